//! `leaderq run`'s pure decisions: what to do when the command exits, when leadership is
//! lost, when the replica is told to stop; and how its exit status becomes `leaderq
//! run`'s own. No I/O and no clock: the shell in `mod.rs` performs what these return.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::time::Duration;

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
}
