//! The task model: lenient parsing of what producers PUT, the ordering key, the state a task
//! is in, and the values leaderq writes back (claims, retries, dead letters).
//!
//! Producers write `taskTime` as epoch seconds (number or string) or RFC 3339, and
//! `taskTaken` as a bool or `"true"`/`"false"`; both are accepted. Every field leaderq does not
//! own is preserved untouched, in the producer's order. Knows nothing of Consul transport.
//!
//! A producer's `runAt` (the same time forms as `taskTime`) schedules the task: it is not
//! due before then. Unlike leaderq's own `notBefore`, it is the producer's word: one that
//! cannot be read, or lies further ahead than the queue allows (`check_run_at`), makes the
//! task invalid rather than being ignored. With both, the task is due at the later one.
//!
//! The fields leaderq owns are read defensively, since anyone can write them: `attempts` is
//! a count that saturates (huge numbers, floats, numeric strings; negative or junk is 0) and
//! never reaches u32::MAX, so the run number `attempts + 1` cannot overflow; `notBefore` is
//! RFC 3339 or epoch seconds, and anything else (junk, out of range) is ignored, which
//! makes the task due. How far ahead a notBefore is honoured is the queue's decision.
//!
//! Size: lenient parsing of every producer field and the values leaderq writes back, with
//! their tests; the key rule is in key.rs.

pub mod attempts;
pub mod history;
pub mod key;
mod known;
pub mod output;
pub mod progress;
mod rewrite;
pub mod shard;

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use serde_json::{json, Map, Value};

use crate::coord::{LeaseId, StoredTask, TaskVersion};
use known::Read;
use rewrite::{RawFields, Rewritten};

/// The largest `attempts` read from a task: one below u32::MAX, so that the run number
/// (`attempts + 1`) saturates at u32::MAX instead of overflowing.
pub const MAX_ATTEMPTS_READ: u32 = u32::MAX - 1;
/// `lastError` is cut to this many bytes: a handler's error must not make the task's value
/// too large to write back.
pub const LAST_ERROR_MAX: usize = 4096;
/// Fields of a dead letter that are kept when the record has to be trimmed to fit.
const DEAD_LETTER_OWN: [&str; 5] = [
    "deadReason",
    "deadAt",
    "originalKey",
    "deadDropped",
    "originalBytes",
];

/// A task as read from its KV entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    pub key: String,
    pub id: String,
    pub task_type: String,
    pub time: DateTime<Utc>,
    pub taken: bool,
    pub attempts: u32,
    pub not_before: Option<DateTime<Utc>>,
    /// The producer's schedule (`runAt`): not due before then.
    pub run_at: Option<DateTime<Utc>>,
    /// Boxed: rarely there, and a `Value` is 72 bytes in every pending task.
    pub taken_by: Option<Box<Value>>,
    pub last_error: Option<String>,
    /// The producer's `maxAttempts`: the runs this task gets, over its type's and the
    /// queue's.
    pub max_attempts: Option<u32>,
    /// `taskPriority`: higher first, before `taskTime`. The producer's, or (once the leader
    /// sorted the task out) its type's when the producer gave none; absent, 0.
    pub priority: Option<i32>,
    /// The whole JSON object, as the producer (and leaderq) wrote it: kept as read and
    /// parsed again only to write the task back (`with`), since a backlog holds every
    /// pending task and a parsed object takes several times its bytes.
    value: Box<[u8]>,
    /// `taskGroup`, empty when there is none.
    group: Box<str>,
    /// The lease holding the task's claim, if one still does.
    pub holder: Option<LeaseId>,
    /// When the task was first written, for ordering ties.
    pub created: u64,
    /// The task's version as read: a write conditioned on it fails if the task moved.
    pub version: TaskVersion,
}

/// Why an entry is not a task; the text goes into the dead letter.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("value is not JSON: {0}")]
    NotJson(String),
    #[error("value is a JSON {0}, not an object")]
    NotObject(&'static str),
    #[error("taskType is missing")]
    MissingType,
    #[error("taskType must be a non-empty string")]
    BadType,
    #[error("taskTime is missing")]
    MissingTime,
    #[error("taskTime {0} is neither epoch seconds nor an RFC 3339 time")]
    BadTime(String),
    #[error("taskTaken {0} is neither true nor false")]
    BadTaken(String),
    #[error("taskGroup {0} is not a string of at most {MAX_GROUP_LEN} bytes")]
    BadGroup(String),
    #[error("runAt {0} is neither epoch seconds (a number or a numeric string) nor an RFC 3339 time such as \"2030-01-31T08:00:00Z\"")]
    BadRunAt(String),
    #[error("maxAttempts {0} is not a whole number from 1 to {MAX_ATTEMPTS_ASKED}")]
    BadMaxAttempts(String),
    #[error(
        "taskPriority {0} is not a whole number from -2147483648 to 2147483647 (higher runs first)"
    )]
    BadPriority(String),
    #[error("runAt {} is more than {} ahead (queue.run_at_max_ahead): schedule it nearer, or raise the setting", rfc3339(*.run_at), crate::util::duration::format(*.max_ahead))]
    RunAtTooFar {
        run_at: DateTime<Utc>,
        max_ahead: Duration,
    },
}

impl Invalid {
    /// The producer's field at fault, for an answer that names it; `None` when the value
    /// as a whole is (not JSON, not an object).
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Invalid::NotJson(_) | Invalid::NotObject(_) => None,
            Invalid::MissingType | Invalid::BadType => Some("taskType"),
            Invalid::MissingTime | Invalid::BadTime(_) => Some("taskTime"),
            Invalid::BadTaken(_) => Some("taskTaken"),
            Invalid::BadGroup(_) => Some("taskGroup"),
            Invalid::BadRunAt(_) | Invalid::RunAtTooFar { .. } => Some("runAt"),
            Invalid::BadMaxAttempts(_) => Some("maxAttempts"),
            Invalid::BadPriority(_) => Some("taskPriority"),
        }
    }
}

/// The longest `taskGroup`: a name, not a payload.
pub const MAX_GROUP_LEN: usize = 256;

/// Where a task stands, as the leader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Ready to claim now.
    Pending,
    /// Waiting for its retry backoff to pass (leaderq's `notBefore`).
    Delayed(DateTime<Utc>),
    /// Waiting for the time its producer scheduled it for (`runAt`).
    Scheduled(DateTime<Utc>),
    /// Held by a live lease: someone runs it.
    InFlight,
    /// Marked taken by leaderq, but the lease that held it is gone: its replica died.
    Orphan,
    /// Marked taken by some other program (no `takenBy`); left alone.
    Foreign,
}

impl Status {
    /// The state's name in `tasks list`, `status` and the dashboard.
    pub fn name(&self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Delayed(_) => "delayed",
            Status::Scheduled(_) => "scheduled",
            Status::InFlight => "in_flight",
            Status::Orphan => "orphaned",
            Status::Foreign => "foreign",
        }
    }

    /// When a task waiting for its time (a retry's or its producer's) is due.
    pub fn due(&self) -> Option<DateTime<Utc>> {
        match self {
            Status::Delayed(at) | Status::Scheduled(at) => Some(*at),
            _ => None,
        }
    }
}

impl Task {
    pub fn parse(pair: &StoredTask) -> Result<Task, Invalid> {
        let mut task = Task::read(pair)?;
        task.value = Box::from(pair.value.as_slice());
        Ok(task)
    }

    /// `parse`, taking the value over instead of copying it (a listing of a large backlog
    /// holds every value once); an entry that is not a task comes back with the reason.
    pub fn parse_owned(mut pair: StoredTask) -> Result<Task, (Invalid, StoredTask)> {
        match Task::read(&pair) {
            Ok(mut task) => {
                task.value = std::mem::take(&mut pair.value).into_boxed_slice();
                Ok(task)
            }
            Err(invalid) => Err((invalid, pair)),
        }
    }

    /// The task in `pair`, its value left empty.
    fn read(pair: &StoredTask) -> Result<Task, Invalid> {
        let mut fields = match Read::parse(&pair.value) {
            Ok(Read::Object(fields)) => fields,
            Ok(Read::Not(kind)) => return Err(Invalid::NotObject(kind)),
            Err(e) => return Err(Invalid::NotJson(e.to_string())),
        };
        let task_type = match fields.task_type.as_ref() {
            None | Some(Value::Null) => return Err(Invalid::MissingType),
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            Some(_) => return Err(Invalid::BadType),
        };
        let time = match fields.time.as_ref() {
            None | Some(Value::Null) => return Err(Invalid::MissingTime),
            Some(value) => parse_time(value).ok_or_else(|| Invalid::BadTime(value.to_string()))?,
        };
        let taken = match fields.taken.as_ref() {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => true,
            Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => false,
            Some(other) => return Err(Invalid::BadTaken(other.to_string())),
        };
        let group = match fields.group.as_ref() {
            None | Some(Value::Null) => Box::from(""),
            Some(Value::String(group)) if group.len() <= MAX_GROUP_LEN => Box::from(group.as_str()),
            Some(other) => return Err(Invalid::BadGroup(shown(other))),
        };
        let run_at = match fields.run_at.as_ref() {
            None | Some(Value::Null) => None,
            Some(value) => Some(parse_time(value).ok_or_else(|| Invalid::BadRunAt(shown(value)))?),
        };
        let id = match fields.id.as_ref() {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => pair.key.rsplit('/').next().unwrap_or(&pair.key).to_string(),
        };
        let attempts = fields.attempts.as_ref().map_or(0, parse_attempts);
        let max_attempts = match fields.max_attempts.as_ref() {
            None | Some(Value::Null) => None,
            Some(value) => Some(
                parse_max_attempts(value).ok_or_else(|| Invalid::BadMaxAttempts(shown(value)))?,
            ),
        };
        let priority = match fields.priority.as_ref() {
            None | Some(Value::Null) => None,
            Some(value) => {
                Some(parse_priority(value).ok_or_else(|| Invalid::BadPriority(shown(value)))?)
            }
        };
        let not_before = fields.not_before.as_ref().and_then(parse_time);
        let taken_by = fields
            .taken_by
            .take()
            .filter(|v| !v.is_null())
            .map(Box::new);
        let last_error = fields
            .last_error
            .as_ref()
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(Task {
            key: pair.key.clone(),
            id,
            task_type,
            time,
            taken,
            attempts,
            not_before,
            run_at,
            taken_by,
            last_error,
            max_attempts,
            priority,
            value: Box::default(),
            group,
            holder: pair.holder.clone(),
            created: pair.created,
            version: pair.version,
        })
    }

    /// The number of the next run: attempts made so far plus one, saturating.
    pub fn run_number(&self) -> u32 {
        self.attempts.saturating_add(1)
    }

    /// The task's concurrency group (`taskGroup`): no two tasks of one group run at once.
    /// Tasks without one form one group, the empty name.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The value as read.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The value as read and the group, taken out: what a backlog keeps of a pending task
    /// besides its place and version (the rest is parsed again from the value).
    pub fn into_value_and_group(self) -> (Box<[u8]>, Box<str>) {
        (self.value, self.group)
    }

    /// The task's JSON object, parsed again from the value read.
    pub fn fields(&self) -> Map<String, Value> {
        serde_json::from_slice(&self.value).expect("the value parsed as an object when read")
    }

    /// The latest progress a run recorded (`progress`, 0 to 1) and its message, if any.
    pub fn progress(&self) -> Option<(f64, Option<String>)> {
        let fields = self.fields();
        let progress = fields.get(progress::PROGRESS)?.as_f64()?.clamp(0.0, 1.0);
        let message = fields
            .get(progress::PROGRESS_MESSAGE)
            .and_then(Value::as_str);
        Some((progress, message.map(str::to_string)))
    }

    /// Claim order: `taskPriority` (higher first), then `taskTime`, then creation, then key.
    pub fn order_key(&self) -> (std::cmp::Reverse<i32>, DateTime<Utc>, u64, &str) {
        let priority = std::cmp::Reverse(self.priority.unwrap_or(0));
        (priority, self.time, self.created, &self.key)
    }

    pub fn status(&self, now: DateTime<Utc>) -> Status {
        if self.holder.is_some() {
            // A claim held by a live lease means a run is in progress, whatever the value
            // says: a producer's re-PUT keeps the lock and is handled when that run ends.
            return Status::InFlight;
        }
        if self.taken {
            return if self.taken_by.is_some() {
                Status::Orphan
            } else {
                Status::Foreign
            };
        }
        let ahead = |at: Option<DateTime<Utc>>| at.filter(|at| *at > now);
        match (ahead(self.not_before), ahead(self.run_at)) {
            // Due at the later of the two.
            (Some(retry), Some(run_at)) if run_at > retry => Status::Scheduled(run_at),
            (Some(retry), _) => Status::Delayed(retry),
            (None, Some(run_at)) => Status::Scheduled(run_at),
            (None, None) => Status::Pending,
        }
    }

    /// Refuses a `runAt` more than `max_ahead` after `now`: a time that far out is a
    /// producer's mistake (milliseconds written as seconds, a wrong year) more often than a
    /// plan, and a task parked for years would be silently lost from sight.
    pub fn check_run_at(&self, now: DateTime<Utc>, max_ahead: Duration) -> Result<(), Invalid> {
        let Some(run_at) = self.run_at else {
            return Ok(());
        };
        let limit = chrono::Duration::from_std(max_ahead)
            .ok()
            .and_then(|ahead| now.checked_add_signed(ahead));
        match limit {
            Some(limit) if run_at > limit => Err(Invalid::RunAtTooFar { run_at, max_ahead }),
            _ => Ok(()),
        }
    }

    /// Whether a task that is not due before `at` waits for its producer's schedule
    /// (`runAt`), rather than for a retry's backoff or a lock-delay: such a task holds no
    /// place in its group's order until it is due.
    pub fn waits_for_run_at(&self, at: DateTime<Utc>) -> bool {
        self.run_at == Some(at)
    }

    /// The task's JSON with `updates` applied (a `Null` removes the field), its other
    /// fields in their order and as they were written (`rewrite.rs`).
    pub fn with(&self, updates: &[(&str, Value)]) -> Vec<u8> {
        let fields =
            RawFields::parse(&self.value).expect("the value parsed as an object when read");
        serde_json::to_vec(&Rewritten {
            fields: &fields,
            updates,
        })
        .expect("task JSON serializes")
    }

    /// The same task with `updates` in its value: for fields leaderq writes during a run
    /// (progress, checkpoint), which change none of the fields parsed here.
    pub fn updated(&self, updates: &[(&str, Value)]) -> Task {
        Task {
            value: self.with(updates).into_boxed_slice(),
            ..self.clone()
        }
    }

    /// The value written when the leader claims the task: a new run has reported no
    /// progress yet (an earlier run's checkpoint stays, for it to start from).
    pub fn claimed(&self, lease: &str, node: &str, now: DateTime<Utc>) -> Vec<u8> {
        self.with(&[
            ("taskTaken", Value::Bool(true)),
            ("takenBy", json!({"session": lease, "node": node})),
            ("takenAt", Value::String(rfc3339(now))),
            (progress::PROGRESS, Value::Null),
            (progress::PROGRESS_MESSAGE, Value::Null),
        ])
    }

    /// The value written when a run failed and the task waits for another attempt.
    pub fn retried(&self, attempts: u32, error: &str, not_before: DateTime<Utc>) -> Vec<u8> {
        self.retried_with(attempts, error, not_before, None)
    }

    /// As [`Task::retried`], after a run the leader saw: `run` joins the attempt log in the
    /// same write.
    pub fn retried_after(
        &self,
        attempts: u32,
        error: &str,
        not_before: DateTime<Utc>,
        run: &attempts::Attempt,
    ) -> Vec<u8> {
        self.retried_with(attempts, error, not_before, Some(run))
    }

    /// The update that adds `run` to the task's attempt log.
    pub fn logged(&self, run: &attempts::Attempt) -> (&'static str, Value) {
        (
            attempts::ATTEMPT_LOG,
            attempts::appended(&self.fields(), run),
        )
    }

    fn retried_with(
        &self,
        attempts: u32,
        error: &str,
        not_before: DateTime<Utc>,
        run: Option<&attempts::Attempt>,
    ) -> Vec<u8> {
        let mut updates = vec![
            ("taskTaken", Value::Bool(false)),
            ("attempts", json!(attempts)),
            (
                "lastError",
                Value::String(cut(error, LAST_ERROR_MAX).to_string()),
            ),
            ("notBefore", Value::String(rfc3339(not_before))),
            ("takenBy", Value::Null),
            ("takenAt", Value::Null),
        ];
        updates.extend(run.map(|run| self.logged(run)));
        self.with(&updates)
    }
}

/// The dead letter for an entry under the queue prefix: the task itself (or its raw value
/// when it is not a JSON object) with the reason, the time and where it came from.
pub fn dead_letter(pair: &StoredTask, reason: &str, now: DateTime<Utc>) -> Vec<u8> {
    encode(&dead_letter_fields(pair, reason, now))
}

fn encode(fields: &Map<String, Value>) -> Vec<u8> {
    serde_json::to_vec(fields).expect("a JSON object serializes")
}

fn dead_letter_fields(pair: &StoredTask, reason: &str, now: DateTime<Utc>) -> Map<String, Value> {
    let mut fields = match serde_json::from_slice::<Value>(&pair.value) {
        Ok(Value::Object(fields)) => fields,
        _ => {
            let mut fields = Map::new();
            fields.insert(
                "rawValue".into(),
                Value::String(String::from_utf8_lossy(&pair.value).into_owned()),
            );
            fields
        }
    };
    fields.insert("deadReason".into(), Value::String(reason.to_string()));
    fields.insert("deadAt".into(), Value::String(rfc3339(now)));
    fields.insert("originalKey".into(), Value::String(pair.key.clone()));
    fields
}

/// The dead letter for `pair`, no longer than `max_len` bytes: when the whole task does not
/// fit (a value too large to move in one transaction), its largest fields are dropped,
/// largest first, and named in `deadDropped` with the original size in `originalBytes`;
/// the reason and the original key are always kept. Also says whether it trimmed.
pub fn dead_letter_within(
    pair: &StoredTask,
    reason: &str,
    now: DateTime<Utc>,
    max_len: usize,
) -> (Vec<u8>, bool) {
    let mut fields = dead_letter_fields(pair, reason, now);
    let full = encode(&fields);
    if full.len() <= max_len {
        return (full, false);
    }
    let mut droppable: Vec<(String, usize)> = fields
        .iter()
        .filter(|(name, _)| !DEAD_LETTER_OWN.contains(&name.as_str()))
        .map(|(name, value)| (name.clone(), name.len() + value.to_string().len()))
        .collect();
    droppable.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    fields.insert("originalBytes".into(), json!(pair.value.len()));
    let mut dropped = Vec::new();
    for (name, _) in droppable {
        fields.shift_remove(&name);
        dropped.push(Value::String(name));
        fields.insert("deadDropped".into(), Value::Array(dropped.clone()));
        let trimmed = encode(&fields);
        if trimmed.len() <= max_len {
            return (trimmed, true);
        }
    }
    // Only the record's own fields are left: cut the reason, the one that can be long.
    let over = encode(&fields).len().saturating_sub(max_len);
    let reason = fields
        .get("deadReason")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let kept = cut(&reason, reason.len().saturating_sub(over));
    fields.insert("deadReason".into(), Value::String(kept.to_string()));
    (encode(&fields), true)
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `attempts` as a saturating count: numbers and numeric strings, fractions rounded down,
/// anything above MAX_ATTEMPTS_READ read as it; negative, not a number or junk is 0.
fn parse_attempts(value: &Value) -> u32 {
    let number = match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    match number {
        // A float-to-int `as` saturates (and maps NaN to 0).
        Some(n) if n > 0.0 => (n as u32).min(MAX_ATTEMPTS_READ),
        _ => 0,
    }
}

/// The most runs a task's own `maxAttempts` may ask for.
pub const MAX_ATTEMPTS_ASKED: u32 = 1000;

/// A producer's `maxAttempts`: a whole number from 1 to `MAX_ATTEMPTS_ASKED`, written as a
/// number or a string of digits.
fn parse_max_attempts(value: &Value) -> Option<u32> {
    let asked = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    }?;
    u32::try_from(asked)
        .ok()
        .filter(|n| (1..=MAX_ATTEMPTS_ASKED).contains(n))
}

/// A producer's `taskPriority`: a whole number that fits an `i32`, written as a number or
/// a string of digits (with a sign).
fn parse_priority(value: &Value) -> Option<i32> {
    let asked = match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    }?;
    i32::try_from(asked).ok()
}

/// `pair` with `fields` set in its value, when that is a JSON object; as it is otherwise.
pub fn stamped(pair: &StoredTask, fields: &[(&str, Value)]) -> StoredTask {
    let mut stamped = pair.clone();
    if let Ok(Value::Object(mut object)) = serde_json::from_slice::<Value>(&pair.value) {
        for (name, value) in fields {
            object.insert((*name).to_string(), value.clone());
        }
        stamped.value = encode(&object);
    }
    stamped
}

pub fn rfc3339(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Epoch seconds (number or numeric string, fractions allowed) or an RFC 3339 string.
fn parse_time(value: &Value) -> Option<DateTime<Utc>> {
    let from_seconds = |seconds: f64| {
        if !seconds.is_finite() {
            return None;
        }
        let millis = (seconds * 1000.0).round() as i64;
        Utc.timestamp_millis_opt(millis).single()
    };
    match value {
        Value::Number(n) => from_seconds(n.as_f64()?),
        Value::String(s) => {
            let s = s.trim();
            if let Ok(seconds) = s.parse::<f64>() {
                return from_seconds(seconds);
            }
            DateTime::parse_from_rfc3339(s)
                .ok()
                .map(|t| t.with_timezone(&Utc))
        }
        _ => None,
    }
}

/// A producer's value as a reason quotes it: cut to about 64 bytes.
fn shown(value: &Value) -> String {
    let mut shown = value.to_string();
    if shown.len() > 64 {
        let cut = (0..=61)
            .rev()
            .find(|at| shown.is_char_boundary(*at))
            .unwrap_or(0);
        shown.truncate(cut);
        shown.push_str("...");
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(key: &str, value: &str, created: u64) -> StoredTask {
        StoredTask {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            version: TaskVersion(created),
            created,
            holder: None,
        }
    }

    /// The seed producer's task parses, with taskTime as a string and taskTaken as a bool.
    #[test]
    fn parses_the_seed_task() {
        let task = Task::parse(&pair(
            "oracleTask/task_1",
            r#"{"taskId":"1","taskTime":"1445599887","taskTaken":false,"taskType":"CreateTableSpace","taskPara":{"size":"10G"}}"#,
            5,
        ))
        .unwrap();
        assert_eq!(task.id, "1");
        assert_eq!(task.task_type, "CreateTableSpace");
        assert_eq!(task.time.timestamp(), 1_445_599_887);
        assert!(!task.taken);
        assert_eq!(task.status(Utc::now()), Status::Pending);
    }

    /// Numbers and strings, booleans and "true"/"false", RFC 3339 times are all accepted.
    #[test]
    fn accepts_every_producer_form() {
        let parse = |json: &str| Task::parse(&pair("q/t", json, 1));
        let number =
            parse(r#"{"taskType":"x","taskTime":1445599887,"taskTaken":"false","taskId":7}"#)
                .unwrap();
        assert_eq!(number.time.timestamp(), 1_445_599_887);
        assert_eq!(number.id, "7");
        let rfc = parse(r#"{"taskType":"x","taskTime":"2015-10-23T11:31:27Z","taskTaken":"true"}"#)
            .unwrap();
        assert_eq!(rfc.time.timestamp(), 1_445_599_887);
        assert!(rfc.taken);
        let no_id = parse(r#"{"taskType":"x","taskTime":"1"}"#).unwrap();
        assert_eq!(no_id.id, "t");
    }

    /// Every malformed shape is refused with a reason for the dead letter.
    #[test]
    fn rejects_malformed_tasks_with_reasons() {
        let parse = |json: &str| Task::parse(&pair("q/t", json, 1)).unwrap_err();
        assert!(matches!(parse("not json"), Invalid::NotJson(_)));
        assert_eq!(parse("[1]"), Invalid::NotObject("array"));
        assert_eq!(parse(r#"{"taskTime":1}"#), Invalid::MissingType);
        assert_eq!(parse(r#"{"taskType":"","taskTime":1}"#), Invalid::BadType);
        assert_eq!(parse(r#"{"taskType":"x"}"#), Invalid::MissingTime);
        assert_eq!(
            parse(r#"{"taskType":"x","taskTime":1,"taskGroup":7}"#),
            Invalid::BadGroup("7".into())
        );
        let long = format!(
            r#"{{"taskType":"x","taskTime":1,"taskGroup":"{}"}}"#,
            "g".repeat(MAX_GROUP_LEN + 1)
        );
        assert!(matches!(parse(&long), Invalid::BadGroup(shown) if shown.ends_with("...")));
        assert!(matches!(
            parse(r#"{"taskType":"x","taskTime":"yesterday"}"#),
            Invalid::BadTime(_)
        ));
        assert!(matches!(
            parse(r#"{"taskType":"x","taskTime":1,"taskTaken":"maybe"}"#),
            Invalid::BadTaken(_)
        ));
    }

    /// Tasks order by taskTime, then creation, then key.
    #[test]
    fn orders_by_time_then_create_index_then_key() {
        let mut tasks = [
            pair("q/c", r#"{"taskType":"x","taskTime":"20"}"#, 1),
            pair("q/b", r#"{"taskType":"x","taskTime":10}"#, 9),
            pair("q/a", r#"{"taskType":"x","taskTime":"10"}"#, 9),
            pair("q/d", r#"{"taskType":"x","taskTime":10}"#, 3),
        ]
        .iter()
        .map(|p| Task::parse(p).unwrap())
        .collect::<Vec<_>>();
        tasks.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        let keys: Vec<&str> = tasks.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["q/d", "q/a", "q/b", "q/c"]);
    }

    /// Status follows the lock, the taken flag, takenBy and notBefore.
    #[test]
    fn status_reflects_lock_and_fields() {
        let now = Utc::now();
        let mut task = Task::parse(&pair("q/t", r#"{"taskType":"x","taskTime":1}"#, 1)).unwrap();
        let claimed: Value = serde_json::from_slice(&task.claimed("s", "n", now)).unwrap();
        assert_eq!(claimed["taskTaken"], true);
        assert_eq!(claimed["takenBy"]["session"], "s");
        task.holder = Some(LeaseId("s".into()));
        assert_eq!(task.status(now), Status::InFlight);
        task.holder = None;
        task.taken = true;
        assert_eq!(task.status(now), Status::Foreign);
        task.taken_by = Some(Box::new(json!({"session": "s"})));
        assert_eq!(task.status(now), Status::Orphan);
        let later = now + chrono::Duration::seconds(30);
        let retried = Task::parse(&pair(
            "q/t",
            std::str::from_utf8(&task.retried(1, "boom", later)).unwrap(),
            1,
        ))
        .unwrap();
        assert_eq!(
            retried.status(now),
            Status::Delayed(retried.not_before.unwrap())
        );
        assert_eq!(
            (retried.attempts, retried.last_error.as_deref()),
            (1, Some("boom"))
        );
        assert!(retried.taken_by.is_none());
    }

    /// Rewrites keep the producer's fields and their order; updated fields stay in place,
    /// new ones come last, nulls remove, the last update of a name wins.
    #[test]
    fn rewrites_preserve_producer_fields_in_order() {
        let task = Task::parse(&pair(
            "q/t",
            r#"{"a":1,"taskType":"x","taskTime":1,"takenBy":{"s":1},"b":2}"#,
            1,
        ))
        .unwrap();
        let text = String::from_utf8(task.with(&[
            ("taskTime", json!(5)),
            ("takenBy", Value::Null),
            ("new", json!(1)),
            ("new", json!(2)),
            ("gone", Value::Null),
        ]))
        .unwrap();
        assert_eq!(text, r#"{"a":1,"taskType":"x","taskTime":5,"b":2,"new":2}"#);
        let task = Task::parse(&pair(
            "q/t",
            r#"{"zeta":1,"taskType":"x","taskTime":1,"alpha":{"n":2}}"#,
            1,
        ))
        .unwrap();
        let text = String::from_utf8(task.with(&[("attempts", json!(1))])).unwrap();
        assert_eq!(
            text,
            r#"{"zeta":1,"taskType":"x","taskTime":1,"alpha":{"n":2},"attempts":1}"#
        );
        let dead = dead_letter(
            &pair("q/bad", "not json", 1),
            "value is not JSON",
            Utc::now(),
        );
        let dead: Value = serde_json::from_slice(&dead).unwrap();
        assert_eq!(dead["rawValue"], "not json");
        assert_eq!(dead["originalKey"], "q/bad");
    }

    /// `attempts` saturates: never above MAX_ATTEMPTS_READ, so the run number is at most
    /// u32::MAX; negative, fractional, textual and junk values read sanely.
    #[test]
    fn attempts_saturate_and_never_wrap() {
        let attempts = |raw: &str| {
            let json = format!(r#"{{"taskType":"x","taskTime":1,"attempts":{raw}}}"#);
            Task::parse(&pair("q/t", &json, 1)).unwrap()
        };
        for (raw, read) in [
            ("0", 0),
            ("3", 3),
            ("\"7\"", 7),
            ("2.9", 2),
            ("-3", 0),
            ("-1e300", 0),
            ("\"many\"", 0),
            ("null", 0),
            ("true", 0),
            ("[1]", 0),
            ("4294967294", MAX_ATTEMPTS_READ),
            ("4294967295", MAX_ATTEMPTS_READ),
            ("4294967297", MAX_ATTEMPTS_READ),
            ("18446744073709551615", MAX_ATTEMPTS_READ),
            ("1e30", MAX_ATTEMPTS_READ),
            ("\"99999999999999999999999\"", MAX_ATTEMPTS_READ),
        ] {
            assert_eq!(attempts(raw).attempts, read, "attempts {raw}");
        }
        assert_eq!(attempts("4294967297").run_number(), u32::MAX);
        assert_eq!(attempts("0").run_number(), 1);
    }

    /// notBefore is RFC 3339 or epoch seconds; junk and out-of-range values are ignored
    /// (the task is due), and none of them panics.
    #[test]
    fn not_before_reads_times_and_ignores_the_rest() {
        let not_before = |raw: &str| {
            let json = format!(r#"{{"taskType":"x","taskTime":1,"notBefore":{raw}}}"#);
            Task::parse(&pair("q/t", &json, 1)).unwrap().not_before
        };
        let far = not_before("\"9999-12-31T23:59:59Z\"").unwrap();
        assert_eq!(far.timestamp(), 253_402_300_799);
        assert_eq!(not_before("-5").unwrap().timestamp(), -5);
        assert_eq!(
            not_before("\"1700000000\"").unwrap().timestamp(),
            1_700_000_000
        );
        for junk in [
            "\"soon\"",
            "1e300",
            "-1e300",
            "null",
            "{}",
            "\"+275760-09-13T00:00:01Z\"",
        ] {
            assert_eq!(not_before(junk), None, "{junk}");
        }
        let now = Utc::now();
        let past = Task::parse(&pair(
            "q/t",
            r#"{"taskType":"x","taskTime":1,"notBefore":-5}"#,
            1,
        ))
        .unwrap();
        assert_eq!(past.status(now), Status::Pending);
    }

    fn with_run_at(raw: &str) -> Result<Task, Invalid> {
        let json = format!(r#"{{"taskType":"x","taskTime":1,"runAt":{raw}}}"#);
        Task::parse(&pair("q/t", &json, 1))
    }

    /// runAt takes taskTime's forms: epoch seconds as a number or a numeric string,
    /// fractions kept to the millisecond, or RFC 3339 with any offset; null is no runAt.
    #[test]
    fn run_at_reads_every_time_form() {
        let run_at = |raw: &str| with_run_at(raw).unwrap().run_at;
        let at = DateTime::from_timestamp_millis(1_700_000_000_250).unwrap();
        for raw in [
            "1700000000.25",
            "\"1700000000.25\"",
            "\" 1700000000.250 \"",
            "\"2023-11-14T22:13:20.250Z\"",
            "\"2023-11-15T00:13:20.250+02:00\"",
        ] {
            assert_eq!(run_at(raw), Some(at), "{raw}");
        }
        assert_eq!(run_at("1700000000").unwrap().timestamp(), 1_700_000_000);
        assert_eq!(run_at("null"), None);
        let none = Task::parse(&pair("q/t", r#"{"taskType":"x","taskTime":1}"#, 1)).unwrap();
        assert_eq!(none.run_at, None);
    }

    /// A runAt that is not a time makes the task invalid (a dead letter), with a reason that
    /// names runAt, quotes the value and says which forms are accepted; it is never taken as
    /// "now" as a junk notBefore is.
    #[test]
    fn an_unreadable_run_at_is_invalid_with_the_accepted_forms() {
        for raw in [
            "\"next tuesday\"",
            "\"\"",
            "true",
            "{}",
            "[1]",
            "1e300",
            "\"+275760-09-13T00:00:01Z\"",
        ] {
            let invalid = with_run_at(raw).unwrap_err();
            assert!(
                matches!(invalid, Invalid::BadRunAt(_)),
                "{raw}: {invalid:?}"
            );
            let reason = invalid.to_string();
            assert!(
                reason.starts_with("runAt ")
                    && reason.contains("epoch seconds")
                    && reason.contains("RFC 3339"),
                "{reason}"
            );
        }
        let long = format!("\"{}\"", "z".repeat(500));
        let reason = with_run_at(&long).unwrap_err().to_string();
        assert!(reason.len() < 250 && reason.contains("..."), "{reason}");
    }

    /// A runAt up to queue.run_at_max_ahead from now is accepted; one beyond it is refused
    /// with a reason naming the time, the limit and the setting.
    #[test]
    fn a_run_at_too_far_ahead_is_refused_with_the_setting_named() {
        let now = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let max = Duration::from_secs(24 * 3600);
        let task = |seconds: i64| with_run_at(&(1_700_000_000 + seconds).to_string()).unwrap();
        assert_eq!(task(24 * 3600).check_run_at(now, max), Ok(()));
        assert_eq!(task(-3600).check_run_at(now, max), Ok(()));
        let none = Task::parse(&pair("q/t", r#"{"taskType":"x","taskTime":1}"#, 1)).unwrap();
        assert_eq!(none.check_run_at(now, max), Ok(()));
        let far = task(24 * 3600 + 1).check_run_at(now, max).unwrap_err();
        assert_eq!(
            far.to_string(),
            "runAt 2023-11-15T22:13:21.000Z is more than 24h0m0s ahead (queue.run_at_max_ahead): schedule it nearer, or raise the setting"
        );
        let millis = with_run_at("1700000000250").unwrap();
        assert!(
            matches!(
                millis.check_run_at(now, Duration::from_secs(8784 * 3600)),
                Err(Invalid::RunAtTooFar { .. })
            ),
            "epoch milliseconds written where seconds go are refused, not parked for 50,000 years"
        );
        // A limit too large for the calendar refuses nothing.
        assert_eq!(
            task(24 * 3600 * 365 * 1000).check_run_at(now, Duration::MAX),
            Ok(())
        );
    }

    /// A future runAt makes a free task Scheduled, distinct from a retry's Delayed; a past
    /// one makes it Pending; with a notBefore too, the later of the two says when it is due;
    /// a claim or a taken mark outranks both.
    #[test]
    fn a_run_at_schedules_the_task_until_the_later_of_it_and_not_before() {
        let now = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let at = |seconds: i64| DateTime::from_timestamp(1_700_000_000 + seconds, 0).unwrap();
        let task = |run_at: i64, not_before: Option<i64>| {
            let mut value =
                json!({"taskType": "x", "taskTime": 1, "runAt": 1_700_000_000 + run_at});
            if let Some(nb) = not_before {
                value["notBefore"] = json!(1_700_000_000 + nb);
            }
            Task::parse(&pair("q/t", &value.to_string(), 1)).unwrap()
        };
        assert_eq!(task(60, None).status(now), Status::Scheduled(at(60)));
        assert_eq!(task(-60, None).status(now), Status::Pending);
        assert_eq!(task(0, None).status(now), Status::Pending);
        assert_eq!(task(60, Some(30)).status(now), Status::Scheduled(at(60)));
        assert_eq!(task(30, Some(60)).status(now), Status::Delayed(at(60)));
        assert_eq!(task(-30, Some(60)).status(now), Status::Delayed(at(60)));
        assert_eq!(task(60, Some(-30)).status(now), Status::Scheduled(at(60)));
        let scheduled = task(60, None);
        assert!(scheduled.waits_for_run_at(at(60)));
        assert!(!task(30, Some(60)).waits_for_run_at(at(60)));
        let mut held = task(60, None);
        held.holder = Some(LeaseId("s".into()));
        assert_eq!(held.status(now), Status::InFlight);
        held.holder = None;
        held.taken = true;
        assert_eq!(held.status(now), Status::Foreign);
    }

    /// A retry's lastError is cut to LAST_ERROR_MAX bytes on a character boundary.
    #[test]
    fn last_error_is_cut_to_its_limit() {
        let task = Task::parse(&pair("q/t", r#"{"taskType":"x","taskTime":1}"#, 1)).unwrap();
        let long = "é".repeat(LAST_ERROR_MAX);
        let retried: Value = serde_json::from_slice(&task.retried(1, &long, Utc::now())).unwrap();
        let error = retried["lastError"].as_str().unwrap();
        assert!(error.len() <= LAST_ERROR_MAX && error.len() >= LAST_ERROR_MAX - 1);
    }

    /// A dead letter too large for its transaction drops its largest fields first and says
    /// so; the reason, the original key and the small fields stay.
    #[test]
    fn dead_letter_within_drops_the_largest_fields_to_fit() {
        let big = format!(
            r#"{{"taskId":"h","taskType":"x","taskTime":1,"taskPara":{{"blob":"{}"}},"note":"{}"}}"#,
            "x".repeat(10_000),
            "y".repeat(500)
        );
        let entry = pair("q/h", &big, 1);
        let now = Utc::now();
        let (whole, trimmed) = dead_letter_within(&entry, "too large", now, 100_000);
        assert!(!trimmed);
        assert_eq!(whole, dead_letter(&entry, "too large", now));
        let (value, trimmed) = dead_letter_within(&entry, "too large", now, 1_000);
        assert!(trimmed && value.len() <= 1_000, "{}", value.len());
        let letter: Value = serde_json::from_slice(&value).unwrap();
        assert_eq!(letter["deadDropped"], json!(["taskPara"]));
        assert_eq!(letter["note"].as_str().unwrap().len(), 500);
        let (value, trimmed) = dead_letter_within(&entry, "too large", now, 400);
        assert!(trimmed && value.len() <= 400, "{}", value.len());
        let letter: Value = serde_json::from_slice(&value).unwrap();
        assert_eq!(letter["originalKey"], "q/h");
        assert_eq!(letter["deadReason"], "too large");
        assert_eq!(letter["taskId"], "h");
        assert_eq!(letter["deadDropped"], json!(["taskPara", "note"]));
        assert_eq!(letter["originalBytes"], big.len());
        let (value, _) = dead_letter_within(&entry, &"r".repeat(5_000), now, 300);
        assert!(value.len() <= 300, "{}", value.len());
        let letter: Value = serde_json::from_slice(&value).unwrap();
        assert_eq!(letter["originalKey"], "q/h");
    }

    #[test]
    fn max_attempts_is_a_whole_number_from_1_written_either_way() {
        let parse = |raw: &str| {
            let json = format!(r#"{{"taskType":"x","taskTime":1,"maxAttempts":{raw}}}"#);
            Task::parse(&pair("q/t", &json, 1)).map(|task| task.max_attempts)
        };
        assert_eq!(parse("2"), Ok(Some(2)));
        assert_eq!(parse("\" 5 \""), Ok(Some(5)));
        assert_eq!(parse("null"), Ok(None));
        for bad in ["0", "-1", "1.5", "\"x\"", "1001", "true"] {
            assert!(
                matches!(parse(bad), Err(Invalid::BadMaxAttempts(_))),
                "{bad}: {:?}",
                parse(bad)
            );
        }
    }

    #[test]
    fn task_priority_is_a_whole_number_written_either_way_and_orders_first() {
        let parse = |raw: &str| {
            let json = format!(r#"{{"taskType":"x","taskTime":1,"taskPriority":{raw}}}"#);
            Task::parse(&pair("q/t", &json, 1)).map(|task| task.priority)
        };
        assert_eq!(parse("10"), Ok(Some(10)));
        assert_eq!(parse("\"-5\""), Ok(Some(-5)));
        assert_eq!(parse("null"), Ok(None));
        for bad in ["1.5", "\"high\"", "4294967296", "true", "[1]"] {
            assert!(
                matches!(parse(bad), Err(Invalid::BadPriority(_))),
                "{bad}: {:?}",
                parse(bad)
            );
        }
        let early = Task::parse(&pair("q/a", r#"{"taskType":"x","taskTime":1}"#, 1)).unwrap();
        let urgent = Task::parse(&pair(
            "q/b",
            r#"{"taskType":"x","taskTime":99,"taskPriority":1}"#,
            2,
        ))
        .unwrap();
        assert!(urgent.order_key() < early.order_key());
    }
}
