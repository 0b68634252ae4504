//! Claiming: the driver that works through a listing's backlog in `taskTime` order, and
//! the one claim write both drivers make. Each claim is planned within the coordinator's
//! limits (`plan.rs`), its answer read (`answer.rs`: claimed, step down, list again, or
//! per task put back, deferred or read again) and applied here ([`Queue::claim_and_apply`]);
//! finished tasks ride along in the next claim, and claims that did not start are put back.
//! With one run at a time the driver is here (`drive_one`, which batches the claims of fast
//! handlers and sends each batch's claim while the batch before it runs); with several,
//! `groups.rs`.
//!
//! Size: the one-at-a-time driver, the claim write and the application of its answer are
//! one path, read top to bottom; the releases of unstarted claims close it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::answer::{after_refusal, fates, read_answer, ClaimAnswer, Fate, Refusal};
use super::backlog::{Backlog, Next};
use super::dead::DEFERRED_RETRY;
use super::entry::pair_of;
use super::finished::{completions, riders, Finished};
use super::plan::{chunks, plan_claim, ClaimPlan};
use super::run::{Claimed, Pace};
use super::sort::{Look, Memory, Reading};
use super::{LeadEnd, Queue};
use crate::coord::{
    CoordError, Edit, FencingToken, Leadership, LeaseId, StoredTask, TaskOp, TaskVersion, Version,
    WriteCost, Written,
};
use crate::leader::Lease;
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
}

/// The next claim, planned.
enum Planned {
    /// Claim the batch's tasks; the first `deletions` finished tasks ride along.
    Batch(Batch),
    /// The first pending task, taken out of the backlog, cannot be claimed even alone: its
    /// claim would cost `cost`.
    TooLarge { task: Box<Task>, cost: WriteCost },
}

/// What one claim write did.
enum Claim {
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
    /// The coordinator refused the write as too large; nothing was applied.
    TooLarge(Vec<Task>, String),
    End(LeadEnd),
}

/// How the runs of a claimed batch ended.
enum Ran {
    /// Every task ran, or a slow run sent the rest back and they were read again.
    Done,
    /// What a slow run sent back could not be read again: list again.
    Relist,
    End(LeadEnd),
}

/// A claim write on its way: awaited, its answer and the completions that rode in it.
type Flight<'a> = Pin<Box<dyn Future<Output = (Claim, Vec<Finished>)> + Send + 'a>>;

/// What one claim write started, once its answer is applied to the backlog.
pub(super) enum Started {
    /// These runs start (possibly none: the tasks were deferred, put back or moved).
    Runs(Vec<(Claimed, TaskVersion)>),
    /// The listing is stale: list again (once the runs in progress are over).
    Relist,
    End(LeadEnd),
}

impl Queue {
    /// Works through a listing's backlog: with one run at a time here, claims batched while
    /// handlers are fast; with `queue.concurrency` above 1, up to that many runs at once,
    /// one per `taskGroup` (`groups.rs`). Both make their claims through
    /// [`Queue::claim_and_apply`]. Returns why the leading ends, if it does, and the
    /// completions it could not record.
    pub(super) async fn drive(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
        backlog: Backlog,
        memory: &mut Memory,
    ) -> (Option<LeadEnd>, Vec<Finished>) {
        if self.settings.concurrency > 1 {
            self.drive_groups(leadership, lease, shutdown, backlog, memory)
                .await
        } else {
            self.drive_one(leadership, lease, shutdown, backlog, memory)
                .await
        }
    }

    /// Works through a listing's backlog one run at a time. Before each claim the plan decides: look at the
    /// queue's keys (every LOOK_INTERVAL) for tasks that arrived and retries written back,
    /// list again, or claim. A cheap look is made before the claim; the names of a costly
    /// one, and a listing, are read while the claims go on, and merged (new keys read and
    /// put in their places) before the first claim after they arrive. Retries that fall due join the pending tasks, so the earliest
    /// eligible task known is always claimed next. Tasks are claimed one at a time, or in
    /// batches of up to `claim_batch` while handlers finish fast, each batch within the
    /// coordinator's write limits; a task too large to claim at all is dead-lettered. Each
    /// claim is conditioned on the version read; a conflict on some of the batch's claims
    /// reads just those tasks again (any other conflict sends the leader back to list
    /// again). Finished tasks are completed in the next claim's write.
    async fn drive_one(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
        mut backlog: Backlog,
        memory: &mut Memory,
    ) -> (Option<LeadEnd>, Vec<Finished>) {
        let mut finished: Vec<Finished> = Vec::new();
        let mut pace = Pace::default();
        // After the coordinator refused a batch as too large (a Consul whose limits are
        // below leaderq's), claim one task at a time, alone in its write, until the next
        // listing.
        let mut single = false;
        let mut end = None;
        // A look whose names are being read.
        let mut reading: Option<Reading> = None;
        // The batch claimed while the previous one ran, none of it started yet.
        let mut ahead: Vec<(Claimed, TaskVersion)> = Vec::new();
        // The claim after it, sent before the answer that claimed `ahead` was applied.
        let mut flight: Option<Flight<'_>> = None;
        loop {
            if let Some(stop) = self.must_stop(lease, shutdown) {
                end = Some(stop);
                break;
            }
            if !lease.outlasts(self.lease_rules.claim_headroom) {
                // Renewals are late: a run started now could be cut by its supervisor's
                // kill window. Start and claim nothing until a renewal comes or the lease
                // runs out.
                tracing::warn!(headroom = %crate::util::duration::format(self.lease_rules.claim_headroom), "the lease may not outlast a run's kill sequence; claiming nothing until it is renewed");
                let landed = self
                    .land(
                        leadership,
                        &mut backlog,
                        memory,
                        flight.take(),
                        &mut finished,
                        &mut single,
                    )
                    .await;
                self.release_unstarted(leadership, std::mem::take(&mut ahead))
                    .await;
                if let Some(stop) = landed {
                    end = Some(stop);
                    break;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = lease.until_it_outlasts(self.lease_rules.claim_headroom) => {}
                }
                continue;
            }
            let in_line = match backlog.next(self.clock().now()) {
                Next::Claim => None,
                // A cheap look is made before this claim, so that a task that arrived goes
                // first; a costly one, and a listing, are read while this claim and the
                // next ones are written (the backlog asks for one read at a time).
                Next::Look if backlog.looks_in_line() => Some(self.start_look(&mut backlog)),
                Next::Look => {
                    reading = Some(self.start_look(&mut backlog));
                    None
                }
                Next::Relist => {
                    reading = Some(self.start_relist(&mut backlog));
                    None
                }
                Next::Done if ahead.is_empty() && flight.is_none() => break,
                // The backlog is empty, but the batch claimed ahead is still to run.
                Next::Done => None,
            };
            if let Some(read) = in_line.or_else(|| reading.take_if(|reading| reading.is_ready())) {
                match self
                    .finish_reading(leadership, &mut backlog, memory, read)
                    .await
                {
                    // A pause takes effect between batches: the loop waits it out.
                    Ok(Look::Continue) if self.paused().await => break,
                    // What was read may come first: decide again.
                    Ok(Look::Continue) => continue,
                    Ok(Look::Relist) => break,
                    Err(stop) => {
                        end = Some(stop);
                        break;
                    }
                }
            }
            let (claimed, sent) = match flight.take() {
                Some(sent) => (std::mem::take(&mut ahead), Some(sent)),
                None => {
                    let claimed = if ahead.is_empty() {
                        let max_tasks = if pace.fast() && !single {
                            self.settings.claim_batch
                        } else {
                            1
                        };
                        let riders = if single { 0 } else { finished.len() };
                        let planned = self.plan_batch(
                            leadership,
                            &mut backlog,
                            &finished[..riders],
                            max_tasks,
                        );
                        let batch = match planned {
                            Planned::Batch(batch) => batch,
                            Planned::TooLarge { task, cost } => {
                                match self.dead_letter_too_large(leadership, &task, cost).await {
                                    Ok(_) => backlog.forget(&task.key),
                                    Err(stop) => {
                                        end = Some(stop);
                                        break;
                                    }
                                }
                                continue;
                            }
                        };
                        let alone = single;
                        let started = self
                            .claim_and_apply(
                                leadership,
                                &mut backlog,
                                memory,
                                batch,
                                &mut finished,
                                &mut single,
                                alone,
                            )
                            .await;
                        match started {
                            // Possibly none: the tasks were deferred, put back or read again.
                            Started::Runs(claimed) => claimed,
                            Started::Relist => break,
                            Started::End(stop) => {
                                end = Some(stop);
                                break;
                            }
                        }
                    } else {
                        std::mem::take(&mut ahead)
                    };
                    // While fast handlers run this batch, the next one is claimed: its
                    // write's round trip overlaps the runs instead of following them.
                    let wanted = pace.fast() && !single && !claimed.is_empty();
                    let next = match self
                        .plan_ahead(leadership, lease, shutdown, &mut backlog, &finished, wanted)
                        .await
                    {
                        Ok(next) => next,
                        Err(stop) => {
                            self.release_unstarted(leadership, claimed).await;
                            end = Some(stop);
                            break;
                        }
                    };
                    let sent = next.map(|batch| {
                        let riders = finished.drain(..batch.deletions).collect();
                        self.send_claim(leadership, batch, riders)
                    });
                    (claimed, sent)
                }
            };
            let Some(sent) = sent else {
                match self
                    .run_batch(
                        leadership,
                        lease,
                        shutdown,
                        claimed,
                        &mut backlog,
                        memory,
                        &mut finished,
                        &mut pace,
                    )
                    .await
                {
                    Ran::Done => continue,
                    Ran::Relist => break,
                    Ran::End(stop) => {
                        end = Some(stop);
                        break;
                    }
                }
            };
            let ((claim, riders), ran) = tokio::join!(
                sent,
                self.run_batch(
                    leadership,
                    lease,
                    shutdown,
                    claimed,
                    &mut backlog,
                    memory,
                    &mut finished,
                    &mut pace
                ),
            );
            // The riders go back in front; they are taken out again if the claim held.
            let deletions = riders.len();
            finished.splice(0..0, riders);
            // The claim after this one is sent before this answer is applied, so that the
            // coordinator works on it while the leader applies the answer and runs the
            // batch: the two overlap instead of taking turns.
            let mut stopping = None;
            if matches!(claim, Claim::Claimed { .. }) && matches!(ran, Ran::Done) {
                let wanted = pace.fast() && !single;
                let later = &finished[deletions..];
                match self
                    .plan_ahead(leadership, lease, shutdown, &mut backlog, later, wanted)
                    .await
                {
                    Ok(Some(batch)) => {
                        let riders = finished
                            .drain(deletions..deletions + batch.deletions)
                            .collect();
                        flight = Some(self.send_claim(leadership, batch, riders));
                    }
                    Ok(None) => {}
                    Err(stop) => stopping = Some(stop),
                }
            }
            let started = self
                .apply_claim(
                    leadership,
                    &mut backlog,
                    memory,
                    claim,
                    deletions,
                    &mut finished,
                    &mut single,
                    false,
                )
                .await;
            let next = match started {
                Started::Runs(next) => next,
                Started::Relist => {
                    if let Ran::End(stop) = ran {
                        end = Some(stop);
                    }
                    break;
                }
                Started::End(stop) => {
                    end = Some(stop);
                    break;
                }
            };
            if let Some(stop) = stopping {
                self.release_unstarted(leadership, next).await;
                end = Some(stop);
                break;
            }
            match ran {
                // A slow run sent the rest of its batch back; the batch claimed ahead,
                // later in claim order, goes back too and is read again.
                Ran::Done if !pace.fast() => {
                    match self.send_back(leadership, &mut backlog, memory, next).await {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(stop) => {
                            end = Some(stop);
                            break;
                        }
                    }
                }
                Ran::Done => ahead = next,
                Ran::Relist => {
                    self.release_unstarted(leadership, next).await;
                    break;
                }
                Ran::End(stop) => {
                    self.release_unstarted(leadership, next).await;
                    end = Some(stop);
                    break;
                }
            }
        }
        let landed = self
            .land(
                leadership,
                &mut backlog,
                memory,
                flight,
                &mut finished,
                &mut single,
            )
            .await;
        end = end.or(landed);
        self.release_unstarted(leadership, ahead).await;
        let unrecorded = self.complete_all(leadership, finished).await;
        (end, unrecorded)
    }

    /// Sends a claim write that also completes `riders`: the write goes out now, on a
    /// task of its own, whatever the leader does meanwhile; its answer, read, and the
    /// riders come when the returned future is awaited. A write whose answer is never read
    /// is a lost answer: what it claimed is held by this lease, and the next listing finds
    /// it (`sort.rs`).
    fn send_claim<'a>(
        &'a self,
        leadership: &'a Leadership,
        batch: Batch,
        riders: Vec<Finished>,
    ) -> Flight<'a> {
        let (tasks, values, ops) = self.claim_ops(batch, &riders);
        let coord = self.coord.clone();
        let guard = leadership.clone();
        let write = tokio::spawn(async move { coord.write(&guard, &ops).await });
        Box::pin(async move {
            let written = write.await.unwrap_or_else(|err| {
                Err(CoordError::Unavailable(format!(
                    "the claim write's task ended: {err}"
                )))
            });
            if let Err(err) = &written {
                self.metrics.coordinator_error(err);
            }
            let claim = self.read_claim(leadership, tasks, values, written).await;
            (claim, riders)
        })
    }

    /// Waits for a claim sent ahead, if any, when the leading stops or waits before its
    /// runs start: its answer is applied (riders recorded if it held, kept if not) and what
    /// it claimed is put back untouched. Answers why the leading ends, if the answer says.
    async fn land(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        memory: &mut Memory,
        flight: Option<Flight<'_>>,
        finished: &mut Vec<Finished>,
        single: &mut bool,
    ) -> Option<LeadEnd> {
        let (claim, riders) = flight?.await;
        let deletions = riders.len();
        finished.splice(0..0, riders);
        let started = self
            .apply_claim(
                leadership, backlog, memory, claim, deletions, finished, single, false,
            )
            .await;
        match started {
            Started::Runs(runs) => {
                self.release_unstarted(leadership, runs).await;
                None
            }
            Started::Relist => None,
            Started::End(stop) => Some(stop),
        }
    }

    /// Plans the batch claimed while this one runs, when `wanted` (handlers are fast and
    /// batches allowed) and the leading may go on; `None`: the next claim follows the runs.
    /// A first pending task too large to claim even alone is dead-lettered here, and the
    /// next claim follows the runs.
    #[allow(clippy::too_many_arguments)]
    async fn plan_ahead(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
        backlog: &mut Backlog,
        finished: &[Finished],
        wanted: bool,
    ) -> Result<Option<Batch>, LeadEnd> {
        if !wanted
            || self.must_stop(lease, shutdown).is_some()
            || !lease.outlasts(self.lease_rules.claim_headroom)
        {
            return Ok(None);
        }
        match self.plan_batch(leadership, backlog, finished, self.settings.claim_batch) {
            Planned::Batch(batch) if batch.tasks.is_empty() => Ok(None),
            Planned::Batch(batch) => Ok(Some(batch)),
            Planned::TooLarge { task, cost } => {
                self.dead_letter_too_large(leadership, &task, cost).await?;
                backlog.forget(&task.key);
                Ok(None)
            }
        }
    }

    /// Runs a claimed batch one task at a time. A run that ends the leading, or a stop
    /// between runs, puts back what did not start; a slow run sends the rest of the batch
    /// back and reads it again (`pace` counts each run).
    #[allow(clippy::too_many_arguments)]
    async fn run_batch(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
        claimed: Vec<(Claimed, TaskVersion)>,
        backlog: &mut Backlog,
        memory: &mut Memory,
        finished: &mut Vec<Finished>,
        pace: &mut Pace,
    ) -> Ran {
        let mut claimed = claimed.into_iter();
        while let Some((task, claimed_version)) = claimed.next() {
            // "Renew between tasks": a batch claimed ahead still runs only while the lease
            // is fresh; what did not start (this task included) goes back untouched.
            if let Some(stop) = self.must_stop(lease, shutdown) {
                let unstarted = std::iter::once((task, claimed_version))
                    .chain(claimed.by_ref())
                    .collect();
                self.release_unstarted(leadership, unstarted).await;
                return Ran::End(stop);
            }
            let key = task.task.key.clone();
            let finished_before = finished.len();
            let run = self
                .run_claimed(leadership, lease, shutdown, task, claimed_version, finished)
                .await;
            if finished.len() == finished_before {
                // Not a success: a retry was written back or the task moved. The next
                // look reads the key again, so the retry is known when due.
                backlog.forget(&key);
            }
            pace.record(run.elapsed);
            // Past a slow run, finished tasks are recorded at once rather than at the
            // next claim, which keeps the window in which a crash makes them run again
            // short.
            if !pace.fast() && !finished.is_empty() {
                *finished = self
                    .complete_known(leadership, backlog, std::mem::take(finished))
                    .await;
            }
            if let Some(stop) = run.end {
                self.release_unstarted(leadership, claimed.collect()).await;
                return Ran::End(stop);
            }
            if !pace.fast() && claimed.len() > 0 {
                // The batch was claimed on the promise of fast runs. A slow one sends the
                // rest back unchanged, so that a batch of slow tasks never holds up an
                // earlier task that arrives or falls due.
                match self
                    .send_back(leadership, backlog, memory, claimed.by_ref().collect())
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => return Ran::Relist,
                    Err(stop) => return Ran::End(stop),
                }
            }
        }
        Ran::Done
    }

    /// Puts claimed tasks back unchanged and reads them again. Sent back, they have new
    /// versions the backlog does not know, and they come before every task still in it:
    /// just they are read again and take their places, so they are claimed next, in order.
    /// Not a listing: a run that straddles the fast-handler threshold costs a read of at
    /// most a batch, whatever the backlog. `Ok(false)`: they could not be read; list again.
    async fn send_back(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        memory: &mut Memory,
        rest: Vec<(Claimed, TaskVersion)>,
    ) -> Result<bool, LeadEnd> {
        if rest.is_empty() {
            return Ok(true);
        }
        let keys: Vec<String> = rest.iter().map(|(task, _)| task.task.key.clone()).collect();
        self.release_unstarted(leadership, rest).await;
        self.read_again(leadership, backlog, memory, &keys).await
    }

    /// Reads `keys` again and puts what they hold in its place in the backlog (or forgets
    /// them, if gone). `Ok(false)`: they could not be read; list again.
    async fn read_again(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        memory: &mut Memory,
        keys: &[String],
    ) -> Result<bool, LeadEnd> {
        let current = match self.coord.get(keys).await {
            Ok(current) => current,
            Err(err) => {
                self.metrics.coordinator_error(&err);
                tracing::warn!(error = %err, "cannot read tasks sent back; listing again");
                return Ok(false);
            }
        };
        for key in keys {
            backlog.forget(key);
        }
        let sorted = self
            .sort_out(leadership, current, memory, self.clock().now())
            .await?;
        backlog.learn(
            sorted.keys.into_iter().collect(),
            sorted.pending,
            sorted.delayed,
        );
        Ok(true)
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
        let now = self.clock().now();
        let (guard, shares) = riders(self.coord.guard_cost(), finished);
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
            let candidate = Candidate::new(&task, leadership, &self.node_id, now);
            claims.push(self.coord.cost(&candidate.op));
            let next = plan_claim(guard, &shares, &claims, max_tasks, limits);
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
            ClaimPlan::Take { finished, tasks } => Planned::Batch(Batch {
                tasks: backlog.take(tasks),
                candidates,
                deletions: finished,
            }),
            ClaimPlan::TooLarge { cost } => match backlog.take_first() {
                Some(task) => Planned::TooLarge {
                    task: Box::new(task),
                    cost,
                },
                None => Planned::Batch(Batch {
                    tasks: Vec::new(),
                    candidates: Vec::new(),
                    deletions: 0,
                }),
            },
        }
    }

    /// Claims `batch` in one write (completing its riders) and applies the answer to the
    /// backlog: forgets the completed keys; on a conflict on the batch's own tasks puts
    /// each back, defers it (refused for a while) or takes it as read again; after a refusal as too
    /// large goes one task at a time (`alone`: it already does) or dead-letters the task
    /// that was alone in its write. Answers the runs to start.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn claim_and_apply(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        memory: &mut Memory,
        batch: Batch,
        finished: &mut Vec<Finished>,
        single: &mut bool,
        alone: bool,
    ) -> Started {
        let deletions = batch.deletions;
        let claim = self
            .claim_batch(leadership, batch, &finished[..deletions])
            .await;
        self.apply_claim(
            leadership, backlog, memory, claim, deletions, finished, single, alone,
        )
        .await
    }

    /// Applies a claim write's answer to the backlog: on success the first `deletions`
    /// finished tasks, its riders, are completed and forgotten; then as
    /// [`Queue::claim_and_apply`] says.
    #[allow(clippy::too_many_arguments)]
    async fn apply_claim(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        memory: &mut Memory,
        claim: Claim,
        deletions: usize,
        finished: &mut Vec<Finished>,
        single: &mut bool,
        alone: bool,
    ) -> Started {
        match claim {
            Claim::Claimed {
                runs,
                fencing_token,
            } => {
                for done in finished.drain(..deletions) {
                    self.log_completed(leadership, &done, fencing_token);
                    backlog.forget(&done.task.key);
                }
                Started::Runs(runs)
            }
            Claim::Relist => Started::Relist,
            Claim::End(stop) => Started::End(stop),
            Claim::Conflicted {
                batch,
                keys,
                current,
                fates,
            } => {
                let until = self.clock().now()
                    + chrono::Duration::from_std(DEFERRED_RETRY).unwrap_or_default();
                let deferred = fates.contains(&Fate::Defer);
                for (task, fate) in batch.into_iter().zip(fates) {
                    match fate {
                        Fate::PutBack => backlog.put_back_one(task),
                        // The coordinator refuses this key for a while (a dead lease's
                        // takeover delay): it steps aside, the tasks after it go first.
                        Fate::Defer => {
                            tracing::info!(task_key = %task.key, retry_in = %crate::util::duration::format(DEFERRED_RETRY), "task refused for a while by the coordinator; claiming the next ones meanwhile");
                            memory.deferred.insert(task.key.clone(), until);
                            backlog.defer(vec![task], until);
                        }
                        Fate::ReadAgain => {}
                    }
                }
                if deferred {
                    return Started::Runs(Vec::new());
                }
                // Only tasks of this batch moved since they were read: they take their new
                // places (or go, if deleted) without listing the whole queue.
                tracing::debug!(
                    ?keys,
                    "claim conflict; taking the moved tasks as read again"
                );
                for key in &keys {
                    backlog.forget(key);
                }
                let now = self.clock().now();
                match self.sort_out(leadership, current, memory, now).await {
                    Ok(sorted) => {
                        backlog.learn(sorted.keys, sorted.pending, sorted.delayed);
                        Started::Runs(Vec::new())
                    }
                    Err(stop) => Started::End(stop),
                }
            }
            Claim::TooLarge(mut batch, why) => match after_refusal(batch.len(), deletions, alone) {
                Refusal::OneAtATime => {
                    tracing::warn!(error = %why, "the coordinator refused a claim as too large; claiming one task at a time");
                    *single = true;
                    let done = std::mem::take(finished);
                    *finished = self.complete_known(leadership, backlog, done).await;
                    backlog.put_back(batch);
                    Started::Runs(Vec::new())
                }
                Refusal::DeadLetter => {
                    let Some(task) = batch.pop() else {
                        return Started::Runs(Vec::new());
                    };
                    let reason =
                        format!("too large to claim: the coordinator refused its claim: {why}");
                    let pair = pair_of(&task, task.with(&[]), task.version);
                    match self.dead_letter(leadership, &pair, &reason).await {
                        Ok(_) => {
                            backlog.forget(&task.key);
                            Started::Runs(Vec::new())
                        }
                        Err(stop) => Started::End(stop),
                    }
                }
            },
        }
    }

    /// Claims `batch` in one write that also completes `riders` (its first `deletions`
    /// finished tasks), and reads the answer (`answer.rs`).
    async fn claim_batch(
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
    fn claim_ops(
        &self,
        batch: Batch,
        riders: &[Finished],
    ) -> (Vec<Task>, Vec<Vec<u8>>, Vec<TaskOp>) {
        let Batch {
            tasks,
            candidates,
            deletions,
        } = batch;
        let mut ops = Vec::with_capacity(deletions + tasks.len());
        // Finished tasks are completed in this claim's write: one commit, not two. It is
        // applied only if the whole claim is.
        ops.extend(completions(&self.settings.done_prefix, riders));
        let mut values = Vec::with_capacity(candidates.len());
        for candidate in candidates {
            ops.push(candidate.op);
            values.push(candidate.value);
        }
        (tasks, values, ops)
    }

    /// Reads a claim write's answer (`answer.rs`) for `batch`, whose claims wrote `values`.
    async fn read_claim(
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
                return Claim::Relist;
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
        Claim::Claimed {
            runs: claimed,
            fencing_token,
        }
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
                    .write_own_or_orphan(&leadership.lease, own, put_back)
                    .await
                {
                    tracing::warn!(task_key = %key, error = %why, "cannot put back a task claimed but not started; the next leader requeues it");
                }
            }
        }
    }
}
