//! A write to the queue as one Consul transaction, and its answer in the seam's words:
//! each [`TaskOp`] becomes Consul verbs (`txn_ops`) from what it requires and does
//! ([`TaskOp::requires`], [`TaskOp::effect`]), after the guard (`check-session` and
//! `check-index` on the leader key) when there is one, and the transaction's outcome
//! becomes a [`Written`] (`written`). Pure: nobody outside this file reads an op index.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use super::layout::token_of;
use crate::coord::consul::client::{TxnOp, TxnOutcome};
use crate::coord::{
    Effect, Expected, FencingToken, Holding, LeaseId, TaskOp, TaskVersion, WriteCost, Written,
};

/// What a guarded transaction checks first: the leader key is still locked by the
/// leadership's session, and still at the ModifyIndex its win wrote (`index`: what the
/// win's transaction answered, which the token may be above, `election.rs`).
#[derive(Clone, Copy, Debug)]
pub struct Guard<'a> {
    pub leader_key: &'a str,
    pub lease: &'a LeaseId,
    pub index: u64,
}

/// The leadership guard, the first ops of every guarded transaction. The session alone
/// would not do: an operator's PUT over the key keeps the lock's session, yet the key no
/// longer says who leads under which token, and a key deleted and acquired again by the
/// same session would pass with an old token.
pub fn guard(guard: Guard) -> [TxnOp; 2] {
    [
        TxnOp::CheckSession {
            key: guard.leader_key.to_string(),
            session: guard.lease.0.clone(),
        },
        TxnOp::CheckIndex {
            key: guard.leader_key.to_string(),
            index: guard.index,
        },
    ]
}

/// The transaction for `ops`, written by `lease`: first the [`guard`] if any, then each
/// op's verbs. Also returns, for each transaction op, the index in `ops` it came from
/// (`None` for the guard).
pub fn txn_ops(
    guard: Option<Guard>,
    lease: &LeaseId,
    ops: &[TaskOp],
) -> (Vec<TxnOp>, Vec<Option<usize>>) {
    let mut txn = Vec::with_capacity(2 + 2 * ops.len());
    let mut owners = Vec::with_capacity(txn.capacity());
    if let Some(checked) = guard {
        for op in self::guard(checked) {
            txn.push(op);
            owners.push(None);
        }
    }
    for (i, op) in ops.iter().enumerate() {
        let before = txn.len();
        let key = op.key().to_string();
        let requires = op.requires();
        match (requires.task, op.effect()) {
            // A cas at index 0 writes only a key that does not exist. Without the guard
            // nothing may be created: the check of a lock on a key that does not exist
            // fails the transaction.
            (Expected::Absent, Effect::Put { value, .. }) => {
                if guard.is_none() {
                    txn.push(own_check(&key, lease));
                }
                txn.push(TxnOp::Cas {
                    key,
                    value: value.to_vec(),
                    index: 0,
                });
            }
            // A put to a task at its version: `lock` takes it for the writer's session and
            // `unlock` gives it up, each after a `check-index` (neither takes an index); a
            // `cas` leaves its lock as it is.
            (_, Effect::Put { value, holding }) => {
                let index = op.version().0;
                let value = value.to_vec();
                let session = lease.0.clone();
                match holding {
                    Holding::Writer | Holding::Nobody => {
                        txn.push(TxnOp::CheckIndex {
                            key: key.clone(),
                            index,
                        });
                        txn.push(if holding == Holding::Writer {
                            TxnOp::Lock {
                                key,
                                value,
                                session,
                            }
                        } else {
                            TxnOp::Unlock {
                                key,
                                value,
                                session,
                            }
                        });
                    }
                    Holding::Unchanged => txn.push(TxnOp::Cas { key, value, index }),
                }
            }
            // A delete-cas of a key that is gone succeeds: right for a completion (it is
            // done already: one op, so batches stay large) and for a finish under the guard
            // (a claimed task can only have gone by an operator's hand, and its run did
            // finish, so its record is true all the same). A move's record is written only
            // for a task still there, so it checks first. Without the guard, the lock check
            // fails on a missing key, and a lease deletes only what it holds.
            (_, Effect::Delete { record }) => {
                let index = op.version().0;
                if record.is_some() && matches!(requires.task, Expected::Version(_)) {
                    txn.push(TxnOp::CheckIndex {
                        key: key.clone(),
                        index,
                    });
                }
                if guard.is_none() {
                    txn.push(own_check(&key, lease));
                }
                txn.push(TxnOp::DeleteCas { key, index });
                if let Some(record) = record {
                    txn.push(TxnOp::Set {
                        key: record.key.to_string(),
                        value: record.value.to_vec(),
                    });
                }
            }
        }
        owners.extend(std::iter::repeat_n(Some(i), txn.len() - before));
    }
    (txn, owners)
}

/// Without the leadership guard, a lease may delete only what it holds itself.
fn own_check(key: &str, lease: &LeaseId) -> TxnOp {
    TxnOp::CheckSession {
        key: key.to_string(),
        session: lease.0.clone(),
    }
}

/// What `op` costs in a guarded transaction: its Consul operations and their encoded
/// bytes, each followed by a comma or the closing bracket. Measured on the op with its
/// value left out, plus the value's base64 length: a cost is asked for every candidate
/// of every claim, and copying values of tens of KB to measure them would dominate.
pub fn cost(lease: &LeaseId, op: &TaskOp) -> WriteCost {
    let (bare, value_len) = (op.bare(), op.value_len());
    let guard = Guard {
        leader_key: "",
        lease,
        index: 0,
    };
    let (txn, owners) = txn_ops(Some(guard), lease, std::slice::from_ref(&bare));
    let verbs = &txn[owners.iter().take_while(|owner| owner.is_none()).count()..];
    WriteCost {
        ops: verbs.len(),
        bytes: verbs
            .iter()
            .map(|verb| verb.encoded_len() + 1)
            .sum::<usize>()
            + value_len.div_ceil(3) * 4,
    }
}

/// The shape of every Consul session id (a UUID): what a cost is counted with.
pub const SESSION_SHAPE: &str = "00000000-0000-0000-0000-000000000000";

/// What the guard on `leader_key` costs: two operations (check-session, check-index),
/// counted with a session id's shape and the longest token (20 digits), so the cost never
/// falls short of the guard that is sent.
pub fn guard_cost_on(leader_key: &str) -> WriteCost {
    let session = LeaseId(SESSION_SHAPE.into());
    let widest = Guard {
        leader_key,
        lease: &session,
        index: u64::MAX,
    };
    guard(widest)
        .iter()
        .map(|op| WriteCost {
            ops: 1,
            bytes: op.encoded_len() + 1,
        })
        .sum()
}

/// One transaction's body budget (see `consul::txn`), less the array's brackets.
pub const MAX_BYTES: usize = crate::coord::consul::client::TXN_MAX_BODY - 2;
// Every Consul version accepts a body under 512 KiB.
const _: () = assert!(MAX_BYTES < 512 * 1024);

/// The answer to a transaction built by [`txn_ops`] for `ops`. Committed: each claimed,
/// released or rewritten task's version is the ModifyIndex of the last result for its key
/// (a check-index result, which comes first, carries the old one), and the fencing token
/// the one the guard's result stands for ([`token_of`] the leader key as the commit saw
/// it), never below `fallback_token` (the leadership's: a server that answers a check
/// without the value shows the index alone). Rolled back: a failed guard op is `NotLeader`,
/// whatever else failed; otherwise the failed ops' keys.
pub fn written(
    outcome: TxnOutcome,
    ops: &[TaskOp],
    owners: &[Option<usize>],
    leader_key: &str,
    fallback_token: FencingToken,
) -> Written {
    match outcome {
        TxnOutcome::Committed(entries) => {
            let fencing_token = entries
                .first()
                .filter(|entry| owners.first() == Some(&None) && entry.key == leader_key)
                .map_or(fallback_token, |entry| token_of(entry).max(fallback_token));
            let versions = ops
                .iter()
                // Every put to a task that existed: a rewrite's version too.
                .filter(|op| {
                    matches!(op.effect(), Effect::Put { .. })
                        && op.requires().task != Expected::Absent
                })
                .map(|op| {
                    let version = entries
                        .iter()
                        .rev()
                        .find(|entry| entry.key == op.key())
                        .map_or(TaskVersion(0), |entry| TaskVersion(entry.modify_index));
                    (op.key().to_string(), version)
                })
                .collect();
            Written::Done {
                versions,
                fencing_token,
            }
        }
        TxnOutcome::RolledBack(errors) => {
            let failed: Vec<Option<usize>> = errors
                .iter()
                .map(|error| owners.get(error.op_index).copied().flatten())
                .collect();
            if errors
                .iter()
                .zip(&failed)
                .any(|(error, owner)| owner.is_none() && error.op_index < owners.len())
            {
                return Written::NotLeader;
            }
            // Consul checks lock-delay before it applies anything, and answers every op
            // under it: the only errors, when no version moved.
            let delayed = !errors.is_empty()
                && errors
                    .iter()
                    .all(|error| error.what.contains(LOCK_DELAY_ERROR));
            let mut indexes: Vec<usize> = failed.into_iter().flatten().collect();
            if indexes.is_empty() {
                // Rolled back without saying which op failed: every task may have moved.
                indexes = (0..ops.len()).collect();
            }
            indexes.sort_unstable();
            indexes.dedup();
            let mut keys: Vec<String> = Vec::with_capacity(indexes.len());
            for key in indexes.into_iter().map(|i| ops[i].key()) {
                if !keys.iter().any(|k| k == key) {
                    keys.push(key.to_string());
                }
            }
            if delayed {
                Written::Deferred(keys)
            } else {
                Written::Conflict(keys)
            }
        }
    }
}

/// What Consul's transaction says of a `lock` refused under lock-delay (txn_endpoint.go
/// `preCheck`: `failed to lock key "k" due to lock delay`).
const LOCK_DELAY_ERROR: &str = "due to lock delay";

#[cfg(test)]
mod tests {
    use crate::coord::consul::client::{KvPair, TxnError};

    use super::*;

    const LEADER: &str = "consumerLeader";

    fn lease() -> LeaseId {
        LeaseId("s1".into())
    }

    /// The guard of a leadership won by `lease()` with the acquire written at index 12.
    fn guarded(lease: &LeaseId) -> Option<Guard<'_>> {
        Some(Guard {
            leader_key: LEADER,
            lease,
            index: 12,
        })
    }

    fn pair(key: &str, modify_index: u64, lock_index: u64) -> KvPair {
        KvPair {
            key: key.into(),
            value: Vec::new(),
            flags: 0,
            session: None,
            lock_index,
            create_index: 1,
            modify_index,
        }
    }

    fn batch() -> Vec<TaskOp> {
        vec![
            TaskOp::Complete {
                key: "q/done".into(),
                version: TaskVersion(5),
            },
            TaskOp::Claim {
                key: "q/a".into(),
                version: TaskVersion(6),
                value: b"claimed".to_vec(),
            },
            TaskOp::Release {
                key: "q/b".into(),
                version: TaskVersion(7),
                value: b"retry".to_vec(),
            },
            TaskOp::Rewrite {
                key: "q/c".into(),
                version: TaskVersion(8),
                value: b"requeued".to_vec(),
            },
            TaskOp::Move {
                key: "q/d".into(),
                version: TaskVersion(9),
                to: "dead/d".into(),
                value: b"dead".to_vec(),
            },
            TaskOp::Finish {
                key: "q/e".into(),
                version: TaskVersion(10),
                to: "done/e".into(),
                value: b"record".to_vec(),
            },
        ]
    }

    fn verbs(txn: &[TxnOp]) -> Vec<String> {
        txn.iter()
            .map(|op| match op {
                TxnOp::Set { key, .. } => format!("set {key}"),
                TxnOp::Cas { key, index, .. } => format!("cas {key} {index}"),
                TxnOp::Lock { key, session, .. } => format!("lock {key} {session}"),
                TxnOp::Unlock { key, session, .. } => format!("unlock {key} {session}"),
                TxnOp::DeleteCas { key, index } => format!("delete-cas {key} {index}"),
                TxnOp::CheckIndex { key, index } => format!("check-index {key} {index}"),
                TxnOp::CheckSession { key, session } => format!("check-session {key} {session}"),
                TxnOp::CheckNotExists { key } => format!("check-not-exists {key}"),
                TxnOp::Get { key } => format!("get {key}"),
            })
            .collect()
    }

    /// A guarded batch opens with the leader check (the session holds the leader key, which
    /// is still at the token's index); each op becomes its verbs, conditioned on the version
    /// it was read at, and every verb knows which op it came from.
    #[test]
    fn task_ops_become_consul_verbs_after_the_leader_check() {
        let (txn, owners) = txn_ops(guarded(&lease()), &lease(), &batch());
        assert_eq!(
            verbs(&txn),
            [
                "check-session consumerLeader s1",
                "check-index consumerLeader 12",
                "delete-cas q/done 5",
                "check-index q/a 6",
                "lock q/a s1",
                "check-index q/b 7",
                "unlock q/b s1",
                "cas q/c 8",
                "check-index q/d 9",
                "delete-cas q/d 9",
                "set dead/d",
                "delete-cas q/e 10",
                "set done/e",
            ]
        );
        assert_eq!(
            owners,
            [
                None,
                None,
                Some(0),
                Some(1),
                Some(1),
                Some(2),
                Some(2),
                Some(3),
                Some(4),
                Some(4),
                Some(4),
                Some(5),
                Some(5)
            ]
        );
        let (own, owners) = txn_ops(None, &lease(), &batch()[1..2]);
        assert_eq!(verbs(&own), ["check-index q/a 6", "lock q/a s1"]);
        assert_eq!(owners, [Some(0), Some(0)]);
        // Without the guard, a lease deletes only what it holds.
        let (own, _) = txn_ops(None, &lease(), &batch()[..1]);
        assert_eq!(
            verbs(&own),
            ["check-session q/done s1", "delete-cas q/done 5"]
        );
        let (own, _) = txn_ops(None, &lease(), &batch()[5..]);
        assert_eq!(
            verbs(&own),
            ["check-session q/e s1", "delete-cas q/e 10", "set done/e"]
        );
    }

    /// A commit answers each claimed, released or rewritten task's new version (the last
    /// result for its key, not its check-index) and the token the guard's result carries:
    /// the leader key's ModifyIndex, not its LockIndex.
    #[test]
    fn a_commit_answers_new_versions_and_the_token_it_saw() {
        let ops = batch();
        let (_, owners) = txn_ops(guarded(&lease()), &lease(), &ops);
        // Deletes add no result; check-index results carry the old index.
        let entries = vec![
            pair(LEADER, 12, 1),
            pair(LEADER, 12, 1),
            pair("q/a", 6, 0),
            pair("q/a", 20, 1),
            pair("q/b", 7, 1),
            pair("q/b", 20, 1),
            pair("q/c", 20, 0),
            pair("q/d", 9, 0),
            pair("dead/d", 20, 0),
        ];
        let answer = written(
            TxnOutcome::Committed(entries),
            &ops,
            &owners,
            LEADER,
            FencingToken(11),
        );
        assert_eq!(
            answer,
            Written::Done {
                versions: vec![
                    ("q/a".into(), TaskVersion(20)),
                    ("q/b".into(), TaskVersion(20)),
                    ("q/c".into(), TaskVersion(20))
                ],
                fencing_token: FencingToken(12),
            }
        );
        // Without the guard's result, the leadership's own token stands.
        let answer = written(
            TxnOutcome::Committed(Vec::new()),
            &[],
            &[None],
            LEADER,
            FencingToken(11),
        );
        assert_eq!(
            answer,
            Written::Done {
                versions: Vec::new(),
                fencing_token: FencingToken(11)
            }
        );
    }

    /// A failed guard op (the session's or the index's) is NotLeader whatever else failed;
    /// otherwise the failed ops' keys, each once, in the batch's order.
    #[test]
    fn a_rollback_is_not_leader_or_a_conflict_on_the_failed_keys() {
        let ops = batch();
        let (_, owners) = txn_ops(guarded(&lease()), &lease(), &ops);
        let error = |op_index: usize| TxnError {
            op_index,
            what: "failed".into(),
        };
        let rolled_back = |errors: Vec<TxnError>| {
            written(
                TxnOutcome::RolledBack(errors),
                &ops,
                &owners,
                LEADER,
                FencingToken(11),
            )
        };
        assert_eq!(rolled_back(vec![error(0), error(2)]), Written::NotLeader);
        assert_eq!(rolled_back(vec![error(1)]), Written::NotLeader);
        assert_eq!(
            rolled_back(vec![error(9), error(4), error(3)]),
            Written::Conflict(vec!["q/a".into(), "q/d".into()])
        );
        assert_eq!(
            rolled_back(Vec::new()),
            Written::Conflict(ops.iter().map(|op| op.key().to_string()).collect())
        );
        // Refused under lock-delay only: deferred, not moved; with any other error it is a
        // conflict still.
        let delayed = |op_index: usize| TxnError {
            op_index,
            what: "failed to lock key \"q/a\" due to lock delay".into(),
        };
        assert_eq!(
            rolled_back(vec![delayed(3), delayed(9)]),
            Written::Deferred(vec!["q/a".into(), "q/d".into()])
        );
        assert_eq!(
            rolled_back(vec![delayed(3), error(9)]),
            Written::Conflict(vec!["q/a".into(), "q/d".into()])
        );
        // Unguarded, op 0 is a task's like any other.
        let (_, owners) = txn_ops(None, &lease(), &ops);
        assert_eq!(
            written(
                TxnOutcome::RolledBack(vec![error(0)]),
                &ops,
                &owners,
                LEADER,
                FencingToken(0)
            ),
            Written::Conflict(vec!["q/done".into()])
        );
    }

    /// A batch's cost is its transaction exactly (the guard's two operations included): as
    /// many Consul operations, and the encoded body within a byte under the longest token,
    /// less under any other, so a batch the limits admit is one Consul accepts.
    #[test]
    fn costs_count_the_transaction_that_is_sent() {
        let lease = LeaseId(SESSION_SHAPE.into());
        let ops = vec![
            TaskOp::Complete {
                key: "q/done".into(),
                version: TaskVersion(5),
            },
            TaskOp::Claim {
                key: "q/a".into(),
                version: TaskVersion(6),
                value: vec![b'x'; 1000],
            },
            TaskOp::Move {
                key: "q/d".into(),
                version: TaskVersion(9),
                to: "dead/d".into(),
                value: b"{\"reason\":\"<bad>\"}".to_vec(),
            },
            TaskOp::Finish {
                key: "q/e".into(),
                version: TaskVersion(10),
                to: "done/e".into(),
                value: b"{\"outcome\":\"completed\"}".to_vec(),
            },
        ];
        let guard = guard_cost_on("consumerLeader");
        assert_eq!(guard.ops, 2);
        let cost = guard + ops.iter().map(|op| cost(&lease, op)).sum();
        let sent_under = |index: u64| {
            let guard = Guard {
                leader_key: "consumerLeader",
                lease: &lease,
                index,
            };
            txn_ops(Some(guard), &lease, &ops).0
        };
        // Under the longest token the body is the cost exactly; under a shorter one, less.
        let sent = sent_under(u64::MAX);
        assert_eq!(cost.ops, sent.len());
        let body = crate::coord::consul::client::body_len(
            sent.iter()
                .map(crate::coord::consul::client::TxnOp::encoded_len),
        );
        assert_eq!(cost.bytes + 1, body);
        let sent = sent_under(7);
        let body = crate::coord::consul::client::body_len(
            sent.iter()
                .map(crate::coord::consul::client::TxnOp::encoded_len),
        );
        assert!(body < cost.bytes + 1);
    }
}
