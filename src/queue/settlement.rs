//! What becomes of a task once its handler's run is over (pure: no I/O, no clock read, no
//! spawn; the run's result, how it was stopped, the attempts, the drawn backoff and `now`
//! come in): complete it, retry it at a time, put it back without using an attempt, or
//! dead-letter it with a reason. `run.rs` runs the handler and writes what
//! [`after_run`] answers; what follows that write's answer (settled, asked again, read
//! again, written outside the leadership, dead-lettered, left to the next leader) is
//! [`after_write`]'s to say.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::coord::{CoordError, Written};
use crate::handler::{HandlerError, TypePolicy};
use crate::queue::LeadEnd;

/// How a handler's run ended, as the leader saw it.
#[derive(Clone, Copy, Debug)]
pub struct RunEnd<'a> {
    /// The handler's answer.
    pub result: &'a Result<(), HandlerError>,
    /// Why the leading ends, if it does (seen while the handler ran).
    pub ending: Option<&'a LeadEnd>,
    /// An operator asked to cancel this run (`leaderq tasks cancel`).
    pub cancelled: bool,
    /// The leader asked the handler to stop (cancel, lease, shutdown).
    pub stopped: bool,
    /// The attempts the task had used before this run.
    pub attempts_before: u32,
}

/// What the leader does with a task after its run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// Delete the version claimed (or move it to its history record); `clear_cancel` when
    /// an operator's cancel marker came too late to stop it and is to be deleted.
    Complete { clear_cancel: bool },
    /// A failure worth retrying: written back with `attempts` and `error`, not to run
    /// before `not_before`.
    Retry {
        attempts: u32,
        error: String,
        not_before: DateTime<Utc>,
    },
    /// Cut short by the leader, not failed: written back due now, its attempts unchanged.
    /// `lease_lost` says why when the lease or the leadership stopped it.
    PutBack {
        attempts: u32,
        error: String,
        lease_lost: Option<String>,
    },
    /// Moved to dead-letter with `attempts`, `last_error` and `reason`; `failed` when it
    /// counts as the handler's failure (not an operator's cancel, whose marker is cleared).
    DeadLetter {
        attempts: u32,
        last_error: String,
        reason: String,
        failed: bool,
    },
}

/// Decides what becomes of a task after `run`: a success completes it; an operator's
/// cancel dead-letters it; a run stopped by shutdown, or for the lease or the leadership,
/// goes back without using an attempt (it is never dead-lettered for it); a failure is
/// retried `backoff` after `now` while attempts are left, else dead-lettered, at once if
/// the handler says retrying cannot help.
pub fn after_run(
    run: RunEnd,
    max_attempts: u32,
    backoff: Duration,
    now: DateTime<Utc>,
) -> Settlement {
    let attempt = run.attempts_before + 1;
    let err = match run.result {
        Ok(()) => {
            // It finished before it could be stopped: it stands as completed.
            return Settlement::Complete {
                clear_cancel: run.cancelled,
            };
        }
        Err(err) => err,
    };
    match run.ending {
        None if run.cancelled => {
            return Settlement::DeadLetter {
                attempts: attempt,
                last_error: err.message.clone(),
                reason: format!("cancelled (leaderq tasks cancel) on attempt {attempt}"),
                failed: false,
            }
        }
        Some(LeadEnd::Shutdown) if run.stopped => {
            return Settlement::PutBack {
                attempts: run.attempts_before,
                error: format!("interrupted by shutdown: {err}"),
                lease_lost: None,
            }
        }
        ending
            if err.interrupted || (run.stopped && matches!(ending, Some(LeadEnd::StepDown(_)))) =>
        {
            // Stopped because the lease or the leadership could not be confirmed (by the
            // leader, or by the supervisor on the lease's deadline before the leader saw it
            // go stale): not the handler's failure.
            let why = match ending {
                Some(LeadEnd::StepDown(why)) => why.clone(),
                _ => "the lease was not confirmed in time".to_string(),
            };
            return Settlement::PutBack {
                attempts: run.attempts_before,
                error: format!("interrupted ({why}): {err}"),
                lease_lost: Some(why),
            };
        }
        _ => {}
    }
    if err.permanent || attempt >= max_attempts {
        let reason = if err.permanent {
            format!("failed permanently (not retried) on attempt {attempt}: {err}")
        } else {
            format!("failed {attempt} times; last error: {err}")
        };
        return Settlement::DeadLetter {
            attempts: attempt,
            last_error: err.message.clone(),
            reason,
            failed: true,
        };
    }
    Settlement::Retry {
        attempts: attempt,
        error: err.message.clone(),
        not_before: now + chrono::Duration::from_std(backoff).unwrap_or_default(),
    }
}

/// What a task's failures get: the runs before it is dead-lettered, and its backoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    pub max_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

/// A task's retry policy: its own `maxAttempts` (`asked`) over its type's policy over the
/// queue's (`queue`, all set).
pub fn retry_policy(asked: Option<u32>, of_type: TypePolicy, queue: Retry) -> Retry {
    Retry {
        max_attempts: asked.or(of_type.max_attempts).unwrap_or(queue.max_attempts),
        backoff_base: of_type.backoff_base.unwrap_or(queue.backoff_base),
        backoff_max: of_type.backoff_max.unwrap_or(queue.backoff_max),
    }
}

/// The backoff before retry `attempt`: base × 2^(attempt-1), capped at `max`, plus up to
/// 20% jitter (`jitter` in 0..1, drawn by the caller) so that retries do not bunch up.
pub fn backoff(base: Duration, max: Duration, attempt: u32, jitter: f64) -> Duration {
    let exponent = attempt.saturating_sub(1).min(30);
    let capped = base.saturating_mul(1u32 << exponent).min(max);
    capped + capped.mul_f64(jitter * 0.2)
}

/// What a settlement write writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settling {
    /// A run's outcome written back on the task (put back, or a retry), guarded and
    /// conditioned on the claim's version; `lease_fresh`: the lease is known to be fresh.
    WriteBack { lease_fresh: bool },
    /// A finished run's completion.
    Completion,
}

/// What follows a settlement write's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterWrite {
    /// Applied: the task is settled.
    Settled,
    /// Not answered while the lease is fresh: ask again after a pause. The write is
    /// conditioned on the claim's version, so a try whose answer was lost is never applied
    /// twice (the next one conflicts and finds the task released).
    AskAgain,
    /// A completion not answered: kept, to be written again (perhaps applied: its record
    /// tells, before it is).
    Keep,
    /// The task moved: a producer rewrote it while it ran (its version is released to the
    /// queue), or the lease ended and left it an orphan, where that moves its version (the
    /// outcome is written on the orphan). Read it again to tell.
    ReadAgain,
    /// The leadership is lost and the run is over: written under the lease's own claim, or
    /// on the orphan its ended lease left, so that the next leader does not take it for a
    /// run cut short.
    OwnOrOrphan,
    /// Refused as too large to write back: the task goes to the dead letters with the
    /// coordinator's words.
    DeadLetter(String),
    /// Nothing more can be done now: the task stays held by this lease and is requeued
    /// when it ends (or, for a completion the coordinator refused, run again).
    LeftAsIs(String),
}

/// What follows `answer`, the coordinator's answer to a settlement write.
pub fn after_write(answer: &Result<Written, CoordError>, settling: Settling) -> AfterWrite {
    match (answer, settling) {
        (Ok(Written::Done { .. }), _) => AfterWrite::Settled,
        (Ok(Written::Conflict(_) | Written::Deferred(_)), _) => AfterWrite::ReadAgain,
        (Ok(Written::NotLeader), _) => AfterWrite::OwnOrOrphan,
        (Err(CoordError::Refused(why)), Settling::WriteBack { .. }) => {
            AfterWrite::DeadLetter(why.clone())
        }
        // One completion cannot be too large for any coordinator; should one refuse it,
        // the task stays held by this lease and the next listing runs it again.
        (Err(CoordError::Refused(why)), Settling::Completion) => AfterWrite::LeftAsIs(why.clone()),
        (Err(_), Settling::WriteBack { lease_fresh: true }) => AfterWrite::AskAgain,
        (Err(err), Settling::WriteBack { lease_fresh: false }) => {
            AfterWrite::LeftAsIs(err.to_string())
        }
        (Err(_), Settling::Completion) => AfterWrite::Keep,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{
        after_run, after_write, backoff, retry_policy, AfterWrite, Retry, RunEnd, Settlement,
        Settling,
    };
    use crate::coord::{CoordError, FencingToken, Written};
    use crate::handler::HandlerError;
    use crate::handler::TypePolicy;
    use crate::queue::scripted::at;
    use crate::queue::LeadEnd;

    const MAX_ATTEMPTS: u32 = 3;
    const BACKOFF: Duration = Duration::from_secs(2);

    /// A run's end with `result`, nothing stopped and `attempts_before` attempts used.
    fn ended(result: &Result<(), HandlerError>, attempts_before: u32) -> RunEnd<'_> {
        RunEnd {
            result,
            ending: None,
            cancelled: false,
            stopped: false,
            attempts_before,
        }
    }

    fn settle(run: RunEnd) -> Settlement {
        after_run(run, MAX_ATTEMPTS, BACKOFF, at(0))
    }

    /// A success completes the task, clearing a cancel marker that came too late.
    #[test]
    fn a_success_completes_the_task() {
        let ok = Ok(());
        assert_eq!(
            settle(ended(&ok, 0)),
            Settlement::Complete {
                clear_cancel: false
            }
        );
        let late_cancel = RunEnd {
            cancelled: true,
            stopped: true,
            ..ended(&ok, 0)
        };
        assert_eq!(
            settle(late_cancel),
            Settlement::Complete { clear_cancel: true }
        );
    }

    /// A failure with attempts left is retried after the backoff, counting this attempt.
    #[test]
    fn a_failure_with_attempts_left_is_retried_after_the_backoff() {
        let failed = Err(HandlerError::new("boom"));
        assert_eq!(
            settle(ended(&failed, 1)),
            Settlement::Retry {
                attempts: 2,
                error: "boom".into(),
                not_before: at(2_000),
            }
        );
    }

    /// The last attempt's failure, or a permanent one, is dead-lettered as failed.
    #[test]
    fn the_last_attempt_or_a_permanent_failure_is_dead_lettered() {
        let failed = Err(HandlerError::new("boom"));
        assert!(matches!(
            settle(ended(&failed, 2)),
            Settlement::DeadLetter { attempts: 3, failed: true, reason, .. }
                if reason == "failed 3 times; last error: boom"
        ));
        let permanent = Err(HandlerError {
            permanent: true,
            ..HandlerError::new("bad input")
        });
        assert!(matches!(
            settle(ended(&permanent, 0)),
            Settlement::DeadLetter { attempts: 1, failed: true, reason, .. }
                if reason.starts_with("failed permanently (not retried) on attempt 1")
        ));
    }

    /// An operator's cancel dead-letters the task, not counted as the handler's failure.
    #[test]
    fn an_operators_cancel_dead_letters_the_task() {
        let failed = Err(HandlerError::new("stopped"));
        let cancelled = RunEnd {
            cancelled: true,
            stopped: true,
            ..ended(&failed, 0)
        };
        assert_eq!(
            settle(cancelled),
            Settlement::DeadLetter {
                attempts: 1,
                last_error: "stopped".into(),
                reason: "cancelled (leaderq tasks cancel) on attempt 1".into(),
                failed: false,
            }
        );
    }

    /// A run stopped by shutdown, or for the lease or the leadership, goes back without
    /// using an attempt, even on its last one.
    #[test]
    fn a_run_stopped_by_the_leader_is_put_back_without_using_an_attempt() {
        let failed = Err(HandlerError::new("killed"));
        let shutdown = LeadEnd::Shutdown;
        let by_shutdown = RunEnd {
            ending: Some(&shutdown),
            stopped: true,
            ..ended(&failed, 2)
        };
        assert_eq!(
            settle(by_shutdown),
            Settlement::PutBack {
                attempts: 2,
                error: "interrupted by shutdown: killed".into(),
                lease_lost: None,
            }
        );
        let lost = LeadEnd::StepDown("lease expired".into());
        let for_the_lease = RunEnd {
            ending: Some(&lost),
            stopped: true,
            ..ended(&failed, 2)
        };
        assert_eq!(
            settle(for_the_lease),
            Settlement::PutBack {
                attempts: 2,
                error: "interrupted (lease expired): killed".into(),
                lease_lost: Some("lease expired".into()),
            }
        );
        let by_supervisor = Err(HandlerError {
            interrupted: true,
            ..HandlerError::new("deadline")
        });
        assert!(matches!(
            settle(ended(&by_supervisor, 0)),
            Settlement::PutBack { attempts: 0, lease_lost: Some(why), .. }
                if why == "the lease was not confirmed in time"
        ));
    }

    /// A failure during a shutdown the handler was not stopped for is an ordinary failure.
    #[test]
    fn a_failure_during_shutdown_that_was_not_stopped_is_retried() {
        let failed = Err(HandlerError::new("boom"));
        let shutdown = LeadEnd::Shutdown;
        let run = RunEnd {
            ending: Some(&shutdown),
            ..ended(&failed, 0)
        };
        assert!(matches!(settle(run), Settlement::Retry { attempts: 1, .. }));
    }

    /// The backoff doubles per attempt from the base, is capped, and adds up to 20% jitter.
    #[test]
    fn the_backoff_doubles_is_capped_and_jittered() {
        let (base, max) = (Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(backoff(base, max, 1, 0.0), Duration::from_secs(1));
        assert_eq!(backoff(base, max, 3, 0.0), Duration::from_secs(4));
        assert_eq!(backoff(base, max, 40, 0.0), Duration::from_secs(60));
        assert_eq!(backoff(base, max, 1, 1.0), Duration::from_millis(1_200));
    }

    fn written(fencing_token: u64) -> Result<Written, CoordError> {
        Ok(Written::Done {
            versions: Vec::new(),
            fencing_token: FencingToken(fencing_token),
        })
    }

    /// A write back (put back or retry) answered each way, as a transcript: the answer in,
    /// what the settling does next out.
    #[test]
    fn a_write_back_is_settled_asked_again_read_again_or_moved_away() {
        let fresh = Settling::WriteBack { lease_fresh: true };
        let stale = Settling::WriteBack { lease_fresh: false };
        let lost = || Err(CoordError::Unavailable("connection reset".into()));
        let transcript = [
            (written(7), fresh, AfterWrite::Settled),
            (lost(), fresh, AfterWrite::AskAgain),
            (
                lost(),
                stale,
                AfterWrite::LeftAsIs("connection reset".into()),
            ),
            (
                Ok(Written::Conflict(vec!["t".into()])),
                fresh,
                AfterWrite::ReadAgain,
            ),
            (
                Ok(Written::Deferred(vec!["t".into()])),
                fresh,
                AfterWrite::ReadAgain,
            ),
            (Ok(Written::NotLeader), fresh, AfterWrite::OwnOrOrphan),
            (Ok(Written::NotLeader), stale, AfterWrite::OwnOrOrphan),
            (
                Err(CoordError::Refused("value too large".into())),
                fresh,
                AfterWrite::DeadLetter("value too large".into()),
            ),
        ];
        for (answer, settling, next) in transcript {
            assert_eq!(
                after_write(&answer, settling),
                next,
                "{answer:?} {settling:?}"
            );
        }
    }

    #[test]
    fn a_completion_unanswered_is_kept_and_one_refused_is_left_to_run_again() {
        let lost = Err(CoordError::Unavailable("time-out".into()));
        assert_eq!(after_write(&lost, Settling::Completion), AfterWrite::Keep);
        let refused = Err(CoordError::Refused("too large".into()));
        assert_eq!(
            after_write(&refused, Settling::Completion),
            AfterWrite::LeftAsIs("too large".into())
        );
        assert_eq!(
            after_write(&written(3), Settling::Completion),
            AfterWrite::Settled
        );
        assert_eq!(
            after_write(&Ok(Written::NotLeader), Settling::Completion),
            AfterWrite::OwnOrOrphan
        );
    }

    #[test]
    fn a_tasks_max_attempts_beats_its_types_which_beats_the_queues() {
        let queue = Retry {
            max_attempts: 5,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
        };
        assert_eq!(retry_policy(None, TypePolicy::default(), queue), queue);
        let of_type = TypePolicy {
            max_attempts: Some(1),
            backoff_base: Some(Duration::from_secs(10)),
            backoff_max: None,
            priority: None,
            concurrency: None,
            rate: None,
        };
        let typed = retry_policy(None, of_type, queue);
        assert_eq!(
            (typed.max_attempts, typed.backoff_base, typed.backoff_max),
            (1, Duration::from_secs(10), Duration::from_secs(300))
        );
        assert_eq!(retry_policy(Some(3), of_type, queue).max_attempts, 3);
        assert_eq!(
            retry_policy(Some(3), TypePolicy::default(), queue).max_attempts,
            3
        );
    }
}
