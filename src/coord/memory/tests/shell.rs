//! The async shell on tokio's paused clock: waiters woken by changes and by lease
//! deadlines, the unavailable and expiry hooks.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{secs, spec};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::{Campaign, CoordError, Coordinator, HolderRecord, LeaseId, Renewal, Version};

pub(super) fn shared() -> Arc<MemoryCoordinator> {
    Arc::new(MemoryCoordinator::default())
}

async fn shell_lease(coord: &MemoryCoordinator, node: &str, takeover_delay: u64) -> LeaseId {
    coord
        .open_lease(&spec(node, 10, takeover_delay))
        .await
        .unwrap()
        .lease
}

/// A waiter on the holder wakes when the holder's lease expires, with no other call to
/// notice it, at the lease's deadline.
#[tokio::test(start_paused = true)]
async fn an_observer_wakes_when_the_holders_lease_expires() {
    let coord = shared();
    let a = shell_lease(&coord, "a", 0).await;
    coord.campaign(&a, &HolderRecord::default()).await.unwrap();
    let (_, version) = coord.observe(Version(0), Duration::ZERO).await.unwrap();
    let started = Instant::now();
    let (holder, moved) = coord.observe(version, secs(100)).await.unwrap();
    assert_eq!(holder.lease, None);
    assert!(moved > version);
    assert_eq!(started.elapsed(), secs(10));
}

/// A list waits for the wait when nothing changes and answers at once on a write.
#[tokio::test(start_paused = true)]
async fn a_list_waits_for_a_change_or_the_wait() {
    let coord = shared();
    let (_, version) = coord.list("q/", Version(0), secs(5)).await.unwrap();
    let started = Instant::now();
    let (_, same) = coord.list("q/", version, secs(5)).await.unwrap();
    assert_eq!((same, started.elapsed()), (version, secs(5)));
    let waiter = {
        let coord = coord.clone();
        tokio::spawn(async move { coord.list("q/", version, secs(100)).await })
    };
    tokio::time::sleep(secs(1)).await;
    coord.put("q/1", b"one").unwrap();
    let (tasks, moved) = waiter.await.unwrap().unwrap();
    assert_eq!((tasks.len(), moved > version), (1, true));
    assert_eq!(started.elapsed(), secs(6));
}

/// While unavailable every call answers `Unavailable`, a waiter already blocked too; time
/// goes on meanwhile, so a lease not kept alive ends.
#[tokio::test(start_paused = true)]
async fn unavailable_answers_every_call_and_time_goes_on() {
    let coord = shared();
    let a = shell_lease(&coord, "a", 0).await;
    let (_, version) = coord.observe(Version(0), Duration::ZERO).await.unwrap();
    let waiter = {
        let coord = coord.clone();
        tokio::spawn(async move { coord.observe(version, secs(100)).await })
    };
    tokio::time::sleep(secs(1)).await;
    coord.set_unavailable(true);
    assert!(matches!(
        waiter.await.unwrap(),
        Err(CoordError::Unavailable(_))
    ));
    assert!(matches!(
        coord.keep_alive(&a).await,
        Err(CoordError::Unavailable(_))
    ));
    assert!(matches!(
        coord.list("", Version(0), Duration::ZERO).await,
        Err(CoordError::Unavailable(_))
    ));
    tokio::time::sleep(secs(10)).await;
    coord.set_unavailable(false);
    assert_eq!(coord.keep_alive(&a).await, Ok(Renewal::Gone));
}

/// `expire_lease` frees leadership at once, under the lease's lock-delay.
#[tokio::test(start_paused = true)]
async fn the_expire_hook_frees_leadership_under_lock_delay() {
    let coord = shared();
    let a = shell_lease(&coord, "a", 2).await;
    let b = shell_lease(&coord, "b", 0).await;
    coord.campaign(&a, &HolderRecord::default()).await.unwrap();
    coord.expire_lease(&a).unwrap();
    let record = HolderRecord::default();
    assert_eq!(coord.campaign(&b, &record).await, Ok(Campaign::Delayed));
    tokio::time::sleep(secs(2)).await;
    assert!(matches!(
        coord.campaign(&b, &record).await,
        Ok(Campaign::Won(_))
    ));
}

/// A wait longer than Consul's cap (even `Duration::MAX`) waits the cap, 10 minutes.
#[tokio::test(start_paused = true)]
async fn a_wait_is_capped_at_ten_minutes() {
    let coord = shared();
    let (_, version) = coord.list("q/", Version(0), Duration::ZERO).await.unwrap();
    let started = Instant::now();
    coord.list("q/", version, Duration::MAX).await.unwrap();
    assert_eq!(started.elapsed(), secs(600));
}
