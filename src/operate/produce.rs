//! A producer's tasks checked before anything is written: the front door's request body (one
//! JSON object, or an array of them) and each line of `leaderq enqueue --stdin`, held to the
//! rules the leader applies when it reads them (`Task::parse`: taskType, taskTime, runAt,
//! taskPriority, maxAttempts, taskGroup, taskTaken; `runAt` within
//! `queue.run_at_max_ahead`), the key rule within the queue prefix, and a size the
//! coordinator takes in one write with the leader's claim on top. A request with one task
//! refused is refused whole, naming the task and the field, so nothing is half-written.
//! Then the tasks cut in writes the coordinator takes ([`chunks`]). The writes themselves
//! are `bulk.rs`'s.
//!
//! Pure: the time, the fresh ids and the coordinator's costs are given.

use std::ops::Range;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::coord::{StoredTask, WriteCost, WriteLimits};
use crate::task::key::{self, Key};
use crate::task::Task;

/// Tasks in one request at most: a bigger batch is better sent as several requests, each
/// answered within a client's timeout.
pub const MAX_TASKS: usize = 10_000;
/// Bytes a claim adds to a task's value (`taskTaken`, `takenBy` with a lease id and a node
/// name, `takenAt`), with room to spare: a task must still fit once the leader claims it.
pub const CLAIM_GROWTH: usize = 512;

/// How a refusal is answered: the request is malformed, a task breaks a rule, or a task
/// (or the request) is too large.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Malformed,
    Invalid,
    TooLarge,
}

/// Why a request is refused whole: which task (its place in the array, or the line), which
/// field, and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub fault: Fault,
    pub index: Option<usize>,
    pub field: Option<String>,
    pub message: String,
}

impl Refusal {
    fn new(fault: Fault, field: Option<&str>, message: String) -> Refusal {
        Refusal {
            fault,
            index: None,
            field: field.map(str::to_string),
            message,
        }
    }

    fn at(mut self, index: usize) -> Refusal {
        self.index = Some(index);
        self
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(index) = self.index {
            write!(f, "task {index}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// A task ready to create: its whole key under the queue prefix and its value, the
/// producer's bytes as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Produced {
    pub key: String,
    pub value: Vec<u8>,
}

/// What a task is held to besides the leader's parsing.
pub struct Rules<'a> {
    /// `queue.prefix`: every key lies under it.
    pub prefix: &'a str,
    /// `queue.run_at_max_ahead`.
    pub run_at_max_ahead: Duration,
    /// The coordinator's limits on one write.
    pub limits: WriteLimits,
    /// What the leader's claim write costs besides its task (the leadership guard).
    pub guard: WriteCost,
    /// What creating a task (key, value) costs.
    pub cost: &'a dyn Fn(&str, &[u8]) -> WriteCost,
}

/// A request's tasks: `one` when the body was a single object (its answer is that task).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub one: bool,
    pub tasks: Vec<Produced>,
}

/// The front door's request: `body`, one JSON object or an array of them, and the
/// `Idempotency-Key` header, which names a single task's key. Every task is checked, and
/// no two may share a key, before the request is accepted.
pub fn request(
    body: &[u8],
    idempotency_key: Option<&str>,
    rules: &Rules<'_>,
    now: DateTime<Utc>,
    fresh_id: &mut dyn FnMut() -> String,
) -> Result<Request, Refusal> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'[') {
        let task = task(body, idempotency_key, rules, now, fresh_id)?;
        return Ok(Request {
            one: true,
            tasks: vec![task],
        });
    }
    if idempotency_key.is_some() {
        return Err(Refusal::new(
            Fault::Malformed,
            Some("Idempotency-Key"),
            "Idempotency-Key names one task's key: send it with one task object, and in an array give each task a taskId (its key is task_<taskId>)".into(),
        ));
    }
    let items: Vec<&RawValue> = serde_json::from_slice(body).map_err(|e| {
        Refusal::new(
            Fault::Malformed,
            None,
            format!("the body is not a JSON array of task objects: {e}"),
        )
    })?;
    if items.is_empty() {
        return Err(Refusal::new(
            Fault::Malformed,
            None,
            "the array holds no task: send at least one".into(),
        ));
    }
    if items.len() > MAX_TASKS {
        return Err(Refusal::new(
            Fault::TooLarge,
            None,
            format!(
                "{} tasks in one request is over {MAX_TASKS}: send them in several requests",
                items.len()
            ),
        ));
    }
    let mut tasks = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let task = task(item.get().as_bytes(), None, rules, now, fresh_id)
            .map_err(|refusal| refusal.at(index))?;
        tasks.push(task);
    }
    refuse_shared_keys(&tasks)?;
    Ok(Request { one: false, tasks })
}

/// Refuses a request in which two tasks have one key: the second would conflict with the
/// first in the same write.
fn refuse_shared_keys(tasks: &[Produced]) -> Result<(), Refusal> {
    let mut seen = std::collections::HashMap::with_capacity(tasks.len());
    for (index, task) in tasks.iter().enumerate() {
        if let Some(first) = seen.insert(task.key.as_str(), index) {
            return Err(Refusal::new(
                Fault::Invalid,
                Some("taskId"),
                format!(
                    "tasks {first} and {index} both have the key {}: give each task its own taskId",
                    task.key
                ),
            )
            .at(index));
        }
    }
    Ok(())
}

/// One task: `value` checked as the leader reads it, its key from `given` (a name under the
/// queue prefix, or a whole key within it), else `task_<taskId>`, else `task_<a fresh id>`.
pub fn task(
    value: &[u8],
    given: Option<&str>,
    rules: &Rules<'_>,
    now: DateTime<Utc>,
    fresh_id: &mut dyn FnMut() -> String,
) -> Result<Produced, Refusal> {
    let parsed: Value = serde_json::from_slice(value)
        .map_err(|e| Refusal::new(Fault::Malformed, None, format!("the task is not JSON: {e}")))?;
    let Value::Object(fields) = &parsed else {
        return Err(Refusal::new(
            Fault::Malformed,
            None,
            "the task is not a JSON object: send {\"taskType\": ..., \"taskTime\": ...}".into(),
        ));
    };
    let key = key_of(fields, given, rules.prefix, fresh_id)?;
    let stored = StoredTask {
        key: key.as_str().to_string(),
        value: value.to_vec(),
        version: crate::coord::TaskVersion(0),
        created: 0,
        holder: None,
    };
    let read = Task::parse(&stored).and_then(|task| {
        task.check_run_at(now, rules.run_at_max_ahead)?;
        Ok(task)
    });
    let task =
        read.map_err(|invalid| Refusal::new(Fault::Invalid, invalid.field(), invalid.to_string()))?;
    if task.taken {
        return Err(Refusal::new(
            Fault::Invalid,
            Some("taskTaken"),
            "taskTaken is true: a new task is not taken (leave it out, or write false)".into(),
        ));
    }
    check_size(key.as_str(), value, rules)?;
    Ok(Produced {
        key: key.into(),
        value: value.to_vec(),
    })
}

/// The task's key: see [`task`].
fn key_of(
    fields: &serde_json::Map<String, Value>,
    given: Option<&str>,
    prefix: &str,
    fresh_id: &mut dyn FnMut() -> String,
) -> Result<Key, Refusal> {
    if let Some(given) = given {
        // A name (one or more segments) under the prefix, or a whole key within it; a key
        // under another prefix is never taken as a name below this one.
        let key = if given.starts_with(prefix) {
            Key::within(given, &[prefix])
        } else if given.contains('/') {
            key::check(given).and(Err(key::Invalid::Outside(prefix.to_string())))
        } else {
            Key::under(prefix, given)
        };
        return key.map_err(|reason| {
            Refusal::new(
                Fault::Invalid,
                Some("Idempotency-Key"),
                format!(
                    "Idempotency-Key {:?} cannot be a task key under {prefix}: {reason}",
                    crate::util::escape::escape(given)
                ),
            )
        });
    }
    let id = match fields.get("taskId") {
        Some(Value::String(id)) if !id.is_empty() => id.clone(),
        Some(Value::Number(id)) => id.to_string(),
        None | Some(Value::Null) => fresh_id(),
        Some(other) => {
            return Err(Refusal::new(
                Fault::Invalid,
                Some("taskId"),
                format!("taskId {other} is neither a non-empty string nor a number"),
            ))
        }
    };
    key::check_id(&id)
        .and_then(|()| Key::under(prefix, &format!("task_{id}")))
        .map_err(|reason| {
            Refusal::new(
                Fault::Invalid,
                Some("taskId"),
                format!(
                    "taskId {:?} cannot name a task (its key is task_<taskId>): {reason}",
                    crate::util::escape::escape(&id)
                ),
            )
        })
}

/// Refuses a task the coordinator would not take in one write once the leader claims it.
fn check_size(key: &str, value: &[u8], rules: &Rules<'_>) -> Result<(), Refusal> {
    let grown = WriteCost {
        ops: 0,
        bytes: CLAIM_GROWTH,
    };
    let claim = rules.guard + (rules.cost)(key, value) + grown;
    if rules.limits.admits(claim) {
        return Ok(());
    }
    Err(Refusal::new(
        Fault::TooLarge,
        None,
        format!(
            "the task is {} bytes, too large for the coordinator to take in one write with the leader's claim ({} bytes at most): keep large payloads elsewhere and put their address in taskPara",
            value.len(),
            rules.limits.max_bytes
        ),
    ))
}

/// The tasks cut in consecutive runs the coordinator takes in one write each, at most
/// `limits` apiece; a task over the limits on its own (which [`task`] refuses) is a run of
/// its own.
pub fn chunks(costs: &[WriteCost], limits: WriteLimits) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    let mut sum = WriteCost::default();
    for (index, cost) in costs.iter().enumerate() {
        if index > start && !limits.admits(sum + *cost) {
            runs.push(start..index);
            start = index;
            sum = WriteCost::default();
        }
        sum = sum + *cost;
    }
    if start < costs.len() {
        runs.push(start..costs.len());
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LIMITS: WriteLimits = WriteLimits {
        max_ops: 4,
        max_bytes: 2000,
    };

    fn cost(key: &str, value: &[u8]) -> WriteCost {
        WriteCost {
            ops: 1,
            bytes: key.len() + value.len(),
        }
    }

    fn rules() -> Rules<'static> {
        Rules {
            prefix: "oracleTask/",
            run_at_max_ahead: Duration::from_secs(3600),
            limits: LIMITS,
            guard: WriteCost { ops: 1, bytes: 50 },
            cost: &cost,
        }
    }

    fn now() -> DateTime<Utc> {
        "2030-01-01T00:00:00Z".parse().unwrap()
    }

    fn ask(body: &str, key: Option<&str>) -> Result<Request, Refusal> {
        let mut n = 0;
        let mut fresh = || {
            n += 1;
            format!("fresh{n}")
        };
        request(body.as_bytes(), key, &rules(), now(), &mut fresh)
    }

    fn refused(body: &str, key: Option<&str>) -> Refusal {
        ask(body, key).expect_err("the request was accepted")
    }

    /// One object with an Idempotency-Key is one task under that key, its bytes as sent.
    #[test]
    fn one_object_is_one_task_under_its_idempotency_key() {
        let body = r#"{"taskType": "T", "taskTime": 1, "b": 2, "a": 1}"#;
        let asked = ask(body, Some("order-17")).unwrap();
        assert!(asked.one);
        assert_eq!(
            asked.tasks,
            [Produced {
                key: "oracleTask/order-17".into(),
                value: body.as_bytes().to_vec()
            }]
        );
        let whole = ask(body, Some("oracleTask/a/b")).unwrap();
        assert_eq!(whole.tasks[0].key, "oracleTask/a/b");
    }

    /// Without a header the key is task_<taskId>, or task_<a fresh id> without taskId.
    #[test]
    fn without_a_header_the_key_comes_from_task_id_or_a_fresh_id() {
        let body = r#"[{"taskType": "T", "taskTime": 1, "taskId": 7},
                       {"taskType": "T", "taskTime": "2029-12-31T00:00:00Z"}]"#;
        let asked = ask(body, None).unwrap();
        assert!(!asked.one);
        let keys: Vec<_> = asked.tasks.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["oracleTask/task_7", "oracleTask/task_fresh1"]);
        assert_eq!(
            asked.tasks[0].value,
            br#"{"taskType": "T", "taskTime": 1, "taskId": 7}"#
        );
    }

    /// Each rule the leader applies refuses the request, naming the task and its field.
    #[test]
    fn a_task_the_leader_would_dead_letter_is_refused_naming_the_field() {
        let cases = [
            (json!({"taskTime": 1}), "taskType"),
            (json!({"taskType": "", "taskTime": 1}), "taskType"),
            (json!({"taskType": "T"}), "taskTime"),
            (
                json!({"taskType": "T", "taskTime": "yesterday"}),
                "taskTime",
            ),
            (
                json!({"taskType": "T", "taskTime": 1, "runAt": "soon"}),
                "runAt",
            ),
            (
                json!({"taskType": "T", "taskTime": 1, "runAt": "2031-01-01T00:00:00Z"}),
                "runAt",
            ),
            (
                json!({"taskType": "T", "taskTime": 1, "maxAttempts": 0}),
                "maxAttempts",
            ),
            (
                json!({"taskType": "T", "taskTime": 1, "taskPriority": 1e12}),
                "taskPriority",
            ),
            (
                json!({"taskType": "T", "taskTime": 1, "taskTaken": true}),
                "taskTaken",
            ),
            (
                json!({"taskType": "T", "taskTime": 1, "taskGroup": 5}),
                "taskGroup",
            ),
            (
                json!({"taskType": "T", "taskTime": 1, "taskId": "../x"}),
                "taskId",
            ),
            (
                json!({"taskType": "T", "taskTime": 1, "taskId": {"a": 1}}),
                "taskId",
            ),
        ];
        for (bad, field) in cases {
            let good = json!({"taskType": "T", "taskTime": 1, "taskId": "ok"});
            let body = json!([good, bad]).to_string();
            let refusal = refused(&body, None);
            assert_eq!(refusal.fault, Fault::Invalid, "{bad}: {refusal:?}");
            assert_eq!(refusal.index, Some(1), "{bad}");
            assert_eq!(refusal.field.as_deref(), Some(field), "{bad}: {refusal:?}");
            assert!(refusal.message.contains(field), "{bad}: {refusal}");
        }
    }

    /// Hostile keys are refused: a dot segment, control characters, a key under another
    /// prefix, one past the prefix's end.
    #[test]
    fn hostile_idempotency_keys_are_refused() {
        let body = r#"{"taskType": "T", "taskTime": 1}"#;
        for bad in [
            "..",
            "a/../../leaderq/pause",
            "oracleTask/../x",
            "x\u{1b}[31m",
            "a\nb",
            "leaderq/pause",
            "oracleTaskDead/x",
            "oracleTask/",
            "/oracleTask/x",
            "",
        ] {
            let refusal = refused(body, Some(bad));
            assert_eq!(refusal.field.as_deref(), Some("Idempotency-Key"), "{bad:?}");
            assert!(!refusal.message.contains('\u{1b}'), "{refusal}");
        }
    }

    /// What is not JSON, not an object, or an empty array is malformed; an
    /// Idempotency-Key with an array is too.
    #[test]
    fn malformed_bodies_are_refused() {
        for body in ["", "nope", "[1]", "3", "[]", "[{\"taskType\": \"T\""] {
            assert_eq!(refused(body, None).fault, Fault::Malformed, "{body:?}");
        }
        let array = r#"[{"taskType": "T", "taskTime": 1}]"#;
        assert_eq!(refused(array, Some("k")).fault, Fault::Malformed);
    }

    /// Two tasks with one key refuse the request; so does a task too large to claim.
    #[test]
    fn shared_keys_and_oversized_tasks_are_refused() {
        let body = r#"[{"taskType": "T", "taskTime": 1, "taskId": "a"},
                       {"taskType": "T", "taskTime": 2, "taskId": "a"}]"#;
        let refusal = refused(body, None);
        assert_eq!((refusal.index, refusal.fault), (Some(1), Fault::Invalid));
        let big = json!({"taskType": "T", "taskTime": 1, "taskPara": "x".repeat(1500)});
        let refusal = refused(&big.to_string(), None);
        assert_eq!(refusal.fault, Fault::TooLarge);
        let fits = json!({"taskType": "T", "taskTime": 1, "taskPara": "x".repeat(1300)});
        assert!(ask(&fits.to_string(), None).is_ok());
    }

    /// Chunks are consecutive, cover every task once, and stay within the limits; a task
    /// over them alone is a chunk of its own.
    #[test]
    fn chunks_cover_every_task_within_the_limits() {
        let each = |ops, bytes| WriteCost { ops, bytes };
        let costs = vec![each(1, 100); 10];
        assert_eq!(chunks(&costs, LIMITS), [0..4, 4..8, 8..10]);
        let costs = [
            each(1, 900),
            each(1, 900),
            each(1, 900),
            each(1, 3000),
            each(1, 10),
        ];
        assert_eq!(chunks(&costs, LIMITS), [0..2, 2..3, 3..4, 4..5]);
        assert!(chunks(&[], LIMITS).is_empty());
        let many = vec![each(1, 7); 1000];
        let runs = chunks(&many, LIMITS);
        assert_eq!(runs.iter().map(|r| r.len()).sum::<usize>(), 1000);
        assert!(runs.iter().all(|r| r.len() <= LIMITS.max_ops));
    }
}
