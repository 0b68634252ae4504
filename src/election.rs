//! Leadership: the replica's session (created, reused after a quick restart, renewed,
//! destroyed), its TTL health check, and contending for the leader key.
//!
//! Session and check are named after the node id (`leaderq:<node-id>`, see `identity.rs`),
//! so a restarted replica finds both again. It reuses the session its data dir names only
//! if that session is still its own: same name, bound to its check, same TTL. If the reused
//! session still holds the leader key, the replica takes the key again (release and acquire
//! in one transaction), so its fencing token is higher than any an earlier run handed out.
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
use crate::consul::{
    self, AgentCheck, Client, PutMode, QueryOptions, SessionInfo, SessionRequest, TxnOp,
    TxnOutcome, WatchIndex,
};
use crate::observe::Metrics;
use crate::task::rfc3339;
use crate::util::duration;

/// After a failed renewal, try again this soon rather than a full TTL/3 later: at most a
/// second, and a tenth of the TTL for short ones, so that one failed renewal (a Consul
/// restart) is made up before the handlers' kill schedule, which starts kill_grace plus a
/// tenth of the TTL before the lease's deadline, gives up on the lease.
const RENEW_RETRY_MAX: Duration = Duration::from_secs(1);

fn renew_retry(ttl: Duration) -> Duration {
    (ttl / 10).min(RENEW_RETRY_MAX)
}

#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error(transparent)]
    Consul(#[from] consul::Error),
    #[error("session {0} is gone")]
    SessionLost(String),
    /// A setting the server refuses, so retrying cannot help: the replica stops.
    #[error("{0}")]
    Refused(String),
}

/// What a restarted replica does with the session its data dir names.
#[derive(Debug, PartialEq, Eq)]
pub enum PreviousSession {
    /// Alive, named after this node, bound to its check, with the TTL it would ask for now.
    Reuse,
    /// This node's, but not what it would create now (health check or TTL changed): give up
    /// the leader key it may hold and destroy it, then create a new one.
    Replace(&'static str),
    /// Gone, or another node's: leave it alone and create a new one.
    Ignore(&'static str),
}

/// Judges the session a restart found (`info`, `None` when the server no longer knows it)
/// against the one this replica would create now (`wanted`).
pub fn judge_previous_session(
    info: Option<&SessionInfo>,
    wanted: &SessionRequest,
) -> PreviousSession {
    let Some(info) = info else {
        return PreviousSession::Ignore("it is gone");
    };
    if info.name != wanted.name {
        return PreviousSession::Ignore("it belongs to another node id");
    }
    let mut bound: Vec<&str> = info
        .node_checks
        .iter()
        .chain(&info.checks)
        .map(String::as_str)
        .collect();
    bound.sort_unstable();
    bound.dedup();
    let mut checks: Vec<&str> = wanted.node_checks.iter().map(String::as_str).collect();
    checks.sort_unstable();
    if bound != checks {
        return PreviousSession::Replace("it is not bound to this replica's checks");
    }
    let ttl = |text: &str| duration::parse(text).ok();
    if ttl(&info.ttl).is_none() || ttl(&info.ttl) != ttl(&wanted.ttl) {
        return PreviousSession::Replace("its TTL is not election.session_ttl");
    }
    PreviousSession::Reuse
}

/// The pid in a check id `leaderq:<host>-<pid>`, the default node id of versions before
/// node ids were kept in the data dir, when `<host>` is `hostname`.
pub fn old_style_check_pid(check_id: &str, hostname: &str) -> Option<u32> {
    let pid = check_id
        .strip_prefix("leaderq:")?
        .strip_prefix(hostname)?
        .strip_prefix('-')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// What to do about a check that looks like an older version's replica on this host, given
/// whether its pid runs here (`None`: cannot tell).
#[derive(Debug, PartialEq, Eq)]
pub enum StaleCheck {
    /// Critical and its process gone: nothing will pass it again.
    Deregister,
    /// Critical, yet a process with its pid runs here (maybe another one that got the pid):
    /// leave it and say so.
    Report,
    /// Passing: a live replica passes it, an older one or one whose configured node id
    /// only looks like `<host>-<pid>`. A dead one's check goes critical within its TTL and
    /// is removed by a later start.
    Leave,
}

pub fn judge_stale_check(check: &AgentCheck, alive: Option<bool>) -> StaleCheck {
    match (check.status.as_str(), alive) {
        ("critical", Some(false)) => StaleCheck::Deregister,
        ("critical", _) => StaleCheck::Report,
        _ => StaleCheck::Leave,
    }
}

/// Whether process `pid` runs on this host, read from /proc; `None` without a /proc.
fn process_alive(pid: u32) -> Option<bool> {
    let proc = std::path::Path::new("/proc");
    if !proc.join("self").exists() {
        return None;
    }
    Some(proc.join(pid.to_string()).exists())
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
        let request = self.session_request();
        if !self.tried_persisted {
            self.tried_persisted = true;
            if let Some(previous) = self.reusable_session(&request).await? {
                return Ok(previous);
            }
        }
        let sent_at = Instant::now();
        let session = match self.client.session_create(&request).await {
            Ok(session) => session,
            // Consul refuses a TTL outside [session_ttl_min, 24h] with this text; no retry
            // can fix that, only the setting.
            Err(consul::Error::Status { code: 500, body }) if body.contains("Session TTL") => {
                return Err(ElectionError::Refused(format!(
                    "election.session_ttl = \"{}\" is refused by Consul ({}): set it within the server's limits (on Consul at least 10s unless its session_ttl_min is lower, at most 24h)",
                    request.ttl,
                    body.trim()
                )));
            }
            Err(err) => return Err(err.into()),
        };
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

    /// The session this replica creates: named after its node, bound to its check.
    fn session_request(&self) -> SessionRequest {
        let mut node_checks = vec!["serfHealth".to_string()];
        if self.settings.health_check {
            node_checks.push(self.check_id.clone());
        }
        SessionRequest {
            name: format!("leaderq:{}", self.node_id),
            ttl: duration::format(self.settings.session_ttl),
            lock_delay: duration::format(self.settings.lock_delay),
            behavior: "release".into(),
            node_checks,
        }
    }

    /// The session the data dir names, renewed and adopted, if it is still this replica's
    /// own (see `judge_previous_session`); a session of this node that no longer fits is
    /// released and destroyed rather than left to hold the leader key until it expires.
    async fn reusable_session(
        &mut self,
        wanted: &SessionRequest,
    ) -> Result<Option<String>, ElectionError> {
        let Ok(previous) = std::fs::read_to_string(&self.session_file) else {
            return Ok(None);
        };
        let previous = previous.trim();
        if previous.is_empty() {
            return Ok(None);
        }
        let info = self.client.session_info(previous).await?;
        match judge_previous_session(info.as_ref(), wanted) {
            PreviousSession::Reuse => {
                let sent_at = Instant::now();
                if self.client.session_renew(previous).await?.is_some() {
                    tracing::info!(
                        session = previous,
                        "reusing the session from before the restart"
                    );
                    self.lease.adopt(previous, sent_at);
                    return Ok(Some(previous.to_string()));
                }
            }
            PreviousSession::Replace(reason) => {
                tracing::info!(
                    session = previous,
                    reason,
                    "replacing the session from before the restart"
                );
                if let Err(err) = self.release(previous).await {
                    tracing::warn!(error = %err, "cannot release the leader key from the old session");
                }
                if let Err(err) = self.client.session_destroy(previous).await {
                    tracing::warn!(session = previous, error = %err, "cannot destroy the old session; Consul will expire it");
                }
            }
            PreviousSession::Ignore(reason) => {
                tracing::info!(
                    session = previous,
                    reason,
                    "not reusing the session from before the restart"
                );
            }
        }
        Ok(None)
    }

    /// Deregisters the checks that replicas of older versions on this host left behind
    /// (`leaderq:<host>-<pid>`, their default node id) once they are critical and their
    /// process is gone: nothing passes them any more, so they would stay critical for ever.
    /// A critical one whose pid runs here is only reported: the pid may have been reused.
    /// Failures are logged; they do not stop the start.
    pub async fn remove_stale_checks(&self) {
        let checks = match self.client.agent_checks().await {
            Ok(checks) => checks,
            Err(err) => {
                tracing::warn!(error = %err, "cannot list the agent's checks to remove stale ones");
                return;
            }
        };
        let host = crate::config::hostname();
        for (id, check) in &checks {
            let Some(pid) = old_style_check_pid(id, &host) else {
                continue;
            };
            if *id == self.check_id {
                continue;
            }
            match judge_stale_check(check, process_alive(pid)) {
                StaleCheck::Deregister => match self.client.check_deregister(id).await {
                    Ok(()) => {
                        tracing::info!(check = %id, status = %check.status, "deregistered the check of an older replica whose process is gone")
                    }
                    Err(err) => {
                        tracing::warn!(check = %id, error = %err, "cannot deregister a stale check")
                    }
                },
                StaleCheck::Report => {
                    tracing::warn!(check = %id, pid, "a critical check of an older replica is left: a process with its pid runs on this host; if no leaderq replica runs as pid {pid}, deregister it (PUT /v1/agent/check/deregister/{id})")
                }
                StaleCheck::Leave => {}
            }
        }
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
        let retry = renew_retry(settings.session_ttl);
        let mut next = Instant::now() + period;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
            }
            let Some(session) = lease.session() else {
                // Between sessions: the loop that creates the next one adopts it into the
                // lease; look again shortly.
                next = Instant::now() + retry;
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
                    next = Instant::now() + retry;
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
                    // Held by this very session: a restart reused it, or this run acquired
                    // the key and could not read it back. An earlier run may have handed
                    // out this LockIndex, so take the key again for a higher one.
                    let used = entry.lock_index;
                    match self.reacquire(&session).await? {
                        Some(fencing_token) if fencing_token > used => {
                            return Ok(Some(Leadership {
                                session,
                                fencing_token,
                            }));
                        }
                        // A server whose transaction kept LockIndex: release the key and
                        // acquire it on the next round like any free key.
                        Some(_) => self.release(&session).await?,
                        None => {}
                    }
                    index.reset();
                    continue;
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

    /// Releases and acquires again the leader key this session holds, in one transaction:
    /// the acquire of an unlocked key raises its LockIndex by one, a release sets no
    /// lock-delay, and no other replica can take the key in between. The new LockIndex, or
    /// `None` if the session no longer holds the key.
    async fn reacquire(&self, session: &str) -> Result<Option<u64>, ElectionError> {
        let key = self.settings.leader_key.clone();
        let value = self.holder_value(session);
        let ops = [
            TxnOp::Unlock {
                key: key.clone(),
                value: value.clone(),
                session: session.to_string(),
            },
            TxnOp::Lock {
                key: key.clone(),
                value,
                session: session.to_string(),
            },
        ];
        match self.client.txn(&ops).await? {
            TxnOutcome::Committed(entries) => Ok(entries
                .iter()
                .rev()
                .find(|entry| entry.key == key)
                .map(|entry| entry.lock_index)),
            TxnOutcome::RolledBack(errors) => {
                tracing::info!(
                    ?errors,
                    "the reused session lost the leader key before taking it again"
                );
                Ok(None)
            }
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

    fn wanted() -> SessionRequest {
        SessionRequest {
            name: "leaderq:web-1".into(),
            ttl: "15s".into(),
            lock_delay: "15s".into(),
            behavior: "release".into(),
            node_checks: vec!["serfHealth".into(), "leaderq:web-1".into()],
        }
    }

    fn info(name: &str, ttl: &str, node_checks: &[&str]) -> SessionInfo {
        SessionInfo {
            id: "s".into(),
            name: name.into(),
            ttl: ttl.into(),
            node_checks: node_checks.iter().map(|c| c.to_string()).collect(),
            checks: Vec::new(),
        }
    }

    /// A previous session is reused only while alive, named after this node and bound to
    /// exactly its checks with its TTL; one of this node's that does not fit is replaced;
    /// another node's (or one gone) is ignored.
    #[test]
    fn previous_session_is_reused_only_when_it_is_this_replicas_own() {
        let wanted = wanted();
        let own = ["serfHealth", "leaderq:web-1"];
        let judge = |info: Option<SessionInfo>| judge_previous_session(info.as_ref(), &wanted);
        assert_eq!(
            judge(Some(info("leaderq:web-1", "15s", &own))),
            PreviousSession::Reuse
        );
        // Go's formatting of the same TTL, and checks in another order, still fit.
        assert_eq!(
            judge(Some(info(
                "leaderq:web-1",
                "15.000s",
                &["leaderq:web-1", "serfHealth"]
            ))),
            PreviousSession::Reuse
        );
        assert!(matches!(judge(None), PreviousSession::Ignore(_)));
        // The session of another process that shared the data dir, or of an old default
        // node id: not this node's.
        assert!(matches!(
            judge(Some(info(
                "leaderq:web-1-4242",
                "15s",
                &["serfHealth", "leaderq:web-1-4242"]
            ))),
            PreviousSession::Ignore(_)
        ));
        // Bound to a dead process's check, or to none while the health check is on.
        assert!(matches!(
            judge(Some(info(
                "leaderq:web-1",
                "15s",
                &["serfHealth", "leaderq:web-1-4242"]
            ))),
            PreviousSession::Replace(_)
        ));
        assert!(matches!(
            judge(Some(info("leaderq:web-1", "15s", &["serfHealth"]))),
            PreviousSession::Replace(_)
        ));
        // Legacy `Checks` count as bindings too.
        let mut legacy = info("leaderq:web-1", "15s", &[]);
        legacy.checks = own.iter().map(|c| c.to_string()).collect();
        assert_eq!(judge(Some(legacy)), PreviousSession::Reuse);
        // The TTL changed since: the lease would be judged against the wrong TTL.
        assert!(matches!(
            judge(Some(info("leaderq:web-1", "30s", &own))),
            PreviousSession::Replace(_)
        ));
        assert!(matches!(
            judge(Some(info("leaderq:web-1", "", &own))),
            PreviousSession::Replace(_)
        ));
    }

    /// Only `leaderq:<this host>-<digits>` names an older replica's check on this host.
    #[test]
    fn old_style_check_ids_name_a_pid_on_this_host() {
        assert_eq!(
            old_style_check_pid("leaderq:web-1-4242", "web-1"),
            Some(4242)
        );
        assert_eq!(old_style_check_pid("leaderq:web-1-4242", "web-2"), None);
        assert_eq!(old_style_check_pid("leaderq:web-1-0000beef", "web-1"), None);
        assert_eq!(old_style_check_pid("leaderq:web-1-", "web-1"), None);
        assert_eq!(old_style_check_pid("leaderq:web-1", "web-1"), None);
        assert_eq!(old_style_check_pid("other:web-1-12", "web-1"), None);
        assert_eq!(
            old_style_check_pid("leaderq:web-1-99999999999", "web-1"),
            None
        );
    }

    /// A stale check goes once it is critical and its process gone; a critical one whose
    /// pid runs is reported; a passing one (a live replica passes it) is left alone.
    #[test]
    fn stale_checks_go_only_when_critical_and_their_process_is_gone() {
        let check = |status: &str| AgentCheck {
            name: "leaderq web-1-4242".into(),
            status: status.into(),
        };
        assert_eq!(
            judge_stale_check(&check("critical"), Some(false)),
            StaleCheck::Deregister
        );
        assert_eq!(
            judge_stale_check(&check("passing"), Some(false)),
            StaleCheck::Leave
        );
        assert_eq!(
            judge_stale_check(&check("warning"), Some(false)),
            StaleCheck::Leave
        );
        assert_eq!(
            judge_stale_check(&check("critical"), Some(true)),
            StaleCheck::Report
        );
        assert_eq!(
            judge_stale_check(&check("critical"), None),
            StaleCheck::Report
        );
        assert_eq!(
            judge_stale_check(&check("passing"), Some(true)),
            StaleCheck::Leave
        );
        assert_eq!(
            judge_stale_check(&check("passing"), None),
            StaleCheck::Leave
        );
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
