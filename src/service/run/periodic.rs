//! `leaderq run --every | --cron`: the periodic form. While leading, the command runs once
//! per tick of the run's schedule; the runs themselves are `mod.rs`'s `lead`, under the same
//! supervision as any run, so two never overlap. What to record, run and skip at each step
//! is `plan.rs`'s [`tick_step`] (pure); this file reads and writes the record and runs.
//!
//! # At most once per tick
//! The run's last tick is kept at `leaderq/run/<NAME>/ticks`. Each tick is recorded there
//! before its run, in a write guarded by the leadership and conditioned on the record as
//! read: two leaders cannot both record a tick, and a tick whose leader was killed, frozen
//! or cut off mid-run is not run again. A write whose answer was lost is settled by the
//! next read, which finds the tick recorded if it was.
//!
//! # Catching up
//! Each leader plans from the record, never from when its own term began, as the
//! schedules' ticker does: the ticks that fell while no replica led (a leader killed,
//! frozen past its lease or partitioned away) or while the command ran are caught up under
//! `--catch-up`. `all` runs each in turn (at most the catch-up limit, the latest), each
//! recorded just before its own run, so a leader that dies half-way through leaves the
//! rest to the next; `latest` runs the latest of them, late; `none` runs the latest only if
//! it is on time (`schedule::plan::ON_TIME_GRACE`). Every tick not run is named in the
//! log, the earliest [`super::plan::SKIPPED_NAMED`] one by one and then the count and
//! range of them all, so none is dropped in silence.
//!
//! # Where the ticks begin
//! With no record (a new run, or a record deleted or garbled by hand) the leader records
//! where the run's ticks begin, its own clock's now, and runs nothing for it: no tick at
//! or before it ever runs, so nothing from before the run existed is replayed, and a
//! failover before the first tick loses none, as the next leader plans from that origin.
//! Only a leader that dies between winning and that one write leaves no origin; the next
//! then begins from its own. The record outlives the replicas: a run whose replicas were
//! all stopped catches up the ticks that fell meanwhile when it starts again, as a schedule
//! does after an outage.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::plan::{tick_step, Event, Skipped, TickStep};
use super::{lead, watch_leadership, RunOptions, COORD_BACKOFF};
use crate::coord::{Coordinator, Leadership, Written};
use crate::leader::Lease;
use crate::schedule::store::{rfc3339_ms, TickRecord};
use crate::schedule::CatchUp;
use crate::supervise::Supervision;

/// The key of a periodic run's tick record: its last tick, written before the tick's run (or,
/// before its first tick, where its ticks begin).
pub fn ticks_key(name: &str) -> String {
    format!("leaderq/run/{name}/ticks")
}

/// A periodic run's schedule and where its ticks are recorded.
pub(super) struct Ticks<'a> {
    pub(super) schedule: &'a crate::schedule::Schedule,
    pub(super) key: String,
    pub(super) node_id: &'a str,
}

/// What running the command under one leadership needs.
pub(super) struct Leading<'a> {
    pub(super) supervision: &'a Supervision,
    pub(super) options: &'a RunOptions,
    pub(super) base_env: &'a [(String, String)],
    pub(super) leadership: &'a Leadership,
    pub(super) lease: &'a Arc<Lease>,
    pub(super) coord: &'a dyn Coordinator,
    pub(super) wait: Duration,
    pub(super) shutdown: &'a CancellationToken,
}

/// The periodic form (`--every`, `--cron`): while leading, runs the command once per tick,
/// as the module header says. Returns when leadership is lost or on shutdown.
pub(super) async fn lead_periodic(ticks: &Ticks<'_>, leading: &Leading<'_>) -> Event {
    loop {
        let read = leading.coord.get(std::slice::from_ref(&ticks.key)).await;
        let stored = match read {
            Ok(mut found) => found.pop(),
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the run's tick record; trying again");
                if let Some(event) = pause(leading, COORD_BACKOFF).await {
                    return event;
                }
                continue;
            }
        };
        let previous = stored.as_ref().and_then(|s| TickRecord::decode(&s.value));
        let recorded = previous.as_ref().and_then(TickRecord::last);
        if stored.is_some() && recorded.is_none() {
            tracing::warn!(key = %ticks.key, "the run's tick record cannot be read; its ticks begin again from now");
        }
        let now = Utc::now();
        let (last, run, skipped) = match tick_step(ticks.schedule, recorded, now) {
            TickStep::Wait { next } => {
                let nap = next.map_or(leading.wait, |at| {
                    (at - Utc::now()).to_std().unwrap_or_default()
                });
                if let Some(event) = pause(leading, nap).await {
                    return event;
                }
                continue;
            }
            TickStep::Begin { origin } => (origin, None, Skipped::default()),
            TickStep::Tick { last, run, skipped } => (last, run, skipped),
        };
        let record = TickRecord {
            last: rfc3339_ms(last),
            last_task: None,
            skipped: previous.as_ref().map_or(0, |r| r.skipped) + skipped.count,
            written_at: rfc3339_ms(now),
            node: ticks.node_id.to_string(),
            fencing_token: leading.leadership.fencing_token,
        };
        let op = record.write(ticks.key.clone(), stored.as_ref().map(|s| s.version));
        match leading.coord.write(leading.leadership, &[op]).await {
            Ok(Written::Done { .. }) => {}
            Ok(Written::NotLeader) => return Event::Lost,
            Ok(Written::Conflict(_) | Written::Deferred(_)) => continue,
            Err(err) => {
                // The write may have been applied with its answer lost: the next read
                // says, and a tick it recorded is not run again (at most once).
                tracing::warn!(error = %err, "cannot record the run's tick yet; trying again");
                if let Some(event) = pause(leading, COORD_BACKOFF).await {
                    return event;
                }
                continue;
            }
        }
        if recorded.is_none() {
            tracing::info!(name = %leading.options.name, origin = %rfc3339_ms(last), "the run's ticks begin here; no tick at or before it runs");
        }
        log_skipped(&leading.options.name, ticks.schedule.catch_up, &skipped);
        let Some(target) = run else {
            continue;
        };
        tracing::info!(name = %leading.options.name, tick = %rfc3339_ms(target), late_ms = (Utc::now() - target).num_milliseconds(), fencing_token = leading.leadership.fencing_token.0, "running the command for its tick");
        let event = lead(
            leading.supervision,
            leading.options,
            leading.base_env,
            ticks.node_id,
            leading.leadership,
            leading.lease,
            leading.coord,
            leading.wait,
            leading.shutdown,
            Some(target),
        )
        .await;
        match event {
            Event::Exited { exit, .. } => {
                if !exit.success() {
                    tracing::warn!(name = %leading.options.name, tick = %rfc3339_ms(target), status = exit.as_code(), "the command failed for its tick; the next tick runs it again");
                }
            }
            other => return other,
        }
    }
}

/// Waits `nap` unless leadership is lost or shutdown comes first, which it returns.
async fn pause(leading: &Leading<'_>, nap: Duration) -> Option<Event> {
    tokio::select! {
        _ = leading.shutdown.cancelled() => Some(Event::Shutdown { exit: None }),
        _ = watch_leadership(leading.coord, leading.leadership, leading.lease, leading.wait) => Some(Event::Lost),
        _ = tokio::time::sleep(nap) => None,
    }
}

/// Names each skipped tick in the log, the earliest [`super::plan::SKIPPED_NAMED`] of them;
/// past those, one line gives the count and the range of them all, so that a long outage
/// under a short interval does not flood the log.
fn log_skipped(name: &str, catch_up: CatchUp, skipped: &Skipped) {
    for tick in &skipped.named {
        tracing::warn!(%name, tick = %rfc3339_ms(*tick), ?catch_up, "a tick was skipped: it fell while no leader ran or while the command ran, and --catch-up does not run it");
    }
    let named = skipped.named.len() as u64;
    if let (true, Some((first, latest))) = (skipped.count > named, skipped.range) {
        let at_least = if skipped.at_least { "at least " } else { "" };
        tracing::warn!(%name, skipped = skipped.count, first = %rfc3339_ms(first), latest = %rfc3339_ms(latest), ?catch_up, "{at_least}{} ticks were skipped in all, from first to latest; the earliest {named} are named above", skipped.count);
    }
}
