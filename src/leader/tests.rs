//! The renewer (`Election::renew_until`) on tokio's paused clock, against the in-memory
//! coordinator behind [`Late`], which takes each keep-alive at once (the coordinator counts
//! the lease from its send) and answers it a scripted latency later: below the bound the
//! settings promise, the lease never gets closer to its deadline than 2/3 × TTL − the
//! latency, so no run is stopped; past 2/3 of a TTL it goes stale at the replica while the
//! coordinator still honours it. And what a renewer must still do: mark a lease lost on the
//! first answer that says so, retry a failure soon, keep only so many on their way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::renewal::IN_FLIGHT_MAX;
use super::{Election, Lease};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::{
    Campaign, CoordFuture, Coordinator, Edit, Edited, Grant, Holder, HolderRecord, Leadership,
    LeaseId, LeaseSpec, Names, Renewal, StoredTask, TaskOp, Version, WriteCost, WriteLimits,
    Written,
};
use crate::observe::Metrics;

/// The settings: a 10 s TTL and a kill grace of 1.4 s, so a run is stopped once
/// its lease has no more than 1.4 s + TTL/10 left.
const TTL: Duration = Duration::from_secs(10);
const KILL_GRACE: Duration = Duration::from_millis(1400);

/// What a run's kill sequence needs of the lease: the kill grace and the supervisor's
/// margin.
fn headroom() -> Duration {
    KILL_GRACE + crate::supervise::lease_margin(TTL)
}

/// Tokio's timers fire on whole milliseconds: a period or a latency may last up to a
/// millisecond longer than asked, each.
const TIMER_RESOLUTION: Duration = Duration::from_millis(1);

/// The latency below which no run is stopped: 2/3 × TTL − kill_grace − TTL/10 (4.27 s).
fn bound() -> Duration {
    TTL * 2 / 3 - headroom()
}

/// The in-memory coordinator, whose keep-alives are applied when sent and answered the
/// `n`-th one's latency later (the last latency for all after).
struct Late {
    inner: Arc<MemoryCoordinator>,
    latencies: Vec<Duration>,
    calls: AtomicUsize,
    waiting: AtomicUsize,
    /// The most keep-alives ever waiting for their answer at once.
    most_waiting: AtomicUsize,
    /// When the coordinator last received a keep-alive of a lease it still had: it ends
    /// the lease a TTL after that.
    received: Mutex<Option<Instant>>,
}

impl Late {
    fn new(inner: Arc<MemoryCoordinator>, latencies: &[Duration]) -> Late {
        Late {
            inner,
            latencies: latencies.to_vec(),
            calls: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            most_waiting: AtomicUsize::new(0),
            received: Mutex::new(None),
        }
    }

    /// When the coordinator ends the lease unless it hears of it again.
    fn coordinator_end(&self) -> Option<Instant> {
        self.received.lock().unwrap().map(|at| at + TTL)
    }
}

/// One keep-alive waiting for its answer, counted until it is answered or given up.
struct Waiting<'a> {
    waiting: &'a AtomicUsize,
    /// How many were waiting, this one included, when it began.
    count: usize,
}

impl<'a> Waiting<'a> {
    fn new(waiting: &'a AtomicUsize) -> Waiting<'a> {
        let count = waiting.fetch_add(1, Ordering::SeqCst) + 1;
        Waiting { waiting, count }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Coordinator for Late {
    fn describe(&self) -> String {
        "the in-memory coordinator, answering keep-alives late".into()
    }
    fn open_lease<'a>(&'a self, spec: &'a LeaseSpec) -> CoordFuture<'a, Grant> {
        self.inner.open_lease(spec)
    }
    fn keep_alive<'a>(&'a self, lease: &'a LeaseId) -> CoordFuture<'a, Renewal> {
        Box::pin(async move {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            let latency = self.latencies[n.min(self.latencies.len() - 1)];
            let answer = self.inner.keep_alive(lease).await;
            if answer == Ok(Renewal::Alive) {
                *self.received.lock().unwrap() = Some(Instant::now());
            }
            let waiting = Waiting::new(&self.waiting);
            self.most_waiting.fetch_max(waiting.count, Ordering::SeqCst);
            tokio::time::sleep(latency).await;
            drop(waiting);
            answer
        })
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
        self.inner.list(prefix, after, wait)
    }
    fn keys<'a>(&'a self, prefix: &'a str) -> CoordFuture<'a, (Names, Version)> {
        self.inner.keys(prefix)
    }
    fn get<'a>(&'a self, keys: &'a [String]) -> CoordFuture<'a, Vec<StoredTask>> {
        self.inner.get(keys)
    }
    fn write<'a>(
        &'a self,
        leadership: &'a Leadership,
        ops: &'a [TaskOp],
    ) -> CoordFuture<'a, Written> {
        self.inner.write(leadership, ops)
    }
    fn write_own<'a>(&'a self, lease: &'a LeaseId, ops: &'a [TaskOp]) -> CoordFuture<'a, Written> {
        self.inner.write_own(lease, ops)
    }
    fn edit<'a>(&'a self, ops: &'a [Edit]) -> CoordFuture<'a, Edited> {
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

/// A lease of `ttl` opened now on a coordinator answering keep-alives `latencies` late,
/// and the renewer keeping it until the token is cancelled.
struct Renewing {
    late: Arc<Late>,
    lease: Arc<Lease>,
    id: LeaseId,
    stop: CancellationToken,
    renewer: JoinHandle<()>,
}

async fn renewing(ttl: Duration, latencies: &[Duration]) -> Renewing {
    let inner = Arc::new(MemoryCoordinator::default());
    let late = Arc::new(Late::new(inner, latencies));
    let spec = LeaseSpec {
        node_id: "n1".into(),
        ttl,
        takeover_delay: Duration::ZERO,
        previous: None,
    };
    let id = late.open_lease(&spec).await.unwrap().lease;
    let lease = Arc::new(Lease::new(ttl));
    lease.adopt(&id, Instant::now());
    let stop = CancellationToken::new();
    let renewer = tokio::spawn(Election::renew_until(
        late.clone(),
        lease.clone(),
        ttl,
        Arc::new(Metrics::new(["Work"])),
        stop.clone(),
    ));
    Renewing {
        late,
        lease,
        id,
        stop,
        renewer,
    }
}

impl Renewing {
    async fn stop(self) {
        self.stop.cancel();
        self.renewer.await.unwrap();
    }
}

/// The least a lease kept by `renewing` had left for `span`: taken just before each move
/// of its deadline, when it is shortest. Panics if the lease went stale, or outlived the
/// coordinator's own end of it.
async fn least_left(renewing: &Renewing, span: Duration) -> Duration {
    let mut watch = renewing.lease.deadline_watch();
    let mut deadline = watch.borrow_and_update().expect("a fresh lease");
    let mut least = Duration::MAX;
    let end = Instant::now() + span;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(end) => break,
            changed = watch.changed() => changed.unwrap(),
        }
        let now = Instant::now();
        assert!(
            now < deadline,
            "the lease went stale {:?} after its deadline",
            now - deadline
        );
        least = least.min(deadline - now);
        deadline = watch.borrow_and_update().expect("a lease kept fresh");
        let coordinator_end = renewing.late.coordinator_end().unwrap();
        assert!(
            deadline <= coordinator_end,
            "the replica's deadline is past the coordinator's end"
        );
    }
    assert!(renewing.lease.is_fresh());
    least
}

/// With every keep-alive answered up to just below the bound late, for twenty TTLs, the
/// lease never goes stale and never has less than 2/3 × TTL − the latency left: it always
/// outlasts a run's kill sequence, so no run is stopped (4 s is the latency).
#[tokio::test(start_paused = true)]
async fn answers_late_within_the_bound_leave_the_lease_room_for_every_run() {
    let latencies = [
        Duration::ZERO,
        Duration::from_millis(2500),
        Duration::from_secs(4),
        bound() - TIMER_RESOLUTION * 5,
    ];
    for latency in latencies {
        let renewing = renewing(TTL, &[latency]).await;
        let least = least_left(&renewing, TTL * 20).await;
        assert!(
            least + TIMER_RESOLUTION * 2 >= TTL * 2 / 3 - latency,
            "{latency:?} late: {least:?} left"
        );
        assert!(
            least > headroom(),
            "{latency:?} late: {least:?} left, a run's kill sequence needs {:?}",
            headroom()
        );
        renewing.stop().await;
    }
}

/// Answers later than the bound (but within 2/3 of a TTL) keep the lease, yet leave it
/// less than a run's kill sequence needs: the bound is exact.
#[tokio::test(start_paused = true)]
async fn answers_later_than_the_bound_leave_too_little_for_a_run() {
    let latency = bound() + Duration::from_millis(10);
    let renewing = renewing(TTL, &[latency]).await;
    let least = least_left(&renewing, TTL * 20).await;
    assert!(least < headroom(), "{least:?} left");
    assert!(
        least + TIMER_RESOLUTION * 2 >= TTL * 2 / 3 - latency,
        "{least:?} left"
    );
    renewing.stop().await;
}

/// Answers later than 2/3 of a TTL let the lease go stale at the replica, a TTL after the
/// last send acknowledged, while the coordinator, which gets every keep-alive on time,
/// still honours it.
#[tokio::test(start_paused = true)]
async fn answers_later_than_two_thirds_of_a_ttl_leave_the_lease_stale_before_the_coordinator_ends_it(
) {
    let start = Instant::now();
    let renewing = renewing(TTL, &[Duration::from_secs(7)]).await;
    renewing.lease.expired().await;
    let stale = Instant::now();
    // No answer came before the first deadline: the first is in at TTL/3 + 7 s.
    assert_eq!(stale - start, TTL);
    let coordinator_end = renewing.late.coordinator_end().unwrap();
    assert!(
        coordinator_end > stale,
        "the coordinator ends the lease {:?} before the replica saw it stale",
        stale - coordinator_end
    );
    assert_eq!(
        renewing.late.inner.keep_alive(&renewing.id).await,
        Ok(Renewal::Alive)
    );
    renewing.stop().await;
}

/// The first answer that the lease is gone marks it lost at once, and an answer of
/// `Alive` to a keep-alive sent before the loss, arriving after it, does not bring it back.
#[tokio::test(start_paused = true)]
async fn the_first_answer_that_the_lease_is_gone_marks_it_lost_for_good() {
    // TTL 9 s: keep-alives at 3 s (answered at 4 s), 6 s (answered at 11 s), 9 s (at 10 s).
    let ttl = Duration::from_secs(9);
    let start = Instant::now();
    let latencies = [
        Duration::from_secs(1),
        Duration::from_secs(5),
        Duration::from_secs(1),
    ];
    let renewing = renewing(ttl, &latencies).await;
    tokio::time::sleep_until(start + Duration::from_millis(7500)).await;
    renewing.late.inner.expire_lease(&renewing.id).unwrap();
    tokio::time::sleep_until(start + Duration::from_millis(9500)).await;
    assert_eq!(renewing.lease.id(), Some(renewing.id.clone()));
    tokio::time::sleep_until(start + Duration::from_millis(10_500)).await;
    assert_eq!(renewing.lease.id(), None, "not lost at the first Gone");
    tokio::time::sleep_until(start + Duration::from_millis(11_500)).await;
    assert_eq!(renewing.lease.id(), None, "a late Alive brought it back");
    assert!(!renewing.lease.is_fresh());
    renewing.stop().await;
}

/// A keep-alive that fails is followed by another a tenth of the TTL later, not a third.
#[tokio::test(start_paused = true)]
async fn a_failed_keep_alive_is_retried_soon() {
    let ttl = Duration::from_secs(9);
    let start = Instant::now();
    let renewing = renewing(ttl, &[Duration::ZERO]).await;
    let mut watch = renewing.lease.deadline_watch();
    watch.borrow_and_update();
    tokio::time::sleep_until(start + Duration::from_millis(2500)).await;
    renewing.late.inner.set_unavailable(true);
    tokio::time::sleep_until(start + Duration::from_millis(3500)).await;
    renewing.late.inner.set_unavailable(false);
    watch.changed().await.unwrap();
    assert_eq!(
        *watch.borrow_and_update(),
        Some(start + Duration::from_millis(3900) + ttl),
        "not renewed at the retry"
    );
    renewing.stop().await;
}

/// A coordinator that takes keep-alives and never answers has at most a TTL's worth of
/// them, plus one, waiting at once; each is given up after a TTL and the lease goes stale.
#[tokio::test(start_paused = true)]
async fn keep_alives_never_answered_are_bounded_and_given_up_after_a_ttl() {
    let renewing = renewing(TTL, &[Duration::from_secs(3600)]).await;
    tokio::time::sleep(TTL * 10).await;
    assert!(!renewing.lease.is_fresh());
    let most = renewing.late.most_waiting.load(Ordering::SeqCst);
    assert!(most <= IN_FLIGHT_MAX, "{most} waiting at once");
    let sent = renewing.late.calls.load(Ordering::SeqCst);
    assert!(sent >= 20, "only {sent} keep-alives in ten TTLs");
    renewing.stop().await;
}
