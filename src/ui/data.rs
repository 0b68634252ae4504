//! The dashboard's calls into what the rest of leaderq records and does, shaped as the
//! page's panes want them: history of finished tasks (`operate::history`), the
//! leadership timeline, the replicas with their last heartbeat, the schedules with their
//! ticks (`operate::schedules::list`), and the operator actions delete, retry all and cancel
//! (the same functions as `leaderq tasks …`) and a schedule's pause and resume (as
//! `leaderq schedules pause|resume`).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};

use super::pages::{self, Chart, TaskPage, Window};
use crate::config::{ElectionSettings, QueueSettings};
use crate::coord::{Coordinator, FencingToken};
use crate::operate::history::{self, HistoryFilter};
use crate::operate::schedules::{self, SchedulesError};
use crate::operate::tasks::{self, Cancelled};
use crate::operate::{dead, leadership, status, OperateError};
use crate::task::history::HistoryRecord;
use crate::task::key::Key;

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

/// The chart of `window` over `records` (the watcher's, so open pages cost no listing of
/// the history), with the leadership terms read now.
pub async fn chart(
    coord: &dyn Coordinator,
    election: &ElectionSettings,
    records: impl IntoIterator<Item = &HistoryRecord>,
    window: Window,
    now: DateTime<Utc>,
) -> Result<Chart, OperateError> {
    let terms = leadership::timeline(coord, election, TIMELINE_ROWS).await?;
    Ok(pages::chart(records, &terms, window, now))
}

/// One task's page, by its key: under the queue prefix (and once it left the queue, its
/// newest history record or dead letter), under the dead-letter prefix, or a history
/// record's. `leader_token` is the current leadership's, shown for a task it runs. With the
/// output its runs left, if it can be read (the page shows without it otherwise).
pub async fn task(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    key: &str,
    leader_token: Option<FencingToken>,
    now: DateTime<Utc>,
) -> Result<TaskPage, OperateError> {
    let mut page = task_page(coord, queue, key, leader_token, now).await?;
    // The task's key in the queue: its record's once it finished or is a dead letter.
    let task_key = match &page.record {
        Some(record) if !record.key.is_empty() => record.key.clone(),
        _ => page.key.clone(),
    };
    if let Ok(kept) = crate::operate::output::read(coord, queue, &task_key).await {
        page.output = kept.attempts;
    }
    Ok(page)
}

async fn task_page(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    key: &str,
    leader_token: Option<FencingToken>,
    now: DateTime<Utc>,
) -> Result<TaskPage, OperateError> {
    let prefixes = [
        queue.prefix.as_str(),
        queue.dead_prefix.as_str(),
        queue.done_prefix.as_str(),
    ];
    let key = Key::within(key, &prefixes).map_err(|reason| OperateError::InvalidKey {
        key: key.to_string(),
        prefixes: prefixes.join(" or "),
        reason,
    })?;
    let key = String::from(key);
    let under = |prefix: &str| key.starts_with(prefix);
    let missing = || OperateError::NoSuchTask { key: key.clone() };
    if under(&queue.done_prefix) {
        // One record of several written together is addressed as `<their key>/<place>`.
        let (stored_key, place) = crate::task::history::locate(&queue.done_prefix, &key);
        let stored = coord.get(&[stored_key]).await?.pop().ok_or_else(missing)?;
        let records = HistoryRecord::decode_all(&stored.key, &stored.value);
        let record = records.into_iter().nth(place.unwrap_or(0));
        return Ok(pages::completed_page(record.ok_or_else(missing)?));
    }
    let found = coord.get(std::slice::from_ref(&key)).await?.pop();
    if under(&queue.dead_prefix) {
        return Ok(pages::dead_page_of(&found.ok_or_else(missing)?));
    }
    if let Some(stored) = found {
        return Ok(pages::queued_page(&stored, leader_token, now));
    }
    // Gone from the queue: finished. Its newest record says how.
    let records = history::history(coord, queue, &HistoryFilter::default()).await?;
    let Some(record) = records.into_iter().find(|record| record.key == key) else {
        return Err(missing());
    };
    if record.failed() {
        let wanted = [record.record_key.clone()];
        if let Some(dead) = coord.get(&wanted).await?.pop() {
            return Ok(pages::dead_page_of(&dead));
        }
    }
    Ok(pages::completed_page(record))
}

/// Who led when, and why each term began and ended.
pub async fn timeline(coord: &dyn Coordinator, election: &ElectionSettings) -> Recorded {
    rows_or_why(
        leadership::timeline(coord, election, TIMELINE_ROWS).await,
        |entry| {
            json!({
                "node": entry.node,
                "token": entry.fencing_token,
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

/// The replicas that do not lead: the standbys with their last heartbeat, then the gone
/// (the leader is the overview's own card). A split queue's: every replica, with the shards
/// it leads and their fencing tokens.
pub async fn standbys(coord: &dyn Coordinator, election: &ElectionSettings) -> Recorded {
    let split = election.shards > 1;
    let others = status::replicas(coord, election).await.map(|views| {
        views
            .into_iter()
            .filter(|v| split || v.status != "leader")
            .collect()
    });
    rows_or_why(others, |view: crate::leader::replicas::ReplicaView| {
        let shards: Vec<String> = view
            .record
            .led_shards
            .iter()
            .map(|led| format!("{} (token {})", led.shard, led.fencing_token))
            .collect();
        json!({
            "node": view.record.node,
            "status": view.status,
            "seen": format!("{} s ago", view.last_seen_seconds),
            "host": view.record.host,
            "shards": shards.join(", "),
        })
    })
}

/// Every schedule of the queue with its last and next tick and where its last task is now
/// (`ui::view::schedule_rows`); an unreadable record is a row with its error.
pub async fn schedules(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    now: DateTime<Utc>,
) -> Recorded {
    match schedules::list(coord, queue, now).await {
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
    queue: &QueueSettings,
    name: &str,
    paused: bool,
) -> Result<bool, SchedulesError> {
    schedules::set_paused(coord, queue, name, paused).await
}

/// Deletes a dead letter (or a pending task) at the version read; a running task is
/// refused.
pub async fn delete(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    key: &str,
) -> Result<(), OperateError> {
    tasks::delete(coord, queue, key).await.map(drop)
}

/// Moves every dead letter (of `task_type`, if given) back to the queue. Answers how many
/// moved and why the others did not.
pub async fn retry_all(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    task_type: Option<&str>,
) -> Result<(usize, Vec<String>), OperateError> {
    let done = dead::retry_all(coord, queue, task_type, &mut |_, _| {}).await?;
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
    queue: &QueueSettings,
    key: &str,
) -> Result<String, String> {
    match tasks::cancel(coord, queue, key).await {
        Ok(Cancelled::DeadLettered { dead_key }) => Ok(format!(
            "cancelled: moved to the dead letters as {dead_key}"
        )),
        Ok(Cancelled::Requested { .. }) => {
            Ok("cancel requested: the leader stops its handler within about a second".into())
        }
        Err(err) => Err(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::memory::MemoryCoordinator;
    use crate::task::history::{batch_value, HistoryRecord, COMPLETED};

    /// A record among several written under one key opens at its address, `key/place`; the
    /// key alone opens the first.
    #[tokio::test]
    async fn a_record_written_with_others_opens_at_its_place() {
        let settings = crate::config::Settings::load(None, crate::config::Env::new()).unwrap();
        let coord = MemoryCoordinator::default();
        let records: Vec<Vec<u8>> = ["t1", "t2"]
            .iter()
            .map(|name| {
                HistoryRecord {
                    outcome: COMPLETED.into(),
                    key: format!("{}{name}", settings.queue.prefix),
                    task_id: name.to_string(),
                    ..HistoryRecord::default()
                }
                .encode()
            })
            .collect();
        let key = format!("{}0000000009000.2-t2", settings.queue.done_prefix);
        coord
            .put(&key, &batch_value(records.iter().map(Vec::as_slice)))
            .unwrap();
        let now = Utc::now();
        let second = task(&coord, &settings.queue, &format!("{key}/1"), None, now)
            .await
            .unwrap();
        assert_eq!(second.task_id, "t2");
        let first = task(&coord, &settings.queue, &key, None, now)
            .await
            .unwrap();
        assert_eq!(first.task_id, "t1");
        assert!(
            task(&coord, &settings.queue, &format!("{key}/2"), None, now)
                .await
                .is_err()
        );
    }
}
