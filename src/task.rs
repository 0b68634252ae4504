//! The task model: lenient parsing of what producers PUT, the ordering key, the state a task
//! is in, and the values leaderq writes back (claims, retries, dead letters).
//!
//! Producers write `taskTime` as epoch seconds (number or string) or RFC 3339, and
//! `taskTaken` as a bool or `"true"`/`"false"`; both are accepted. Every field leaderq does not
//! own is preserved untouched, in the producer's order. Knows nothing of Consul transport.

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use serde_json::{json, Map, Value};

use crate::consul::KvPair;

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
    pub taken_by: Option<Value>,
    pub last_error: Option<String>,
    /// The whole JSON object, as the producer (and leaderq) wrote it.
    pub fields: Map<String, Value>,
    pub session: Option<String>,
    pub create_index: u64,
    pub modify_index: u64,
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
}

/// Where a task stands, as the leader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Ready to claim now.
    Pending,
    /// Waiting for its retry backoff to pass.
    Delayed(DateTime<Utc>),
    /// Locked by a live session: someone runs it.
    InFlight,
    /// Marked taken by leaderq, but the session that held it is gone: its replica died.
    Orphan,
    /// Marked taken by some other program (no `takenBy`); left alone.
    Foreign,
}

impl Task {
    pub fn parse(pair: &KvPair) -> Result<Task, Invalid> {
        let value: Value =
            serde_json::from_slice(&pair.value).map_err(|e| Invalid::NotJson(e.to_string()))?;
        let fields = match value {
            Value::Object(fields) => fields,
            other => return Err(Invalid::NotObject(kind(&other))),
        };
        let task_type = match fields.get("taskType") {
            None | Some(Value::Null) => return Err(Invalid::MissingType),
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            Some(_) => return Err(Invalid::BadType),
        };
        let time = match fields.get("taskTime") {
            None | Some(Value::Null) => return Err(Invalid::MissingTime),
            Some(value) => parse_time(value).ok_or_else(|| Invalid::BadTime(value.to_string()))?,
        };
        let taken = match fields.get("taskTaken") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => true,
            Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => false,
            Some(other) => return Err(Invalid::BadTaken(other.to_string())),
        };
        let id = match fields.get("taskId") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => pair.key.rsplit('/').next().unwrap_or(&pair.key).to_string(),
        };
        let attempts = fields
            .get("attempts")
            .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()))
            .unwrap_or(0) as u32;
        let not_before = fields
            .get("notBefore")
            .and_then(Value::as_str)
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.with_timezone(&Utc));
        let taken_by = fields.get("takenBy").filter(|v| !v.is_null()).cloned();
        let last_error = fields
            .get("lastError")
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
            taken_by,
            last_error,
            fields,
            session: pair.session.clone(),
            create_index: pair.create_index,
            modify_index: pair.modify_index,
        })
    }

    /// Claim order: `taskTime`, then `CreateIndex`, then key.
    pub fn order_key(&self) -> (DateTime<Utc>, u64, &str) {
        (self.time, self.create_index, &self.key)
    }

    pub fn status(&self, now: DateTime<Utc>) -> Status {
        if self.session.is_some() {
            // A lock held by a live session means a run is in progress, whatever the value
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
        match self.not_before {
            Some(at) if at > now => Status::Delayed(at),
            _ => Status::Pending,
        }
    }

    /// The task's JSON with `updates` applied (a `Null` removes the field).
    pub fn with(&self, updates: &[(&str, Value)]) -> Vec<u8> {
        let mut fields = self.fields.clone();
        for (name, value) in updates {
            if value.is_null() {
                fields.shift_remove(*name);
            } else {
                fields.insert((*name).to_string(), value.clone());
            }
        }
        serde_json::to_vec(&Value::Object(fields)).expect("task JSON serializes")
    }

    /// The value written when the leader claims the task.
    pub fn claimed(&self, session: &str, node: &str, now: DateTime<Utc>) -> Vec<u8> {
        self.with(&[
            ("taskTaken", Value::Bool(true)),
            ("takenBy", json!({"session": session, "node": node})),
            ("takenAt", Value::String(rfc3339(now))),
        ])
    }

    /// The value written when a run failed and the task waits for another attempt.
    pub fn retried(&self, attempts: u32, error: &str, not_before: DateTime<Utc>) -> Vec<u8> {
        self.with(&[
            ("taskTaken", Value::Bool(false)),
            ("attempts", json!(attempts)),
            ("lastError", Value::String(error.to_string())),
            ("notBefore", Value::String(rfc3339(not_before))),
            ("takenBy", Value::Null),
            ("takenAt", Value::Null),
        ])
    }
}

/// The dead letter for an entry under the queue prefix: the task itself (or its raw value
/// when it is not a JSON object) with the reason, the time and where it came from.
pub fn dead_letter(pair: &KvPair, reason: &str, now: DateTime<Utc>) -> Vec<u8> {
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
    serde_json::to_vec(&Value::Object(fields)).expect("dead letter serializes")
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

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(key: &str, value: &str, create_index: u64) -> KvPair {
        KvPair {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            flags: 0,
            session: None,
            lock_index: 0,
            create_index,
            modify_index: create_index,
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
        assert!(matches!(
            parse(r#"{"taskType":"x","taskTime":"yesterday"}"#),
            Invalid::BadTime(_)
        ));
        assert!(matches!(
            parse(r#"{"taskType":"x","taskTime":1,"taskTaken":"maybe"}"#),
            Invalid::BadTaken(_)
        ));
    }

    /// Tasks order by taskTime, then CreateIndex, then key.
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
        task.session = Some("s".into());
        assert_eq!(task.status(now), Status::InFlight);
        task.session = None;
        task.taken = true;
        assert_eq!(task.status(now), Status::Foreign);
        task.taken_by = Some(json!({"session": "s"}));
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

    /// Rewrites keep the producer's fields and their order.
    #[test]
    fn rewrites_preserve_producer_fields_in_order() {
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
}
