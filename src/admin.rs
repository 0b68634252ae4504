//! Operator commands over the Consul API: `leaderq enqueue` (what a producer does, from
//! files or flags) and `leaderq status` (leader, fencing token, queue depth, dead letters).

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
