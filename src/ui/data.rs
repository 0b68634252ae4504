//! The dashboard's calls into what the rest of leaderq records and does, shaped as the
//! page's panes want them: history of finished tasks (`operate::history`), the
//! leadership timeline, the replicas with their last heartbeat, the schedules with their
//! ticks (`operate::schedules::list`), and the operator actions delete, retry all and cancel
//! (the same functions as `leaderq tasks …`) and a schedule's pause and resume (as
//! `leaderq schedules pause|resume`).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};

use crate::config::Settings;
use crate::coord::Coordinator;
use crate::operate::history::{self, HistoryFilter};
use crate::operate::schedules::{self, SchedulesError};
use crate::operate::tasks::{self, Cancelled};
use crate::operate::{dead, leadership, status, OperateError};

/// History records the pane shows, newest first.
const HISTORY_ROWS: usize = 200;
/// Leadership terms the pane shows, newest first.
const TIMELINE_ROWS: usize = 100;

/// Rows of a pane read from records: or why they could not be read.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "recorded", rename_all = "lowercase")]
pub enum Recorded {
    /// The rows, newest first.
    Yes { rows: Vec<Value> },
    /// Not readable now (the coordinator did not answer): the page says why.
    No { why: String },
}

fn rows_or_why<T>(read: Result<Vec<T>, OperateError>, row: impl Fn(T) -> Value) -> Recorded {
    match read {
        Ok(items) => Recorded::Yes {
            rows: items.into_iter().map(row).collect(),
        },
        Err(err) => Recorded::No {
            why: err.to_string(),
        },
    }
}

/// Finished tasks: outcome, duration, attempts, fencing token, node, and for a dead
/// letter its reason.
pub async fn history(coord: &dyn Coordinator, settings: &Settings) -> Recorded {
    let filter = HistoryFilter {
        task_type: None,
        failed: false,
        limit: Some(HISTORY_ROWS),
    };
    rows_or_why(history::history(coord, settings, &filter).await, |record| {
        json!({
            "key": record.key,
            "task_type": record.task_type,
            "outcome": record.outcome,
            "duration": record.duration_ms.map(|ms| format!("{ms} ms")).unwrap_or_default(),
            "attempts": record.attempts,
            "fencing_token": record.fencing_token,
            "node": record.node.unwrap_or_default(),
            "finished_at": record.finished_at,
            "detail": record.reason.or(record.last_error).unwrap_or_default(),
        })
    })
}

/// Who led when, and why each term began and ended.
pub async fn timeline(coord: &dyn Coordinator, settings: &Settings) -> Recorded {
    rows_or_why(
        leadership::timeline(coord, settings, TIMELINE_ROWS).await,
        |entry| {
            json!({
                "node": entry.node,
                "fencing_token": entry.fencing_token,
                "since": entry.since,
                "until": entry.ended_at.unwrap_or_default(),
                "why": format!(
                    "began: {}{}",
                    entry.previous_end,
                    entry.ended.map(|ended| format!("; ended: {ended}")).unwrap_or_default()
                ),
            })
        },
    )
}

/// Every replica's record: the leader, the standbys with their last heartbeat, the gone.
pub async fn standbys(coord: &dyn Coordinator, settings: &Settings) -> Recorded {
    rows_or_why(status::replicas(coord, settings).await, |view| {
        json!({
            "node": view.record.node,
            "status": view.status,
            "last_heartbeat": format!("{} s ago", view.last_seen_seconds),
            "host": view.record.host,
        })
    })
}

/// Every schedule of the queue with its last and next tick and where its last task is now
/// (`ui::view::schedule_rows`); an unreadable record is a row with its error.
pub async fn schedules(
    coord: &dyn Coordinator,
    settings: &Settings,
    now: DateTime<Utc>,
) -> Recorded {
    match schedules::list(coord, settings, now).await {
        Ok(views) => Recorded::Yes {
            rows: crate::ui::view::schedule_rows(views)
                .into_iter()
                .map(|row| json!(row))
                .collect(),
        },
        Err(err) => Recorded::No {
            why: err.to_string(),
        },
    }
}

/// Pauses or resumes the schedule `name`; answers whether that changed anything.
pub async fn set_schedule_paused(
    coord: &dyn Coordinator,
    settings: &Settings,
    name: &str,
    paused: bool,
) -> Result<bool, SchedulesError> {
    schedules::set_paused(coord, settings, name, paused).await
}

/// Deletes a dead letter (or a pending task) at the version read; a running task is
/// refused.
pub async fn delete(
    coord: &dyn Coordinator,
    settings: &Settings,
    key: &str,
) -> Result<(), OperateError> {
    tasks::delete(coord, settings, key).await.map(drop)
}

/// Moves every dead letter (of `task_type`, if given) back to the queue. Answers how many
/// moved and why the others did not.
pub async fn retry_all(
    coord: &dyn Coordinator,
    settings: &Settings,
    task_type: Option<&str>,
) -> Result<(usize, Vec<String>), OperateError> {
    let done = dead::retry_all(coord, settings, task_type, &mut |_, _| {}).await?;
    let errors = done
        .failed
        .into_iter()
        .map(|(key, why)| format!("{key}: {why}"))
        .collect();
    Ok((done.retried.len(), errors))
}

/// Cancels a pending task (dead-lettered as cancelled) or a running one (the leader stops
/// its handler and dead-letters it). Answers what happened, for the page.
pub async fn cancel(
    coord: &dyn Coordinator,
    settings: &Settings,
    key: &str,
) -> Result<String, String> {
    match tasks::cancel(coord, settings, key).await {
        Ok(Cancelled::DeadLettered { dead_key }) => Ok(format!(
            "cancelled: moved to the dead letters as {dead_key}"
        )),
        Ok(Cancelled::Requested { .. }) => {
            Ok("cancel requested: the leader stops its handler within about a second".into())
        }
        Err(err) => Err(err.to_string()),
    }
}
