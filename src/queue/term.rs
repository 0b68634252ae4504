//! Pure: the term core. It decides every next move of the driver (`driver.rs`) while it
//! works through one listing: [`Term::step`] takes what just happened ([`Event`]) and what
//! the driver sees now ([`Seen`]: the lease, the shutdown, what the backlog asks for, the
//! reads and claims on their way) and answers what to do ([`Action`]): claim, send a claim
//! ahead, read its answer, start a run, put back, send back, look, record, wait, leave.
//! The driver performs the actions and feeds their outcomes back; it decides nothing.
//!
//! One policy, two settings of it. With one slot (`queue.concurrency = 1`) tasks are
//! claimed in batches while handlers are fast and run one after another, and the next
//! batch is claimed *ahead*, while this one runs (up to two claims on their way; what
//! becomes of a batch claimed ahead is `batches.rs`). With several slots, each claim takes
//! the earliest task of each free group (`slots.rs` says who may start) into the free
//! slots, and nothing is claimed ahead. Tested as transcripts (`queue/tests/term.rs`): events
//! in, actions out, no runtime.
//!
//! Size: one state machine; its moves are read together, since each must agree with the
//! others on what is on its way and what was claimed and not started.

use std::time::Duration;

use super::backlog::{Next, LOOK_INTERVAL};
use super::batches::{after_batch, send_next_early, send_second, Ran, Then};
use super::work::Pace;
use super::LeadEnd;

/// How often the leader lists again while every claimable task belongs to a group whose
/// task another lease holds (the runs of a previous leader, until its lease ends).
pub(super) const HELD_GROUP_RELIST: Duration = Duration::from_secs(1);

/// What the driver sees when it asks the core, read just before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Seen {
    /// Why the leading must end now, if it must (shutdown, a lease not known fresh, the
    /// term over).
    pub(super) stop: Option<LeadEnd>,
    /// The lease outlasts a run's kill sequence: a run started now can be stopped whole.
    pub(super) headroom: bool,
    /// What the backlog asks for before the next claim.
    pub(super) next: Next,
    /// A look now is cheap enough to be made before the claim, rather than beside it.
    pub(super) in_line: bool,
    /// A look or listing read beside the claims is in.
    pub(super) read_ready: bool,
    /// The earliest claim on its way is answered (its answer is not read yet).
    pub(super) answered: bool,
    /// Completions are waiting to be recorded.
    pub(super) finished: bool,
    /// Some of them were written in a write whose answer never came.
    pub(super) unsure: bool,
    /// The coordinator refused a claim as too large: one task per write.
    pub(super) single: bool,
    /// Another lease holds tasks of some groups or capped types (a previous leader's runs,
    /// another shard's).
    pub(super) held: bool,
}

/// What a claim, a read or a send back came to, for the core.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Came {
    /// Went on: so many runs were claimed (possibly none), or the read was merged.
    On(usize),
    /// The listing is stale, or what was sent back could not be read again: list again.
    Relist,
    /// Nothing may start now (every pending task's group or type is taken).
    NothingFree,
    End(LeadEnd),
}

/// What just happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Event {
    /// The listing's work begins, or an action that reports nothing was done.
    Go,
    /// A claim made now was answered and applied.
    Claimed(Came),
    /// A claim was sent ahead (`Ok(true)`) or not (nothing to claim, or the runs are slow).
    Sent(Result<bool, LeadEnd>),
    /// The earliest claim on its way was answered: it held, or not (nothing of it applied).
    Answered { held: bool },
    /// The answer read was applied.
    Applied(Came),
    /// What a later claim took, whose earlier claim did not hold, went back and was read.
    TakenBack(Came),
    /// What was sent back was read again.
    SentBack(Came),
    /// A look, or a read made beside the claims, was merged.
    Read(Came),
    /// A run ended: whether it succeeded, how long it took, why the leading ends if it does.
    RunEnded {
        succeeded: bool,
        elapsed: Duration,
        end: Option<LeadEnd>,
    },
    /// The claims on their way landed and what was claimed ahead went back, before a wait
    /// for the lease to be renewed; why the leading ends, if their answers say so.
    Held(Option<LeadEnd>),
    /// A wait ended with no run ending.
    Waited,
}

/// A read the backlog asks for beside the claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReadKind {
    Look,
    Relist,
}

/// What the driver does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Claims up to `max_tasks` of the earliest pending tasks now, in one write, and applies
    /// the answer (`Event::Claimed`).
    Claim { max_tasks: usize },
    /// Claims into `free` slots the earliest task of each group that may start, starts
    /// their runs (`Event::Claimed`).
    ClaimFree { free: usize },
    /// Sends a claim of up to `max_tasks` ahead, on a task of its own (`Event::Sent`).
    SendClaim { max_tasks: usize },
    /// Waits for the earliest claim on its way and reads its answer (`Event::Answered`).
    ReadAnswer,
    /// Applies the answer read: what it claimed waits to start (`Event::Applied`).
    ApplyAnswer,
    /// The earliest claim on its way comes after one that did not hold: its answer is
    /// applied, what it claimed goes back and is read again (`Event::TakenBack`).
    TakeBack,
    /// Starts the run of the first task claimed and not started.
    Start,
    /// Puts back, untouched, what was claimed and not started.
    PutBack,
    /// Puts back what was claimed and not started and reads it again, so that it takes its
    /// place behind what arrived meanwhile (`Event::SentBack`).
    SendBack,
    /// Records the completions waiting, now.
    Record,
    /// Settles completions written in a write whose answer never came.
    SettleUnsure,
    /// Looks at the queue's keys now (and at the pauses), the runs polled meanwhile
    /// (`Event::Read`).
    Look,
    /// Starts a look or a listing, read beside the claims.
    StartRead(ReadKind),
    /// Merges the read made beside the claims (`Event::Read`).
    MergeRead,
    /// Lands the claims on their way, puts back what was claimed ahead, and waits for a
    /// renewal (`Event::Held`).
    Hold,
    /// The leadership is gone while runs go on: their handlers are stopped now.
    MarkLost,
    /// Waits for a run to end (`Event::RunEnded`), or at most `at_most` (`Event::Waited`).
    WaitRuns { at_most: Option<Duration> },
    /// Waits a while for runs another lease holds to end (`Event::Waited`).
    WaitHeld,
    /// The listing is worked through: the claims on their way land, what was claimed and
    /// not started goes back, the completions are recorded; why the leading ends, if it does.
    Leave(Option<LeadEnd>),
}

/// Why no further task starts for now, with several slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stall {
    /// Every slot is taken.
    Full,
    /// Every pending task's group is running or waits for a retry, or renewals are late.
    NothingFree,
    /// Nothing is pending; runs are in progress, so new tasks are looked for meanwhile.
    Empty,
    /// No more claims from this listing (list again, paused, or leading ends).
    Over,
}

/// Where the one-slot policy is within a turn: deciding from the top, claiming, running a
/// batch, or after a batch's runs with a claim ahead of them.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Stage {
    Top,
    /// A claim was made now; then one goes ahead, if the batch is not empty.
    Claiming,
    /// Deciding whether to send a claim ahead of the batch (`Claimed` or taken ahead).
    Sending,
    /// Running the batch; `sent`: a claim went ahead of its runs.
    Running {
        ran: Ran,
        sent: bool,
    },
    /// After the runs, with the claim ahead of them to read.
    After(After),
}

/// The state after a batch's runs: how they ended, why the leading ends if a claim sent
/// meanwhile said, whether what a later claim took could not be read again, whether the
/// answer held, whether a second claim is on its way.
#[derive(Clone, Debug, PartialEq, Eq)]
struct After {
    ran: Ran,
    stopping: Option<LeadEnd>,
    relist: bool,
    held: Option<bool>,
    second: bool,
    step: AfterStep,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AfterStep {
    /// Whether a second claim goes out before the first is answered.
    Second,
    /// Reading the answer.
    Read,
    /// Whether the next claim goes out before the answer is applied.
    Early,
    /// Applying the answer.
    Apply,
    /// Sending back the batch the answer took.
    SendBack,
}

/// The term core: the driver's state while it works through one listing, as data.
#[derive(Debug)]
pub(super) struct Term {
    /// How many runs at once (`queue.concurrency`).
    slots: usize,
    /// With one slot, claims are batched and sent ahead of the runs (not with rates: each
    /// claim is then chosen as the slots policy chooses, task by task).
    ahead_policy: bool,
    /// How many tasks one claim takes at most while handlers are fast.
    claim_batch: usize,
    /// How fast the handlers run lately: claims take batches while they are fast.
    pace: Pace,
    /// Runs in progress.
    running: usize,
    /// Tasks claimed and not started (one slot: the batch to run).
    ahead: usize,
    /// Claims on their way (one slot: up to two).
    flights: usize,
    /// A read beside the claims is on its way.
    reading: bool,
    stage: Stage,
    /// Several slots: why the leading ends, whether the listing is over, whether a look
    /// comes before the next claim, and why nothing started at the last claim.
    end: Option<LeadEnd>,
    over: bool,
    look_first: bool,
    stalled: Option<Stall>,
}

impl Term {
    /// The core of a listing's work with `slots` runs at once and claims of up to
    /// `claim_batch` tasks (with one slot).
    pub(super) fn new(slots: usize, claim_batch: usize) -> Term {
        Term {
            slots: slots.max(1),
            ahead_policy: slots <= 1,
            claim_batch: claim_batch.max(1),
            pace: Pace::default(),
            running: 0,
            ahead: 0,
            flights: 0,
            reading: false,
            stage: Stage::Top,
            end: None,
            over: false,
            look_first: false,
            stalled: None,
        }
    }

    /// The same, with no claim ever sent ahead: one slot is filled as several are, each
    /// claim choosing its task as `slots.rs` says (a type's rate is decided there).
    pub(super) fn without_claims_ahead(mut self) -> Term {
        self.ahead_policy = false;
        self
    }

    /// Takes in what happened, and decides what the driver does next from what it sees.
    pub(super) fn step(&mut self, event: Event, seen: &Seen) -> Vec<Action> {
        if self.ahead_policy {
            self.step_one(event, seen)
        } else {
            self.step_slots(event, seen)
        }
    }

    // One slot: batches, claimed ahead.

    fn step_one(&mut self, event: Event, seen: &Seen) -> Vec<Action> {
        let mut first = Vec::new();
        match event {
            Event::Go | Event::Waited => {}
            Event::Claimed(came) => match came {
                Came::On(runs) => {
                    self.ahead = runs;
                    self.stage = Stage::Claiming;
                }
                Came::NothingFree => self.stage = Stage::Top,
                Came::Relist => return vec![Action::Leave(None)],
                Came::End(stop) => return vec![Action::Leave(Some(stop))],
            },
            Event::Held(Some(stop)) => return vec![Action::Leave(Some(stop))],
            Event::Held(None) => self.stage = Stage::Top,
            Event::Read(came) => {
                self.reading = false;
                match came {
                    Came::On(_) | Came::NothingFree => self.stage = Stage::Top,
                    Came::Relist => return vec![Action::Leave(None)],
                    Came::End(stop) => return vec![Action::Leave(Some(stop))],
                }
            }
            Event::RunEnded { elapsed, end, .. } => first = self.one_ran(elapsed, end, seen),
            Event::SentBack(came) => match &mut self.stage {
                Stage::Running { ran, .. } => {
                    *ran = match came {
                        Came::End(stop) => Ran::End(stop),
                        Came::Relist => Ran::Relist,
                        Came::On(_) | Came::NothingFree => Ran::Done,
                    }
                }
                _ => match came {
                    Came::End(stop) => return vec![Action::Leave(Some(stop))],
                    Came::Relist => return vec![Action::Leave(None)],
                    Came::On(_) | Came::NothingFree => self.stage = Stage::Top,
                },
            },
            Event::Sent(sent) => {
                if let Some(leave) = self.sent(sent) {
                    return leave;
                }
            }
            Event::Answered { held } => self.answered(held),
            Event::TakenBack(came) => self.taken_back(came),
            Event::Applied(came) => {
                if let Some(leave) = self.applied(came) {
                    return leave;
                }
            }
        }
        if !first.is_empty() {
            // Recorded, put back or sent back before anything else; decided again after.
            return first;
        }
        self.decide_one(seen)
    }

    /// A run of the batch ended: the pace counts it; past a slow run the completions are
    /// recorded at once (a crash then makes fewer finished tasks run again); a run that
    /// ends the leading puts back the rest of the batch; a slow one sends it back.
    fn one_ran(&mut self, elapsed: Duration, end: Option<LeadEnd>, seen: &Seen) -> Vec<Action> {
        self.running = self.running.saturating_sub(1);
        self.pace.record(elapsed);
        let mut actions = Vec::new();
        if !self.pace.fast() && seen.finished {
            actions.push(Action::Record);
        }
        let Stage::Running { ran, .. } = &mut self.stage else {
            return actions;
        };
        if let Some(stop) = end {
            *ran = Ran::End(stop);
            if self.ahead > 0 {
                self.ahead = 0;
                actions.push(Action::PutBack);
            }
        } else if !self.pace.fast() && self.ahead > 0 {
            // The batch was claimed on the promise of fast runs. A slow one sends the rest
            // back unchanged, so that a batch of slow tasks never holds up an earlier task
            // that arrives or falls due.
            self.ahead = 0;
            actions.push(Action::SendBack);
        }
        actions
    }

    /// A claim sent ahead (or not): where it was sent from says what comes next.
    fn sent(&mut self, sent: Result<bool, LeadEnd>) -> Option<Vec<Action>> {
        let went = match sent {
            Ok(went) => went,
            Err(stop) if matches!(self.stage, Stage::After(_)) => {
                if let Stage::After(after) = &mut self.stage {
                    after.stopping = Some(stop);
                    after.step = next_after(after.step);
                }
                return None;
            }
            Err(stop) => {
                // What was claimed for these runs goes back untouched.
                let put_back = std::mem::take(&mut self.ahead) > 0;
                self.stage = Stage::Top;
                let mut leave = Vec::new();
                if put_back {
                    leave.push(Action::PutBack);
                }
                leave.push(Action::Leave(Some(stop)));
                return Some(leave);
            }
        };
        if went {
            self.flights += 1;
        }
        match &mut self.stage {
            Stage::After(after) => {
                if after.step == AfterStep::Second {
                    after.second = went;
                }
                after.step = next_after(after.step);
            }
            _ => {
                self.stage = Stage::Running {
                    ran: Ran::Done,
                    sent: went,
                }
            }
        }
        None
    }

    fn answered(&mut self, held: bool) {
        self.flights = self.flights.saturating_sub(1);
        if let Stage::After(after) = &mut self.stage {
            after.held = Some(held);
            after.step = if after.second && !held {
                // Decided at once below: the later claim goes back.
                AfterStep::Read
            } else {
                AfterStep::Early
            };
        }
    }

    fn taken_back(&mut self, came: Came) {
        self.flights = self.flights.saturating_sub(1);
        if let Stage::After(after) = &mut self.stage {
            after.second = false;
            match came {
                Came::On(_) | Came::NothingFree => {}
                Came::Relist => after.relist = true,
                Came::End(stop) => after.stopping = Some(stop),
            }
            after.step = AfterStep::Early;
        }
    }

    /// The answer of the claim ahead of the runs, applied: what it took starts next, is
    /// sent back, or goes back untouched as `batches::after_batch` says.
    fn applied(&mut self, came: Came) -> Option<Vec<Action>> {
        let Stage::After(after) = std::mem::replace(&mut self.stage, Stage::Top) else {
            return None;
        };
        let runs = match came {
            Came::On(runs) => runs,
            Came::NothingFree => 0,
            Came::Relist => {
                let end = match after.ran {
                    Ran::End(stop) => Some(stop),
                    _ => after.stopping,
                };
                return Some(vec![Action::Leave(end)]);
            }
            Came::End(stop) => return Some(vec![Action::Leave(Some(stop))]),
        };
        self.ahead = runs;
        match after_batch(after.stopping, after.relist, after.ran, self.pace.fast()) {
            Then::Start => None,
            Then::SendBack => {
                self.stage = Stage::After(After {
                    step: AfterStep::SendBack,
                    ..After::new(Ran::Done)
                });
                self.ahead = 0;
                Some(vec![Action::SendBack])
            }
            Then::PutBack(end) => {
                let mut leave = Vec::new();
                if std::mem::take(&mut self.ahead) > 0 {
                    leave.push(Action::PutBack);
                }
                leave.push(Action::Leave(end));
                Some(leave)
            }
        }
    }

    /// The one-slot policy's next move, from where the turn stands.
    fn decide_one(&mut self, seen: &Seen) -> Vec<Action> {
        if self.running > 0 {
            return vec![Action::WaitRuns { at_most: None }];
        }
        match self.stage.clone() {
            Stage::Top => self.top(seen),
            Stage::Claiming | Stage::Sending => self.send_ahead(seen, self.ahead > 0),
            Stage::Running { ran, sent } => self.run_next(seen, ran, sent),
            Stage::After(after) => self.after_runs(seen, after),
        }
    }

    /// The top of a turn: a stop leaves; unsure completions are settled; late renewals
    /// hold; a read asked for is made or started, one that is in merged; then the batch
    /// claimed ahead runs, or a claim is made now.
    fn top(&mut self, seen: &Seen) -> Vec<Action> {
        if let Some(stop) = &seen.stop {
            return vec![Action::Leave(Some(stop.clone()))];
        }
        let mut actions = Vec::new();
        if seen.unsure {
            actions.push(Action::SettleUnsure);
        }
        if !seen.headroom {
            // Renewals are late: a run started now could be cut by its supervisor's kill
            // window. What was claimed ahead goes back; nothing starts until a renewal.
            self.ahead = 0;
            self.flights = 0;
            actions.push(Action::Hold);
            return actions;
        }
        match seen.next {
            Next::Claim => {}
            Next::Look if seen.in_line => {
                actions.push(Action::Look);
                return actions;
            }
            Next::Look | Next::Relist => {
                let kind = match seen.next {
                    Next::Relist => ReadKind::Relist,
                    _ => ReadKind::Look,
                };
                self.reading = true;
                actions.push(Action::StartRead(kind));
            }
            Next::Done if self.ahead == 0 && self.flights == 0 => {
                actions.push(Action::Leave(None));
                return actions;
            }
            // The backlog is empty, but the batch claimed ahead is still to run.
            Next::Done => {}
        }
        if self.reading && seen.read_ready {
            actions.push(Action::MergeRead);
            return actions;
        }
        if self.flights > 0 {
            // The batch claimed ahead runs, while the claim after it is on its way.
            self.stage = Stage::Running {
                ran: Ran::Done,
                sent: true,
            };
            return self.then(actions, seen);
        }
        if self.ahead > 0 {
            self.stage = Stage::Sending;
            return self.then(actions, seen);
        }
        let max_tasks = if self.batches(seen) {
            self.claim_batch
        } else {
            1
        };
        actions.push(Action::Claim { max_tasks });
        actions
    }

    /// `actions`, then the next move decided from the same view.
    fn then(&mut self, mut actions: Vec<Action>, seen: &Seen) -> Vec<Action> {
        actions.extend(self.decide_one(seen));
        actions
    }

    /// Whether the next claim may take a batch: handlers are fast, and the coordinator has
    /// not refused a claim as too large.
    fn batches(&self, seen: &Seen) -> bool {
        self.pace.fast() && !seen.single
    }

    /// Whether a claim may go out ahead of runs: batches are allowed and the leading may go
    /// on with room to spare.
    fn may_send(&self, seen: &Seen) -> bool {
        self.batches(seen) && seen.stop.is_none() && seen.headroom
    }

    /// A claim goes out ahead of the batch's runs when there is a batch (`wanted`), the
    /// handlers are fast, batches are allowed and the leading may go on; otherwise the
    /// batch runs with nothing ahead of it.
    fn send_ahead(&mut self, seen: &Seen, wanted: bool) -> Vec<Action> {
        if wanted && self.may_send(seen) {
            return vec![Action::SendClaim {
                max_tasks: self.claim_batch,
            }];
        }
        self.stage = Stage::Running {
            ran: Ran::Done,
            sent: false,
        };
        self.decide_one(seen)
    }

    /// The batch's next run starts ("renew between tasks": only while the leading may go
    /// on; a stop puts back what did not start); once none is left, the turn goes on after
    /// the runs.
    fn run_next(&mut self, seen: &Seen, ran: Ran, sent: bool) -> Vec<Action> {
        if self.ahead > 0 && ran == Ran::Done {
            if let Some(stop) = &seen.stop {
                self.ahead = 0;
                self.stage = Stage::Running {
                    ran: Ran::End(stop.clone()),
                    sent,
                };
                return vec![Action::PutBack];
            }
            self.ahead -= 1;
            self.running += 1;
            return vec![Action::Start];
        }
        if sent {
            self.stage = Stage::After(After::new(ran));
            return self.decide_one(seen);
        }
        self.stage = Stage::Top;
        match ran {
            Ran::Done => self.top(seen),
            Ran::Relist => vec![Action::Leave(None)],
            Ran::End(stop) => vec![Action::Leave(Some(stop))],
        }
    }

    /// After a batch's runs, with a claim sent ahead of them: a second claim goes out if
    /// the runs beat its answer; the answer is read; if it did not hold, what the second
    /// took goes back (the order holds); the next claim goes out before the answer is
    /// applied; then the answer is applied.
    fn after_runs(&mut self, seen: &Seen, mut after: After) -> Vec<Action> {
        let action = match after.step {
            AfterStep::Second if send_second(&after.ran, seen.answered) && self.may_send(seen) => {
                Some(Action::SendClaim {
                    max_tasks: self.claim_batch,
                })
            }
            AfterStep::Second => {
                after.step = AfterStep::Read;
                Some(Action::ReadAnswer)
            }
            AfterStep::Read if after.held.is_some() => Some(Action::TakeBack),
            AfterStep::Read => Some(Action::ReadAnswer),
            AfterStep::Early => {
                let held = after.held == Some(true);
                let early =
                    send_next_early(self.flights > 0, after.stopping.is_some(), held, &after.ran);
                if early && self.may_send(seen) {
                    Some(Action::SendClaim {
                        max_tasks: self.claim_batch,
                    })
                } else {
                    after.step = AfterStep::Apply;
                    Some(Action::ApplyAnswer)
                }
            }
            AfterStep::Apply => Some(Action::ApplyAnswer),
            AfterStep::SendBack => None,
        };
        self.stage = Stage::After(after);
        action.into_iter().collect()
    }

    // Several slots: one claim fills the free slots, nothing ahead.

    fn step_slots(&mut self, event: Event, seen: &Seen) -> Vec<Action> {
        self.absorb(event);
        self.decide_slots(seen)
    }

    /// Takes in what happened before the last event, when several came at once (runs that
    /// ended while a claim, a look or a record was being made): only with several slots,
    /// where taking them in decides nothing. With one slot, nothing runs beside them.
    pub(super) fn absorb(&mut self, event: Event) {
        match event {
            Event::Go | Event::Held(_) => {}
            Event::Claimed(came) | Event::Read(came) => match came {
                Came::On(runs) => self.running += runs,
                Came::NothingFree => self.stalled = Some(Stall::NothingFree),
                Came::Relist => self.over = true,
                Came::End(stop) => self.end = Some(stop),
            },
            Event::RunEnded {
                succeeded,
                elapsed,
                end,
            } => {
                self.running = self.running.saturating_sub(1);
                self.pace.record(elapsed);
                self.stalled = None;
                if !succeeded {
                    // Its retry (written back under a new version) is read before its
                    // group's next task may start, so the group keeps its order.
                    self.look_first = true;
                }
                if let Some(stop) = end {
                    self.end.get_or_insert(stop);
                }
            }
            Event::Waited => {
                if self.stalled.take() == Some(Stall::Empty) {
                    self.look_first = true;
                }
            }
            // Not asked for with several slots.
            Event::Sent(_)
            | Event::Answered { .. }
            | Event::Applied(_)
            | Event::TakenBack(_)
            | Event::SentBack(_) => {}
        }
    }

    /// Claims into the free slots until no further task starts for now; then leaves (once
    /// every run is over), waits for runs held elsewhere, records, or waits for a run.
    fn decide_slots(&mut self, seen: &Seen) -> Vec<Action> {
        let stall = match self.fill(seen) {
            Ok(action) => return vec![action],
            Err(stall) => stall,
        };
        if stall == Stall::Over && self.running == 0 {
            return vec![Action::Leave(self.end.clone())];
        }
        let mut actions = Vec::new();
        if matches!(self.end, Some(LeadEnd::StepDown(_))) && self.running > 0 {
            // Leadership is gone while runs go on: stop their handlers now, as when the
            // lease runs out, instead of letting them finish under a lost leadership.
            actions.push(Action::MarkLost);
        }
        if stall == Stall::NothingFree && self.running == 0 && seen.held {
            // What is left waits for runs another lease holds (a previous leader's):
            // list again after a while to see them end.
            self.over = true;
            actions.push(Action::WaitHeld);
            return actions;
        }
        if seen.finished && self.end.is_none() {
            // Nothing more starts now: what finished is recorded at once rather than at
            // the next claim, which keeps the window in which a crash makes it run again
            // short.
            self.stalled = (stall != Stall::Over && stall != Stall::Full).then_some(stall);
            actions.push(Action::Record);
            return actions;
        }
        let at_most = match stall {
            Stall::Full | Stall::Over => None,
            Stall::NothingFree | Stall::Empty => Some(LOOK_INTERVAL),
        };
        self.stalled = Some(stall);
        actions.push(Action::WaitRuns { at_most });
        actions
    }

    /// The next claim or look into the free slots; `Err`: why nothing more starts now.
    fn fill(&mut self, seen: &Seen) -> Result<Action, Stall> {
        if self.end.is_some() || self.over {
            return Err(Stall::Over);
        }
        if self.running >= self.slots {
            return Err(Stall::Full);
        }
        if let Some(stop) = &seen.stop {
            self.end = Some(stop.clone());
            return Err(Stall::Over);
        }
        if !seen.headroom {
            // Renewals are late: nothing starts until a renewal comes or the lease runs
            // out; the runs going on are polled meanwhile.
            return Err(Stall::NothingFree);
        }
        if let Some(stall) = self.stalled.take() {
            // Nothing could start at the last claim and nothing ended since.
            if stall == Stall::NothingFree {
                return Err(stall);
            }
        }
        let next = if self.look_first {
            Next::Look
        } else {
            seen.next
        };
        match next {
            Next::Claim => Ok(Action::ClaimFree {
                free: if seen.single {
                    1
                } else {
                    self.slots - self.running
                },
            }),
            Next::Look => {
                self.look_first = false;
                Ok(Action::Look)
            }
            Next::Relist => {
                self.over = true;
                Err(Stall::Over)
            }
            Next::Done if self.running == 0 => {
                self.over = true;
                Err(Stall::Over)
            }
            Next::Done => Err(Stall::Empty),
        }
    }
}

impl After {
    fn new(ran: Ran) -> After {
        After {
            ran,
            stopping: None,
            relist: false,
            held: None,
            second: false,
            step: AfterStep::Second,
        }
    }
}

/// The step after a claim sent (or not) at `step`.
fn next_after(step: AfterStep) -> AfterStep {
    match step {
        AfterStep::Second => AfterStep::Read,
        _ => AfterStep::Apply,
    }
}
