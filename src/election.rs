//! Leadership: the replica's session (created, reused after a quick restart, renewed,
//! destroyed), its TTL health check, and contending for the leader key.
//!
//! The lease is the replica's own view of whether its session is alive: fresh while the
//! last successful renewal was *sent* less than one TTL ago. A leader that cannot say so
//! stops claiming. What the leader does with its leadership is `queue.rs`'s business.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ElectionSettings;
use crate::consul::{self, Client, PutMode, QueryOptions, SessionRequest, WatchIndex};
use crate::observe::Metrics;
use crate::server::duration;
use crate::task::rfc3339;

/// After a failed renewal, try again this soon rather than a full TTL/3 later.
const RENEW_RETRY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error(transparent)]
    Consul(#[from] consul::Error),
    #[error("session {0} is gone")]
    SessionLost(String),
}

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
    session: Option<String>,
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

    /// The session the lease is about, if it is believed alive.
    pub fn session(&self) -> Option<String> {
        let state = self.lock();
        state.session.clone().filter(|_| !state.lost)
    }

    fn adopt(&self, session: &str, renewed_at: Instant) {
        let mut state = self.lock();
        *state = LeaseState {
            session: Some(session.to_string()),
            renewed_at: Some(renewed_at),
            lost: false,
        };
        drop(state);
        self.announce();
    }

    /// Records a successful renewal sent at `sent_at` (not when the answer came).
    fn renewed(&self, session: &str, sent_at: Instant) {
        let mut state = self.lock();
        if state.session.as_deref() == Some(session) {
            state.renewed_at = Some(state.renewed_at.map_or(sent_at, |at| at.max(sent_at)));
        }
        drop(state);
        self.announce();
    }

    pub fn mark_lost(&self, session: &str) {
        let mut state = self.lock();
        if state.session.as_deref() == Some(session) {
            state.lost = true;
        }
        drop(state);
        self.announce();
    }

    fn forget(&self) {
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

/// A won election: what the leader needs to act and to prove it still leads.
#[derive(Clone, Debug)]
pub struct Leadership {
    pub session: String,
    /// The leader key's LockIndex after acquiring: grows with every new leader.
    pub fencing_token: u64,
}

pub struct Election {
    client: Arc<Client>,
    settings: ElectionSettings,
    node_id: String,
    check_id: String,
    session_file: PathBuf,
    lease: Arc<Lease>,
    /// Whether the persisted session id has been considered since start.
    tried_persisted: bool,
}

impl Election {
    pub fn new(
        client: Arc<Client>,
        settings: ElectionSettings,
        node_id: String,
        data_dir: PathBuf,
    ) -> Election {
        let lease = Arc::new(Lease::new(settings.session_ttl));
        Election {
            client,
            check_id: format!("leaderq:{node_id}"),
            session_file: data_dir.join("session"),
            node_id,
            settings,
            lease,
            tried_persisted: false,
        }
    }

    pub fn lease(&self) -> Arc<Lease> {
        self.lease.clone()
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn leader_key(&self) -> &str {
        &self.settings.leader_key
    }

    /// Makes sure the replica has a live session: the one it had before a quick restart if
    /// Consul still knows it, otherwise a new one bound to a fresh, passing TTL check.
    pub async fn ensure_session(&mut self) -> Result<String, ElectionError> {
        if let Some(session) = self.lease.session() {
            return Ok(session);
        }
        if self.settings.health_check {
            let notes =
                "passed by a leaderq replica while its loop is alive; its session dies with it";
            self.client
                .check_register(
                    &self.check_id,
                    &format!("leaderq {}", self.node_id),
                    self.settings.session_ttl,
                    notes,
                )
                .await?;
        }
        if !self.tried_persisted {
            self.tried_persisted = true;
            if let Ok(previous) = std::fs::read_to_string(&self.session_file) {
                let previous = previous.trim();
                let sent_at = Instant::now();
                if !previous.is_empty() && self.client.session_renew(previous).await?.is_some() {
                    tracing::info!(
                        session = previous,
                        "reusing the session from before the restart"
                    );
                    self.lease.adopt(previous, sent_at);
                    return Ok(previous.to_string());
                }
            }
        }
        let mut node_checks = vec!["serfHealth".to_string()];
        if self.settings.health_check {
            node_checks.push(self.check_id.clone());
        }
        let request = SessionRequest {
            name: format!("leaderq:{}", self.node_id),
            ttl: duration::format(self.settings.session_ttl),
            lock_delay: duration::format(self.settings.lock_delay),
            behavior: "release".into(),
            node_checks,
        };
        let sent_at = Instant::now();
        let session = self.client.session_create(&request).await?;
        if let Some(dir) = self.session_file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Err(err) = std::fs::write(&self.session_file, &session) {
            tracing::warn!(file = %self.session_file.display(), error = %err, "cannot persist the session id; a restart will not reuse it");
        }
        tracing::info!(session = %session, node = %self.node_id, "session created");
        self.lease.adopt(&session, sent_at);
        Ok(session)
    }

    /// Renews the session every TTL/3 (and passes the health check) until `stop`; a failed
    /// renewal is retried after a second. A session Consul no longer knows marks the lease
    /// lost, so the loops that depend on it notice at once.
    pub async fn renew_until(
        client: Arc<Client>,
        lease: Arc<Lease>,
        settings: ElectionSettings,
        check_id: String,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) {
        let period = settings.session_ttl / 3;
        let mut next = Instant::now() + period;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
            }
            let Some(session) = lease.session() else {
                // Between sessions: the loop that creates the next one adopts it into the
                // lease; look again shortly.
                next = Instant::now() + RENEW_RETRY;
                continue;
            };
            let sent_at = Instant::now();
            let renewed = client.session_renew(&session).await;
            if settings.health_check {
                if let Err(err) = client.check_pass(&check_id).await {
                    tracing::warn!(error = %err, "cannot pass the health check");
                }
            }
            match renewed {
                Ok(Some(_)) => {
                    metrics.renewed(sent_at.elapsed());
                    lease.renewed(&session, sent_at);
                    next = sent_at + period;
                }
                Ok(None) => {
                    tracing::warn!(session = %session, "session expired or was destroyed");
                    lease.mark_lost(&session);
                    next = Instant::now() + period;
                }
                Err(err) => {
                    metrics.consul_error(&err);
                    tracing::warn!(error = %err, "session renewal failed; retrying");
                    next = Instant::now() + RENEW_RETRY;
                }
            }
        }
    }

    pub fn check_id(&self) -> &str {
        &self.check_id
    }

    pub fn settings(&self) -> &ElectionSettings {
        &self.settings
    }

    fn holder_value(&self, session: &str) -> Vec<u8> {
        json!({
            "node": self.node_id,
            "host": crate::config::hostname(),
            "pid": std::process::id(),
            "session": session,
            "since": rfc3339(Utc::now()),
        })
        .to_string()
        .into_bytes()
    }

    /// Contends for the leader key until this replica holds it (`Some`) or `stop` fires
    /// (`None`). Followers wait on a blocking query and contest as soon as the key is
    /// missing or unlocked; a refused acquire on a free key (lock-delay) waits
    /// `retry_interval` before the next attempt.
    pub async fn campaign(
        &mut self,
        wait: Duration,
        stop: &CancellationToken,
    ) -> Result<Option<Leadership>, ElectionError> {
        let mut index = WatchIndex::default();
        let mut pacer = consul::Pacer::default();
        let mut deferred_to_previous = false;
        loop {
            let session = self.ensure_session().await?;
            pacer.sent();
            let options = QueryOptions {
                index: index.get(),
                wait: Some(wait),
            };
            let (entry, returned) = tokio::select! {
                _ = stop.cancelled() => return Ok(None),
                _ = self.lease.expired() => return Err(ElectionError::SessionLost(session)),
                read = self.client.kv_get(&self.settings.leader_key, options) => read?,
            };
            let moved = index.update(returned);
            match &entry {
                Some(entry) if entry.session.as_deref() == Some(session.as_str()) => {
                    // Still ours: a restart reused the session that holds the key.
                    return Ok(Some(Leadership {
                        session,
                        fencing_token: entry.lock_index,
                    }));
                }
                Some(entry) if entry.session.is_some() => {
                    pacer.settle(moved || options.index == 0).await;
                    continue;
                }
                _ => {}
            }
            let grace = self.settings.prefer_previous_leader;
            if !grace.is_zero() && !deferred_to_previous {
                deferred_to_previous = true;
                let previous = entry
                    .as_ref()
                    .and_then(|e| serde_json::from_slice::<Value>(&e.value).ok())
                    .and_then(|v| v.get("node").and_then(Value::as_str).map(str::to_string));
                if previous.is_some_and(|node| node != self.node_id) {
                    tracing::info!(grace = %duration::format(grace), "deferring to the previous leader");
                    tokio::select! {
                        _ = stop.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(grace) => {}
                    }
                    index.reset();
                    continue;
                }
            }
            let value = self.holder_value(&session);
            let acquired = match self
                .client
                .kv_put(
                    &self.settings.leader_key,
                    &value,
                    PutMode::Acquire(session.clone()),
                )
                .await
            {
                Ok(acquired) => acquired,
                Err(consul::Error::Status { code: 500, body })
                    if body.contains("invalid session") =>
                {
                    self.lease.mark_lost(&session);
                    return Err(ElectionError::SessionLost(session));
                }
                Err(err) => return Err(err.into()),
            };
            if acquired {
                let (entry, _) = self
                    .client
                    .kv_get(&self.settings.leader_key, QueryOptions::default())
                    .await?;
                if let Some(entry) =
                    entry.filter(|e| e.session.as_deref() == Some(session.as_str()))
                {
                    return Ok(Some(Leadership {
                        session,
                        fencing_token: entry.lock_index,
                    }));
                }
                // Lost it again between the acquire and the read (session invalidated).
                index.reset();
                continue;
            }
            // Refused. Either another replica won the race (then wait on it, at once) or
            // the key is free but under lock-delay (then try again after a pause).
            let (entry, returned) = self
                .client
                .kv_get(&self.settings.leader_key, QueryOptions::default())
                .await?;
            if entry.is_some_and(|e| e.session.is_some()) {
                index = WatchIndex::default();
                index.update(returned);
                continue;
            }
            tokio::select! {
                _ = stop.cancelled() => return Ok(None),
                _ = tokio::time::sleep(self.settings.retry_interval) => {}
            }
            index.reset();
        }
    }

    /// Gives up the leader key (a release, so no lock-delay applies) if this session holds it.
    pub async fn release(&self, session: &str) -> Result<(), ElectionError> {
        let value = self.holder_value(session);
        self.client
            .kv_put(
                &self.settings.leader_key,
                &value,
                PutMode::Release(session.to_string()),
            )
            .await?;
        Ok(())
    }

    /// Destroys the session (releasing whatever it still holds) and forgets it, so that the
    /// next `ensure_session` creates a new one.
    pub async fn drop_session(&mut self) {
        // Also a session believed lost: destroying it again is harmless, and if Consul
        // still has it this frees its locks at once.
        let session = self.lease.lock().session.clone();
        if let Some(session) = session {
            if let Err(err) = self.client.session_destroy(&session).await {
                tracing::warn!(session = %session, error = %err, "cannot destroy the session; Consul will expire it");
            }
        }
        self.lease.forget();
        let _ = std::fs::remove_file(&self.session_file);
    }

    /// Leaves for good: releases the key, destroys the session, deregisters the check.
    pub async fn resign(&mut self) {
        if let Some(session) = self.lease.session() {
            if let Err(err) = self.release(&session).await {
                tracing::warn!(error = %err, "cannot release the leader key");
            }
        }
        self.drop_session().await;
        if self.settings.health_check {
            if let Err(err) = self.client.check_deregister(&self.check_id).await {
                tracing::warn!(error = %err, "cannot deregister the health check");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lease is fresh for one TTL after the renewal was sent, and not after a loss.
    #[tokio::test(start_paused = true)]
    async fn lease_freshness_follows_renewals() {
        let lease = Lease::new(Duration::from_secs(15));
        assert!(!lease.is_fresh());
        lease.adopt("s", Instant::now());
        assert!(lease.is_fresh());
        tokio::time::advance(Duration::from_secs(10)).await;
        lease.renewed("s", Instant::now());
        tokio::time::advance(Duration::from_secs(14)).await;
        assert!(lease.is_fresh());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!lease.is_fresh());
        lease.renewed("other", Instant::now());
        assert!(!lease.is_fresh());
        lease.renewed("s", Instant::now());
        assert!(lease.is_fresh());
        lease.mark_lost("s");
        assert!(!lease.is_fresh());
        assert_eq!(lease.session(), None);
    }

    /// The deadline watch follows adoption, renewals and loss: what handler supervisors
    /// enforce.
    #[tokio::test(start_paused = true)]
    async fn deadline_watch_follows_the_lease() {
        let ttl = Duration::from_secs(15);
        let lease = Lease::new(ttl);
        let mut watch = lease.deadline_watch();
        assert_eq!(*watch.borrow(), None);
        let start = Instant::now();
        lease.adopt("s", start);
        assert!(watch.has_changed().unwrap());
        assert_eq!(*watch.borrow_and_update(), Some(start + ttl));
        tokio::time::advance(Duration::from_secs(5)).await;
        lease.renewed("s", Instant::now());
        assert_eq!(
            *watch.borrow_and_update(),
            Some(start + Duration::from_secs(20))
        );
        lease.renewed("other", Instant::now() + Duration::from_secs(1));
        assert!(
            !watch.has_changed().unwrap(),
            "another session's renewal moved it"
        );
        lease.mark_lost("s");
        assert_eq!(*watch.borrow_and_update(), None);
    }

    /// `expired` resolves when the TTL passes without a renewal, not before.
    #[tokio::test(start_paused = true)]
    async fn lease_expiry_wakes_waiters() {
        let lease = Arc::new(Lease::new(Duration::from_secs(15)));
        lease.adopt("s", Instant::now());
        let waiter = {
            let lease = lease.clone();
            tokio::spawn(async move { lease.expired().await })
        };
        tokio::time::advance(Duration::from_secs(10)).await;
        lease.renewed("s", Instant::now());
        tokio::time::advance(Duration::from_secs(10)).await;
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        tokio::time::advance(Duration::from_secs(6)).await;
        waiter.await.unwrap();
    }
}
