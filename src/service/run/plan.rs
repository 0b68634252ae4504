//! `leaderq run`'s pure decisions: what to do when the command exits, when leadership is
//! lost, when the replica is told to stop; and how its exit status becomes `leaderq
//! run`'s own. For the periodic form, [`tick_step`]: given the tick record as read, what
//! the leader records next, which tick it runs and which it skips (the planning itself is
//! `schedule::plan`'s, as for schedules). No I/O and no clock: the shells in `mod.rs` and
//! `periodic.rs` perform what these return.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::schedule::{CatchUp, Schedule};

/// `leaderq run`'s exit code when leadership was lost and `--on-loss exit` (the default):
/// EX_TEMPFAIL, "try again later" (a supervisor such as systemd restarts it).
pub const EXIT_LEADERSHIP_LOST: i32 = 75;

/// Restarts back off from this, doubling per quick failure, up to [`BACKOFF_MAX`].
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A command that ran at least this long resets the backoff.
pub const HEALTHY_RUN: Duration = Duration::from_secs(30);

/// When the command is started again after it exits (`--restart`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Restart {
    /// Never: `leaderq run` gives leadership up and exits with the command's status.
    Never,
    /// After a failure (a non-zero exit, or killed by a signal).
    OnFailure,
    /// After every exit.
    Always,
}

/// What to do when leadership is lost while the command runs (`--on-loss`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnLoss {
    /// Stop the command and exit with [`EXIT_LEADERSHIP_LOST`].
    Exit,
    /// Stop the command and contest again; it runs again when this replica leads.
    Rerun,
}

/// How the command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl Exit {
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }

    /// The shell's convention: the code, or 128 + the signal number.
    pub fn as_code(self) -> i32 {
        match self {
            Exit::Code(code) => code,
            Exit::Signal(signal) => 128 + signal,
        }
    }
}

/// What happened while leading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The command exited by itself after running `ran`.
    Exited { exit: Exit, ran: Duration },
    /// Leadership or the lease was lost; the command has been stopped.
    Lost,
    /// SIGTERM or SIGINT to `leaderq run`; the command has been stopped, ending thus.
    Shutdown { exit: Option<Exit> },
}

/// What `leaderq run` does next. Every path gives leadership up first (the shell does),
/// so another replica can take it: a command that exited has no leadership to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Contest again, standing back first (`--handover`) or not, and start the command
    /// after `delay` once leading.
    Again { delay: Duration, stand_back: bool },
    /// Leave and exit with this code.
    Exit(i32),
}

/// The options that decide [`next`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub restart: Restart,
    pub on_loss: OnLoss,
    pub handover: bool,
}

/// Decides what follows `event`. `quick_failures` counts the restarts in a row after runs
/// shorter than [`HEALTHY_RUN`] (the caller keeps it with [`quick_failures_after`]).
pub fn next(policy: Policy, event: Event, quick_failures: u32) -> Next {
    match event {
        Event::Shutdown { exit } => Next::Exit(exit.map_or(0, Exit::as_code)),
        Event::Lost => match policy.on_loss {
            OnLoss::Exit => Next::Exit(EXIT_LEADERSHIP_LOST),
            OnLoss::Rerun => Next::Again {
                delay: Duration::ZERO,
                stand_back: false,
            },
        },
        Event::Exited { exit, .. } => {
            let again = match policy.restart {
                Restart::Never => false,
                Restart::OnFailure => !exit.success(),
                Restart::Always => true,
            };
            if !again {
                return Next::Exit(exit.as_code());
            }
            Next::Again {
                delay: backoff(quick_failures),
                stand_back: policy.handover,
            }
        }
    }
}

/// The quick-failure count after `event`: a run of [`HEALTHY_RUN`] or more resets it.
pub fn quick_failures_after(event: Event, before: u32) -> u32 {
    match event {
        Event::Exited { ran, .. } if ran >= HEALTHY_RUN => 0,
        Event::Exited { .. } => before.saturating_add(1),
        _ => before,
    }
}

/// The pause before restart number `quick_failures` (the first after a healthy run is 0).
pub fn backoff(quick_failures: u32) -> Duration {
    if quick_failures == 0 {
        return Duration::ZERO;
    }
    BACKOFF_FIRST
        .saturating_mul(1 << (quick_failures - 1).min(16))
        .min(BACKOFF_MAX)
}

/// Skipped ticks named one by one in the log, the earliest first. An outage of a day under
/// `--every 1s` skips 86,400 ticks; past this many, one more line gives their count and
/// range instead of a line each.
pub const SKIPPED_NAMED: usize = 10;

/// What a periodic run's leader does next ([`tick_step`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TickStep {
    /// No tick is recorded (a new run, or a record deleted or garbled by hand): record
    /// `origin`, where the run's ticks begin, and run nothing; no tick at or before it ever
    /// runs, so a missing record never replays ticks from before it.
    Begin { origin: DateTime<Utc> },
    /// Record `last` as the run's last tick, then run the command for `run`, if any, and
    /// report `skipped`. `last` is `run` when a tick runs (a catch-up of several ticks
    /// records and runs them one at a time, so a leader that dies mid-way leaves the rest
    /// to the next), else the latest tick that fell, skipped with the others.
    Tick {
        last: DateTime<Utc>,
        run: Option<DateTime<Utc>>,
        skipped: Skipped,
    },
    /// Nothing fell since the record: wait until `next` (None: no tick is left).
    Wait { next: Option<DateTime<Utc>> },
}

/// The ticks one [`TickStep::Tick`] skips: all that fell after the record and before the
/// tick it runs, or all that fell if it runs none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// How many (a lower bound when `at_least`: a cron count stops at
    /// `schedule::plan::SKIPPED_COUNT_LIMIT`).
    pub count: u64,
    pub at_least: bool,
    /// The earliest of them, ascending, at most [`SKIPPED_NAMED`].
    pub named: Vec<DateTime<Utc>>,
    /// The first and the latest of them, when there are any.
    pub range: Option<(DateTime<Utc>, DateTime<Utc>)>,
}

/// What a periodic run's leader does at `now`, given the last tick its record holds
/// (`recorded`: None when there is no record, or none that can be read). The ticks are
/// planned from the record, never from when this leader's term began, so the ticks that fell
/// while no replica led are caught up under the run's `--catch-up`, as a schedule's are.
pub fn tick_step(
    schedule: &Schedule,
    recorded: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> TickStep {
    let Some(recorded) = recorded else {
        return TickStep::Begin { origin: now };
    };
    let planned = crate::schedule::plan::plan(schedule, Some(recorded), recorded, now);
    let Some(latest_due) = planned.last else {
        return TickStep::Wait { next: planned.next };
    };
    let run = planned.enqueue.first().copied();
    let mut skipped = Skipped {
        count: planned.skipped,
        at_least: planned.skipped_at_least,
        ..Skipped::default()
    };
    if skipped.count > 0 {
        // The skipped ticks are the earliest that fell, so they are named walking forward
        // from the record, and a long outage costs no more than SKIPPED_NAMED steps.
        let skips = |tick: &DateTime<Utc>| run.map_or(*tick <= latest_due, |run| *tick < run);
        let mut cursor = recorded;
        while skipped.named.len() < SKIPPED_NAMED && (skipped.named.len() as u64) < skipped.count {
            let next = crate::schedule::plan::next_tick(&schedule.when, schedule.timezone, cursor);
            let Some(tick) = next.filter(skips) else {
                break;
            };
            skipped.named.push(tick);
            cursor = tick;
        }
        let all_named = skipped.named.len() as u64 == skipped.count;
        let latest = match run {
            None => Some(latest_due),
            Some(_) if all_named => skipped.named.last().copied(),
            Some(run) => latest_before(schedule, recorded, run),
        };
        skipped.range = skipped.named.first().copied().zip(latest);
    }
    TickStep::Tick {
        last: run.unwrap_or(latest_due),
        run,
        skipped,
    }
}

/// The latest tick of `schedule` after `after` and before `before`, through the planner
/// itself (asked for the latest tick due a millisecond before `before`: ticks are whole
/// milliseconds), so that cron ticks follow its daylight-saving rules here too.
fn latest_before(
    schedule: &Schedule,
    after: DateTime<Utc>,
    before: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let mut latest = schedule.clone();
    latest.catch_up = CatchUp::Latest;
    crate::schedule::plan::plan(
        &latest,
        Some(after),
        after,
        before - TimeDelta::milliseconds(1),
    )
    .last
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn policy(restart: Restart, on_loss: OnLoss, handover: bool) -> Policy {
        Policy {
            restart,
            on_loss,
            handover,
        }
    }

    #[test]
    fn an_exit_restarts_per_the_policy_or_ends_with_the_commands_status() {
        let exited = |exit| Event::Exited { exit, ran: SECOND };
        let never = policy(Restart::Never, OnLoss::Exit, false);
        assert_eq!(next(never, exited(Exit::Code(3)), 0), Next::Exit(3));
        assert_eq!(next(never, exited(Exit::Signal(9)), 0), Next::Exit(137));
        let on_failure = policy(Restart::OnFailure, OnLoss::Exit, false);
        assert_eq!(next(on_failure, exited(Exit::Code(0)), 0), Next::Exit(0));
        assert_eq!(
            next(on_failure, exited(Exit::Code(1)), 1),
            Next::Again {
                delay: SECOND,
                stand_back: false
            }
        );
        let always = policy(Restart::Always, OnLoss::Exit, true);
        assert_eq!(
            next(always, exited(Exit::Code(0)), 0),
            Next::Again {
                delay: Duration::ZERO,
                stand_back: true
            }
        );
    }

    #[test]
    fn a_loss_exits_75_or_contests_again_and_a_shutdown_ends_with_the_commands_status() {
        assert_eq!(
            next(policy(Restart::Always, OnLoss::Exit, false), Event::Lost, 0),
            Next::Exit(EXIT_LEADERSHIP_LOST)
        );
        assert_eq!(
            next(policy(Restart::Never, OnLoss::Rerun, true), Event::Lost, 5),
            Next::Again {
                delay: Duration::ZERO,
                stand_back: false
            }
        );
        let any = policy(Restart::Always, OnLoss::Rerun, false);
        let shutdown = |exit| Event::Shutdown { exit };
        assert_eq!(
            next(any, shutdown(Some(Exit::Signal(15))), 0),
            Next::Exit(143)
        );
        assert_eq!(next(any, shutdown(Some(Exit::Code(0))), 0), Next::Exit(0));
        assert_eq!(next(any, shutdown(None), 0), Next::Exit(0));
    }

    #[test]
    fn quick_failures_back_off_exponentially_and_a_healthy_run_resets() {
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(1), SECOND);
        assert_eq!(backoff(2), 2 * SECOND);
        assert_eq!(backoff(4), 8 * SECOND);
        assert_eq!(backoff(40), BACKOFF_MAX);
        let quick = Event::Exited {
            exit: Exit::Code(1),
            ran: SECOND,
        };
        let healthy = Event::Exited {
            exit: Exit::Code(1),
            ran: HEALTHY_RUN,
        };
        assert_eq!(quick_failures_after(quick, 2), 3);
        assert_eq!(quick_failures_after(healthy, 7), 0);
        assert_eq!(quick_failures_after(Event::Lost, 2), 2);
    }

    /// A second of the tests' own epoch, on a whole hour (UTC), as a time.
    fn at(second: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_794_996_000 + second, 0).unwrap()
    }

    fn schedule(
        every: Option<&str>,
        cron: Option<&str>,
        catch_up: CatchUp,
        limit: u32,
    ) -> Schedule {
        Schedule::from_spec(crate::schedule::ScheduleSpec {
            name: "job".into(),
            every: every.map(str::to_string),
            cron: cron.map(str::to_string),
            task_type: "run".into(),
            catch_up: Some(catch_up),
            catch_up_limit: Some(limit),
            ..Default::default()
        })
        .unwrap()
    }

    fn every_second(catch_up: CatchUp) -> Schedule {
        schedule(Some("1s"), None, catch_up, 100)
    }

    /// Steps as the leader takes them, each recording what the one before said, until one
    /// waits: the ticks run, in order, and the steps' skipped ticks.
    fn drive(
        schedule: &Schedule,
        recorded: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> (Vec<DateTime<Utc>>, Vec<Skipped>) {
        let (mut ran, mut skips, mut recorded) = (Vec::new(), Vec::new(), recorded);
        loop {
            match tick_step(schedule, Some(recorded), now) {
                TickStep::Tick { last, run, skipped } => {
                    ran.extend(run);
                    if skipped.count > 0 {
                        skips.push(skipped);
                    }
                    recorded = last;
                }
                TickStep::Wait { .. } => return (ran, skips),
                TickStep::Begin { .. } => unreachable!("a record is given"),
            }
        }
    }

    /// With no record, the leader records where the run's ticks begin and runs nothing:
    /// nothing from before it is replayed, and the ticks after it are planned from it, so
    /// a failover before the first tick loses none.
    #[test]
    fn a_run_with_no_record_begins_at_now_and_its_ticks_follow_from_there() {
        let run = every_second(CatchUp::All);
        let now = at(10) + TimeDelta::milliseconds(300);
        assert_eq!(tick_step(&run, None, now), TickStep::Begin { origin: now });
        assert_eq!(
            tick_step(&run, Some(now), now),
            TickStep::Wait { next: Some(at(11)) }
        );
        // The next leader, three seconds on, runs the ticks that fell since the origin.
        let (ran, skips) = drive(&run, now, at(13) + TimeDelta::milliseconds(500));
        assert_eq!(ran, vec![at(11), at(12), at(13)]);
        assert_eq!(skips, vec![]);
    }

    /// The ticks that fell since the record are caught up whenever this leader's term
    /// began; with `all` each is recorded just before its own run, one at a time.
    #[test]
    fn all_runs_every_tick_since_the_record_recording_each_before_its_run() {
        let run = every_second(CatchUp::All);
        let now = at(14) + TimeDelta::milliseconds(500);
        assert_eq!(
            tick_step(&run, Some(at(10)), now),
            TickStep::Tick {
                last: at(11),
                run: Some(at(11)),
                skipped: Skipped::default()
            }
        );
        let (ran, skips) = drive(&run, at(10), now);
        assert_eq!(ran, vec![at(11), at(12), at(13), at(14)]);
        assert_eq!(skips, vec![]);
        assert_eq!(
            tick_step(&run, Some(at(14)), now),
            TickStep::Wait { next: Some(at(15)) }
        );
    }

    /// `latest` runs the latest tick that fell, late, and names the earlier ones skipped.
    #[test]
    fn latest_runs_the_latest_missed_tick_and_names_the_earlier_ones() {
        let now = at(14) + TimeDelta::milliseconds(500);
        assert_eq!(
            tick_step(&every_second(CatchUp::Latest), Some(at(10)), now),
            TickStep::Tick {
                last: at(14),
                run: Some(at(14)),
                skipped: Skipped {
                    count: 3,
                    at_least: false,
                    named: vec![at(11), at(12), at(13)],
                    range: Some((at(11), at(13))),
                }
            }
        );
    }

    /// `none` runs the latest tick only if it is on time, and names every other one; a
    /// tick that fell too long ago is recorded as skipped with the rest.
    #[test]
    fn none_names_every_missed_tick_and_runs_only_one_on_time() {
        let run = every_second(CatchUp::None);
        let (ran, skips) = drive(&run, at(10), at(14) + TimeDelta::milliseconds(500));
        assert_eq!(ran, vec![at(14)]);
        assert_eq!(skips[0].named, vec![at(11), at(12), at(13)]);
        // A minute's tick half a minute late is past the grace of `none`.
        let minutely = schedule(Some("1m"), None, CatchUp::None, 100);
        assert_eq!(
            tick_step(&minutely, Some(at(0)), at(150)),
            TickStep::Tick {
                last: at(120),
                run: None,
                skipped: Skipped {
                    count: 2,
                    at_least: false,
                    named: vec![at(60), at(120)],
                    range: Some((at(60), at(120))),
                }
            }
        );
    }

    /// A long outage names the earliest skipped ticks one by one, and gives the count and
    /// the range of them all; `all` runs the latest ticks up to its limit.
    #[test]
    fn a_long_outage_names_a_bounded_number_of_skipped_ticks_and_gives_their_range() {
        let latest = tick_step(&every_second(CatchUp::Latest), Some(at(0)), at(86_400));
        let TickStep::Tick { last, run, skipped } = latest else {
            panic!("{latest:?}");
        };
        assert_eq!((last, run), (at(86_400), Some(at(86_400))));
        assert_eq!(skipped.count, 86_399);
        assert_eq!(skipped.named, (1..=10).map(at).collect::<Vec<_>>());
        assert_eq!(skipped.range, Some((at(1), at(86_399))));
        let all = tick_step(&every_second(CatchUp::All), Some(at(0)), at(1000));
        let TickStep::Tick { last, run, skipped } = all else {
            panic!("{all:?}");
        };
        assert_eq!((last, run), (at(901), Some(at(901))));
        assert_eq!(skipped.count, 900);
        assert_eq!(skipped.range, Some((at(1), at(900))));
    }

    /// Cron ticks are named and ranged as the planner counts them, the latest skipped one
    /// found by the planner too.
    #[test]
    fn cron_ticks_are_named_and_ranged_as_the_planner_counts_them() {
        let quarters = schedule(None, Some("*/15 * * * *"), CatchUp::Latest, 100);
        let step = tick_step(&quarters, Some(at(0)), at(3630));
        assert_eq!(
            step,
            TickStep::Tick {
                last: at(3600),
                run: Some(at(3600)),
                skipped: Skipped {
                    count: 3,
                    at_least: false,
                    named: vec![at(900), at(1800), at(2700)],
                    range: Some((at(900), at(2700))),
                }
            }
        );
        let seconds = schedule(None, Some("* * * * * *"), CatchUp::All, 2);
        let TickStep::Tick { run, skipped, .. } = tick_step(&seconds, Some(at(0)), at(100)) else {
            panic!("a tick is due");
        };
        assert_eq!(run, Some(at(99)));
        assert_eq!((skipped.count, skipped.named.len()), (98, SKIPPED_NAMED));
        assert_eq!(skipped.range, Some((at(1), at(98))));
    }

    /// A record ahead of this replica's clock (a clock that went back, or another
    /// replica's ahead) runs nothing until its tick's successor falls.
    #[test]
    fn a_record_ahead_of_the_clock_runs_nothing_again() {
        let run = every_second(CatchUp::All);
        assert_eq!(
            tick_step(&run, Some(at(20)), at(15)),
            TickStep::Wait { next: Some(at(21)) }
        );
    }
}
