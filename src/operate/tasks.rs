//! The queue's tasks, one at a time or as a list: `leaderq enqueue` (what a producer does,
//! from task files or flags), `leaderq tasks list|show|cancel|delete`, and what the CLI
//! prints for each. Finding a task by key, name or id ([`find`]) is here too; the dead
//! letters as such (retry, purge) are `dead.rs`'s.
//!
//! Size: each verb is one short function beside what the CLI prints for it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};

use super::waits::{explain, Limits};
use super::{list_now, Line, OperateError};
use crate::config::{ElectionSettings, QueueSettings};
use crate::coord::{Coordinator, Edit, Edited, StoredTask};
use crate::task::key::{self, Key};
use crate::task::Task;
use crate::util::duration::format_age;
use crate::util::escape::escape;

/// A cancelled running task is looked for this often until it left the queue.
const CANCEL_POLL: Duration = Duration::from_millis(200);
/// Slack on top of the kill grace and a session TTL before a cancel stops waiting: the
/// leader looks for cancel requests every second.
const CANCEL_SLACK: Duration = Duration::from_secs(5);

/// A task ready to PUT: its name under the prefix and its JSON.
#[derive(Clone, Debug)]
pub struct NewTask {
    pub name: String,
    pub value: Vec<u8>,
}

/// `task_<id>`, once `id` passed [`key::check_id`]; `what` names where the id came from.
fn task_name(id: &str, what: impl FnOnce() -> String) -> Result<String, OperateError> {
    key::check_id(id).map_err(|reason| OperateError::InvalidId {
        what: what(),
        value: id.to_string(),
        reason,
    })?;
    Ok(format!("task_{id}"))
}

/// The tasks `leaderq enqueue` was given: one built from `--type` (with `--para`, `--id`),
/// or one per task file.
pub fn to_enqueue(
    task_type: Option<&str>,
    para: Option<&str>,
    id: Option<&str>,
    files: &[PathBuf],
) -> Result<Vec<NewTask>, OperateError> {
    match task_type {
        Some(task_type) => Ok(vec![task_from_flags(task_type, para, id)?]),
        None if files.is_empty() => Err(OperateError::NothingToEnqueue),
        None => files.iter().map(|path| task_from_file(path)).collect(),
    }
}

/// Reads a task file in the producers' format. Its key is `task_<taskId>`, or the file's
/// name when it has no taskId; either must be a valid key segment.
pub fn task_from_file(path: &Path) -> Result<NewTask, OperateError> {
    let shown = path.display().to_string();
    let text = std::fs::read(path).map_err(|e| OperateError::Read {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    let value: Value = serde_json::from_slice(&text).map_err(|e| OperateError::NotATask {
        path: shown.clone(),
        reason: format!("not JSON: {e}"),
    })?;
    let Value::Object(fields) = &value else {
        return Err(OperateError::NotATask {
            path: shown,
            reason: "not a JSON object".into(),
        });
    };
    if !fields.contains_key("taskType") {
        return Err(OperateError::NotATask {
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
            key::check_id(&stem).map_err(|reason| OperateError::InvalidId {
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
) -> Result<NewTask, OperateError> {
    let name = id
        .map(|id| task_name(id, || "--id".to_string()))
        .transpose()?;
    let para: Value = match para {
        Some(text) => serde_json::from_str(text).map_err(|e| OperateError::Para(e.to_string()))?,
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
) -> Result<String, OperateError> {
    let key = Key::under(prefix, &task.name).map_err(|reason| OperateError::InvalidKey {
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
        Edited::Conflict(_) => Err(OperateError::Exists { key: key.into() }),
    }
}

/// `leaderq enqueue`: each task in turn, saying a line about each to `say` as it goes (a
/// failing `say` stops the batch). In a batch, a task whose key exists is refused and the
/// others go on, and the batch ends in [`OperateError::NotAllEnqueued`]; any other
/// failure stops it.
pub async fn enqueue_all<E: From<OperateError>>(
    coord: &dyn Coordinator,
    prefix: &str,
    tasks: &[NewTask],
    mut say: impl FnMut(Line) -> Result<(), E>,
) -> Result<(), E> {
    let total = tasks.len();
    let mut failed = 0;
    for (n, task) in tasks.iter().enumerate() {
        match enqueue(coord, prefix, task).await {
            Ok(key) => say(Line::Out(format!("[{}/{total}] enqueued {key}", n + 1)))?,
            // One task refused (its key exists) does not stop the others.
            Err(err @ OperateError::Exists { .. }) if total > 1 => {
                failed += 1;
                say(Line::Err(format!(
                    "[{}/{total}] not enqueued: {}",
                    n + 1,
                    escape(&err.to_string())
                )))?;
            }
            Err(err) => return Err(err.into()),
        }
    }
    if total > 1 {
        say(Line::Out(format!(
            "enqueued {} of {total} task(s)",
            total - failed
        )))?;
    }
    if failed > 0 {
        return Err(OperateError::NotAllEnqueued { failed, total }.into());
    }
    Ok(())
}

/// One row of `leaderq tasks list` (and of the dashboard's queue pane).
#[derive(Clone, Debug, Serialize)]
pub struct TaskRow {
    pub state: String,
    pub key: String,
    pub task_type: String,
    /// Its `taskGroup` (empty: none).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// Why it waits, when something holds it back (`waits.rs`): a pause, a backoff, its
    /// `runAt`, its type's cap, a busy group.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub waits: String,
    /// Seconds since taskTime (queued tasks) or since deadAt (dead letters).
    pub age_seconds: Option<i64>,
    /// When a delayed or scheduled task is due (RFC 3339).
    pub due_at: Option<String>,
    pub attempts: u64,
    pub last_error: String,
    /// How far a running task's run got (0 to 1), as it last reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<f64>,
    /// The shard it belongs to, in a split queue (`election.shards`); dead letters have none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
}

/// Names each queued task's shard of `shards` (a split queue only).
pub fn name_shards(rows: &mut [TaskRow], shards: u32) {
    if shards <= 1 {
        return;
    }
    for row in rows.iter_mut().filter(|row| row.state != "dead") {
        row.shard = Some(crate::task::shard::shard_of(&row.key, &row.group, shards));
    }
}

/// Every task under the queue prefix and every dead letter, queue first, in claim order,
/// each queued task with why it waits under `limits` and the pauses.
pub async fn list(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    limits: &Limits,
) -> Result<Vec<TaskRow>, OperateError> {
    let queued = list_now(coord, &queue.prefix).await?;
    let dead = list_now(coord, &queue.dead_prefix).await?;
    let mut rows = task_rows(queued, dead, Utc::now());
    let paused_types = super::status::paused_types(coord, queue).await?;
    let paused = super::status::paused(coord, queue).await?;
    let mut limits = limits.clone();
    limits.read_rates(coord, &queue.prefix, Utc::now()).await;
    explain(&mut rows, &limits, paused, &paused_types);
    Ok(rows)
}

/// The rows of `leaderq tasks list` from what was read: the queue in claim order, then the
/// dead letters.
pub fn task_rows(
    queued: Vec<StoredTask>,
    dead: Vec<StoredTask>,
    now: DateTime<Utc>,
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
                group: task.group().to_string(),
                waits: String::new(),
                age_seconds: Some((now - task.time).num_seconds()),
                due_at: task.status(now).due().map(crate::task::rfc3339),
                attempts: u64::from(task.attempts),
                last_error: task.last_error.clone().unwrap_or_default(),
                progress: task.progress().map(|(p, _)| p).filter(|_| task.taken),
                shard: None,
            },
            None => TaskRow {
                state: "malformed".into(),
                key: pair.key,
                task_type: String::new(),
                group: String::new(),
                waits: String::new(),
                age_seconds: None,
                due_at: None,
                attempts: 0,
                last_error: "not a valid task; the leader moves it to the dead-letter prefix"
                    .into(),
                progress: None,
                shard: None,
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
            group: String::new(),
            waits: String::new(),
            age_seconds: dead_at.map(|t| (now - t.with_timezone(&Utc)).num_seconds()),
            due_at: None,
            attempts: value.get("attempts").and_then(Value::as_u64).unwrap_or(0),
            last_error: value
                .get("deadReason")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
            progress: None,
            shard: None,
        });
    }
    rows
}

/// The table `leaderq tasks list` prints, with a count at the end.
pub fn render_list(rows: &[TaskRow], now: DateTime<Utc>) -> String {
    let mut out = format!(
        "{:<10} {:<40} {:<20} {:>10} {:>10} {:>8}  {:<28} LAST ERROR\n",
        "STATE", "KEY", "TYPE", "AGE", "DUE", "ATTEMPTS", "WAITS FOR"
    );
    for row in rows {
        let age = row.age_seconds.map(format_age).unwrap_or_default();
        // When a delayed or scheduled task is due, as "in 5m0s" (`--json`: the time).
        let due = row
            .due_at
            .as_deref()
            .and_then(|due| chrono::DateTime::parse_from_rfc3339(due).ok())
            .map(|at| format_age((now - at.to_utc()).num_seconds()))
            .unwrap_or_default();
        // Keys, types and errors are stored text: shown escaped.
        let error: String = escape(&row.last_error).chars().take(80).collect();
        // A running task's last reported progress joins its state ("running 40%"), and a
        // split queue's task its shard ("pending @3").
        let mut state = match row.progress {
            Some(p) => format!("{} {:.0}%", row.state, p * 100.0),
            None => row.state.clone(),
        };
        if let Some(shard) = row.shard {
            state.push_str(&format!(" @{shard}"));
        }
        out.push_str(&format!(
            "{:<10} {:<40} {:<20} {:>10} {:>10} {:>8}  {:<28} {}\n",
            state,
            escape(&row.key),
            escape(&row.task_type),
            age,
            due,
            row.attempts,
            escape(&row.waits),
            error
        ));
    }
    out.push_str(&format!("{} task(s)", rows.len()));
    out
}

/// Finds a task by full key, by name under the queue or the dead-letter prefix, or by the
/// id `leaderq enqueue --id` was given (its key is `task_<id>`). Reads nothing else: a key
/// outside both prefixes is taken as a name under them, and one that is not a valid key
/// there is refused.
pub async fn find(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    key: &str,
) -> Result<StoredTask, OperateError> {
    let prefixes = [queue.prefix.as_str(), queue.dead_prefix.as_str()];
    let candidates = match Key::within(key, &prefixes) {
        Ok(full) => vec![full],
        Err(_) => {
            let mut names = prefixes
                .iter()
                .map(|prefix| Key::under(prefix, key))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|reason| OperateError::InvalidKey {
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
    Err(OperateError::NoSuchTask {
        key: key.to_string(),
    })
}

/// What `leaderq tasks show` prints: the key, its holder, its versions, then the value as
/// indented JSON (or as a JSON string when it is not JSON).
pub fn render_show(pair: &StoredTask) -> String {
    let value: Value = serde_json::from_slice(&pair.value)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&pair.value).into_owned()));
    let holder = pair
        .holder
        .as_ref()
        .map_or("(none)", |lease| lease.0.as_str());
    format!(
        "key:          {}\nheld by:      {}\ncreated:      {}\nversion:      {}\n{}",
        escape(&pair.key),
        escape(holder),
        pair.created,
        pair.version,
        serde_json::to_string_pretty(&value).expect("a JSON value serializes")
    )
}

/// What `leaderq tasks show` says of a task, as JSON (the front door's answer): its key,
/// state and attempts as `tasks list` reads them, its holder and versions, and its value.
pub fn show_json(pair: &StoredTask, queue: &QueueSettings, now: DateTime<Utc>) -> Value {
    let dead = pair.key.starts_with(&queue.dead_prefix);
    let (queued, dead) = if dead {
        (Vec::new(), vec![pair.clone()])
    } else {
        (vec![pair.clone()], Vec::new())
    };
    let row = task_rows(queued, dead, now).pop();
    let value: Value = serde_json::from_slice(&pair.value)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&pair.value).into_owned()));
    json!({
        "key": pair.key,
        "state": row.as_ref().map(|r| r.state.as_str()),
        "taskType": row.as_ref().map(|r| r.task_type.as_str()),
        "attempts": row.as_ref().map(|r| r.attempts),
        "lastError": row.as_ref().map(|r| r.last_error.as_str()).filter(|e| !e.is_empty()),
        "dueAt": row.as_ref().and_then(|r| r.due_at.as_deref()),
        "heldBy": pair.holder.as_ref().map(|lease| lease.0.as_str()),
        "created": pair.created,
        "version": pair.version,
        "value": value,
    })
}

/// What [`cancel`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Cancelled {
    /// The task was pending: it is a dead letter now, under `dead_key`.
    DeadLettered { dead_key: String },
    /// The task is running: the leader was asked to stop its handler and dead-letter it
    /// (within about a second); `marker` is the request's key.
    Requested { marker: String },
}

/// `tasks cancel KEY`: a pending task moves to the dead letters with reason "cancelled",
/// at the version read; a running one (held by a live lease) gets a cancel marker naming
/// its claim, which the leader acts on (`queue/cancel.rs`). A dead letter cannot be
/// cancelled.
pub async fn cancel(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    key: &str,
) -> Result<Cancelled, OperateError> {
    let stored = find(coord, queue, key).await?;
    if !stored.key.starts_with(&queue.prefix) {
        return Err(OperateError::NotQueued { key: stored.key });
    }
    if stored.holder.is_some() {
        let marker = crate::queue::cancel_key(&stored.key);
        let value = serde_json::to_vec(&crate::queue::CancelMarker {
            version: stored.version,
            requested_at: crate::task::rfc3339(Utc::now()),
        })
        .expect("a marker serializes");
        coord
            .edit(&[Edit::Put {
                key: marker.clone(),
                value,
            }])
            .await?;
        return Ok(Cancelled::Requested { marker });
    }
    let dead_key: String =
        crate::task::key::dead_letter_key(&queue.prefix, &queue.dead_prefix, &stored.key).into();
    let value = crate::task::dead_letter(
        &stored,
        "cancelled (leaderq tasks cancel) before it ran",
        Utc::now(),
    );
    let ops = [
        Edit::Delete {
            key: stored.key.clone(),
            version: stored.version,
        },
        // As the leader's own dead letters: an older one of the same name is replaced.
        Edit::Put {
            key: dead_key.clone(),
            value,
        },
    ];
    match coord.edit(&ops).await? {
        Edited::Done => Ok(Cancelled::DeadLettered { dead_key }),
        Edited::Conflict(_) => Err(OperateError::Changed { key: stored.key }),
    }
}

/// `leaderq tasks cancel KEY` as the CLI runs it: [`cancel`], and for a running task a
/// (bounded) wait until the leader stopped its handler and dead-lettered it, saying each
/// step to `say`.
pub async fn cancel_and_wait<E: From<OperateError>>(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    election: &ElectionSettings,
    key: &str,
    mut say: impl FnMut(Line) -> Result<(), E>,
) -> Result<(), E> {
    match cancel(coord, queue, key).await? {
        Cancelled::DeadLettered { dead_key } => say(Line::Out(format!(
            "cancelled: moved to {}",
            escape(&dead_key)
        ))),
        Cancelled::Requested { .. } => {
            say(Line::Out(format!(
                "{} is running: the leader stops its handler and dead-letters it",
                escape(key)
            )))?;
            let line = wait_cancelled(coord, queue, election, key).await?;
            say(line)
        }
    }
}

/// Waits (a bounded while) until the running task `key` left the queue after a cancel;
/// answers the line that says where it went.
async fn wait_cancelled(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    election: &ElectionSettings,
    key: &str,
) -> Result<Line, OperateError> {
    // The leader looks every second, then stops the handler (kill_grace at most).
    let limit = queue.kill_grace + election.lease_ttl + CANCEL_SLACK;
    let started = std::time::Instant::now();
    loop {
        match find(coord, queue, key).await {
            Ok(found) if found.key.starts_with(&queue.dead_prefix) => {
                return Ok(Line::Out(format!(
                    "cancelled: moved to {}",
                    escape(&found.key)
                )));
            }
            Ok(found) if found.holder.is_none() => {
                return Err(OperateError::NotCancelled {
                    key: escape(&found.key).into_owned(),
                });
            }
            Err(OperateError::NoSuchTask { .. }) => {
                return Ok(Line::Out(format!(
                    "{} finished before it could be stopped (see `leaderq tasks history`)",
                    escape(key)
                )));
            }
            Err(err) => return Err(err),
            Ok(_) => {}
        }
        if started.elapsed() > limit {
            return Err(OperateError::StillRunning {
                key: escape(key).into_owned(),
                waited: crate::util::duration::format(limit),
            });
        }
        tokio::time::sleep(CANCEL_POLL).await;
    }
}

/// What `leaderq tasks delete` prints for the key it deleted.
pub fn render_deleted(key: &str) -> String {
    format!("deleted {}", escape(key))
}

/// `tasks delete KEY`: deletes a pending task or a dead letter at the version read, and
/// its runs' kept output. A running task is refused (cancel it instead).
pub async fn delete(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    key: &str,
) -> Result<String, OperateError> {
    let stored = find(coord, queue, key).await?;
    if stored.holder.is_some() {
        return Err(OperateError::Running { key: stored.key });
    }
    let ops = [Edit::Delete {
        key: stored.key.clone(),
        version: stored.version,
    }];
    match coord.edit(&ops).await? {
        Edited::Done => {
            // Its runs' kept output goes with it; the deletion stands whatever this answers.
            if let Err(err) = super::output::forget(coord, queue, &stored, Utc::now()).await {
                tracing::warn!(task_key = %stored.key, error = %err, "cannot delete the task's kept output");
            }
            Ok(stored.key)
        }
        Edited::Conflict(_) => Err(OperateError::Changed { key: stored.key }),
    }
}

#[cfg(test)]
mod tests {
    use super::task_rows;
    use crate::coord::{StoredTask, TaskVersion};
    use crate::operate::waits::{explain, Limits};

    fn stored(key: &str, value: &str) -> StoredTask {
        StoredTask {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            version: TaskVersion(1),
            created: 1,
            holder: None,
        }
    }

    /// A waiting task of a paused type shows as `paused`, whatever else it waits for; a
    /// task of another type, or a dead letter, keeps its state.
    #[test]
    fn tasks_of_a_paused_type_show_as_paused() {
        let queued = vec![
            stored("q/a", r#"{"taskType":"Held","taskTime":1}"#),
            stored("q/b", r#"{"taskType":"Work","taskTime":2}"#),
            stored(
                "q/c",
                r#"{"taskType":"Held","taskTime":3,"runAt":"2999-01-01T00:00:00Z"}"#,
            ),
        ];
        let dead = vec![stored("d/x", r#"{"taskType":"Held","deadReason":"boom"}"#)];
        let mut rows = task_rows(queued, dead, chrono::Utc::now());
        explain(&mut rows, &Limits::default(), false, &["Held".to_string()]);
        let states: Vec<&str> = rows.iter().map(|row| row.state.as_str()).collect();
        assert_eq!(states, ["paused", "pending", "paused", "dead"]);
    }

    /// A running task's last reported progress joins its state in the table and its row in
    /// JSON; a pending task's progress from an earlier run does not.
    #[test]
    fn a_running_tasks_progress_shows_beside_its_state() {
        let mut running = stored(
            "q/a",
            r#"{"taskType":"Copy","taskTime":1,"taskTaken":true,"progress":0.4,"checkpoint":{"n":4}}"#,
        );
        running.holder = Some(crate::coord::LeaseId("s1".into()));
        let pending = stored("q/b", r#"{"taskType":"Copy","taskTime":2,"progress":0.9}"#);
        let now = chrono::Utc::now();
        let rows = task_rows(vec![running, pending], Vec::new(), now);
        assert_eq!(rows[0].progress, Some(0.4));
        assert_eq!(rows[1].progress, None);
        let table = super::render_list(&rows, now);
        assert!(table.contains("in_flight 40%"), "{table}");
        let json = serde_json::to_value(&rows).unwrap();
        assert_eq!(json[0]["progress"], 0.4);
        assert!(json[1].get("progress").is_none(), "{json}");
    }
}
