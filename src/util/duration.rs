//! Go's `time.Duration` text format, which Consul uses on the wire (`"15s"`, `"15000ms"`,
//! `"24h0m0s"`): parsing with Go's error messages and formatting like `Duration.String()`.
//!
//! The server reads and writes it on the wire; settings files use it too ([`deserialize`]).

use std::time::Duration;

/// Parses a Go duration string (`"1h2m3.5s"`, `"15000ms"`, `"0"`). Negative values are
/// rejected with Go's own wording for a bad number, since no caller here accepts them.
pub fn parse(text: &str) -> Result<Duration, String> {
    let invalid = || format!("time: invalid duration {}", quote(text));
    let mut rest = text;
    if let Some(stripped) = rest.strip_prefix('+') {
        rest = stripped;
    } else if rest.starts_with('-') {
        // Go accepts a sign, but every duration Consul reads here must not be negative.
        return Err(invalid());
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let int_part = &rest[..int_len];
        rest = &rest[int_len..];
        let mut frac_part = "";
        if let Some(after_dot) = rest.strip_prefix('.') {
            let frac_len = after_dot
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after_dot.len());
            frac_part = &after_dot[..frac_len];
            rest = &after_dot[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid());
        }
        let unit_len = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        if unit.is_empty() {
            return Err(format!("time: missing unit in duration {}", quote(text)));
        }
        let nanos_per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            _ => {
                return Err(format!(
                    "time: unknown unit {} in duration {}",
                    quote(unit),
                    quote(text)
                ))
            }
        };
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| invalid())?
        };
        let mut value = whole.checked_mul(nanos_per_unit).ok_or_else(invalid)?;
        if !frac_part.is_empty() {
            // Go keeps as many fractional digits as fit; nanosecond precision is enough.
            let digits = &frac_part[..frac_part.len().min(18)];
            let scale = 10u128.pow(digits.len() as u32);
            let frac: u128 = digits.parse().map_err(|_| invalid())?;
            value += frac * nanos_per_unit / scale;
        }
        total = total.checked_add(value).ok_or_else(invalid)?;
    }
    // Go durations are int64 nanoseconds.
    if total > i64::MAX as u128 {
        return Err(invalid());
    }
    Ok(Duration::from_nanos(total as u64))
}

/// Formats like Go's `Duration.String()`: `"0s"`, `"1.5s"`, `"100ms"`, `"24h0m0s"`.
pub fn format(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000_000_000 {
        let (unit, scale) = if nanos < 1_000 {
            ("ns", 1)
        } else if nanos < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", fixed(nanos, scale));
    }
    let hours = nanos / 3_600_000_000_000;
    let minutes = (nanos / 60_000_000_000) % 60;
    let sec_nanos = nanos % 60_000_000_000;
    let seconds = fixed(sec_nanos, 1_000_000_000);
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// `value / scale` as a decimal with trailing zeros removed.
fn fixed(value: u128, scale: u128) -> String {
    let whole = value / scale;
    let frac = value % scale;
    if frac == 0 {
        return whole.to_string();
    }
    let width = scale.to_string().len() - 1;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// An age for a table column: its two largest units (`45s`, `12m3s`, `5h7m`, `4049d10h`),
/// and `in 5m` for a time still ahead (a taskTime in the future).
pub fn format_age(seconds: i64) -> String {
    let ahead = seconds < 0;
    let s = seconds.unsigned_abs();
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    let text = if d > 0 {
        format!("{d}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m{sec}s")
    } else {
        format!("{sec}s")
    };
    if ahead {
        format!("in {text}")
    } else {
        text
    }
}

/// Go's `%q` for the strings that appear in error messages.
pub fn quote(s: &str) -> String {
    format!("{s:?}")
}

/// Serde's `deserialize_with` for a duration in Go's syntax, as settings files write it.
pub fn deserialize<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Duration, D::Error> {
    use serde::Deserialize as _;
    let text = String::deserialize(deserializer)?;
    parse(&text)
        .map_err(|e| serde::de::Error::custom(format!("{e} (use a duration such as \"15s\")")))
}

/// [`deserialize`] for an optional setting.
pub fn deserialize_optional<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    deserialize(deserializer).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ages show their two largest units, and a time ahead says so.
    #[test]
    fn ages_show_two_units() {
        assert_eq!(format_age(45), "45s");
        assert_eq!(format_age(723), "12m3s");
        assert_eq!(format_age(5 * 3600 + 7 * 60 + 9), "5h7m");
        assert_eq!(format_age(97_186 * 3600 + 31 * 60), "4049d10h");
        assert_eq!(format_age(-300), "in 5m0s");
    }

    /// The forms Consul clients send parse to the same durations Go would produce.
    #[test]
    fn parses_go_duration_forms() {
        assert_eq!(parse("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse("15000ms"), Ok(Duration::from_secs(15)));
        assert_eq!(parse("1h2m3.5s"), Ok(Duration::from_millis(3_723_500)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("300us"), Ok(Duration::from_micros(300)));
        assert_eq!(parse("2µs"), Ok(Duration::from_micros(2)));
        assert_eq!(parse(".5s"), Ok(Duration::from_millis(500)));
    }

    /// Bad input gets Go's error wording, which Consul passes through to clients.
    #[test]
    fn rejects_bad_durations_with_go_messages() {
        assert_eq!(
            parse("10z"),
            Err(r#"time: unknown unit "z" in duration "10z""#.to_string())
        );
        assert_eq!(
            parse("5"),
            Err(r#"time: missing unit in duration "5""#.to_string())
        );
        assert_eq!(parse(""), Err(r#"time: invalid duration """#.to_string()));
        assert_eq!(parse("s"), Err(r#"time: invalid duration "s""#.to_string()));
        assert!(parse("-1s").is_err());
        assert!(parse("99999999999h").is_err());
    }

    /// Formatting matches Go's `Duration.String()`, used in Consul's TTL error text.
    #[test]
    fn formats_like_go() {
        assert_eq!(format(Duration::ZERO), "0s");
        assert_eq!(format(Duration::from_secs(10)), "10s");
        assert_eq!(format(Duration::from_secs(86_400)), "24h0m0s");
        assert_eq!(format(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format(Duration::from_millis(100)), "100ms");
        assert_eq!(format(Duration::from_secs(90)), "1m30s");
        assert_eq!(format(Duration::from_nanos(1500)), "1.5µs");
    }
}
