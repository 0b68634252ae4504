//! Claiming: the one claim write the driver makes (`driver.rs`, through `flights.rs`). Each
//! claim is planned within the coordinator's limits (`plan.rs`), its answer read
//! (`answer.rs`: claimed, step down, list again, or per task put back, deferred or read
//! again) and applied here ([`Queue::claim_and_apply`]); finished tasks ride along in the
//! next claim, and claims that did not start are put back.

use std::time::Duration;

use super::answer::{after_refusal, fates, read_answer, ClaimAnswer, Fate, Refusal};
use super::backlog::Backlog;
use super::dead::DEFERRED_RETRY;
use super::entry::{pair_of, UnansweredClaim};
use super::finished::{completions, mark_unanswered, ride_able, riders, Finished};
use super::plan::{chunks, plan_claim, ClaimPlan};
use super::run::Claimed;
use super::work::Work;
use super::{Applied, LeadEnd, Queue};
use crate::coord::{
    CoordError, Edit, FencingToken, Leadership, LeaseId, StoredTask, TaskOp, TaskVersion, Version,
    WriteCost, Written,
};
use crate::task::Task;

/// A task's claim, prepared: the value it writes and its op.
pub(super) struct Candidate {
    value: Vec<u8>,
    op: TaskOp,
}

impl Candidate {
    pub(super) fn new(
        task: &Task,
        leadership: &Leadership,
        node_id: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Candidate {
        let value = task.claimed(&leadership.lease.0, node_id, now);
        let op = TaskOp::Claim {
            key: task.key.clone(),
            version: task.version,
            value: value.clone(),
        };
        Candidate { value, op }
    }

    /// The claim's op, to cost it.
    pub(super) fn op(&self) -> &TaskOp {
        &self.op
    }
}

/// One claim write, ready: the tasks in claim order, their prepared claims, and how many
/// of the finished tasks' completions ride along (the first `deletions`).
pub(super) struct Batch {
    pub(super) tasks: Vec<Task>,
    pub(super) candidates: Vec<Candidate>,
    pub(super) deletions: usize,
    /// Other writes of the same commit: the rated types' start records (`rates.rs`).
    pub(super) notes: Vec<TaskOp>,
}

/// The next claim, planned.
pub(super) enum Planned {
    /// Claim the batch's tasks; the first `deletions` finished tasks ride along.
    Batch(Batch),
    /// The first pending task, taken out of the backlog, cannot be claimed even alone: its
    /// claim would cost `cost`.
    TooLarge { task: Box<Task>, cost: WriteCost },
}

/// What one claim write did.
pub(super) enum Claim {
    /// Claimed, in order, each with its claim's version; the riders' completions were
    /// written under `fencing_token`.
    Claimed {
        runs: Vec<(Claimed, TaskVersion)>,
        fencing_token: FencingToken,
    },
    /// The listing is stale (a claim conflict or an error): list again.
    Relist,
    /// Only the batch's own claims failed, on `keys`: moved (read again, they hold
    /// `current`) or refused for a while; nothing was applied. Each task's fate is decided
    /// (`answer::fates`).
    Conflicted {
        batch: Vec<Task>,
        keys: Vec<String>,
        current: Vec<StoredTask>,
        fates: Vec<Fate>,
    },
    /// The write's answer never came: it may have been applied. List again; the tasks
    /// (claimed as `values` say) are remembered until the next read of their keys.
    Unanswered {
        batch: Vec<Task>,
        values: Vec<Vec<u8>>,
    },
    /// The coordinator refused the write as too large; nothing was applied.
    TooLarge(Vec<Task>, String),
    End(LeadEnd),
}

/// What one claim write started, once its answer is applied to the backlog.
pub(super) enum Started {
    /// These runs start (possibly none: the tasks were deferred, put back or moved).
    Runs(Vec<(Claimed, TaskVersion)>),
    /// The listing is stale: list again (once the runs in progress are over).
    Relist,
    End(LeadEnd),
}

impl Queue {
    /// Plans the next claim: prepares claims of up to `max_tasks` pending tasks while they
    /// fit one write, with as many of the `finished` completions as leave room; or, when
    /// the first task cannot be claimed even alone, takes that task out of the backlog.
    pub(super) fn plan_batch(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        finished: &[Finished],
        max_tasks: usize,
    ) -> Planned {
        let now = self.clock().now();
        let finished = ride_able(finished);
        let (guard, shares) = riders(self.coord.guard_cost(), finished);
        let limits = self.coord.limits();
        // Claims are prepared one at a time and only while they fit: preparing one writes
        // the task's whole value, which is worth skipping for large values.
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut tasks: Vec<Task> = Vec::new();
        let mut claims: Vec<WriteCost> = Vec::new();
        let mut plan = ClaimPlan::Take {
            finished: 0,
            tasks: 0,
        };
        for task in backlog.pending().take(max_tasks) {
            if self.registry.has_rate(&task.task_type) {
                break; // Claimed where its rate is counted (`slots.rs`), after a listing.
            }
            let candidate = Candidate::new(&task, leadership, &self.node_id, now);
            claims.push(self.coord.cost(&candidate.op));
            let next = plan_claim(guard, &shares, &claims, max_tasks, limits);
            match next {
                ClaimPlan::Take { tasks: n, .. } if n == claims.len() => {
                    candidates.push(candidate);
                    tasks.push(task);
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
            ClaimPlan::Take { finished, .. } => {
                // The batch is the tasks just read, first in claim order.
                backlog.take_read(tasks.len());
                Planned::Batch(Batch {
                    tasks,
                    candidates,
                    deletions: finished,
                    notes: Vec::new(),
                })
            }
            ClaimPlan::TooLarge { cost } => match backlog.take_first() {
                Some(task) => Planned::TooLarge {
                    task: Box::new(task),
                    cost,
                },
                None => Planned::Batch(Batch {
                    tasks: Vec::new(),
                    candidates: Vec::new(),
                    deletions: 0,
                    notes: Vec::new(),
                }),
            },
        }
    }

    /// Claims `batch` in one write (completing its riders) and applies the answer to the
    /// work: forgets the completed keys; on a conflict on the batch's own tasks puts each
    /// back, defers it (refused for a while) or takes it as read again; after a refusal as
    /// too large goes one task at a time (`alone`: it already does) or dead-letters the
    /// task that was alone in its write. Answers the runs to start.
    pub(super) async fn claim_and_apply(
        &self,
        leadership: &Leadership,
        work: &mut Work<'_>,
        batch: Batch,
        alone: bool,
    ) -> Started {
        let riders: Vec<Finished> = work.finished.drain(..batch.deletions).collect();
        let claim = self.claim_batch(leadership, batch, &riders).await;
        self.apply_claim(leadership, work, claim, riders, alone)
            .await
    }

    /// Applies a claim write's answer to the work: on success its `riders` are completed
    /// and forgotten; if nothing was applied they go back in front of the finished; then
    /// as [`Queue::claim_and_apply`] says.
    pub(super) async fn apply_claim(
        &self,
        leadership: &Leadership,
        work: &mut Work<'_>,
        claim: Claim,
        mut riders: Vec<Finished>,
        alone: bool,
    ) -> Started {
        let deletions = riders.len();
        if let Claim::Unanswered { .. } = claim {
            // Perhaps applied: their records tell, before they are written again.
            mark_unanswered(&self.settings.done_prefix, &mut riders);
        }
        if !matches!(claim, Claim::Claimed { .. }) {
            // Nothing was applied (or, unanswered, perhaps all was): the riders are
            // completed later, first of the finished.
            work.finished.splice(0..0, std::mem::take(&mut riders));
        }
        match claim {
            Claim::Claimed {
                runs,
                fencing_token,
            } => {
                for done in riders {
                    self.log_completed(leadership, &done, fencing_token);
                    work.backlog.forget(&done.task.key);
                }
                Started::Runs(runs)
            }
            Claim::Relist => Started::Relist,
            Claim::Unanswered { batch, values } => {
                for (task, claimed) in batch.into_iter().zip(values) {
                    let before = task.with(&[]);
                    work.memory
                        .unanswered
                        .insert(task.key, UnansweredClaim { claimed, before });
                }
                Started::Relist
            }
            Claim::End(stop) => Started::End(stop),
            Claim::Conflicted {
                batch,
                keys,
                current,
                fates,
            } => {
                self.apply_conflict(leadership, work, batch, &keys, current, fates)
                    .await
            }
            Claim::TooLarge(batch, why) => match after_refusal(batch.len(), deletions, alone) {
                Refusal::OneAtATime => {
                    tracing::warn!(error = %why, "the coordinator refused a claim as too large; claiming one task at a time");
                    work.single = true;
                    let done = std::mem::take(&mut work.finished);
                    work.finished = self
                        .complete_known(leadership, &mut work.backlog, done)
                        .await;
                    work.backlog.put_back(batch);
                    Started::Runs(Vec::new())
                }
                Refusal::DeadLetter => {
                    self.dead_letter_refused(leadership, work, batch, &why)
                        .await
                }
            },
        }
    }

    /// Applies a conflict on the batch's own claims (`Claim::Conflicted`): each task is put
    /// back, steps aside for a while, or is taken as read again (`current`).
    async fn apply_conflict(
        &self,
        leadership: &Leadership,
        work: &mut Work<'_>,
        batch: Vec<Task>,
        keys: &[String],
        current: Vec<StoredTask>,
        fates: Vec<Fate>,
    ) -> Started {
        let until =
            self.clock().now() + chrono::Duration::from_std(DEFERRED_RETRY).unwrap_or_default();
        let deferred = fates.contains(&Fate::Defer);
        for (task, fate) in batch.into_iter().zip(fates) {
            match fate {
                Fate::PutBack => work.backlog.put_back_one(task),
                // The coordinator refuses this key for a while (a dead lease's takeover
                // delay): it steps aside, the tasks after it go first.
                Fate::Defer => {
                    tracing::info!(task_key = %task.key, retry_in = %crate::util::duration::format(DEFERRED_RETRY), "task refused for a while by the coordinator; claiming the next ones meanwhile");
                    work.memory.deferred.insert(task.key.clone(), until);
                    work.backlog.defer(vec![task], until);
                }
                Fate::ReadAgain => {}
            }
        }
        if deferred {
            return Started::Runs(Vec::new());
        }
        // Only tasks of this batch moved since they were read: they take their new places
        // (or go, if deleted) without listing the whole queue.
        tracing::debug!(
            ?keys,
            "claim conflict; taking the moved tasks as read again"
        );
        for key in keys {
            work.backlog.forget(key);
        }
        let now = self.clock().now();
        match self.sort_out(leadership, current, work.memory, now).await {
            Ok(sorted) => {
                work.backlog
                    .learn(sorted.keys, sorted.pending.into_pending(), sorted.delayed);
                Started::Runs(Vec::new())
            }
            Err(stop) => Started::End(stop),
        }
    }

    /// Dead-letters the task that was alone in a write the coordinator refused as too large.
    async fn dead_letter_refused(
        &self,
        leadership: &Leadership,
        work: &mut Work<'_>,
        mut batch: Vec<Task>,
        why: &str,
    ) -> Started {
        let Some(task) = batch.pop() else {
            return Started::Runs(Vec::new());
        };
        let reason = format!("too large to claim: the coordinator refused its claim: {why}");
        let pair = pair_of(&task, task.with(&[]), task.version);
        match self.dead_letter(leadership, &pair, &reason).await {
            Ok(_) => {
                work.backlog.forget(&task.key);
                Started::Runs(Vec::new())
            }
            Err(stop) => Started::End(stop),
        }
    }

    /// Claims `batch` in one write that also completes `riders` (its first `deletions`
    /// finished tasks), and reads the answer (`answer.rs`).
    pub(super) async fn claim_batch(
        &self,
        leadership: &Leadership,
        batch: Batch,
        riders: &[Finished],
    ) -> Claim {
        let (tasks, values, ops) = self.claim_ops(batch, riders);
        let written = self.write(leadership, &ops).await;
        self.read_claim(leadership, tasks, values, written).await
    }

    /// A claim write's ops: the riders' completions, then the claims, in order; with the
    /// tasks and the values their claims write.
    pub(super) fn claim_ops(
        &self,
        batch: Batch,
        riders: &[Finished],
    ) -> (Vec<Task>, Vec<Vec<u8>>, Vec<TaskOp>) {
        let Batch {
            tasks,
            candidates,
            deletions,
            notes,
        } = batch;
        let mut ops = Vec::with_capacity(deletions + tasks.len() + notes.len());
        // Finished tasks are completed in this claim's write: one commit, not two. It is
        // applied only if the whole claim is.
        ops.extend(completions(&self.settings.done_prefix, riders));
        let mut values = Vec::with_capacity(candidates.len());
        for candidate in candidates {
            ops.push(candidate.op);
            values.push(candidate.value);
        }
        ops.extend(notes);
        (tasks, values, ops)
    }

    /// Reads a claim write's answer (`answer.rs`) for `batch`, whose claims wrote `values`.
    pub(super) async fn read_claim(
        &self,
        leadership: &Leadership,
        batch: Vec<Task>,
        values: Vec<Vec<u8>>,
        written: Result<Written, CoordError>,
    ) -> Claim {
        let written = match written {
            Ok(written) => written,
            Err(CoordError::Refused(why)) => return Claim::TooLarge(batch, why),
            Err(err) => {
                tracing::warn!(error = %err, "claim failed");
                return Claim::Unanswered { batch, values };
            }
        };
        let answer = read_answer(&batch, written);
        let (versions, fencing_token) = match answer {
            ClaimAnswer::Claimed {
                versions,
                fencing_token,
            } => (versions, fencing_token),
            // Nothing was applied; the finished tasks are completed on their own later.
            ClaimAnswer::NotLeader => {
                return Claim::End(LeadEnd::StepDown("lost leadership at claim".into()))
            }
            ClaimAnswer::Relist => {
                self.metrics.claim_conflicts.inc();
                tracing::debug!("claim conflict; listing again");
                return Claim::Relist;
            }
            ClaimAnswer::ReadAgain(ref keys) => {
                self.metrics.claim_conflicts.inc();
                let current = match self.coord.get(keys).await {
                    Ok(current) => current,
                    Err(err) => {
                        self.metrics.coordinator_error(&err);
                        tracing::warn!(error = %err, "cannot read tasks that moved; listing again");
                        return Claim::Relist;
                    }
                };
                return Claim::Conflicted {
                    fates: fates(&batch, &answer),
                    keys: keys.clone(),
                    batch,
                    current,
                };
            }
            // Refused for a while, not moved: nothing to read.
            ClaimAnswer::Deferred(ref keys) => {
                return Claim::Conflicted {
                    fates: fates(&batch, &answer),
                    keys: keys.clone(),
                    batch,
                    current: Vec::new(),
                };
            }
        };
        Claim::Claimed {
            runs: self.log_claimed(leadership, batch, values, versions),
            fencing_token,
        }
    }

    /// The tasks of a claim that held, each with the value its claim wrote and its claim's
    /// version, counted and logged.
    fn log_claimed(
        &self,
        leadership: &Leadership,
        batch: Vec<Task>,
        values: Vec<Vec<u8>>,
        versions: Vec<TaskVersion>,
    ) -> Vec<(Claimed, TaskVersion)> {
        let mut claimed = Vec::with_capacity(batch.len());
        for ((task, value), claimed_version) in batch.into_iter().zip(values).zip(versions) {
            let attempt = task.run_number();
            self.metrics.claimed(&task.task_type);
            tracing::info!(
                task_key = %task.key,
                task_id = %task.id,
                task_type = %task.task_type,
                attempt,
                fencing_token = leadership.fencing_token.0,
                "task claimed"
            );
            claimed.push((
                Claimed {
                    task: Box::new(task),
                    value,
                },
                claimed_version,
            ));
        }
        claimed
    }

    /// After a restart that took this replica's lease up again (before it leads, if it
    /// ever does): every task that lease still holds was a run of the previous process,
    /// gone by now (the replica waits for its handlers at start). Each is put back as a
    /// failed attempt, as the leader would, so that no claim is left held by a live lease
    /// that runs nothing: the next leader starts nothing while one is.
    pub async fn release_previous(&self, lease: &LeaseId) {
        let listed = self
            .coord
            .list(&self.settings.prefix, Version::default(), Duration::ZERO)
            .await;
        let tasks = match listed {
            Ok((tasks, _)) => tasks,
            Err(err) => {
                tracing::warn!(error = %err, "cannot look for tasks the previous process left claimed; the leader requeues them when this lease ends");
                return;
            }
        };
        let reason = "the replica restarted while running the task";
        for stored in tasks.iter().filter(|t| t.holder.as_ref() == Some(lease)) {
            let Ok(task) = Task::parse(stored) else {
                continue;
            };
            let value = task.retried(task.run_number(), reason, self.clock().now());
            let op = [TaskOp::Release {
                key: task.key.clone(),
                version: task.version,
                value,
            }];
            match self.coord.write_own(lease, &op).await {
                Ok(Written::Done { .. }) => {
                    tracing::warn!(task_key = %task.key, reason, "task requeued")
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(task_key = %task.key, error = %err, "cannot put back a task the previous process left claimed; the leader requeues it when this lease ends")
                }
            }
        }
    }

    /// Puts back, as it was before, a task held by a claim of this term whose answer never
    /// came (`Entry::Unanswered`): nothing ran it, so it costs no attempt. A task that
    /// changed meanwhile is left to the next listing.
    pub(super) async fn put_back_unanswered(
        &self,
        leadership: &Leadership,
        task: &Task,
        value: Vec<u8>,
    ) -> Result<(), LeadEnd> {
        let op = [TaskOp::Release {
            key: task.key.clone(),
            version: task.version,
            value,
        }];
        match self
            .write_or_step_down(leadership, &op, "put back a claim whose answer was lost")
            .await?
        {
            Applied::Done => {
                tracing::info!(task_key = %task.key, "a claim whose answer was lost was applied; the task did not run and is back in the queue as it was")
            }
            Applied::Conflict => {}
            // Smaller than the claim that was written: only a coordinator whose limits
            // shrank meanwhile refuses it; the next listing requeues the task.
            Applied::TooLarge(why) => {
                tracing::warn!(task_key = %task.key, error = %why, "cannot put back a claim whose answer was lost")
            }
        }
        Ok(())
    }

    /// Releases claimed tasks whose handlers never started, restoring their value, so they
    /// go back to the queue without using an attempt. Only this lease's own claims are
    /// touched, so no leadership guard is needed; a batch that no longer applies whole
    /// (the lease ended, leaving orphans) is put back task by task.
    pub(super) async fn release_unstarted(
        &self,
        leadership: &Leadership,
        unstarted: Vec<(Claimed, TaskVersion)>,
    ) {
        if unstarted.is_empty() {
            return;
        }
        let ops: Vec<TaskOp> = unstarted
            .iter()
            .map(|(claimed, claimed_version)| TaskOp::Release {
                key: claimed.task.key.clone(),
                version: *claimed_version,
                value: claimed.task.with(&[]),
            })
            .collect();
        let costs: Vec<WriteCost> = ops.iter().map(|op| self.coord.cost(op)).collect();
        let until = self.own_deadline();
        for range in chunks(None, &costs, self.coord.limits()) {
            match self
                .coord
                .write_own(&leadership.lease, &ops[range.clone()])
                .await
            {
                Ok(Written::Done { .. }) => continue,
                Ok(_) => {}
                Err(err) => self.metrics.coordinator_error(&err),
            }
            for op in &ops[range] {
                let TaskOp::Release { key, value, .. } = op else {
                    continue;
                };
                let put_back = |version| {
                    vec![Edit::Replace {
                        key: key.clone(),
                        version,
                        value: value.clone(),
                    }]
                };
                let own = std::slice::from_ref(op);
                if let Err(why) = self
                    .write_own_or_orphan(&leadership.lease, own, put_back, until)
                    .await
                {
                    tracing::warn!(task_key = %key, error = %why, "cannot put back a task claimed but not started; the next leader requeues it");
                }
            }
        }
    }
}
