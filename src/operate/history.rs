//! Finished tasks as an operator reads them: `leaderq tasks history` (completed tasks'
//! history records and dead letters, newest first, filtered) and its table; the dashboard's
//! history pane and throughput chart read the same records. The records themselves are
//! written by the leader (`task::history`).

use std::time::Duration;

use serde::Serialize;

use super::{list_now, OperateError};
use crate::config::QueueSettings;
use crate::coord::Coordinator;
use crate::task::history::HistoryRecord;
use crate::util::escape::escape;

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

/// The history records of completed tasks under `queue.done_prefix`, in key order (the
/// records written together under one key in their order there); a record that is not one
/// of leaderq's is skipped.
pub async fn completed(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
) -> Result<Vec<HistoryRecord>, OperateError> {
    Ok(list_now(coord, &queue.done_prefix)
        .await?
        .iter()
        .flat_map(|stored| HistoryRecord::decode_all(&stored.key, &stored.value))
        .collect())
}

/// Finished tasks, newest first: the history records under `queue.done_prefix` (completed)
/// and the dead letters under `queue.dead_prefix` (dead), filtered by `filter`. A record
/// that is not one of leaderq's is skipped.
pub async fn history(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    filter: &HistoryFilter,
) -> Result<Vec<HistoryRecord>, OperateError> {
    let mut records: Vec<HistoryRecord> = Vec::new();
    if !filter.failed {
        records = completed(coord, queue).await?;
    }
    for stored in list_now(coord, &queue.dead_prefix).await? {
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

/// The table `leaderq tasks history` prints, with a count at the end.
pub fn render(records: &[HistoryRecord]) -> String {
    let mut out = format!(
        "{:<9} {:<24} {:<36} {:<16} {:>9} {:>8} {:>7} {:<12}  ERROR\n",
        "OUTCOME", "FINISHED", "KEY", "TYPE", "DURATION", "ATTEMPTS", "TOKEN", "NODE"
    );
    for record in records {
        let duration = record
            .duration_ms
            .map(|ms| crate::util::duration::format(Duration::from_millis(ms)))
            .unwrap_or_default();
        let token = record
            .fencing_token
            .map(|t| t.to_string())
            .unwrap_or_default();
        // Records are stored text: shown escaped.
        let error = record.reason.as_ref().or(record.last_error.as_ref());
        let error: String = error
            .map(|e| escape(e).chars().take(80).collect())
            .unwrap_or_default();
        out.push_str(&format!(
            "{:<9} {:<24} {:<36} {:<16} {:>9} {:>8} {:>7} {:<12}  {}\n",
            record.outcome,
            escape(&record.finished_at),
            escape(&record.key),
            escape(&record.task_type),
            duration,
            record.attempts,
            token,
            escape(record.node.as_deref().unwrap_or("")),
            error
        ));
    }
    out.push_str(&format!("{} finished task(s)", records.len()));
    out
}
