//! The operator's memory and control, as plain functions over the coordinator seam that the
//! CLI and the dashboard both call, each answering serializable values: [`history`] (finished
//! tasks: history records and dead letters), [`replicas()`] (leader and standbys with their
//! last heartbeat), [`timeline`] (who led when, and why each term ended), and the actions
//! on single tasks and on the dead letters as a whole. Reads go through `list`/`get`, writes through
//! `Coordinator::edit` at the versions read, as in `admin.rs`, whose errors they share.

use serde::Serialize;

use crate::config::Settings;
use crate::coord::{Coordinator, Edit, Edited, StoredTask};
use crate::leader::timeline::TimelineEntry;
use crate::service::admin::{list_now, AdminError};
use crate::task::history::HistoryRecord;

/// Which finished tasks [`history`] answers.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HistoryFilter {
    /// Only this `taskType`.
    pub task_type: Option<String>,
    /// Only those that did not complete (dead letters).
    pub failed: bool,
    /// At most this many, the newest.
    pub limit: Option<usize>,
}

/// The history records of completed tasks under `queue.done_prefix`, in key order; a
/// record that is not one of leaderq's is skipped.
pub async fn completed(
    coord: &dyn Coordinator,
    settings: &Settings,
) -> Result<Vec<HistoryRecord>, AdminError> {
    Ok(list_now(coord, &settings.queue.done_prefix)
        .await?
        .iter()
        .filter_map(|stored| HistoryRecord::decode(&stored.key, &stored.value))
        .collect())
}

/// Finished tasks, newest first: the history records under `queue.done_prefix` (completed)
/// and the dead letters under `queue.dead_prefix` (dead), filtered by `filter`. A record
/// that is not one of leaderq's is skipped.
pub async fn history(
    coord: &dyn Coordinator,
    settings: &Settings,
    filter: &HistoryFilter,
) -> Result<Vec<HistoryRecord>, AdminError> {
    let mut records: Vec<HistoryRecord> = Vec::new();
    if !filter.failed {
        records = completed(coord, settings).await?;
    }
    for stored in list_now(coord, &settings.queue.dead_prefix).await? {
        records.extend(HistoryRecord::from_dead_letter(&stored.key, &stored.value));
    }
    if let Some(task_type) = &filter.task_type {
        records.retain(|record| &record.task_type == task_type);
    }
    records.sort_by(|a, b| (b.finished(), &b.record_key).cmp(&(a.finished(), &a.record_key)));
    if let Some(limit) = filter.limit {
        records.truncate(limit);
    }
    Ok(records)
}

// Every replica's record: `status` shows them too, so they are read where it is.
pub use crate::service::admin::replicas;

/// The newest `limit` terms of leadership, newest first: who led, from when, with which
/// fencing token, and why the term before ended.
pub async fn timeline(
    coord: &dyn Coordinator,
    settings: &Settings,
    limit: usize,
) -> Result<Vec<TimelineEntry>, AdminError> {
    Ok(crate::leader::timeline::read(coord, &settings.election.leader_key, limit).await?)
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
    settings: &Settings,
    key: &str,
) -> Result<Cancelled, AdminError> {
    let stored = crate::service::admin::find(coord, settings, key).await?;
    if !stored.key.starts_with(&settings.queue.prefix) {
        return Err(AdminError::NotQueued { key: stored.key });
    }
    if stored.holder.is_some() {
        let marker = crate::queue::cancel_key(&stored.key);
        let value = serde_json::to_vec(&crate::queue::CancelMarker {
            version: stored.version,
            requested_at: crate::task::rfc3339(chrono::Utc::now()),
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
    let dead_key: String = crate::task::key::dead_letter_key(
        &settings.queue.prefix,
        &settings.queue.dead_prefix,
        &stored.key,
    )
    .into();
    let value = crate::task::dead_letter(
        &stored,
        "cancelled (leaderq tasks cancel) before it ran",
        chrono::Utc::now(),
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
        Edited::Conflict(_) => Err(AdminError::Changed { key: stored.key }),
    }
}

/// `tasks delete KEY`: deletes a pending task or a dead letter at the version read. A
/// running task is refused (cancel it instead).
pub async fn delete(
    coord: &dyn Coordinator,
    settings: &Settings,
    key: &str,
) -> Result<String, AdminError> {
    let stored = crate::service::admin::find(coord, settings, key).await?;
    if stored.holder.is_some() {
        return Err(AdminError::Running { key: stored.key });
    }
    let ops = [Edit::Delete {
        key: stored.key.clone(),
        version: stored.version,
    }];
    match coord.edit(&ops).await? {
        Edited::Done => Ok(stored.key),
        Edited::Conflict(_) => Err(AdminError::Changed { key: stored.key }),
    }
}

/// What [`retry_all`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RetriedAll {
    /// The queue keys the dead letters went back to.
    pub retried: Vec<String>,
    /// Dead letters left where they were, with why.
    pub failed: Vec<(String, String)>,
}

/// `tasks retry --all [--type T]`: every dead letter (of `task_type`) back to the queue,
/// one edit each, as `tasks retry` does; `progress(done, total)` after each. Dead letters
/// that are not tasks (malformed values) are skipped.
pub async fn retry_all(
    coord: &dyn Coordinator,
    settings: &Settings,
    task_type: Option<&str>,
    progress: &mut (dyn FnMut(usize, usize) + Send),
) -> Result<RetriedAll, AdminError> {
    let dead = list_now(coord, &settings.queue.dead_prefix).await?;
    let chosen: Vec<&StoredTask> = dead
        .iter()
        .filter(|stored| {
            let value: serde_json::Value =
                serde_json::from_slice(&stored.value).unwrap_or_default();
            let Some(this_type) = value.get("taskType").and_then(|t| t.as_str()) else {
                return false;
            };
            value.get("rawValue").is_none() && task_type.is_none_or(|wanted| wanted == this_type)
        })
        .collect();
    let mut report = RetriedAll::default();
    for (n, stored) in chosen.iter().enumerate() {
        match crate::service::admin::retry(coord, settings, &stored.key).await {
            Ok(target) => report.retried.push(target),
            Err(AdminError::Coordinator(err)) => return Err(err.into()),
            Err(err) => report.failed.push((stored.key.clone(), err.to_string())),
        }
        progress(n + 1, chosen.len());
    }
    Ok(report)
}
