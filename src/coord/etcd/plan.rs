//! Queue writes as one etcd transaction each, and their answers in the seam's words.
//!
//! A guarded write compares the leader's campaign key's `create_revision` with the revision
//! its win created it at (a key that went compares as 0), then, for each task, its
//! `mod_revision`, and its claim key only where the version cannot say more
//! ([`second_compared`]: held by a claim key, it still exists; a create, none exists;
//! without leadership, `write_own`: the claim key, or the claim record holding the task, is
//! this lease's). Claims go as one claim record while every lease's owner knows records (a
//! compare that no owner key moved since they were read), else as a claim key each; a
//! release of record-held tasks writes a release record. The failure branch reads every key
//! compared per task, so a rolled-back write is judged on what the compares saw: a failed
//! guard is `NotLeader`, otherwise the tasks whose compares failed are the `Conflict` (all
//! of them, if only the owners' or a record's compare failed).
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.
//!
//! Size: most of it is tests, one per way a write is built and judged (claim keys and
//! claim records, a lease's own writes, rollbacks, costs), each pinned to etcd's rules.

use std::collections::HashMap;

use crate::coord::etcd::client::{Compare, Kv, Op, Range, Txn, TxnResponse};
use crate::coord::etcd::layout::{read_version, task_version, Hold, Layout, Record};
use crate::coord::{
    Edit, Edited, Effect, Expected, FencingToken, Holding, TaskOp, WriteCost, WriteLimits, Written,
};

/// etcd's default `--max-txn-ops` (each of compare, success and failure may hold as many).
pub const MAX_TXN_OPS: usize = 128;
/// Under etcd's default `--max-request-bytes` (1.5 MiB), with room for what the estimate
/// of [`cost`] leaves out.
pub const MAX_TXN_BYTES: usize = 1024 * 1024;
/// What one compare or operation costs beyond its key and value (field tags, numbers).
const ENTRY_OVERHEAD: usize = 24;

pub const LIMITS: WriteLimits = WriteLimits {
    max_ops: MAX_TXN_OPS,
    max_bytes: MAX_TXN_BYTES,
};

/// The leadership a guarded write is conditioned on: the campaign key and its
/// `create_revision` as the win created it (which the token may be above).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guard {
    pub key: String,
    pub created: i64,
}

/// Who writes: the lease claims are attached to, and whether the write is a lease's own
/// (`write_own`: only tasks it holds may be released, completed or moved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Writer {
    pub lease: i64,
    pub own: bool,
}

/// Records a write adds beside its tasks' own operations (`layout.rs` says what they are).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Records {
    /// Claims go as one claim record of this name, attached to the writer's lease, written
    /// only while no lease's owner was created or written after the revision given (each
    /// was seen to know records then): `None` writes a claim key per task instead.
    pub claim: Option<(String, i64)>,
    /// The name of the release record, for a release of tasks a claim record holds.
    pub release: String,
    /// Records to delete: nothing they say matters any more.
    pub garbage: Vec<String>,
    /// For a lease's own write: the claim record each task it holds by one is held by, as
    /// far as this process knows (a task missing here is no task of its own to write).
    pub own: HashMap<String, String>,
}

/// Records deleted with one write, at most: what a write reserves for them.
pub const GARBAGE_PER_WRITE: usize = 4;

/// The transaction for `ops`.
pub fn write_txn(
    layout: &Layout,
    guard: Option<&Guard>,
    writer: Writer,
    ops: &[TaskOp],
    records: &Records,
) -> Txn {
    let mut txn = Txn::default();
    if let Some(guard) = guard {
        let key = guard.key.as_bytes().to_vec();
        txn.compare
            .push(Compare::Created(key.clone(), guard.created));
        txn.failure.push(Op::Get(Range::key(&key)));
    }
    let (mut claimed, mut released) = (Vec::new(), Vec::new());
    for op in ops {
        let key = op.key().as_bytes().to_vec();
        let claim = layout.claim(op.key()).into_bytes();
        let (requires, effect) = (op.requires(), op.effect());
        // A created key was never held: no claim may exist beside it.
        let (revision, hold) = match requires.task {
            Expected::Absent => (0, Hold::Free),
            _ => read_version(op.version()),
        };
        txn.compare.push(match requires.task {
            // Created at revision 0: the key does not exist.
            Expected::Absent => Compare::Created(key.clone(), 0),
            _ => Compare::Modified(key.clone(), revision),
        });
        // A lease's own write touches only its claims (so it creates nothing: a new key
        // has no claim): its claim key, or the claim record holding the task, is the
        // lease's, for every op but a claim and a put that leaves the claim as it is.
        // Records change only with a write of their tasks, which the task's own compare
        // sees, so a leader's write compares no record.
        let own_only = writer.own
            && !matches!(
                effect,
                Effect::Put {
                    holding: Holding::Writer | Holding::Unchanged,
                    ..
                }
            );
        let second = match (own_only, hold, records.own.get(op.key())) {
            (true, Hold::Record, Some(record)) => {
                Compare::Lease(record.as_bytes().to_vec(), writer.lease)
            }
            (true, ..) => Compare::Lease(claim.clone(), writer.lease),
            (false, Hold::Key, _) => Compare::Exists(claim.clone()),
            (false, ..) => Compare::Created(claim.clone(), 0),
        };
        txn.failure.push(Op::Get(Range::key(&key)));
        txn.failure.push(Op::Get(Range::key(second.key())));
        if second_compared(op, writer.own) {
            txn.compare.push(second);
        }
        let put = |key: &[u8], value: &[u8], lease: i64| Op::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
        };
        // The claim key goes with the task wherever one holds it.
        let unclaim = |txn: &mut Txn| {
            if hold == Hold::Key {
                txn.success.push(Op::Delete(claim.clone()));
            }
        };
        match effect {
            Effect::Put { value, holding } => {
                txn.success.push(put(&key, value, 0));
                match holding {
                    Holding::Writer if records.claim.is_some() => {
                        claimed.push(op.key().to_string());
                    }
                    Holding::Writer => txn.success.push(put(
                        &claim,
                        format!("{:x}", writer.lease).as_bytes(),
                        writer.lease,
                    )),
                    // A created key is held by nothing: nothing to give up.
                    Holding::Nobody => {
                        unclaim(&mut txn);
                        if hold == Hold::Record {
                            released.push(op.key().to_string());
                        }
                    }
                    Holding::Unchanged => {}
                }
            }
            Effect::Delete { record } => {
                txn.success.push(Op::Delete(key));
                unclaim(&mut txn);
                if let Some(record) = record {
                    txn.success
                        .push(put(record.key.as_bytes(), record.value, 0));
                }
            }
        }
    }
    if let (Some((name, owners_seen)), false) = (&records.claim, claimed.is_empty()) {
        // A lease opened since the owners were read may be a replica's that knows only
        // claim keys, which would take these tasks for orphans: then nothing is written.
        txn.compare.push(Compare::PrefixUnchangedSince(
            layout.owners().into_bytes(),
            *owners_seen,
        ));
        txn.compare
            .push(Compare::Created(name.as_bytes().to_vec(), 0));
        let record = Record {
            claimed,
            ..Record::default()
        };
        txn.success.push(Op::Put {
            key: name.as_bytes().to_vec(),
            value: record.encode(),
            lease: writer.lease,
        });
    }
    if !released.is_empty() {
        // Attached to no lease: it stays after the claim record it answers, which the
        // holder's lease ends with, until it is deleted as garbage.
        let name = records.release.as_bytes().to_vec();
        txn.compare.push(Compare::Created(name.clone(), 0));
        let record = Record {
            released,
            ..Record::default()
        };
        txn.success.push(Op::Put {
            key: name,
            value: record.encode(),
            lease: 0,
        });
    }
    for name in &records.garbage {
        txn.success.push(Op::Delete(name.as_bytes().to_vec()));
    }
    txn
}

/// The answer to [`write_txn`]'s transaction (`guarded`: it compared a guard first).
/// Committed: claimed, released and rewritten tasks have their new versions (held only
/// after a claim, by a record or by a key as the write made it) and the token is the
/// guard's. Rolled back: judged on the keys the failure branch read; the compares past the
/// tasks' (the owners, the records' names) are read by none, so a rollback they alone
/// explain is a conflict on every task.
pub fn written(
    txn: &Txn,
    response: &TxnResponse,
    ops: &[TaskOp],
    records: &Records,
    guarded: bool,
    token: FencingToken,
) -> Written {
    if response.succeeded {
        let revision = response.header.revision;
        let claimed = if records.claim.is_some() {
            Hold::Record
        } else {
            Hold::Key
        };
        let versions = ops
            .iter()
            .filter_map(|op| {
                // Every put to a task that existed: a rewrite's version too.
                let Effect::Put { holding, .. } = op.effect() else {
                    return None;
                };
                if op.requires().task == Expected::Absent {
                    return None;
                }
                let hold = if holding == Holding::Writer {
                    claimed
                } else {
                    Hold::Free
                };
                Some((op.key().to_string(), task_version(revision, hold)))
            })
            .collect();
        return Written::Done {
            versions,
            fencing_token: token,
        };
    }
    let seen = seen(txn, response);
    if guarded && !holds(&txn.compare[0], &seen) {
        return Written::NotLeader;
    }
    let task_compares = &txn.compare[usize::from(guarded)..];
    // A guarded write is the leader's; an unguarded one a lease's own (`write_own`).
    let own = !guarded;
    Written::Conflict(failed_keys(
        ops.iter()
            .map(|op| (op.key(), 1 + usize::from(second_compared(op, own)))),
        task_compares,
        &seen,
    ))
}

/// Whether a write compares `op`'s claim key (or the claim record holding it) beside its
/// `mod_revision`: where the version alone cannot say who holds the task. That is a
/// lease's own write (the holder must be the lease), a version held by a claim key (which
/// dies with its lease and leaves the task unwritten), and a create (a claim key left by a
/// task deleted by hand lives until its lease ends). A version read free or held by a
/// record needs no more: a claim key is only made by a write of its task, which moves the
/// task's `mod_revision`, and so is a record naming it.
pub fn second_compared(op: &TaskOp, own: bool) -> bool {
    own || op.requires().task == Expected::Absent || read_version(op.version()).1 == Hold::Key
}

/// The transaction for an operator's edit: create-only puts, and deletes and replaces at a
/// version, two compares each, and puts of whatever is there, with none.
pub fn edit_txn(layout: &Layout, ops: &[Edit]) -> Txn {
    let mut txn = Txn::default();
    for op in ops {
        let key = op.key().as_bytes().to_vec();
        let claim = layout.claim(op.key()).into_bytes();
        match op {
            Edit::Put { value, .. } => {
                txn.success.push(Op::Put {
                    key: key.clone(),
                    value: value.clone(),
                    lease: 0,
                });
                // Nothing to compare, so nothing to read back on failure.
                continue;
            }
            Edit::Create { value, .. } => {
                txn.compare.push(Compare::Created(key.clone(), 0));
                // Two compares per edit keep the judging uniform; a claim of a key that
                // does not exist is harmless, so this one checks the key again.
                txn.compare.push(Compare::Created(key.clone(), 0));
                txn.success.push(Op::Put {
                    key: key.clone(),
                    value: value.clone(),
                    lease: 0,
                });
            }
            Edit::Delete { version, .. } | Edit::Replace { version, .. } => {
                let (revision, hold) = read_version(*version);
                txn.compare.push(Compare::Modified(key.clone(), revision));
                txn.compare.push(if hold == Hold::Key {
                    Compare::Exists(claim.clone())
                } else {
                    Compare::Created(claim.clone(), 0)
                });
                match op {
                    Edit::Replace { value, .. } => txn.success.push(Op::Put {
                        key: key.clone(),
                        value: value.clone(),
                        lease: 0,
                    }),
                    _ => txn.success.push(Op::Delete(key.clone())),
                }
                // A claim key goes with the edit. A claim record that holds the task is
                // left: a replace is for a task no live lease holds (its holder settling
                // it after its lease ended), and a deleted task is past every record.
                if hold == Hold::Key {
                    txn.success.push(Op::Delete(claim.clone()));
                }
            }
        }
        txn.failure.push(Op::Get(Range::key(&key)));
        txn.failure.push(Op::Get(Range::key(&claim)));
    }
    txn
}

pub fn edited(txn: &Txn, response: &TxnResponse, ops: &[Edit]) -> Edited {
    if response.succeeded {
        return Edited::Done;
    }
    let seen = seen(txn, response);
    // Only creates, deletes and replaces have compares (two each); a put never fails.
    let compared = ops
        .iter()
        .filter(|op| !matches!(op, Edit::Put { .. }))
        .map(Edit::key);
    Edited::Conflict(failed_keys(
        compared.map(|key| (key, 2)),
        &txn.compare,
        &seen,
    ))
}

/// What the failure branch read, by key.
fn seen(txn: &Txn, response: &TxnResponse) -> HashMap<Vec<u8>, Kv> {
    let mut seen = HashMap::new();
    for (op, kvs) in txn.failure.iter().zip(response.ranges()) {
        if let (Op::Get(range), Some(kv)) = (op, kvs.into_iter().next()) {
            seen.insert(range.key.clone(), kv);
        }
    }
    seen
}

fn holds(compare: &Compare, seen: &HashMap<Vec<u8>, Kv>) -> bool {
    compare.holds(seen.get(compare.key()))
}

/// The keys (one per op, each with how many compares it made, in order) whose compares
/// fail, each once, in the ops' order; every key if none does (a rollback nothing
/// explains: all may have moved).
fn failed_keys<'a>(
    ops: impl Iterator<Item = (&'a str, usize)> + Clone,
    compares: &[Compare],
    seen: &HashMap<Vec<u8>, Kv>,
) -> Vec<String> {
    let mut failed: Vec<String> = Vec::new();
    let mut rest = compares;
    for (key, count) in ops.clone() {
        let (own, after) = rest.split_at(count.min(rest.len()));
        rest = after;
        if !own.iter().all(|c| holds(c, seen)) && !failed.iter().any(|k| k == key) {
            failed.push(key.to_string());
        }
    }
    if failed.is_empty() {
        for (key, _) in ops {
            if !failed.iter().any(|k| k == key) {
                failed.push(key.to_string());
            }
        }
    }
    failed
}

/// The bytes a transaction's keys and values take, plus a fixed overhead per entry: an
/// estimate of its protobuf size, which etcd's request limit applies to.
pub fn txn_bytes(txn: &Txn) -> usize {
    let compares: usize = txn
        .compare
        .iter()
        .map(|c| c.key().len() + ENTRY_OVERHEAD)
        .sum();
    let ops: usize = txn
        .success
        .iter()
        .chain(&txn.failure)
        .map(|op| {
            ENTRY_OVERHEAD
                + match op {
                    Op::Put { key, value, .. } => key.len() + value.len(),
                    Op::Delete(key) => key.len(),
                    Op::Get(range) => range.key.len(),
                }
        })
        .sum();
    compares + ops
}

/// What `op` costs: the entries it adds to the largest of its transaction's branches, and
/// its bytes. etcd bounds each branch (compare, success, failure) by `MAX_TXN_OPS` on its
/// own, so a write whose ops' costs sum within it has no branch over it: two compares and
/// two failure reads per op, and one to three success entries (a claim: the task and its
/// claim key; a move or finish also writes its record). Measured on the op without its
/// value, plus the value's length, so that costing a large task copies nothing big.
pub fn cost(layout: &Layout, op: &TaskOp) -> WriteCost {
    let (bare, value_len) = (op.bare(), op.value_len());
    // The longest lease id, so a cost does not depend on whose lease writes.
    let writer = Writer {
        lease: i64::MAX,
        own: false,
    };
    // Claim keys rather than a record: never fewer entries nor bytes for any one op.
    let txn = write_txn(
        layout,
        None,
        writer,
        std::slice::from_ref(&bare),
        &Records::default(),
    );
    let branches = [txn.compare.len(), txn.success.len(), txn.failure.len()];
    WriteCost {
        ops: branches.into_iter().max().unwrap_or_default(),
        bytes: txn_bytes(&txn) + value_len,
    }
}

/// What the guard costs, with what a write adds beside its tasks: one compare and one read
/// of the campaign key; the owners' compare, and a claim and a release record (a compare
/// and a put each; their lists of tasks cost less than the claim keys [`cost`] counts per
/// task); and up to [`GARBAGE_PER_WRITE`] deletes of records.
pub fn guard_cost(layout: &Layout) -> WriteCost {
    let key_len = layout.candidate(i64::MAX).len();
    let record_len = layout.record(i64::MAX, u64::MAX).len();
    let records = 2 * 2 * (record_len + ENTRY_OVERHEAD);
    let owners = layout.owners().len() * 2 + ENTRY_OVERHEAD;
    let garbage = GARBAGE_PER_WRITE * (record_len + ENTRY_OVERHEAD);
    WriteCost {
        ops: 2 + GARBAGE_PER_WRITE,
        bytes: 2 * (key_len + ENTRY_OVERHEAD) + records + owners + garbage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::etcd::client::{Header, RangeResponse, ResponseOp};
    use crate::coord::TaskVersion;

    fn layout() -> Layout {
        Layout::new("L")
    }

    fn kv(key: &str, create: i64, modified: i64, lease: i64) -> Kv {
        Kv {
            key: key.as_bytes().to_vec(),
            create_revision: create,
            mod_revision: modified,
            version: 1,
            value: Vec::new(),
            lease,
        }
    }

    /// A failure branch's answer: each read finds the key given, or nothing.
    fn failed(found: Vec<Option<Kv>>) -> TxnResponse {
        TxnResponse {
            header: Header { revision: 50 },
            succeeded: false,
            responses: found
                .into_iter()
                .map(|kv| ResponseOp {
                    response_range: Some(RangeResponse {
                        header: Header::default(),
                        kvs: kv.into_iter().collect(),
                        more: false,
                    }),
                })
                .collect(),
        }
    }

    fn guard() -> Guard {
        Guard {
            key: "L/a".into(),
            created: 10,
        }
    }

    const TOKEN: FencingToken = FencingToken(10);
    const WRITER: Writer = Writer {
        lease: 0xa,
        own: false,
    };

    fn claim(key: &str, version: TaskVersion) -> TaskOp {
        TaskOp::Claim {
            key: key.into(),
            version,
            value: b"v".to_vec(),
        }
    }

    /// A claim compares the guard and the task's revision (a claim key is only made with
    /// a write of its task, so a free version says no claim exists), then writes the task
    /// and a claim key under the writer's lease.
    #[test]
    fn a_claim_checks_leadership_and_revision() {
        let txn = write_txn(
            &layout(),
            Some(&guard()),
            WRITER,
            &[claim("q/a", task_version(7, Hold::Free))],
            &Records::default(),
        );
        assert_eq!(
            txn.compare,
            vec![
                Compare::Created(b"L/a".to_vec(), 10),
                Compare::Modified(b"q/a".to_vec(), 7),
            ]
        );
        assert_eq!(
            txn.success,
            vec![
                Op::Put {
                    key: b"q/a".to_vec(),
                    value: b"v".to_vec(),
                    lease: 0
                },
                Op::Put {
                    key: b"L.claims/q/a".to_vec(),
                    value: b"a".to_vec(),
                    lease: 0xa
                },
            ]
        );
        assert_eq!(txn.failure.len(), 3);
    }

    /// A lease's own write may release, complete or move only what its claim holds.
    #[test]
    fn own_writes_compare_the_claims_lease() {
        let own = Writer {
            lease: 0xa,
            own: true,
        };
        let ops = [TaskOp::Complete {
            key: "q/a".into(),
            version: task_version(7, Hold::Key),
        }];
        let txn = write_txn(&layout(), None, own, &ops, &Records::default());
        assert_eq!(
            txn.compare[1],
            Compare::Lease(b"L.claims/q/a".to_vec(), 0xa)
        );
        // Held by a claim record: that record is the lease's. Unknown to this process: no
        // task of its own (the claim key's lease, which no key has, fails the write).
        let ops = [TaskOp::Complete {
            key: "q/a".into(),
            version: task_version(7, Hold::Record),
        }];
        let records = Records {
            own: [("q/a".to_string(), "L.held/a/01".to_string())].into(),
            ..Records::default()
        };
        let txn = write_txn(&layout(), None, own, &ops, &records);
        assert_eq!(txn.compare[1], Compare::Lease(b"L.held/a/01".to_vec(), 0xa));
        assert_eq!(txn.failure[1], Op::Get(Range::key(b"L.held/a/01")));
        assert_eq!(txn.success, [Op::Delete(b"q/a".to_vec())]);
        let txn = write_txn(&layout(), None, own, &ops, &Records::default());
        assert_eq!(
            txn.compare[1],
            Compare::Lease(b"L.claims/q/a".to_vec(), 0xa)
        );
    }

    /// A committed claim answers the held version at the commit's revision.
    #[test]
    fn a_commit_answers_new_versions_and_the_token() {
        let ops = [
            claim("q/a", TaskVersion(14)),
            TaskOp::Complete {
                key: "q/b".into(),
                version: TaskVersion(9),
            },
        ];
        let txn = write_txn(&layout(), Some(&guard()), WRITER, &ops, &Records::default());
        let response = TxnResponse {
            header: Header { revision: 20 },
            succeeded: true,
            responses: Vec::new(),
        };
        assert_eq!(
            written(&txn, &response, &ops, &Records::default(), true, TOKEN),
            Written::Done {
                versions: vec![("q/a".into(), task_version(20, Hold::Key))],
                fencing_token: TOKEN
            }
        );
    }

    /// A rollback with the campaign key gone (or re-created) is NotLeader, whatever else
    /// failed; with it in place, the tasks whose compares fail are the conflict.
    #[test]
    fn a_rollback_tells_lost_leadership_from_moved_tasks() {
        let ops = [
            claim("q/a", task_version(7, Hold::Free)),
            claim("q/b", task_version(8, Hold::Free)),
        ];
        let txn = write_txn(&layout(), Some(&guard()), WRITER, &ops, &Records::default());
        let leader = Some(kv("L/a", 10, 10, 0xa));
        let a = Some(kv("q/a", 3, 7, 0));
        let b_moved = Some(kv("q/b", 3, 9, 0));
        let response = failed(vec![leader.clone(), a.clone(), None, b_moved.clone(), None]);
        assert_eq!(
            written(&txn, &response, &ops, &Records::default(), true, TOKEN),
            Written::Conflict(vec!["q/b".into()])
        );
        let response = failed(vec![None, a.clone(), None, b_moved.clone(), None]);
        assert_eq!(
            written(&txn, &response, &ops, &Records::default(), true, TOKEN),
            Written::NotLeader
        );
        let again = Some(kv("L/a", 12, 12, 0xa));
        let response = failed(vec![again, a.clone(), None, b_moved, None]);
        assert_eq!(
            written(&txn, &response, &ops, &Records::default(), true, TOKEN),
            Written::NotLeader
        );
        // A claim taken meanwhile by another lease wrote the task: a conflict too.
        let claimed = Some(kv("L.claims/q/a", 8, 8, 0xb));
        let a_claimed = Some(kv("q/a", 3, 8, 0));
        let b = Some(kv("q/b", 3, 8, 0));
        let response = failed(vec![leader, a_claimed, claimed, b, None]);
        assert_eq!(
            written(&txn, &response, &ops, &Records::default(), true, TOKEN),
            Written::Conflict(vec!["q/a".into()])
        );
    }

    /// A version held by a claim key still compares that key, which may die with its lease
    /// while the task stays unwritten; ops of one and two compares are judged side by side.
    #[test]
    fn a_claim_key_version_still_compares_its_claim_key() {
        let ops = [
            TaskOp::Complete {
                key: "q/a".into(),
                version: task_version(7, Hold::Key),
            },
            TaskOp::Complete {
                key: "q/b".into(),
                version: task_version(8, Hold::Free),
            },
        ];
        let txn = write_txn(&layout(), Some(&guard()), WRITER, &ops, &Records::default());
        assert_eq!(
            txn.compare,
            vec![
                Compare::Created(b"L/a".to_vec(), 10),
                Compare::Modified(b"q/a".to_vec(), 7),
                Compare::Exists(b"L.claims/q/a".to_vec()),
                Compare::Modified(b"q/b".to_vec(), 8),
            ]
        );
        let leader = Some(kv("L/a", 10, 10, 0xa));
        let (a, b) = (Some(kv("q/a", 3, 7, 0)), Some(kv("q/b", 3, 8, 0)));
        let claim = Some(kv("L.claims/q/a", 7, 7, 0xa));
        let judge = |seen| written(&txn, &failed(seen), &ops, &Records::default(), true, TOKEN);
        // The claim key died with its lease.
        assert_eq!(
            judge(vec![leader.clone(), a.clone(), None, b.clone(), None]),
            Written::Conflict(vec!["q/a".into()])
        );
        // The other task moved.
        let b_moved = Some(kv("q/b", 3, 9, 0));
        assert_eq!(
            judge(vec![leader, a, claim, b_moved, None]),
            Written::Conflict(vec!["q/b".into()])
        );
    }

    /// An edit names the keys that exist (to create) or moved (to delete).
    #[test]
    fn an_edit_rollback_names_its_keys() {
        let ops = [
            Edit::Delete {
                key: "d/a".into(),
                version: task_version(5, Hold::Free),
            },
            Edit::Create {
                key: "q/a".into(),
                value: b"{}".to_vec(),
            },
        ];
        let txn = edit_txn(&layout(), &ops);
        let response = failed(vec![
            Some(kv("d/a", 5, 5, 0)),
            None,
            Some(kv("q/a", 6, 6, 0)),
            None,
        ]);
        assert_eq!(
            edited(&txn, &response, &ops),
            Edited::Conflict(vec!["q/a".into()])
        );
    }

    /// A batch's cost bounds its transaction, with claim keys or with records: no branch
    /// has more entries, and the bytes estimate is at least the transaction's.
    #[test]
    fn costs_bound_the_transaction_sent() {
        let layout = layout();
        let ops = vec![
            claim("q/a", task_version(3, Hold::Free)),
            TaskOp::Move {
                key: "q/b".into(),
                version: TaskVersion(9),
                to: "dead/b".into(),
                value: vec![b'x'; 100],
            },
            TaskOp::Complete {
                key: "q/c".into(),
                version: task_version(2, Hold::Key),
            },
            TaskOp::Release {
                key: "q/d".into(),
                version: task_version(2, Hold::Record),
                value: b"{}".to_vec(),
            },
        ];
        let writer = Writer {
            lease: i64::MAX,
            own: false,
        };
        let guard = Guard {
            key: layout.candidate(i64::MAX),
            created: 1,
        };
        let records = Records {
            claim: Some((layout.record(i64::MAX, u64::MAX), 10)),
            release: layout.record(i64::MAX, u64::MAX - 1),
            garbage: (0..GARBAGE_PER_WRITE as u64)
                .map(|n| layout.record(i64::MAX, n))
                .collect(),
            own: HashMap::new(),
        };
        let cost: WriteCost =
            guard_cost(&layout) + ops.iter().map(|op| cost(&layout, op)).sum::<WriteCost>();
        for records in [Records::default(), records] {
            let txn = write_txn(&layout, Some(&guard), writer, &ops, &records);
            for branch in [txn.compare.len(), txn.success.len(), txn.failure.len()] {
                assert!(
                    branch <= cost.ops,
                    "{branch} entries over {cost:?}: {records:?}"
                );
            }
            assert!(txn_bytes(&txn) <= cost.bytes, "{records:?}");
        }
    }

    /// A branch holds at most `MAX_TXN_OPS` entries, each on its own: a write of a full
    /// batch of claims with a batch of completions riding along fits one transaction,
    /// beside its records.
    #[test]
    fn a_full_batch_of_claims_with_its_completions_fits_one_transaction() {
        let layout = layout();
        let mut ops: Vec<TaskOp> = (0..32)
            .map(|n| claim(&format!("q/c{n:02}"), task_version(3, Hold::Free)))
            .collect();
        ops.extend((0..29).map(|n| TaskOp::Complete {
            key: format!("q/d{n:02}"),
            version: task_version(2, Hold::Record),
        }));
        let cost: WriteCost =
            guard_cost(&layout) + ops.iter().map(|op| cost(&layout, op)).sum::<WriteCost>();
        assert!(cost.ops <= MAX_TXN_OPS, "{} entries", cost.ops);
    }

    /// Claims under records: one claim record attached to the writer's lease, naming them,
    /// and written only while no owner key moved past the revision they were read at; no
    /// claim key. Completing a record-held task deletes the task alone; releasing one
    /// writes a release record attached to no lease.
    #[test]
    fn records_replace_claim_keys() {
        let records = Records {
            claim: Some(("L.held/a/01".into(), 40)),
            release: "L.held/a/02".into(),
            garbage: vec!["L.held/a/00".into()],
            own: HashMap::new(),
        };
        let ops = [
            claim("q/a", task_version(7, Hold::Free)),
            claim("q/b", task_version(8, Hold::Free)),
            TaskOp::Complete {
                key: "q/c".into(),
                version: task_version(6, Hold::Record),
            },
            TaskOp::Release {
                key: "q/d".into(),
                version: task_version(6, Hold::Record),
                value: b"{}".to_vec(),
            },
        ];
        let txn = write_txn(&layout(), Some(&guard()), WRITER, &ops, &records);
        // One compare a task: neither a free version nor a record-held one needs its
        // claim key compared.
        assert_eq!(
            txn.compare[1..5],
            [
                Compare::Modified(b"q/a".to_vec(), 7),
                Compare::Modified(b"q/b".to_vec(), 8),
                Compare::Modified(b"q/c".to_vec(), 6),
                Compare::Modified(b"q/d".to_vec(), 6),
            ]
        );
        assert_eq!(
            txn.compare[5..],
            [
                Compare::PrefixUnchangedSince(b"L.owner/".to_vec(), 40),
                Compare::Created(b"L.held/a/01".to_vec(), 0),
                Compare::Created(b"L.held/a/02".to_vec(), 0),
            ]
        );
        let put = |key: &str, value: &[u8], lease| Op::Put {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
            lease,
        };
        assert_eq!(
            txn.success,
            vec![
                put("q/a", b"v", 0),
                put("q/b", b"v", 0),
                Op::Delete(b"q/c".to_vec()),
                put("q/d", b"{}", 0),
                put("L.held/a/01", br#"{"claimed":["q/a","q/b"]}"#, 0xa),
                put("L.held/a/02", br#"{"released":["q/d"]}"#, 0),
                Op::Delete(b"L.held/a/00".to_vec()),
            ]
        );
        let response = TxnResponse {
            header: Header { revision: 50 },
            succeeded: true,
            responses: Vec::new(),
        };
        assert_eq!(
            written(&txn, &response, &ops, &records, true, TOKEN),
            Written::Done {
                versions: vec![
                    ("q/a".into(), task_version(50, Hold::Record)),
                    ("q/b".into(), task_version(50, Hold::Record)),
                    ("q/d".into(), task_version(50, Hold::Free)),
                ],
                fencing_token: TOKEN
            }
        );
        // A rollback no task's compare explains (a new owner, a record's name taken) is
        // a conflict on every task, never a lost leadership.
        let leader = Some(kv("L/a", 10, 10, 0xa));
        let read = |key: &str, modified| Some(kv(key, 1, modified, 0));
        let response = failed(vec![
            leader,
            read("q/a", 7),
            None,
            read("q/b", 8),
            None,
            read("q/c", 6),
            None,
            read("q/d", 6),
            None,
        ]);
        assert_eq!(
            written(&txn, &response, &ops, &records, true, TOKEN),
            Written::Conflict(vec!["q/a".into(), "q/b".into(), "q/c".into(), "q/d".into()])
        );
    }
}
