//! A run whose handler succeeded and whose completion is still to be written, and how the
//! completions of several share one write: every task's claimed version is deleted, and
//! their history records go together under one key (`task::history::batch_key`), written
//! by one op instead of one per task. What a completion costs a write, alone or sharing,
//! so that the planner keeps writes within the coordinator's limits.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use crate::coord::{Coordinator, TaskOp, TaskVersion, WriteCost};
use crate::task::history::{batch_key, batch_value};
use crate::task::Task;

/// Bytes a write of records under one key may carry beyond their shares: the key's `.`
/// and count, and the array's brackets, as a backend may encode them (base64 adds a third
/// and rounds up).
const BATCH_EXTRA: usize = 16;
/// Bytes each record's share adds for the comma before it, base64-encoded.
const COMMA: usize = 2;

/// A task whose handler succeeded and whose deletion is still to be written.
pub(super) struct Finished {
    pub(super) task: Box<Task>,
    pub(super) claimed_version: TaskVersion,
    pub(super) elapsed_ms: u64,
    /// Where its history record goes when written alone, and the record (`None`: history
    /// is off).
    pub(super) history: Option<(String, Vec<u8>)>,
    /// The history record key of a completion write that carried this one and whose answer
    /// never came: if that key exists, the write was applied (it is all or nothing), and
    /// writing the completion again would record the run twice.
    pub(super) sent_under: Option<String>,
    /// What its completion costs in a write of its own.
    alone: WriteCost,
    /// What it adds to a write whose completions share one record key: its deletion and
    /// its record's bytes.
    shared: WriteCost,
}

impl Finished {
    pub(super) fn new(
        coord: &dyn Coordinator,
        task: Box<Task>,
        claimed_version: TaskVersion,
        elapsed_ms: u64,
        history: Option<(String, Vec<u8>)>,
    ) -> Finished {
        let mut finished = Finished {
            task,
            claimed_version,
            elapsed_ms,
            history,
            sent_under: None,
            alone: WriteCost::default(),
            shared: WriteCost::default(),
        };
        finished.alone = coord.cost(&finished.completion());
        finished.shared = match &finished.history {
            None => finished.alone,
            Some((to, _)) => {
                let deletion = coord.cost(&finished.deletion());
                let bare = coord.cost(&TaskOp::Finish {
                    key: finished.task.key.clone(),
                    version: claimed_version,
                    to: to.clone(),
                    value: Vec::new(),
                });
                // The record as the backend encodes it, and the comma before it.
                deletion
                    + WriteCost {
                        ops: 0,
                        bytes: finished.alone.bytes.saturating_sub(bare.bytes) + COMMA,
                    }
            }
        };
        finished
    }

    /// Completes the version this run claimed, and only that one: deletes it, or, with
    /// history on, finishes it with its history record in the same write (no extra round
    /// trip).
    pub(super) fn completion(&self) -> TaskOp {
        match &self.history {
            Some((to, value)) => self.finish(to.clone(), value.clone()),
            None => self.deletion(),
        }
    }

    fn deletion(&self) -> TaskOp {
        TaskOp::Complete {
            key: self.task.key.clone(),
            version: self.claimed_version,
        }
    }

    fn finish(&self, to: String, value: Vec<u8>) -> TaskOp {
        TaskOp::Finish {
            key: self.task.key.clone(),
            version: self.claimed_version,
            to,
            value,
        }
    }
}

/// The completions of `group`, in one write: each task's claimed version deleted, and the
/// history records, if more than one, together under one key under `done_prefix` (named
/// after the newest), written by the finish of the task that has it. One record is
/// written under its own key, as a completion alone writes it.
pub(super) fn completions(done_prefix: &str, group: &[Finished]) -> Vec<TaskOp> {
    let Some((to, Some(carrier))) = record_of(done_prefix, group) else {
        return group.iter().map(Finished::completion).collect();
    };
    let value = batch_value(
        group
            .iter()
            .filter_map(|done| Some(done.history.as_ref()?.1.as_slice())),
    );
    let mut value = Some(value);
    group
        .iter()
        .enumerate()
        .map(|(i, done)| match value.take_if(|_| i == carrier) {
            Some(value) => done.finish(to.clone(), value),
            None => done.deletion(),
        })
        .collect()
}

/// The key [`completions`] writes `group`'s history records under, if any, and the index
/// of the completion that carries them when they share one key (`None`: one record, under
/// its own key).
fn record_of(done_prefix: &str, group: &[Finished]) -> Option<(String, Option<usize>)> {
    let recorded = group.iter().filter(|done| done.history.is_some()).count();
    let (newest, carrier) = group
        .iter()
        .enumerate()
        .filter_map(|(i, done)| Some((&done.history.as_ref()?.0, i)))
        .max()?;
    if recorded == 1 {
        return Some((newest.clone(), None));
    }
    Some((batch_key(done_prefix, newest, recorded), Some(carrier)))
}

/// Marks `group`, whose completion write's answer never came, with the record key that
/// write carried (nothing without history: a completion written again deletes what is
/// gone and records nothing).
pub(super) fn mark_unanswered(done_prefix: &str, group: &mut [Finished]) {
    let key = record_of(done_prefix, group).map(|(key, _)| key);
    for done in group {
        done.sent_under = key.clone();
    }
}

/// The completions of `finished` that may ride a claim: those before the first whose
/// earlier write's answer was lost, which rides nothing until its record says whether that
/// write was applied (`Queue::recorded_already`).
pub(super) fn ride_able(finished: &[Finished]) -> &[Finished] {
    let unsure = finished.iter().position(|done| done.sent_under.is_some());
    &finished[..unsure.unwrap_or(finished.len())]
}

/// What the completions of `finished` cost a write, as [`completions`] writes them: the
/// write's own part (`guard`, plus the shared record key's op when records ride) and each
/// completion's share. Kept within limits, any prefix of them fits with what they say.
pub(super) fn riders(guard: WriteCost, finished: &[Finished]) -> (WriteCost, Vec<WriteCost>) {
    let record = finished
        .iter()
        .filter(|done| done.history.is_some())
        .map(|done| WriteCost {
            ops: done.alone.ops.saturating_sub(done.shared.ops),
            bytes: done.alone.bytes.saturating_sub(done.shared.bytes) + BATCH_EXTRA,
        })
        .max_by_key(|cost| (cost.ops, cost.bytes))
        .unwrap_or_default();
    (
        guard + record,
        finished.iter().map(|done| done.shared).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::memory::MemoryCoordinator;
    use crate::coord::StoredTask;

    fn memory() -> MemoryCoordinator {
        MemoryCoordinator::new(Default::default())
    }

    fn finished(coord: &dyn Coordinator, n: usize, recorded: bool) -> Finished {
        let stored = StoredTask {
            key: format!("q/t{n}"),
            value: format!(r#"{{"taskType":"T","taskTime":{n}}}"#).into_bytes(),
            version: TaskVersion(n as u64),
            created: 1,
            holder: None,
        };
        let task = Task::parse(&stored).unwrap();
        let history = recorded.then(|| {
            (
                format!("done/000000000000{n}-t{n}"),
                format!(r#"{{"outcome":"completed","key":"q/t{n}"}}"#).into_bytes(),
            )
        });
        Finished::new(coord, Box::new(task), TaskVersion(n as u64), 1, history)
    }

    /// Several records share one key named after the newest, carried by its task's
    /// finish; every other task is only deleted, at the version it claimed.
    #[test]
    fn records_of_one_write_share_one_key() {
        let coord = memory();
        let group = [
            finished(&coord, 1, true),
            finished(&coord, 3, true),
            finished(&coord, 2, true),
        ];
        let ops = completions("done/", &group);
        assert_eq!(ops.len(), 3);
        assert!(
            matches!(&ops[0], TaskOp::Complete { key, version } if key == "q/t1" && version.0 == 1)
        );
        assert!(matches!(&ops[2], TaskOp::Complete { key, .. } if key == "q/t2"));
        let TaskOp::Finish { key, to, value, .. } = &ops[1] else {
            panic!("the newest record's task carries the records: {:?}", ops[1]);
        };
        assert_eq!(key, "q/t3");
        assert_eq!(to, "done/0000000000003.3-t3");
        let records = crate::task::history::HistoryRecord::decode_all(to, value);
        let keys: Vec<&str> = records.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["q/t1", "q/t3", "q/t2"]);
    }

    /// One record keeps its own key, and without history every completion is a deletion.
    #[test]
    fn one_record_or_none_is_written_as_alone() {
        let coord = memory();
        let one = [finished(&coord, 1, false), finished(&coord, 2, true)];
        let ops = completions("done/", &one);
        assert!(matches!(&ops[0], TaskOp::Complete { .. }));
        assert!(matches!(&ops[1], TaskOp::Finish { to, .. } if to == "done/0000000000002-t2"));
        let none = [finished(&coord, 1, false), finished(&coord, 2, false)];
        assert!(completions("done/", &none)
            .iter()
            .all(|op| matches!(op, TaskOp::Complete { .. })));
    }

    /// What the planner is told a group costs is never less than what the group's write
    /// costs, for every prefix of it.
    #[test]
    fn the_planned_cost_covers_the_write() {
        let settings = crate::config::Settings::load(None, crate::config::Env::default()).unwrap();
        let consul = crate::coord::consul::connect(&settings.consul, "leader", false, "").unwrap();
        the_planned_cost_covers_the_write_on(&memory());
        the_planned_cost_covers_the_write_on(consul.as_ref());
    }

    fn the_planned_cost_covers_the_write_on(coord: &dyn Coordinator) {
        let group: Vec<Finished> = (1..=9).map(|n| finished(coord, n, n != 4)).collect();
        let guard = coord.guard_cost();
        let (base, shares) = riders(guard, &group);
        for len in 1..=group.len() {
            let planned = shares[..len].iter().copied().fold(base, |a, b| a + b);
            let written = completions("done/", &group[..len])
                .iter()
                .map(|op| coord.cost(op))
                .fold(guard, |a, b| a + b);
            assert!(
                planned.ops >= written.ops && planned.bytes >= written.bytes,
                "{len}: planned {planned:?}, written {written:?}"
            );
        }
    }
}
