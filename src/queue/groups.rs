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

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::backlog::{Next, LOOK_INTERVAL};
use super::claim::{Batch, Candidate, Started};
use super::finished::{ride_able, riders, Finished};
use super::plan::{plan_claim, ClaimPlan};
use super::run::{Claimed, RunOutcome};
use super::slots::{may_start, Chosen, Taken};
use super::sort::Look;
use super::work::{Leading, Work};
use super::{LeadEnd, Queue};
use crate::coord::{Leadership, TaskVersion, WriteCost};
use crate::task::Task;

/// How often the leader lists again while every claimable task belongs to a group whose
/// task another lease holds (the runs of a previous leader, until its lease ends).
const HELD_GROUP_RELIST: Duration = Duration::from_secs(1);

/// A run that ended: its group and key, and its task if it succeeded.
struct GroupRun {
    group: String,
    kind: String,
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

/// The runs in progress, each a future polled in place (they borrow the leader's state).
type Runs<'a> = FuturesUnordered<Pin<Box<dyn Future<Output = GroupRun> + Send + 'a>>>;

/// The driver's state with several runs at once: the work, the runs going on and those
/// that ended and are not yet taken in, the groups running, why the leading ends (if it
/// does), whether this listing is over, and whether a look comes before the next claim.
struct Slots<'a, 'm> {
    work: Work<'m>,
    runs: Runs<'a>,
    ended: Vec<GroupRun>,
    busy: HashSet<String>,
    /// Runs in progress by `taskType`, for the types' caps.
    kinds: HashMap<String, usize>,
    end: Option<LeadEnd>,
    over: bool,
    /// After a failed run, its retry (written back under a new version) is read before
    /// its group's next task may start, so the group keeps its order.
    look_first: bool,
}

impl Slots<'_, '_> {
    /// Takes in the runs that ended: they free their slots and groups before anything is
    /// claimed; a run that did not succeed (retried, dead-lettered, put back) has its key
    /// read again before its group goes on.
    fn take_in_ended(&mut self) {
        for ran in self.ended.drain(..) {
            self.busy.remove(&ran.group);
            if let Some(running) = self.kinds.get_mut(&ran.kind) {
                *running = running.saturating_sub(1);
            }
            if ran.finished.is_empty() {
                self.work.backlog.forget(&ran.key);
                self.look_first = true;
            }
            self.work.finished.extend(ran.finished);
            if let Some(stop) = ran.outcome.end {
                self.end.get_or_insert(stop);
            }
        }
    }
}

/// What the backlog says before a claim, for the slots.
enum Ready {
    Claim,
    /// A look was made, or the listing is over: decide again.
    Again,
    Stall(Stall),
}

impl Queue {
    /// Works through a listing's backlog with up to `concurrency` runs at once. Returns
    /// once no more can be claimed from this listing and every run has ended, with the
    /// completions it could not record.
    pub(super) async fn drive_groups<'a>(
        &'a self,
        lead: Leading<'a>,
        work: Work<'_>,
    ) -> (Option<LeadEnd>, Vec<Finished>) {
        let mut slots = Slots {
            work,
            runs: FuturesUnordered::new(),
            ended: Vec::new(),
            busy: HashSet::new(),
            kinds: HashMap::new(),
            end: None,
            over: false,
            look_first: false,
        };
        loop {
            slots.take_in_ended();
            let stall = self.fill(lead, &mut slots).await;
            if stall == Stall::Over && slots.runs.is_empty() && slots.ended.is_empty() {
                break;
            }
            if let (Some(LeadEnd::StepDown(_)), false) = (&slots.end, slots.runs.is_empty()) {
                // Leadership is gone while runs go on: stop their handlers now, as when the
                // lease runs out, instead of letting them finish under a lost leadership.
                lead.lease.mark_lost(&lead.leadership.lease);
            }
            let held = !slots.work.memory.held_groups.is_empty();
            if stall == Stall::NothingFree && slots.runs.is_empty() && held {
                // What is left waits for runs another lease holds (a previous leader's):
                // list again after a while to see them end.
                tokio::select! {
                    _ = lead.shutdown.cancelled() => {}
                    _ = lead.lease.expired() => {}
                    _ = tokio::time::sleep(HELD_GROUP_RELIST) => {}
                }
                slots.over = true;
                continue;
            }
            if !slots.ended.is_empty() || !self.record_finished(lead, &mut slots).await {
                continue;
            }
            self.wait_for_runs(&mut slots, stall).await;
        }
        let finished = std::mem::take(&mut slots.work.finished);
        let unrecorded = self.complete_all(lead.leadership, finished).await;
        (slots.end, unrecorded)
    }

    /// Claims into the free slots until no further task starts for now, and says why.
    async fn fill<'a>(&'a self, lead: Leading<'a>, slots: &mut Slots<'a, '_>) -> Stall {
        loop {
            if slots.end.is_some() || slots.over {
                return Stall::Over;
            }
            if slots.runs.len() >= self.settings.concurrency {
                return Stall::Full;
            }
            if let Some(stop) = self.must_stop(lead.lease, lead.shutdown) {
                slots.end = Some(stop);
                continue;
            }
            if !lead.lease.outlasts(self.lease_rules.claim_headroom) {
                // Renewals are late: a run claimed now could be cut by its supervisor's
                // kill window. Nothing starts until a renewal comes or the lease runs
                // out; the runs going on are polled meanwhile.
                return Stall::NothingFree;
            }
            match self.ready(lead.leadership, slots).await {
                Ready::Claim => {}
                Ready::Again => continue,
                Ready::Stall(stall) => return stall,
            }
            if let Some(stall) = self.claim_slots(lead, slots).await {
                return stall;
            }
        }
    }

    /// What the backlog asks for before a claim: a look (made here, the runs polled
    /// meanwhile), a listing, or nothing more for now.
    async fn ready(&self, leadership: &Leadership, slots: &mut Slots<'_, '_>) -> Ready {
        let next = if slots.look_first {
            Next::Look
        } else {
            slots.work.backlog.next(self.clock().now())
        };
        match next {
            Next::Claim => Ready::Claim,
            Next::Look => {
                slots.look_first = false;
                let work = &mut slots.work;
                let looked = polling(&mut slots.runs, &mut slots.ended, async move {
                    match self.look(leadership, &mut work.backlog, work.memory).await {
                        Ok(Look::Continue) if self.stops_for_a_pause(&mut *work.memory).await => {
                            Ok(Look::Relist)
                        }
                        other => other,
                    }
                })
                .await;
                match looked {
                    Ok(Look::Continue) => {}
                    Ok(Look::Relist) => slots.over = true,
                    Err(stop) => slots.end = Some(stop),
                }
                Ready::Again
            }
            Next::Relist => {
                slots.over = true;
                Ready::Again
            }
            Next::Done if slots.runs.is_empty() => {
                slots.over = true;
                Ready::Again
            }
            Next::Done => Ready::Stall(Stall::Empty),
        }
    }

    /// Claims, in one write, the earliest task of each group with nothing running, up to
    /// the free slots, and starts their runs. `Some`: nothing more starts for now.
    async fn claim_slots<'a>(
        &'a self,
        lead: Leading<'a>,
        slots: &mut Slots<'a, '_>,
    ) -> Option<Stall> {
        let free = if slots.work.single {
            1
        } else {
            self.settings.concurrency - slots.runs.len()
        };
        let mut batch = Vec::new();
        let mut chosen = Chosen::default();
        let memory = &slots.work.memory;
        let taken = Taken {
            running_groups: &slots.busy,
            running_kinds: &slots.kinds,
            held_groups: &memory.held_groups,
            held_kinds: &memory.held_kinds,
        };
        while batch.len() < free {
            let Some(task) = slots.work.backlog.take_first_free(|group, kind| {
                let cap = self.registry.policy(kind).concurrency;
                may_start(group, kind, cap, &taken, &chosen)
            }) else {
                break;
            };
            chosen.add(task.group(), &task.task_type);
            batch.push(task);
        }
        if batch.is_empty() {
            return Some(Stall::NothingFree);
        }
        let claim = self.claim_free(lead.leadership, &mut slots.work, batch);
        match polling(&mut slots.runs, &mut slots.ended, claim).await {
            Started::Runs(started) => {
                for (claimed, claimed_version) in started {
                    slots.busy.insert(claimed.task.group().to_string());
                    let kind = claimed.task.task_type.clone();
                    *slots.kinds.entry(kind).or_default() += 1;
                    let run = self.run_in_group(lead, claimed, claimed_version);
                    slots.runs.push(Box::pin(run));
                }
            }
            Started::Relist => slots.over = true,
            Started::End(stop) => slots.end = Some(stop),
        }
        (!slots.ended.is_empty()).then_some(Stall::Full)
    }

    /// Nothing more starts now: records what finished at once rather than at the next
    /// claim, which keeps the window in which a crash makes a finished task run again
    /// short. `false`: runs ended meanwhile, to be taken in first.
    async fn record_finished(&self, lead: Leading<'_>, slots: &mut Slots<'_, '_>) -> bool {
        if slots.work.finished.is_empty() || slots.end.is_some() {
            return true;
        }
        let done = std::mem::take(&mut slots.work.finished);
        let work = &mut slots.work;
        let recording = self.complete_known(lead.leadership, &mut work.backlog, done);
        work.finished = polling(&mut slots.runs, &mut slots.ended, recording).await;
        slots.ended.is_empty()
    }

    /// Waits for a run to end; when something may arrive or fall due meanwhile (a slot or
    /// a group is free), for at most a look's interval.
    async fn wait_for_runs(&self, slots: &mut Slots<'_, '_>, stall: Stall) {
        let ran = if stall == Stall::Full || stall == Stall::Over {
            slots.runs.next().await
        } else {
            tokio::select! {
                ran = slots.runs.next(), if !slots.runs.is_empty() => ran,
                _ = tokio::time::sleep(LOOK_INTERVAL) => {
                    slots.look_first = stall == Stall::Empty;
                    None
                }
            }
        };
        slots.ended.extend(ran);
    }

    /// Runs one claimed task, as a future of its own among the group's runs.
    async fn run_in_group(
        &self,
        lead: Leading<'_>,
        claimed: Claimed,
        claimed_version: TaskVersion,
    ) -> GroupRun {
        let group = claimed.task.group().to_string();
        let kind = claimed.task.task_type.clone();
        let key = claimed.task.key.clone();
        let mut finished = Vec::new();
        let outcome = self
            .run_claimed(lead, claimed, claimed_version, &mut finished)
            .await;
        GroupRun {
            group,
            kind,
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
        work: &mut Work<'_>,
        mut batch: Vec<Task>,
    ) -> Started {
        let backlog = &mut work.backlog;
        let now = self.clock().now();
        let candidates: Vec<Candidate> = batch
            .iter()
            .map(|task| Candidate::new(task, leadership, &self.node_id, now))
            .collect();
        let (guard, shares) = riders(self.coord.guard_cost(), ride_able(&work.finished));
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
            tasks: batch,
            candidates,
            deletions,
        };
        // A write of one task with no completions riding along is already alone.
        self.claim_and_apply(leadership, work, batch, true).await
    }
}
