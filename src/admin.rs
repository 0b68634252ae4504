//! Operator commands over the Consul API: `leaderq enqueue` (what a producer does, from
//! files or flags), `leaderq status` (leader, fencing token, queue depth, dead letters) and
//! `leaderq tasks` (list, show, retry a dead letter, purge dead letters).

use std::path::Path;

use chrono::Utc;
use serde::Serialize;
use serde_json::{json, Value};

use crate::config::Settings;
use crate::consul::{self, Client, PutMode, QueryOptions};
use crate::task::{Status, Task};

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(transparent)]
    Consul(#[from] consul::Error),
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path} is not a task: {reason}")]
    NotATask { path: String, reason: String },
    #[error("--para is not JSON: {0}")]
    Para(String),
    #[error("{key} already exists; tasks are enqueued only under new keys (delete it or pick another taskId)")]
    Exists { key: String },
    #[error("no task {key} under the queue or dead-letter prefix (see `leaderq tasks list`)")]
    NoSuchTask { key: String },
    #[error("{key} is not a dead letter; only dead letters can be retried")]
    NotDead { key: String },
    #[error(
        "{key} was not a task (not a JSON object with a taskType); fix it and enqueue it anew"
    )]
    NotRetryable { key: String },
    #[error("cannot move the task back to {key}: {reason}")]
    Conflict { key: String, reason: String },
}

/// A task ready to PUT: its key under the prefix and its JSON.
#[derive(Clone, Debug)]
pub struct NewTask {
    pub name: String,
    pub value: Vec<u8>,
}

/// Reads a task file in the producers' format. Its key is `task_<taskId>`, or the file's
/// name when it has no taskId.
pub fn task_from_file(path: &Path) -> Result<NewTask, AdminError> {
    let shown = path.display().to_string();
    let text = std::fs::read(path).map_err(|e| AdminError::Read {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    let value: Value = serde_json::from_slice(&text).map_err(|e| AdminError::NotATask {
        path: shown.clone(),
        reason: format!("not JSON: {e}"),
    })?;
    let Value::Object(fields) = &value else {
        return Err(AdminError::NotATask {
            path: shown,
            reason: "not a JSON object".into(),
        });
    };
    if !fields.contains_key("taskType") {
        return Err(AdminError::NotATask {
            path: shown,
            reason: "no taskType".into(),
        });
    }
    let name = match fields.get("taskId") {
        Some(Value::String(id)) if !id.is_empty() => format!("task_{id}"),
        Some(Value::Number(id)) => format!("task_{id}"),
        _ => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "task".into()),
    };
    Ok(NewTask { name, value: text })
}

/// Builds a task from flags: now as `taskTime`, a fresh id unless one is given.
pub fn task_from_flags(
    task_type: &str,
    para: Option<&str>,
    id: Option<&str>,
) -> Result<NewTask, AdminError> {
    let para: Value = match para {
        Some(text) => serde_json::from_str(text).map_err(|e| AdminError::Para(e.to_string()))?,
        None => json!({}),
    };
    let now = Utc::now();
    let id = id
        .map(str::to_string)
        .unwrap_or_else(|| format!("{}{:03}", now.timestamp_millis(), fastrand::u16(..1000)));
    let value = json!({
        "taskId": id,
        "taskTime": now.timestamp().to_string(),
        "taskTaken": false,
        "taskType": task_type,
        "taskPara": para,
    });
    Ok(NewTask {
        name: format!("task_{id}"),
        value: value.to_string().into_bytes(),
    })
}

/// PUTs a task under `prefix` only if the key is new (cas=0), so a running task is never
/// overwritten by accident. Returns the key.
pub async fn enqueue(client: &Client, prefix: &str, task: &NewTask) -> Result<String, AdminError> {
    let key = format!("{prefix}{}", task.name);
    if !client.kv_put(&key, &task.value, PutMode::Cas(0)).await? {
        return Err(AdminError::Exists { key });
    }
    Ok(key)
}

#[derive(Debug, Default, Serialize)]
pub struct StatusReport {
    pub leader: Option<Value>,
    pub fencing_token: Option<u64>,
    pub pending: usize,
    pub delayed: usize,
    pub in_flight: usize,
    /// Marked taken by leaderq, but no session holds them: requeued by the next leader.
    pub orphaned: usize,
    pub foreign: usize,
    pub malformed: usize,
    pub dead: usize,
}

pub async fn status(client: &Client, settings: &Settings) -> Result<StatusReport, AdminError> {
    let mut report = StatusReport::default();
    let (leader, _) = client
        .kv_get(&settings.election.leader_key, QueryOptions::default())
        .await?;
    if let Some(entry) = leader.filter(|e| e.session.is_some()) {
        report.leader = Some(serde_json::from_slice(&entry.value).unwrap_or_else(
            |_| json!({"session": entry.session, "value": String::from_utf8_lossy(&entry.value)}),
        ));
        report.fencing_token = Some(entry.lock_index);
    }
    let (tasks, _) = client
        .kv_list(&settings.queue.prefix, QueryOptions::default())
        .await?;
    let now = Utc::now();
    for pair in &tasks {
        match Task::parse(pair).map(|task| task.status(now)) {
            Ok(Status::Pending) => report.pending += 1,
            Ok(Status::Delayed(_)) => report.delayed += 1,
            Ok(Status::InFlight) => report.in_flight += 1,
            Ok(Status::Orphan) => report.orphaned += 1,
            Ok(Status::Foreign) => report.foreign += 1,
            Err(_) => report.malformed += 1,
        }
    }
    let (dead, _) = client
        .kv_list(&settings.queue.dead_prefix, QueryOptions::default())
        .await?;
    report.dead = dead.len();
    Ok(report)
}

/// One row of `leaderq tasks list`.
#[derive(Debug, Serialize)]
pub struct TaskRow {
    pub state: String,
    pub key: String,
    pub task_type: String,
    /// Seconds since taskTime (queued tasks) or since deadAt (dead letters).
    pub age_seconds: Option<i64>,
    pub attempts: u64,
    pub last_error: String,
}

/// Every task under the queue prefix and every dead letter, queue first, in claim order.
pub async fn list(client: &Client, settings: &Settings) -> Result<Vec<TaskRow>, AdminError> {
    let now = Utc::now();
    let (queued, _) = client
        .kv_list(&settings.queue.prefix, QueryOptions::default())
        .await?;
    let mut tasks: Vec<(Option<Task>, crate::consul::KvPair)> = queued
        .into_iter()
        .map(|pair| (Task::parse(&pair).ok(), pair))
        .collect();
    tasks.sort_by(|a, b| match (&a.0, &b.0) {
        (Some(x), Some(y)) => x.order_key().cmp(&y.order_key()),
        _ => a.1.key.cmp(&b.1.key),
    });
    let mut rows = Vec::new();
    for (task, pair) in tasks {
        rows.push(match task {
            Some(task) => TaskRow {
                state: match task.status(now) {
                    Status::Pending => "pending",
                    Status::Delayed(_) => "delayed",
                    Status::InFlight => "in_flight",
                    Status::Orphan => "orphaned",
                    Status::Foreign => "foreign",
                }
                .into(),
                key: pair.key,
                task_type: task.task_type.clone(),
                age_seconds: Some((now - task.time).num_seconds()),
                attempts: u64::from(task.attempts),
                last_error: task.last_error.clone().unwrap_or_default(),
            },
            None => TaskRow {
                state: "malformed".into(),
                key: pair.key,
                task_type: String::new(),
                age_seconds: None,
                attempts: 0,
                last_error: "not a valid task; the leader moves it to the dead-letter prefix"
                    .into(),
            },
        });
    }
    let (dead, _) = client
        .kv_list(&settings.queue.dead_prefix, QueryOptions::default())
        .await?;
    for pair in dead {
        let value: Value = serde_json::from_slice(&pair.value).unwrap_or_default();
        let dead_at = value
            .get("deadAt")
            .and_then(Value::as_str)
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
        rows.push(TaskRow {
            state: "dead".into(),
            key: pair.key,
            task_type: value
                .get("taskType")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
            age_seconds: dead_at.map(|t| (now - t.with_timezone(&Utc)).num_seconds()),
            attempts: value.get("attempts").and_then(Value::as_u64).unwrap_or(0),
            last_error: value
                .get("deadReason")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
        });
    }
    Ok(rows)
}

/// Finds a task by full key, or by name under the queue or the dead-letter prefix.
pub async fn find(
    client: &Client,
    settings: &Settings,
    key: &str,
) -> Result<crate::consul::KvPair, AdminError> {
    let candidates = [
        key.to_string(),
        format!("{}{key}", settings.queue.prefix),
        format!("{}{key}", settings.queue.dead_prefix),
    ];
    for candidate in candidates {
        if let (Some(pair), _) = client.kv_get(&candidate, QueryOptions::default()).await? {
            return Ok(pair);
        }
    }
    Err(AdminError::NoSuchTask {
        key: key.to_string(),
    })
}

/// Moves a dead letter back to the queue under its original key, with its attempts reset.
/// Returns the queue key.
pub async fn retry(client: &Client, settings: &Settings, key: &str) -> Result<String, AdminError> {
    let pair = find(client, settings, key).await?;
    if !pair.key.starts_with(&settings.queue.dead_prefix) {
        return Err(AdminError::NotDead { key: pair.key });
    }
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(&pair.value) else {
        return Err(AdminError::NotRetryable { key: pair.key });
    };
    if fields.contains_key("rawValue") || !fields.contains_key("taskType") {
        return Err(AdminError::NotRetryable { key: pair.key });
    }
    let name = pair.key[settings.queue.dead_prefix.len()..].to_string();
    let target = fields
        .get("originalKey")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("{}{name}", settings.queue.prefix));
    for field in [
        "deadReason",
        "deadAt",
        "originalKey",
        "attempts",
        "lastError",
        "notBefore",
        "takenBy",
        "takenAt",
    ] {
        fields.shift_remove(field);
    }
    fields.insert("taskTaken".into(), Value::Bool(false));
    let value = serde_json::to_vec(&Value::Object(fields)).expect("task serializes");
    let ops = [
        crate::consul::TxnOp::DeleteCas {
            key: pair.key.clone(),
            index: pair.modify_index,
        },
        // Create only: a new task under the same key is never overwritten.
        crate::consul::TxnOp::Cas {
            key: target.clone(),
            value,
            index: 0,
        },
    ];
    match client.txn(&ops).await? {
        crate::consul::TxnOutcome::Committed(_) => Ok(target),
        crate::consul::TxnOutcome::RolledBack(errors) => Err(AdminError::Conflict {
            key: target,
            reason: errors
                .into_iter()
                .map(|e| e.what)
                .collect::<Vec<_>>()
                .join("; "),
        }),
    }
}

/// Deletes dead letters, all of them or those dead for longer than `older_than`. Returns
/// how many were deleted.
pub async fn purge_dead(
    client: &Client,
    settings: &Settings,
    older_than: Option<std::time::Duration>,
) -> Result<usize, AdminError> {
    let now = Utc::now();
    let (dead, _) = client
        .kv_list(&settings.queue.dead_prefix, QueryOptions::default())
        .await?;
    let mut purged = 0;
    for pair in dead {
        if let Some(limit) = older_than {
            let dead_at = serde_json::from_slice::<Value>(&pair.value)
                .ok()
                .and_then(|v| v.get("deadAt")?.as_str().map(str::to_string))
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(&t).ok());
            let old_enough = dead_at.is_some_and(|t| {
                (now - t.with_timezone(&Utc)).to_std().unwrap_or_default() > limit
            });
            if !old_enough {
                continue;
            }
        }
        let ops = [crate::consul::TxnOp::DeleteCas {
            key: pair.key.clone(),
            index: pair.modify_index,
        }];
        if let crate::consul::TxnOutcome::Committed(_) = client.txn(&ops).await? {
            purged += 1;
        }
    }
    Ok(purged)
}
