//! The supervisor's kill schedule, as a pure function of what it has seen and `now`: when
//! to send SIGTERM to the handler's process group, when SIGKILL, and how long to sleep.
//!
//! Times are durations on the supervisor's clock (CLOCK_BOOTTIME, see `protocol.rs`). The
//! rule: SIGTERM at the first stop request (the leader asked, the leader died, the handler
//! exited and left processes behind) or at `kill_by - kill_grace`, whichever comes first;
//! SIGKILL `kill_grace` after SIGTERM but never later than `kill_by`, then again every
//! `KILL_REPEAT` for processes that escaped the group, until everything is gone.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::time::Duration;

/// After the first SIGKILL, how often the kill is repeated: descendants that left the
/// handler's group (setsid) are reparented to the supervisor one level at a time.
pub const KILL_REPEAT: Duration = Duration::from_millis(50);

/// Why the kill sequence started before the handler ended on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The leader asked (time-out, step-down, shutdown grace over).
    Requested,
    /// The leader's control channel closed: the leader process is gone.
    LeaderGone,
    /// The lease was not confirmed in time: `kill_by - kill_grace` came first.
    Lease,
}

/// What the supervisor has seen so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// The handler must be dead by then: the lease deadline minus the safety margin.
    pub kill_by: Duration,
    /// When a stop was first asked for, and why (`None`: the handler exited by itself and
    /// only leftovers are being stopped).
    pub stop: Option<(Duration, Option<StopReason>)>,
    pub term_sent_at: Option<Duration>,
    pub last_kill_at: Option<Duration>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send SIGTERM to the group now; the reason is why the sequence started.
    Term(Option<StopReason>),
    /// Send SIGKILL to the group now.
    Kill,
    /// Nothing to do before this time (unless an event comes first).
    SleepUntil(Duration),
}

impl Progress {
    /// Records a stop request; the first one counts.
    pub fn stop(&mut self, now: Duration, reason: Option<StopReason>) {
        self.stop.get_or_insert((now, reason));
    }

    /// When SIGTERM is (or was) due.
    fn term_at(&self, kill_grace: Duration) -> Duration {
        let by_lease = self.kill_by.saturating_sub(kill_grace);
        self.stop.map_or(by_lease, |(at, _)| at.min(by_lease))
    }

    /// Why SIGTERM is sent: the stop request if it came no later than the lease's turn.
    fn term_reason(&self, kill_grace: Duration) -> Option<StopReason> {
        let by_lease = self.kill_by.saturating_sub(kill_grace);
        match self.stop {
            Some((at, reason)) if at <= by_lease => reason,
            _ => Some(StopReason::Lease),
        }
    }

    /// The next step at `now`.
    pub fn next(&self, kill_grace: Duration, now: Duration) -> Step {
        let term_at = self.term_at(kill_grace);
        let Some(term_sent_at) = self.term_sent_at else {
            if now >= term_at {
                return Step::Term(self.term_reason(kill_grace));
            }
            return Step::SleepUntil(term_at);
        };
        let kill_at = match self.last_kill_at {
            Some(last) => last + KILL_REPEAT,
            None => (term_sent_at + kill_grace).min(self.kill_by),
        };
        if now >= kill_at {
            Step::Kill
        } else {
            Step::SleepUntil(kill_at)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds)
    }

    const GRACE: Duration = Duration::from_secs(5);

    /// Drives the schedule from `start` by following its own answers, applying each step,
    /// and returns the steps with their times, up to the first SIGKILL.
    fn run(mut progress: Progress, start: Duration) -> Vec<(Step, Duration)> {
        let mut now = start;
        let mut steps = Vec::new();
        loop {
            match progress.next(GRACE, now) {
                Step::SleepUntil(at) => {
                    assert!(at > now, "sleeping into the past at {now:?}");
                    now = at;
                }
                step @ Step::Term(_) => {
                    progress.term_sent_at = Some(now);
                    steps.push((step, now));
                }
                Step::Kill => {
                    steps.push((Step::Kill, now));
                    return steps;
                }
            }
        }
    }

    /// With no stop, a lease that is not confirmed again is enforced by itself: SIGTERM at
    /// kill_by - kill_grace, SIGKILL at kill_by.
    #[test]
    fn unconfirmed_lease_terms_then_kills_by_the_deadline() {
        let progress = Progress {
            kill_by: s(100.0),
            ..Progress::default()
        };
        assert_eq!(progress.next(GRACE, s(10.0)), Step::SleepUntil(s(95.0)));
        assert_eq!(
            run(progress, s(10.0)),
            vec![
                (Step::Term(Some(StopReason::Lease)), s(95.0)),
                (Step::Kill, s(100.0))
            ]
        );
    }

    /// A stop asked early gets the whole grace before SIGKILL.
    #[test]
    fn early_stop_gets_the_full_grace() {
        let mut progress = Progress {
            kill_by: s(100.0),
            ..Progress::default()
        };
        progress.stop(s(20.0), Some(StopReason::Requested));
        assert_eq!(
            run(progress, s(20.0)),
            vec![
                (Step::Term(Some(StopReason::Requested)), s(20.0)),
                (Step::Kill, s(25.0))
            ]
        );
    }

    /// A stop asked close to the lease deadline has its grace cut: SIGKILL still comes at
    /// kill_by, never later.
    #[test]
    fn late_stop_is_killed_by_the_deadline() {
        let mut progress = Progress {
            kill_by: s(100.0),
            ..Progress::default()
        };
        progress.stop(s(94.0), Some(StopReason::LeaderGone));
        assert_eq!(
            run(progress, s(94.0)),
            vec![
                (Step::Term(Some(StopReason::LeaderGone)), s(94.0)),
                (Step::Kill, s(99.0))
            ]
        );
        let mut progress = Progress {
            kill_by: s(100.0),
            ..Progress::default()
        };
        progress.stop(s(98.0), Some(StopReason::Requested));
        assert_eq!(
            run(progress, s(98.0)),
            vec![
                (Step::Term(Some(StopReason::Lease)), s(98.0)),
                (Step::Kill, s(100.0))
            ]
        );
    }

    /// A lost lease (kill_by in the past, or zero) means SIGTERM and SIGKILL at once.
    #[test]
    fn lost_lease_kills_at_once() {
        let progress = Progress::default();
        assert_eq!(
            run(progress, s(50.0)),
            vec![
                (Step::Term(Some(StopReason::Lease)), s(50.0)),
                (Step::Kill, s(50.0))
            ]
        );
    }

    /// A renewal moves kill_by later and postpones the sequence; once SIGTERM is sent, a
    /// later renewal does not undo it, but SIGKILL keeps to the grace.
    #[test]
    fn renewals_postpone_until_the_sequence_starts() {
        let mut progress = Progress {
            kill_by: s(100.0),
            ..Progress::default()
        };
        progress.kill_by = s(110.0);
        assert_eq!(progress.next(GRACE, s(96.0)), Step::SleepUntil(s(105.0)));
        progress.term_sent_at = Some(s(105.0));
        progress.kill_by = s(200.0);
        assert_eq!(progress.next(GRACE, s(106.0)), Step::SleepUntil(s(110.0)));
    }

    /// After the first SIGKILL the kill repeats until everything is gone.
    #[test]
    fn kill_repeats() {
        let progress = Progress {
            kill_by: s(100.0),
            term_sent_at: Some(s(95.0)),
            last_kill_at: Some(s(100.0)),
            ..Progress::default()
        };
        assert_eq!(
            progress.next(GRACE, s(100.01)),
            Step::SleepUntil(s(100.0) + KILL_REPEAT)
        );
        assert_eq!(progress.next(GRACE, s(100.0) + KILL_REPEAT), Step::Kill);
    }

    /// Leftovers of a handler that exited by itself are stopped with no reason recorded,
    /// and the first stop request is the one that counts.
    #[test]
    fn leftovers_carry_no_reason_and_the_first_stop_counts() {
        let mut progress = Progress {
            kill_by: s(100.0),
            ..Progress::default()
        };
        progress.stop(s(30.0), None);
        progress.stop(s(31.0), Some(StopReason::Requested));
        assert_eq!(progress.next(GRACE, s(31.0)), Step::Term(None));
    }
}
