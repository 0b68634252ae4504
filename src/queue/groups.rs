//! Concurrency groups (`[queue] concurrency` above 1): up to N runs at once under the one
//! leadership, never two tasks of one `taskGroup` at once, and each group in claim order.
//! Tasks without a group form one group. Each run is supervised, fenced and settled
//! exactly as a run on its own (`run.rs`); this file decides which tasks start and when.
//!
//! A group with a task held by another lease (a previous leader's run, until that lease
//! ends) is busy too, so two leaders never run one group at once.
//!
//! Whenever slots are free the leader claims, in one write, the earliest task of each
//! group with nothing running (up to the free slots), and the completions of the runs that
//! ended ride along in that write. While it claims, looks or records, the runs in progress
//! are polled all the same, so their handlers' supervision never waits on the leader's
//! I/O. The leader lists again only once every run of the listing is over, so a listing
//! never sees this lease's own runs in progress (it would take them for runs cut short).

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio_util::sync::CancellationToken;

use super::backlog::{Backlog, Next, LOOK_INTERVAL};
use super::claim::{Batch, Candidate, Started};
use super::finished::{ride_able, riders, Finished};
use super::plan::{plan_claim, ClaimPlan};
use super::run::Claimed;
use super::run::RunOutcome;
use super::sort::{Look, Memory};
use super::{LeadEnd, Queue};
use crate::coord::{Leadership, TaskVersion, WriteCost};
use crate::leader::Lease;
use crate::task::Task;

/// How often the leader lists again while every claimable task belongs to a group whose
/// task another lease holds (the runs of a previous leader, until its lease ends).
const HELD_GROUP_RELIST: Duration = Duration::from_secs(1);

/// A run that ended: its group and key, and its task if it succeeded.
struct GroupRun {
    group: String,
    key: String,
    finished: Vec<Finished>,
    outcome: RunOutcome,
}

/// Why no further task starts for now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stall {
    /// Every slot is taken.
    Full,
    /// Every pending task's group is running or waits for a retry.
    NothingFree,
    /// Nothing is pending; runs are in progress, so new tasks are looked for meanwhile.
    Empty,
    /// No more claims from this listing (list again, paused, or leading ends).
    Over,
}

/// Awaits `work` while polling `runs`, keeping the runs that end meanwhile in `ended`: the
/// handlers' supervision (lease deadline, shutdown) never waits on the leader's I/O.
async fn polling<F, R, T>(
    runs: &mut FuturesUnordered<F>,
    ended: &mut Vec<R>,
    work: impl Future<Output = T>,
) -> T
where
    F: Future<Output = R>,
{
    let mut work = std::pin::pin!(work);
    loop {
        tokio::select! {
            out = &mut work => return out,
            Some(ran) = runs.next(), if !runs.is_empty() => ended.push(ran),
        }
    }
}

impl Queue {
    /// Works through a listing's backlog with up to `concurrency` runs at once. Returns
    /// once no more can be claimed from this listing and every run has ended, with the
    /// completions it could not record.
    pub(super) async fn drive_groups(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
        mut backlog: Backlog,
        memory: &mut Memory,
    ) -> (Option<LeadEnd>, Vec<Finished>) {
        let limit = self.settings.concurrency;
        let mut runs = FuturesUnordered::new();
        let mut ended: Vec<GroupRun> = Vec::new();
        let mut busy: HashSet<String> = HashSet::new();
        let mut finished: Vec<Finished> = Vec::new();
        let mut end: Option<LeadEnd> = None;
        let mut over = false;
        // After the coordinator refused a claim as too large, one task per write.
        let mut single = false;
        // After a failed run, its retry (written back under a new version) is read before
        // its group's next task may start, so the group keeps its order.
        let mut look_first = false;
        loop {
            // Runs that ended free their slots and groups before anything is claimed.
            for ran in ended.drain(..) {
                busy.remove(&ran.group);
                if ran.finished.is_empty() {
                    // Retried, dead-lettered or put back: read the key again before its
                    // group goes on.
                    backlog.forget(&ran.key);
                    look_first = true;
                }
                finished.extend(ran.finished);
                if let Some(stop) = ran.outcome.end {
                    end.get_or_insert(stop);
                }
            }
            let stall = 'fill: loop {
                if end.is_some() || over {
                    break Stall::Over;
                }
                if runs.len() >= limit {
                    break Stall::Full;
                }
                if let Some(stop) = self.must_stop(lease, shutdown) {
                    end = Some(stop);
                    continue;
                }
                if !lease.outlasts(self.lease_rules.claim_headroom) {
                    // Renewals are late: a run claimed now could be cut by its supervisor's
                    // kill window. Nothing starts until a renewal comes or the lease runs
                    // out; the runs going on are polled meanwhile.
                    break Stall::NothingFree;
                }
                let next = if look_first {
                    Next::Look
                } else {
                    backlog.next(self.clock().now())
                };
                match next {
                    Next::Claim => {}
                    Next::Look => {
                        look_first = false;
                        let looked = polling(&mut runs, &mut ended, async {
                            match self.look(leadership, &mut backlog, memory).await {
                                Ok(Look::Continue) if self.paused().await => Ok(Look::Relist),
                                other => other,
                            }
                        })
                        .await;
                        match looked {
                            Ok(Look::Continue) => {}
                            Ok(Look::Relist) => over = true,
                            Err(stop) => end = Some(stop),
                        }
                        continue;
                    }
                    Next::Relist => {
                        over = true;
                        continue;
                    }
                    Next::Done if runs.is_empty() => {
                        over = true;
                        continue;
                    }
                    Next::Done => break Stall::Empty,
                }
                // The earliest task of each group with nothing running, up to the free slots.
                let slots = if single { 1 } else { limit - runs.len() };
                let mut batch = Vec::new();
                let mut chosen: HashSet<String> = HashSet::new();
                while batch.len() < slots {
                    let Some(task) = backlog.take_first_free(|group| {
                        !busy.contains(group)
                            && !chosen.contains(group)
                            && !memory.held_groups.contains(group)
                    }) else {
                        break;
                    };
                    chosen.insert(task.group().to_string());
                    batch.push(task);
                }
                if batch.is_empty() {
                    break Stall::NothingFree;
                }
                let claimed = polling(
                    &mut runs,
                    &mut ended,
                    self.claim_free(
                        leadership,
                        &mut backlog,
                        memory,
                        batch,
                        &mut finished,
                        &mut single,
                    ),
                )
                .await;
                match claimed {
                    Started::Runs(started) => {
                        for (claimed, claimed_version) in started {
                            busy.insert(claimed.task.group().to_string());
                            runs.push(self.run_in_group(
                                leadership,
                                lease,
                                shutdown,
                                claimed,
                                claimed_version,
                            ));
                        }
                    }
                    Started::Relist => over = true,
                    Started::End(stop) => end = Some(stop),
                }
                if !ended.is_empty() {
                    break 'fill Stall::Full;
                }
            };
            if stall == Stall::Over && runs.is_empty() && ended.is_empty() {
                break;
            }
            if let (Some(LeadEnd::StepDown(_)), false) = (&end, runs.is_empty()) {
                // Leadership is gone while runs go on: stop their handlers now, as when the
                // lease runs out, instead of letting them finish under a lost leadership.
                lease.mark_lost(&leadership.lease);
            }
            if stall == Stall::NothingFree && runs.is_empty() && !memory.held_groups.is_empty() {
                // What is left waits for runs another lease holds (a previous leader's):
                // list again after a while to see them end.
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = lease.expired() => {}
                    _ = tokio::time::sleep(HELD_GROUP_RELIST) => {}
                }
                over = true;
                continue;
            }
            if !ended.is_empty() {
                continue;
            }
            // Nothing more starts now: record what finished at once rather than at the
            // next claim, which keeps the window in which a crash makes a finished task
            // run again short.
            if !finished.is_empty() && end.is_none() {
                let done = std::mem::take(&mut finished);
                finished = polling(
                    &mut runs,
                    &mut ended,
                    self.complete_known(leadership, &mut backlog, done),
                )
                .await;
                if !ended.is_empty() {
                    continue;
                }
            }
            let ran = if stall == Stall::Full || stall == Stall::Over {
                runs.next().await
            } else {
                // Something may arrive or fall due meanwhile: look again after a while.
                tokio::select! {
                    ran = runs.next(), if !runs.is_empty() => ran,
                    _ = tokio::time::sleep(LOOK_INTERVAL) => {
                        look_first = stall == Stall::Empty;
                        None
                    }
                }
            };
            ended.extend(ran);
        }
        let unrecorded = self.complete_all(leadership, finished).await;
        (end, unrecorded)
    }

    /// Runs one claimed task, as a future of its own among the group's runs.
    async fn run_in_group(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
        claimed: Claimed,
        claimed_version: TaskVersion,
    ) -> GroupRun {
        let group = claimed.task.group().to_string();
        let key = claimed.task.key.clone();
        let mut finished = Vec::new();
        let outcome = self
            .run_claimed(
                leadership,
                lease,
                shutdown,
                claimed,
                claimed_version,
                &mut finished,
            )
            .await;
        GroupRun {
            group,
            key,
            finished,
            outcome,
        }
    }

    /// Claims `batch` (tasks of distinct free groups, in claim order) in one write within
    /// the coordinator's limits, with as many finished tasks' completions as fit. Tasks
    /// that do not fit go back to the backlog in their place.
    async fn claim_free(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        memory: &mut Memory,
        mut batch: Vec<Task>,
        finished: &mut Vec<Finished>,
        single: &mut bool,
    ) -> Started {
        let now = self.clock().now();
        let candidates: Vec<Candidate> = batch
            .iter()
            .map(|task| Candidate::new(task, leadership, &self.node_id, now))
            .collect();
        let (guard, shares) = riders(self.coord.guard_cost(), ride_able(finished));
        let claims: Vec<WriteCost> = candidates
            .iter()
            .map(|candidate| self.coord.cost(candidate.op()))
            .collect();
        let limits = self.coord.limits();
        let riding = if *single { &[][..] } else { &shares[..] };
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
            tasks: batch,
            candidates,
            deletions,
        };
        // A write of one task with no completions riding along is already alone.
        self.claim_and_apply(leadership, backlog, memory, batch, finished, single, true)
            .await
    }
}
