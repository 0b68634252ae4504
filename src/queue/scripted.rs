//! Scripted inputs for the tests of the queue's pure decisions: tasks as a producer or a
//! leader would have written them, and instants on a fixed wall clock, so that every test
//! reads its times as milliseconds after one start.

use chrono::{DateTime, Utc};

use crate::coord::{StoredTask, TaskVersion};
use crate::task::Task;

/// `ms` milliseconds after a fixed start.
pub fn at(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(1_700_000_000_000 + ms).expect("a time within chrono's range")
}

/// A pending task at `key` with `taskTime` `time`, and a notBefore when given.
pub fn task(key: &str, time: i64, not_before: Option<DateTime<Utc>>) -> Task {
    let mut value = serde_json::json!({"taskType": "x", "taskTime": time});
    if let Some(nb) = not_before {
        value["notBefore"] = crate::task::rfc3339(nb).into();
    }
    Task::parse(&StoredTask {
        key: key.into(),
        value: value.to_string().into_bytes(),
        version: TaskVersion(1),
        created: 1,
        holder: None,
    })
    .expect("a scripted task is valid")
}

/// A pending task of `group`.
pub fn grouped(key: &str, time: i64, group: &str) -> Task {
    let value = serde_json::json!({"taskType": "x", "taskTime": time, "taskGroup": group});
    Task::parse(&StoredTask {
        key: key.into(),
        value: value.to_string().into_bytes(),
        version: TaskVersion(1),
        created: 1,
        holder: None,
    })
    .expect("a scripted task is valid")
}

/// A task scheduled by its producer (`runAt`), with a notBefore too when given.
pub fn scheduled(
    key: &str,
    time: i64,
    run_at: DateTime<Utc>,
    not_before: Option<DateTime<Utc>>,
) -> Task {
    let mut value = serde_json::json!({
        "taskType": "x",
        "taskTime": time,
        "runAt": crate::task::rfc3339(run_at),
        "taskGroup": "g",
    });
    if let Some(nb) = not_before {
        value["notBefore"] = crate::task::rfc3339(nb).into();
    }
    Task::parse(&StoredTask {
        key: key.into(),
        value: value.to_string().into_bytes(),
        version: TaskVersion(1),
        created: 1,
        holder: None,
    })
    .expect("a scripted task is valid")
}
