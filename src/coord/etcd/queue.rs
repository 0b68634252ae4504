//! [`Tasks`] on etcd's keys: list (the prefix and its claims, read at one revision, after
//! watches of both from the revision last seen when asked to wait), keys, get, and writes
//! as one transaction each (built and judged in `txn.rs`).

use std::collections::HashMap;
use std::time::Duration;

use crate::coord::etcd::client::{Kv, Op, Range, Txn};
use crate::coord::etcd::layout::{lease_id, lease_number, position, revision_of, task_version};
use crate::coord::etcd::txn::{edit_txn, edited, write_txn, written, Guard, Writer, MAX_TXN_OPS};
use crate::coord::{
    conflict_on_all, CoordError, Edit, Edited, FencingToken, Leadership, LeaseId, Names,
    StoredTask, TaskOp, Tasks, Version, WriteCost, WriteLimits, Written,
};

use super::{not_a_lease, txn, EtcdCoordinator};

/// Keys read per transaction by `get` (a read of the task and one of its claim each).
const GET_CHUNK: usize = MAX_TXN_OPS / 2;

/// Keys per page of a listing or a look: a large queue in one answer would be held whole
/// (tens of MB of JSON with its values in base64) beside what it decodes to.
const LIST_PAGE: usize = 1024;

/// The key right after `key` in etcd's order: where the next page starts.
fn key_after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// The tasks among `tasks`, each held if `claims` (keys `claims_prefix` + task key) has
/// its claim.
pub fn stored_tasks(claims_prefix: &str, tasks: Vec<Kv>, claims: &[Kv]) -> Vec<StoredTask> {
    let holders: HashMap<&[u8], i64> = claims
        .iter()
        .filter_map(|claim| {
            claim
                .key
                .strip_prefix(claims_prefix.as_bytes())
                .map(|task| (task, claim.lease))
        })
        .collect();
    tasks
        .into_iter()
        .map(|kv| {
            let claim = holders.get(kv.key.as_slice()).copied();
            StoredTask {
                key: String::from_utf8(kv.key)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
                version: task_version(kv.mod_revision, claim.is_some()),
                created: kv.create_revision.max(0) as u64,
                holder: claim.filter(|lease| *lease != 0).map(lease_id),
                value: kv.value,
            }
        })
        .collect()
}

impl Tasks for EtcdCoordinator {
    /// Past `after`, a watch on `prefix` from the revision after it first (at once if that
    /// revision was compacted); then the prefix and its claims.
    async fn list(
        &self,
        prefix: &str,
        after: Version,
        wait: Duration,
    ) -> Result<(Vec<StoredTask>, Version), CoordError> {
        let claims = format!("{}{prefix}", self.layout.claims());
        if after.0 != 0 {
            // The claims too: a claim that dies with a lease that is not the leader's (a
            // deposed leader's, kept alive after it stepped down) changes no task key, yet
            // makes its task an orphan to requeue.
            let start = revision_of(after) + 1;
            let tasks = Range::prefix(prefix.as_bytes());
            let held = Range::prefix(claims.as_bytes());
            tokio::select! {
                watched = self.client.watch(&tasks, start, wait) => watched?,
                watched = self.client.watch(&held, start, wait) => watched?,
            };
        }
        // The first page with every claim, then the other pages at the same revision: one
        // picture of the queue, read a page at a time.
        let tasks = Range {
            limit: LIST_PAGE,
            ..Range::prefix(prefix.as_bytes())
        };
        let read = Txn {
            success: vec![
                Op::Get(tasks.clone()),
                Op::Get(Range::prefix(claims.as_bytes())),
            ],
            ..Txn::default()
        };
        let response = self.client.txn(&read).await?;
        let revision = response.header.revision;
        let mut ranges = response
            .responses
            .into_iter()
            .map(|op| op.response_range.unwrap_or_default());
        let first = ranges.next().unwrap_or_default();
        let claims = ranges.next().unwrap_or_default().kvs;
        let mut more = first.more;
        let mut listed = stored_tasks(&self.layout.claims(), first.kvs, &claims);
        while more {
            let Some(last) = listed.last() else { break };
            let page = Range {
                key: key_after(last.key.as_bytes()),
                revision,
                ..tasks.clone()
            };
            let page = self.client.range(&page).await?;
            more = page.more;
            listed.extend(stored_tasks(&self.layout.claims(), page.kvs, &claims));
        }
        Ok((listed, position(revision)))
    }

    /// The prefix's keys without values.
    async fn keys(&self, prefix: &str) -> Result<(Names, Version), CoordError> {
        let range = Range {
            keys_only: true,
            limit: LIST_PAGE,
            ..Range::prefix(prefix.as_bytes())
        };
        let response = self.client.range(&range).await?;
        let revision = response.header.revision;
        let mut more = response.more;
        let mut keys = Names::new();
        let mut page = response.kvs;
        loop {
            let next = page.last().map(|kv| key_after(&kv.key));
            for kv in &page {
                keys.push(&String::from_utf8_lossy(&kv.key));
            }
            let (true, Some(next)) = (more, next) else {
                break;
            };
            let read = Range {
                key: next,
                revision,
                ..range.clone()
            };
            let response = self.client.range(&read).await?;
            more = response.more;
            page = response.kvs;
        }
        Ok((keys, position(revision)))
    }

    /// Each key with its claim, a chunk of keys per read-only transaction.
    async fn get(&self, keys: &[String]) -> Result<Vec<StoredTask>, CoordError> {
        let mut found = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(GET_CHUNK) {
            let read = Txn {
                success: chunk
                    .iter()
                    .flat_map(|key| {
                        [
                            Op::Get(Range::key(key.as_bytes())),
                            Op::Get(Range::key(self.layout.claim(key).as_bytes())),
                        ]
                    })
                    .collect(),
                ..Txn::default()
            };
            let response = self.client.txn(&read).await?;
            let ranges = response.ranges();
            let (mut tasks, mut claims) = (Vec::new(), Vec::new());
            for pair in ranges.chunks(2) {
                tasks.extend(pair[0].iter().cloned());
                if let Some(claim) = pair.get(1) {
                    claims.extend(claim.iter().cloned());
                }
            }
            found.extend(stored_tasks(&self.layout.claims(), tasks, &claims));
        }
        Ok(found)
    }

    /// One transaction, guarded by the campaign key's creation revision.
    async fn write(&self, leadership: &Leadership, ops: &[TaskOp]) -> Result<Written, CoordError> {
        crate::coord::admit(self, ops, true)?;
        let id = lease_number(&leadership.lease).ok_or_else(|| not_a_lease(&leadership.lease))?;
        let guard = Guard {
            key: self.layout.candidate(id),
            token: leadership.fencing_token.0 as i64,
        };
        let writer = Writer {
            lease: id,
            own: false,
        };
        let txn = write_txn(&self.layout, Some(&guard), writer, ops);
        let response = match self.send_judged(txn).await {
            Ok(response) => response,
            // A claim under a lease etcd no longer has: the leadership went with it.
            Err(err) if err.is_not_found() => return Ok(Written::NotLeader),
            Err(err) => return Err(err.into()),
        };
        let (txn, response) = response;
        Ok(written(&txn, &response, ops, leadership.fencing_token))
    }

    /// The same transaction without the guard, releasing, completing or moving only what
    /// this lease's claims hold. A rollback (a task that moved meanwhile) is not an error:
    /// the task is no longer this lease's to put back.
    async fn write_own(&self, lease: &LeaseId, ops: &[TaskOp]) -> Result<Written, CoordError> {
        if ops.is_empty() {
            return Ok(Written::Done {
                versions: Vec::new(),
                fencing_token: FencingToken(0),
            });
        }
        crate::coord::admit(self, ops, false)?;
        let id = lease_number(lease).ok_or_else(|| not_a_lease(lease))?;
        let writer = Writer {
            lease: id,
            own: true,
        };
        let txn = write_txn(&self.layout, None, writer, ops);
        let response = match self.send_judged(txn).await {
            Ok(response) => response,
            // The lease ended: its claims are orphans now, none of them its to settle.
            Err(err) if err.is_not_found() => return Ok(conflict_on_all(ops)),
            Err(err) => return Err(err.into()),
        };
        let (txn, response) = response;
        Ok(written(&txn, &response, ops, FencingToken(0)))
    }

    /// One transaction of create-only puts and deletes at a version.
    async fn edit(&self, ops: &[Edit]) -> Result<Edited, CoordError> {
        if ops.is_empty() {
            return Ok(Edited::Done);
        }
        if 2 * ops.len() > MAX_TXN_OPS {
            return Err(CoordError::Refused(format!(
                "an edit of {} operations is over etcd's transaction limit of {} ({} per task): edit fewer tasks at once",
                ops.len(),
                MAX_TXN_OPS,
                2
            )));
        }
        let txn = edit_txn(&self.layout, ops);
        let response = self.client.txn(&txn).await?;
        Ok(edited(&txn, &response, ops))
    }

    fn limits(&self) -> WriteLimits {
        txn::LIMITS
    }

    fn cost(&self, op: &TaskOp) -> WriteCost {
        txn::cost(&self.layout, op)
    }

    fn guard_cost(&self) -> WriteCost {
        txn::guard_cost(&self.layout)
    }
}

impl EtcdCoordinator {
    /// Sends a queue write without its failure branch, and reads that branch's keys only
    /// if the write was rolled back; answers the transaction as planned (failure branch
    /// included) and a response as if that branch had run.
    ///
    /// The failure branch (the guard's key and each task's key and claim) serves only to
    /// say why a rollback happened. Sent with every write, it is decoded by the gateway
    /// and carried in the raft entry every member logs and applies, though it runs only on
    /// a rollback. Read after the rollback instead, in one read-only transaction, it says
    /// the same: the rollback applied nothing either way; a guard that failed stays failed
    /// (a campaign key's `create_revision` never comes back), and a guard that fails only
    /// by then means the leadership is gone now, which `NotLeader` says; a task whose
    /// compare failed has moved for good (revisions only rise), and if none is seen to
    /// fail every task of the write is a conflict, as for any rollback nothing explains.
    async fn send_judged(
        &self,
        mut txn: Txn,
    ) -> Result<(Txn, crate::coord::etcd::client::TxnResponse), crate::coord::etcd::client::Error>
    {
        let reads = std::mem::take(&mut txn.failure);
        let response = self.client.txn(&txn).await?;
        txn.failure = reads;
        if response.succeeded || txn.failure.is_empty() {
            return Ok((txn, response));
        }
        let read = Txn {
            success: txn.failure.clone(),
            ..Txn::default()
        };
        let seen = self.client.txn(&read).await?;
        let judged = crate::coord::etcd::client::TxnResponse {
            header: response.header,
            succeeded: false,
            responses: seen.responses,
        };
        Ok((txn, judged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, create: i64, modified: i64, lease: i64) -> Kv {
        Kv {
            key: key.as_bytes().to_vec(),
            create_revision: create,
            mod_revision: modified,
            version: 1,
            value: b"{}".to_vec(),
            lease,
        }
    }

    /// A task is held by the lease of its claim key; without one its version is odd.
    #[test]
    fn tasks_are_held_by_their_claims_lease() {
        let tasks = vec![kv("q/a", 3, 5, 0), kv("q/b", 4, 4, 0)];
        let claims = [kv("L.claims/q/a", 5, 5, 0x1f)];
        let stored = stored_tasks("L.claims/", tasks, &claims);
        assert_eq!(stored[0].holder, Some(LeaseId("1f".into())));
        assert_eq!(stored[0].version, task_version(5, true));
        assert_eq!(stored[0].created, 3);
        assert_eq!(stored[1].holder, None);
        assert_eq!(stored[1].version, task_version(4, false));
    }
}
