//! What the coordinator's answer to a claim write means for each task of the batch (pure:
//! no I/O, no clock; the batch, the answer and what a re-read found come in): claimed at a
//! version, the leadership lost, the listing stale, or, when only the batch's own claims
//! conflicted, each task put back, deferred (refused for a while: Consul's lock-delay) or
//! taken as read again. Also whether a write refused as too large is tried again one task
//! at a time or its task dead-lettered. `claim.rs` writes the claim and performs what
//! [`read_answer`], [`after_conflict`] and [`after_refusal`] answer.

use crate::coord::{StoredTask, Written};
use crate::task::Task;

/// What a claim write's answer means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimAnswer {
    /// Every task of the batch is claimed, each at its claim's version (in batch order),
    /// under the leadership whose token the write saw.
    Claimed {
        versions: Vec<u64>,
        fencing_token: u64,
    },
    /// The leadership is gone: nothing was applied; step down.
    NotLeader,
    /// A conflict beyond the batch's own claims (or one naming no key): the listing is
    /// stale; list again.
    Relist,
    /// Only claims of the batch conflicted, on these keys: nothing was applied; read them
    /// again and decide with [`after_conflict`].
    ReadAgain(Vec<String>),
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
                        .map_or(0, |(_, version)| *version)
                })
                .collect(),
            fencing_token,
        },
        Written::NotLeader => ClaimAnswer::NotLeader,
        Written::Conflict(keys) => {
            // Only claims of the batch conflicted: its other tasks and the rest of the
            // backlog are as read, and those tasks read again are enough.
            let own =
                !keys.is_empty() && keys.iter().all(|key| batch.iter().any(|t| t.key == *key));
            if own {
                ClaimAnswer::ReadAgain(keys)
            } else {
                ClaimAnswer::Relist
            }
        }
    }
}

/// What becomes of one task of a batch whose claim conflicted on its own tasks only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Not in the conflict: back to its place in the backlog, as read.
    PutBack,
    /// Refused for a while (Consul: another session's lock-delay): set aside, the tasks
    /// after it go first.
    Defer,
    /// It moved (a producer rewrote it, a retry was written back) or went: forgotten, and
    /// taken as the re-read shows it now.
    ReadAgain,
}

/// What becomes of each task of `batch` after its claim conflicted on `keys` (all of them
/// the batch's), given `current`, those keys as read again. If every conflicted task is
/// still as read and held by no lease, nothing moved them: the coordinator refuses them for
/// a while and they step aside. Otherwise the conflicted ones are taken as read again.
pub fn after_conflict(batch: &[Task], keys: &[String], current: &[StoredTask]) -> Vec<Fate> {
    let tried: Vec<usize> = keys
        .iter()
        .filter_map(|key| batch.iter().position(|task| task.key == *key))
        .collect();
    let still = unmoved(batch, &tried, current);
    let deferred = !still.is_empty() && still.len() == tried.len() && still.len() == keys.len();
    (0..batch.len())
        .map(
            |n| match (deferred, still.contains(&n), keys.contains(&batch[n].key)) {
                (true, true, _) => Fate::Defer,
                (false, _, true) => Fate::ReadAgain,
                _ => Fate::PutBack,
            },
        )
        .collect()
}

/// Of a conflicted claim's tasks (`tried`, indexes into `batch`), those that `current`
/// shows still at the version read and held by no lease: nothing moved them, so the
/// coordinator refuses them for a while (Consul: another session's lock-delay) and they
/// step aside rather than send the leader back to list.
pub fn unmoved(batch: &[Task], tried: &[usize], current: &[StoredTask]) -> Vec<usize> {
    tried
        .iter()
        .copied()
        .filter(|&i| {
            batch.get(i).is_some_and(|task| {
                current.iter().any(|now| {
                    now.key == task.key && now.version == task.version && now.holder.is_none()
                })
            })
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
    use super::{after_conflict, after_refusal, read_answer, unmoved, ClaimAnswer, Fate, Refusal};
    use crate::coord::LeaseId;
    use crate::coord::{StoredTask, Written};
    use crate::queue::scripted::task;
    use crate::task::Task;

    fn batch() -> Vec<Task> {
        vec![
            task("q/a", 1, None),
            task("q/b", 2, None),
            task("q/c", 3, None),
        ]
    }

    fn stored(key: &str, version: u64, holder: Option<&str>) -> StoredTask {
        StoredTask {
            key: key.into(),
            value: Vec::new(),
            version,
            created: 1,
            holder: holder.map(|h| LeaseId(h.into())),
        }
    }

    /// A claim done gives each task its own claim version, in batch order, and a task the
    /// answer does not name gets none (0).
    #[test]
    fn a_done_claim_gives_each_task_its_version() {
        let written = Written::Done {
            versions: vec![("q/c".into(), 30), ("q/a".into(), 10)],
            fencing_token: 7,
        };
        assert_eq!(
            read_answer(&batch(), written),
            ClaimAnswer::Claimed {
                versions: vec![10, 0, 30],
                fencing_token: 7
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

    /// Conflicted tasks still as read and free are deferred (lock-delay) and the others
    /// go back to their places.
    #[test]
    fn tasks_nothing_moved_are_deferred_and_the_others_put_back() {
        let keys = vec!["q/a".to_string(), "q/c".to_string()];
        let current = vec![stored("q/a", 1, None), stored("q/c", 1, None)];
        assert_eq!(
            after_conflict(&batch(), &keys, &current),
            [Fate::Defer, Fate::PutBack, Fate::Defer]
        );
    }

    /// Once one conflicted task moved, every conflicted one is read again (none is
    /// deferred) and the rest go back.
    #[test]
    fn a_task_that_moved_is_read_again() {
        let keys = vec!["q/a".to_string(), "q/c".to_string()];
        let current = vec![stored("q/a", 1, None), stored("q/c", 9, None)];
        assert_eq!(
            after_conflict(&batch(), &keys, &current),
            [Fate::ReadAgain, Fate::PutBack, Fate::ReadAgain]
        );
        let gone = vec![stored("q/a", 1, None)];
        assert_eq!(
            after_conflict(&batch(), &keys, &gone),
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

    /// A conflicted claim's task still as read and free was refused for a while; one that
    /// moved, went or is held was not.
    #[test]
    fn only_tasks_nothing_moved_are_refused_for_a_while() {
        let batch = vec![
            task("q/a", 1, None),
            task("q/b", 2, None),
            task("q/c", 3, None),
        ];
        let stored = |key: &str, version: u64, holder: Option<&str>| StoredTask {
            key: key.into(),
            value: Vec::new(),
            version,
            created: 1,
            holder: holder.map(|h| LeaseId(h.into())),
        };
        let current = vec![
            stored("q/a", 1, None),
            stored("q/b", 7, None),
            stored("q/c", 1, Some("other")),
        ];
        assert_eq!(unmoved(&batch, &[0, 1, 2], &current), [0]);
        assert_eq!(unmoved(&batch, &[1], &current), Vec::<usize>::new());
        assert_eq!(unmoved(&batch, &[0], &[]), Vec::<usize>::new());
    }
}
