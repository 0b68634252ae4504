//! The replica's own view of its lease: fresh while the last successful keep-alive was
//! *sent* less than one TTL ago (the answer may come late; the coordinator counts from
//! when it received the request, which is no earlier). A leader that cannot say its lease
//! is fresh stops acting. The deadline is published for those who enforce it outside this
//! process (handler supervisors).
//!
//! A leadership can also end at the coordinator while the lease itself lives on (an
//! operator deleted or rewrote the leader record, another lease holds it): the term's
//! leadership watch then *deposes* the lease for the rest of the term. A deposed lease is
//! no longer fresh and wakes every `expired` waiter at once, but its deadline stays as it
//! was: the runs it started are stopped by request (SIGTERM, then SIGKILL after the kill
//! grace), and the lease's own deadline still bounds them.

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
    /// Why the current term's leadership ended at the coordinator, if it did.
    deposed: Option<String>,
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
            deposed: None,
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

    /// The leadership this lease won has ended at the coordinator (`reason` says how):
    /// nothing more may be done under it this term.
    pub fn depose(&self, reason: &str) {
        let mut state = self.lock();
        if state.deposed.is_none() {
            state.deposed = Some(reason.to_string());
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// Why this term's leadership ended at the coordinator, if it did.
    pub fn deposed(&self) -> Option<String> {
        self.lock().deposed.clone()
    }

    /// A new term begins on this lease: a deposition of an earlier one no longer counts.
    pub fn begin_term(&self) {
        self.lock().deposed = None;
    }

    /// Why the lease may not be acted on now: deposed, lost, or not renewed within its TTL.
    pub fn why_not_fresh(&self) -> String {
        self.deposed()
            .unwrap_or_else(|| "lease not renewed within its TTL".to_string())
    }

    /// Whether the lease is fresh and stays so for longer than `span` without another
    /// renewal: a run started now could still be stopped whole (SIGTERM, the kill grace,
    /// SIGKILL) before its supervisor's kill window would cut it.
    pub fn outlasts(&self, span: Duration) -> bool {
        if self.lock().deposed.is_some() {
            return false;
        }
        self.deadline()
            .is_some_and(|deadline| Instant::now() + span < deadline)
    }

    /// Waits until the lease outlasts `span` (`true`) or stops being fresh (`false`).
    pub async fn until_it_outlasts(&self, span: Duration) -> bool {
        loop {
            let notified = self.changed.notified();
            if self.outlasts(span) {
                return true;
            }
            if !self.is_fresh() {
                return false;
            }
            let Some(deadline) = self.deadline() else {
                return false;
            };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
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
        if self.lock().deposed.is_some() {
            return false;
        }
        self.deadline()
            .is_some_and(|deadline| Instant::now() < deadline)
    }

    /// Resolves once the lease is lost, deposed, or has not been renewed for a TTL.
    pub async fn expired(&self) {
        loop {
            let notified = self.changed.notified();
            if self.lock().deposed.is_some() {
                return;
            }
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

impl crate::observe::LeaseView for Lease {
    fn is_fresh(&self) -> bool {
        Lease::is_fresh(self)
    }

    fn id(&self) -> Option<LeaseId> {
        Lease::id(self)
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
            "another lease's renewal moved it"
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

    /// A deposed lease wakes `expired` at once and is not fresh, but keeps publishing its
    /// deadline (the runs are stopped by request, still bounded by it); a new term clears
    /// the deposition.
    #[tokio::test(start_paused = true)]
    async fn a_deposed_lease_ends_the_term_but_keeps_its_deadline() {
        let s = LeaseId("s".into());
        let ttl = Duration::from_secs(15);
        let lease = Arc::new(Lease::new(ttl));
        let start = Instant::now();
        lease.adopt(&s, start);
        let mut watch = lease.deadline_watch();
        watch.borrow_and_update();
        let waiter = {
            let lease = lease.clone();
            tokio::spawn(async move { lease.expired().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        lease.depose("the leader record was deleted");
        waiter.await.unwrap();
        assert!(!lease.is_fresh());
        assert!(!lease.outlasts(Duration::ZERO));
        assert_eq!(lease.why_not_fresh(), "the leader record was deleted");
        assert!(!watch.has_changed().unwrap(), "the deadline moved");
        assert_eq!(*watch.borrow(), Some(start + ttl));
        lease.begin_term();
        assert!(lease.is_fresh());
    }

    /// A lease outlasts a span only while its deadline is further away than that; waiting
    /// for room ends with a renewal (`true`) or the lease's expiry (`false`).
    #[tokio::test(start_paused = true)]
    async fn claims_need_a_lease_that_outlasts_the_kill_sequence() {
        let s = LeaseId("s".into());
        let lease = Arc::new(Lease::new(Duration::from_secs(15)));
        lease.adopt(&s, Instant::now());
        let span = Duration::from_secs(5);
        assert!(lease.outlasts(span));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!lease.outlasts(span));
        assert!(lease.is_fresh());
        let waiter = {
            let lease = lease.clone();
            tokio::spawn(async move { lease.until_it_outlasts(span).await })
        };
        tokio::time::advance(Duration::from_secs(1)).await;
        lease.renewed(&s, Instant::now());
        assert!(waiter.await.unwrap());
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!lease.until_it_outlasts(span).await);
    }
}
