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
//! this file performs their I/O. Leadership itself is `leader`'s business.
//!
//! Size: the leader's loop with the I/O for each decision plan.rs makes; splitting claims,
//! completions and dead letters into files of their own is still to do.

mod plan;
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
}

/// Entries sorted out: what can be claimed now or later, and the keys left as they were.
#[derive(Default)]
struct Sorted {
    pending: Vec<Task>,
    /// Tasks not eligible before a time.
    delayed: Vec<(DateTime<Utc>, Task)>,
    /// Keys of the entries left in place unchanged; those moved or rewritten are not here,
    /// so the next look reads them again.
    keys: HashSet<String>,
    in_flight: usize,
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
        let mut memory = Memory::default();
        // Finished tasks whose completion could not be recorded (coordinator unreachable).
        // They are still held by this lease, so until they are recorded the leader neither
        // lists nor claims: a listing would take them for runs cut short and run them again.
        let mut unrecorded: Vec<Finished> = Vec::new();
        self.term.begin();
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
                return LeadEnd::StepDown("lease not renewed within its TTL".into());
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
            let listed = tokio::select! {
                _ = shutdown.cancelled() => return LeadEnd::Shutdown,
                _ = lease.expired() => return LeadEnd::StepDown("lease not renewed within its TTL".into()),
                _ = self.term_over() => continue,
                listed = self.coord.list(&self.settings.prefix, asked, self.wait) => listed,
            };
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
                    let (end, left) = self
                        .work_through(leadership, lease, shutdown, backlog, &mut memory)
                        .await;
                    unrecorded = left;
                    match end {
                        // Recorded first, at the top of the loop.
                        Some(LeadEnd::Rotate) => continue,
                        Some(end) => return end,
                        None => {}
                    }
                    // The leader's own writes moved the queue: list again without waiting.
                    after = Version::default();
                }
                Ok(Pick::WaitUntil(at)) => {
                    self.count_dead().await;
                    // Nothing runnable before `at`: wait for a change, but not past `at`.
                    let until = (at - Utc::now()).to_std().unwrap_or_default();
                    if until < self.wait {
                        let wait = until.max(Duration::from_millis(1));
                        tokio::select! {
                            _ = shutdown.cancelled() => return LeadEnd::Shutdown,
                            _ = lease.expired() => return LeadEnd::StepDown("lease not renewed within its TTL".into()),
                            _ = self.term_over() => {}
                            _ = self.coord.list(&self.settings.prefix, after, wait) => {}
                        }
                        after = Version::default();
                    }
                }
                Ok(Pick::Nothing) => self.count_dead().await,
                Ok(Pick::Again) => after = Version::default(),
                Err(end) => return end,
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

    /// Sorts a listing out and says what to do with it: work through its pending tasks,
    /// wait for the earliest retry, or list again. `listed_from` is when the listing began
    /// costing time.
    async fn pick(
        &self,
        leadership: &Leadership,
        entries: Vec<StoredTask>,
        memory: &mut Memory,
        listed_from: Instant,
    ) -> Result<Pick, LeadEnd> {
        let now = Utc::now();
        let sorted = self.sort_out(leadership, entries, memory, now).await?;
        self.metrics
            .queue_depth(sorted.pending.len(), sorted.in_flight, sorted.delayed.len());
        if !sorted.pending.is_empty() {
            let backlog = Backlog::new(
                sorted.pending,
                sorted.delayed,
                sorted.keys,
                Utc::now(),
                listed_from.elapsed(),
            );
            return Ok(Pick::Run(backlog));
        }
        if sorted.changed {
            return Ok(Pick::Again);
        }
        let earliest = sorted.delayed.iter().map(|(at, _)| *at).min();
        Ok(earliest.map_or(Pick::Nothing, Pick::WaitUntil))
    }

    /// Sorts entries of the queue out: dead-letters what cannot run, requeues orphans, and
    /// returns the pending and delayed tasks (a listing's, or new keys' a look read).
    async fn sort_out(
        &self,
        leadership: &Leadership,
        entries: Vec<StoredTask>,
        memory: &mut Memory,
        now: DateTime<Utc>,
    ) -> Result<Sorted, LeadEnd> {
        let horizon = self.not_before_horizon();
        memory.deferred.retain(|_, until| *until > now);
        let mut sorted = Sorted::default();
        for pair in entries {
            // A key that breaks the key rule could not be addressed safely (a `..` segment
            // resolves elsewhere in a URL): such a task is not run but dead-lettered.
            if let Err(invalid) = Key::within(&pair.key, &[&self.settings.prefix]) {
                if pair.holder.is_none() {
                    let reason = format!("the key is not a valid task key: {invalid}");
                    self.dead_letter(leadership, &pair, &reason).await?;
                    sorted.changed = true;
                }
                continue;
            }
            let task = match Task::parse(&pair) {
                Ok(task) => task,
                Err(invalid) => {
                    // A locked entry is someone's run in progress: left alone until it ends.
                    if pair.holder.is_none() {
                        sorted.changed = true;
                        if self
                            .dead_letter(leadership, &pair, &invalid.to_string())
                            .await?
                        {
                            continue;
                        }
                    }
                    sorted.keys.insert(pair.key);
                    continue;
                }
            };
            let deferred = memory.deferred.get(&task.key).copied();
            match plan::eligibility(&task, now, horizon, deferred) {
                Status::Pending if self.registry.get(&task.task_type).is_none() => {
                    let reason = format!("no handler for taskType {:?}", task.task_type);
                    self.dead_letter(leadership, &pair, &reason).await?;
                    sorted.changed = true;
                }
                Status::Pending => {
                    if let Status::Delayed(at) = task.status(now) {
                        if memory.warned.insert(format!("notBefore {}", task.key)) {
                            tracing::warn!(task_key = %task.key, not_before = %crate::task::rfc3339(at), "notBefore is further ahead than any backoff leaderq writes (a clock that jumped, or a crafted value); ignoring it");
                        }
                    }
                    sorted.keys.insert(task.key.clone());
                    sorted.pending.push(task);
                }
                Status::Delayed(at) => {
                    sorted.keys.insert(task.key.clone());
                    sorted.delayed.push((at, task));
                }
                Status::InFlight if task.holder.as_ref() == Some(&leadership.lease) => {
                    // Held by this very lease, yet nothing runs here: a run cut short by a
                    // restart that took the lease up again. Put it back as a failed attempt.
                    self.requeue(
                        leadership,
                        &task,
                        "the replica restarted while running the task",
                    )
                    .await?;
                    sorted.changed = true;
                }
                Status::InFlight => {
                    sorted.in_flight += 1;
                    sorted.keys.insert(task.key.clone());
                }
                Status::Orphan => {
                    self.requeue(leadership, &task, "the replica running the task died")
                        .await?;
                    sorted.changed = true;
                }
                Status::Foreign => {
                    if memory.warned.insert(format!("foreign {}", task.key)) {
                        tracing::warn!(task_key = %task.key, "task is marked taken by a program other than leaderq; leaving it alone");
                    }
                    sorted.keys.insert(task.key.clone());
                }
            }
        }
        sorted
            .pending
            .sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        Ok(sorted)
    }

    /// How far ahead a notBefore is believed: the longest backoff leaderq writes
    /// (backoff_max plus 20% jitter) plus NOT_BEFORE_SLACK.
    fn not_before_horizon(&self) -> chrono::Duration {
        let max = self.settings.backoff_max;
        let longest = max.saturating_add(max / 5).saturating_add(NOT_BEFORE_SLACK);
        chrono::Duration::from_std(longest).unwrap_or(chrono::Duration::MAX)
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

    fn dead_key(&self, key: &str) -> String {
        crate::task::key::dead_letter_key(&self.settings.prefix, &self.settings.dead_prefix, key)
            .into()
    }

    /// Moves an entry to the dead-letter prefix with `reason`, in one guarded write that
    /// deletes it only if unchanged. A dead letter the coordinator would not admit is
    /// trimmed until it does (its largest fields dropped, the reason and original key
    /// kept). Returns whether the entry moved.
    async fn dead_letter(
        &self,
        leadership: &Leadership,
        pair: &StoredTask,
        reason: &str,
    ) -> Result<bool, LeadEnd> {
        let dead_key = self.dead_key(&pair.key);
        let ops = |value: Vec<u8>| {
            [TaskOp::Move {
                key: pair.key.clone(),
                version: pair.version,
                to: dead_key.clone(),
                value,
            }]
        };
        let (value, mut trimmed) = self.dead_letter_admitted(pair, reason, &ops);
        let mut written = self
            .write_or_step_down(leadership, &ops(value), "dead-letter a task")
            .await?;
        if let Applied::TooLarge(why) = &written {
            tracing::warn!(task_key = %pair.key, error = %why, "the coordinator refused the dead letter as too large; writing a minimal one");
            let (value, _) = dead_letter_within(pair, reason, Utc::now(), MINIMAL_DEAD_LETTER);
            trimmed = true;
            written = self
                .write_or_step_down(leadership, &ops(value), "dead-letter a task")
                .await?;
        }
        match written {
            Applied::Done => {}
            Applied::Conflict => return Ok(false),
            Applied::TooLarge(why) => {
                tracing::error!(task_key = %pair.key, error = %why, "cannot dead-letter a task: the coordinator refuses even a minimal record as too large; raise its limit (Consul: txn_max_req_len)");
                return Ok(false);
            }
        }
        let task_type = serde_json::from_slice::<serde_json::Value>(&pair.value)
            .ok()
            .and_then(|v| {
                v.get("taskType")
                    .and_then(|t| t.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        self.metrics.dead_lettered(&task_type);
        tracing::warn!(
            task_key = %pair.key,
            dead_key = %dead_key,
            reason,
            trimmed,
            fencing_token = leadership.fencing_token,
            "task moved to the dead-letter prefix"
        );
        Ok(true)
    }

    /// The dead letter for `pair`, shrunk until the coordinator admits its move (`ops`
    /// builds the write from a record), and whether it was trimmed.
    fn dead_letter_admitted(
        &self,
        pair: &StoredTask,
        reason: &str,
        ops: &dyn Fn(Vec<u8>) -> [TaskOp; 1],
    ) -> (Vec<u8>, bool) {
        let now = Utc::now();
        let limits = self.coord.limits();
        let mut room = limits.max_bytes;
        loop {
            let (value, trimmed) = dead_letter_within(pair, reason, now, room);
            let len = value.len();
            let cost = crate::coord::batch_cost(self.coord.as_ref(), &ops(value.clone()), true);
            if limits.admits(cost) || len == 0 || room == 0 {
                return (value, trimmed);
            }
            // Over by this much in the coordinator's units: shrink at least as much.
            let over = cost.bytes.saturating_sub(limits.max_bytes).max(1);
            room = len.saturating_sub(over).min(room - 1);
        }
    }

    /// Puts a task whose run was cut short back in the queue as a failed attempt (or
    /// dead-letters it when its attempts are used up, or when the rewritten task would be
    /// too large to write back).
    async fn requeue(
        &self,
        leadership: &Leadership,
        task: &Task,
        reason: &str,
    ) -> Result<(), LeadEnd> {
        let attempts = task.run_number();
        if attempts >= self.settings.max_attempts {
            return self
                .exhausted(leadership, task, task.version, attempts, reason)
                .await;
        }
        let value = task.retried(attempts, reason, Utc::now());
        // A task still held (by this very lease) is released if unchanged; an orphan, whose
        // claim went with its lease, is rewritten if unchanged.
        let (key, version) = (task.key.clone(), task.version);
        let ops = match &task.holder {
            Some(_) => [TaskOp::Release {
                key,
                version,
                value: value.clone(),
            }],
            None => [TaskOp::Rewrite {
                key,
                version,
                value: value.clone(),
            }],
        };
        match self
            .write_or_step_down(leadership, &ops, "requeue a task")
            .await?
        {
            Applied::Done => {
                tracing::warn!(task_key = %task.key, task_type = %task.task_type, attempt = attempts, reason, "task requeued");
            }
            Applied::Conflict => {}
            Applied::TooLarge(why) => {
                let pair = pair_of(task, value, task.version);
                let reason = format!("{reason}; cannot requeue it: {why}");
                self.dead_letter(leadership, &pair, &reason).await?;
            }
        }
        Ok(())
    }

    /// Moves a task that used up its attempts to the dead-letter prefix.
    async fn exhausted(
        &self,
        leadership: &Leadership,
        task: &Task,
        index: u64,
        attempts: u32,
        error: &str,
    ) -> Result<(), LeadEnd> {
        let value = task.with(&[
            ("attempts", serde_json::json!(attempts)),
            ("lastError", serde_json::Value::String(error.to_string())),
        ]);
        let pair = pair_of(task, value, index);
        let reason = format!("failed {attempts} times; last error: {error}");
        self.dead_letter(leadership, &pair, &reason).await?;
        Ok(())
    }

    /// Works through a listing's backlog. Before each claim the plan decides: look at the
    /// queue's keys (every LOOK_INTERVAL) for tasks that arrived and retries written back,
    /// list again, or claim. Retries that fall due join the pending tasks, so the earliest
    /// eligible task known is always claimed next. Tasks are claimed one at a time, or in
    /// batches of up to `claim_batch` while handlers finish fast, each batch within the
    /// coordinator's write limits; a task too large to claim at all is dead-lettered. Each
    /// claim is conditioned on the version read, and a conflict sends the leader back to
    /// list again. Finished tasks are completed in the next claim's write.
    async fn work_through(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
        mut backlog: Backlog,
        memory: &mut Memory,
    ) -> (Option<LeadEnd>, Vec<Finished>) {
        let mut finished: Vec<Finished> = Vec::new();
        let mut fast = false;
        // After the coordinator refused a batch as too large (a Consul whose limits are
        // below leaderq's), claim one task at a time, alone in its write, until the next
        // listing.
        let mut single = false;
        let mut end = None;
        'listing: loop {
            if let Some(stop) = self.must_stop(lease, shutdown) {
                end = Some(stop);
                break;
            }
            match backlog.next(Utc::now()) {
                Next::Claim => {}
                Next::Look => match self.look(leadership, &mut backlog, memory).await {
                    Ok(Look::Continue) => continue,
                    Ok(Look::Relist) => break,
                    Err(stop) => {
                        end = Some(stop);
                        break;
                    }
                },
                Next::Relist | Next::Done => break,
            }
            let max_tasks = if fast && !single {
                self.settings.claim_batch
            } else {
                1
            };
            let riders = &finished[..if single { 0 } else { finished.len() }];
            let (batch, candidates, deletions) = match self.plan_batch(
                leadership,
                &mut backlog,
                riders,
                max_tasks,
            ) {
                Planned::Batch {
                    tasks,
                    candidates,
                    deletions,
                } => (tasks, candidates, deletions),
                Planned::TooLarge { task, cost } => {
                    let limits = self.coord.limits();
                    let reason = format!(
                            "too large to claim: its claim would be {} operations and {} bytes as the coordinator counts them, over its limits of {} and {}; the task's value is {} bytes",
                            cost.ops,
                            cost.bytes,
                            limits.max_ops,
                            limits.max_bytes,
                            task.with(&[]).len()
                        );
                    let pair = pair_of(&task, task.with(&[]), task.version);
                    match self.dead_letter(leadership, &pair, &reason).await {
                        Ok(_) => backlog.forget(&task.key),
                        Err(stop) => {
                            end = Some(stop);
                            break;
                        }
                    }
                    continue;
                }
            };
            let deleted: Vec<String> = finished[..deletions]
                .iter()
                .map(|done| done.task.key.clone())
                .collect();
            let claimed = match self
                .claim_batch(leadership, batch, candidates, &mut finished, deletions)
                .await
            {
                Claim::Claimed(claimed) => {
                    for key in &deleted {
                        backlog.forget(key);
                    }
                    claimed
                }
                Claim::Relist => break,
                Claim::LockDelayed(batch, refused) => {
                    // The coordinator refuses these keys for a while (Consul: another
                    // session's lock-delay): nothing was applied.
                    // They step aside for a while, and the tasks after them go first.
                    let (delayed, others): (Vec<_>, Vec<_>) = batch
                        .into_iter()
                        .enumerate()
                        .partition(|(n, _)| refused.contains(n));
                    let delayed: Vec<Task> = delayed.into_iter().map(|(_, task)| task).collect();
                    for task in &delayed {
                        tracing::info!(task_key = %task.key, retry_in = %crate::util::duration::format(LOCK_DELAY_RETRY), "task is under another session's lock-delay; claiming the next ones meanwhile");
                    }
                    backlog.put_back(others.into_iter().map(|(_, task)| task).collect());
                    let until = Utc::now()
                        + chrono::Duration::from_std(LOCK_DELAY_RETRY).unwrap_or_default();
                    for task in &delayed {
                        memory.deferred.insert(task.key.clone(), until);
                    }
                    backlog.defer(delayed, until);
                    continue;
                }
                Claim::End(stop) => {
                    end = Some(stop);
                    break;
                }
                Claim::TooLarge(mut batch, why) => {
                    if batch.len() > 1 || deletions > 0 || !single {
                        tracing::warn!(error = %why, "the coordinator refused a claim as too large; claiming one task at a time");
                        single = true;
                        if !finished.is_empty() {
                            finished = self
                                .complete_known(
                                    leadership,
                                    &mut backlog,
                                    std::mem::take(&mut finished),
                                )
                                .await;
                        }
                        backlog.put_back(batch);
                        continue;
                    }
                    let Some(task) = batch.pop() else { continue };
                    let reason =
                        format!("too large to claim: the coordinator refused its claim: {why}");
                    let pair = pair_of(&task, task.with(&[]), task.version);
                    match self.dead_letter(leadership, &pair, &reason).await {
                        Ok(_) => backlog.forget(&task.key),
                        Err(stop) => {
                            end = Some(stop);
                            break;
                        }
                    }
                    continue;
                }
            };
            let mut claimed = claimed.into_iter();
            while let Some((task, claim_index)) = claimed.next() {
                // "Renew between tasks": a batch claimed ahead still runs only while the lease
                // is fresh; what did not start (this task included) goes back untouched.
                if let Some(stop) = self.must_stop(lease, shutdown) {
                    let unstarted = std::iter::once((task, claim_index))
                        .chain(claimed.by_ref())
                        .collect();
                    self.release_unstarted(leadership, unstarted).await;
                    end = Some(stop);
                    break 'listing;
                }
                let key = task.task.key.clone();
                let finished_before = finished.len();
                let run = self
                    .run_claimed(
                        leadership,
                        lease,
                        shutdown,
                        task,
                        claim_index,
                        &mut finished,
                    )
                    .await;
                if finished.len() == finished_before {
                    // Not a success: a retry was written back or the task moved. The next
                    // look reads the key again, so the retry is known when due.
                    backlog.forget(&key);
                }
                fast = run.elapsed < FAST_HANDLER;
                // Past a slow run, finished tasks are recorded at once rather than at the
                // next claim, which keeps the window in which a crash makes them run again
                // short.
                if !fast && !finished.is_empty() {
                    finished = self
                        .complete_known(leadership, &mut backlog, std::mem::take(&mut finished))
                        .await;
                }
                let stop = run.end;
                if let Some(stop) = stop {
                    self.release_unstarted(leadership, claimed.collect()).await;
                    end = Some(stop);
                    break 'listing;
                }
                if !fast && claimed.len() > 0 {
                    // The batch was claimed on the promise of fast runs. A slow one sends the
                    // rest back unchanged, so that a batch of slow tasks never holds up an
                    // earlier task that arrives or falls due; the next look reads them again.
                    let rest: Vec<(Claimed, u64)> = claimed.by_ref().collect();
                    for (unstarted, _) in &rest {
                        backlog.forget(&unstarted.task.key);
                    }
                    self.release_unstarted(leadership, rest).await;
                }
            }
        }
        let unrecorded = self.complete_all(leadership, finished).await;
        (end, unrecorded)
    }

    /// Plans the next claim: prepares claims of up to `max_tasks` pending tasks while they
    /// fit one write, with as many of the `finished` completions as leave room; or, when
    /// the first task cannot be claimed even alone, takes that task out of the backlog.
    fn plan_batch(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        finished: &[Finished],
        max_tasks: usize,
    ) -> Planned {
        let now = Utc::now();
        let completions: Vec<WriteCost> = finished
            .iter()
            .map(|done| self.coord.cost(&done.completion()))
            .collect();
        let guard = self.coord.guard_cost();
        let limits = self.coord.limits();
        // Claims are prepared one at a time and only while they fit: preparing one writes
        // the task's whole value, which is worth skipping for large values.
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut claims: Vec<WriteCost> = Vec::new();
        let mut plan = ClaimPlan::Take {
            finished: 0,
            tasks: 0,
        };
        for task in backlog.pending().take(max_tasks) {
            let candidate = Candidate::new(task, leadership, &self.node_id, now);
            claims.push(self.coord.cost(&candidate.op));
            let next = plan::plan_claim(guard, &completions, &claims, max_tasks, limits);
            match next {
                ClaimPlan::Take { tasks, .. } if tasks == claims.len() => {
                    candidates.push(candidate);
                    plan = next;
                }
                ClaimPlan::Take { .. } => break,
                ClaimPlan::TooLarge { .. } => {
                    plan = next;
                    break;
                }
            }
        }
        match plan {
            ClaimPlan::Take { finished, tasks } => Planned::Batch {
                tasks: backlog.take(tasks),
                candidates,
                deletions: finished,
            },
            ClaimPlan::TooLarge { cost } => match backlog.take_first() {
                Some(task) => Planned::TooLarge {
                    task: Box::new(task),
                    cost,
                },
                None => Planned::Batch {
                    tasks: Vec::new(),
                    candidates: Vec::new(),
                    deletions: 0,
                },
            },
        }
    }

    /// Looks at the queue's keys: drops tasks whose keys went away, reads the new keys
    /// (tasks that arrived, retries written back, tasks released to a producer's newer
    /// version) and adds what they hold to the backlog.
    async fn look(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        memory: &mut Memory,
    ) -> Result<Look, LeadEnd> {
        let started = Instant::now();
        let keys = match self.coord.keys(&self.settings.prefix).await {
            Ok((keys, _)) => keys,
            Err(err) => {
                self.metrics.coordinator_error(&err);
                tracing::warn!(error = %err, "cannot read the queue's keys; listing again");
                return Ok(Look::Relist);
            }
        };
        let new = match backlog.looked(keys, Utc::now(), started.elapsed()) {
            Looked::Relist => return Ok(Look::Relist),
            Looked::New(new) => new,
        };
        if new.is_empty() {
            return Ok(Look::Continue);
        }
        // A key that went away meanwhile is simply not among them.
        let entries = match self.coord.get(&new).await {
            Ok(entries) => entries,
            Err(err) => {
                self.metrics.coordinator_error(&err);
                tracing::warn!(error = %err, "cannot read new tasks; listing again");
                return Ok(Look::Relist);
            }
        };
        let sorted = self
            .sort_out(leadership, entries, memory, Utc::now())
            .await?;
        backlog.learn(
            sorted.keys.into_iter().collect(),
            sorted.pending,
            sorted.delayed,
        );
        Ok(Look::Continue)
    }

    fn must_stop(&self, lease: &Lease, shutdown: &CancellationToken) -> Option<LeadEnd> {
        if shutdown.is_cancelled() {
            return Some(LeadEnd::Shutdown);
        }
        if !lease.is_fresh() {
            return Some(LeadEnd::StepDown("lease not renewed within its TTL".into()));
        }
        if self.rotation_due() {
            return Some(LeadEnd::Rotate);
        }
        None
    }

    /// Claims `batch` (with its prepared `candidates`) in one write that also completes
    /// the first `deletions` finished tasks.
    async fn claim_batch(
        &self,
        leadership: &Leadership,
        batch: Vec<Task>,
        candidates: Vec<Candidate>,
        finished: &mut Vec<Finished>,
        deletions: usize,
    ) -> Claim {
        let mut ops = Vec::with_capacity(deletions + batch.len());
        // Finished tasks are completed in this claim's write: one commit, not two. It is
        // applied only if the whole claim is.
        ops.extend(finished[..deletions].iter().map(Finished::completion));
        let mut values = Vec::with_capacity(candidates.len());
        for candidate in candidates {
            ops.push(candidate.op);
            values.push(candidate.value);
        }
        let (versions, fencing_token) = match self.write(leadership, &ops).await {
            Ok(Written::Done {
                versions,
                fencing_token,
            }) => (versions, fencing_token),
            // Nothing was applied; the finished tasks are completed on their own later.
            Ok(Written::NotLeader) => {
                return Claim::End(LeadEnd::StepDown("lost leadership at claim".into()))
            }
            Ok(Written::Conflict(keys)) => {
                self.metrics.claim_conflicts.inc();
                let refused = self.refused_for_a_while(&batch, &keys).await;
                if !refused.is_empty() && refused.len() == keys.len() {
                    return Claim::LockDelayed(batch, refused);
                }
                tracing::debug!(?keys, "claim conflict; listing again");
                return Claim::Relist;
            }
            Err(CoordError::Refused(why)) => return Claim::TooLarge(batch, why),
            Err(err) => {
                tracing::warn!(error = %err, "claim failed");
                return Claim::Relist;
            }
        };
        for done in finished.drain(..deletions) {
            self.log_completed(leadership, &done, fencing_token);
        }
        let mut claimed = Vec::with_capacity(batch.len());
        for (task, value) in batch.into_iter().zip(values) {
            let claim_index = versions
                .iter()
                .find(|(key, _)| *key == task.key)
                .map_or(0, |(_, version)| *version);
            let attempt = task.run_number();
            self.metrics.claimed(&task.task_type);
            tracing::info!(
                task_key = %task.key,
                task_id = %task.id,
                task_type = %task.task_type,
                attempt,
                fencing_token = leadership.fencing_token,
                "task claimed"
            );
            claimed.push((
                Claimed {
                    task: Box::new(task),
                    value,
                },
                claim_index,
            ));
        }
        Claim::Claimed(claimed)
    }

    /// Of a conflicted claim's `keys`, the tasks of `batch` (indexes) that are still as
    /// read and held by no lease: nothing moved them, the coordinator refuses them for a
    /// while (Consul: lock-delay). Empty unless every conflicted key is such a task.
    async fn refused_for_a_while(&self, batch: &[Task], keys: &[String]) -> Vec<usize> {
        let tried: Vec<usize> = keys
            .iter()
            .filter_map(|key| batch.iter().position(|task| task.key == *key))
            .collect();
        if tried.len() != keys.len() {
            return Vec::new();
        }
        let Ok(current) = self.coord.get(keys).await else {
            return Vec::new();
        };
        let still = plan::unmoved(batch, &tried, &current);
        if still.len() == tried.len() {
            still
        } else {
            Vec::new()
        }
    }

    /// Releases claimed tasks whose handlers never started, restoring their value, so they
    /// go back to the queue without using an attempt. Only this lease's own claims are
    /// touched, so no leadership guard is needed.
    async fn release_unstarted(&self, leadership: &Leadership, unstarted: Vec<(Claimed, u64)>) {
        if unstarted.is_empty() {
            return;
        }
        let ops: Vec<TaskOp> = unstarted
            .iter()
            .map(|(claimed, claim_index)| TaskOp::Release {
                key: claimed.task.key.clone(),
                version: *claim_index,
                value: claimed.task.with(&[]),
            })
            .collect();
        let costs: Vec<WriteCost> = ops.iter().map(|op| self.coord.cost(op)).collect();
        for range in plan::chunks(None, &costs, self.coord.limits()) {
            if let Err(err) = self.coord.write_own(&leadership.lease, &ops[range]).await {
                self.metrics.coordinator_error(&err);
                tracing::warn!(error = %err, "cannot release tasks claimed but not started; the next leader requeues them");
            }
        }
    }

    /// Runs one claimed task's handler and settles a failure; a success joins `finished`.
    async fn run_claimed(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
        claimed: Claimed,
        claim_index: u64,
        finished: &mut Vec<Finished>,
    ) -> RunOutcome {
        let Claimed { task, value } = claimed;
        self.term.ran_one();
        let attempt = task.attempts + 1;
        let started = std::time::Instant::now();
        let Some(handler) = self.registry.get(&task.task_type) else {
            // Checked before the claim; the task is requeued as ours at the next listing.
            return RunOutcome {
                elapsed: started.elapsed(),
                end: None,
            };
        };
        let cancel = CancellationToken::new();
        let ctx = TaskContext {
            key: task.key.clone(),
            task_id: task.id.clone(),
            task_type: task.task_type.clone(),
            task_json: value,
            attempt,
            fencing_token: leadership.fencing_token,
            cancel: cancel.clone(),
            lease_deadline: lease.deadline_watch(),
        };
        let mut run = handler.handle(&ctx);
        let mut ending: Option<LeadEnd> = None;
        let result = loop {
            tokio::select! {
                result = &mut run => break result,
                _ = lease.expired(), if ending.is_none() => {
                    // Another replica may lead soon: stop the handler now.
                    cancel.cancel();
                    ending = Some(LeadEnd::StepDown("lease not renewed within its TTL".into()));
                }
                _ = shutdown.cancelled(), if ending.is_none() => {
                    ending = Some(LeadEnd::Shutdown);
                    let grace = self.settings.shutdown_grace;
                    tracing::info!(task_key = %task.key, grace = %crate::util::duration::format(grace), "shutting down: waiting for the running handler");
                    match tokio::time::timeout(grace, &mut run).await {
                        Ok(result) => break result,
                        Err(_) => cancel.cancel(),
                    }
                }
            }
        };
        drop(run);
        let elapsed = started.elapsed();
        let elapsed_ms = elapsed.as_millis() as u64;
        match (result, &ending) {
            (Ok(()), _) => finished.push(Finished {
                task,
                claim_index,
                elapsed_ms,
            }),
            (Err(err), Some(LeadEnd::Shutdown)) if cancel.is_cancelled() => {
                // Cut short by us, not failed: back in the queue without using an attempt.
                let value = task.retried(
                    task.attempts,
                    &format!("interrupted by shutdown: {err}"),
                    Utc::now(),
                );
                self.settle(leadership, &task, claim_index, value, "put back")
                    .await;
            }
            (Err(err), _) => {
                self.metrics.failed(&task.task_type, elapsed);
                tracing::warn!(task_key = %task.key, task_type = %task.task_type, attempt, fencing_token = leadership.fencing_token, error = %err, elapsed_ms, "task failed");
                if attempt >= self.settings.max_attempts {
                    if let Err(end) = self
                        .exhausted(leadership, &task, claim_index, attempt, &err.0)
                        .await
                    {
                        return RunOutcome {
                            elapsed,
                            end: Some(ending.unwrap_or(end)),
                        };
                    }
                } else {
                    let backoff = self.backoff(attempt);
                    let not_before =
                        Utc::now() + chrono::Duration::from_std(backoff).unwrap_or_default();
                    let value = task.retried(attempt, &err.0, not_before);
                    self.settle(leadership, &task, claim_index, value, "schedule a retry")
                        .await;
                }
            }
        }
        RunOutcome {
            elapsed,
            end: ending,
        }
    }

    /// `fencing_token` is the leadership's token as the committed write saw it: logging it
    /// beside the leadership's own lets an audit prove no stale leader completed a task.
    fn log_completed(&self, leadership: &Leadership, done: &Finished, fencing_token: u64) {
        let task = &done.task;
        // The name the chaos audit reads (Consul's LockIndex of the leader key).
        let leader_lock_index = fencing_token;
        self.metrics
            .completed(&task.task_type, Duration::from_millis(done.elapsed_ms));
        tracing::info!(
            task_key = %task.key,
            task_id = %task.id,
            task_type = %task.task_type,
            attempt = task.run_number(),
            fencing_token = leadership.fencing_token,
            elapsed_ms = done.elapsed_ms,
            leader_lock_index,
            "task completed"
        );
    }

    /// Deletes a finished task, but only the version this run claimed: a producer's newer
    /// write under the same key is released back to the queue instead.
    /// Returns the task back when its completion could not be recorded (coordinator
    /// unavailable), so that the caller retries it: a finished task is never mistaken for a
    /// cut-short one.
    async fn complete(&self, leadership: &Leadership, done: Finished) -> Option<Finished> {
        let task = &done.task;
        match self.write(leadership, &[done.completion()]).await {
            Ok(Written::Done { fencing_token, .. }) => {
                self.log_completed(leadership, &done, fencing_token)
            }
            Ok(Written::Conflict(_)) => {
                tracing::info!(task_key = %task.key, "task completed, but a producer rewrote it meanwhile; the new version stays queued");
                self.release_current(leadership, &task.key).await;
            }
            Ok(Written::NotLeader) => {
                tracing::warn!(task_key = %task.key, "task completed after this replica lost leadership; the next leader will run it again");
            }
            Err(CoordError::Refused(why)) => {
                // One completion cannot be too large for any coordinator; should one refuse
                // it, the task stays held by this lease and the next listing runs it again.
                tracing::error!(task_key = %task.key, error = %why, "cannot record the completed task: the coordinator refused it as too large");
            }
            Err(err) => {
                tracing::warn!(task_key = %task.key, error = %err, "cannot record the completed task yet; retrying");
                return Some(done);
            }
        }
        None
    }

    /// Completes finished tasks, in as few writes as the limits allow; if one of them was
    /// rewritten meanwhile, each of its write's tasks is completed on its own so the
    /// rewritten one is released, not deleted. Returns those whose completion could not be
    /// recorded yet.
    async fn complete_all(
        &self,
        leadership: &Leadership,
        finished: Vec<Finished>,
    ) -> Vec<Finished> {
        let mut left = Vec::new();
        if finished.len() <= 1 {
            for done in finished {
                left.extend(self.complete(leadership, done).await);
            }
            return left;
        }
        let costs: Vec<WriteCost> = finished
            .iter()
            .map(|done| self.coord.cost(&done.completion()))
            .collect();
        let guard = self.coord.guard_cost();
        let mut finished = finished.into_iter();
        for range in plan::chunks(Some(guard), &costs, self.coord.limits()) {
            let group: Vec<Finished> = finished.by_ref().take(range.len()).collect();
            let ops: Vec<TaskOp> = group.iter().map(Finished::completion).collect();
            match self.write(leadership, &ops).await {
                Ok(Written::Done { fencing_token, .. }) => {
                    for done in &group {
                        self.log_completed(leadership, done, fencing_token);
                    }
                }
                _ => {
                    for done in group {
                        left.extend(self.complete(leadership, done).await);
                    }
                }
            }
        }
        left
    }

    /// Completes finished tasks, and forgets the keys whose outcome is recorded: deleted,
    /// or released to a producer's newer version, which the next look then reads.
    async fn complete_known(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        finished: Vec<Finished>,
    ) -> Vec<Finished> {
        let keys: Vec<String> = finished.iter().map(|done| done.task.key.clone()).collect();
        let left = self.complete_all(leadership, finished).await;
        for key in keys {
            if !left.iter().any(|done| done.task.key == key) {
                backlog.forget(&key);
            }
        }
        left
    }

    /// Writes `value` and releases the task, if it is still the version this run claimed.
    /// A value too large to write back sends the task to dead-letter instead.
    async fn settle(
        &self,
        leadership: &Leadership,
        task: &Task,
        claim_index: u64,
        value: Vec<u8>,
        what: &str,
    ) {
        let ops = [TaskOp::Release {
            key: task.key.clone(),
            version: claim_index,
            value: value.clone(),
        }];
        match self.write(leadership, &ops).await {
            Ok(Written::Done { .. }) => {}
            Ok(Written::Conflict(_)) => self.release_current(leadership, &task.key).await,
            Err(CoordError::Refused(why)) => {
                let pair = pair_of(task, value, claim_index);
                let reason = format!("cannot {what}: the task is too large to write back: {why}");
                if let Err(end) = self.dead_letter(leadership, &pair, &reason).await {
                    tracing::warn!(task_key = %task.key, ?end, "cannot dead-letter a task too large to {what}; the task is requeued when this lease ends");
                }
            }
            Ok(Written::NotLeader) => {
                tracing::warn!(task_key = %task.key, "cannot {what}: leadership lost; the task is requeued when this lease ends")
            }
            Err(err) => {
                tracing::warn!(task_key = %task.key, error = %err, "cannot {what}; the task is requeued when this lease ends")
            }
        }
    }

    /// Releases a task a producer rewrote while it ran, keeping the producer's value.
    async fn release_current(&self, leadership: &Leadership, key: &str) {
        let keys = [key.to_string()];
        for _ in 0..RELEASE_ATTEMPTS {
            let current = match self.coord.get(&keys).await {
                Ok(found) => match found.into_iter().next() {
                    Some(current) => current,
                    None => return,
                },
                Err(err) => {
                    tracing::warn!(task_key = %key, error = %err, "cannot read a rewritten task");
                    return;
                }
            };
            if current.holder.as_ref() != Some(&leadership.lease) {
                return;
            }
            let ops = [TaskOp::Release {
                key: key.to_string(),
                version: current.version,
                value: current.value,
            }];
            match self.write(leadership, &ops).await {
                Ok(Written::Conflict(_)) => continue,
                _ => return,
            }
        }
    }

    /// base × 2^(attempt-1), capped, plus up to 20% jitter so retries do not bunch up.
    fn backoff(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(30);
        let base = self.settings.backoff_base.saturating_mul(1u32 << exponent);
        let capped = base.min(self.settings.backoff_max);
        capped + capped.mul_f64(fastrand::f64() * 0.2)
    }
}

enum Pick {
    /// Pending tasks to work through.
    Run(Backlog),
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
}

impl Finished {
    /// Completes the version this run claimed, and only that one.
    fn completion(&self) -> TaskOp {
        TaskOp::Complete {
            key: self.task.key.clone(),
            version: self.claim_index,
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
