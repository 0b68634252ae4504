//! Pure: what the coordinator's answer to a claim write means for each task of the batch
//! (no I/O, no clock; the batch and the answer come in): claimed at a version, the
//! leadership lost, the listing stale, or, when only the batch's own claims failed, each
//! task put back, deferred (the coordinator refuses it for a while) or read again (it
//! moved). Also whether a write refused as too large is tried again one task at a time or
//! its task dead-lettered. `claim.rs` writes the claim and performs what [`read_answer`],
//! [`fates`] and [`after_refusal`] answer.

use crate::coord::{FencingToken, TaskVersion, Written};
use crate::task::Task;

/// What a claim write's answer means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimAnswer {
    /// Every task of the batch is claimed, each at its claim's version (in batch order),
    /// under the leadership whose token the write saw.
    Claimed {
        versions: Vec<TaskVersion>,
        fencing_token: FencingToken,
    },
    /// The leadership is gone: nothing was applied; step down.
    NotLeader,
    /// A conflict beyond the batch's own claims (or one naming no key): the listing is
    /// stale; list again.
    Relist,
    /// Only claims of the batch conflicted, on these keys: nothing was applied; they
    /// moved, so read them again ([`fates`]).
    ReadAgain(Vec<String>),
    /// Only claims of the batch were refused for a while, on these keys: nothing was
    /// applied and nothing moved them; they step aside ([`fates`]).
    Deferred(Vec<String>),
}

/// Reads the answer to a claim of `batch`.
pub fn read_answer(batch: &[Task], written: Written) -> ClaimAnswer {
    match written {
        Written::Done {
            versions,
            fencing_token,
        } => ClaimAnswer::Claimed {
            versions: batch
                .iter()
                .map(|task| {
                    versions
                        .iter()
                        .find(|(key, _)| *key == task.key)
                        .map_or(TaskVersion(0), |(_, version)| *version)
                })
                .collect(),
            fencing_token,
        },
        Written::NotLeader => ClaimAnswer::NotLeader,
        // Only claims of the batch failed: its other tasks and the rest of the backlog are
        // as read, and those tasks alone are dealt with.
        Written::Conflict(keys) if batch_own(batch, &keys) => ClaimAnswer::ReadAgain(keys),
        Written::Deferred(keys) if batch_own(batch, &keys) => ClaimAnswer::Deferred(keys),
        Written::Conflict(_) | Written::Deferred(_) => ClaimAnswer::Relist,
    }
}

/// Whether `keys` names tasks of `batch` only, and at least one.
fn batch_own(batch: &[Task], keys: &[String]) -> bool {
    !keys.is_empty() && keys.iter().all(|key| batch.iter().any(|t| t.key == *key))
}

/// What becomes of one task of a batch whose claim conflicted on its own tasks only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Not in the conflict: back to its place in the backlog, as read.
    PutBack,
    /// Refused for a while (a dead lease's takeover delay): set aside, the tasks after it
    /// go first.
    Defer,
    /// It moved (a producer rewrote it, a retry was written back) or went: forgotten, and
    /// taken as the re-read shows it now.
    ReadAgain,
}

/// What becomes of each task of `batch` after its claim failed on its own tasks only: the
/// tasks named in `answer` are read again (a conflict: they moved) or step aside (deferred:
/// refused for a while), the others go back to their places.
pub fn fates(batch: &[Task], answer: &ClaimAnswer) -> Vec<Fate> {
    let (keys, fate) = match answer {
        ClaimAnswer::ReadAgain(keys) => (keys.as_slice(), Fate::ReadAgain),
        ClaimAnswer::Deferred(keys) => (keys.as_slice(), Fate::Defer),
        _ => (&[][..], Fate::PutBack),
    };
    batch
        .iter()
        .map(|task| {
            if keys.contains(&task.key) {
                fate
            } else {
                Fate::PutBack
            }
        })
        .collect()
}

/// What the leader does after the coordinator refused a claim write as too large.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Claim one task at a time, alone in its write (no completions riding along), until
    /// the next listing; the batch goes back.
    OneAtATime,
    /// The write already held one task alone: dead-letter it as too large to claim.
    DeadLetter,
}

/// After a claim of `tasks` tasks with `riders` completions riding along was refused as
/// too large: a write that held more than one task alone is tried again one task at a
/// time. `alone` says whether the leader already claims one task at a time.
pub fn after_refusal(tasks: usize, riders: usize, alone: bool) -> Refusal {
    if tasks > 1 || riders > 0 || !alone {
        Refusal::OneAtATime
    } else {
        Refusal::DeadLetter
    }
}

#[cfg(test)]
mod tests {
    use super::{after_refusal, fates, read_answer, ClaimAnswer, Fate, Refusal};
    use crate::coord::{FencingToken, TaskVersion, Written};
    use crate::queue::scripted::task;
    use crate::task::Task;

    fn batch() -> Vec<Task> {
        vec![
            task("q/a", 1, None),
            task("q/b", 2, None),
            task("q/c", 3, None),
        ]
    }

    /// A claim done gives each task its own claim version, in batch order, and a task the
    /// answer does not name gets none (0).
    #[test]
    fn a_done_claim_gives_each_task_its_version() {
        let written = Written::Done {
            versions: vec![
                ("q/c".into(), TaskVersion(30)),
                ("q/a".into(), TaskVersion(10)),
            ],
            fencing_token: FencingToken(7),
        };
        assert_eq!(
            read_answer(&batch(), written),
            ClaimAnswer::Claimed {
                versions: vec![TaskVersion(10), TaskVersion(0), TaskVersion(30)],
                fencing_token: FencingToken(7)
            }
        );
    }

    /// A claim answered NotLeader means stepping down.
    #[test]
    fn a_lost_leadership_means_stepping_down() {
        assert_eq!(
            read_answer(&batch(), Written::NotLeader),
            ClaimAnswer::NotLeader
        );
    }

    /// A conflict on the batch's own tasks reads just those again; a conflict on another
    /// key, or one naming none, means the listing is stale.
    #[test]
    fn a_conflict_on_the_batch_alone_reads_those_tasks_again() {
        assert_eq!(
            read_answer(&batch(), Written::Conflict(vec!["q/b".into()])),
            ClaimAnswer::ReadAgain(vec!["q/b".into()])
        );
        assert_eq!(
            read_answer(
                &batch(),
                Written::Conflict(vec!["q/b".into(), "q/zz".into()])
            ),
            ClaimAnswer::Relist
        );
        assert_eq!(
            read_answer(&batch(), Written::Conflict(vec![])),
            ClaimAnswer::Relist
        );
    }

    /// Tasks the coordinator refuses for a while step aside without being read again, and
    /// the others go back to their places; a deferral naming another key is a stale listing.
    #[test]
    fn deferred_tasks_step_aside_and_the_others_go_back() {
        let answer = read_answer(
            &batch(),
            Written::Deferred(vec!["q/a".into(), "q/c".into()]),
        );
        assert_eq!(
            answer,
            ClaimAnswer::Deferred(vec!["q/a".into(), "q/c".into()])
        );
        assert_eq!(
            fates(&batch(), &answer),
            [Fate::Defer, Fate::PutBack, Fate::Defer]
        );
        assert_eq!(
            read_answer(&batch(), Written::Deferred(vec!["q/zz".into()])),
            ClaimAnswer::Relist
        );
    }

    /// Conflicted tasks moved: they are read again and the rest go back.
    #[test]
    fn a_task_that_moved_is_read_again() {
        let answer = ClaimAnswer::ReadAgain(vec!["q/a".into(), "q/c".into()]);
        assert_eq!(
            fates(&batch(), &answer),
            [Fate::ReadAgain, Fate::PutBack, Fate::ReadAgain]
        );
    }

    /// A refused write of several tasks, or with completions riding along, is tried one
    /// task at a time; a lone task already claimed alone is dead-lettered.
    #[test]
    fn a_refused_batch_goes_one_at_a_time_and_a_lone_task_is_dead_lettered() {
        assert_eq!(after_refusal(3, 0, false), Refusal::OneAtATime);
        assert_eq!(after_refusal(1, 2, true), Refusal::OneAtATime);
        assert_eq!(after_refusal(1, 0, false), Refusal::OneAtATime);
        assert_eq!(after_refusal(1, 0, true), Refusal::DeadLetter);
    }
}
