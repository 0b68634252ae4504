//! [`Tasks`] on Consul's KV store: list (a blocking `?recurse`), keys (`?keys`), get, and
//! writes as one transaction each (built and read in `plan.rs`). A guarded write's first
//! operations are `check-session` and `check-index` on the leader key, so it applies only
//! while the leadership's session holds the key and nobody rewrote it since the acquire
//! whose ModifyIndex is the token; their result carries that index as the commit saw it.

use std::time::Duration;

use tokio::time::Instant;

use crate::coord::consul::client::{self as consul, QueryOptions, TxnOp, TxnOutcome};
use crate::coord::{
    CoordError, Edit, Edited, FencingToken, Leadership, LeaseId, Names, StoredTask, TaskOp, Tasks,
    Version, WriteCost, WriteLimits, Written,
};

use super::election::{next_version, settle};
use super::layout::stored_task;
use super::plan::{self, txn_ops, written, Guard};
use super::plan::{guard_cost_on, MAX_BYTES, SESSION_SHAPE};
use super::ConsulCoordinator;

/// Read transactions of one `get` sent at once.
const GET_IN_FLIGHT: usize = 8;

impl ConsulCoordinator {
    /// One read-only transaction of `chunk`'s keys; one GET per key if it rolls back.
    async fn get_chunk(&self, chunk: &[String]) -> Result<Vec<StoredTask>, CoordError> {
        let reads: Vec<TxnOp> = chunk
            .iter()
            .map(|key| TxnOp::Get { key: key.clone() })
            .collect();
        match self.client.txn(&reads).await? {
            TxnOutcome::Committed(found) => Ok(found.into_iter().map(stored_task).collect()),
            TxnOutcome::RolledBack(_) => {
                let mut tasks = Vec::new();
                for key in chunk {
                    if let (Some(pair), _) =
                        self.client.kv_get(key, QueryOptions::default()).await?
                    {
                        tasks.push(stored_task(pair));
                    }
                }
                Ok(tasks)
            }
        }
    }
}

impl Tasks for ConsulCoordinator {
    /// A blocking `?recurse` on `prefix` at `after`, paced as `observe` is.
    async fn list(
        &self,
        prefix: &str,
        after: Version,
        wait: Duration,
    ) -> Result<(Vec<StoredTask>, Version), CoordError> {
        let options = QueryOptions {
            index: after.0,
            wait: Some(wait),
        };
        let sent = Instant::now();
        let (entries, returned) = self.client.kv_list_as(prefix, options, stored_task).await?;
        let next = next_version(after, returned);
        settle(sent, wait, after, next).await;
        Ok((entries, next))
    }

    /// The same blocking `?recurse`, each entry handed on as the body brings it.
    async fn list_each(
        &self,
        prefix: &str,
        after: Version,
        wait: Duration,
        each: &mut (dyn FnMut(StoredTask) + Send),
    ) -> Result<Version, CoordError> {
        let options = QueryOptions {
            index: after.0,
            wait: Some(wait),
        };
        let sent = Instant::now();
        // Nothing is kept: a vector of `()` holds no memory.
        let (_, returned) = self
            .client
            .kv_list_as(prefix, options, |pair| each(stored_task(pair)))
            .await?;
        let next = next_version(after, returned);
        settle(sent, wait, after, next).await;
        Ok(next)
    }

    /// `?keys` on `prefix`, no values.
    async fn keys(&self, prefix: &str) -> Result<(Names, Version), CoordError> {
        let (keys, index) = self.client.kv_keys(prefix, QueryOptions::default()).await?;
        Ok((keys, next_version(Version(0), index)))
    }

    /// Read-only transactions of `get` ops, as many keys as one holds, up to
    /// GET_IN_FLIGHT at once (the leader reads thousands of values ahead of its claims on a
    /// large backlog); a chunk that rolls back (a key went away meanwhile) is read again one
    /// GET per key.
    async fn get(&self, keys: &[String]) -> Result<Vec<StoredTask>, CoordError> {
        let mut tasks = Vec::with_capacity(keys.len());
        for group in keys.chunks(consul::TXN_MAX_OPS * GET_IN_FLIGHT) {
            let reads: Vec<_> = group
                .chunks(consul::TXN_MAX_OPS)
                .map(|chunk| self.get_chunk(chunk))
                .collect();
            for read in futures_util::future::try_join_all(reads).await? {
                tasks.extend(read);
            }
        }
        Ok(tasks)
    }

    /// One transaction, guarded by `check-session` and `check-index` on the leader key.
    async fn write(&self, leadership: &Leadership, ops: &[TaskOp]) -> Result<Written, CoordError> {
        crate::coord::admit(self, ops, true)?;
        let leader_key = self.settings.leader_key.as_str();
        let guard = Guard {
            leader_key,
            lease: &leadership.lease,
            index: self.won_at(&leadership.lease, Some(leadership.fencing_token)),
        };
        let (txn, owners) = txn_ops(Some(guard), &leadership.lease, ops);
        let outcome = self.client.txn(&txn).await?;
        Ok(written(
            outcome,
            ops,
            &owners,
            leader_key,
            leadership.fencing_token,
        ))
    }

    /// The same transaction without the guard. A rollback (a task that moved meanwhile, or
    /// a lock whose session ended) answers `Conflict`: the task is no longer this lease's
    /// to settle.
    async fn write_own(&self, lease: &LeaseId, ops: &[TaskOp]) -> Result<Written, CoordError> {
        if ops.is_empty() {
            return Ok(Written::Done {
                versions: Vec::new(),
                fencing_token: FencingToken(0),
            });
        }
        crate::coord::admit(self, ops, false)?;
        let (txn, owners) = txn_ops(None, lease, ops);
        let outcome = self.client.txn(&txn).await?;
        Ok(written(
            outcome,
            ops,
            &owners,
            &self.settings.leader_key,
            FencingToken(0),
        ))
    }

    /// One transaction of create-only `cas` (index 0), `delete-cas`, `set` and `cas` ops; a
    /// rollback names the keys of the failed ops. It may carry `consul.txn_max_ops`
    /// operations, as the leader's writes do (`Tasks::limits`).
    async fn edit(&self, ops: &[Edit]) -> Result<Edited, CoordError> {
        if ops.is_empty() {
            return Ok(Edited::Done);
        }
        let max_ops = self.settings.txn_max_ops;
        if ops.len() > max_ops {
            return Err(CoordError::Refused(format!(
                "an edit of {} operations is over Consul's limit of {max_ops} (consul.txn_max_ops): edit fewer tasks at once",
                ops.len(),
            )));
        }
        let txn: Vec<TxnOp> = ops
            .iter()
            .map(|op| match op {
                Edit::Create { key, value } => TxnOp::Cas {
                    key: key.clone(),
                    value: value.clone(),
                    index: 0,
                },
                Edit::Delete { key, version } => TxnOp::DeleteCas {
                    key: key.clone(),
                    index: version.0,
                },
                Edit::Put { key, value } => TxnOp::Set {
                    key: key.clone(),
                    value: value.clone(),
                },
                // A task's lock moves its ModifyIndex (a session's end releases it), so a
                // cas at the version read also finds the claim as it was read.
                Edit::Replace {
                    key,
                    version,
                    value,
                } => TxnOp::Cas {
                    key: key.clone(),
                    value: value.clone(),
                    index: version.0,
                },
            })
            .collect();
        Ok(match self.client.txn(&txn).await? {
            TxnOutcome::Committed(_) => Edited::Done,
            TxnOutcome::RolledBack(errors) => Edited::Conflict(
                errors
                    .iter()
                    .filter_map(|e| ops.get(e.op_index).map(|op| op.key().to_string()))
                    .collect(),
            ),
        })
    }

    fn limits(&self) -> WriteLimits {
        WriteLimits {
            max_ops: self.settings.txn_max_ops,
            max_bytes: MAX_BYTES,
        }
    }

    fn cost(&self, op: &TaskOp) -> WriteCost {
        // A session id is 36 characters whoever writes; costs do not depend on whose.
        plan::cost(&LeaseId(SESSION_SHAPE.into()), op)
    }

    fn guard_cost(&self) -> WriteCost {
        guard_cost_on(&self.settings.leader_key)
    }
}
