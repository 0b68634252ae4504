//! Operator commands over the coordinator seam, on every backend: `leaderq enqueue` (what a producer does, from
//! files or flags), `leaderq status` (leader, fencing token, queue depth, dead letters) and
//! `leaderq tasks` (list, show, retry a dead letter, purge dead letters).
//!
//! Every key these commands write or read by name is a [`Key`] under the queue or the
//! dead-letter prefix: ids and keys from the command line and `originalKey` from a dead
//! letter are validated, and refused with a message before anything is sent.

use std::path::Path;

use chrono::Utc;
use serde::Serialize;
use serde_json::{json, Value};

use crate::config::Settings;
use crate::coord::{CoordError, Coordinator, Edit, Edited, Holder, StoredTask, Version};
use crate::task::key::{self, Key};
use crate::task::{Status, Task};

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(transparent)]
    Coordinator(#[from] CoordError),
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path} is not a task: {reason}")]
    NotATask { path: String, reason: String },
    #[error("--para is not JSON: {0}")]
    Para(String),
    #[error("{key} already exists; tasks are enqueued only under new keys (delete it or pick another taskId)")]
    Exists { key: String },
    #[error("no task {key} under the queue or dead-letter prefix, by key, name or id (see `leaderq tasks list`)")]
    NoSuchTask { key: String },
    #[error("{key} is not a dead letter; only dead letters can be retried")]
    NotDead { key: String },
    #[error("{key} is a dead letter, not a queued task; only queued tasks can be cancelled (delete it with `leaderq tasks delete`)")]
    NotQueued { key: String },
    #[error("{key} is running; cancel it with `leaderq tasks cancel` instead")]
    Running { key: String },
    #[error("{key} changed or went meanwhile; look again with `leaderq tasks show` and try again")]
    Changed { key: String },
    #[error(
        "{key} was not a task (not a JSON object with a taskType); fix it and enqueue it anew"
    )]
    NotRetryable { key: String },
    #[error("cannot move the task back to {key}: {reason}")]
    Conflict { key: String, reason: String },
    #[error("{what} {value:?} cannot name a task: {reason}")]
    InvalidId {
        what: String,
        value: String,
        reason: key::Invalid,
    },
    #[error("{key:?} is neither a key under {prefixes} nor a task name: {reason}")]
    InvalidKey {
        key: String,
        prefixes: String,
        reason: key::Invalid,
    },
    #[error("{key} holds originalKey {original:?}, which retry will not write to: {reason}; fix the record, or enqueue the task anew")]
    BadOriginalKey {
        key: String,
        original: String,
        reason: String,
    },
}

impl AdminError {
    /// Input from the command line refused before anything was sent.
    pub fn is_refused_input(&self) -> bool {
        matches!(
            self,
            AdminError::InvalidId { .. } | AdminError::InvalidKey { .. }
        )
    }
}

/// A task ready to PUT: its name under the prefix and its JSON.
#[derive(Clone, Debug)]
pub struct NewTask {
    pub name: String,
    pub value: Vec<u8>,
}

/// `task_<id>`, once `id` passed [`key::check_id`]; `what` names where the id came from.
fn task_name(id: &str, what: impl FnOnce() -> String) -> Result<String, AdminError> {
    key::check_id(id).map_err(|reason| AdminError::InvalidId {
        what: what(),
        value: id.to_string(),
        reason,
    })?;
    Ok(format!("task_{id}"))
}

/// Reads a task file in the producers' format. Its key is `task_<taskId>`, or the file's
/// name when it has no taskId; either must be a valid key segment.
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
        Some(Value::String(id)) if !id.is_empty() => {
            task_name(id, || format!("taskId in {shown}"))?
        }
        Some(Value::Number(id)) => task_name(&id.to_string(), || format!("taskId in {shown}"))?,
        _ => {
            let stem = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "task".into());
            key::check_id(&stem).map_err(|reason| AdminError::InvalidId {
                what: format!("the name of {shown} (it has no taskId)"),
                value: stem.clone(),
                reason,
            })?;
            stem
        }
    };
    Ok(NewTask { name, value: text })
}

/// Builds a task from flags: now as `taskTime`, a fresh id unless one is given. A given id
/// must be a valid key segment; it is refused, not escaped, so a task's key is always
/// `task_<its id>`.
pub fn task_from_flags(
    task_type: &str,
    para: Option<&str>,
    id: Option<&str>,
) -> Result<NewTask, AdminError> {
    let name = id
        .map(|id| task_name(id, || "--id".to_string()))
        .transpose()?;
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
        name: name.unwrap_or_else(|| format!("task_{id}")),
        value: value.to_string().into_bytes(),
    })
}

/// Writes a task under `prefix` only if the key is new, so a running task is never
/// overwritten by accident. Returns the key.
pub async fn enqueue(
    coord: &dyn Coordinator,
    prefix: &str,
    task: &NewTask,
) -> Result<String, AdminError> {
    let key = Key::under(prefix, &task.name).map_err(|reason| AdminError::InvalidKey {
        key: task.name.clone(),
        prefixes: prefix.to_string(),
        reason,
    })?;
    let create = [Edit::Create {
        key: key.as_str().to_string(),
        value: task.value.clone(),
    }];
    match coord.edit(&create).await? {
        Edited::Done => Ok(key.into()),
        Edited::Conflict(_) => Err(AdminError::Exists { key: key.into() }),
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct StatusReport {
    pub leader: Option<Value>,
    pub fencing_token: Option<u64>,
    pub pending: usize,
    /// Waiting for a retry's backoff (`notBefore`).
    pub delayed: usize,
    /// Waiting for the time their producer set (`runAt`).
    pub scheduled: usize,
    /// When the first scheduled task is due (RFC 3339).
    pub next_due: Option<String>,
    pub in_flight: usize,
    /// Marked taken by leaderq, but no session holds them: requeued by the next leader.
    pub orphaned: usize,
    pub foreign: usize,
    pub malformed: usize,
    pub dead: usize,
    /// `leaderq pause` is in effect: the leader claims nothing.
    pub paused: bool,
    /// Every replica's record: the leader, standbys with their last heartbeat, the gone.
    pub replicas: Vec<crate::leader::replicas::ReplicaView>,
}

/// Every replica's record, as of now: the leader first, then standbys, then those gone
/// (no heartbeat for `replicas::GONE_AFTER` periods).
pub async fn replicas(
    coord: &dyn Coordinator,
    settings: &Settings,
) -> Result<Vec<crate::leader::replicas::ReplicaView>, AdminError> {
    use crate::leader::replicas;
    let stored = list_now(coord, &replicas::prefix(&settings.election.leader_key)).await?;
    Ok(replicas::view(&stored, chrono::Utc::now()))
}

/// Every task under `prefix` now.
pub(crate) async fn list_now(
    coord: &dyn Coordinator,
    prefix: &str,
) -> Result<Vec<StoredTask>, AdminError> {
    let (tasks, _) = coord
        .list(prefix, Version(0), std::time::Duration::ZERO)
        .await?;
    Ok(tasks)
}

pub async fn status(
    coord: &dyn Coordinator,
    settings: &Settings,
) -> Result<StatusReport, AdminError> {
    let (holder, _) = coord.observe(Version(0), std::time::Duration::ZERO).await?;
    let tasks = list_now(coord, &settings.queue.prefix).await?;
    let dead = list_now(coord, &settings.queue.dead_prefix).await?.len();
    let paused = !coord
        .get(&[crate::queue::pause_key(&settings.queue.prefix)])
        .await?
        .is_empty();
    let mut report = status_of(&holder, &tasks, dead, paused, Utc::now());
    report.replicas = replicas(coord, settings).await?;
    Ok(report)
}

/// The status from what was read: the holder, the queue, the number of dead letters and
/// the pause flag (the dashboard builds it from its own reads).
pub fn status_of(
    holder: &Holder,
    tasks: &[StoredTask],
    dead: usize,
    paused: bool,
    now: chrono::DateTime<Utc>,
) -> StatusReport {
    let mut report = StatusReport::default();
    if let Some(lease) = &holder.lease {
        report.leader = Some(match &holder.record {
            Some(record) => serde_json::to_value(record).unwrap_or_default(),
            None => json!({ "session": lease.0 }),
        });
        report.fencing_token = Some(holder.token);
    }
    let mut next_due: Option<chrono::DateTime<Utc>> = None;
    for stored in tasks {
        match Task::parse(stored).map(|task| task.status(now)) {
            Ok(Status::Pending) => report.pending += 1,
            Ok(Status::Delayed(_)) => report.delayed += 1,
            Ok(Status::Scheduled(at)) => {
                report.scheduled += 1;
                next_due = Some(next_due.map_or(at, |due| due.min(at)));
            }
            Ok(Status::InFlight) => report.in_flight += 1,
            Ok(Status::Orphan) => report.orphaned += 1,
            Ok(Status::Foreign) => report.foreign += 1,
            Err(_) => report.malformed += 1,
        }
    }
    report.next_due = next_due.map(crate::task::rfc3339);
    report.dead = dead;
    report.paused = paused;
    report
}

/// One row of `leaderq tasks list`.
#[derive(Clone, Debug, Serialize)]
pub struct TaskRow {
    pub state: String,
    pub key: String,
    pub task_type: String,
    /// Seconds since taskTime (queued tasks) or since deadAt (dead letters).
    pub age_seconds: Option<i64>,
    /// When a delayed or scheduled task is due (RFC 3339).
    pub due_at: Option<String>,
    pub attempts: u64,
    pub last_error: String,
}

/// Every task under the queue prefix and every dead letter, queue first, in claim order.
pub async fn list(
    coord: &dyn Coordinator,
    settings: &Settings,
) -> Result<Vec<TaskRow>, AdminError> {
    let queued = list_now(coord, &settings.queue.prefix).await?;
    let dead = list_now(coord, &settings.queue.dead_prefix).await?;
    Ok(task_rows(queued, dead, Utc::now()))
}

/// The rows of `leaderq tasks list` from what was read: the queue in claim order, then the
/// dead letters.
pub fn task_rows(
    queued: Vec<StoredTask>,
    dead: Vec<StoredTask>,
    now: chrono::DateTime<Utc>,
) -> Vec<TaskRow> {
    let mut tasks: Vec<(Option<Task>, StoredTask)> = queued
        .into_iter()
        .map(|stored| (Task::parse(&stored).ok(), stored))
        .collect();
    tasks.sort_by(|a, b| match (&a.0, &b.0) {
        (Some(x), Some(y)) => x.order_key().cmp(&y.order_key()),
        _ => a.1.key.cmp(&b.1.key),
    });
    let mut rows = Vec::new();
    for (task, pair) in tasks {
        rows.push(match task {
            Some(task) => TaskRow {
                state: task.status(now).name().into(),
                key: pair.key,
                task_type: task.task_type.clone(),
                age_seconds: Some((now - task.time).num_seconds()),
                due_at: task.status(now).due().map(crate::task::rfc3339),
                attempts: u64::from(task.attempts),
                last_error: task.last_error.clone().unwrap_or_default(),
            },
            None => TaskRow {
                state: "malformed".into(),
                key: pair.key,
                task_type: String::new(),
                age_seconds: None,
                due_at: None,
                attempts: 0,
                last_error: "not a valid task; the leader moves it to the dead-letter prefix"
                    .into(),
            },
        });
    }
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
            due_at: None,
            attempts: value.get("attempts").and_then(Value::as_u64).unwrap_or(0),
            last_error: value
                .get("deadReason")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
        });
    }
    rows
}

/// Finds a task by full key, by name under the queue or the dead-letter prefix, or by the
/// id `leaderq enqueue --id` was given (its key is `task_<id>`). Reads nothing else: a key
/// outside both prefixes is taken as a name under them, and one that is not a valid key
/// there is refused.
pub async fn find(
    coord: &dyn Coordinator,
    settings: &Settings,
    key: &str,
) -> Result<StoredTask, AdminError> {
    let prefixes = [
        settings.queue.prefix.as_str(),
        settings.queue.dead_prefix.as_str(),
    ];
    let candidates = match Key::within(key, &prefixes) {
        Ok(full) => vec![full],
        Err(_) => {
            let mut names = prefixes
                .iter()
                .map(|prefix| Key::under(prefix, key))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|reason| AdminError::InvalidKey {
                    key: key.to_string(),
                    prefixes: prefixes.join(" or "),
                    reason,
                })?;
            if key::check_id(key).is_ok() && !key.starts_with("task_") {
                let name = format!("task_{key}");
                names.extend(prefixes.iter().filter_map(|p| Key::under(p, &name).ok()));
            }
            names
        }
    };
    for candidate in candidates {
        let wanted = [String::from(candidate)];
        if let Some(found) = coord.get(&wanted).await?.pop() {
            return Ok(found);
        }
    }
    Err(AdminError::NoSuchTask {
        key: key.to_string(),
    })
}

/// Moves a dead letter back to the queue under its original key, with its attempts reset.
/// The original key must be a valid key under the queue prefix: a record is data, and a
/// crafted one must not make this write anywhere else. Returns the queue key.
pub async fn retry(
    coord: &dyn Coordinator,
    settings: &Settings,
    key: &str,
) -> Result<String, AdminError> {
    let pair = find(coord, settings, key).await?;
    if !pair.key.starts_with(&settings.queue.dead_prefix) {
        return Err(AdminError::NotDead { key: pair.key });
    }
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(&pair.value) else {
        return Err(AdminError::NotRetryable { key: pair.key });
    };
    if fields.contains_key("rawValue") || !fields.contains_key("taskType") {
        return Err(AdminError::NotRetryable { key: pair.key });
    }
    let prefix = settings.queue.prefix.as_str();
    let refuse = |original: &str, reason: String| AdminError::BadOriginalKey {
        key: pair.key.clone(),
        original: original.to_string(),
        reason,
    };
    let target = match fields.get("originalKey") {
        Some(Value::String(original)) => Key::within(original, &[prefix])
            .map_err(|reason| refuse(original, reason.to_string()))?,
        Some(other) => {
            return Err(refuse(&other.to_string(), "it is not a string".into()));
        }
        None => {
            let name = &pair.key[settings.queue.dead_prefix.len()..];
            Key::under(prefix, name).map_err(|reason| AdminError::InvalidKey {
                key: name.to_string(),
                prefixes: prefix.to_string(),
                reason,
            })?
        }
    };
    let target = String::from(target);
    for field in [
        "deadReason",
        "deadAt",
        "deadNode",
        "deadFencingToken",
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
        Edit::Delete {
            key: pair.key.clone(),
            version: pair.version,
        },
        // Create only: a new task under the same key is never overwritten.
        Edit::Create {
            key: target.clone(),
            value,
        },
    ];
    match coord.edit(&ops).await? {
        Edited::Done => Ok(target),
        Edited::Conflict(keys) => Err(AdminError::Conflict {
            reason: keys
                .iter()
                .map(|key| {
                    if *key == target {
                        format!("{key} exists (a new task took the key)")
                    } else {
                        format!("{key} changed or went meanwhile")
                    }
                })
                .collect::<Vec<_>>()
                .join("; "),
            key: target,
        }),
    }
}

/// Deletes dead letters, all of them or those dead for longer than `older_than`. Returns
/// how many were deleted.
pub async fn purge_dead(
    coord: &dyn Coordinator,
    settings: &Settings,
    older_than: Option<std::time::Duration>,
) -> Result<usize, AdminError> {
    purge_dead_with_progress(coord, settings, older_than, &mut |_, _| {}).await
}

/// [`purge_dead`], calling `progress(looked at, total)` after each dead letter.
pub async fn purge_dead_with_progress(
    coord: &dyn Coordinator,
    settings: &Settings,
    older_than: Option<std::time::Duration>,
    progress: &mut (dyn FnMut(usize, usize) + Send),
) -> Result<usize, AdminError> {
    let now = Utc::now();
    let dead = list_now(coord, &settings.queue.dead_prefix).await?;
    let total = dead.len();
    let mut purged = 0;
    for (n, pair) in dead.into_iter().enumerate() {
        progress(n, total);
        // A listing is by byte prefix, so this always holds; checked so that not even a
        // misbehaving server can make purge delete anything else.
        if !pair.key.starts_with(&settings.queue.dead_prefix) {
            continue;
        }
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
        let ops = [Edit::Delete {
            key: pair.key.clone(),
            version: pair.version,
        }];
        if coord.edit(&ops).await? == Edited::Done {
            purged += 1;
        }
    }
    progress(total, total);
    Ok(purged)
}

/// `leaderq pause`: sets the queue's pause flag (a key of its own in the coordinator, so it
/// outlives a failover). The leader finishes the run in progress and claims nothing more
/// until `resume`. Answers whether it was already paused.
pub async fn pause(coord: &dyn Coordinator, settings: &Settings) -> Result<bool, AdminError> {
    let key = crate::queue::pause_key(&settings.queue.prefix);
    let value = serde_json::to_vec(&json!({
        "pausedAt": crate::task::rfc3339(Utc::now()),
        "by": crate::util::hostname(),
    }))
    .expect("a JSON object serializes");
    match coord.edit(&[Edit::Create { key, value }]).await? {
        Edited::Done => Ok(false),
        Edited::Conflict(_) => Ok(true),
    }
}

/// `leaderq resume`: clears the pause flag. Answers whether the queue was paused.
pub async fn resume(coord: &dyn Coordinator, settings: &Settings) -> Result<bool, AdminError> {
    let key = crate::queue::pause_key(&settings.queue.prefix);
    for _ in 0..5 {
        let Some(flag) = coord.get(std::slice::from_ref(&key)).await?.pop() else {
            return Ok(false);
        };
        let delete = [Edit::Delete {
            key: flag.key,
            version: flag.version,
        }];
        if coord.edit(&delete).await? == Edited::Done {
            return Ok(true);
        }
    }
    Err(AdminError::Conflict {
        key,
        reason: "the pause flag kept changing while resuming; try again".into(),
    })
}
