//! What this process knows of the claim records it wrote, so that each goes as soon as
//! nothing it says matters any more, and whether it may write them at all. Pure: the
//! queue's writes and listings (`queue.rs`) tell it what was answered and read; names
//! for new records come in from outside.
//!
//! A claim record is garbage once each of its tasks was completed, moved or released by a
//! write this process saw applied (a release writes a later record naming the task). A
//! release record is garbage once every claim record it answers is gone; it is deleted
//! with the last of them, never before (alone, a claim record would hold its task again).
//! What this process cannot follow (a write whose answer was lost, a record of a lease it
//! took up after a restart) a listing finds (`layout::garbage`).
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::coord::etcd::client::Kv;
use crate::coord::etcd::layout::{read_version, Hold, Layout, Owner};
use crate::coord::etcd::plan::{Records, GARBAGE_PER_WRITE};
use crate::coord::{Effect, Expected, Holding, TaskOp, Written};

/// How a write went, as far as its records are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Applied whole, at this revision.
    Applied(i64),
    /// Applied nothing (rolled back, or refused), or not known (the answer was lost).
    NotApplied,
}

impl Outcome {
    pub fn of(written: &Written, revision: i64) -> Outcome {
        match written {
            Written::Done { .. } => Outcome::Applied(revision),
            _ => Outcome::NotApplied,
        }
    }
}

#[derive(Debug, Default)]
pub struct RecordBook {
    /// The revision at which every lease's owner was last seen to know records (0: one
    /// did not, or none was read yet).
    all_know_since: i64,
    /// Claim records this process wrote, each with the revision it was made at and the
    /// tasks still held by it.
    live: HashMap<String, (i64, HashSet<String>)>,
    /// The claim record each task this process claimed is held by.
    record_of: HashMap<String, String>,
    /// Release records, each with the claim records it answers that are not gone yet.
    answers: HashMap<String, HashSet<String>>,
    /// Records to delete, oldest first.
    garbage: VecDeque<String>,
    /// The claim record holding each record-held task the last reads found (tasks this
    /// process did not claim itself: a lease taken up after a restart).
    learned: HashMap<String, String>,
    /// Whether this process wrote a record: only then does its listing look for garbage.
    wrote: bool,
    /// Whether a write was applied since a listing last took garbage: the next write is
    /// then likely soon, and takes it along.
    busy: bool,
}

impl RecordBook {
    /// The owners read at `revision`: records may be written while all of them know them.
    pub fn owners_seen(&mut self, owners: &[Kv], revision: i64) {
        let all_know = owners
            .iter()
            .all(|kv| Owner::decode(&kv.value).knows_records());
        self.all_know_since = if all_know && revision > 0 {
            revision
        } else {
            0
        };
    }

    /// What `ops`, written by `lease` (`own`: outside leadership, its own tasks only),
    /// add beside their own operations: a claim record if records may be written (named
    /// `ids.0`), a release record (`ids.1`), garbage, and for an own write the records
    /// that hold its tasks.
    pub fn plan(
        &mut self,
        layout: &Layout,
        lease: i64,
        own: bool,
        ops: &[TaskOp],
        ids: (u64, u64),
    ) -> Records {
        let claims = ops.iter().any(takes_claim);
        let claim = (claims && self.all_know_since > 0)
            .then(|| (layout.record(lease, ids.0), self.all_know_since));
        let take = self.garbage.len().min(GARBAGE_PER_WRITE);
        let own = if own {
            ops.iter()
                .filter_map(|op| {
                    let key = op.key();
                    let record = self.record_of.get(key).or_else(|| self.learned.get(key))?;
                    Some((key.to_string(), record.clone()))
                })
                .collect()
        } else {
            HashMap::new()
        };
        Records {
            claim,
            release: layout.record(lease, ids.1),
            garbage: self.garbage.drain(..take).collect(),
            own,
        }
    }

    /// Reads found these tasks held by these claim records.
    pub fn learn(&mut self, held: impl IntoIterator<Item = (String, String)>) {
        self.learned.extend(held);
    }

    /// What a write planned with `records` did.
    pub fn answered(&mut self, records: &Records, ops: &[TaskOp], outcome: Outcome) {
        let Outcome::Applied(revision) = outcome else {
            // Deleting again is harmless; a record is never deleted before its time.
            for name in records.garbage.iter().rev() {
                self.garbage.push_front(name.clone());
            }
            return;
        };
        self.busy = true;
        if let Some((name, _)) = &records.claim {
            let claimed: HashSet<String> = ops
                .iter()
                .filter(|op| takes_claim(op))
                .map(|op| op.key().to_string())
                .collect();
            if !claimed.is_empty() {
                self.wrote = true;
                for key in &claimed {
                    self.record_of.insert(key.clone(), name.clone());
                }
                self.live.insert(name.clone(), (revision, claimed));
            }
        }
        // The claim records the release record answers (`None`: it answers one this
        // process did not write, which only a listing can judge).
        let mut answers: Option<HashSet<String>> = Some(HashSet::new());
        let mut releases = false;
        let mut emptied = Vec::new();
        for op in ops {
            let (_, hold) = read_version(op.version());
            // A delete ends the claim, and so does a put of an existing task that gives
            // it up (a release).
            let release = op.requires().task != Expected::Absent
                && matches!(
                    op.effect(),
                    Effect::Put {
                        holding: Holding::Nobody,
                        ..
                    }
                );
            let ends = release || matches!(op.effect(), Effect::Delete { .. });
            if !ends || hold != Hold::Record {
                continue;
            }
            releases |= release;
            self.learned.remove(op.key());
            let Some(name) = self.record_of.remove(op.key()) else {
                if release {
                    answers = None;
                }
                continue;
            };
            if let (true, Some(answers)) = (release, answers.as_mut()) {
                answers.insert(name.clone());
            }
            if let Some((_, tasks)) = self.live.get_mut(&name) {
                tasks.remove(op.key());
                if tasks.is_empty() {
                    self.live.remove(&name);
                    emptied.push(name);
                }
            }
        }
        if releases {
            self.wrote = true;
            if let Some(answers) = answers {
                self.answers.insert(records.release.clone(), answers);
            }
        }
        for name in emptied {
            self.gone(name);
        }
    }

    /// A claim record holds nothing any more: it goes, and any release record whose last
    /// claim record it was goes after it.
    fn gone(&mut self, name: String) {
        self.garbage.push_back(name.clone());
        let mut freed = Vec::new();
        for (release, claims) in &mut self.answers {
            if claims.remove(&name) && claims.is_empty() {
                freed.push(release.clone());
            }
        }
        for release in freed {
            self.answers.remove(&release);
            self.garbage.push_back(release);
        }
    }

    /// A listing at `revision` read the records `present`, and found `garbage` among them.
    /// A claim record this process made before that revision and not present went (its
    /// lease ended, or an operator deleted it): it is forgotten, and a release record that
    /// waited for it goes.
    pub fn listed(&mut self, present: &HashSet<&str>, revision: i64, garbage: Vec<String>) {
        let went: Vec<String> = self
            .live
            .iter()
            .filter(|(name, (made, _))| *made <= revision && !present.contains(name.as_str()))
            .map(|(name, _)| name.clone())
            .collect();
        self.learned
            .retain(|_, record| present.contains(record.as_str()));
        for name in went {
            if let Some((_, tasks)) = self.live.remove(&name) {
                for task in tasks {
                    self.record_of.remove(&task);
                }
            }
            self.gone(name);
        }
        for name in garbage {
            if !self.garbage.contains(&name) {
                self.garbage.push_back(name);
            }
        }
    }

    /// Whether this process wrote records (its listings look for garbage).
    pub fn wrote(&self) -> bool {
        self.wrote
    }

    /// Up to `limit` records to delete now, outside any write.
    pub fn take_garbage(&mut self, limit: usize) -> Vec<String> {
        let take = self.garbage.len().min(limit);
        self.garbage.drain(..take).collect()
    }

    /// [`take_garbage`](Self::take_garbage) for a listing: nothing if a write was applied
    /// since the last listing asked (writes go on, and take it along at no cost of their
    /// own), so only after a quiet spell.
    pub fn take_garbage_if_quiet(&mut self, limit: usize) -> Vec<String> {
        if std::mem::take(&mut self.busy) {
            return Vec::new();
        }
        self.take_garbage(limit)
    }

    /// Records taken to delete that were not deleted after all.
    pub fn put_back(&mut self, garbage: Vec<String>) {
        for name in garbage.into_iter().rev() {
            self.garbage.push_front(name);
        }
    }
}

/// Whether `op` claims its task for the writer's lease.
fn takes_claim(op: &TaskOp) -> bool {
    matches!(
        op.effect(),
        Effect::Put {
            holding: Holding::Writer,
            ..
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::etcd::layout::task_version;

    fn layout() -> Layout {
        Layout::new("L")
    }

    fn owner(value: &[u8]) -> Kv {
        Kv {
            key: b"L.owner/a".to_vec(),
            value: value.to_vec(),
            ..Kv::default()
        }
    }

    fn claim(key: &str) -> TaskOp {
        TaskOp::Claim {
            key: key.into(),
            version: task_version(3, Hold::Free),
            value: b"{}".to_vec(),
        }
    }

    fn complete(key: &str) -> TaskOp {
        TaskOp::Complete {
            key: key.into(),
            version: task_version(5, Hold::Record),
        }
    }

    fn release(key: &str) -> TaskOp {
        TaskOp::Release {
            key: key.into(),
            version: task_version(5, Hold::Record),
            value: b"{}".to_vec(),
        }
    }

    /// A book whose owners all know records, as of revision 7.
    fn knowing() -> RecordBook {
        let mut book = RecordBook::default();
        book.owners_seen(&[owner(&Owner::encode("n1"))], 7);
        book
    }

    /// `ops` planned with record names `ids` and applied at `revision`.
    fn apply(book: &mut RecordBook, ops: &[TaskOp], ids: (u64, u64), revision: i64) {
        let planned = book.plan(&layout(), 0xa, false, ops, ids);
        book.answered(&planned, ops, Outcome::Applied(revision));
    }

    /// Records are written only while every owner knows them; a bare owner (a replica
    /// from before records) turns them off until it is gone.
    #[test]
    fn claims_use_records_only_while_every_owner_knows_them() {
        let mut book = knowing();
        let planned = book.plan(&layout(), 0xa, false, &[claim("q/a")], (1, 2));
        assert_eq!(planned.claim, Some((layout().record(0xa, 1), 7)));
        book.owners_seen(&[owner(&Owner::encode("n1")), owner(b"n2")], 9);
        assert_eq!(
            book.plan(&layout(), 0xa, false, &[claim("q/a")], (1, 2))
                .claim,
            None
        );
        // A write with no claim carries no claim record.
        let mut book = knowing();
        assert_eq!(
            book.plan(&layout(), 0xa, false, &[complete("q/a")], (1, 2))
                .claim,
            None
        );
    }

    /// A claim record goes once each of its tasks was completed or released by a write
    /// seen applied; the release record goes with (after) the last claim record it
    /// answers, never before.
    #[test]
    fn records_go_once_their_tasks_are_done() {
        let mut book = knowing();
        let claims = [claim("q/a"), claim("q/b")];
        apply(&mut book, &claims, (1, 2), 10);
        let first = layout().record(0xa, 1);

        let done = [complete("q/a")];
        let planned = book.plan(&layout(), 0xa, false, &done, (3, 4));
        assert!(planned.garbage.is_empty());
        book.answered(&planned, &done, Outcome::Applied(11));
        assert!(book.take_garbage(10).is_empty());

        let let_go = [release("q/b")];
        apply(&mut book, &let_go, (5, 6), 12);
        assert_eq!(book.take_garbage(10), [first, layout().record(0xa, 6)]);
    }

    /// A release record waits for every claim record it answers.
    #[test]
    fn a_release_record_waits_for_the_claim_records_it_answers() {
        let mut book = knowing();
        let claims = [claim("q/a"), claim("q/b")];
        apply(&mut book, &claims, (1, 2), 10);
        let let_go = [release("q/a")];
        apply(&mut book, &let_go, (3, 4), 11);
        assert!(
            book.take_garbage(10).is_empty(),
            "q/b still holds its record"
        );
        let done = [complete("q/b")];
        apply(&mut book, &done, (5, 6), 12);
        assert_eq!(
            book.take_garbage(10),
            [layout().record(0xa, 1), layout().record(0xa, 4)]
        );
    }

    /// Garbage rides on the next write; a write not applied hands it back, in order.
    #[test]
    fn garbage_not_deleted_is_tried_again() {
        let mut book = knowing();
        book.listed(&HashSet::new(), 1, vec!["g1".into(), "g2".into()]);
        let ops = [claim("q/a")];
        let planned = book.plan(&layout(), 0xa, false, &ops, (1, 2));
        assert_eq!(planned.garbage, ["g1", "g2"]);
        book.answered(&planned, &ops, Outcome::NotApplied);
        assert_eq!(book.take_garbage(10), ["g1", "g2"]);
        assert!(!book.wrote(), "nothing was written");
    }

    /// A listing deletes garbage itself only when no write was applied since it last
    /// looked: while writes go on, they take it along.
    #[test]
    fn a_listing_deletes_garbage_only_after_a_quiet_spell() {
        let mut book = knowing();
        book.listed(&HashSet::new(), 1, vec!["g1".into()]);
        apply(&mut book, &[claim("q/a")], (1, 2), 10);
        // That write took g1 along.
        book.listed(&HashSet::new(), 1, vec!["g2".into()]);
        assert!(book.take_garbage_if_quiet(10).is_empty());
        assert_eq!(book.take_garbage_if_quiet(10), ["g2"]);
    }

    /// A record this process made that a later listing does not show went with its
    /// lease (or by hand): forgotten, and the release record that waited for it goes.
    #[test]
    fn a_record_gone_from_a_listing_is_forgotten() {
        let mut book = knowing();
        let claims = [claim("q/a"), claim("q/b")];
        apply(&mut book, &claims, (1, 2), 10);
        let let_go = [release("q/a")];
        apply(&mut book, &let_go, (3, 4), 11);
        // A listing before the record was made says nothing of it.
        book.listed(&HashSet::new(), 9, Vec::new());
        assert!(book.take_garbage(10).is_empty());
        book.listed(&HashSet::new(), 12, Vec::new());
        assert_eq!(
            book.take_garbage(10),
            [layout().record(0xa, 1), layout().record(0xa, 4)]
        );
        // Its task is not followed any more.
        let done = [complete("q/b")];
        apply(&mut book, &done, (5, 6), 13);
        assert!(book.take_garbage(10).is_empty());
    }
}
