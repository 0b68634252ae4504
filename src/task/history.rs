//! The history of finished tasks: the small record a completion leaves under
//! `[queue] done_prefix` (written in the completion's own write), the record's key, which
//! starts with the finish time so that keys sort by it, and the pure retention decision
//! (which records the leader prunes, by count and by age).
//!
//! Tasks completed in one write share one key ([`batch_key`]): its value is the JSON array
//! of their records, and the key says how many it holds, so that retention counts records
//! without reading them. A key of one record holds the record itself.
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
    /// Where the record is stored (under the done or the dead-letter prefix); for one of
    /// several records under one key, that key, `/`, and its place in it ([`locate`]). Not
    /// stored in the record itself.
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

    /// The records stored under `key`: one, or the array [`batch_value`] wrote, each then
    /// addressed as `key/<place>`. Nothing for a value that is neither.
    pub fn decode_all(key: &str, value: &[u8]) -> Vec<HistoryRecord> {
        if !value.trim_ascii_start().starts_with(b"[") {
            return HistoryRecord::decode(key, value).into_iter().collect();
        }
        let Ok(records) = serde_json::from_slice::<Vec<HistoryRecord>>(value) else {
            return Vec::new();
        };
        records
            .into_iter()
            .enumerate()
            .map(|(place, mut record)| {
                record.record_key = format!("{key}/{place}");
                record
            })
            .collect()
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

/// The key of `count` records written together, the newest of which has the key `newest`
/// (made by [`record_key`]): `<done_prefix><epoch ms>.<count>-<name>`. The count sits
/// where a key of one record has its `-`, so the two never read as each other.
pub fn batch_key(done_prefix: &str, newest: &str, count: usize) -> String {
    match newest.strip_prefix(done_prefix) {
        Some(rest)
            if count > 1 && rest.len() > MILLIS_DIGITS && rest.is_char_boundary(MILLIS_DIGITS) =>
        {
            let (millis, name) = rest.split_at(MILLIS_DIGITS);
            format!("{done_prefix}{millis}.{count}{name}")
        }
        _ => newest.to_string(),
    }
}

/// The value of records written together under a [`batch_key`]: a JSON array of them,
/// each as [`HistoryRecord::encode`] wrote it.
pub fn batch_value<'a>(records: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut value = vec![b'['];
    for (n, record) in records.into_iter().enumerate() {
        if n > 0 {
            value.push(b',');
        }
        value.extend_from_slice(record);
    }
    value.push(b']');
    value
}

/// Where the record addressed as `address` is stored: its key, and its place in that key's
/// array for an address `key/<place>` ([`HistoryRecord::decode_all`]).
pub fn locate(done_prefix: &str, address: &str) -> (String, Option<usize>) {
    if let Some((key, place)) = address.rsplit_once('/') {
        if let (Some(_), Ok(place)) = (stored_count(done_prefix, key), place.parse::<usize>()) {
            return (key.to_string(), Some(place));
        }
    }
    (address.to_string(), None)
}

/// The finish time a record key carries; `None` for a key not made by [`record_key`] or
/// [`batch_key`].
pub fn finished_of(done_prefix: &str, key: &str) -> Option<DateTime<Utc>> {
    stored_count(done_prefix, key).map(|(at, _)| at)
}

/// The finish time a record key carries and how many records it holds.
fn stored_count(done_prefix: &str, key: &str) -> Option<(DateTime<Utc>, usize)> {
    let rest = key.strip_prefix(done_prefix)?;
    let (head, name) = rest.split_once('-')?;
    if name.is_empty() || name.contains('/') {
        return None;
    }
    let (millis, count) = match head.split_once('.') {
        Some((millis, count)) => (millis, count.parse::<usize>().ok().filter(|n| *n > 1)?),
        None => (head, 1),
    };
    if millis.len() != MILLIS_DIGITS {
        return None;
    }
    let millis: i64 = millis.parse().ok()?;
    Some((Utc.timestamp_millis_opt(millis).single()?, count))
}

/// Retention: keep the newest `keep` records (0: none) and none finished more than
/// `max_age` before `now` (zero: no age limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub keep: usize,
    pub max_age: std::time::Duration,
}

/// A record key that retention prunes: deleted, or, holding records on both sides of the
/// count, cut to the newest `keep` of them (the last in its array).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prune {
    pub key: String,
    /// Records that stay under it, 0: the key goes.
    pub keep: usize,
}

/// What `retention` drops under `done_prefix`, oldest first: every key too old, every key
/// whose records are all beyond the newest `keep`, and the key that straddles the count,
/// cut to what it keeps. Keys that no record of leaderq's would have are left alone.
pub fn to_prune<S: AsRef<str> + Ord>(
    keys: impl IntoIterator<Item = S>,
    done_prefix: &str,
    retention: Retention,
    now: DateTime<Utc>,
) -> Vec<Prune> {
    let mut stored: Vec<(DateTime<Utc>, S, usize)> = keys
        .into_iter()
        .filter_map(|key| {
            stored_count(done_prefix, key.as_ref()).map(|(at, count)| (at, key, count))
        })
        .collect();
    stored.sort();
    let too_old = |at: &DateTime<Utc>| {
        !retention.max_age.is_zero()
            && (now - *at)
                .to_std()
                .is_ok_and(|age| age > retention.max_age)
    };
    // Records in keys newer than each key, counted from the newest.
    let mut newer = 0usize;
    let mut kept_after: Vec<usize> = vec![0; stored.len()];
    for (i, (_, _, count)) in stored.iter().enumerate().rev() {
        kept_after[i] = newer;
        newer += count;
    }
    stored
        .iter()
        .zip(kept_after)
        .filter_map(|((at, key, count), newer)| {
            let keep = if too_old(at) {
                0
            } else {
                retention.keep.saturating_sub(newer)
            };
            (keep < *count).then(|| Prune {
                key: key.as_ref().to_string(),
                keep,
            })
        })
        .collect()
}

/// The value of a key of several records cut to its last `keep`; `None` when the value
/// is not such an array.
pub fn cut_to_newest(value: &[u8], keep: usize) -> Option<Vec<u8>> {
    let records: Vec<Value> = serde_json::from_slice(value).ok()?;
    let kept: Vec<Vec<u8>> = records[records.len().saturating_sub(keep)..]
        .iter()
        .map(|record| serde_json::to_vec(record).expect("a JSON value serializes"))
        .collect();
    Some(batch_value(kept.iter().map(Vec::as_slice)))
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
            pruned(to_prune(&keys, "d/", by_count, now)),
            ["d/0000000100000-t1", "d/0000000200000-t2"]
        );
        let by_age = Retention {
            keep: 10,
            max_age: Duration::from_secs(250),
        };
        assert_eq!(
            pruned(to_prune(&keys, "d/", by_age, now)),
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

    /// Records written together share a key that carries their count where a single
    /// record's key has its `-`: it sorts by time with the others, reads back its time and
    /// count, and addresses each record in it as `key/<place>`.
    #[test]
    fn records_written_together_share_a_counted_key() {
        let newest = record_key("q/", "done/", "q/a/b", at(9));
        let batch = batch_key("done/", &newest, 3);
        assert_eq!(batch, "done/0000000009000.3-a_b");
        crate::task::key::check(&batch).unwrap();
        assert_eq!(batch_key("done/", &newest, 1), newest);
        assert_eq!(finished_of("done/", &batch), Some(at(9)));
        assert_eq!(stored_count("done/", &batch).map(|(_, n)| n), Some(3));
        assert_eq!(finished_of("done/", "done/0000000009000.1-x"), None);
        assert_eq!(finished_of("done/", "done/0000000009000.x-y"), None);
        let records: Vec<Vec<u8>> = ["q/t1", "q/t2"]
            .iter()
            .map(|key| {
                HistoryRecord {
                    outcome: COMPLETED.into(),
                    key: key.to_string(),
                    ..HistoryRecord::default()
                }
                .encode()
            })
            .collect();
        let value = batch_value(records.iter().map(Vec::as_slice));
        let read = HistoryRecord::decode_all(&batch, &value);
        let read: Vec<(&str, &str)> = read
            .iter()
            .map(|r| (r.key.as_str(), r.record_key.as_str()))
            .collect();
        assert_eq!(
            read,
            [
                ("q/t1", "done/0000000009000.3-a_b/0"),
                ("q/t2", "done/0000000009000.3-a_b/1")
            ]
        );
        assert_eq!(
            locate("done/", "done/0000000009000.3-a_b/1"),
            ("done/0000000009000.3-a_b".to_string(), Some(1))
        );
        assert_eq!(locate("done/", &newest), (newest.clone(), None));
        assert_eq!(HistoryRecord::decode_all(&newest, &records[0]).len(), 1);
        assert!(HistoryRecord::decode_all(&batch, b"[1,2").is_empty());
    }

    /// Retention counts records, not keys: a key goes once all its records are beyond the
    /// newest `keep`; one that straddles the count stays.
    #[test]
    fn retention_counts_the_records_a_key_holds() {
        let keys = vec![
            "d/0000000100000.4-a".to_string(),
            "d/0000000200000-b".to_string(),
            "d/0000000300000.3-c".to_string(),
        ];
        let keep = |keep| Retention {
            keep,
            max_age: Duration::ZERO,
        };
        let now = at(400);
        let cut = |key: &str, keep| Prune {
            key: key.into(),
            keep,
        };
        assert_eq!(
            to_prune(&keys, "d/", keep(4), now),
            [cut("d/0000000100000.4-a", 0)]
        );
        assert_eq!(
            to_prune(&keys, "d/", keep(6), now),
            [cut("d/0000000100000.4-a", 2)]
        );
        assert!(to_prune(&keys, "d/", keep(8), now).is_empty());
        assert_eq!(
            to_prune(&keys, "d/", keep(2), now),
            [
                cut("d/0000000100000.4-a", 0),
                cut("d/0000000200000-b", 0),
                cut("d/0000000300000.3-c", 2)
            ]
        );
        let value = br#"[{"n":1},{"n":2},{"n":3}]"#;
        assert_eq!(cut_to_newest(value, 2).unwrap(), br#"[{"n":2},{"n":3}]"#);
        assert_eq!(cut_to_newest(b"{}", 2), None);
    }

    fn pruned(prunes: Vec<Prune>) -> Vec<String> {
        prunes
            .into_iter()
            .map(|prune| {
                assert_eq!(prune.keep, 0, "{prune:?}");
                prune.key
            })
            .collect()
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
