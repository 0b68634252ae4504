//! One write to the queue, [`TaskOp`], and its meaning stated once: what each op requires
//! of its task before it applies ([`Requirement`]: a version, or no task at all, and who
//! may hold it) and what it does ([`Effect`]: a put, holding the task for the writer or for
//! nobody or leaving its claim as it is, or a delete, with a record written beside it).
//! Backends map these to their native writes (each backend's plan, such as
//! `coord/zookeeper/plan.rs`) and never tell the variants apart themselves; a new op is
//! one row here and one in the table test below.
//!
//! Two rules hold for every op and are not repeated per row: a guarded write
//! ([`crate::coord::Tasks::write`]) applies only while its leadership holds; a lease's own
//! write ([`crate::coord::Tasks::write_own`]) touches only tasks that lease holds, so it
//! may carry no op that [`TaskOp::needs_leadership`]. A requirement is what the seam
//! promises; a backend need not check again what its native write already ensures (under
//! the leadership guard only the leader writes), and where its delete of a missing key
//! succeeds a completion of a task already gone may answer `Done` (Consul's `delete-cas`).
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use super::TaskVersion;

/// One write to the queue. Each is conditioned on the version the leader last read; the
/// whole batch is also conditioned on the leadership it is written under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskOp {
    /// Mark the task taken by this leadership's lease, writing `value`.
    Claim {
        key: String,
        version: TaskVersion,
        value: Vec<u8>,
    },
    /// Delete the task: its run finished.
    Complete { key: String, version: TaskVersion },
    /// Write `value` and give up this lease's claim (a retry, a run put back).
    Release {
        key: String,
        version: TaskVersion,
        value: Vec<u8>,
    },
    /// Write `value` to a task no live lease holds (an orphan put back in the queue).
    Rewrite {
        key: String,
        version: TaskVersion,
        value: Vec<u8>,
    },
    /// Delete the task and write `value` under `to` (the dead-letter prefix).
    Move {
        key: String,
        version: TaskVersion,
        to: String,
        value: Vec<u8>,
    },
    /// Delete the task, its run finished, and write its history record `value` under
    /// `to`, in the same write. Unlike [`TaskOp::Move`], a task that is gone already (under
    /// the leadership guard only an operator can delete a claimed task) may be finished all
    /// the same: `Done` with the record written, or `Conflict` with nothing written, are
    /// both right (the run did finish, so its record is true either way). A backend on
    /// which that saves an operation (Consul: no `check-index` before the `delete-cas`)
    /// writes it in fewer.
    Finish {
        key: String,
        version: TaskVersion,
        to: String,
        value: Vec<u8>,
    },
    /// Create `key` holding `value`, unheld; conflicts if it exists: a schedule's tick,
    /// enqueued by the leader in the same write that records the tick, so that it is
    /// enqueued at most once whoever leads.
    Create { key: String, value: Vec<u8> },
}

/// What an op requires of its task's existence and version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// The task exists at this version.
    Version(TaskVersion),
    /// The task exists at this version or, under the leadership guard, is gone already
    /// (under the guard only an operator can delete a claimed task): then only the op's
    /// record is written, or the op conflicts; a backend may do either.
    VersionOrGone(TaskVersion),
    /// No task exists at the key.
    Absent,
}

/// Who may hold the task's claim for an op to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeldBy {
    /// Anyone or nobody: the leadership guard is enough.
    Any,
    /// Nobody, or the writer's own lease (a claim taken up again).
    FreeOrWriter,
    /// The writer's own lease.
    Writer,
    /// No live lease.
    Free,
}

/// What an op requires before it applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub task: Expected,
    pub held_by: HeldBy,
}

/// Who holds the task after a put.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holding {
    /// The writer's lease: the task is claimed, and its claim ends with that lease.
    Writer,
    /// Nobody: whatever claim there was is given up.
    Nobody,
    /// The claim is left as it is (a task no live lease holds stays so).
    Unchanged,
}

/// A record an op writes beside deleting its task (a dead letter, a history record),
/// whatever is under its key already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub key: &'a str,
    pub value: &'a [u8],
}

/// What an op does to its task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect<'a> {
    /// Writes `value` to the task (creating it for [`Expected::Absent`]), held as `holding`.
    Put { value: &'a [u8], holding: Holding },
    /// Deletes the task and its claim, and writes `record` if there is one.
    Delete { record: Option<Record<'a>> },
}

fn at(version: &TaskVersion, held_by: HeldBy) -> Requirement {
    Requirement {
        task: Expected::Version(*version),
        held_by,
    }
}

fn put(value: &[u8], holding: Holding) -> Effect<'_> {
    Effect::Put { value, holding }
}

impl TaskOp {
    /// The one place the variants are told apart for their meaning: the key, what the op
    /// requires and what it does.
    fn meaning(&self) -> (&str, Requirement, Effect<'_>) {
        match self {
            TaskOp::Claim {
                key,
                version,
                value,
            } => (
                key,
                at(version, HeldBy::FreeOrWriter),
                put(value, Holding::Writer),
            ),
            TaskOp::Complete { key, version } => (
                key,
                at(version, HeldBy::Any),
                Effect::Delete { record: None },
            ),
            TaskOp::Release {
                key,
                version,
                value,
            } => (
                key,
                at(version, HeldBy::Writer),
                put(value, Holding::Nobody),
            ),
            TaskOp::Rewrite {
                key,
                version,
                value,
            } => (
                key,
                at(version, HeldBy::Free),
                put(value, Holding::Unchanged),
            ),
            TaskOp::Move {
                key,
                version,
                to,
                value,
            } => (
                key,
                at(version, HeldBy::Any),
                Effect::Delete {
                    record: Some(Record { key: to, value }),
                },
            ),
            TaskOp::Finish {
                key,
                version,
                to,
                value,
            } => (
                key,
                Requirement {
                    task: Expected::VersionOrGone(*version),
                    held_by: HeldBy::Any,
                },
                Effect::Delete {
                    record: Some(Record { key: to, value }),
                },
            ),
            TaskOp::Create { key, value } => (
                key,
                Requirement {
                    task: Expected::Absent,
                    held_by: HeldBy::Free,
                },
                put(value, Holding::Nobody),
            ),
        }
    }

    pub fn key(&self) -> &str {
        self.meaning().0
    }

    /// What the op requires of its task before it applies.
    pub fn requires(&self) -> Requirement {
        self.meaning().1
    }

    /// What the op does to its task.
    pub fn effect(&self) -> Effect<'_> {
        self.meaning().2
    }

    /// The version the op is conditioned on (0 for a key that must not exist yet).
    pub fn version(&self) -> TaskVersion {
        match self.requires().task {
            Expected::Version(version) | Expected::VersionOrGone(version) => version,
            Expected::Absent => TaskVersion(0),
        }
    }

    /// Where the op writes its record beside deleting its task (the dead letter, the
    /// history record).
    pub fn record_key(&self) -> Option<&str> {
        match self.effect() {
            Effect::Delete {
                record: Some(record),
            } => Some(record.key),
            _ => None,
        }
    }

    /// The length of the value the op writes, to its task or its record (0 for a delete
    /// alone).
    pub fn value_len(&self) -> usize {
        match self.effect() {
            Effect::Put { value, .. }
            | Effect::Delete {
                record: Some(Record { value, .. }),
            } => value.len(),
            Effect::Delete { record: None } => 0,
        }
    }

    /// Whether only a leadership may write the op, never a lease's own write: it claims a
    /// task, or creates one (a new task has no claim for the lease to hold).
    pub fn needs_leadership(&self) -> bool {
        matches!(
            self.effect(),
            Effect::Put {
                holding: Holding::Writer,
                ..
            }
        ) || self.requires().task == Expected::Absent
    }

    /// Whether the answer to a write that applied the op must carry the task's new version
    /// ([`crate::coord::Written::Done`]): it claimed or released a task. A backend may
    /// answer the version of any other put too (a rewrite's), as it finds it.
    pub fn answers_version(&self) -> bool {
        self.requires().task != Expected::Absent
            && matches!(
                self.effect(),
                Effect::Put {
                    holding: Holding::Writer | Holding::Nobody,
                    ..
                }
            )
    }

    /// The op with an empty value: what a backend measures to cost an op, adding the
    /// value's length, so that costing every candidate of a claim copies nothing big.
    pub fn bare(&self) -> TaskOp {
        match self {
            TaskOp::Complete { key, version } => TaskOp::Complete {
                key: key.clone(),
                version: *version,
            },
            TaskOp::Claim { key, version, .. } => TaskOp::Claim {
                key: key.clone(),
                version: *version,
                value: Vec::new(),
            },
            TaskOp::Release { key, version, .. } => TaskOp::Release {
                key: key.clone(),
                version: *version,
                value: Vec::new(),
            },
            TaskOp::Rewrite { key, version, .. } => TaskOp::Rewrite {
                key: key.clone(),
                version: *version,
                value: Vec::new(),
            },
            TaskOp::Move {
                key, version, to, ..
            } => TaskOp::Move {
                key: key.clone(),
                version: *version,
                to: to.clone(),
                value: Vec::new(),
            },
            TaskOp::Finish {
                key, version, to, ..
            } => TaskOp::Finish {
                key: key.clone(),
                version: *version,
                to: to.clone(),
                value: Vec::new(),
            },
            TaskOp::Create { key, .. } => TaskOp::Create {
                key: key.clone(),
                value: Vec::new(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: TaskVersion = TaskVersion(7);

    /// Every op's meaning, one row each: what it requires of its task (existence and
    /// version, holder) and what it does (a put and who holds the task after it, or a
    /// delete and the record written beside it); with whether a lease's own write may carry
    /// it and whether its answer carries the task's new version.
    #[test]
    fn every_op_states_what_it_requires_and_does() {
        let (key, to, value) = ("q/a".to_string(), "r/a".to_string(), b"v".to_vec());
        let record = Some(Record {
            key: "r/a",
            value: b"v",
        });
        let put = |holding| Effect::Put {
            value: b"v",
            holding,
        };
        let version = |held_by| Requirement {
            task: Expected::Version(V),
            held_by,
        };
        #[rustfmt::skip]
        let table: [(TaskOp, Requirement, Effect, bool, bool); 7] = [
            // op, requires, effect, needs leadership, answers its version
            (TaskOp::Claim { key: key.clone(), version: V, value: value.clone() },
                version(HeldBy::FreeOrWriter), put(Holding::Writer), true, true),
            (TaskOp::Complete { key: key.clone(), version: V },
                version(HeldBy::Any), Effect::Delete { record: None }, false, false),
            (TaskOp::Release { key: key.clone(), version: V, value: value.clone() },
                version(HeldBy::Writer), put(Holding::Nobody), false, true),
            (TaskOp::Rewrite { key: key.clone(), version: V, value: value.clone() },
                version(HeldBy::Free), put(Holding::Unchanged), false, false),
            (TaskOp::Move { key: key.clone(), version: V, to: to.clone(), value: value.clone() },
                version(HeldBy::Any), Effect::Delete { record }, false, false),
            (TaskOp::Finish { key: key.clone(), version: V, to: to.clone(), value: value.clone() },
                Requirement { task: Expected::VersionOrGone(V), held_by: HeldBy::Any },
                Effect::Delete { record }, false, false),
            (TaskOp::Create { key: key.clone(), value: value.clone() },
                Requirement { task: Expected::Absent, held_by: HeldBy::Free },
                put(Holding::Nobody), true, false),
        ];
        for (op, requires, effect, needs_leadership, answers_version) in table {
            assert_eq!(op.key(), "q/a", "{op:?}");
            assert_eq!(op.requires(), requires, "{op:?}");
            assert_eq!(op.effect(), effect, "{op:?}");
            assert_eq!(op.needs_leadership(), needs_leadership, "{op:?}");
            assert_eq!(op.answers_version(), answers_version, "{op:?}");
            let expected_version = match requires.task {
                Expected::Absent => TaskVersion(0),
                _ => V,
            };
            assert_eq!(op.version(), expected_version, "{op:?}");
            let writes = !matches!(effect, Effect::Delete { record: None });
            assert_eq!(op.value_len(), usize::from(writes), "{op:?}");
            let record_key = matches!(effect, Effect::Delete { record: Some(_) }).then_some("r/a");
            assert_eq!(op.record_key(), record_key, "{op:?}");
            let bare = op.bare();
            assert_eq!(
                (bare.key(), bare.requires(), bare.value_len()),
                (op.key(), op.requires(), 0)
            );
            assert_eq!(bare.record_key(), op.record_key(), "{op:?}");
        }
    }
}
