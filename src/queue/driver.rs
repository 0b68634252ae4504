//! The driver: works through a listing's backlog as the term core (`term.rs`) decides. It
//! sees ([`Queue::see`]: the lease, the shutdown, what the backlog asks for, the reads and
//! claims on their way), asks the core, performs the actions it answers and feeds their
//! outcomes back, until the core says to leave. It decides nothing itself.
//!
//! The runs in progress are futures polled in place (they borrow the leader's state);
//! while the driver claims, looks or records, they are polled all the same, so their
//! handlers' supervision never waits on the leader's I/O, and those that end meanwhile
//! are fed to the core after the outcome of what was being done. The claims themselves
//! are `flights.rs`; running and settling a task is `run.rs`.
//!
//! Size: the shell around the core, one method per action it performs; the claim into
//! free slots keeps here what it reads before it chooses (values, rated types' records).

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::backlog::Backlog;
use super::claim::{Claim, Started};
use super::finished::Finished;
use super::flights::Flight;
use super::rates::{rate_key, Rate, Starts};
use super::run::{Claimed, RunOutcome};
use super::slots::{may_start, Chosen, Taken};
use super::sort::{Look, Memory, Reading};
use super::term::{Action, Came, Event, ReadKind, Seen, Term, HELD_GROUP_RELIST};
use super::work::{Leading, Work};
use super::{LeadEnd, Queue};
use crate::coord::{TaskOp, TaskVersion};
use crate::task::Task;

/// A run that ended: its group, type and key, its task if it succeeded, and how it went.
struct Ended {
    group: String,
    kind: String,
    key: String,
    finished: Vec<Finished>,
    outcome: RunOutcome,
}

/// The runs in progress, each a future polled in place.
type Runs<'a> = FuturesUnordered<Pin<Box<dyn Future<Output = Ended> + Send + 'a>>>;

/// What the driver holds while it works through one listing, that the core knows only by
/// count: the runs and those that ended and are not yet told, the tasks claimed and not
/// started, the claims on their way and an answer read but not applied, a read beside the
/// claims, and the groups and types running (for who may take a free slot).
struct Shell<'a, 'm> {
    work: Work<'m>,
    runs: Runs<'a>,
    ended: Vec<Ended>,
    ahead: VecDeque<(Claimed, TaskVersion)>,
    flights: VecDeque<Flight>,
    answer: Option<(Claim, Vec<Finished>)>,
    reading: Option<Reading>,
    busy: HashSet<String>,
    kinds: HashMap<String, usize>,
    /// The rated types' recorded starts, as last read (`None`: to be read before the next
    /// claim, since a claim that took rated tasks rewrote them).
    rates: Option<HashMap<String, Starts>>,
}

/// Awaits `work` while polling `runs`, keeping the runs that end meanwhile in `ended`.
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

/// A claim's, a read's or a send back's outcome, for the core.
fn came_of(started: Started, shell: &mut Shell<'_, '_>) -> Came {
    match started {
        Started::Runs(runs) => {
            let n = runs.len();
            shell.ahead.extend(runs);
            Came::On(n)
        }
        Started::Relist => Came::Relist,
        Started::End(stop) => Came::End(stop),
    }
}

fn came_of_look(looked: Result<Look, LeadEnd>) -> Came {
    match looked {
        Ok(Look::Continue) => Came::On(0),
        Ok(Look::Relist) => Came::Relist,
        Err(stop) => Came::End(stop),
    }
}

fn came_of_sent_back(sent: Result<bool, LeadEnd>) -> Came {
    match sent {
        Ok(true) => Came::On(0),
        Ok(false) => Came::Relist,
        Err(stop) => Came::End(stop),
    }
}

impl Shell<'_, '_> {
    /// Takes in a run that ended: its slot, group and type are free; a run that did not
    /// succeed (retried, dead-lettered, put back) has its key read again before it runs.
    fn take_in(&mut self, ran: Ended) -> Event {
        self.busy.remove(&ran.group);
        if let Some(running) = self.kinds.get_mut(&ran.kind) {
            *running = running.saturating_sub(1);
        }
        let succeeded = !ran.finished.is_empty();
        if !succeeded {
            self.work.backlog.forget(&ran.key);
        }
        self.work.finished.extend(ran.finished);
        Event::RunEnded {
            succeeded,
            elapsed: ran.outcome.elapsed,
            end: ran.outcome.end,
        }
    }
}

impl Queue {
    /// Works through a listing's backlog: with one run at a time, claims batched while
    /// handlers are fast and claimed ahead of the runs; with `queue.concurrency` above 1,
    /// up to that many runs at once, one per `taskGroup`. Returns why the leading ends, if
    /// it does, and the completions it could not record.
    pub(super) async fn drive<'a>(
        &'a self,
        lead: Leading<'a>,
        backlog: Backlog,
        memory: &mut Memory,
    ) -> (Option<LeadEnd>, Vec<Finished>) {
        let mut shell = Shell {
            work: Work::new(backlog, memory),
            runs: FuturesUnordered::new(),
            ended: Vec::new(),
            ahead: VecDeque::new(),
            flights: VecDeque::new(),
            answer: None,
            reading: None,
            busy: HashSet::new(),
            kinds: HashMap::new(),
            rates: None,
        };
        let slots = self.sharding.slots(self.settings.concurrency);
        let mut term = Term::new(slots, self.settings.claim_batch);
        if slots <= 1 && self.settings.concurrency > 1 {
            // A shard with one of the replica's several slots still keeps the groups' and
            // caps' rules, as several slots do.
            term = term.without_claims_ahead();
        }
        let rated = |kind: &str| self.registry.has_rate(kind);
        if self.registry.rates().next().is_some() && shell.work.backlog.has_pending_of(rated) {
            // A type's rate is decided task by task, as the slots choose them. Without a
            // task of a rated type pending, claims are batched (and stop before one that
            // falls due or arrives: `plan_batch`, which lists again then).
            term = term.without_claims_ahead();
        }
        let mut events = vec![Event::Go];
        let end = loop {
            let event = events.pop().unwrap_or(Event::Go);
            for earlier in events.drain(..) {
                term.absorb(earlier);
            }
            let seen = self.see(lead, &mut shell);
            let mut outcome = Event::Go;
            let mut leave = None;
            for action in term.step(event, &seen) {
                match action {
                    Action::Leave(end) => leave = Some(end),
                    action => outcome = self.perform(lead, &mut shell, action).await,
                }
            }
            if let Some(end) = leave {
                break end;
            }
            events.push(outcome);
            let ended: Vec<Ended> = shell.ended.drain(..).collect();
            events.extend(ended.into_iter().map(|ran| shell.take_in(ran)));
        };
        self.leave(lead, shell, end).await
    }

    /// What the driver sees now, for the core.
    fn see(&self, lead: Leading<'_>, shell: &mut Shell<'_, '_>) -> Seen {
        let work = &mut shell.work;
        Seen {
            stop: self.must_stop(lead.lease, lead.shutdown),
            headroom: lead.lease.outlasts(self.lease_rules.claim_headroom),
            next: work.backlog.next(self.clock().now()),
            in_line: work.backlog.looks_in_line(),
            read_ready: shell.reading.as_ref().is_some_and(Reading::is_ready),
            answered: shell.flights.front().is_some_and(Flight::answered),
            finished: !work.finished.is_empty(),
            unsure: work.finished.iter().any(|done| done.sent_under.is_some()),
            single: work.single,
            held: !work.memory.held_groups.is_empty() || !work.memory.held_kinds.is_empty(),
        }
    }

    /// Performs one action; answers its outcome.
    async fn perform<'a>(
        &'a self,
        lead: Leading<'a>,
        shell: &mut Shell<'a, '_>,
        action: Action,
    ) -> Event {
        let leadership = lead.leadership;
        match action {
            Action::Claim { max_tasks } => {
                let started = self.claim_now(leadership, &mut shell.work, max_tasks).await;
                Event::Claimed(came_of(started, shell))
            }
            Action::ClaimFree { free } => Event::Claimed(self.claim_slots(lead, shell, free).await),
            Action::SendClaim { max_tasks } => {
                let sent = self
                    .send_ahead(leadership, &mut shell.work, max_tasks)
                    .await;
                Event::Sent(sent.map(|flight| {
                    let went = flight.is_some();
                    shell.flights.extend(flight);
                    went
                }))
            }
            Action::ReadAnswer => {
                let Some(flight) = shell.flights.pop_front() else {
                    return Event::Answered { held: false };
                };
                let (claim, riders) = self.answer(leadership, flight).await;
                let held = matches!(claim, Claim::Claimed { .. });
                shell.answer = Some((claim, riders));
                Event::Answered { held }
            }
            Action::ApplyAnswer => {
                let Some((claim, riders)) = shell.answer.take() else {
                    return Event::Applied(Came::On(0));
                };
                let applied = self.apply_claim(leadership, &mut shell.work, claim, riders, false);
                let started = applied.await;
                Event::Applied(came_of(started, shell))
            }
            Action::TakeBack => {
                let Some(later) = shell.flights.pop_front() else {
                    return Event::TakenBack(Came::On(0));
                };
                let taken = self.take_back(leadership, &mut shell.work, later).await;
                Event::TakenBack(came_of_sent_back(taken))
            }
            Action::Start => {
                if let Some((claimed, version)) = shell.ahead.pop_front() {
                    self.start(lead, shell, claimed, version);
                }
                Event::Go
            }
            Action::PutBack => {
                let ahead = shell.ahead.drain(..).collect();
                self.release_unstarted(leadership, ahead).await;
                Event::Go
            }
            Action::SendBack => {
                let ahead = shell.ahead.drain(..).collect();
                let sent = self.send_back(leadership, &mut shell.work, ahead).await;
                Event::SentBack(came_of_sent_back(sent))
            }
            Action::Record | Action::SettleUnsure | Action::Look | Action::MergeRead => {
                self.perform_polled(lead, shell, action).await
            }
            action => self.perform_waits(lead, shell, action).await,
        }
    }

    /// Performs an action that starts a read, holds, or waits.
    async fn perform_waits(
        &self,
        lead: Leading<'_>,
        shell: &mut Shell<'_, '_>,
        action: Action,
    ) -> Event {
        match action {
            Action::StartRead(kind) => {
                let backlog = &mut shell.work.backlog;
                shell.reading = Some(match kind {
                    ReadKind::Look => self.start_look(backlog),
                    ReadKind::Relist => self.start_relist(lead.leadership, backlog),
                });
                Event::Go
            }
            Action::Hold => Event::Held(self.hold(lead, shell).await),
            Action::MarkLost => {
                lead.lease.mark_lost(&lead.leadership.lease);
                Event::Go
            }
            Action::WaitRuns { at_most } => self.wait_runs(shell, at_most).await,
            Action::WaitHeld => {
                tokio::select! {
                    _ = lead.shutdown.cancelled() => {}
                    _ = lead.lease.expired() => {}
                    _ = tokio::time::sleep(HELD_GROUP_RELIST) => {}
                }
                Event::Waited
            }
            // Performed elsewhere.
            _ => Event::Go,
        }
    }

    /// Performs an action that reads or records, the runs polled meanwhile.
    async fn perform_polled(
        &self,
        lead: Leading<'_>,
        shell: &mut Shell<'_, '_>,
        action: Action,
    ) -> Event {
        let leadership = lead.leadership;
        let Shell {
            work,
            runs,
            ended,
            reading,
            ..
        } = shell;
        match action {
            Action::Record => {
                let done = std::mem::take(&mut work.finished);
                let recording = self.complete_known(leadership, &mut work.backlog, done);
                work.finished = polling(runs, ended, recording).await;
                Event::Go
            }
            Action::SettleUnsure => {
                let done = std::mem::take(&mut work.finished);
                let settling = self.settle_unsure(leadership, done);
                work.finished = polling(runs, ended, settling).await;
                Event::Go
            }
            Action::Look => {
                let looking = async {
                    let looked = self.look(leadership, &mut work.backlog, work.memory).await;
                    self.unless_paused(looked, work.memory).await
                };
                Event::Read(came_of_look(polling(runs, ended, looking).await))
            }
            Action::MergeRead => {
                let Some(read) = reading.take() else {
                    return Event::Read(Came::On(0));
                };
                let merging = async {
                    let (backlog, memory) = (&mut work.backlog, &mut *work.memory);
                    let looked = self.finish_reading(leadership, backlog, memory, read).await;
                    self.unless_paused(looked, work.memory).await
                };
                Event::Read(came_of_look(polling(runs, ended, merging).await))
            }
            // Performed elsewhere.
            _ => Event::Go,
        }
    }

    /// A look or merge that went on, unless a pause takes effect there: the queue paused,
    /// or the set of paused types changed (then the listing ends, to be sorted again).
    async fn unless_paused(
        &self,
        looked: Result<Look, LeadEnd>,
        memory: &mut Memory,
    ) -> Result<Look, LeadEnd> {
        match looked {
            Ok(Look::Continue) if self.stops_for_a_pause(memory).await => Ok(Look::Relist),
            other => other,
        }
    }

    /// Renewals are late: a run started now could be cut by its supervisor's kill window.
    /// The claims on their way land, what was claimed ahead goes back; nothing is claimed
    /// or started until a renewal comes or the lease runs out.
    async fn hold(&self, lead: Leading<'_>, shell: &mut Shell<'_, '_>) -> Option<LeadEnd> {
        let headroom = self.lease_rules.claim_headroom;
        tracing::warn!(headroom = %crate::util::duration::format(headroom), "the lease may not outlast a run's kill sequence; claiming nothing until it is renewed");
        if let Some(stop) = self.land_all(lead, shell).await {
            return Some(stop);
        }
        tokio::select! {
            _ = lead.shutdown.cancelled() => {}
            _ = lead.lease.until_it_outlasts(headroom) => {}
        }
        None
    }

    /// Lands every claim on their way and an answer read but not applied, and puts back
    /// what was claimed and not started; why the leading ends, if an answer says so.
    async fn land_all(&self, lead: Leading<'_>, shell: &mut Shell<'_, '_>) -> Option<LeadEnd> {
        let leadership = lead.leadership;
        let mut end = None;
        if let Some((claim, riders)) = shell.answer.take() {
            let applied = self.apply_claim(leadership, &mut shell.work, claim, riders, false);
            // What it claimed goes back with the rest, below.
            if let Came::End(stop) = came_of(applied.await, shell) {
                end.get_or_insert(stop);
            }
        }
        while let Some(flight) = shell.flights.pop_front() {
            if let Some(stop) = self.land(leadership, &mut shell.work, Some(flight)).await {
                end.get_or_insert(stop);
            }
        }
        let ahead = shell.ahead.drain(..).collect();
        self.release_unstarted(leadership, ahead).await;
        end
    }

    /// Waits for a run to end, or at most `at_most`.
    async fn wait_runs(&self, shell: &mut Shell<'_, '_>, at_most: Option<Duration>) -> Event {
        if shell.runs.is_empty() && at_most.is_none() {
            return Event::Waited;
        }
        let ran = match at_most {
            None => shell.runs.next().await,
            Some(at_most) => tokio::select! {
                ran = shell.runs.next(), if !shell.runs.is_empty() => ran,
                _ = tokio::time::sleep(at_most) => None,
            },
        };
        match ran {
            Some(ran) => shell.take_in(ran),
            None => Event::Waited,
        }
    }

    /// The listing is worked through: what is on its way lands, what did not start goes
    /// back, the completions are recorded (those that could not be are handed back).
    async fn leave(
        &self,
        lead: Leading<'_>,
        mut shell: Shell<'_, '_>,
        end: Option<LeadEnd>,
    ) -> (Option<LeadEnd>, Vec<Finished>) {
        let landed = self.land_all(lead, &mut shell).await;
        let finished = std::mem::take(&mut shell.work.finished);
        let unrecorded = self.complete_all(lead.leadership, finished).await;
        (end.or(landed), unrecorded)
    }

    /// Chooses, in claim order, the earliest task of each group that may start (its group
    /// idle here and elsewhere, its type under its cap), up to `free`; claims them in one
    /// write, the runs polled meanwhile, and starts their runs.
    async fn claim_slots<'a>(
        &'a self,
        lead: Leading<'a>,
        shell: &mut Shell<'a, '_>,
        free: usize,
    ) -> Came {
        if !self.fill_front(&mut shell.work.backlog).await {
            return Came::Relist;
        }
        let room = self.rate_room(shell).await;
        let batch = self.choose_free(shell, free, &room);
        if batch.is_empty() {
            return Came::NothingFree;
        }
        let rates = shell.rates.take().unwrap_or_default();
        let now_ms = self.clock().now().timestamp_millis();
        let notes = |tasks: &[Task]| self.rate_notes(&rates, tasks, now_ms);
        let rated = !notes(&batch).is_empty();
        let claim = self.claim_free(lead.leadership, &mut shell.work, batch, notes);
        let started = polling(&mut shell.runs, &mut shell.ended, claim).await;
        if !rated {
            // Nothing recorded: what was read still holds.
            shell.rates = Some(rates);
        }
        let runs = match started {
            Started::Runs(runs) => runs,
            Started::Relist => return Came::Relist,
            Started::End(stop) => return Came::End(stop),
        };
        let n = runs.len();
        for (claimed, version) in runs {
            self.start(lead, shell, claimed, version);
        }
        Came::On(n)
    }

    /// How many more starts each type with a rate may have now, from its record (read
    /// first if a claim rewrote it since, the runs polled meanwhile). A record that cannot
    /// be read allows none: the other types go on.
    async fn rate_room(&self, shell: &mut Shell<'_, '_>) -> HashMap<String, usize> {
        let rated: Vec<(&str, Rate)> = self.registry.rates().collect();
        if rated.is_empty() {
            return HashMap::new();
        }
        if shell.rates.is_none() {
            let keys: Vec<String> = rated
                .iter()
                .map(|(kind, _)| rate_key(&self.settings.prefix, kind))
                .collect();
            let read = polling(&mut shell.runs, &mut shell.ended, self.coord.get(&keys)).await;
            match read {
                Ok(found) => {
                    let starts = rated.iter().zip(&keys).map(|((kind, _), key)| {
                        let stored = found.iter().find(|stored| stored.key == *key);
                        (kind.to_string(), Starts::read(stored))
                    });
                    shell.rates = Some(starts.collect());
                }
                Err(err) => {
                    self.metrics.coordinator_error(&err);
                    tracing::warn!(error = %err, "cannot read the rated types' starts; none of them starts for now");
                }
            }
        }
        let now_ms = self.clock().now().timestamp_millis();
        rated
            .iter()
            .map(|(kind, rate)| {
                let room = shell
                    .rates
                    .as_ref()
                    .and_then(|rates| rates.get(*kind))
                    .map_or(0, |starts| starts.room(rate, now_ms));
                (kind.to_string(), room)
            })
            .collect()
    }

    /// The start records a claim of `tasks` rewrites: one per rated type among them.
    fn rate_notes(
        &self,
        rates: &HashMap<String, Starts>,
        tasks: &[Task],
        now_ms: i64,
    ) -> Vec<TaskOp> {
        let mut notes = Vec::new();
        for (kind, rate) in self.registry.rates() {
            let count = tasks.iter().filter(|task| task.task_type == kind).count();
            if count == 0 {
                continue;
            }
            let key = rate_key(&self.settings.prefix, kind);
            let starts = rates.get(kind).cloned().unwrap_or_default();
            notes.push(starts.record(key, &rate, now_ms, count));
        }
        notes
    }

    /// The tasks to claim into `free` slots, taken out of the backlog in claim order.
    fn choose_free(
        &self,
        shell: &mut Shell<'_, '_>,
        free: usize,
        room: &HashMap<String, usize>,
    ) -> Vec<Task> {
        let mut batch = Vec::new();
        let mut chosen = Chosen::default();
        let memory = &shell.work.memory;
        let taken = Taken {
            running_groups: &shell.busy,
            running_kinds: &shell.kinds,
            held_groups: &memory.held_groups,
            held_kinds: &memory.held_kinds,
            room,
        };
        while batch.len() < free {
            let Some(task) = shell.work.backlog.take_first_free(|group, kind| {
                let cap = self.registry.policy(kind).concurrency;
                may_start(group, kind, cap, &taken, &chosen)
            }) else {
                break;
            };
            chosen.add(task.group(), &task.task_type);
            batch.push(task);
        }
        batch
    }

    /// Starts the run of a claimed task, among the runs polled in place.
    fn start<'a>(
        &'a self,
        lead: Leading<'a>,
        shell: &mut Shell<'a, '_>,
        claimed: Claimed,
        version: TaskVersion,
    ) {
        let group = claimed.task.group().to_string();
        let kind = claimed.task.task_type.clone();
        shell.busy.insert(group.clone());
        *shell.kinds.entry(kind.clone()).or_default() += 1;
        let key = claimed.task.key.clone();
        shell.runs.push(Box::pin(async move {
            let mut finished = Vec::new();
            let outcome = self
                .run_claimed(lead, claimed, version, &mut finished)
                .await;
            Ended {
                group,
                kind,
                key,
                finished,
                outcome,
            }
        }));
    }
}
