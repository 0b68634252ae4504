//! Pure: a run's reports of how far it got: the lines a handler writes (`{"progress": 0.4,
//! "message": "copying"}`, `{"checkpoint": {...}}`) read and checked, the fields they
//! become in the task's value (`progress`, `progressMessage`, `checkpoint`), and the
//! throttle that keeps progress writes to one a second. The reading of the file and the
//! writes are the handler's and the queue's.

use std::time::Duration;

use tokio::time::Instant;

use serde_json::Value;

/// The longest report line read: a checkpoint is a small cursor, not the work's data, and
/// every one is written into the task's value.
pub const MAX_LINE: usize = 64 * 1024;
/// The longest progress message kept; a longer one is cut.
pub const MAX_MESSAGE: usize = 200;
/// Progress is written at most this often.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// A checkpoint is written at most this often (the latest one then; the last one of a run
/// is written with its settlement whatever the time): a rerun resumes at most this far
/// behind where the run got, and a run costs the coordinator at most 4 writes a second.
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// The task's fields a run's reports are kept in.
pub const PROGRESS: &str = "progress";
pub const PROGRESS_MESSAGE: &str = "progressMessage";
pub const CHECKPOINT: &str = "checkpoint";

/// One report line, read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// How far the run got, from 0 to 1.
    pub progress: Option<f64>,
    pub message: Option<String>,
    /// Where a rerun may start from: any JSON the handler understands.
    pub checkpoint: Option<Value>,
}

/// Reads one report line (without its newline): a JSON object with `progress` (a number,
/// clamped to 0..1), `message` (a string) and/or `checkpoint` (any JSON but null). Says
/// why a line is refused.
pub fn parse_line(line: &[u8]) -> Result<Report, String> {
    if line.len() > MAX_LINE {
        return Err(format!(
            "a report line of {} bytes is over the {MAX_LINE}-byte limit: keep checkpoints small",
            line.len()
        ));
    }
    let value: Value = serde_json::from_slice(line).map_err(|err| {
        format!("a report line is not JSON ({err}): write one JSON object a line")
    })?;
    let Value::Object(mut fields) = value else {
        return Err("a report line is not a JSON object: write one object a line".into());
    };
    let progress = match fields.remove("progress") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => n.as_f64().map(|p| p.clamp(0.0, 1.0)),
        Some(other) => return Err(format!("progress {other} is not a number from 0 to 1")),
    };
    let message = match fields.remove("message") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(cut(&text, MAX_MESSAGE)),
        Some(other) => return Err(format!("message {other} is not a string")),
    };
    let checkpoint = fields.remove("checkpoint").filter(|c| !c.is_null());
    if progress.is_none() && message.is_none() && checkpoint.is_none() {
        return Err("a report line has none of progress, message, checkpoint".into());
    }
    Ok(Report {
        progress,
        message,
        checkpoint,
    })
}

/// The task's fields for the latest progress and checkpoint (what is known of each).
pub fn fields(
    progress: Option<(f64, Option<&str>)>,
    checkpoint: Option<&Value>,
) -> Vec<(&'static str, Value)> {
    let mut fields = Vec::new();
    if let Some((progress, message)) = progress {
        fields.push((PROGRESS, serde_json::json!(progress)));
        let message = message.map_or(Value::Null, |m| Value::String(m.to_string()));
        fields.push((PROGRESS_MESSAGE, message));
    }
    if let Some(checkpoint) = checkpoint {
        fields.push((CHECKPOINT, checkpoint.clone()));
    }
    fields
}

/// At most one report write each [`PROGRESS_EVERY`], or each [`CHECKPOINT_EVERY`] when a
/// checkpoint waits to be written; time is given, never read.
#[derive(Clone, Debug, Default)]
pub struct Throttle {
    last: Option<Instant>,
}

impl Throttle {
    /// How long to wait from `now` before the next write may go (zero: now), when what
    /// waits holds a checkpoint (`checkpoint`) or progress only.
    pub fn wait(&self, now: Instant, checkpoint: bool) -> Duration {
        let every = if checkpoint {
            CHECKPOINT_EVERY
        } else {
            PROGRESS_EVERY
        };
        match self.last {
            None => Duration::ZERO,
            Some(last) => (last + every).saturating_duration_since(now),
        }
    }

    /// A write went at `now`.
    pub fn wrote(&mut self, now: Instant) {
        self.last = Some(now);
    }
}

fn cut(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Progress is clamped to 0..1; a message and a checkpoint are read beside it.
    #[test]
    fn report_lines_are_read_and_progress_clamped() {
        let read = parse_line(br#"{"progress": 0.4, "message": "copying"}"#).unwrap();
        assert_eq!(read.progress, Some(0.4));
        assert_eq!(read.message.as_deref(), Some("copying"));
        assert_eq!(
            parse_line(br#"{"progress": 7}"#).unwrap().progress,
            Some(1.0)
        );
        assert_eq!(
            parse_line(br#"{"progress": -2}"#).unwrap().progress,
            Some(0.0)
        );
        let read = parse_line(br#"{"checkpoint": {"n": 3}}"#).unwrap();
        assert_eq!(read.checkpoint, Some(serde_json::json!({"n": 3})));
        assert_eq!(read.progress, None);
    }

    /// Malformed lines are refused with a reason, never a panic.
    #[test]
    fn malformed_report_lines_are_refused() {
        for line in [
            &b"not json"[..],
            b"[1]",
            b"{}",
            br#"{"progress": "half"}"#,
            br#"{"message": 3}"#,
            br#"{"checkpoint": null}"#,
        ] {
            assert!(
                parse_line(line).is_err(),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    /// A line over the limit is refused before it is parsed.
    #[test]
    fn oversized_report_lines_are_refused() {
        let big = format!(r#"{{"checkpoint": "{}"}}"#, "x".repeat(MAX_LINE));
        let err = parse_line(big.as_bytes()).unwrap_err();
        assert!(err.contains("limit"), "{err}");
        let long = format!(r#"{{"progress": 0.1, "message": "{}"}}"#, "é".repeat(300));
        assert!(parse_line(long.as_bytes()).unwrap().message.unwrap().len() <= MAX_MESSAGE);
    }

    /// Progress goes at once, then at most once a second, on a scripted clock.
    #[test]
    fn progress_writes_are_throttled_to_one_a_second() {
        let start = Instant::now();
        let mut throttle = Throttle::default();
        assert_eq!(throttle.wait(start, false), Duration::ZERO);
        throttle.wrote(start);
        let later = start + Duration::from_millis(300);
        assert_eq!(throttle.wait(later, false), Duration::from_millis(700));
        assert_eq!(throttle.wait(start + PROGRESS_EVERY, false), Duration::ZERO);
        throttle.wrote(start + Duration::from_secs(5));
        assert_eq!(
            throttle.wait(start + Duration::from_millis(5500), false),
            Duration::from_millis(500)
        );
    }

    /// A checkpoint goes at once, then at most one each `CHECKPOINT_EVERY`, whatever the
    /// progress waits: a handler checkpointing in a tight loop costs the coordinator four
    /// writes a second, not one per round trip.
    #[test]
    fn checkpoint_writes_are_throttled_more_lightly_than_progress() {
        let start = Instant::now();
        let mut throttle = Throttle::default();
        assert_eq!(throttle.wait(start, true), Duration::ZERO);
        throttle.wrote(start);
        let soon = start + Duration::from_millis(10);
        assert_eq!(
            throttle.wait(soon, true),
            CHECKPOINT_EVERY - Duration::from_millis(10)
        );
        assert_eq!(
            throttle.wait(start + CHECKPOINT_EVERY, true),
            Duration::ZERO
        );
        assert!(throttle.wait(start + CHECKPOINT_EVERY, false) > Duration::ZERO);
        assert!(CHECKPOINT_EVERY < PROGRESS_EVERY);
    }
}
