//! The in-memory coordinator behind a counter of the queue's calls, for tests that show
//! what the leader does not ask.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::coord::memory::MemoryCoordinator;
use crate::coord::{Campaign, CoordError, Coordinator, HolderRecord, LeaseSpec};
use crate::coord::{
    CoordFuture, Edit, Edited, Grant, Holder, Leadership, LeaseId, Names, Renewal, StoredTask,
    TaskOp, Version, WriteCost, WriteLimits, Written,
};

/// The in-memory coordinator, counting the queue's calls (reads and writes of tasks, not
/// the lease's renewals or the leadership's).
pub(super) struct Counting {
    inner: Arc<MemoryCoordinator>,
    pub calls: AtomicUsize,
    /// Listings of the queue alone, shared so that a handler can read it.
    pub lists: Arc<AtomicUsize>,
    /// How long each guarded write takes before it is applied (tokio's clock).
    write_delay: Duration,
    writing: AtomicUsize,
    /// The most guarded writes that were ever on their way at once.
    pub most_writing: AtomicUsize,
    /// How many more guarded writes that claim something are applied, and then answered
    /// `Unavailable` as if the answer was lost on its way back.
    pub lose_claim_answers: AtomicUsize,
    /// The same for guarded writes that complete tasks and claim nothing.
    pub lose_completion_answers: AtomicUsize,
    /// How many claim writes are answered before `lose_claim_answers` starts losing.
    pub pass_claims: AtomicUsize,
    /// How many more reads of tasks by key (`get`) answer `Unavailable`, reading nothing.
    pub fail_gets: AtomicUsize,
    /// Reads of tasks by key (`get`), and the keys they asked for.
    pub gets: AtomicUsize,
    pub got_keys: AtomicUsize,
}

impl Counting {
    pub fn new(inner: Arc<MemoryCoordinator>) -> Counting {
        Counting {
            inner,
            calls: AtomicUsize::new(0),
            lists: Arc::new(AtomicUsize::new(0)),
            write_delay: Duration::ZERO,
            writing: AtomicUsize::new(0),
            most_writing: AtomicUsize::new(0),
            lose_claim_answers: AtomicUsize::new(0),
            lose_completion_answers: AtomicUsize::new(0),
            pass_claims: AtomicUsize::new(0),
            fail_gets: AtomicUsize::new(0),
            gets: AtomicUsize::new(0),
            got_keys: AtomicUsize::new(0),
        }
    }

    /// The same, with each guarded write taking `delay` before it is applied.
    pub fn with_write_delay(inner: Arc<MemoryCoordinator>, delay: Duration) -> Counting {
        Counting {
            write_delay: delay,
            ..Counting::new(inner)
        }
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

impl Coordinator for Counting {
    fn describe(&self) -> String {
        "the in-memory coordinator, counting".into()
    }
    fn open_lease<'a>(&'a self, spec: &'a LeaseSpec) -> CoordFuture<'a, Grant> {
        self.inner.open_lease(spec)
    }
    fn keep_alive<'a>(&'a self, lease: &'a LeaseId) -> CoordFuture<'a, Renewal> {
        self.inner.keep_alive(lease)
    }
    fn revoke<'a>(&'a self, lease: &'a LeaseId) -> CoordFuture<'a, ()> {
        self.inner.revoke(lease)
    }
    fn close<'a>(&'a self, lease: Option<&'a LeaseId>) -> CoordFuture<'a, ()> {
        self.inner.close(lease)
    }
    fn observe(&self, after: Version, wait: Duration) -> CoordFuture<'_, (Holder, Version)> {
        self.inner.observe(after, wait)
    }
    fn campaign<'a>(
        &'a self,
        lease: &'a LeaseId,
        record: &'a HolderRecord,
    ) -> CoordFuture<'a, Campaign> {
        self.inner.campaign(lease, record)
    }
    fn resign<'a>(&'a self, lease: &'a LeaseId) -> CoordFuture<'a, ()> {
        self.inner.resign(lease)
    }
    fn list<'a>(
        &'a self,
        prefix: &'a str,
        after: Version,
        wait: Duration,
    ) -> CoordFuture<'a, (Vec<StoredTask>, Version)> {
        self.count();
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list(prefix, after, wait)
    }
    fn keys<'a>(&'a self, prefix: &'a str) -> CoordFuture<'a, (Names, Version)> {
        self.count();
        self.inner.keys(prefix)
    }
    fn get<'a>(&'a self, keys: &'a [String]) -> CoordFuture<'a, Vec<StoredTask>> {
        self.count();
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.got_keys.fetch_add(keys.len(), Ordering::SeqCst);
        let fail = self
            .fail_gets
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Box::pin(async { Err(CoordError::Unavailable("the read failed".into())) });
        }
        self.inner.get(keys)
    }
    fn write<'a>(
        &'a self,
        leadership: &'a Leadership,
        ops: &'a [TaskOp],
    ) -> CoordFuture<'a, Written> {
        self.count();
        Box::pin(async move {
            let writing = self.writing.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_writing.fetch_max(writing, Ordering::SeqCst);
            if !self.write_delay.is_zero() {
                tokio::time::sleep(self.write_delay).await;
            }
            let written = self.inner.write(leadership, ops).await;
            self.writing.fetch_sub(1, Ordering::SeqCst);
            let claims = ops.iter().any(|op| matches!(op, TaskOp::Claim { .. }));
            let completes = ops
                .iter()
                .any(|op| matches!(op, TaskOp::Complete { .. } | TaskOp::Finish { .. }));
            let passed = |left: &AtomicUsize| {
                left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            };
            let counter = match (claims, completes) {
                (true, _) if passed(&self.pass_claims) => None,
                (true, _) => Some(&self.lose_claim_answers),
                (false, true) => Some(&self.lose_completion_answers),
                (false, false) => None,
            };
            let lose = counter.is_some_and(passed);
            if lose {
                return Err(CoordError::Unavailable("the answer was lost".into()));
            }
            written
        })
    }
    fn write_own<'a>(&'a self, lease: &'a LeaseId, ops: &'a [TaskOp]) -> CoordFuture<'a, Written> {
        self.count();
        self.inner.write_own(lease, ops)
    }
    fn edit<'a>(&'a self, ops: &'a [Edit]) -> CoordFuture<'a, Edited> {
        self.count();
        self.inner.edit(ops)
    }
    fn limits(&self) -> WriteLimits {
        self.inner.limits()
    }
    fn cost(&self, op: &TaskOp) -> WriteCost {
        self.inner.cost(op)
    }
    fn guard_cost(&self) -> WriteCost {
        self.inner.guard_cost()
    }
}
