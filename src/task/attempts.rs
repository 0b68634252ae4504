//! The attempt log (`attemptLog`): one entry per run of a task that did not complete,
//! written by the leader into the task's value in the same write as the retry, the put-back
//! or the dead letter (no extra round trip), so the dashboard's task page can show every
//! attempt with its error. Bounded: the last [`ATTEMPT_LOG_MAX`] entries, each error cut to
//! [`ATTEMPT_ERROR_MAX`] bytes. A field like any other to producers and older versions,
//! which preserve it untouched; a log that is not an array is started afresh.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::rfc3339;
use crate::coord::FencingToken;

/// The task's field that holds the log.
pub const ATTEMPT_LOG: &str = "attemptLog";
/// Entries kept: the newest. Ten runs tell the story of a failing task; more would make
/// its value (moved whole to the dead letters) grow with every retry.
pub const ATTEMPT_LOG_MAX: usize = 10;
/// Each entry's error (a handler's message, an exec handler's stderr tail) is cut to this
/// many bytes, so the log stays under about 12 KiB.
pub const ATTEMPT_ERROR_MAX: usize = 1024;

/// How a run ended: failed (the handler's error), interrupted (stopped by the leader, for
/// the lease or a shutdown: no attempt used), cancelled (by an operator), completed.
pub const FAILED: &str = "failed";
pub const INTERRUPTED: &str = "interrupted";
pub const CANCELLED: &str = "cancelled";
pub const COMPLETED: &str = "completed";

/// One run of a task, as the log keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    /// The run's number (1 for the first).
    pub attempt: u32,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339.
    pub finished_at: String,
    /// [`FAILED`], [`INTERRUPTED`], [`CANCELLED`] or [`COMPLETED`].
    pub outcome: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    #[serde(default)]
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<FencingToken>,
    /// What the leader noted of the run besides its outcome: report lines it refused.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

impl Attempt {
    /// The entry for run `attempt`, `started` to `finished`, its error cut to its limit.
    pub fn new(
        attempt: u32,
        started: DateTime<Utc>,
        finished: DateTime<Utc>,
        outcome: &str,
        error: &str,
        node: &str,
        fencing_token: FencingToken,
    ) -> Attempt {
        Attempt {
            attempt,
            started_at: rfc3339(started),
            finished_at: rfc3339(finished),
            outcome: outcome.to_string(),
            error: super::cut(error, ATTEMPT_ERROR_MAX).to_string(),
            node: node.to_string(),
            fencing_token: Some(fencing_token),
            note: String::new(),
        }
    }
}

/// Whether a task's value may hold a log: a look for the field's name, cheaper than
/// parsing the value again on every completion.
pub fn has_log(value: &[u8]) -> bool {
    memchr::memmem::find(value, b"\"attemptLog\"").is_some()
}

/// The log read from a task's fields: the entries that can be read, oldest first; an
/// absent or unreadable log is empty.
pub fn read(fields: &Map<String, Value>) -> Vec<Attempt> {
    match fields.get(ATTEMPT_LOG) {
        Some(Value::Array(entries)) => entries
            .iter()
            .filter_map(|entry| serde_json::from_value(entry.clone()).ok())
            .collect(),
        _ => Vec::new(),
    }
}

/// The log of `fields` with `entry` appended, as the value to write: the newest
/// [`ATTEMPT_LOG_MAX`] entries. Entries that cannot be read are kept as they are (someone
/// else's), yet count against the bound.
pub fn appended(fields: &Map<String, Value>, entry: &Attempt) -> Value {
    let mut entries = match fields.get(ATTEMPT_LOG) {
        Some(Value::Array(entries)) => entries.clone(),
        _ => Vec::new(),
    };
    entries.push(serde_json::to_value(entry).expect("an attempt serializes"));
    let over = entries.len().saturating_sub(ATTEMPT_LOG_MAX);
    entries.drain(..over);
    Value::Array(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(seconds, 0).unwrap()
    }

    fn entry(attempt: u32, error: &str) -> Attempt {
        Attempt::new(
            attempt,
            at(10),
            at(12),
            FAILED,
            error,
            "r1",
            FencingToken(7),
        )
    }

    fn fields(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    /// Each failed run adds an entry with its times, outcome, error, node and token; the
    /// log reads back as written.
    #[test]
    fn each_run_adds_an_entry_that_reads_back() {
        let mut task = fields(json!({"taskType": "T", "taskTime": 1}));
        assert!(read(&task).is_empty());
        task.insert(ATTEMPT_LOG.into(), appended(&task, &entry(1, "boom")));
        task.insert(ATTEMPT_LOG.into(), appended(&task, &entry(2, "bang")));
        let log = read(&task);
        assert_eq!(log.len(), 2);
        assert_eq!(log[0].error, "boom");
        assert_eq!(log[1].attempt, 2);
        assert_eq!(log[1].started_at, "1970-01-01T00:00:10.000Z");
        assert_eq!(log[1].finished_at, "1970-01-01T00:00:12.000Z");
        assert_eq!(log[1].node, "r1");
        assert_eq!(log[1].fencing_token, Some(FencingToken(7)));
        assert_eq!(
            task[ATTEMPT_LOG][1]["fencingToken"],
            json!(7),
            "camelCase, as the producers' fields"
        );
    }

    /// The look finds the field's quoted name anywhere in a value, and nothing else.
    #[test]
    fn has_log_looks_for_the_quoted_field_name() {
        assert!(has_log(br#"{"attemptLog":[]}"#));
        assert!(has_log(br#"{"taskId":"1","attemptLog":[{"attempt":1}]}"#));
        assert!(!has_log(br#"{"taskId":"1","attemptLogs":[]}"#));
        assert!(!has_log(
            br#"{"note":"attemptLog without quotes: attemptLog"}"#
        ));
        assert!(!has_log(b""));
    }

    /// The log keeps the newest ATTEMPT_LOG_MAX entries and cuts each error to its limit,
    /// on a character boundary.
    #[test]
    fn the_log_is_bounded_in_entries_and_bytes() {
        let mut task = Map::new();
        for attempt in 1..=25 {
            task.insert(
                ATTEMPT_LOG.into(),
                appended(&task, &entry(attempt, &"é".repeat(ATTEMPT_ERROR_MAX))),
            );
        }
        let log = read(&task);
        assert_eq!(log.len(), ATTEMPT_LOG_MAX);
        assert_eq!(log[0].attempt, 16);
        assert_eq!(log[ATTEMPT_LOG_MAX - 1].attempt, 25);
        assert!(log.iter().all(|a| a.error.len() <= ATTEMPT_ERROR_MAX));
        assert!(task[ATTEMPT_LOG].to_string().len() < 12 * ATTEMPT_ERROR_MAX + 4096);
    }

    /// A log someone else wrote that is not an array is started afresh; entries that
    /// cannot be read are skipped when read, kept when appended to.
    #[test]
    fn an_unreadable_log_is_tolerated() {
        let task = fields(json!({ ATTEMPT_LOG: "junk" }));
        assert!(read(&task).is_empty());
        assert_eq!(appended(&task, &entry(1, "x")).as_array().unwrap().len(), 1);
        let task = fields(json!({ ATTEMPT_LOG: [42, {"attempt": 1}] }));
        assert!(read(&task).is_empty());
        let log = appended(&task, &entry(2, "x"));
        assert_eq!(log.as_array().unwrap().len(), 3);
        assert_eq!(log[0], json!(42));
    }
}
