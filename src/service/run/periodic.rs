//! `leaderq run --every | --cron`: the periodic form. While leading, the command runs once
//! per tick of the run's schedule, each tick recorded in the coordinator before its run
//! (`leaderq/run/<NAME>/ticks`), in a write guarded by the leadership; the runs themselves
//! are `mod.rs`'s `lead`, under the same supervision as any run.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::plan::Event;
use super::{lead, watch_leadership, RunOptions, COORD_BACKOFF};
use crate::coord::{Coordinator, Leadership};
use crate::leader::Lease;
use crate::supervise::Supervision;

/// The key of a periodic run's tick record: its last tick, written before the tick's run.
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

/// The periodic form (`--every`, `--cron`): while leading, runs the command once per tick.
/// Each tick is recorded in the coordinator before its run, in a write guarded by the
/// leadership and conditioned on the record as read, so a failover neither repeats a tick
/// (one whose leader died mid-run is not run again: at most once) nor skips one that was not
/// recorded (the next leader runs it, as `--catch-up` says). A run that outlasts its tick is
/// not overlapped: the ticks that fell meanwhile are planned when it ends, and with the
/// default `--catch-up latest` one run follows at once for the latest of them. Returns when
/// leadership is lost or on shutdown.
pub(super) async fn lead_periodic(ticks: &Ticks<'_>, leading: &Leading<'_>) -> Event {
    use crate::schedule::store::{rfc3339_ms, TickRecord};
    let started = Utc::now();
    loop {
        let read = leading.coord.get(std::slice::from_ref(&ticks.key)).await;
        let stored = match read {
            Ok(mut found) => found.pop(),
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the run's tick record; trying again");
                tokio::select! {
                    _ = leading.shutdown.cancelled() => return Event::Shutdown { exit: None },
                    _ = watch_leadership(leading.coord, leading.leadership, leading.lease, leading.wait) => return Event::Lost,
                    _ = tokio::time::sleep(COORD_BACKOFF) => continue,
                }
            }
        };
        let previous = stored
            .as_ref()
            .and_then(|s| TickRecord::decode(&s.value).map(|r| (r, s.version)));
        let last = previous.as_ref().and_then(|(r, _)| r.last());
        let now = Utc::now();
        // A run with no record yet starts from when this replica started.
        let planned = crate::schedule::plan::plan(ticks.schedule, last, started, now);
        if let Some(planned_last) = planned.last {
            let record = TickRecord {
                last: rfc3339_ms(planned_last),
                last_task: None,
                skipped: previous.as_ref().map_or(0, |(r, _)| r.skipped) + planned.skipped,
                written_at: rfc3339_ms(now),
                node: ticks.node_id.to_string(),
                fencing_token: leading.leadership.fencing_token,
            };
            let op = record.write(ticks.key.clone(), stored.as_ref().map(|s| s.version));
            match leading.coord.write(leading.leadership, &[op]).await {
                Ok(crate::coord::Written::Done { .. }) => {}
                Ok(crate::coord::Written::NotLeader) => return Event::Lost,
                Ok(crate::coord::Written::Conflict(_) | crate::coord::Written::Deferred(_)) => {
                    continue
                }
                Err(err) => {
                    tracing::warn!(error = %err, "cannot record the run's tick yet; trying again");
                    tokio::time::sleep(COORD_BACKOFF).await;
                    continue;
                }
            }
            if planned.skipped > 0 {
                tracing::warn!(name = %leading.options.name, skipped = planned.skipped, "ticks that fell while no leader ran, or while the command ran, were skipped");
            }
            // The ticks to run, each recorded already; with catch-up "all", several in turn.
            for target in &planned.enqueue {
                tracing::info!(name = %leading.options.name, tick = %rfc3339_ms(*target), late_ms = (Utc::now() - *target).num_milliseconds(), fencing_token = leading.leadership.fencing_token.0, "running the command for its tick");
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
                    Some(*target),
                )
                .await;
                match event {
                    Event::Exited { exit, .. } => {
                        if !exit.success() {
                            tracing::warn!(name = %leading.options.name, tick = %rfc3339_ms(*target), status = exit.as_code(), "the command failed for its tick; the next tick runs it again");
                        }
                    }
                    other => return other,
                }
            }
            continue;
        }
        let nap = planned.next.map_or(leading.wait, |at| {
            (at - Utc::now()).to_std().unwrap_or_default()
        });
        tokio::select! {
            _ = leading.shutdown.cancelled() => return Event::Shutdown { exit: None },
            _ = watch_leadership(leading.coord, leading.leadership, leading.lease, leading.wait) => return Event::Lost,
            _ = tokio::time::sleep(nap) => {}
        }
    }
}
