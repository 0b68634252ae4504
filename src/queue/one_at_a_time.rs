//! The one-at-a-time driver: works through a listing's backlog in `taskTime` order, one run
//! at a time, and claims in batches while handlers are fast (`work.rs`'s `Pace`). Each
//! batch's claim is sent, on a task of its own, as soon as the answer before it is in, and
//! is answered while the batch before it runs; when the runs are over before that answer
//! comes, the next claim goes out at once, so that up to two are on their way. A claim
//! sent ahead is always landed (its answer applied, what it claimed put back) when the
//! leading stops or waits first, or when the claim before it did not hold. The loop's
//! state is one [`Line`]; each turn is cut in steps that say whether to go on, decide
//! again, or leave the listing ([`Flow`]), and what becomes of a batch claimed ahead is
//! decided by the pure `batches.rs`. The claim write itself, and the application of its
//! answer, are in `claim.rs`; the driver of several runs at once is `groups.rs`.

use tokio::task::JoinHandle;

use super::backlog::{Backlog, Next};
use super::batches::{after_batch, send_next_early, send_second, Ran, Then};
use super::claim::{Batch, Claim, Planned, Started};
use super::finished::Finished;
use super::run::Claimed;
use super::sort::{Look, Memory, Reading};
use super::work::{Leading, Work};
use super::{LeadEnd, Queue};
use crate::coord::{CoordError, Leadership, TaskVersion, Written};
use crate::task::Task;

/// Why a step of the loop does not go on to the next: decide again from the top, or leave
/// the listing (saying why the leading ends, if it does).
enum Flow {
    Again,
    Leave(Option<LeadEnd>),
}

impl Flow {
    /// The loop's answer to a claim's outcome that starts no runs.
    fn from_started(started: Started) -> Result<Vec<(Claimed, TaskVersion)>, Flow> {
        match started {
            Started::Runs(runs) => Ok(runs),
            Started::Relist => Err(Flow::Leave(None)),
            Started::End(stop) => Err(Flow::Leave(Some(stop))),
        }
    }

    /// The loop's answer to a send back (`Queue::send_back`).
    fn from_sent_back(sent: Result<bool, LeadEnd>) -> Result<(), Flow> {
        match sent {
            Ok(true) => Ok(()),
            Ok(false) => Err(Flow::Leave(None)),
            Err(stop) => Err(Flow::Leave(Some(stop))),
        }
    }
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

/// The one-at-a-time driver's state: the work, a look or listing being read beside the
/// claims, the batch claimed while the previous one ran (none of it started yet), and the
/// claim after it, sent before the answer that claimed `ahead` was applied.
struct Line<'m> {
    work: Work<'m>,
    reading: Option<Reading>,
    ahead: Vec<(Claimed, TaskVersion)>,
    flight: Option<Flight>,
}

impl Queue {
    /// Works through a listing's backlog: with one run at a time here, claims batched while
    /// handlers are fast; with `queue.concurrency` above 1, up to that many runs at once,
    /// one per `taskGroup` (`groups.rs`). Both make their claims through
    /// [`Queue::claim_and_apply`]. Returns why the leading ends, if it does, and the
    /// completions it could not record.
    pub(super) async fn drive(
        &self,
        lead: Leading<'_>,
        backlog: Backlog,
        memory: &mut Memory,
    ) -> (Option<LeadEnd>, Vec<Finished>) {
        let work = Work::new(backlog, memory);
        if self.settings.concurrency > 1 {
            self.drive_groups(lead, work).await
        } else {
            self.drive_one(lead, work).await
        }
    }

    /// Works through a listing's backlog one run at a time. Before each claim the plan
    /// decides: look at the queue's keys (every LOOK_INTERVAL) for tasks that arrived and
    /// retries written back, list again, or claim. A cheap look is made before the claim;
    /// the names of a costly one, and a listing, are read while the claims go on, and
    /// merged (new keys read and put in their places) before the first claim after they
    /// arrive. Retries that fall due join the pending tasks, so the earliest eligible task
    /// known is always claimed next. Tasks are claimed one at a time, or in batches of up
    /// to `claim_batch` while handlers finish fast, each batch within the coordinator's
    /// write limits; a task too large to claim at all is dead-lettered. Each claim is
    /// conditioned on the version read; a conflict on some of the batch's claims reads
    /// just those tasks again (any other conflict sends the leader back to list again).
    /// Finished tasks are completed in the next claim's write.
    async fn drive_one(
        &self,
        lead: Leading<'_>,
        work: Work<'_>,
    ) -> (Option<LeadEnd>, Vec<Finished>) {
        let mut line = Line {
            work,
            reading: None,
            ahead: Vec::new(),
            flight: None,
        };
        let end = loop {
            match self.step_one(lead, &mut line).await {
                Ok(()) | Err(Flow::Again) => continue,
                Err(Flow::Leave(end)) => break end,
            }
        };
        let leadership = lead.leadership;
        let flight = line.flight.take();
        let landed = self.land(leadership, &mut line.work, flight).await;
        self.release_unstarted(leadership, std::mem::take(&mut line.ahead))
            .await;
        let finished = std::mem::take(&mut line.work.finished);
        let unrecorded = self.complete_all(leadership, finished).await;
        (end.or(landed), unrecorded)
    }

    /// One turn of the loop: a read merged first if one is due or done, then a claim (or
    /// the batch claimed ahead), its runs, and what the claim sent ahead of them took.
    async fn step_one(&self, lead: Leading<'_>, line: &mut Line<'_>) -> Result<(), Flow> {
        if let Some(stop) = self.must_stop(lead.lease, lead.shutdown) {
            return Err(Flow::Leave(Some(stop)));
        }
        if line
            .work
            .finished
            .iter()
            .any(|done| done.sent_under.is_some())
        {
            let finished = std::mem::take(&mut line.work.finished);
            line.work.finished = self.settle_unsure(lead.leadership, finished).await;
        }
        if !lead.lease.outlasts(self.lease_rules.claim_headroom) {
            return self.hold_for_headroom(lead, line).await;
        }
        self.read_first(lead.leadership, line).await?;
        let (claimed, sent) = self.claim_or_take_ahead(lead, line).await?;
        // A claim sent goes on, on its own task, while this batch runs.
        let ran = self.run_batch(lead, claimed, &mut line.work).await;
        match (sent, ran) {
            (Some(sent), ran) => self.after_runs(lead, line, ran, sent).await,
            (None, Ran::Done) => Ok(()),
            (None, Ran::Relist) => Err(Flow::Leave(None)),
            (None, Ran::End(stop)) => Err(Flow::Leave(Some(stop))),
        }
    }

    /// Renewals are late: a run started now could be cut by its supervisor's kill window.
    /// What was claimed ahead goes back; nothing is claimed or started until a renewal
    /// comes or the lease runs out.
    async fn hold_for_headroom(&self, lead: Leading<'_>, line: &mut Line<'_>) -> Result<(), Flow> {
        let headroom = self.lease_rules.claim_headroom;
        tracing::warn!(headroom = %crate::util::duration::format(headroom), "the lease may not outlast a run's kill sequence; claiming nothing until it is renewed");
        let flight = line.flight.take();
        let landed = self.land(lead.leadership, &mut line.work, flight).await;
        self.release_unstarted(lead.leadership, std::mem::take(&mut line.ahead))
            .await;
        if let Some(stop) = landed {
            return Err(Flow::Leave(Some(stop)));
        }
        tokio::select! {
            _ = lead.shutdown.cancelled() => {}
            _ = lead.lease.until_it_outlasts(headroom) => {}
        }
        Err(Flow::Again)
    }

    /// What the backlog asks for before the next claim: a cheap look is made before it, so
    /// that a task that arrived goes first; a costly one, and a listing, are read while
    /// this claim and the next ones are written (the backlog asks for one read at a
    /// time), and merged once read, after which the loop decides again: what was read may
    /// come first. Leaves with nothing left to run, on a pause, or to list again.
    async fn read_first(&self, leadership: &Leadership, line: &mut Line<'_>) -> Result<(), Flow> {
        let backlog = &mut line.work.backlog;
        let in_line = match backlog.next(self.clock().now()) {
            Next::Claim => None,
            Next::Look if backlog.looks_in_line() => Some(self.start_look(backlog)),
            Next::Look => {
                line.reading = Some(self.start_look(backlog));
                None
            }
            Next::Relist => {
                line.reading = Some(self.start_relist(backlog));
                None
            }
            Next::Done if line.ahead.is_empty() && line.flight.is_none() => {
                return Err(Flow::Leave(None))
            }
            // The backlog is empty, but the batch claimed ahead is still to run.
            Next::Done => None,
        };
        let Some(read) = in_line.or_else(|| line.reading.take_if(|reading| reading.is_ready()))
        else {
            return Ok(());
        };
        let work = &mut line.work;
        match self
            .finish_reading(leadership, &mut work.backlog, work.memory, read)
            .await
        {
            // A pause takes effect between batches: the loop waits it out.
            Ok(Look::Continue) if self.stops_for_a_pause(&mut *work.memory).await => {
                Err(Flow::Leave(None))
            }
            Ok(Look::Continue) => Err(Flow::Again),
            Ok(Look::Relist) => Err(Flow::Leave(None)),
            Err(stop) => Err(Flow::Leave(Some(stop))),
        }
    }

    /// The batch to run now, and the claim sent ahead of its runs, if one is: the batch a
    /// claim in flight is taking (answered after the runs), the batch claimed ahead, or a
    /// claim made now. While fast handlers run the batch, the next one is claimed: its
    /// write's round trip overlaps the runs instead of following them.
    async fn claim_or_take_ahead(
        &self,
        lead: Leading<'_>,
        line: &mut Line<'_>,
    ) -> Result<(Vec<(Claimed, TaskVersion)>, Option<Flight>), Flow> {
        if let Some(sent) = line.flight.take() {
            return Ok((std::mem::take(&mut line.ahead), Some(sent)));
        }
        let claimed = if line.ahead.is_empty() {
            self.claim_now(lead.leadership, &mut line.work).await?
        } else {
            std::mem::take(&mut line.ahead)
        };
        let wanted = !claimed.is_empty();
        match self.send_ahead(lead, &mut line.work, wanted).await {
            Ok(sent) => Ok((claimed, sent)),
            Err(stop) => {
                self.release_unstarted(lead.leadership, claimed).await;
                Err(Flow::Leave(Some(stop)))
            }
        }
    }

    /// Claims the next tasks now: a batch while handlers are fast, else one; a first task
    /// too large to claim even alone is dead-lettered, and the loop decides again.
    async fn claim_now(
        &self,
        leadership: &Leadership,
        work: &mut Work<'_>,
    ) -> Result<Vec<(Claimed, TaskVersion)>, Flow> {
        let max_tasks = if work.batches() {
            self.settings.claim_batch
        } else {
            1
        };
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
                match self.dead_letter_too_large(leadership, &task, cost).await {
                    Ok(_) => work.backlog.forget(&task.key),
                    Err(stop) => return Err(Flow::Leave(Some(stop))),
                }
                return Err(Flow::Again);
            }
        };
        let alone = work.single;
        let started = self.claim_and_apply(leadership, work, batch, alone).await;
        // Possibly none: the tasks were deferred, put back or read again.
        Flow::from_started(started)
    }

    /// After a batch's runs, with a claim sent ahead of them: a second claim goes out if
    /// the runs beat its answer; the answer is read; if it did not hold, what the second
    /// took goes back (the order holds); the next claim goes out before the answer is
    /// applied; then the batch the answer took starts next, is sent back, or goes back
    /// untouched as `batches::after_batch` says.
    async fn after_runs(
        &self,
        lead: Leading<'_>,
        line: &mut Line<'_>,
        ran: Ran,
        sent: Flight,
    ) -> Result<(), Flow> {
        let leadership = lead.leadership;
        let mut stopping = None;
        let mut relist = false;
        let mut second = None;
        if send_second(&ran, sent.answered()) {
            match self.send_ahead(lead, &mut line.work, true).await {
                Ok(sent) => second = sent,
                Err(stop) => stopping = Some(stop),
            }
        }
        let (claim, riders) = self.answer(leadership, sent).await;
        let held = matches!(claim, Claim::Claimed { .. });
        match second {
            Some(later) if held => line.flight = Some(later),
            // The earlier claim did not hold: what the later one claimed goes back and is
            // read again, so that the order holds.
            Some(later) => match self.take_back(leadership, &mut line.work, later).await {
                Ok(true) => {}
                Ok(false) => relist = true,
                Err(stop) => stopping = Some(stop),
            },
            None => {}
        }
        if send_next_early(line.flight.is_some(), stopping.is_some(), held, &ran) {
            match self.send_ahead(lead, &mut line.work, true).await {
                Ok(sent) => line.flight = sent,
                Err(stop) => stopping = Some(stop),
            }
        }
        let started = self.apply_claim(leadership, &mut line.work, claim, riders, false);
        let next = match started.await {
            Started::Runs(next) => next,
            Started::Relist => {
                let end = match ran {
                    Ran::End(stop) => Some(stop),
                    _ => stopping,
                };
                return Err(Flow::Leave(end));
            }
            Started::End(stop) => return Err(Flow::Leave(Some(stop))),
        };
        match after_batch(stopping, relist, ran, line.work.pace.fast()) {
            Then::Start => {
                line.ahead = next;
                Ok(())
            }
            Then::SendBack => {
                let sent = self.send_back(leadership, &mut line.work, next).await;
                Flow::from_sent_back(sent)
            }
            Then::PutBack(end) => {
                self.release_unstarted(leadership, next).await;
                Err(Flow::Leave(end))
            }
        }
    }

    /// A later claim whose earlier one did not hold: its answer is applied and what it
    /// claimed goes back and is read again. `Ok(false)`: it could not be read; list again.
    async fn take_back(
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

    /// Plans and sends a claim ahead of the runs (its riders taken out of the finished),
    /// when `wanted`, handlers are fast, batches are allowed and the leading may go on;
    /// `None`: the next claim follows the runs. A first pending task too large to claim
    /// even alone is dead-lettered here, and the next claim follows the runs.
    async fn send_ahead(
        &self,
        lead: Leading<'_>,
        work: &mut Work<'_>,
        wanted: bool,
    ) -> Result<Option<Flight>, LeadEnd> {
        if !wanted
            || !work.batches()
            || self.must_stop(lead.lease, lead.shutdown).is_some()
            || !lead.lease.outlasts(self.lease_rules.claim_headroom)
        {
            return Ok(None);
        }
        let leadership = lead.leadership;
        let max_tasks = self.settings.claim_batch;
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

    /// Runs a claimed batch one task at a time. A run that ends the leading, or a stop
    /// between runs, puts back what did not start; a slow run sends the rest of the batch
    /// back and reads it again (the pace counts each run).
    async fn run_batch(
        &self,
        lead: Leading<'_>,
        claimed: Vec<(Claimed, TaskVersion)>,
        work: &mut Work<'_>,
    ) -> Ran {
        let leadership = lead.leadership;
        let mut claimed = claimed.into_iter();
        while let Some((task, claimed_version)) = claimed.next() {
            // "Renew between tasks": a batch claimed ahead still runs only while the lease
            // is fresh; what did not start (this task included) goes back untouched.
            if let Some(stop) = self.must_stop(lead.lease, lead.shutdown) {
                let unstarted = std::iter::once((task, claimed_version))
                    .chain(claimed.by_ref())
                    .collect();
                self.release_unstarted(leadership, unstarted).await;
                return Ran::End(stop);
            }
            let key = task.task.key.clone();
            let finished_before = work.finished.len();
            let run = self
                .run_claimed(lead, task, claimed_version, &mut work.finished)
                .await;
            if work.finished.len() == finished_before {
                // Not a success: a retry was written back or the task moved. The next
                // look reads the key again, so the retry is known when due.
                work.backlog.forget(&key);
            }
            work.pace.record(run.elapsed);
            // Past a slow run, finished tasks are recorded at once rather than at the
            // next claim, which keeps the window in which a crash makes them run again
            // short.
            if !work.pace.fast() && !work.finished.is_empty() {
                let finished = std::mem::take(&mut work.finished);
                work.finished = self
                    .complete_known(leadership, &mut work.backlog, finished)
                    .await;
            }
            if let Some(stop) = run.end {
                self.release_unstarted(leadership, claimed.collect()).await;
                return Ran::End(stop);
            }
            if !work.pace.fast() && claimed.len() > 0 {
                // The batch was claimed on the promise of fast runs. A slow one sends the
                // rest back unchanged, so that a batch of slow tasks never holds up an
                // earlier task that arrives or falls due.
                let rest = claimed.by_ref().collect();
                match self.send_back(leadership, work, rest).await {
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
            sorted.pending,
            sorted.delayed,
        );
        Ok(true)
    }
}
