//! The leader's work on the task queue: list pending tasks with a blocking query, claim
//! them in `taskTime` order, run their handlers, then complete, retry or dead-letter them;
//! requeue tasks whose replica died; dead-letter what cannot run, a task too large to claim
//! included.
//!
//! Everything goes through the [`Coordinator`] seam: every write is guarded by the
//! leadership it was won with, so a deposed leader can never claim, complete or move a
//! task, and answers `Done`, `NotLeader` (step down) or `Conflict` (a task moved). Every
//! write is planned within the coordinator's limits, in its own costs, and one it still
//! refuses moves the task away instead of costing the leadership. The pure decisions
//! (what to claim, when to look for newer tasks, when to list again) live in `plan.rs`;
//! the I/O for them is cut by what it does: `sort.rs` (what a listing holds), `claim.rs`
//! (claiming a backlog), `groups.rs` (the same with several runs at once, one per
//! `taskGroup`), `run.rs` (running and settling a task, its history record written by the
//! completion), `dead.rs` (dead letters and requeued orphans), `history.rs` (pruning the
//! history now and then), `cancel.rs` (an operator's cancel of a running task). This file
//! holds the leader's loop and the types they share.
//! Leadership itself is `leader`'s business.

mod cancel;
mod claim;
mod dead;
mod groups;
mod history;
mod plan;
mod run;
mod sort;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::coord::{
    CoordError, Coordinator, Leadership, StoredTask, TaskOp, Version, WriteCost, Written,
};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::config::QueueSettings;
use crate::handler::{Registry, TaskContext};
use crate::leader::rotation::Rotation;
use crate::leader::Lease;
use crate::observe::Metrics;
use crate::task::key::Key;
use crate::task::{dead_letter_within, Status, Task};

use plan::{Backlog, ClaimPlan, Looked, Next};

pub use cancel::{cancel_key, CancelMarker};

/// Back-off after coordinator errors while leading, so an outage is not a hot loop.
const ERROR_BACKOFF: Duration = Duration::from_secs(1);
/// A handler run shorter than this lets the next claim take a batch.
const FAST_HANDLER: Duration = Duration::from_millis(5);
/// How many times a completion re-reads a task that a producer keeps rewriting.
const RELEASE_ATTEMPTS: usize = 5;
/// Added to the longest backoff (backoff_max + 20% jitter) before a notBefore is
/// disbelieved: the clocks of replicas differ a little.
const NOT_BEFORE_SLACK: Duration = Duration::from_secs(1);
/// A task whose claim is refused although it is as read and held by no lease (Consul: its
/// key is under another session's lock-delay) is tried again after this long; the tasks
/// after it are claimed meanwhile. (Consul does not say how long the delay lasts: the
/// holder's session set it, 15 s by default, at most 60 s.)
const LOCK_DELAY_RETRY: Duration = Duration::from_secs(1);
/// The dead letter written when the coordinator refuses even the trimmed one (a Consul
/// whose own limits are below leaderq's): about the least that says what happened.
const MINIMAL_DEAD_LETTER: usize = 4096;

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

/// Why the leader stopped leading.
#[derive(Debug, PartialEq, Eq)]
pub enum LeadEnd {
    Shutdown,
    StepDown(String),
    /// Rotate mode: its term is over; everything it claimed is settled or put back, and
    /// its lease is still good.
    Rotate,
}

/// The current term's clock, for rotation: when it began and how many runs it started.
#[derive(Debug, Default)]
pub struct Term {
    /// On tokio's clock, so that rotation is tested on a paused one.
    started: std::sync::Mutex<Option<tokio::time::Instant>>,
    runs: std::sync::atomic::AtomicU64,
}

impl Term {
    fn begin(&self) {
        *self.started.lock().unwrap_or_else(|e| e.into_inner()) = Some(tokio::time::Instant::now());
        self.runs.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    fn led_for(&self) -> Duration {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map_or(Duration::ZERO, |at| at.elapsed())
    }

    fn ran_one(&self) {
        self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn runs(&self) -> u64 {
        self.runs.load(std::sync::atomic::Ordering::Relaxed)
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

/// The outcome of a guarded write whose lost leadership ends the leading.
enum Applied {
    Done,
    Conflict,
    /// Refused by the coordinator (over its limits): nothing was applied, and sending it
    /// again cannot help.
    TooLarge(String),
}

/// What the leader remembers across listings while it leads.
#[derive(Default)]
struct Memory {
    /// Warnings given once per key ("foreign …", "notBefore …").
    warned: HashSet<String>,
    /// Keys whose claims are refused for a while (lock-delay), and when to try them again.
    deferred: HashMap<String, DateTime<Utc>>,
    /// Groups (`taskGroup`) of tasks the last listing found held by another lease: a run
    /// of a previous leader may still be going, so with concurrency groups none of their
    /// tasks starts before a listing shows them free.
    held_groups: HashSet<String>,
    /// Orphans and when this term first saw each: requeued once `orphan_fence` has passed.
    orphans_seen: HashMap<String, tokio::time::Instant>,
}

/// Entries sorted out: what can be claimed now or later, and the keys left as they were.
#[derive(Default)]
struct Sorted {
    pending: Vec<Task>,
    /// Tasks not eligible before a time.
    delayed: Vec<(DateTime<Utc>, Task)>,
    /// Keys of the entries left in place unchanged; those moved or rewritten are not here,
    /// so the next look reads them again.
    keys: plan::Keys,
    in_flight: usize,
    /// When the earliest orphan still fenced may be requeued, if one is.
    fenced_until: Option<tokio::time::Instant>,
    /// Something was moved or rewritten.
    changed: bool,
}

/// The result of a look at the keys.
enum Look {
    Continue,
    Relist,
}

impl Queue {
    /// Leads until shutdown, a lost lease or a lost leader check.
    pub async fn lead(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
    ) -> LeadEnd {
        let mut after = Version::default();
        // When the idle leader wakes by itself: the earliest waiting task falls due.
        let mut wake: Option<DateTime<Utc>> = None;
        let mut memory = Memory::default();
        // Finished tasks whose completion could not be recorded (coordinator unreachable).
        // They are still held by this lease, so until they are recorded the leader neither
        // lists nor claims: a listing would take them for runs cut short and run them again.
        let mut unrecorded: Vec<Finished> = Vec::new();
        self.term.begin();
        // Pruned beside the claims for as long as this term lasts.
        let _history = self.keep_history();
        loop {
            if shutdown.is_cancelled() {
                return LeadEnd::Shutdown;
            }
            // A term ends only with nothing left unrecorded, so the lease holds no claim.
            if unrecorded.is_empty() && self.rotation_due() {
                return LeadEnd::Rotate;
            }

            // "Renew between tasks": no claim unless the lease is known to be fresh.
            if !lease.is_fresh() {
                self.record_own(leadership, std::mem::take(&mut unrecorded))
                    .await;
                return LeadEnd::StepDown(lease.why_not_fresh());
            }
            if !unrecorded.is_empty() {
                unrecorded = self.complete_all(leadership, unrecorded).await;
                if !unrecorded.is_empty() {
                    if self.pause(shutdown, ERROR_BACKOFF).await {
                        return LeadEnd::Shutdown;
                    }
                    continue;
                }
                after = Version::default();
            }
            let asked = after;
            let list_started = Instant::now();
            // The backend paces listings that come back at once (Consul's blocking query).
            // A task falling due changes nothing in the queue: the leader's own timer ends
            // the wait then, to the millisecond, with no request made meanwhile (a wait
            // the coordinator times would be late by its jitter: up to wait/16 on Consul).
            let listed = tokio::select! {
                _ = shutdown.cancelled() => return LeadEnd::Shutdown,
                _ = lease.expired() => return LeadEnd::StepDown(lease.why_not_fresh()),
                _ = self.term_over() => continue,
                _ = until_wall_clock(wake) => {
                    wake = None;
                    after = Version::default();
                    continue;
                }
                listed = self.coord.list(&self.settings.prefix, asked, self.wait) => listed,
            };
            wake = None;
            let (entries, version) = match listed {
                Ok(listed) => listed,
                Err(err) => {
                    self.metrics.coordinator_error(&err);
                    self.metrics.blocking_restarts.inc();
                    tracing::warn!(error = %err, "cannot list the queue; retrying");
                    after = Version::default();
                    if self.pause(shutdown, ERROR_BACKOFF).await {
                        return LeadEnd::Shutdown;
                    }
                    continue;
                }
            };
            if version < asked {
                self.metrics.blocking_restarts.inc();
            }
            after = version;
            // What listing cost, for spacing listings out: a listing that may have waited
            // for a change counts from its answer.
            let listed_from = if asked == Version::default() {
                list_started
            } else {
                Instant::now()
            };
            match self
                .pick(leadership, entries, &mut memory, listed_from)
                .await
            {
                Ok(Pick::Run(backlog)) => {
                    // Looked at after the listing, which may have waited for a new task,
                    // and only when there is something to claim: a pause set meanwhile
                    // still stops the claim.
                    if self.paused().await {
                        if let Some(end) = self.wait_while_paused(leadership, lease, shutdown).await
                        {
                            return end;
                        }
                        after = Version::default();
                        continue;
                    }
                    let (end, left) = if self.settings.concurrency > 1 {
                        self.work_through_groups(leadership, lease, shutdown, *backlog, &mut memory)
                            .await
                    } else {
                        self.work_through(leadership, lease, shutdown, *backlog, &mut memory)
                            .await
                    };
                    unrecorded = left;
                    match end {
                        // Recorded first, at the top of the loop.
                        Some(LeadEnd::Rotate) => continue,
                        Some(end) => {
                            // A clean end is an end: what finished is recorded under the
                            // lease's own claims if the leadership could not record it.
                            self.record_own(leadership, std::mem::take(&mut unrecorded))
                                .await;
                            return end;
                        }
                        None => {}
                    }
                    // The leader's own writes moved the queue: list again without waiting.
                    after = Version::default();
                }
                Ok(Pick::WaitUntil(at)) => {
                    self.count_dead().await;
                    // Nothing runnable before `at`: wait for a change, but not past `at`.
                    wake = Some(at);
                }
                Ok(Pick::Nothing) => self.count_dead().await,
                Ok(Pick::Again) => after = Version::default(),
                Err(end) => return end,
            }
        }
    }

    /// Whether the queue's pause flag is set. A flag that cannot be read is taken as not
    /// set: the listing that follows meets the same coordinator and backs off itself.
    async fn paused(&self) -> bool {
        let key = [pause_key(&self.settings.prefix)];
        self.coord
            .get(&key)
            .await
            .is_ok_and(|found| !found.is_empty())
    }

    /// Waits, reading only the pause flag, until it is cleared (`None`: list again), the
    /// term ends by time (`None`: the loop rotates), or the leading must end.
    async fn wait_while_paused(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
    ) -> Option<LeadEnd> {
        tracing::info!(
            fencing_token = leadership.fencing_token,
            "queue paused: claiming nothing until `leaderq resume`"
        );
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Some(LeadEnd::Shutdown),
                _ = lease.expired() => return Some(LeadEnd::StepDown(lease.why_not_fresh())),
                _ = self.term_over() => return None,
                _ = tokio::time::sleep(PAUSE_POLL) => {}
            }
            if !self.paused().await {
                tracing::info!(fencing_token = leadership.fencing_token, "queue resumed");
                return None;
            }
        }
    }

    /// Whether rotate mode ends this term now.
    fn rotation_due(&self) -> bool {
        self.rotation
            .is_some_and(|rotation| rotation.due(self.term.led_for(), self.term.runs()))
    }

    /// Resolves when time alone ends this term (never in latch mode, or with no time
    /// limit), so an idle leader does not wait out a whole listing first.
    async fn term_over(&self) {
        match self
            .rotation
            .and_then(|rotation| rotation.time_left(self.term.led_for()))
        {
            Some(left) => tokio::time::sleep(left).await,
            None => std::future::pending().await,
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
            Ok(Written::Conflict(keys)) => {
                tracing::debug!(?keys, "{what}: the task changed meanwhile; will look again");
                Ok(Applied::Conflict)
            }
            Err(CoordError::Refused(why)) => Ok(Applied::TooLarge(why)),
            Err(err) => Err(LeadEnd::StepDown(format!("cannot {what}: {err}"))),
        }
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

/// Resolves at `at` on the wall clock (never, for `None`), timed on tokio's clock.
async fn until_wall_clock(at: Option<DateTime<Utc>>) {
    match at {
        Some(at) => tokio::time::sleep((at - Utc::now()).to_std().unwrap_or_default()).await,
        None => std::future::pending().await,
    }
}

enum Pick {
    /// Pending tasks to work through.
    Run(Box<Backlog>),
    WaitUntil(DateTime<Utc>),
    /// Something was moved; list again at once.
    Again,
    Nothing,
}

/// A task whose handler succeeded and whose deletion is still to be written.
struct Finished {
    task: Box<Task>,
    claim_index: u64,
    elapsed_ms: u64,
    /// Where its history record goes and the record (`None`: history is off).
    history: Option<(String, Vec<u8>)>,
    /// What its completion costs in a write (asked for at every claim it may ride along).
    cost: WriteCost,
}

impl Finished {
    fn new(
        coord: &dyn Coordinator,
        task: Box<Task>,
        claim_index: u64,
        elapsed_ms: u64,
        history: Option<(String, Vec<u8>)>,
    ) -> Finished {
        let mut finished = Finished {
            task,
            claim_index,
            elapsed_ms,
            history,
            cost: WriteCost { ops: 0, bytes: 0 },
        };
        finished.cost = coord.cost(&finished.completion());
        finished
    }

    /// Completes the version this run claimed, and only that one: deletes it, or, with
    /// history on, moves it to its history record in the same write (no extra round trip).
    fn completion(&self) -> TaskOp {
        match &self.history {
            Some((to, value)) => TaskOp::Move {
                key: self.task.key.clone(),
                version: self.claim_index,
                to: to.clone(),
                value: value.clone(),
            },
            None => TaskOp::Complete {
                key: self.task.key.clone(),
                version: self.claim_index,
            },
        }
    }
}

/// The next claim, planned.
enum Planned {
    /// Claim `tasks` with their `candidates`; the first `deletions` finished tasks ride along.
    Batch {
        tasks: Vec<Task>,
        candidates: Vec<Candidate>,
        deletions: usize,
    },
    /// The first pending task, taken out of the backlog, cannot be claimed even alone: its
    /// claim would cost `cost`.
    TooLarge { task: Box<Task>, cost: WriteCost },
}

/// A task's claim, prepared: the value it writes and its op.
struct Candidate {
    value: Vec<u8>,
    op: TaskOp,
}

impl Candidate {
    fn new(task: &Task, leadership: &Leadership, node_id: &str, now: DateTime<Utc>) -> Candidate {
        let value = task.claimed(&leadership.lease.0, node_id, now);
        let op = TaskOp::Claim {
            key: task.key.clone(),
            version: task.version,
            value: value.clone(),
        };
        Candidate { value, op }
    }
}

/// A task as stored again, with `value` and at `version`, to move it to dead-letter.
fn pair_of(task: &Task, value: Vec<u8>, version: u64) -> StoredTask {
    StoredTask {
        key: task.key.clone(),
        value,
        version,
        created: task.created,
        holder: None,
    }
}

/// A claimed task and the value its claim wrote (what the handler gets).
struct Claimed {
    task: Box<Task>,
    value: Vec<u8>,
}

/// The result of one claim write.
enum Claim {
    /// Claimed, in order, each with its claim's version.
    Claimed(Vec<(Claimed, u64)>),
    /// The listing is stale (a claim conflict or an error): list again.
    Relist,
    /// These tasks of the batch (keys) moved since they were read (a producer rewrote one,
    /// a retry was written back): nothing was applied; what they hold now (those that are
    /// still there), read once, takes their place.
    Moved(Vec<Task>, Vec<String>, Vec<StoredTask>),
    /// The coordinator refused the write as too large; nothing was applied.
    TooLarge(Vec<Task>, String),
    /// Only the claims of these tasks (indexes into the batch) failed, refused for a while
    /// (Consul: another session's lock-delay); nothing was applied.
    LockDelayed(Vec<Task>, Vec<usize>),
    End(LeadEnd),
}

/// How one handler run went: how long it took, and whether leadership ends.
struct RunOutcome {
    elapsed: Duration,
    end: Option<LeadEnd>,
}
