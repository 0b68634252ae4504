//! Pure: a rate, "N/PERIOD" (at most N in any window of PERIOD), as the settings write it
//! (`[handlers.T] rate`); what it limits, and how, is `queue/rates.rs`'s.

use std::time::Duration;

/// The most starts a rate may allow in one period (each is kept in the type's record).
pub const MAX_STARTS: u32 = 1000;

/// At most `starts` starts in any window of `per`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub starts: u32,
    pub per: Duration,
}

impl Rate {
    /// Reads `"N/PERIOD"` (`"10/1m"`, `"5/2s"`): N from 1 to [`MAX_STARTS`], PERIOD from 1s
    /// to 24h. The error says what is wrong, for a message that names the setting.
    pub fn parse(text: &str) -> Result<Rate, String> {
        let (starts, per) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not N/PERIOD, such as \"10/1m\""))?;
        let starts: u32 = starts
            .trim()
            .parse()
            .map_err(|_| format!("{starts:?} in {text:?} is not a number of starts"))?;
        if !(1..=MAX_STARTS).contains(&starts) {
            return Err(format!(
                "{starts} starts in {text:?}: a rate allows from 1 to {MAX_STARTS} starts"
            ));
        }
        let per = crate::util::duration::parse(per.trim())
            .map_err(|err| format!("{per:?} in {text:?}: {err}"))?;
        if per < Duration::from_secs(1) || per > Duration::from_secs(24 * 3600) {
            return Err(format!("the period in {text:?} must be from 1s to 24h"));
        }
        Ok(Rate { starts, per })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_n_per_period_and_say_what_is_wrong() {
        assert_eq!(
            Rate::parse("5/2s"),
            Ok(Rate {
                starts: 5,
                per: Duration::from_secs(2)
            })
        );
        assert_eq!(
            Rate::parse("10 / 1m").map(|r| r.per),
            Ok(Duration::from_secs(60))
        );
        for bad in ["5", "x/1s", "0/1s", "1001/1h", "5/100ms", "5/2d", "5/soon"] {
            assert!(Rate::parse(bad).is_err(), "{bad}");
        }
    }
}
