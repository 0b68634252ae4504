//! The one-at-a-time driver: works through a listing's backlog in `taskTime` order, one run
//! at a time, and claims in batches while handlers are fast (`run.rs`'s `Pace`). Each
//! batch's claim is sent, on a task of its own, as soon as the answer before it is in, and
//! is answered while the batch before it runs; when the runs are over before that answer
//! comes, the next claim goes out at once, so that up to two are on their way. A claim
//! sent ahead is always landed (its answer applied, what it claimed put back) when the
//! leading stops or waits first, or when the claim before it did not hold. The
//! claim write itself, and the application of its answer, are in `claim.rs`; the driver of
//! several runs at once is `groups.rs`.
//!
//! Size: one loop, and the helpers only it uses; the claims in flight are landed on every
//! path out of it, which reads best beside the loop.

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::backlog::{Backlog, Next};
use super::claim::{Batch, Claim, Planned, Started};
use super::finished::Finished;
use super::run::{Claimed, Pace};
use super::sort::{Look, Memory, Reading};
use super::{LeadEnd, Queue};
use crate::coord::{CoordError, Leadership, TaskVersion, Written};
use crate::leader::Lease;
use crate::task::Task;

/// How the runs of a claimed batch ended.
enum Ran {
    /// Every task ran, or a slow run sent the rest back and they were read again.
    Done,
    /// What a slow run sent back could not be read again: list again.
    Relist,
    End(LeadEnd),
}

/// A claim write on its way, on a task of its own: what its answer is read against, and
/// the completions riding in it.
struct Flight {
    write: JoinHandle<Result<Written, CoordError>>,
    tasks: Vec<Task>,
    values: Vec<Vec<u8>>,
    riders: Vec<Finished>,
}

impl Flight {
    /// The coordinator has answered (the answer is not read yet).
    fn answered(&self) -> bool {
        self.write.is_finished()
    }
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
        let mut flight: Option<Flight> = None;
        loop {
            if let Some(stop) = self.must_stop(lease, shutdown) {
                end = Some(stop);
                break;
            }
            if finished.iter().any(|done| done.sent_under.is_some()) {
                finished = self.settle_unsure(leadership, finished).await;
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
                    let sent = match self
                        .send_ahead(
                            leadership,
                            lease,
                            shutdown,
                            &mut backlog,
                            &mut finished,
                            wanted,
                        )
                        .await
                    {
                        Ok(sent) => sent,
                        Err(stop) => {
                            self.release_unstarted(leadership, claimed).await;
                            end = Some(stop);
                            break;
                        }
                    };
                    (claimed, sent)
                }
            };
            // A claim sent goes on, on its own task, while this batch runs.
            let ran = self
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
                .await;
            let Some(sent) = sent else {
                match ran {
                    Ran::Done => continue,
                    Ran::Relist => break,
                    Ran::End(stop) => {
                        end = Some(stop);
                        break;
                    }
                }
            };
            let mut stopping = None;
            let mut relist = false;
            // The runs went faster than the coordinator answers: a second claim, carrying
            // this batch's completions, is sent before the first is answered, so that the
            // coordinator always has one to work on.
            let mut second = None;
            if matches!(ran, Ran::Done) && !sent.answered() {
                let wanted = pace.fast() && !single;
                match self
                    .send_ahead(
                        leadership,
                        lease,
                        shutdown,
                        &mut backlog,
                        &mut finished,
                        wanted,
                    )
                    .await
                {
                    Ok(sent) => second = sent,
                    Err(stop) => stopping = Some(stop),
                }
            }
            let (claim, riders) = self.answer(leadership, sent).await;
            if let Some(later) = second.take() {
                if matches!(claim, Claim::Claimed { .. }) {
                    flight = Some(later);
                } else {
                    // The earlier claim did not hold: what the later one claimed goes
                    // back and is read again, so that the order holds.
                    let (later, later_riders) = self.answer(leadership, later).await;
                    let started = self
                        .apply_claim(
                            leadership,
                            &mut backlog,
                            memory,
                            later,
                            later_riders,
                            &mut finished,
                            &mut single,
                            false,
                        )
                        .await;
                    match started {
                        Started::Runs(runs) => {
                            match self.send_back(leadership, &mut backlog, memory, runs).await {
                                Ok(true) => {}
                                Ok(false) => relist = true,
                                Err(stop) => stopping = Some(stop),
                            }
                        }
                        Started::Relist => {}
                        Started::End(stop) => stopping = Some(stop),
                    }
                }
            }
            // The claim after this one is sent before this answer is applied, so that the
            // coordinator works on it while the leader applies the answer and runs the
            // batch: the two overlap instead of taking turns.
            if flight.is_none()
                && stopping.is_none()
                && matches!(claim, Claim::Claimed { .. })
                && matches!(ran, Ran::Done)
            {
                let wanted = pace.fast() && !single;
                match self
                    .send_ahead(
                        leadership,
                        lease,
                        shutdown,
                        &mut backlog,
                        &mut finished,
                        wanted,
                    )
                    .await
                {
                    Ok(sent) => flight = sent,
                    Err(stop) => stopping = Some(stop),
                }
            }
            let started = self
                .apply_claim(
                    leadership,
                    &mut backlog,
                    memory,
                    claim,
                    riders,
                    &mut finished,
                    &mut single,
                    false,
                )
                .await;
            let next = match started {
                Started::Runs(next) => next,
                Started::Relist => {
                    end = match ran {
                        Ran::End(stop) => Some(stop),
                        _ => stopping,
                    };
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
            if relist {
                self.release_unstarted(leadership, next).await;
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
    async fn answer(&self, leadership: &Leadership, flight: Flight) -> (Claim, Vec<Finished>) {
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
    async fn land(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        memory: &mut Memory,
        flight: Option<Flight>,
        finished: &mut Vec<Finished>,
        single: &mut bool,
    ) -> Option<LeadEnd> {
        let (claim, riders) = self.answer(leadership, flight?).await;
        let started = self
            .apply_claim(
                leadership, backlog, memory, claim, riders, finished, single, false,
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

    /// Plans and sends a claim ahead of the runs (its riders taken out of `finished`), when
    /// `wanted` (handlers are fast and batches allowed) and the leading may go on; `None`:
    /// the next claim follows the runs. A first pending task too large to claim even alone
    /// is dead-lettered here, and the next claim follows the runs.
    #[allow(clippy::too_many_arguments)]
    async fn send_ahead(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
        backlog: &mut Backlog,
        finished: &mut Vec<Finished>,
        wanted: bool,
    ) -> Result<Option<Flight>, LeadEnd> {
        if !wanted
            || self.must_stop(lease, shutdown).is_some()
            || !lease.outlasts(self.lease_rules.claim_headroom)
        {
            return Ok(None);
        }
        match self.plan_batch(leadership, backlog, finished, self.settings.claim_batch) {
            Planned::Batch(batch) if batch.tasks.is_empty() => Ok(None),
            Planned::Batch(batch) => {
                let riders = finished.drain(..batch.deletions).collect();
                Ok(Some(self.send_claim(leadership, batch, riders)))
            }
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
}
