//! The operator's memory and control, as plain functions over the coordinator seam that the
//! CLI and the dashboard both call, each answering serializable values: [`history`] (finished
//! tasks: history records and dead letters), [`replicas`] (leader and standbys with their
//! last heartbeat), [`timeline`] (who led when, and why each term ended), and the actions
//! on single tasks and on the dead letters as a whole. Reads go through `list`/`get`, writes through
//! `Coordinator::edit` at the versions read, as in `admin.rs`, whose errors they share.

use serde::Serialize;

use crate::config::Settings;
use crate::coord::{Coordinator, StoredTask, Version};
use crate::leader::replicas::{self, ReplicaView};
use crate::leader::timeline::TimelineEntry;
use crate::service::admin::AdminError;
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

/// Every task under `prefix` now.
async fn list_now(coord: &dyn Coordinator, prefix: &str) -> Result<Vec<StoredTask>, AdminError> {
    let (tasks, _) = coord
        .list(prefix, Version(0), std::time::Duration::ZERO)
        .await?;
    Ok(tasks)
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
        for stored in list_now(coord, &settings.queue.done_prefix).await? {
            records.extend(HistoryRecord::decode(&stored.key, &stored.value));
        }
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

/// Every replica's record, as of now: the leader first, then standbys, then those gone
/// (no heartbeat for `replicas::GONE_AFTER` periods).
pub async fn replicas(
    coord: &dyn Coordinator,
    settings: &Settings,
) -> Result<Vec<ReplicaView>, AdminError> {
    let stored = list_now(coord, &replicas::prefix(&settings.election.leader_key)).await?;
    Ok(replicas::view(&stored, chrono::Utc::now()))
}

/// The newest `limit` terms of leadership, newest first: who led, from when, with which
/// fencing token, and why the term before ended.
pub async fn timeline(
    coord: &dyn Coordinator,
    settings: &Settings,
    limit: usize,
) -> Result<Vec<TimelineEntry>, AdminError> {
    Ok(crate::leader::timeline::read(coord, &settings.election.leader_key, limit).await?)
}
