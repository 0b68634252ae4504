//! [`Leases`] as Consul sessions: open (remove what older versions left, take up the
//! previous session only if it is still this node's own, else create one bound to the
//! node's TTL check), keep alive (renew and pass the check, side by side), revoke
//! (destroy), close (release the leader key, destroy, deregister), and announce the
//! replica in Consul's catalog (`registration.rs`).
//!
//! Session and check are named after the node id (`leaderq:<node-id>`), so a restarted
//! replica finds both again; what to do with what earlier runs left is judged in
//! `leftovers.rs`. Whether the lease is fresh enough to act on is the caller's
//! judgement (from when its keep-alives were sent); this file only asks Consul.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;

use crate::coord::consul::client::{self as consul, PutMode, QueryOptions, SessionRequest};
use crate::coord::{Announcement, CoordError, Grant, LeaseId, LeaseSpec, Leases, Renewal, Role};
use crate::util::duration;

use super::layout::check_id;
use super::leftovers::{
    judge_previous_session, judge_stale_check, old_style_check_pid, process_alive, PreviousSession,
    StaleCheck,
};
use super::{registration, ConsulCoordinator};

const CHECK_NOTES: &str =
    "passed by a leaderq replica while its loop is alive; its session dies with it";

/// The session a replica creates: named after its node, released (not deleted) when it
/// dies, bound to `serfHealth` and, given one, to the node's TTL `check`.
pub fn session_request(spec: &LeaseSpec, check: Option<&str>) -> SessionRequest {
    let mut node_checks = vec!["serfHealth".to_string()];
    node_checks.extend(check.map(str::to_string));
    SessionRequest {
        name: check_id(&spec.node_id),
        ttl: duration::format(spec.ttl),
        lock_delay: duration::format(spec.takeover_delay),
        behavior: "release".into(),
        node_checks,
    }
}

impl Leases for ConsulCoordinator {
    fn describe(&self) -> String {
        format!("Consul at {}", self.client.address())
    }

    /// On the first call, removes stale checks of older versions; registers the node's
    /// check (passing, so a session can be bound to it at once); takes up `spec.previous`
    /// if it is still this node's own; otherwise creates a session.
    async fn open_lease(&self, spec: &LeaseSpec) -> Result<Grant, CoordError> {
        let own_check = format!("{}{}", check_id(&spec.node_id), self.settings.check_suffix);
        if !self.stale_checks_looked_at.swap(true, Ordering::Relaxed) {
            self.remove_stale_checks(&own_check).await;
        }
        let check = self.settings.health_check.then_some(own_check);
        if let Some(check) = &check {
            self.client
                .check_register(
                    check,
                    &format!("leaderq {}", spec.node_id),
                    spec.ttl,
                    CHECK_NOTES,
                )
                .await?;
            self.tied().checks.insert(check.clone());
        }
        let request = session_request(spec, check.as_deref());
        if let Some(previous) = spec.previous.as_ref().filter(|p| !p.0.trim().is_empty()) {
            if self.take_up(previous, &request).await? {
                self.tied().leases.insert(previous.clone(), check);
                return Ok(Grant {
                    lease: previous.clone(),
                    reused: true,
                });
            }
        }
        let session = match self.client.session_create(&request).await {
            Ok(session) => session,
            // Consul refuses a TTL outside [session_ttl_min, 24h] with this text; no retry
            // can fix that, only the setting.
            Err(consul::Error::Status { code: 500, body }) if body.contains("Session TTL") => {
                return Err(CoordError::Refused(format!(
                    "election.lease_ttl = \"{}\" is refused by Consul ({}): set it within the server's limits (on Consul at least 10s unless its session_ttl_min is lower, at most 24h)",
                    request.ttl,
                    body.trim()
                )));
            }
            Err(err) => return Err(err.into()),
        };
        tracing::info!(session = %session, node = %spec.node_id, "session created");
        let lease = LeaseId(session);
        self.tied().leases.insert(lease.clone(), check);
        Ok(Grant {
            lease,
            reused: false,
        })
    }

    /// Renews the session and passes its check, side by side: one after the other, each
    /// answer late by `L` would delay the keep-alive's own answer, and the check's next
    /// pass, by twice that. A check that cannot be passed is logged, not fatal: the session
    /// lives while the renewals do, and the check's own TTL ends it if the passes keep
    /// failing.
    async fn keep_alive(&self, lease: &LeaseId) -> Result<Renewal, CoordError> {
        let check = self.tied().leases.get(lease).cloned().flatten();
        let pass = async {
            if let Some(check) = check {
                if let Err(err) = self.client.check_pass(&check).await {
                    tracing::warn!(error = %err, "cannot pass the health check");
                }
            }
        };
        let (renewed, ()) = tokio::join!(self.client.session_renew(&lease.0), pass);
        match renewed? {
            Some(_) => Ok(Renewal::Alive),
            None => {
                tracing::warn!(session = %lease, "session expired or was destroyed");
                Ok(Renewal::Gone)
            }
        }
    }

    /// Destroys the session; Consul releases what it held (lock-delay applies to the keys
    /// it still held, so resign first).
    async fn revoke(&self, lease: &LeaseId) -> Result<(), CoordError> {
        self.client.session_destroy(&lease.0).await?;
        self.forget(lease);
        Ok(())
    }

    /// Releases the leader key if `lease` still holds it (a release sets no lock-delay),
    /// destroys the session, and deregisters the checks no open lease of this coordinator
    /// is bound to. Every step is tried; the first failure is returned.
    async fn close(&self, lease: Option<&LeaseId>) -> Result<(), CoordError> {
        let mut first: Option<CoordError> = None;
        let mut failed = |err: CoordError, what: &str| {
            tracing::warn!(error = %err, "cannot {what}");
            first.get_or_insert(err);
        };
        if let Some(lease) = lease {
            if let Err(err) = self.release_leader_key(lease).await {
                failed(err, "release the leader key");
            }
            match self.client.session_destroy(&lease.0).await {
                Ok(()) => {}
                Err(err) => failed(err.into(), "destroy the session; Consul will expire it"),
            }
            self.forget(lease);
        }
        let unbound: Vec<String> = {
            let tied = self.tied();
            tied.checks
                .iter()
                .filter(|check| !tied.leases.values().any(|c| c.as_ref() == Some(*check)))
                .cloned()
                .collect()
        };
        for check in unbound {
            match self.client.check_deregister(&check).await {
                Ok(()) => {
                    self.tied().checks.remove(&check);
                }
                Err(err) => failed(err.into(), "deregister the health check"),
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Keeps the replica registered in Consul's catalog as `registration.rs` says, bound to
    /// its node's check when health checks are on, re-tagged as its role changes.
    fn announce(
        &self,
        replica: Announcement,
        roles: tokio::sync::watch::Receiver<Role>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Option<Pin<Box<dyn Future<Output = ()> + Send + 'static>>> {
        let check_id = check_id(&replica.node_id);
        let check = self.settings.health_check.then_some(check_id.as_str());
        let wanted = registration::registration(&replica, check, Role::Standby);
        Some(Box::pin(registration::keep_registered(
            self.client.clone(),
            wanted,
            roles,
            replica.lease_ttl / 3,
            stop,
        )))
    }
}

impl ConsulCoordinator {
    /// Whether `previous` was taken up (renewed) as this replica's lease. A session of this
    /// node that no longer fits is released and destroyed rather than left to hold the
    /// leader key until it expires.
    async fn take_up(
        &self,
        previous: &LeaseId,
        wanted: &SessionRequest,
    ) -> Result<bool, CoordError> {
        let info = self.client.session_info(&previous.0).await?;
        match judge_previous_session(info.as_ref(), wanted) {
            PreviousSession::Reuse => {
                if self.client.session_renew(&previous.0).await?.is_some() {
                    tracing::info!(
                        session = %previous,
                        "reusing the session from before the restart"
                    );
                    return Ok(true);
                }
            }
            PreviousSession::Replace(reason) => {
                tracing::info!(
                    session = %previous,
                    reason,
                    "replacing the session from before the restart"
                );
                if let Err(err) = self.release_leader_key(previous).await {
                    tracing::warn!(error = %err, "cannot release the leader key from the old session");
                }
                if let Err(err) = self.client.session_destroy(&previous.0).await {
                    tracing::warn!(session = %previous, error = %err, "cannot destroy the old session; Consul will expire it");
                }
            }
            PreviousSession::Ignore(reason) => {
                tracing::info!(
                    session = %previous,
                    reason,
                    "not reusing the session from before the restart"
                );
            }
        }
        Ok(false)
    }

    /// Deregisters the checks that replicas of older versions on this host left behind
    /// (`leaderq:<host>-<pid>`, their default node id) once they are critical and their
    /// process is gone: nothing passes them any more, so they would stay critical for ever.
    /// A critical one whose pid runs here is only reported: the pid may have been reused.
    /// Failures are logged; they do not stop the start.
    async fn remove_stale_checks(&self, own_check: &str) {
        let checks = match self.client.agent_checks().await {
            Ok(checks) => checks,
            Err(err) => {
                tracing::warn!(error = %err, "cannot list the agent's checks to remove stale ones");
                return;
            }
        };
        let host = crate::util::hostname();
        for (id, check) in &checks {
            let Some(pid) = old_style_check_pid(id, &host) else {
                continue;
            };
            if id == own_check {
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

    fn forget(&self, lease: &LeaseId) {
        let mut tied = self.tied();
        tied.leases.remove(lease);
        tied.records.remove(lease);
        tied.won_at.remove(lease);
    }

    /// Releases the leader key if `lease` holds it, writing back the holder record (the one
    /// this coordinator wrote, or the key's current value), so standbys still see who led
    /// last. A release sets no lock-delay. Whether it was released.
    pub(super) async fn release_leader_key(&self, lease: &LeaseId) -> Result<bool, CoordError> {
        let key = &self.settings.leader_key;
        let remembered = self.tied().records.get(lease).cloned();
        let value = match remembered {
            Some(value) => value,
            None => match self.client.kv_get(key, QueryOptions::default()).await? {
                (Some(entry), _) if entry.session.as_deref() == Some(lease.0.as_str()) => {
                    entry.value
                }
                _ => return Ok(false),
            },
        };
        let released = self
            .client
            .kv_put(key, &value, PutMode::Release(lease.0.clone()))
            .await?;
        Ok(released)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn spec() -> LeaseSpec {
        LeaseSpec {
            node_id: "web-1".into(),
            ttl: Duration::from_secs(15),
            takeover_delay: Duration::from_secs(15),
            previous: None,
        }
    }

    /// The session is named after the node, released on death, and bound to serfHealth
    /// plus the node's check only when health checks are on.
    #[test]
    fn session_request_names_the_node_and_binds_its_check() {
        let with = session_request(&spec(), Some(&check_id(&spec().node_id)));
        assert_eq!(with.name, "leaderq:web-1");
        assert_eq!(with.ttl, "15s");
        assert_eq!(with.lock_delay, "15s");
        assert_eq!(with.behavior, "release");
        assert_eq!(with.node_checks, ["serfHealth", "leaderq:web-1"]);
        let without = session_request(&spec(), None);
        assert_eq!(without.node_checks, ["serfHealth"]);
    }
}
