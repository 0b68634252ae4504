//! The leader's work on the task queue: list pending tasks with a blocking query, claim
//! them in `taskTime` order, run their handlers, then complete, retry or dead-letter them;
//! requeue tasks whose replica died; dead-letter what cannot run.
//!
//! Every write is one transaction that first checks, with `check-session` on the leader key,
//! that this replica still leads, so a deposed leader can never claim, complete or move a
//! task. Leadership itself is `election.rs`'s business.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::config::QueueSettings;
use crate::consul::{self, Client, KvPair, QueryOptions, TxnError, TxnOp, TxnOutcome, WatchIndex};
use crate::election::{Leadership, Lease};
use crate::handler::{Registry, TaskContext};
use crate::key::Key;
use crate::observe::Metrics;
use crate::task::{dead_letter, Status, Task};

/// Back-off after Consul errors while leading, so an outage is not a hot loop.
const ERROR_BACKOFF: Duration = Duration::from_secs(1);
/// A handler run shorter than this lets the next claim take a batch.
const FAST_HANDLER: Duration = Duration::from_millis(5);
/// Tasks claimed from one listing before listing again, so that a task queued meanwhile
/// with an earlier taskTime waits at most this many runs.
const MAX_TASKS_PER_LISTING: usize = 256;
/// How many times a completion re-reads a task that a producer keeps rewriting.
const RELEASE_ATTEMPTS: usize = 5;

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
        let mut foreign_logged: HashSet<String> = HashSet::new();
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
            match self.pick(leadership, entries, &mut foreign_logged).await {
                Ok(Pick::Run(tasks)) => {
                    let (end, left) = self.work_through(leadership, lease, shutdown, tasks).await;
                    unrecorded = left;
                    if let Some(end) = end {
                        return end;
                    }
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

    /// Sorts the listing out: dead-letters what cannot run, requeues orphans, and returns
    /// the pending tasks in claim order.
    async fn pick(
        &self,
        leadership: &Leadership,
        entries: Vec<KvPair>,
        foreign_logged: &mut HashSet<String>,
    ) -> Result<Pick, LeadEnd> {
        let now = Utc::now();
        let mut pending: Vec<Task> = Vec::new();
        let mut earliest: Option<DateTime<Utc>> = None;
        let mut changed = false;
        let (mut in_flight, mut delayed) = (0, 0);
        for pair in entries {
            // A key that breaks the key rule could not be addressed safely (a `..` segment
            // resolves elsewhere in a URL): such a task is not run but dead-lettered.
            if let Err(invalid) = Key::within(&pair.key, &[&self.settings.prefix]) {
                if pair.session.is_none() {
                    let reason = format!("the key is not a valid task key: {invalid}");
                    self.dead_letter(leadership, &pair, &reason).await?;
                    changed = true;
                }
                continue;
            }
            let task = match Task::parse(&pair) {
                Ok(task) => task,
                Err(invalid) => {
                    if pair.session.is_none() {
                        self.dead_letter(leadership, &pair, &invalid.to_string())
                            .await?;
                        changed = true;
                    }
                    continue;
                }
            };
            match task.status(now) {
                Status::Pending if self.registry.get(&task.task_type).is_none() => {
                    let reason = format!("no handler for taskType {:?}", task.task_type);
                    self.dead_letter(leadership, &pair, &reason).await?;
                    changed = true;
                }
                Status::Pending => pending.push(task),
                Status::Delayed(at) => {
                    delayed += 1;
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
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
                    changed = true;
                }
                Status::InFlight => in_flight += 1,
                Status::Orphan => {
                    self.requeue(leadership, &task, "the replica running the task died")
                        .await?;
                    changed = true;
                }
                Status::Foreign => {
                    if foreign_logged.insert(task.key.clone()) {
                        tracing::warn!(task_key = %task.key, "task is marked taken by a program other than leaderq; leaving it alone");
                    }
                }
            }
        }
        self.metrics.queue_depth(pending.len(), in_flight, delayed);
        pending.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        if !pending.is_empty() {
            return Ok(Pick::Run(pending));
        }
        if changed {
            return Ok(Pick::Again);
        }
        Ok(earliest.map_or(Pick::Nothing, Pick::WaitUntil))
    }

    /// Runs `ops` after the leader check, in one transaction.
    async fn guarded(
        &self,
        leadership: &Leadership,
        ops: Vec<TxnOp>,
    ) -> Result<Guarded, consul::Error> {
        let mut all = vec![TxnOp::CheckSession {
            key: self.leader_key.clone(),
            session: leadership.session.clone(),
        }];
        all.extend(ops);
        let outcome = self
            .client
            .txn(&all)
            .await
            .inspect_err(|err| self.metrics.consul_error(err))?;
        match outcome {
            TxnOutcome::Committed(entries) => Ok(Guarded::Done(entries)),
            TxnOutcome::RolledBack(errors) if errors.iter().any(|e| e.op_index == 0) => {
                Ok(Guarded::NotLeader)
            }
            TxnOutcome::RolledBack(errors) => Ok(Guarded::Conflict(errors)),
        }
    }

    /// A guarded write whose conflicts are not this replica's problem; a lost leader check
    /// or a Consul error ends the leadership.
    async fn guarded_or_step_down(
        &self,
        leadership: &Leadership,
        ops: Vec<TxnOp>,
        what: &str,
    ) -> Result<Option<Vec<KvPair>>, LeadEnd> {
        match self.guarded(leadership, ops).await {
            Ok(Guarded::Done(entries)) => Ok(Some(entries)),
            Ok(Guarded::NotLeader) => Err(LeadEnd::StepDown(format!(
                "lost leadership while trying to {what}"
            ))),
            Ok(Guarded::Conflict(errors)) => {
                tracing::debug!(
                    ?errors,
                    "{what}: the task changed meanwhile; will look again"
                );
                Ok(None)
            }
            Err(err) => Err(LeadEnd::StepDown(format!("cannot {what}: {err}"))),
        }
    }

    fn dead_key(&self, key: &str) -> String {
        crate::key::dead_letter_key(&self.settings.prefix, &self.settings.dead_prefix, key).into()
    }

    async fn dead_letter(
        &self,
        leadership: &Leadership,
        pair: &KvPair,
        reason: &str,
    ) -> Result<(), LeadEnd> {
        let ops = vec![
            TxnOp::DeleteCas {
                key: pair.key.clone(),
                index: pair.modify_index,
            },
            TxnOp::Set {
                key: self.dead_key(&pair.key),
                value: dead_letter(pair, reason, Utc::now()),
            },
        ];
        if self
            .guarded_or_step_down(leadership, ops, "dead-letter a task")
            .await?
            .is_some()
        {
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
                dead_key = %self.dead_key(&pair.key),
                reason,
                fencing_token = leadership.fencing_token,
                "task moved to the dead-letter prefix"
            );
        }
        Ok(())
    }

    /// Puts a task whose run was cut short back in the queue as a failed attempt (or
    /// dead-letters it when its attempts are used up).
    async fn requeue(
        &self,
        leadership: &Leadership,
        task: &Task,
        reason: &str,
    ) -> Result<(), LeadEnd> {
        let attempts = task.attempts + 1;
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
                    value,
                    session: session.clone(),
                },
            ],
            None => vec![TxnOp::Cas {
                key: task.key.clone(),
                value,
                index: task.modify_index,
            }],
        };
        if self
            .guarded_or_step_down(leadership, ops, "requeue a task")
            .await?
            .is_some()
        {
            tracing::warn!(task_key = %task.key, task_type = %task.task_type, attempt = attempts, reason, "task requeued");
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
        let pair = KvPair {
            key: task.key.clone(),
            value: task.with(&[
                ("attempts", serde_json::json!(attempts)),
                ("lastError", serde_json::Value::String(error.to_string())),
            ]),
            flags: 0,
            session: None,
            lock_index: 0,
            create_index: task.create_index,
            modify_index: index,
        };
        let reason = format!("failed {attempts} times; last error: {error}");
        self.dead_letter(leadership, &pair, &reason).await
    }

    /// Works through one listing's pending tasks in claim order. Tasks are claimed one at a
    /// time, or in batches of up to `claim_batch` while handlers finish fast; each claim's
    /// check-index catches a task that changed since the listing, and a conflict sends the
    /// leader back to list again. Finished tasks are deleted in the next claim's transaction.
    async fn work_through(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
        tasks: Vec<Task>,
    ) -> (Option<LeadEnd>, Vec<Finished>) {
        let mut pending: std::collections::VecDeque<Task> =
            tasks.into_iter().take(MAX_TASKS_PER_LISTING).collect();
        let mut finished: Vec<Finished> = Vec::new();
        let mut fast = false;
        let mut end = None;
        'listing: while !pending.is_empty() {
            if let Some(stop) = self.must_stop(lease, shutdown) {
                end = Some(stop);
                break;
            }
            let size = if fast {
                self.settings.claim_batch.min(pending.len())
            } else {
                1
            };
            let batch: Vec<Task> = pending.drain(..size).collect();
            let claimed = match self.claim_batch(leadership, batch, &mut finished).await {
                Claim::Claimed(claimed) => claimed,
                Claim::Relist => break,
                Claim::End(stop) => {
                    end = Some(stop);
                    break;
                }
            };
            let mut claimed = claimed.into_iter();
            while let Some((task, claim_index)) = claimed.next() {
                // "Renew between tasks": a batch claimed ahead still runs only while the lease
                // is fresh; what did not start goes back untouched.
                let stop = match self.must_stop(lease, shutdown) {
                    Some(stop) => Some(stop),
                    None => {
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
                        fast = run.elapsed < FAST_HANDLER;
                        // Past a slow run, finished tasks are recorded at once rather than
                        // at the next claim, which keeps the window in which a crash makes
                        // them run again short.
                        if !fast && !finished.is_empty() {
                            let left = self
                                .complete_all(leadership, std::mem::take(&mut finished))
                                .await;
                            finished = left;
                        }
                        run.end
                    }
                };
                if let Some(stop) = stop {
                    self.release_unstarted(leadership, claimed.collect()).await;
                    end = Some(stop);
                    break 'listing;
                }
            }
        }
        let unrecorded = self.complete_all(leadership, finished).await;
        (end, unrecorded)
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

    /// Claims `batch` in one transaction that also deletes the `finished` tasks.
    async fn claim_batch(
        &self,
        leadership: &Leadership,
        batch: Vec<Task>,
        finished: &mut Vec<Finished>,
    ) -> Claim {
        let now = Utc::now();
        let values: Vec<Vec<u8>> = batch
            .iter()
            .map(|task| task.claimed(&leadership.session, &self.node_id, now))
            .collect();
        let mut ops = Vec::with_capacity(finished.len() + 2 * batch.len());
        // Finished tasks are deleted in this claim's transaction: one commit, not two. It
        // is applied only if the whole claim is.
        for done in finished.iter() {
            ops.push(TxnOp::DeleteCas {
                key: done.task.key.clone(),
                index: done.claim_index,
            });
        }
        for (task, value) in batch.iter().zip(&values) {
            ops.push(TxnOp::CheckIndex {
                key: task.key.clone(),
                index: task.modify_index,
            });
            ops.push(TxnOp::Lock {
                key: task.key.clone(),
                value: value.clone(),
                session: leadership.session.clone(),
            });
        }
        let entries = match self.guarded(leadership, ops).await {
            Ok(Guarded::Done(entries)) => entries,
            // Nothing was applied; the finished tasks are completed on their own later.
            Ok(Guarded::NotLeader) => {
                return Claim::End(LeadEnd::StepDown("lost leadership at claim".into()))
            }
            Ok(Guarded::Conflict(errors)) => {
                self.metrics.claim_conflicts.inc();
                tracing::debug!(?errors, "claim conflict; listing again");
                return Claim::Relist;
            }
            Err(err) => {
                tracing::warn!(error = %err, "claim failed");
                return Claim::Relist;
            }
        };
        for done in finished.drain(..) {
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
            let attempt = task.attempts + 1;
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
        let mut ops = Vec::with_capacity(unstarted.len() * 2);
        for (claimed, claim_index) in &unstarted {
            let task = &claimed.task;
            ops.push(TxnOp::CheckIndex {
                key: task.key.clone(),
                index: *claim_index,
            });
            ops.push(TxnOp::Unlock {
                key: task.key.clone(),
                value: task.with(&[]),
                session: leadership.session.clone(),
            });
        }
        if let Err(err) = self.client.txn(&ops).await {
            tracing::warn!(error = %err, "cannot release tasks claimed but not started; the next leader requeues them");
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
            attempt = task.attempts + 1,
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
            Err(err) => {
                tracing::warn!(task_key = %task.key, error = %err, "cannot record the completed task yet; retrying");
                return Some(done);
            }
        }
        None
    }

    /// Deletes finished tasks in one transaction; if one of them was rewritten meanwhile,
    /// each is completed on its own so the rewritten one is released, not deleted. Returns
    /// those whose deletion could not be recorded yet.
    async fn complete_all(
        &self,
        leadership: &Leadership,
        finished: Vec<Finished>,
    ) -> Vec<Finished> {
        if finished.len() <= 1 {
            let mut left = Vec::new();
            for done in finished {
                left.extend(self.complete(leadership, done).await);
            }
            return left;
        }
        let ops = finished
            .iter()
            .map(|done| TxnOp::DeleteCas {
                key: done.task.key.clone(),
                index: done.claim_index,
            })
            .collect();
        match self.guarded(leadership, ops).await {
            Ok(Guarded::Done(entries)) => {
                for done in &finished {
                    self.log_completed(leadership, done, &entries);
                }
                Vec::new()
            }
            _ => {
                let mut left = Vec::new();
                for done in finished {
                    left.extend(self.complete(leadership, done).await);
                }
                left
            }
        }
    }

    /// Writes `value` and unlocks the task, if it is still the version this run claimed.
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
                value,
                session: leadership.session.clone(),
            },
        ];
        match self.guarded(leadership, ops).await {
            Ok(Guarded::Done(_)) => {}
            Ok(Guarded::Conflict(_)) => self.release_current(leadership, &task.key).await,
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
    /// Pending tasks in claim order.
    Run(Vec<Task>),
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
    End(LeadEnd),
}

/// How one handler run went: how long it took, and whether leadership ends.
struct RunOutcome {
    elapsed: Duration,
    end: Option<LeadEnd>,
}
