//! Pure: rate limits per task type (`[handlers.T] rate = "N/PERIOD"`): at most N starts of
//! the type in any window of PERIOD, whoever leads. The starts are kept in the coordinator,
//! in one record per type (`leaderq/rates/<queue prefix><type>`: the claim times, in ms, of
//! the starts inside the last window), rewritten by the very claim write that takes the
//! type's tasks, under the same leadership guard and all or nothing with it: a claim that
//! is applied has its starts recorded, one that is not has none, and a new leader reads what
//! its predecessors recorded before its first claim of the type. A start counts from its
//! claim; the window is kept `START_MARGIN` longer than PERIOD, to cover the time between a
//! claim and its handler's start. The clocks of the replicas are taken to agree within
//! that margin (NTP).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::coord::{StoredTask, TaskOp, TaskVersion};
pub use crate::util::rate::Rate;

/// How much longer than its period a rate's window is kept: a start counts from its claim,
/// and its handler starts a little later.
pub const START_MARGIN: Duration = Duration::from_millis(500);

/// How far back `rate`'s starts count, in ms.
fn window_ms(rate: &Rate) -> i64 {
    (rate.per + START_MARGIN).as_millis() as i64
}

/// The key of `task_type`'s rate record in the queue under `queue_prefix`.
pub fn rate_key(queue_prefix: &str, task_type: &str) -> String {
    format!(
        "{}rates/{queue_prefix}{task_type}",
        crate::config::OWN_NAMESPACE
    )
}

/// A rate record as stored.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    /// Claim times of the starts inside the last window, in ms since the epoch, oldest first.
    starts: Vec<i64>,
}

/// A type's recorded starts, as read, with the record's version (`None`: no record yet).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Starts {
    version: Option<TaskVersion>,
    at: Vec<i64>,
}

impl Starts {
    /// The starts a read of the record found (`None`: there is none). A record that is not
    /// one (an operator's edit) counts no start, and is written over at the next claim.
    pub fn read(stored: Option<&StoredTask>) -> Starts {
        let Some(stored) = stored else {
            return Starts::default();
        };
        let record: Record = serde_json::from_slice(&stored.value).unwrap_or_default();
        Starts {
            version: Some(stored.version),
            at: record.starts,
        }
    }

    /// How many more starts `rate` allows at `now_ms`.
    pub fn room(&self, rate: &Rate, now_ms: i64) -> usize {
        let since = now_ms - window_ms(rate);
        let counted = self.at.iter().filter(|&&at| at > since).count();
        (rate.starts as usize).saturating_sub(counted)
    }

    /// The write that records `count` more starts at `now_ms` at `key` (dropping those out
    /// of the window): created when there is no record, else conditioned on the version
    /// read, so that a record that moved meanwhile fails the claim with it.
    pub fn record(&self, key: String, rate: &Rate, now_ms: i64, count: usize) -> TaskOp {
        let since = now_ms - window_ms(rate);
        let mut starts: Vec<i64> = self.at.iter().copied().filter(|&at| at > since).collect();
        starts.extend(std::iter::repeat_n(now_ms, count));
        let value = serde_json::to_vec(&Record { starts }).unwrap_or_default();
        match self.version {
            Some(version) => TaskOp::Rewrite {
                key,
                version,
                value,
            },
            None => TaskOp::Create { key, value },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(value: &str) -> StoredTask {
        StoredTask {
            key: "leaderq/rates/q/T".into(),
            value: value.as_bytes().to_vec(),
            version: TaskVersion(7),
            created: 0,
            holder: None,
        }
    }

    #[test]
    fn a_window_counts_the_starts_inside_it_and_a_margin_after() {
        let rate = Rate::parse("3/2s").unwrap();
        let starts = Starts::read(Some(&stored(r#"{"starts":[1000,1500,2000]}"#)));
        assert_eq!(starts.room(&rate, 2000), 0);
        // 2 s and the margin after the first start, it no longer counts.
        assert_eq!(starts.room(&rate, 3499), 0);
        assert_eq!(starts.room(&rate, 3500), 1);
        assert_eq!(starts.room(&rate, 10_000), 3);
        assert_eq!(Starts::read(None).room(&rate, 0), 3);
        // An operator's garbage counts nothing, and is written over.
        assert_eq!(Starts::read(Some(&stored("junk"))).room(&rate, 0), 3);
    }

    #[test]
    fn a_claim_records_its_starts_dropping_the_old_ones_conditioned_on_what_was_read() {
        let rate = Rate::parse("3/2s").unwrap();
        let starts = Starts::read(Some(&stored(r#"{"starts":[1000,1500,2000]}"#)));
        let op = starts.record("k".into(), &rate, 3600, 1);
        let TaskOp::Rewrite {
            key,
            version,
            value,
        } = op
        else {
            panic!("a record read is rewritten: {op:?}");
        };
        assert_eq!((key.as_str(), version), ("k", TaskVersion(7)));
        assert_eq!(value, br#"{"starts":[1500,2000,3600]}"#);
        let first = Starts::read(None).record("k".into(), &rate, 5, 1);
        assert!(matches!(first, TaskOp::Create { .. }), "{first:?}");
    }
}
