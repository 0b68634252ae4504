//! The leader's work on the task queue: list pending tasks with a blocking query, claim
//! them in `taskTime` order, run their handlers, then complete, retry or dead-letter them;
//! requeue tasks whose replica died; dead-letter what cannot run, a task too large to claim
//! included.
//!
//! Everything goes through the [`Coordinator`] seam: every write is guarded by the
//! leadership it was won with, so a deposed leader can never claim, complete or move a
//! task, and answers `Done`, `NotLeader` (step down) or `Conflict` (a task moved). Every
//! write is planned within the coordinator's limits, in its own costs, and one it still
//! refuses moves the task away instead of costing the leadership.
//!
//! Read top-down: [`Queue::lead`] (this file) lists, sorts the listing out (`sort.rs`) and
//! hands the backlog to the driver (`driver.rs`: `drive`), which performs what the term
//! core (`term.rs`) decides: claims (`flights.rs`, through `claim.rs`), runs, settles. The
//! decisions
//! that matter are pure functions beside them, fed `now` from the one `Clock` (`clock.rs`):
//! `entry.rs` (what a listed entry is), `backlog.rs` (what the leader knows and does next
//! between claims), `plan.rs` (what one write takes), `answer.rs` (what a claim's answer
//! means for each task), `settlement.rs` (what becomes of a task after its run). The rest
//! is I/O cut by what it does: `run.rs` (running and settling a task, its history record
//! written by the completion), `dead.rs` (dead letters and requeued orphans), `history.rs`
//! (pruning the history now and then), `cancel.rs` (an operator's cancel of a running
//! task). Leadership itself is `leader`'s business.

mod answer;
mod backlog;
mod batches;
mod cancel;
mod claim;
mod clock;
mod dead;
mod driver;
mod entry;
mod finished;
mod flights;
mod history;
mod output;
mod pauses;
mod pending;
mod plan;
mod progress;
pub mod rates;
mod run;
#[cfg(test)]
mod scripted;
mod settlement;
mod slots;
mod sort;
mod term;
#[cfg(test)]
mod tests;
mod work;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::QueueSettings;
use crate::coord::{CoordError, Coordinator, Leadership, TaskOp, Version, Written};
use crate::handler::Registry;
use crate::leader::rotation::Rotation;
use crate::leader::Lease;
use crate::observe::Metrics;

use clock::Clock;
use finished::Finished;
use sort::{Memory, Pick};
use work::Leading;

pub use cancel::{cancel_key, CancelMarker};
pub use output::{attempt_of, forget_prefixes, output_key, output_prefix, queue_output_prefix};
pub use rates::{rate_key, Rate};

/// Back-off after coordinator errors while leading, so an outage is not a hot loop.
const ERROR_BACKOFF: Duration = Duration::from_secs(1);

/// While paused, the leader looks at the pause flag this often.
const PAUSE_POLL: Duration = Duration::from_secs(1);

/// The key of a queue's pause flag (`leaderq pause`): outside the queue and dead-letter
/// prefixes, so that no listing of tasks ever sees it, and named after the queue so that
/// queues sharing a coordinator pause one at a time.
pub fn pause_key(queue_prefix: &str) -> String {
    format!(
        "{}paused/{}",
        crate::config::OWN_NAMESPACE,
        queue_prefix.trim_end_matches('/')
    )
}

/// Where a queue's paused task types are kept (`leaderq pause --type T`): one key per type
/// under this prefix, outside the queue and named after it, as its pause flag is.
pub fn paused_types_prefix(queue_prefix: &str) -> String {
    format!(
        "{}paused-types/{}/",
        crate::config::OWN_NAMESPACE,
        queue_prefix.trim_end_matches('/')
    )
}

/// The task types paused on their own, from the keys a read under `paused_types_prefix`
/// (`prefix`) found, in the order given: a name with a `/` is another queue's (one whose
/// prefix continues this one's), not a type of this one.
pub fn paused_type_names<'a>(
    prefix: &'a str,
    keys: impl Iterator<Item = String> + 'a,
) -> impl Iterator<Item = String> + 'a {
    keys.filter_map(move |key| key.strip_prefix(prefix).map(str::to_string))
        .filter(|name| !name.is_empty() && !name.contains('/'))
}

/// The key of `task_type`'s pause flag in the queue under `queue_prefix`. A type that is not
/// one key segment (a `/`, or a character keys cannot hold) cannot be paused alone.
pub fn paused_type_key(
    queue_prefix: &str,
    task_type: &str,
) -> Result<String, crate::task::key::Invalid> {
    crate::task::key::check_id(task_type)?;
    Ok(format!("{}{task_type}", paused_types_prefix(queue_prefix)))
}

/// Where the leading stands between listings: the version the next listing waits for a
/// change after, when an idle leader wakes by itself (the earliest waiting task falls
/// due), what it remembers across listings, and finished tasks whose completion could not
/// be recorded (coordinator unreachable).
struct Between {
    after: Version,
    wake: Option<chrono::DateTime<chrono::Utc>>,
    memory: Memory,
    unrecorded: Vec<Finished>,
}

/// Why the leader stopped leading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeadEnd {
    Shutdown,
    StepDown(String),
    /// Rotate mode: its term is over; everything it claimed is settled or put back, and
    /// its lease is still good.
    Rotate,
}

/// The current term's clock, for rotation: when it began and how many runs it started;
/// and the queue's one `Clock` (`clock.rs`), anchored when first read.
#[derive(Debug, Default)]
pub struct Term {
    /// On tokio's clock, so that rotation is tested on a paused one.
    started: std::sync::Mutex<Option<tokio::time::Instant>>,
    runs: std::sync::atomic::AtomicU64,
    clock: std::sync::OnceLock<Clock>,
}

impl Term {
    fn begin(&self) {
        let now = self.clock().instant();
        *self.started.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
        self.runs.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    fn led_for(&self) -> Duration {
        let clock = self.clock();
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map_or(Duration::ZERO, |at| clock.since(at))
    }

    fn ran_one(&self) {
        self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn runs(&self) -> u64 {
        self.runs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The queue's clock: one anchor for the life of the queue, taken at its first read.
    fn clock(&self) -> Clock {
        *self.clock.get_or_init(Clock::start)
    }
}

/// What the leader needs: the coordinator, the queue settings, the handlers, who it is.
pub struct Queue {
    pub coord: Arc<dyn Coordinator>,
    pub settings: QueueSettings,
    pub registry: Registry,
    pub node_id: String,
    pub wait: Duration,
    pub metrics: Arc<Metrics>,
    /// Rotate mode's limits; `None` in latch mode.
    pub rotation: Option<Rotation>,
    /// The current term's clock (start with `Term::default()`).
    pub term: Term,
    /// What the lease allows: when a claim may start, when an orphan may be requeued.
    pub lease_rules: LeaseRules,
    /// The shard this queue leads, if the queue is split (`Sharding::default()`: all of it).
    pub sharding: Sharding,
}

/// The part of a split queue one leadership leads (`election.shards`), and how the replica
/// asks it to hand that shard over to another.
#[derive(Clone, Debug, Default)]
pub struct Sharding {
    /// The shard whose tasks this queue claims; `None`: every task.
    pub shard: Option<crate::task::shard::Shard>,
    /// Becomes `true` when the replica leads more shards than its share: the term ends as
    /// a rotation does (runs finished, claims put back), and another replica takes it.
    pub handover: Option<tokio::sync::watch::Receiver<bool>>,
    /// This shard's share of the replica's `queue.concurrency`, as the replica spreads it
    /// over the shards it leads (read at each listing); `None`: all of it.
    pub slots: Option<Arc<std::sync::atomic::AtomicUsize>>,
}

impl Sharding {
    /// Whether the term is asked to hand its shard over now.
    fn handing_over(&self) -> bool {
        self.handover.as_ref().is_some_and(|asked| *asked.borrow())
    }

    /// Resolves once the term is asked to hand its shard over (never, unsplit).
    async fn handover_asked(&self) {
        match self.handover.clone() {
            Some(mut asked) => {
                if asked.wait_for(|asked| *asked).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }

    /// How many runs at once this queue's term has, of the replica's `concurrency`.
    fn slots(&self, concurrency: usize) -> usize {
        self.slots.as_ref().map_or(concurrency, |slots| {
            slots
                .load(std::sync::atomic::Ordering::Relaxed)
                .clamp(1, concurrency.max(1))
        })
    }

    /// Whether this queue does what is done once for the whole queue (history pruning):
    /// unsplit, or shard 0.
    pub fn leads_the_common_work(&self) -> bool {
        self.shard.is_none_or(|shard| shard.index == 0)
    }
}

/// The leader's rules against runs it cannot see: a run of an earlier holder that may
/// still go on, and a run of its own that the lease's kill window would cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRules {
    /// How long after this leader first sees an orphan (a task whose claiming lease
    /// ended) it is requeued, and (with one run at a time) how long nothing starts
    /// meanwhile. The earlier holder's runs are killed by their supervisors before its own
    /// view of its lease runs out, at most one TTL after the lease ended, however it ended:
    /// expired, or revoked by an operator while its runs went on.
    pub orphan_fence: Duration,
    /// A claim is made only while the lease outlasts this (the kill grace plus the
    /// supervisor's margin): a run started then can still be stopped whole, by request,
    /// before the supervisor's kill window would cut it.
    pub claim_headroom: Duration,
}

impl LeaseRules {
    pub fn from_settings(settings: &crate::config::Settings) -> LeaseRules {
        let ttl = settings.election.lease_ttl;
        LeaseRules {
            orphan_fence: ttl,
            claim_headroom: settings.queue.kill_grace + crate::supervise::lease_margin(ttl),
        }
    }
}

impl Queue {
    /// Leads until shutdown, a lost lease or a lost leader check.
    pub async fn lead(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
    ) -> LeadEnd {
        let lead = Leading {
            leadership,
            lease,
            shutdown,
        };
        let mut between = Between {
            after: Version::default(),
            wake: None,
            memory: Memory::default(),
            unrecorded: Vec::new(),
        };
        self.term.begin();
        // Pruned beside the claims for as long as this term lasts, by one shard's leader.
        let _history = self
            .sharding
            .leads_the_common_work()
            .then(|| self.keep_history());
        loop {
            match self.turn(lead, &mut between).await {
                Ok(()) | Err(None) => continue,
                Err(Some(end)) => return end,
            }
        }
    }

    /// One turn of the leading: what is left unrecorded first, then a listing (or a wait
    /// for the queue to change, or for its earliest task to fall due), sorted out and
    /// worked through. `Err(None)`: start the next turn at once; `Err(Some)`: the leading
    /// ends.
    async fn turn(&self, lead: Leading<'_>, between: &mut Between) -> Result<(), Option<LeadEnd>> {
        self.before_listing(lead, between).await?;
        // The listing is sorted out as it arrives, by the paused types as read now; if
        // they changed meanwhile, it is sorted out again from a listing made at once.
        self.refresh_paused_types(&mut between.memory).await;
        let Between {
            after,
            wake,
            memory,
            ..
        } = &mut *between;
        let paused = (memory.set_aside > 0).then(|| memory.paused_types.clone());
        // What another lease holds is what this listing finds held.
        memory.held_groups.clear();
        memory.held_kinds.clear();
        let mut intake = self.intake(lead.leadership, memory, None);
        let listed_from = self
            .list(lead, after, wake, paused.as_ref(), &mut intake)
            .await?;
        let sorted = intake.finish().await.map_err(Some)?;
        if self.refresh_paused_types(&mut between.memory).await {
            between.after = Version::default();
            return Err(None);
        }
        let pick = self.pick(sorted, &mut between.memory, listed_from);
        match pick.await.map_err(Some)? {
            Pick::Run(backlog) => self.work_through(lead, between, *backlog).await,
            Pick::WaitUntil(at) => {
                self.count_dead().await;
                // Nothing runnable before `at`: wait for a change, but not past `at`.
                between.wake = Some(at);
                Ok(())
            }
            Pick::Nothing => {
                self.count_dead().await;
                Ok(())
            }
            Pick::Again => {
                between.after = Version::default();
                Ok(())
            }
        }
    }

    /// Before a listing: the leading ends on shutdown, when the term is over (with nothing
    /// left unrecorded, so the lease holds no claim), or when the lease is not known to be
    /// fresh ("renew between tasks"); completions left unrecorded are written first, and
    /// while they cannot be, nothing is listed or claimed: a listing would take them for
    /// runs cut short and run them again.
    async fn before_listing(
        &self,
        lead: Leading<'_>,
        between: &mut Between,
    ) -> Result<(), Option<LeadEnd>> {
        if lead.shutdown.is_cancelled() {
            return Err(Some(LeadEnd::Shutdown));
        }
        if between.unrecorded.is_empty() && self.rotation_due() {
            return Err(Some(LeadEnd::Rotate));
        }
        let unrecorded = std::mem::take(&mut between.unrecorded);
        if !lead.lease.is_fresh() {
            self.record_own(lead.leadership, unrecorded).await;
            return Err(Some(LeadEnd::StepDown(lead.lease.why_not_fresh())));
        }
        if unrecorded.is_empty() {
            return Ok(());
        }
        between.unrecorded = self.complete_all(lead.leadership, unrecorded).await;
        if !between.unrecorded.is_empty() {
            if self.pause(lead.shutdown, ERROR_BACKOFF).await {
                return Err(Some(LeadEnd::Shutdown));
            }
            return Err(None);
        }
        between.after = Version::default();
        Ok(())
    }

    /// Lists the queue, waiting for a change after the last listing's version. The backend
    /// paces listings that come back at once (Consul's blocking query). A task falling due
    /// changes nothing in the queue: the leader's own timer ends the wait then, to the
    /// millisecond, with no request made meanwhile (a wait the coordinator times would be
    /// late by its jitter: up to wait/16 on Consul). Answers the entries and when the
    /// listing began costing time.
    async fn list(
        &self,
        lead: Leading<'_>,
        after: &mut Version,
        wake: &mut Option<chrono::DateTime<chrono::Utc>>,
        paused: Option<&HashSet<String>>,
        intake: &mut sort::Intake<'_>,
    ) -> Result<tokio::time::Instant, Option<LeadEnd>> {
        let asked = *after;
        let clock = self.clock();
        let list_started = clock.instant();
        let prefix = &self.settings.prefix;
        let mut each = |entry| intake.take(entry);
        let listed = tokio::select! {
            _ = lead.shutdown.cancelled() => return Err(Some(LeadEnd::Shutdown)),
            _ = lead.lease.expired() => {
                return Err(Some(LeadEnd::StepDown(lead.lease.why_not_fresh())))
            }
            _ = self.term_over() => return Err(None),
            _ = self.until_types_change(paused), if paused.is_some() => {
                *after = Version::default();
                return Err(None);
            }
            _ = clock.until(*wake) => {
                *wake = None;
                *after = Version::default();
                return Err(None);
            }
            listed = self.coord.list_each(prefix, asked, self.wait, &mut each) => listed,
        };
        *wake = None;
        let version = match listed {
            Ok(version) => version,
            Err(err) => {
                self.metrics.coordinator_error(&err);
                self.metrics.blocking_restarts.inc();
                tracing::warn!(error = %err, "cannot list the queue; retrying");
                *after = Version::default();
                if self.pause(lead.shutdown, ERROR_BACKOFF).await {
                    return Err(Some(LeadEnd::Shutdown));
                }
                return Err(None);
            }
        };
        if version < asked {
            self.metrics.blocking_restarts.inc();
        }
        *after = version;
        // What listing cost, for spacing listings out: a listing that may have waited for
        // a change counts from its answer.
        let listed_from = if asked == Version::default() {
            list_started
        } else {
            clock.instant()
        };
        Ok(listed_from)
    }

    /// Works through a listing's pending tasks, unless the queue is paused (looked at
    /// after the listing, which may have waited for a new task, and only when there is
    /// something to claim: a pause set meanwhile still stops the claim). Claims, runs and
    /// settles until this listing is worked through (`driver.rs`, as `term.rs` decides).
    async fn work_through(
        &self,
        lead: Leading<'_>,
        between: &mut Between,
        backlog: backlog::Backlog,
    ) -> Result<(), Option<LeadEnd>> {
        if self.paused().await {
            let (leadership, lease, shutdown) = (lead.leadership, lead.lease, lead.shutdown);
            if let Some(end) = self.wait_while_paused(leadership, lease, shutdown).await {
                return Err(Some(end));
            }
            between.after = Version::default();
            return Err(None);
        }
        let (end, left) = self.drive(lead, backlog, &mut between.memory).await;
        between.unrecorded = left;
        match end {
            // Recorded first, at the top of the next turn.
            Some(LeadEnd::Rotate) => return Err(None),
            Some(end) => {
                // A clean end is an end: what finished is recorded under the lease's own
                // claims if the leadership could not record it.
                let unrecorded = std::mem::take(&mut between.unrecorded);
                self.record_own(lead.leadership, unrecorded).await;
                return Err(Some(end));
            }
            None => {}
        }
        // The leader's own writes moved the queue: list again without waiting.
        between.after = Version::default();
        Ok(())
    }

    /// Whether rotate mode ends this term now.
    fn rotation_due(&self) -> bool {
        self.sharding.handing_over()
            || self
                .rotation
                .is_some_and(|rotation| rotation.due(self.term.led_for(), self.term.runs()))
    }

    /// Resolves when time alone ends this term (never in latch mode, or with no time
    /// limit), so an idle leader does not wait out a whole listing first.
    async fn term_over(&self) {
        let by_time = async {
            match self
                .rotation
                .and_then(|rotation| rotation.time_left(self.term.led_for()))
            {
                Some(left) => tokio::time::sleep(left).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = by_time => {}
            () = self.sharding.handover_asked() => {}
        }
    }

    /// Refreshes the dead-letter depth; done when idle, off the dispatch path.
    async fn count_dead(&self) {
        match self.coord.keys(&self.settings.dead_prefix).await {
            Ok((dead, _)) => self.metrics.dead_depth(dead.len()),
            Err(err) => self.metrics.coordinator_error(&err),
        }
    }

    async fn pause(&self, shutdown: &CancellationToken, period: Duration) -> bool {
        tokio::select! {
            _ = shutdown.cancelled() => true,
            _ = tokio::time::sleep(period) => false,
        }
    }

    /// Writes `ops` guarded by `leadership`; an error is counted, and left to the caller.
    async fn write(&self, leadership: &Leadership, ops: &[TaskOp]) -> Result<Written, CoordError> {
        let written = self.coord.write(leadership, ops).await;
        if let Err(err) = &written {
            self.metrics.coordinator_error(err);
        }
        written
    }

    /// A guarded write whose conflicts are not this replica's problem; lost leadership or
    /// an unavailable coordinator ends the leadership. Refused is the caller's to handle.
    async fn write_or_step_down(
        &self,
        leadership: &Leadership,
        ops: &[TaskOp],
        what: &str,
    ) -> Result<Applied, LeadEnd> {
        match self.write(leadership, ops).await {
            Ok(Written::Done { .. }) => Ok(Applied::Done),
            Ok(Written::NotLeader) => Err(LeadEnd::StepDown(format!(
                "lost leadership while trying to {what}"
            ))),
            Ok(Written::Conflict(keys) | Written::Deferred(keys)) => {
                tracing::debug!(?keys, "{what}: the task changed meanwhile; will look again");
                Ok(Applied::Conflict)
            }
            Err(CoordError::Refused(why)) => Ok(Applied::TooLarge(why)),
            Err(err) => Err(LeadEnd::StepDown(format!("cannot {what}: {err}"))),
        }
    }

    /// The queue's one clock (see `clock.rs`).
    fn clock(&self) -> Clock {
        self.term.clock()
    }

    fn must_stop(&self, lease: &Lease, shutdown: &CancellationToken) -> Option<LeadEnd> {
        if shutdown.is_cancelled() {
            return Some(LeadEnd::Shutdown);
        }
        if !lease.is_fresh() {
            return Some(LeadEnd::StepDown(lease.why_not_fresh()));
        }
        if self.rotation_due() {
            return Some(LeadEnd::Rotate);
        }
        None
    }
}

/// The outcome of a guarded write whose lost leadership ends the leading.
enum Applied {
    Done,
    Conflict,
    /// Refused by the coordinator (over its limits): nothing was applied, and sending it
    /// again cannot help.
    TooLarge(String),
}
