//! The history of finished tasks: the small record a completion leaves under
//! `[queue] done_prefix` (written in the completion's own write, as a move of the task to
//! it), the record's key, which starts with the finish time so that keys sort by it, and the
//! pure retention decision (which records the leader prunes, by count and by age).
//! Dead letters are history too: [`HistoryRecord::from_dead_letter`] reads one as a record
//! of outcome `dead`, so nothing is written twice. No I/O, no clock: time comes in.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::coord::FencingToken;

use super::attempts::{self, Attempt};
use super::{rfc3339, Task};

/// A completed task's outcome.
pub const COMPLETED: &str = "completed";
/// A dead letter's outcome (failed for good, used up its attempts, malformed, cancelled).
pub const DEAD: &str = "dead";

/// Digits of the finish time (epoch milliseconds) a record's key starts with: zero-padded,
/// so that byte order is time order until the year 2286.
const MILLIS_DIGITS: usize = 13;

/// One finished task, as `leaderq tasks history` and the dashboard show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryRecord {
    /// [`COMPLETED`] or [`DEAD`].
    pub outcome: String,
    /// The task's key in the queue.
    pub key: String,
    #[serde(default)]
    pub task_id: String,
    #[serde(default)]
    pub task_type: String,
    /// When the run that finished it started (RFC 3339); unknown for most dead letters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When it finished (RFC 3339): completed, or moved to the dead letters.
    #[serde(default)]
    pub finished_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Runs it took, the last one included.
    #[serde(default)]
    pub attempts: u32,
    /// The leadership that recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<FencingToken>,
    /// The replica that ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The last error of an earlier failed run (an exec handler's stderr tail), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Why it was dead-lettered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The task's earlier runs, oldest first (`task::attempts`): for a completed task the
    /// attempt log it carried (the run that completed it is the record itself), for a dead
    /// letter every run it logged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempt_log: Vec<Attempt>,
    /// Where the record is stored (under the done or the dead-letter prefix); not stored
    /// in the record itself.
    #[serde(default, skip_deserializing)]
    pub record_key: String,
}

/// What a run that finished tells the record.
#[derive(Clone, Debug)]
pub struct Run<'a> {
    pub started: DateTime<Utc>,
    pub finished: DateTime<Utc>,
    pub fencing_token: FencingToken,
    pub node: &'a str,
}

impl HistoryRecord {
    /// The record of `task`, completed by `run`.
    pub fn completed(task: &Task, run: &Run<'_>) -> HistoryRecord {
        HistoryRecord {
            outcome: COMPLETED.into(),
            key: task.key.clone(),
            task_id: task.id.clone(),
            task_type: task.task_type.clone(),
            started_at: Some(rfc3339(run.started)),
            finished_at: rfc3339(run.finished),
            duration_ms: Some(
                (run.finished - run.started)
                    .to_std()
                    .unwrap_or_default()
                    .as_millis() as u64,
            ),
            attempts: task.run_number(),
            fencing_token: Some(run.fencing_token),
            node: Some(run.node.to_string()),
            last_error: task.last_error.clone(),
            reason: None,
            // The earlier runs (this one is the record itself); a value without a log (most
            // first runs) is not parsed again. A retried dead letter keeps its log.
            attempt_log: if attempts::has_log(task.value()) {
                attempts::read(&task.fields())
            } else {
                Vec::new()
            },
            record_key: String::new(),
        }
    }

    /// The record a dead letter stands for; `None` for a value that is not a JSON object.
    pub fn from_dead_letter(record_key: &str, value: &[u8]) -> Option<HistoryRecord> {
        let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(value) else {
            return None;
        };
        let text = |name: &str| fields.get(name).and_then(Value::as_str).map(str::to_string);
        let task_id = match fields.get("taskId") {
            Some(Value::String(id)) => id.clone(),
            Some(Value::Number(id)) => id.to_string(),
            _ => String::new(),
        };
        Some(HistoryRecord {
            outcome: DEAD.into(),
            key: text("originalKey").unwrap_or_default(),
            task_id,
            task_type: text("taskType").unwrap_or_default(),
            started_at: None,
            finished_at: text("deadAt").unwrap_or_default(),
            duration_ms: None,
            attempts: fields
                .get("attempts")
                .map(super::parse_attempts)
                .unwrap_or_default(),
            fencing_token: fields
                .get("deadFencingToken")
                .and_then(Value::as_u64)
                .map(FencingToken),
            node: text("deadNode"),
            last_error: text("lastError"),
            reason: text("deadReason"),
            attempt_log: attempts::read(&fields),
            record_key: record_key.to_string(),
        })
    }

    /// A record as stored under the done prefix; `None` for a value that is not one.
    pub fn decode(record_key: &str, value: &[u8]) -> Option<HistoryRecord> {
        let mut record: HistoryRecord = serde_json::from_slice(value).ok()?;
        record.record_key = record_key.to_string();
        Some(record)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a history record serializes")
    }

    /// The finish time, for ordering; records with none sort first.
    pub fn finished(&self) -> Option<DateTime<Utc>> {
        DateTime::parse_from_rfc3339(&self.finished_at)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    }

    pub fn failed(&self) -> bool {
        self.outcome != COMPLETED
    }
}

/// The key of the record of `task_key` (under `queue_prefix`) finished at `finished`:
/// `<done_prefix><epoch ms, 13 digits>-<the task's name, '/' as '_'>`. Tasks whose keys
/// break the key rule never run, so the name is a valid segment once its slashes go.
pub fn record_key(
    queue_prefix: &str,
    done_prefix: &str,
    task_key: &str,
    finished: DateTime<Utc>,
) -> String {
    let name = task_key
        .strip_prefix(queue_prefix)
        .unwrap_or(task_key)
        .replace('/', "_");
    let millis = finished.timestamp_millis().max(0);
    format!(
        "{done_prefix}{millis:0width$}-{name}",
        width = MILLIS_DIGITS
    )
}

/// The finish time a record key carries; `None` for a key not made by [`record_key`].
pub fn finished_of(done_prefix: &str, key: &str) -> Option<DateTime<Utc>> {
    let rest = key.strip_prefix(done_prefix)?;
    let (millis, name) = rest.split_once('-')?;
    if millis.len() != MILLIS_DIGITS || name.is_empty() {
        return None;
    }
    let millis: i64 = millis.parse().ok()?;
    Utc.timestamp_millis_opt(millis).single()
}

/// Retention: keep the newest `keep` records (0: none) and none finished more than
/// `max_age` before `now` (zero: no age limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub keep: usize,
    pub max_age: std::time::Duration,
}

/// The record keys under `done_prefix` that `retention` drops, oldest first. Keys that no
/// record of leaderq's would have are left alone.
pub fn to_prune(
    keys: &[String],
    done_prefix: &str,
    retention: Retention,
    now: DateTime<Utc>,
) -> Vec<String> {
    let mut records: Vec<(DateTime<Utc>, &String)> = keys
        .iter()
        .filter_map(|key| finished_of(done_prefix, key).map(|at| (at, key)))
        .collect();
    records.sort();
    let over = records.len().saturating_sub(retention.keep);
    let too_old = |at: &DateTime<Utc>| {
        !retention.max_age.is_zero()
            && (now - *at)
                .to_std()
                .is_ok_and(|age| age > retention.max_age)
    };
    records
        .iter()
        .enumerate()
        .filter(|(n, (at, _))| *n < over || too_old(at))
        .map(|(_, (_, key))| (*key).clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(seconds, 0).unwrap()
    }

    /// Record keys sort by finish time, and carry it back out; a nested task name stays one
    /// segment.
    #[test]
    fn record_keys_sort_by_finish_time_and_carry_it() {
        let early = record_key("q/", "done/", "q/zz", at(9));
        let late = record_key("q/", "done/", "q/a/b", at(1_000_000_000));
        assert_eq!(early, "done/0000000009000-zz");
        assert_eq!(late, "done/1000000000000-a_b");
        assert!(early < late);
        crate::task::key::check(&late).unwrap();
        assert_eq!(finished_of("done/", &late), Some(at(1_000_000_000)));
        assert_eq!(finished_of("done/", "done/other"), None);
        assert_eq!(finished_of("done/", "done/12-x"), None);
    }

    /// The oldest records beyond the count go, and every record past the age, and nothing
    /// else; 0 keeps none, a zero age keeps all ages.
    #[test]
    fn retention_drops_the_oldest_beyond_the_count_and_the_too_old() {
        let keys: Vec<String> = [5, 1, 3, 4, 2]
            .iter()
            .map(|s| record_key("q/", "d/", &format!("q/t{s}"), at(*s * 100)))
            .chain(["d/foreign".to_string()])
            .collect();
        let now = at(600);
        let by_count = Retention {
            keep: 3,
            max_age: Duration::ZERO,
        };
        assert_eq!(
            to_prune(&keys, "d/", by_count, now),
            ["d/0000000100000-t1", "d/0000000200000-t2"]
        );
        let by_age = Retention {
            keep: 10,
            max_age: Duration::from_secs(250),
        };
        assert_eq!(
            to_prune(&keys, "d/", by_age, now),
            [
                "d/0000000100000-t1",
                "d/0000000200000-t2",
                "d/0000000300000-t3"
            ]
        );
        let none = Retention {
            keep: 0,
            max_age: Duration::ZERO,
        };
        assert_eq!(to_prune(&keys, "d/", none, now).len(), 5);
        let all = Retention {
            keep: 10,
            max_age: Duration::ZERO,
        };
        assert!(to_prune(&keys, "d/", all, now).is_empty());
    }

    /// A dead letter reads as a record of outcome `dead` with its reason and attempts.
    #[test]
    fn a_dead_letter_reads_as_a_failed_record() {
        let value = br#"{"taskId":7,"taskType":"Fail","attempts":"3","lastError":"boom","deadReason":"failed 3 times","deadAt":"2026-01-01T00:00:00.000Z","originalKey":"q/t7"}"#;
        let record = HistoryRecord::from_dead_letter("dead/t7", value).unwrap();
        assert_eq!(record.outcome, DEAD);
        assert!(record.failed());
        assert_eq!(record.task_id, "7");
        assert_eq!(record.attempts, 3);
        assert_eq!(record.key, "q/t7");
        assert_eq!(record.reason.as_deref(), Some("failed 3 times"));
        assert_eq!(
            record.finished(),
            Some(Utc.timestamp_opt(1_767_225_600, 0).unwrap())
        );
        assert!(HistoryRecord::from_dead_letter("dead/x", b"nope").is_none());
    }

    /// A task retried after a failed run carries that run in its attempt log (producer
    /// fields untouched); the record of its completion keeps the earlier runs, and a dead
    /// letter reads back with them; a first run that completes adds no log.
    #[test]
    fn the_attempt_log_travels_from_retries_to_the_history() {
        use crate::coord::{StoredTask, TaskVersion};
        let stored = StoredTask {
            key: "q/t1".into(),
            value: br#"{"taskType":"T","taskTime":1,"mine":{"a":1}}"#.to_vec(),
            version: TaskVersion(1),
            created: 1,
            holder: None,
        };
        let task = Task::parse(&stored).unwrap();
        let run = Run {
            started: at(20),
            finished: at(21),
            fencing_token: FencingToken(3),
            node: "r1",
        };
        assert!(HistoryRecord::completed(&task, &run).attempt_log.is_empty());
        let failed = Attempt::new(
            1,
            at(10),
            at(11),
            attempts::FAILED,
            "boom",
            "r1",
            FencingToken(3),
        );
        let retried = StoredTask {
            value: task.retried_after(1, "boom", at(12), &failed),
            ..stored
        };
        let value: Value = serde_json::from_slice(&retried.value).unwrap();
        assert_eq!(value["mine"], serde_json::json!({"a": 1}));
        assert_eq!(value["attemptLog"][0]["error"], "boom");
        let task = Task::parse(&retried).unwrap();
        let record = HistoryRecord::completed(&task, &run);
        assert_eq!(record.attempt_log, vec![failed.clone()]);
        let decoded = HistoryRecord::decode("d/x", &record.encode()).unwrap();
        assert_eq!(decoded.attempt_log, vec![failed.clone()]);
        let dead = super::super::dead_letter(&retried, "failed", at(30));
        let record = HistoryRecord::from_dead_letter("dead/t1", &dead).unwrap();
        assert_eq!(record.attempt_log, vec![failed]);
    }
}
