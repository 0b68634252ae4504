//! The leader's work on the task queue: list pending tasks with a blocking query, claim
//! them in `taskTime` order, run their handlers, then complete, retry or dead-letter them;
//! requeue tasks whose replica died; dead-letter what cannot run, a task too large to claim
//! included.
//!
//! Every write is one transaction that first checks, with `check-session` on the leader key,
//! that this replica still leads, so a deposed leader can never claim, complete or move a
//! task. Every transaction is planned within Consul's limits, and one that Consul still
//! refuses as too large moves the task away instead of costing the leadership. The pure
//! decisions (what to claim, when to look for newer tasks, when to list again) live in
//! `plan.rs`; this file performs their I/O. Leadership itself is `election.rs`'s business.

mod plan;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::config::QueueSettings;
use crate::consul::{self, Client, KvPair, QueryOptions, TxnError, TxnOp, TxnOutcome, WatchIndex};
use crate::election::{Leadership, Lease};
use crate::handler::{Registry, TaskContext};
use crate::key::Key;
use crate::observe::Metrics;
use crate::task::{dead_letter_within, Status, Task};

use plan::{Backlog, ClaimPlan, Looked, Next, TxnLimits};

/// Back-off after Consul errors while leading, so an outage is not a hot loop.
const ERROR_BACKOFF: Duration = Duration::from_secs(1);
/// A handler run shorter than this lets the next claim take a batch.
const FAST_HANDLER: Duration = Duration::from_millis(5);
/// How many times a completion re-reads a task that a producer keeps rewriting.
const RELEASE_ATTEMPTS: usize = 5;
/// Added to the longest backoff (backoff_max + 20% jitter) before a notBefore is
/// disbelieved: the clocks of replicas differ a little.
const NOT_BEFORE_SLACK: Duration = Duration::from_secs(1);
/// A task whose key is under another session's lock-delay is tried again after this long;
/// the tasks after it are claimed meanwhile. (Consul does not say how long the delay lasts:
/// the holder's session set it, 15 s by default, at most 60 s.)
const LOCK_DELAY_RETRY: Duration = Duration::from_secs(1);
/// The dead letter written when Consul refuses even the trimmed one: Consul's own limits
/// are below leaderq's, and this is about the least that says what happened.
const MINIMAL_DEAD_LETTER: usize = 4096;

/// Why the leader stopped leading.
#[derive(Debug, PartialEq, Eq)]
pub enum LeadEnd {
    Shutdown,
    StepDown(String),
}

/// What the leader needs: the client, the queue settings, the handlers, who it is.
pub struct Queue {
    pub client: Arc<Client>,
    pub settings: QueueSettings,
    pub registry: Registry,
    pub leader_key: String,
    pub node_id: String,
    pub wait: Duration,
    pub metrics: Arc<Metrics>,
}

/// The outcome of a transaction guarded by the leader check.
enum Guarded {
    Done(Vec<KvPair>),
    /// The leader check failed: this replica no longer leads.
    NotLeader,
    /// Another check failed (the task changed, lock-delay): nothing was applied.
    Conflict(Vec<TxnError>),
    /// Too large for one transaction (found before sending, or Consul's 413): nothing was
    /// applied, and sending it again cannot help.
    TooLarge(String),
}

/// The outcome of a guarded write whose lost leadership ends the leading.
enum Written {
    Done,
    Conflict,
    TooLarge(String),
}

/// What the leader remembers across listings while it leads.
#[derive(Default)]
struct Memory {
    /// Warnings given once per key ("foreign …", "notBefore …").
    warned: HashSet<String>,
    /// Keys under another session's lock-delay, and when to try them again.
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
        let mut index = WatchIndex::default();
        let mut memory = Memory::default();
        // Finished tasks whose deletion could not be recorded (Consul unreachable). They are
        // still locked by this session, so until they are recorded the leader neither lists
        // nor claims: a listing would take them for runs cut short and run them again.
        let mut unrecorded: Vec<Finished> = Vec::new();
        let mut pacer = crate::consul::Pacer::default();
        loop {
            if shutdown.is_cancelled() {
                return LeadEnd::Shutdown;
            }
            // "Renew between tasks": no claim unless the lease is known to be fresh.
            if !lease.is_fresh() {
                return LeadEnd::StepDown("session not renewed within its TTL".into());
            }
            if !unrecorded.is_empty() {
                unrecorded = self.complete_all(leadership, unrecorded).await;
                if !unrecorded.is_empty() {
                    if self.pause(shutdown, ERROR_BACKOFF).await {
                        return LeadEnd::Shutdown;
                    }
                    continue;
                }
                index.reset();
            }
            let options = QueryOptions {
                index: index.get(),
                wait: Some(self.wait),
            };
            pacer.sent();
            let list_started = Instant::now();
            let listed = tokio::select! {
                _ = shutdown.cancelled() => return LeadEnd::Shutdown,
                _ = lease.expired() => return LeadEnd::StepDown("session not renewed within its TTL".into()),
                listed = self.client.kv_list(&self.settings.prefix, options) => listed,
            };
            let (entries, returned) = match listed {
                Ok(listed) => listed,
                Err(err) => {
                    self.metrics.consul_error(&err);
                    self.metrics.blocking_restarts.inc();
                    tracing::warn!(error = %err, "cannot list the queue; retrying");
                    index.reset();
                    if self.pause(shutdown, ERROR_BACKOFF).await {
                        return LeadEnd::Shutdown;
                    }
                    continue;
                }
            };
            if returned < index.get() {
                self.metrics.blocking_restarts.inc();
            }
            let moved = index.update(returned) || options.index == 0;
            // What listing cost, for spacing listings out: a listing that may have waited
            // on the blocking query counts from its answer.
            let listed_from = if options.index == 0 {
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
                    if let Some(end) = end {
                        return end;
                    }
                    // The leader's own writes moved the queue: list again without waiting.
                    index.reset();
                }
                Ok(Pick::WaitUntil(at)) => {
                    self.count_dead().await;
                    // Nothing runnable before `at`: block on the queue, but not past `at`.
                    let until = (at - Utc::now()).to_std().unwrap_or_default();
                    if until < self.wait {
                        let options = QueryOptions {
                            index: index.get(),
                            wait: Some(until.max(Duration::from_millis(1))),
                        };
                        tokio::select! {
                            _ = shutdown.cancelled() => return LeadEnd::Shutdown,
                            _ = lease.expired() => return LeadEnd::StepDown("session not renewed within its TTL".into()),
                            _ = self.client.kv_list(&self.settings.prefix, options) => {}
                        }
                        index.reset();
                    }
                }
                Ok(Pick::Nothing) => {
                    self.count_dead().await;
                    pacer.settle(moved).await;
                }
                Ok(Pick::Again) => index.reset(),
                Err(end) => return end,
            }
        }
    }

    /// Refreshes the dead-letter depth; done when idle, off the dispatch path.
    async fn count_dead(&self) {
        let options = QueryOptions::default();
        match self
            .client
            .kv_list(&self.settings.dead_prefix, options)
            .await
        {
            Ok((dead, _)) => self.metrics.dead_depth(dead.len()),
            Err(err) => self.metrics.consul_error(&err),
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
        entries: Vec<KvPair>,
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
        entries: Vec<KvPair>,
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
                if pair.session.is_none() {
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
                    if pair.session.is_none() {
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
                Status::InFlight
                    if task.session.as_deref() == Some(leadership.session.as_str()) =>
                {
                    // Locked by this very session, yet nothing runs here: a run cut short by a
                    // restart that reused the session. Put it back as a failed attempt.
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

    /// The leader check every guarded transaction starts with.
    fn guard(&self, leadership: &Leadership) -> TxnOp {
        TxnOp::CheckSession {
            key: self.leader_key.clone(),
            session: leadership.session.clone(),
        }
    }

    /// Runs `ops` after the leader check, in one transaction, if they fit one.
    async fn guarded(
        &self,
        leadership: &Leadership,
        ops: Vec<TxnOp>,
    ) -> Result<Guarded, consul::Error> {
        let mut all = vec![self.guard(leadership)];
        all.extend(ops);
        if !consul::fits(&all) {
            let body = consul::body_len(all.iter().map(TxnOp::encoded_len));
            return Ok(Guarded::TooLarge(format!(
                "the transaction would hold {} operations in {body} bytes encoded, over the {} operations or {} bytes leaderq puts in one",
                all.len(),
                consul::TXN_MAX_OPS,
                consul::TXN_MAX_BODY
            )));
        }
        let outcome = match self.client.txn(&all).await {
            Ok(outcome) => outcome,
            Err(err) => {
                self.metrics.consul_error(&err);
                if err.is_too_large() {
                    return Ok(Guarded::TooLarge(err.to_string()));
                }
                return Err(err);
            }
        };
        match outcome {
            TxnOutcome::Committed(entries) => Ok(Guarded::Done(entries)),
            TxnOutcome::RolledBack(errors) if errors.iter().any(|e| e.op_index == 0) => {
                Ok(Guarded::NotLeader)
            }
            TxnOutcome::RolledBack(errors) => Ok(Guarded::Conflict(errors)),
        }
    }

    /// A guarded write whose conflicts are not this replica's problem; a lost leader check
    /// or a Consul error ends the leadership. Too large is the caller's to handle.
    async fn guarded_or_step_down(
        &self,
        leadership: &Leadership,
        ops: Vec<TxnOp>,
        what: &str,
    ) -> Result<Written, LeadEnd> {
        match self.guarded(leadership, ops).await {
            Ok(Guarded::Done(_)) => Ok(Written::Done),
            Ok(Guarded::NotLeader) => Err(LeadEnd::StepDown(format!(
                "lost leadership while trying to {what}"
            ))),
            Ok(Guarded::Conflict(errors)) => {
                tracing::debug!(
                    ?errors,
                    "{what}: the task changed meanwhile; will look again"
                );
                Ok(Written::Conflict)
            }
            Ok(Guarded::TooLarge(why)) => Ok(Written::TooLarge(why)),
            Err(err) => Err(LeadEnd::StepDown(format!("cannot {what}: {err}"))),
        }
    }

    fn dead_key(&self, key: &str) -> String {
        crate::key::dead_letter_key(&self.settings.prefix, &self.settings.dead_prefix, key).into()
    }

    /// Moves an entry to the dead-letter prefix with `reason`, in one guarded transaction
    /// that deletes it only if unchanged. A dead letter that would not fit the transaction
    /// is trimmed to fit (its largest fields dropped, the reason and original key kept).
    /// Returns whether the entry moved.
    async fn dead_letter(
        &self,
        leadership: &Leadership,
        pair: &KvPair,
        reason: &str,
    ) -> Result<bool, LeadEnd> {
        let dead_key = self.dead_key(&pair.key);
        let ops = |value: Vec<u8>| {
            vec![
                TxnOp::DeleteCas {
                    key: pair.key.clone(),
                    index: pair.modify_index,
                },
                TxnOp::Set {
                    key: dead_key.clone(),
                    value,
                },
            ]
        };
        let mut shell = vec![self.guard(leadership)];
        shell.extend(ops(Vec::new()));
        let room = consul::value_room(&shell);
        let (value, mut trimmed) = dead_letter_within(pair, reason, Utc::now(), room);
        let mut written = self
            .guarded_or_step_down(leadership, ops(value), "dead-letter a task")
            .await?;
        if let Written::TooLarge(why) = &written {
            tracing::warn!(task_key = %pair.key, error = %why, "Consul refused the dead letter as too large; writing a minimal one");
            let (value, _) = dead_letter_within(pair, reason, Utc::now(), MINIMAL_DEAD_LETTER);
            trimmed = true;
            written = self
                .guarded_or_step_down(leadership, ops(value), "dead-letter a task")
                .await?;
        }
        match written {
            Written::Done => {}
            Written::Conflict => return Ok(false),
            Written::TooLarge(why) => {
                tracing::error!(task_key = %pair.key, error = %why, "cannot dead-letter a task: Consul refuses even a minimal record as too large; raise its txn_max_req_len");
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
                .exhausted(leadership, task, task.modify_index, attempts, reason)
                .await;
        }
        let value = task.retried(attempts, reason, Utc::now());
        // A task still locked (by this very session) is unlocked if unchanged; an orphan,
        // whose lock went with its session, is rewritten with check-and-set.
        let ops = match &task.session {
            Some(session) => vec![
                TxnOp::CheckIndex {
                    key: task.key.clone(),
                    index: task.modify_index,
                },
                TxnOp::Unlock {
                    key: task.key.clone(),
                    value: value.clone(),
                    session: session.clone(),
                },
            ],
            None => vec![TxnOp::Cas {
                key: task.key.clone(),
                value: value.clone(),
                index: task.modify_index,
            }],
        };
        match self
            .guarded_or_step_down(leadership, ops, "requeue a task")
            .await?
        {
            Written::Done => {
                tracing::warn!(task_key = %task.key, task_type = %task.task_type, attempt = attempts, reason, "task requeued");
            }
            Written::Conflict => {}
            Written::TooLarge(why) => {
                let pair = pair_of(task, value, task.modify_index);
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
    /// transaction limits; a task too large to claim at all is dead-lettered. Each claim's
    /// check-index catches a task that changed since it was read, and a conflict sends the
    /// leader back to list again. Finished tasks are deleted in the next claim's transaction.
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
        // After Consul refused a batch as too large (its limits are below leaderq's), claim
        // one task at a time, alone in its transaction, until the next listing.
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
                Planned::TooLarge { task, body } => {
                    let reason = format!(
                            "too large to claim: its claim transaction would be {body} bytes encoded (values travel base64-encoded), over the {} bytes leaderq puts in one transaction (Consul refuses more than 512 KiB); the task's value is {} bytes",
                            consul::TXN_MAX_BODY,
                            task.with(&[]).len()
                        );
                    let pair = pair_of(&task, task.with(&[]), task.modify_index);
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
                    // Another session's lock-delay holds these keys: nothing was applied.
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
                        tracing::warn!(error = %why, "Consul refused a claim as too large; claiming one task at a time");
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
                        format!("too large to claim: Consul refused its claim transaction: {why}");
                    let pair = pair_of(&task, task.with(&[]), task.modify_index);
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
    /// fit one transaction, with as many of the `finished` deletions as leave room; or,
    /// when the first task cannot be claimed even alone, takes that task out of the backlog.
    fn plan_batch(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        finished: &[Finished],
        max_tasks: usize,
    ) -> Planned {
        let now = Utc::now();
        let deletions: Vec<usize> = finished
            .iter()
            .map(|done| done.deletion().encoded_len())
            .collect();
        let guard = self.guard(leadership).encoded_len();
        // Claims are prepared one at a time and only while they fit: preparing one writes
        // the task's whole value, which is worth skipping for large values.
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut claims: Vec<usize> = Vec::new();
        let mut plan = ClaimPlan::Take {
            finished: 0,
            tasks: 0,
        };
        for task in backlog.pending().take(max_tasks) {
            let candidate = Candidate::new(task, leadership, &self.node_id, now);
            claims.push(candidate.encoded_len());
            let next = plan::plan_claim(guard, &deletions, &claims, max_tasks, TxnLimits::CONSUL);
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
            ClaimPlan::TooLarge { body } => match backlog.take_first() {
                Some(task) => Planned::TooLarge {
                    task: Box::new(task),
                    body,
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
        let keys = match self
            .client
            .kv_keys(&self.settings.prefix, QueryOptions::default())
            .await
        {
            Ok((keys, _)) => keys,
            Err(err) => {
                self.metrics.consul_error(&err);
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
        let mut entries = Vec::with_capacity(new.len());
        for chunk in new.chunks(consul::TXN_MAX_OPS) {
            let reads: Vec<TxnOp> = chunk
                .iter()
                .map(|key| TxnOp::Get { key: key.clone() })
                .collect();
            match self.client.txn(&reads).await {
                Ok(TxnOutcome::Committed(found)) => entries.extend(found),
                // A key went away meanwhile; the next look reads the others again.
                Ok(TxnOutcome::RolledBack(_)) => {}
                Err(err) => {
                    self.metrics.consul_error(&err);
                    tracing::warn!(error = %err, "cannot read new tasks; listing again");
                    return Ok(Look::Relist);
                }
            }
        }
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
            return Some(LeadEnd::StepDown(
                "session not renewed within its TTL".into(),
            ));
        }
        None
    }

    /// Claims `batch` (with its prepared `candidates`) in one transaction that also deletes
    /// the first `deletions` finished tasks.
    async fn claim_batch(
        &self,
        leadership: &Leadership,
        batch: Vec<Task>,
        candidates: Vec<Candidate>,
        finished: &mut Vec<Finished>,
        deletions: usize,
    ) -> Claim {
        let mut ops = Vec::with_capacity(deletions + 2 * batch.len());
        // Finished tasks are deleted in this claim's transaction: one commit, not two. It
        // is applied only if the whole claim is.
        ops.extend(finished[..deletions].iter().map(Finished::deletion));
        let mut values = Vec::with_capacity(candidates.len());
        for candidate in candidates {
            ops.extend(candidate.ops);
            values.push(candidate.value);
        }
        let entries = match self.guarded(leadership, ops).await {
            Ok(Guarded::Done(entries)) => entries,
            // Nothing was applied; the finished tasks are completed on their own later.
            Ok(Guarded::NotLeader) => {
                return Claim::End(LeadEnd::StepDown("lost leadership at claim".into()))
            }
            Ok(Guarded::Conflict(errors)) => {
                self.metrics.claim_conflicts.inc();
                // The guard is op 0, the deletions follow, then a check and a lock per task.
                let first_claim = 1 + deletions;
                let refused: Vec<usize> = errors
                    .iter()
                    .filter(|error| error.what.contains("lock delay"))
                    .filter_map(|error| error.op_index.checked_sub(first_claim))
                    .map(|op| op / 2)
                    .filter(|&task| task < batch.len())
                    .collect();
                if !refused.is_empty() && refused.len() == errors.len() {
                    return Claim::LockDelayed(batch, refused);
                }
                tracing::debug!(?errors, "claim conflict; listing again");
                return Claim::Relist;
            }
            Ok(Guarded::TooLarge(why)) => return Claim::TooLarge(batch, why),
            Err(err) => {
                tracing::warn!(error = %err, "claim failed");
                return Claim::Relist;
            }
        };
        for done in finished.drain(..deletions) {
            self.log_completed(leadership, &done, &entries);
        }
        let mut claimed = Vec::with_capacity(batch.len());
        for (task, value) in batch.into_iter().zip(values) {
            // Each task's check-index result carries its old index; its lock result, which
            // comes after, carries the claim's.
            let claim_index = entries
                .iter()
                .rev()
                .find(|e| e.key == task.key)
                .map_or(0, |e| e.modify_index);
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

    /// Unlocks claimed tasks whose handlers never started, restoring their value, so they
    /// go back to the queue without using an attempt. Only this session's own locks are
    /// touched, so no leader check is needed.
    async fn release_unstarted(&self, leadership: &Leadership, unstarted: Vec<(Claimed, u64)>) {
        if unstarted.is_empty() {
            return;
        }
        let mut groups: Vec<[TxnOp; 2]> = Vec::with_capacity(unstarted.len());
        for (claimed, claim_index) in &unstarted {
            let task = &claimed.task;
            groups.push([
                TxnOp::CheckIndex {
                    key: task.key.clone(),
                    index: *claim_index,
                },
                TxnOp::Unlock {
                    key: task.key.clone(),
                    value: task.with(&[]),
                    session: leadership.session.clone(),
                },
            ]);
        }
        let lens: Vec<usize> = groups
            .iter()
            .map(|group| group.iter().map(TxnOp::encoded_len).sum())
            .collect();
        for range in plan::chunks(None, &lens, 2, TxnLimits::CONSUL) {
            let ops: Vec<TxnOp> = groups[range].iter().flatten().cloned().collect();
            if let Err(err) = self.client.txn(&ops).await {
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
                    ending = Some(LeadEnd::StepDown("session not renewed within its TTL".into()));
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

    /// `entries` are the committed transaction's results; the first is the leader key as
    /// the commit saw it, so its LockIndex is the fencing token that was current when the
    /// task was deleted. Logging both lets an audit prove no stale leader completed a task.
    fn log_completed(&self, leadership: &Leadership, done: &Finished, entries: &[KvPair]) {
        let task = &done.task;
        let leader_lock_index = entries
            .first()
            .filter(|entry| entry.key == self.leader_key)
            .map_or(0, |entry| entry.lock_index);
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
    /// Returns the task back when its deletion could not be recorded (Consul unreachable),
    /// so that the caller retries it: a finished task is never mistaken for a cut-short one.
    async fn complete(&self, leadership: &Leadership, done: Finished) -> Option<Finished> {
        let task = &done.task;
        let ops = vec![TxnOp::DeleteCas {
            key: task.key.clone(),
            index: done.claim_index,
        }];
        match self.guarded(leadership, ops).await {
            Ok(Guarded::Done(entries)) => self.log_completed(leadership, &done, &entries),
            Ok(Guarded::Conflict(_)) => {
                tracing::info!(task_key = %task.key, "task completed, but a producer rewrote it meanwhile; the new version stays queued");
                self.release_current(leadership, &task.key).await;
            }
            Ok(Guarded::NotLeader) => {
                tracing::warn!(task_key = %task.key, "task completed after this replica lost leadership; the next leader will run it again");
            }
            Ok(Guarded::TooLarge(why)) => {
                // One deletion cannot be too large for any Consul; should one refuse it, the
                // task stays locked by this session and the next listing runs it again.
                tracing::error!(task_key = %task.key, error = %why, "cannot record the completed task: Consul refused its deletion as too large");
            }
            Err(err) => {
                tracing::warn!(task_key = %task.key, error = %err, "cannot record the completed task yet; retrying");
                return Some(done);
            }
        }
        None
    }

    /// Deletes finished tasks, as few transactions as the limits allow; if one of them was
    /// rewritten meanwhile, each of its transaction's tasks is completed on its own so the
    /// rewritten one is released, not deleted. Returns those whose deletion could not be
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
        let lens: Vec<usize> = finished
            .iter()
            .map(|done| done.deletion().encoded_len())
            .collect();
        let guard = self.guard(leadership).encoded_len();
        let mut finished = finished.into_iter();
        for range in plan::chunks(Some(guard), &lens, 1, TxnLimits::CONSUL) {
            let group: Vec<Finished> = finished.by_ref().take(range.len()).collect();
            let ops = group.iter().map(Finished::deletion).collect();
            match self.guarded(leadership, ops).await {
                Ok(Guarded::Done(entries)) => {
                    for done in &group {
                        self.log_completed(leadership, done, &entries);
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

    /// Writes `value` and unlocks the task, if it is still the version this run claimed.
    /// A value too large to write back sends the task to dead-letter instead.
    async fn settle(
        &self,
        leadership: &Leadership,
        task: &Task,
        claim_index: u64,
        value: Vec<u8>,
        what: &str,
    ) {
        let ops = vec![
            TxnOp::CheckIndex {
                key: task.key.clone(),
                index: claim_index,
            },
            TxnOp::Unlock {
                key: task.key.clone(),
                value: value.clone(),
                session: leadership.session.clone(),
            },
        ];
        match self.guarded(leadership, ops).await {
            Ok(Guarded::Done(_)) => {}
            Ok(Guarded::Conflict(_)) => self.release_current(leadership, &task.key).await,
            Ok(Guarded::TooLarge(why)) => {
                let pair = pair_of(task, value, claim_index);
                let reason = format!("cannot {what}: the task is too large to write back: {why}");
                if let Err(end) = self.dead_letter(leadership, &pair, &reason).await {
                    tracing::warn!(task_key = %task.key, ?end, "cannot dead-letter a task too large to {what}; the task is requeued when this session ends");
                }
            }
            Ok(Guarded::NotLeader) => {
                tracing::warn!(task_key = %task.key, "cannot {what}: leadership lost; the task is requeued when this session ends")
            }
            Err(err) => {
                tracing::warn!(task_key = %task.key, error = %err, "cannot {what}; the task is requeued when this session ends")
            }
        }
    }

    /// Unlocks a task a producer rewrote while it ran, keeping the producer's value.
    async fn release_current(&self, leadership: &Leadership, key: &str) {
        for _ in 0..RELEASE_ATTEMPTS {
            let current = match self.client.kv_get(key, QueryOptions::default()).await {
                Ok((Some(current), _)) => current,
                Ok((None, _)) => return,
                Err(err) => {
                    tracing::warn!(task_key = %key, error = %err, "cannot read a rewritten task");
                    return;
                }
            };
            if current.session.as_deref() != Some(leadership.session.as_str()) {
                return;
            }
            let ops = vec![
                TxnOp::CheckIndex {
                    key: key.to_string(),
                    index: current.modify_index,
                },
                TxnOp::Unlock {
                    key: key.to_string(),
                    value: current.value.clone(),
                    session: leadership.session.clone(),
                },
            ];
            match self.guarded(leadership, ops).await {
                Ok(Guarded::Conflict(_)) => continue,
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
    /// Deletes the version this run claimed, and only that one.
    fn deletion(&self) -> TxnOp {
        TxnOp::DeleteCas {
            key: self.task.key.clone(),
            index: self.claim_index,
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
    /// claim transaction would be `body` bytes.
    TooLarge { task: Box<Task>, body: usize },
}

/// A task's claim, prepared: the value it writes and its two ops (the check that the task
/// is as read, and the lock that writes the value).
struct Candidate {
    value: Vec<u8>,
    ops: [TxnOp; 2],
}

impl Candidate {
    fn new(task: &Task, leadership: &Leadership, node_id: &str, now: DateTime<Utc>) -> Candidate {
        let value = task.claimed(&leadership.session, node_id, now);
        let ops = [
            TxnOp::CheckIndex {
                key: task.key.clone(),
                index: task.modify_index,
            },
            TxnOp::Lock {
                key: task.key.clone(),
                value: value.clone(),
                session: leadership.session.clone(),
            },
        ];
        Candidate { value, ops }
    }

    fn encoded_len(&self) -> usize {
        self.ops.iter().map(TxnOp::encoded_len).sum()
    }
}

/// A task as an entry again, with `value` and at `index`, to move it to dead-letter.
fn pair_of(task: &Task, value: Vec<u8>, index: u64) -> KvPair {
    KvPair {
        key: task.key.clone(),
        value,
        flags: 0,
        session: None,
        lock_index: 0,
        create_index: task.create_index,
        modify_index: index,
    }
}

/// A claimed task and the value its claim wrote (what the handler gets).
struct Claimed {
    task: Box<Task>,
    value: Vec<u8>,
}

/// The result of one claim transaction.
enum Claim {
    /// Claimed, in order, each with its claim's ModifyIndex.
    Claimed(Vec<(Claimed, u64)>),
    /// The listing is stale (a claim conflict or an error): list again.
    Relist,
    /// Consul refused the transaction as too large; nothing was applied.
    TooLarge(Vec<Task>, String),
    /// Only the locks of these tasks (indexes into the batch) failed, under another
    /// session's lock-delay; nothing was applied.
    LockDelayed(Vec<Task>, Vec<usize>),
    End(LeadEnd),
}

/// How one handler run went: how long it took, and whether leadership ends.
struct RunOutcome {
    elapsed: Duration,
    end: Option<LeadEnd>,
}
