//! [`Tasks`] on etcd's keys: list (the prefix, its claim keys, the claim records and the
//! leases' owners, read at one revision, after watches of the first three from the
//! revision last seen when asked to wait), keys, get, and writes as one transaction each
//! (built and judged in `plan.rs`, their records planned in `records.rs`).

use std::collections::HashSet;
use std::time::Duration;

use crate::coord::etcd::client::{Event, Kv, Op, Range, Txn};
use crate::coord::etcd::layout::{
    garbage, lease_id, lease_number, position, revision_of, task_version, Holders, Record,
};
use crate::coord::etcd::plan::{edit_txn, edited, write_txn, written, Guard, Writer, MAX_TXN_OPS};
use crate::coord::etcd::records::Outcome;
use crate::coord::{
    conflict_on_all, CoordError, Edit, Edited, FencingToken, Leadership, LeaseId, Names,
    StoredTask, TaskOp, Tasks, Version, WriteCost, WriteLimits, Written,
};

use super::{not_a_lease, plan, EtcdCoordinator};

/// Keys read per transaction by `get` (a read of the task and one of its claim key each,
/// beside the records and the owners).
const GET_CHUNK: usize = MAX_TXN_OPS / 2 - 1;

/// Records a listing deletes at most, when it finds garbage no write took along.
const GARBAGE_PER_LISTING: usize = 64;

/// Tasks per page of a listing: a large queue in one answer would be held whole (tens of
/// MB of JSON with its values in base64) beside what it decodes to, and a page of 1024
/// tasks of 20 KB is 20 MB already. Pages are not free either: etcd 3.4 walks every key
/// left in the range for each page, so a listing of N keys in pages of P costs etcd about
/// N²/2P key visits (at 100k tasks of 300 B, 2.1 s of its CPU in pages of 1024, 1.5 s in
/// pages of 4096).
const LIST_PAGE: usize = 1024;

/// Keys per page of a look, which reads keys only (a few dozen bytes each): the same walk
/// costs etcd 1.7 s of CPU for 100k keys in pages of 1024, 1.1 s in pages of 4096, 0.95 s
/// in pages of 16384; a larger page is held whole by the leader (8192 raised its peak
/// at 100k by 4.5 MiB).
const KEYS_PAGE: usize = 4096;

/// The key right after `key` in etcd's order: where the next page starts.
fn key_after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// The tasks among `tasks`, each held as `holders` says.
pub fn stored_tasks(tasks: Vec<Kv>, holders: &Holders) -> Vec<StoredTask> {
    tasks
        .into_iter()
        .map(|kv| {
            let (hold, lease) = holders.hold(&kv.key, kv.create_revision);
            StoredTask {
                key: String::from_utf8(kv.key)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
                version: task_version(kv.mod_revision, hold),
                created: kv.create_revision.max(0) as u64,
                holder: (lease != 0).then(|| lease_id(lease)),
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
            let records = Range::prefix(self.layout.records().as_bytes());
            // Of the records, only those naming a task under the prefix: the leader's
            // claims and completions write and delete records of the queue's tasks, and a
            // wait on another prefix (the schedules') would wake, and be read again, at
            // every one of them.
            let concerns = |event: &Event| Record::change_concerns(event, prefix);
            tokio::select! {
                watched = self.client.watch(&tasks, start, wait) => watched?,
                watched = self.client.watch(&held, start, wait) => watched?,
                watched = self.client.watch_for(&records, start, wait, Some(&concerns)) => watched?,
            };
        }
        // The first page with every claim key, record and owner, then the other pages at
        // the same revision: one picture of the queue, read a page at a time.
        let tasks = Range {
            limit: LIST_PAGE,
            ..Range::prefix(prefix.as_bytes())
        };
        let read = Txn {
            success: vec![
                Op::Get(tasks.clone()),
                Op::Get(Range::prefix(claims.as_bytes())),
                Op::Get(Range::prefix(self.layout.records().as_bytes())),
                Op::Get(Range::prefix(self.layout.owners().as_bytes())),
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
        let records = ranges.next().unwrap_or_default().kvs;
        let owners = ranges.next().unwrap_or_default().kvs;
        self.book().owners_seen(&owners, revision);
        let holders = Holders::new(&self.layout.claims(), &claims, &records);
        let mut more = first.more;
        let mut listed = stored_tasks(first.kvs, &holders);
        while more {
            let Some(last) = listed.last() else { break };
            let page = Range {
                key: key_after(last.key.as_bytes()),
                revision,
                ..tasks.clone()
            };
            let page = self.client.range(&page).await?;
            more = page.more;
            listed.extend(stored_tasks(page.kvs, &holders));
        }
        self.learn(&listed, &holders);
        self.collect_garbage(prefix, &listed, &records, revision)
            .await;
        Ok((listed, position(revision)))
    }

    /// The prefix's keys without values.
    async fn keys(&self, prefix: &str) -> Result<(Names, Version), CoordError> {
        let range = Range {
            keys_only: true,
            limit: KEYS_PAGE,
            ..Range::prefix(prefix.as_bytes())
        };
        let response = self.client.range(&range).await?;
        let revision = response.header.revision;
        let mut more = response.more;
        let mut keys = Names::under(prefix);
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

    /// Each key with its claim key, and the records and owners, a chunk of keys per
    /// read-only transaction.
    async fn get(&self, keys: &[String]) -> Result<Vec<StoredTask>, CoordError> {
        let mut found = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(GET_CHUNK) {
            let mut success = vec![
                Op::Get(Range::prefix(self.layout.records().as_bytes())),
                Op::Get(Range::prefix(self.layout.owners().as_bytes())),
            ];
            success.extend(chunk.iter().flat_map(|key| {
                [
                    Op::Get(Range::key(key.as_bytes())),
                    Op::Get(Range::key(self.layout.claim(key).as_bytes())),
                ]
            }));
            let read = Txn {
                success,
                ..Txn::default()
            };
            let response = self.client.txn(&read).await?;
            let revision = response.header.revision;
            let mut ranges = response.into_ranges().into_iter();
            let records = ranges.next().unwrap_or_default();
            let owners = ranges.next().unwrap_or_default();
            self.book().owners_seen(&owners, revision);
            let (mut tasks, mut claims) = (Vec::new(), Vec::new());
            while let Some(task) = ranges.next() {
                tasks.extend(task);
                claims.extend(ranges.next().unwrap_or_default());
            }
            let holders = Holders::new(&self.layout.claims(), &claims, &records);
            let stored = stored_tasks(tasks, &holders);
            self.learn(&stored, &holders);
            found.extend(stored);
        }
        Ok(found)
    }

    /// One transaction, guarded by the campaign key's creation revision as the win left it.
    async fn write(&self, leadership: &Leadership, ops: &[TaskOp]) -> Result<Written, CoordError> {
        crate::coord::admit(self, ops, true)?;
        let id = lease_number(&leadership.lease).ok_or_else(|| not_a_lease(&leadership.lease))?;
        let Some(created) = self.guarded_revision(leadership) else {
            return Ok(Written::NotLeader);
        };
        let guard = Guard {
            key: self.layout.candidate(id),
            created,
        };
        let writer = Writer {
            lease: id,
            own: false,
        };
        let token = leadership.fencing_token;
        match self.send_write(Some(&guard), writer, ops, token).await? {
            Some(answer) => Ok(answer),
            // A claim under a lease etcd no longer has: the leadership went with it.
            None => Ok(Written::NotLeader),
        }
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
        match self.send_write(None, writer, ops, FencingToken(0)).await? {
            Some(answer) => Ok(answer),
            // The lease ended: its claims are orphans now, none of them its to settle.
            None => Ok(conflict_on_all(ops)),
        }
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
        plan::LIMITS
    }

    fn cost(&self, op: &TaskOp) -> WriteCost {
        plan::cost(&self.layout, op)
    }

    fn guard_cost(&self) -> WriteCost {
        plan::guard_cost(&self.layout)
    }
}

impl EtcdCoordinator {
    /// `ops` as one transaction with the records they add (named at random), and what the
    /// book learns of it; `None` when the writer's lease is gone. A write that used a
    /// claim record and was rolled back while a lease's owner was created since the owners
    /// were read (a replica started: one from before records forbids them) is planned
    /// again on the owners as they are, once: the caller's tasks did not move for it. (If
    /// the owners cannot be read, the rollback is answered as it is: a conflict.)
    async fn send_write(
        &self,
        guard: Option<&Guard>,
        writer: Writer,
        ops: &[TaskOp],
        token: FencingToken,
    ) -> Result<Option<Written>, CoordError> {
        let mut replanned = false;
        loop {
            let ids = (fastrand::u64(..), fastrand::u64(..));
            let records = self
                .book()
                .plan(&self.layout, writer.lease, writer.own, ops, ids);
            let txn = write_txn(&self.layout, guard, writer, ops, &records);
            let (txn, response) = match self.send_judged(txn).await {
                Ok(sent) => sent,
                Err(err) => {
                    self.book().answered(&records, ops, Outcome::NotApplied);
                    return if err.is_not_found() {
                        Ok(None)
                    } else {
                        Err(err.into())
                    };
                }
            };
            let answer = written(&txn, &response, ops, &records, guard.is_some(), token);
            let revision = response.header.revision;
            self.book()
                .answered(&records, ops, Outcome::of(&answer, revision));
            if let (false, Some((_, seen)), Written::Conflict(_)) =
                (replanned, &records.claim, &answer)
            {
                let owners = Range::prefix(self.layout.owners().as_bytes());
                let owners = self.client.range(&owners).await.unwrap_or_default();
                if owners.kvs.iter().any(|kv| kv.mod_revision > *seen) {
                    self.book().owners_seen(&owners.kvs, owners.header.revision);
                    replanned = true;
                    continue;
                }
            }
            return Ok(Some(answer));
        }
    }

    /// The claim records holding the record-held tasks among `tasks`, for the book.
    fn learn(&self, tasks: &[StoredTask], holders: &Holders) {
        let held = tasks.iter().filter_map(|task| {
            let record = holders.record(&task.key, task.created as i64)?;
            Some((task.key.clone(), record.to_string()))
        });
        self.book().learn(held);
    }

    /// After a listing of `prefix` at `revision`: what the book learns of the records it
    /// read (the ones that went); if this process writes records at all, the garbage among
    /// them, and deletes some of what is waiting. A failed delete is tried again
    /// later; a listing never fails for it.
    async fn collect_garbage(
        &self,
        prefix: &str,
        listed: &[StoredTask],
        records: &[Kv],
        revision: i64,
    ) {
        let batch = {
            let present: HashSet<&str> = records
                .iter()
                .filter_map(|kv| std::str::from_utf8(&kv.key).ok())
                .collect();
            let mut book = self.book();
            if !book.wrote() {
                book.listed(&present, revision, Vec::new());
                return;
            }
            let tasks = listed
                .iter()
                .map(|task| (task.key.as_str(), task.created as i64));
            let found = garbage(records, prefix, tasks);
            book.listed(&present, revision, found);
            book.take_garbage_if_quiet(GARBAGE_PER_LISTING)
        };
        if batch.is_empty() {
            return;
        }
        let delete = Txn {
            success: batch
                .iter()
                .map(|name| Op::Delete(name.as_bytes().to_vec()))
                .collect(),
            ..Txn::default()
        };
        if let Err(err) = self.client.txn(&delete).await {
            tracing::debug!(error = %err, "cannot delete claim records no task needs; later");
            self.book().put_back(batch);
        }
    }

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

    /// A task is held by the lease of its claim key, or of the claim record naming it;
    /// each way of holding has its own version.
    #[test]
    fn tasks_are_held_by_their_claims_lease() {
        use crate::coord::etcd::layout::{Hold, Record};
        let tasks = vec![kv("q/a", 3, 5, 0), kv("q/b", 4, 4, 0), kv("q/c", 2, 6, 0)];
        let claims = [kv("L.claims/q/a", 5, 5, 0x1f)];
        let mut record = kv("L.held/2e/01", 6, 6, 0x2e);
        record.value = Record {
            claimed: vec!["q/c".into()],
            ..Record::default()
        }
        .encode();
        let holders = Holders::new("L.claims/", &claims, &[record]);
        let stored = stored_tasks(tasks, &holders);
        assert_eq!(stored[0].holder, Some(LeaseId("1f".into())));
        assert_eq!(stored[0].version, task_version(5, Hold::Key));
        assert_eq!(stored[0].created, 3);
        assert_eq!(stored[1].holder, None);
        assert_eq!(stored[1].version, task_version(4, Hold::Free));
        assert_eq!(stored[2].holder, Some(LeaseId("2e".into())));
        assert_eq!(stored[2].version, task_version(6, Hold::Record));
    }
}
