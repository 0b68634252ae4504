//! The dashboard's watcher: one per serving process, started by the first request. It
//! reads the queue, the dead letters, the holder and the pause flag, publishes the panes
//! built from them (with the completed tasks' history records, read again every few
//! seconds or a second after a completion, which the history page and the chart filter
//! and count; the last hour's throughput as seen between two readings when history is
//! off), then waits on the coordinator's blocking `list`/`observe` for the next change,
//! an action on this dashboard, the pause flag moving, or the records' next reading; at
//! most once per `MIN_REFRESH`.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use super::view::{self, Panes, Seen, Throughput};
use super::Ui;
use crate::coord::{CoordError, Holder, StoredTask, Version};
use crate::task::history::HistoryRecord;

/// The watcher reads at most this often, however busy the queue: a burst of changes costs
/// one reading per interval, not one per change.
const MIN_REFRESH: Duration = Duration::from_millis(250);
/// After a failed reading, the next one waits this long.
const ERROR_RETRY: Duration = Duration::from_secs(1);
/// The pause flag is its own key, outside the queue's listing: looked at this often, so a
/// `leaderq pause` from a shell shows within a second.
const PAUSE_POLL: Duration = Duration::from_millis(900);

/// The chart's completed records are read again at most this often (a listing of up to
/// `queue.history_keep` records); the dead letters come with every reading.
const HISTORY_REFRESH: Duration = Duration::from_secs(5);
/// After a reading that saw a task finish, the records are read again once this long has
/// passed since the last read: the history page shows a completion within about a second,
/// yet a busy queue costs one listing a second, not one per reading.
const HISTORY_AFTER_CHANGE: Duration = Duration::from_secs(1);

/// One reading of everything the panes show.
struct Reading {
    holder: Holder,
    holder_version: Version,
    queued: Vec<StoredTask>,
    queue_version: Version,
    dead: Vec<StoredTask>,
    dead_version: Version,
    paused: bool,
    /// The task types paused on their own (none, when they cannot be read).
    paused_types: Vec<String>,
}

async fn read(ui: &Ui) -> Result<Reading, CoordError> {
    let queue = &ui.queue;
    let (holder, holder_version) = ui.coord.observe(Version(0), Duration::ZERO).await?;
    let (queued, queue_version) = ui
        .coord
        .list(&queue.prefix, Version(0), Duration::ZERO)
        .await?;
    let (dead, dead_version) = ui
        .coord
        .list(&queue.dead_prefix, Version(0), Duration::ZERO)
        .await?;
    let paused = paused(ui).await?;
    let paused_types = crate::operate::status::paused_types(ui.coord.as_ref(), queue)
        .await
        .unwrap_or_default();
    Ok(Reading {
        holder,
        holder_version,
        queued,
        queue_version,
        dead,
        dead_version,
        paused,
        paused_types,
    })
}

async fn paused(ui: &Ui) -> Result<bool, CoordError> {
    let key = [crate::queue::pause_key(&ui.queue.prefix)];
    Ok(!ui.coord.get(&key).await?.is_empty())
}

/// The watcher: read, publish, wait for a change, again; until `stop`.
pub(super) async fn watch_coordinator(ui: Arc<Ui>) {
    let mut seen: Option<Seen> = None;
    let mut throughput = Throughput::default();
    // The completed tasks' history records, and when they were read (the dead letters come
    // with every reading).
    let mut done_records: Option<(tokio::time::Instant, Arc<Vec<HistoryRecord>>)> = None;
    let mut seq = 0;
    let wait = ui.watch_wait;
    loop {
        seq += 1;
        let read_at = tokio::time::Instant::now();
        match read(&ui).await {
            Ok(reading) => {
                let now = Utc::now();
                let next = Seen::of(&reading.queued, &reading.dead);
                let (completed, failed) = seen.as_ref().map_or((0, 0), |seen| seen.changes(&next));
                throughput.record(now, completed, failed);
                seen = Some(next);
                let history_on = ui.queue.history_keep > 0;
                let mut refreshed = false;
                let dead: Vec<HistoryRecord> = reading
                    .dead
                    .iter()
                    .filter_map(|s| HistoryRecord::from_dead_letter(&s.key, &s.value))
                    .collect();
                // The rated types' records, read only when some type has a rate.
                let mut limits = ui.limits.clone();
                limits
                    .read_rates(ui.coord.as_ref(), &ui.queue.prefix, now)
                    .await;
                let mut panes = view::panes(
                    &reading.holder,
                    reading.queued,
                    reading.dead,
                    reading.paused,
                    &reading.paused_types,
                    &limits,
                    now,
                );
                panes.overview.seq = seq;
                panes.overview.chart = throughput.chart(now);
                panes.overview.chart_source = "seen";
                if history_on {
                    let stale = done_records.as_ref().is_none_or(|(read, _)| {
                        read.elapsed() >= HISTORY_REFRESH
                            || (completed + failed > 0 && read.elapsed() >= HISTORY_AFTER_CHANGE)
                    });
                    if stale {
                        refreshed = true;
                        if let Ok(records) =
                            crate::operate::history::completed(ui.coord.as_ref(), &ui.queue).await
                        {
                            done_records = Some((tokio::time::Instant::now(), Arc::new(records)));
                        }
                    }
                    if let Some((_, records)) = &done_records {
                        panes.overview.chart =
                            view::chart_of_history(records.iter().chain(&dead), now);
                        panes.overview.chart_source = "history";
                        panes.done = records.clone();
                    }
                }
                panes.dead_records = dead;
                // The records are read again on their own clock too: a completion seen
                // while they were fresh, or a record written by another hand, shows
                // within HISTORY_AFTER_CHANGE or HISTORY_REFRESH with no further change.
                let history_next = match &done_records {
                    Some((read, _)) if completed + failed > 0 && !refreshed => {
                        *read + HISTORY_AFTER_CHANGE
                    }
                    Some((read, _)) => *read + HISTORY_REFRESH,
                    None => tokio::time::Instant::now() + HISTORY_REFRESH,
                };
                panes.overview.completed_last_hour =
                    panes.overview.chart.iter().map(|m| m.completed).sum();
                panes.overview.failed_last_hour =
                    panes.overview.chart.iter().map(|m| m.failed).sum();
                ui.panes.send_replace(Arc::new(panes));
                let coord = ui.coord.as_ref();
                let queue = &ui.queue;
                tokio::select! {
                    _ = ui.stop.cancelled() => return,
                    _ = ui.refresh.notified() => {}
                    _ = coord.list(&queue.prefix, reading.queue_version, wait) => {}
                    _ = coord.list(&queue.dead_prefix, reading.dead_version, wait) => {}
                    _ = coord.observe(reading.holder_version, wait) => {}
                    _ = pause_changes(&ui, reading.paused) => {}
                    _ = tokio::time::sleep_until(history_next), if history_on => {}
                }
            }
            Err(err) => {
                let mut panes = Panes::clone(&ui.panes.borrow());
                panes.overview.seq = seq;
                panes.overview.error = Some(format!("cannot read {}: {err}", ui.coord.describe()));
                ui.panes.send_replace(Arc::new(panes));
                tokio::select! {
                    _ = ui.stop.cancelled() => return,
                    _ = tokio::time::sleep(ERROR_RETRY) => {}
                }
            }
        }
        tokio::select! {
            _ = ui.stop.cancelled() => return,
            // A change after a quiet spell is read at once; a burst, once per interval.
            _ = tokio::time::sleep_until(read_at + MIN_REFRESH) => {}
        }
    }
}

/// Returns once the pause flag is no longer `paused` (or cannot be read).
async fn pause_changes(ui: &Ui, was: bool) {
    loop {
        tokio::time::sleep(PAUSE_POLL).await;
        if paused(ui).await.ok() != Some(was) {
            return;
        }
    }
}
