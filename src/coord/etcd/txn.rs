//! Queue writes as one etcd transaction each, and their answers in the seam's words.
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`. A guarded write compares the leader's campaign key's `create_revision` with the fencing
//! token (a key that went compares as 0), then, for each task, its `mod_revision` and its
//! claim as the version says (held: the claim key exists; not held: it does not; without
//! leadership, `write_own`: the claim is this lease's). The failure branch reads every key
//! compared, so a rolled-back write is judged on what the compares saw: a failed guard is
//! `NotLeader`, otherwise the tasks whose compares failed are the `Conflict`.

use std::collections::HashMap;

use crate::coord::etcd::client::{Compare, Kv, Op, Range, Txn, TxnResponse};
use crate::coord::etcd::layout::{read_version, task_version, Layout};
use crate::coord::{Edit, Edited, FencingToken, TaskOp, WriteCost, WriteLimits, Written};

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

/// The leadership a guarded write is conditioned on: the campaign key and its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guard {
    pub key: String,
    pub token: i64,
}

/// Who writes: the lease claims are attached to, and whether the write is a lease's own
/// (`write_own`: only tasks it holds may be released, completed or moved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Writer {
    pub lease: i64,
    pub own: bool,
}

/// The transaction for `ops`.
pub fn write_txn(layout: &Layout, guard: Option<&Guard>, writer: Writer, ops: &[TaskOp]) -> Txn {
    let mut txn = Txn::default();
    if let Some(guard) = guard {
        let key = guard.key.as_bytes().to_vec();
        txn.compare.push(Compare::Created(key.clone(), guard.token));
        txn.failure.push(Op::Get(Range::key(&key)));
    }
    for op in ops {
        let key = op.key().as_bytes().to_vec();
        let claim = layout.claim(op.key()).into_bytes();
        // A created key was never held: no claim may exist beside it.
        let (revision, held) = match op {
            TaskOp::Create { .. } => (0, false),
            _ => read_version(op.version()),
        };
        txn.compare.push(match op {
            // Created at revision 0: the key does not exist.
            TaskOp::Create { .. } => Compare::Created(key.clone(), 0),
            _ => Compare::Modified(key.clone(), revision),
        });
        // A lease's own write touches only its claims (so it creates nothing: a new key
        // has no claim).
        let own_only = writer.own
            && matches!(
                op,
                TaskOp::Release { .. }
                    | TaskOp::Complete { .. }
                    | TaskOp::Move { .. }
                    | TaskOp::Finish { .. }
                    | TaskOp::Create { .. }
            );
        txn.compare.push(if own_only {
            Compare::Lease(claim.clone(), writer.lease)
        } else if held {
            Compare::Exists(claim.clone())
        } else {
            Compare::Created(claim.clone(), 0)
        });
        txn.failure.push(Op::Get(Range::key(&key)));
        txn.failure.push(Op::Get(Range::key(&claim)));
        let put = |key: &[u8], value: &[u8], lease: i64| Op::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
        };
        match op {
            TaskOp::Claim { value, .. } => {
                txn.success.push(put(&key, value, 0));
                txn.success.push(put(
                    &claim,
                    format!("{:x}", writer.lease).as_bytes(),
                    writer.lease,
                ));
            }
            TaskOp::Complete { .. } => {
                txn.success.push(Op::Delete(key));
                txn.success.push(Op::Delete(claim));
            }
            TaskOp::Release { value, .. } => {
                txn.success.push(put(&key, value, 0));
                txn.success.push(Op::Delete(claim));
            }
            TaskOp::Rewrite { value, .. } | TaskOp::Create { value, .. } => {
                txn.success.push(put(&key, value, 0))
            }
            TaskOp::Move { to, value, .. } | TaskOp::Finish { to, value, .. } => {
                txn.success.push(Op::Delete(key));
                txn.success.push(Op::Delete(claim));
                txn.success.push(put(to.as_bytes(), value, 0));
            }
        }
    }
    txn
}

/// The answer to [`write_txn`]'s transaction. Committed: claimed, released and rewritten
/// tasks have their new versions (held only after a claim) and the token is the guard's.
/// Rolled back: judged on the keys the failure branch read.
pub fn written(txn: &Txn, response: &TxnResponse, ops: &[TaskOp], token: FencingToken) -> Written {
    if response.succeeded {
        let revision = response.header.revision;
        let versions = ops
            .iter()
            .filter_map(|op| match op {
                TaskOp::Claim { key, .. } => Some((key.clone(), task_version(revision, true))),
                TaskOp::Release { key, .. } | TaskOp::Rewrite { key, .. } => {
                    Some((key.clone(), task_version(revision, false)))
                }
                _ => None,
            })
            .collect();
        return Written::Done {
            versions,
            fencing_token: token,
        };
    }
    let seen = seen(txn, response);
    let guarded = txn.compare.len() == 1 + 2 * ops.len();
    if guarded && !holds(&txn.compare[0], &seen) {
        return Written::NotLeader;
    }
    let task_compares = &txn.compare[usize::from(guarded)..];
    Written::Conflict(failed_keys(
        ops.iter().map(TaskOp::key),
        task_compares,
        2,
        &seen,
    ))
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
                let (revision, held) = read_version(*version);
                txn.compare.push(Compare::Modified(key.clone(), revision));
                txn.compare.push(if held {
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
                txn.success.push(Op::Delete(claim.clone()));
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
    Edited::Conflict(failed_keys(compared, &txn.compare, 2, &seen))
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

/// The keys (one per op, `per_op` compares each) whose compares fail, each once, in the
/// ops' order; every key if none does (a rollback nothing explains: all may have moved).
fn failed_keys<'a>(
    keys: impl Iterator<Item = &'a str> + Clone,
    compares: &[Compare],
    per_op: usize,
    seen: &HashMap<Vec<u8>, Kv>,
) -> Vec<String> {
    let mut failed: Vec<String> = Vec::new();
    for (key, compares) in keys.clone().zip(compares.chunks(per_op)) {
        if !compares.iter().all(|c| holds(c, seen)) && !failed.iter().any(|k| k == key) {
            failed.push(key.to_string());
        }
    }
    if failed.is_empty() {
        for key in keys {
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
    let txn = write_txn(layout, None, writer, std::slice::from_ref(&bare));
    let branches = [txn.compare.len(), txn.success.len(), txn.failure.len()];
    WriteCost {
        ops: branches.into_iter().max().unwrap_or_default(),
        bytes: txn_bytes(&txn) + value_len,
    }
}

/// What the guard costs: one compare and one read of the campaign key.
pub fn guard_cost(layout: &Layout) -> WriteCost {
    let key_len = layout.candidate(i64::MAX).len();
    WriteCost {
        ops: 1,
        bytes: 2 * (key_len + ENTRY_OVERHEAD),
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
            token: 10,
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

    /// A claim compares the guard, the task's revision and that no claim exists, then
    /// writes the task and a claim key under the writer's lease.
    #[test]
    fn a_claim_checks_leadership_revision_and_no_claim() {
        let txn = write_txn(
            &layout(),
            Some(&guard()),
            WRITER,
            &[claim("q/a", task_version(7, false))],
        );
        assert_eq!(
            txn.compare,
            vec![
                Compare::Created(b"L/a".to_vec(), 10),
                Compare::Modified(b"q/a".to_vec(), 7),
                Compare::Created(b"L.claims/q/a".to_vec(), 0),
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
            version: task_version(7, true),
        }];
        let txn = write_txn(&layout(), None, own, &ops);
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
        let txn = write_txn(&layout(), Some(&guard()), WRITER, &ops);
        let response = TxnResponse {
            header: Header { revision: 20 },
            succeeded: true,
            responses: Vec::new(),
        };
        assert_eq!(
            written(&txn, &response, &ops, TOKEN),
            Written::Done {
                versions: vec![("q/a".into(), task_version(20, true))],
                fencing_token: TOKEN
            }
        );
    }

    /// A rollback with the campaign key gone (or re-created) is NotLeader, whatever else
    /// failed; with it in place, the tasks whose compares fail are the conflict.
    #[test]
    fn a_rollback_tells_lost_leadership_from_moved_tasks() {
        let ops = [
            claim("q/a", task_version(7, false)),
            claim("q/b", task_version(8, false)),
        ];
        let txn = write_txn(&layout(), Some(&guard()), WRITER, &ops);
        let leader = Some(kv("L/a", 10, 10, 0xa));
        let a = Some(kv("q/a", 3, 7, 0));
        let b_moved = Some(kv("q/b", 3, 9, 0));
        let response = failed(vec![leader.clone(), a.clone(), None, b_moved.clone(), None]);
        assert_eq!(
            written(&txn, &response, &ops, TOKEN),
            Written::Conflict(vec!["q/b".into()])
        );
        let response = failed(vec![None, a.clone(), None, b_moved.clone(), None]);
        assert_eq!(written(&txn, &response, &ops, TOKEN), Written::NotLeader);
        let again = Some(kv("L/a", 12, 12, 0xa));
        let response = failed(vec![again, a.clone(), None, b_moved, None]);
        assert_eq!(written(&txn, &response, &ops, TOKEN), Written::NotLeader);
        // A claim taken meanwhile by another lease conflicts too.
        let claimed = Some(kv("L.claims/q/a", 8, 8, 0xb));
        let b = Some(kv("q/b", 3, 8, 0));
        let response = failed(vec![leader, a, claimed, b, None]);
        assert_eq!(
            written(&txn, &response, &ops, TOKEN),
            Written::Conflict(vec!["q/a".into()])
        );
    }

    /// An edit names the keys that exist (to create) or moved (to delete).
    #[test]
    fn an_edit_rollback_names_its_keys() {
        let ops = [
            Edit::Delete {
                key: "d/a".into(),
                version: task_version(5, false),
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

    /// A batch's cost bounds its transaction: no branch has more entries, and the bytes
    /// estimate is the sum of the ops' and the guard's.
    #[test]
    fn costs_bound_the_transaction_sent() {
        let layout = layout();
        let ops = vec![
            claim("q/a", TaskVersion(14)),
            TaskOp::Move {
                key: "q/b".into(),
                version: TaskVersion(9),
                to: "dead/b".into(),
                value: vec![b'x'; 100],
            },
            TaskOp::Complete {
                key: "q/c".into(),
                version: TaskVersion(8),
            },
        ];
        let writer = Writer {
            lease: i64::MAX,
            own: false,
        };
        let guard = Guard {
            key: layout.candidate(i64::MAX),
            token: 1,
        };
        let txn = write_txn(&layout, Some(&guard), writer, &ops);
        let cost: WriteCost =
            guard_cost(&layout) + ops.iter().map(|op| cost(&layout, op)).sum::<WriteCost>();
        for branch in [txn.compare.len(), txn.success.len(), txn.failure.len()] {
            assert!(branch <= cost.ops);
        }
        assert_eq!(cost.bytes, txn_bytes(&txn));
    }

    /// A branch holds at most `MAX_TXN_OPS` entries, each on its own: a write of a full
    /// batch of claims with a batch of completions riding along fits one transaction.
    #[test]
    fn a_full_batch_of_claims_with_its_completions_fits_one_transaction() {
        let layout = layout();
        let mut ops: Vec<TaskOp> = (0..32)
            .map(|n| claim(&format!("q/c{n:02}"), TaskVersion(14)))
            .collect();
        ops.extend((0..31).map(|n| TaskOp::Complete {
            key: format!("q/d{n:02}"),
            version: TaskVersion(8),
        }));
        let cost: WriteCost =
            guard_cost(&layout) + ops.iter().map(|op| cost(&layout, op)).sum::<WriteCost>();
        assert!(cost.ops <= MAX_TXN_OPS, "{} entries", cost.ops);
    }
}
