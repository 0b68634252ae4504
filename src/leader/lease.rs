//! The replica's own view of its lease: fresh while the last successful keep-alive was
//! *sent* less than one TTL ago (the answer may come late; the coordinator counts from
//! when it received the request, which is no earlier). A leader that cannot say its lease
//! is fresh stops acting. The deadline is published for those who enforce it outside this
//! process (handler supervisors).

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::coord::LeaseId;

/// Shared between the renewer and whoever needs to know the lease is still good.
pub struct Lease {
    ttl: Duration,
    state: Mutex<LeaseState>,
    changed: Notify,
    /// The deadline as it moves, for those who enforce it outside this process (handler
    /// supervisors).
    deadline: watch::Sender<Option<Instant>>,
}

#[derive(Default)]
struct LeaseState {
    lease: Option<LeaseId>,
    renewed_at: Option<Instant>,
    lost: bool,
}

impl Lease {
    pub fn new(ttl: Duration) -> Lease {
        Lease {
            ttl,
            state: Mutex::new(LeaseState::default()),
            changed: Notify::new(),
            deadline: watch::Sender::new(None),
        }
    }

    /// Wakes the waiters and publishes the deadline after every change of state.
    fn announce(&self) {
        let deadline = self.deadline();
        self.deadline.send_if_modified(|published| {
            let moved = *published != deadline;
            *published = deadline;
            moved
        });
        self.changed.notify_waiters();
    }

    /// Follows the lease deadline: when the lease stops being fresh unless renewed again;
    /// `None` while there is no fresh lease.
    pub fn deadline_watch(&self) -> watch::Receiver<Option<Instant>> {
        self.deadline.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LeaseState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The lease's id, also when it is believed lost (to revoke it).
    pub(crate) fn held(&self) -> Option<LeaseId> {
        self.lock().lease.clone()
    }

    /// The lease's id, while it is believed alive.
    pub fn id(&self) -> Option<LeaseId> {
        let state = self.lock();
        state.lease.clone().filter(|_| !state.lost)
    }

    pub(crate) fn adopt(&self, lease: &LeaseId, renewed_at: Instant) {
        let mut state = self.lock();
        *state = LeaseState {
            lease: Some(lease.clone()),
            renewed_at: Some(renewed_at),
            lost: false,
        };
        drop(state);
        self.announce();
    }

    /// Records a successful renewal sent at `sent_at` (not when the answer came).
    pub(crate) fn renewed(&self, lease: &LeaseId, sent_at: Instant) {
        let mut state = self.lock();
        if state.lease.as_ref() == Some(lease) {
            state.renewed_at = Some(state.renewed_at.map_or(sent_at, |at| at.max(sent_at)));
        }
        drop(state);
        self.announce();
    }

    pub fn mark_lost(&self, lease: &LeaseId) {
        let mut state = self.lock();
        if state.lease.as_ref() == Some(lease) {
            state.lost = true;
        }
        drop(state);
        self.announce();
    }

    pub(crate) fn forget(&self) {
        *self.lock() = LeaseState::default();
        self.announce();
    }

    /// When the lease stops being fresh, if nothing renews it.
    fn deadline(&self) -> Option<Instant> {
        let state = self.lock();
        if state.lost {
            return None;
        }
        state.renewed_at.map(|at| at + self.ttl)
    }

    pub fn is_fresh(&self) -> bool {
        self.deadline()
            .is_some_and(|deadline| Instant::now() < deadline)
    }

    /// Resolves once the lease is lost or has not been renewed for a TTL.
    pub async fn expired(&self) {
        loop {
            let notified = self.changed.notified();
            match self.deadline() {
                None => return,
                Some(deadline) if Instant::now() >= deadline => return,
                Some(deadline) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(deadline) => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// The lease is fresh for one TTL after the renewal was sent, and not after a loss.
    #[tokio::test(start_paused = true)]
    async fn lease_freshness_follows_renewals() {
        let s = LeaseId("s".into());
        let lease = Lease::new(Duration::from_secs(15));
        assert!(!lease.is_fresh());
        lease.adopt(&s, Instant::now());
        assert!(lease.is_fresh());
        tokio::time::advance(Duration::from_secs(10)).await;
        lease.renewed(&s, Instant::now());
        tokio::time::advance(Duration::from_secs(14)).await;
        assert!(lease.is_fresh());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!lease.is_fresh());
        lease.renewed(&LeaseId("other".into()), Instant::now());
        assert!(!lease.is_fresh());
        lease.renewed(&s, Instant::now());
        assert!(lease.is_fresh());
        lease.mark_lost(&s);
        assert!(!lease.is_fresh());
        assert_eq!(lease.id(), None);
    }

    /// The deadline watch follows adoption, renewals and loss: what handler supervisors
    /// enforce.
    #[tokio::test(start_paused = true)]
    async fn deadline_watch_follows_the_lease() {
        let s = LeaseId("s".into());
        let ttl = Duration::from_secs(15);
        let lease = Lease::new(ttl);
        let mut watch = lease.deadline_watch();
        assert_eq!(*watch.borrow(), None);
        let start = Instant::now();
        lease.adopt(&s, start);
        assert!(watch.has_changed().unwrap());
        assert_eq!(*watch.borrow_and_update(), Some(start + ttl));
        tokio::time::advance(Duration::from_secs(5)).await;
        lease.renewed(&s, Instant::now());
        assert_eq!(
            *watch.borrow_and_update(),
            Some(start + Duration::from_secs(20))
        );
        lease.renewed(
            &LeaseId("other".into()),
            Instant::now() + Duration::from_secs(1),
        );
        assert!(
            !watch.has_changed().unwrap(),
            "another session's renewal moved it"
        );
        lease.mark_lost(&s);
        assert_eq!(*watch.borrow_and_update(), None);
    }

    /// `expired` resolves when the TTL passes without a renewal, not before.
    #[tokio::test(start_paused = true)]
    async fn lease_expiry_wakes_waiters() {
        let s = LeaseId("s".into());
        let lease = Arc::new(Lease::new(Duration::from_secs(15)));
        lease.adopt(&s, Instant::now());
        let waiter = {
            let lease = lease.clone();
            tokio::spawn(async move { lease.expired().await })
        };
        tokio::time::advance(Duration::from_secs(10)).await;
        lease.renewed(&s, Instant::now());
        tokio::time::advance(Duration::from_secs(10)).await;
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        tokio::time::advance(Duration::from_secs(6)).await;
        waiter.await.unwrap();
    }
}
