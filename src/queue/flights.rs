//! The claims the driver (`driver.rs`) makes, as the term core (`term.rs`) asks: now, in
//! one write awaited at once; ahead of the runs, on a task of their own ([`Flight`]), their
//! answers read and applied later, landed when the leading stops or waits first, taken
//! back when the claim before them did not hold; into free slots, one task per free group.
//! Claimed tasks that are not to start now are sent back (put back and read again). The
//! claim write itself, and the application of its answer, are in `claim.rs`.

use tokio::task::JoinHandle;

use super::backlog::Backlog;
use super::claim::{Batch, Candidate, Claim, Planned, Started};
use super::finished::{ride_able, riders, Finished};
use super::plan::{plan_claim, ClaimPlan};
use super::run::Claimed;
use super::work::Work;
use super::{LeadEnd, Queue};
use crate::coord::{CoordError, Leadership, TaskOp, TaskVersion, WriteCost, Written};
use crate::task::Task;

/// A claim write on its way, on a task of its own: what its answer is read against, and
/// the completions riding in it.
pub(super) struct Flight {
    write: JoinHandle<Result<Written, CoordError>>,
    tasks: Vec<Task>,
    values: Vec<Vec<u8>>,
    riders: Vec<Finished>,
}

impl Flight {
    /// The coordinator has answered (the answer is not read yet).
    pub(super) fn answered(&self) -> bool {
        self.write.is_finished()
    }
}

/// A claim reads the values of the first tasks held without theirs (a large backlog's past
/// its front) when any is among the first FILL_BEFORE in claim order: those among the
/// first FILL_WINDOW, in one read, so that a read serves thousands of claims.
const FILL_BEFORE: usize = 512;
const FILL_WINDOW: usize = 4096;

impl Queue {
    /// Reads the values of the first pending tasks held without theirs, as a claim is about
    /// to take them (`FILL_BEFORE`). `false`: they could not be read (list again).
    pub(super) async fn fill_front(&self, backlog: &mut Backlog) -> bool {
        if backlog.unfilled_front(FILL_BEFORE).is_empty() {
            return true;
        }
        let keys = backlog.unfilled_front(FILL_WINDOW);
        match self.coord.get(&keys).await {
            Ok(found) => {
                backlog.filled(&keys, found);
                true
            }
            Err(err) => {
                self.metrics.coordinator_error(&err);
                tracing::warn!(error = %err, "cannot read the next tasks' values; listing again");
                false
            }
        }
    }

    /// Claims up to `max_tasks` of the next tasks now; a first task too large to claim even
    /// alone is dead-lettered, and nothing starts (the core decides again).
    pub(super) async fn claim_now(
        &self,
        leadership: &Leadership,
        work: &mut Work<'_>,
        max_tasks: usize,
    ) -> Started {
        if !self.fill_front(&mut work.backlog).await {
            return Started::Relist;
        }
        let riders = if work.single { 0 } else { work.finished.len() };
        let planned = self.plan_batch(
            leadership,
            &mut work.backlog,
            &work.finished[..riders],
            max_tasks,
        );
        let batch = match planned {
            Planned::Batch(batch) => batch,
            Planned::TooLarge { task, cost } => {
                return match self.dead_letter_too_large(leadership, &task, cost).await {
                    Ok(_) => {
                        work.backlog.forget(&task.key);
                        Started::Runs(Vec::new())
                    }
                    Err(stop) => Started::End(stop),
                };
            }
        };
        if batch.tasks.is_empty() && self.next_is_rated(&work.backlog) {
            // A batch stops before a task of a rated type: claimed task by task, with its
            // rate counted, from the next listing on (`drive`).
            return Started::Relist;
        }
        let alone = work.single;
        // Possibly none: the tasks were deferred, put back or read again.
        self.claim_and_apply(leadership, work, batch, alone).await
    }

    /// Whether the next pending task is of a type with a rate.
    fn next_is_rated(&self, backlog: &super::backlog::Backlog) -> bool {
        let next = backlog.pending().next();
        next.is_some_and(|task| self.registry.has_rate(&task.task_type))
    }

    /// A later claim whose earlier one did not hold: its answer is applied and what it
    /// claimed goes back and is read again. `Ok(false)`: it could not be read; list again.
    pub(super) async fn take_back(
        &self,
        leadership: &Leadership,
        work: &mut Work<'_>,
        later: Flight,
    ) -> Result<bool, LeadEnd> {
        let (later, later_riders) = self.answer(leadership, later).await;
        match self
            .apply_claim(leadership, work, later, later_riders, false)
            .await
        {
            Started::Runs(runs) => self.send_back(leadership, work, runs).await,
            Started::Relist => Ok(true),
            Started::End(stop) => Err(stop),
        }
    }

    /// Sends a claim write that also completes `riders`: the write goes out now, on a
    /// task of its own, whatever the leader does meanwhile; [`Queue::answer`] reads its
    /// answer. A write whose answer is never read is a lost answer: what it claimed is held
    /// by this lease, and the next listing finds it (`entry.rs`: requeued as ours).
    fn send_claim(&self, leadership: &Leadership, batch: Batch, riders: Vec<Finished>) -> Flight {
        let (tasks, values, ops) = self.claim_ops(batch, &riders);
        let coord = self.coord.clone();
        let guard = leadership.clone();
        Flight {
            write: tokio::spawn(async move { coord.write(&guard, &ops).await }),
            tasks,
            values,
            riders,
        }
    }

    /// Waits for a claim sent ahead and reads its answer; hands back its riders.
    pub(super) async fn answer(
        &self,
        leadership: &Leadership,
        flight: Flight,
    ) -> (Claim, Vec<Finished>) {
        let written = flight.write.await.unwrap_or_else(|err| {
            Err(CoordError::Unavailable(format!(
                "the claim write's task ended: {err}"
            )))
        });
        if let Err(err) = &written {
            self.metrics.coordinator_error(err);
        }
        let claim = self
            .read_claim(leadership, flight.tasks, flight.values, written)
            .await;
        (claim, flight.riders)
    }

    /// Waits for a claim sent ahead, if any, when the leading stops or waits before its
    /// runs start: its answer is applied (riders recorded if it held, kept if not) and what
    /// it claimed is put back untouched. Answers why the leading ends, if the answer says.
    pub(super) async fn land(
        &self,
        leadership: &Leadership,
        work: &mut Work<'_>,
        flight: Option<Flight>,
    ) -> Option<LeadEnd> {
        let (claim, riders) = self.answer(leadership, flight?).await;
        match self
            .apply_claim(leadership, work, claim, riders, false)
            .await
        {
            Started::Runs(runs) => {
                self.release_unstarted(leadership, runs).await;
                None
            }
            Started::Relist => None,
            Started::End(stop) => Some(stop),
        }
    }

    /// Plans and sends a claim of up to `max_tasks` ahead of the runs (its riders taken out
    /// of the finished); `None`: nothing to claim. A first pending task too large to claim
    /// even alone is dead-lettered here, and the next claim follows the runs.
    pub(super) async fn send_ahead(
        &self,
        leadership: &Leadership,
        work: &mut Work<'_>,
        max_tasks: usize,
    ) -> Result<Option<Flight>, LeadEnd> {
        if !self.fill_front(&mut work.backlog).await {
            // Nothing goes ahead; the claim after the runs reads them again, or lists.
            return Ok(None);
        }
        match self.plan_batch(leadership, &mut work.backlog, &work.finished, max_tasks) {
            Planned::Batch(batch) if batch.tasks.is_empty() => Ok(None),
            Planned::Batch(batch) => {
                let riders = work.finished.drain(..batch.deletions).collect();
                Ok(Some(self.send_claim(leadership, batch, riders)))
            }
            Planned::TooLarge { task, cost } => {
                self.dead_letter_too_large(leadership, &task, cost).await?;
                work.backlog.forget(&task.key);
                Ok(None)
            }
        }
    }

    /// Puts claimed tasks back unchanged and reads them again. Sent back, they have new
    /// versions the backlog does not know, and they come before every task still in it:
    /// just they are read again and take their places, so they are claimed next, in order.
    /// Not a listing: a run that straddles the fast-handler threshold costs a read of at
    /// most a batch, whatever the backlog. `Ok(false)`: they could not be read; list again.
    pub(super) async fn send_back(
        &self,
        leadership: &Leadership,
        work: &mut Work<'_>,
        rest: Vec<(Claimed, TaskVersion)>,
    ) -> Result<bool, LeadEnd> {
        if rest.is_empty() {
            return Ok(true);
        }
        let keys: Vec<String> = rest.iter().map(|(task, _)| task.task.key.clone()).collect();
        self.release_unstarted(leadership, rest).await;
        self.read_again(leadership, work, &keys).await
    }

    /// Reads `keys` again and puts what they hold in its place in the backlog (or forgets
    /// them, if gone). `Ok(false)`: they could not be read; list again.
    async fn read_again(
        &self,
        leadership: &Leadership,
        work: &mut Work<'_>,
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
            work.backlog.forget(key);
        }
        let sorted = self
            .sort_out(leadership, current, work.memory, self.clock().now())
            .await?;
        work.backlog.learn(
            sorted.keys.into_iter().collect(),
            sorted.pending.into_pending(),
            sorted.delayed,
        );
        Ok(true)
    }

    /// Claims `batch` (tasks of distinct free groups, in claim order) in one write within
    /// the coordinator's limits, with as many finished tasks' completions as fit, and the
    /// writes `notes` asks for the tasks claimed (the rated types' start records). Tasks
    /// that do not fit go back to the backlog in their place.
    pub(super) async fn claim_free(
        &self,
        leadership: &Leadership,
        work: &mut Work<'_>,
        mut batch: Vec<Task>,
        notes: impl Fn(&[Task]) -> Vec<TaskOp>,
    ) -> Started {
        let backlog = &mut work.backlog;
        let now = self.clock().now();
        let candidates: Vec<Candidate> = batch
            .iter()
            .map(|task| Candidate::new(task, leadership, &self.node_id, now))
            .collect();
        // The notes of the whole batch cost at least those of the part that fits.
        let noted = notes(&batch)
            .iter()
            .fold(self.coord.guard_cost(), |cost, op| {
                cost + self.coord.cost(op)
            });
        let (guard, shares) = riders(noted, ride_able(&work.finished));
        let claims: Vec<WriteCost> = candidates
            .iter()
            .map(|candidate| self.coord.cost(candidate.op()))
            .collect();
        let limits = self.coord.limits();
        let riding = if work.single { &[][..] } else { &shares[..] };
        let (deletions, fit) = match plan_claim(guard, riding, &claims, batch.len(), limits) {
            ClaimPlan::Take { finished, tasks } => (finished, tasks.max(1)),
            ClaimPlan::TooLarge { cost } => {
                let task = batch.remove(0);
                for task in batch {
                    backlog.put_back_one(task);
                }
                return match self.dead_letter_too_large(leadership, &task, cost).await {
                    Ok(()) => {
                        backlog.forget(&task.key);
                        Started::Runs(Vec::new())
                    }
                    Err(stop) => Started::End(stop),
                };
            }
        };
        for task in batch.split_off(fit) {
            backlog.put_back_one(task);
        }
        let candidates: Vec<Candidate> = candidates.into_iter().take(fit).collect();
        let batch = Batch {
            notes: notes(&batch),
            tasks: batch,
            candidates,
            deletions,
        };
        // A write of one task with no completions riding along is already alone.
        self.claim_and_apply(leadership, work, batch, true).await
    }
}
