//! [`Leases`] on ZooKeeper: one session per lease, its own connection with the lease's TTL as
//! session timeout.
//!
//! ZooKeeper keeps a session alive by the client library's own pings, whether or not the
//! replica still calls `keep_alive`. So that a lease still ends a TTL after its last
//! keep-alive, as the seam says (a replica whose loop hangs loses it), each lease has a
//! watchdog that closes its session then. ZooKeeper itself ends it when the replica is dead
//! or frozen (no ping within the session timeout). The watchdog also keeps the lease's
//! connection busy enough that answers coming late do not make the client take it for lost
//! (`beat`).
//!
//! A lease cannot be taken up by a new process: `zookeeper-client` gives no way to hand a
//! session's id and password to a new connection (`SessionInfo` has no public
//! constructor). So `open_lease` with a previous lease of this node opens a new session,
//! after deleting the previous one's latch znode (a dead run of this very node must not
//! keep leadership until its session expires); its claims go when it expires.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use zookeeper_client as zk;

use super::client::{children_synced, commit, timed, unavailable};
use super::{layout, ZkCoordinator};
use crate::coord::{CoordError, Grant, HolderRecord, LeaseId, LeaseSpec, Leases, Renewal};

/// A lease this coordinator holds: the session's client, and the watchdog that closes it
/// a TTL after the last keep-alive.
pub(super) struct Held {
    pub(super) client: zk::Client,
    ttl: Duration,
    renewed: Arc<Mutex<Instant>>,
    watchdog: JoinHandle<()>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.watchdog.abort();
    }
}

/// How long a revocation waits for ZooKeeper to confirm the session's end, after which
/// its ephemeral znodes are gone for every reader.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

impl Leases for ZkCoordinator {
    fn describe(&self) -> String {
        format!("ZooKeeper at {}", self.settings.connect)
    }

    async fn open_lease(&self, spec: &LeaseSpec) -> Result<Grant, CoordError> {
        if let Some(previous) = &spec.previous {
            self.clear_previous(previous, &spec.node_id).await?;
        }
        let client = self.open_session(spec.ttl).await?;
        if client.session_timeout() < spec.ttl {
            return Err(CoordError::Refused(format!(
                "the ensemble grants sessions of at most {:?}, below election.lease_ttl {:?}: lower lease_ttl or raise the servers' maxSessionTimeout",
                client.session_timeout(),
                spec.ttl
            )));
        }
        let lease = layout::lease_of(client.session_id().0);
        let renewed = Arc::new(Mutex::new(Instant::now()));
        let watchdog = tokio::spawn(watchdog(
            Arc::downgrade(&self.leases),
            lease.clone(),
            renewed.clone(),
            spec.ttl,
            client.state_watcher(),
        ));
        self.leases().insert(
            lease.clone(),
            Held {
                client,
                ttl: spec.ttl,
                renewed,
                watchdog,
            },
        );
        Ok(Grant {
            lease,
            reused: false,
        })
    }

    /// Alive only if the session answers now: a request on it is what ZooKeeper counts as
    /// contact. Disconnected (Curator's SUSPENDED) is an error, so the leader steps down
    /// once no keep-alive succeeded for a TTL; expired (LOST) or closed is `Gone`. Several
    /// may be on their way at once (the renewer sends on schedule, answered or not); the
    /// watchdog counts from the latest send answered.
    async fn keep_alive(&self, lease: &LeaseId) -> Result<Renewal, CoordError> {
        let Some((client, ttl, renewed)) = self
            .leases()
            .get(lease)
            .map(|held| (held.client.clone(), held.ttl, held.renewed.clone()))
        else {
            return Ok(Renewal::Gone);
        };
        let state = client.state();
        if state.is_terminated() {
            self.leases().remove(lease);
            return Ok(Renewal::Gone);
        }
        if state == zk::SessionState::Disconnected {
            return Err(CoordError::Unavailable(
                "the lease's ZooKeeper connection is lost (suspended); its session may live".into(),
            ));
        }
        let sent = Instant::now();
        // A TTL: an answer later than that acknowledges a send whose lease has ended. Any
        // shorter and answers late by less than the latency a lease is promised to bear
        // (up to 2/3 of a TTL) would fail keep-alives that keep it.
        match tokio::time::timeout(ttl, client.check_stat("/")).await {
            Ok(Ok(_)) => {
                let mut renewed = renewed.lock().unwrap_or_else(|p| p.into_inner());
                *renewed = (*renewed).max(sent);
                Ok(Renewal::Alive)
            }
            Ok(Err(zk::Error::SessionExpired | zk::Error::ClientClosed)) => {
                self.leases().remove(lease);
                Ok(Renewal::Gone)
            }
            Ok(Err(err)) => Err(unavailable(err)),
            Err(_) => Err(CoordError::Unavailable(format!(
                "the lease's ZooKeeper session did not answer within {ttl:?}"
            ))),
        }
    }

    /// Ends the lease: deletes its ephemeral znodes (latch, claim markers) so every reader
    /// sees them gone at once, then closes the session.
    async fn revoke(&self, lease: &LeaseId) -> Result<(), CoordError> {
        let Some(held) = self.leases().remove(lease) else {
            return Ok(());
        };
        let client = held.client.clone();
        if let Ok(ephemerals) = timed(client.list_ephemerals("/")).await {
            if !ephemerals.is_empty() {
                let mut multi = client.new_multi_writer();
                for path in &ephemerals {
                    multi.add_delete(path, None).map_err(unavailable)?;
                }
                // Best effort: closing the session below deletes whatever this missed.
                let _ = commit(&mut multi).await;
            }
        }
        let mut state = client.state_watcher();
        drop(client);
        drop(held);
        let _ = tokio::time::timeout(CLOSE_WAIT, async {
            while !state.state().is_terminated() {
                state.changed().await;
            }
        })
        .await;
        Ok(())
    }

    /// Revokes the lease, if one is given, then closes the coordinator's own session too:
    /// nothing of it is left to expire.
    async fn close(&self, lease: Option<&LeaseId>) -> Result<(), CoordError> {
        if let Some(lease) = lease {
            self.revoke(lease).await?;
        }
        self.main.lock().await.take();
        Ok(())
    }
}

impl ZkCoordinator {
    pub(super) fn lease_client(&self, lease: &LeaseId) -> Option<zk::Client> {
        self.leases().get(lease).map(|held| held.client.clone())
    }

    /// The sessions of the leases this coordinator holds.
    pub(super) fn own_sessions(&self) -> Vec<i64> {
        self.leases()
            .keys()
            .filter_map(layout::session_of)
            .collect()
    }

    /// Deletes the latch znode of `previous` if it is this node's (its record names
    /// `node_id`): the run that held it is over.
    async fn clear_previous(&self, previous: &LeaseId, node_id: &str) -> Result<(), CoordError> {
        let Some(session) = layout::session_of(previous) else {
            return Ok(());
        };
        let main = self.main().await?;
        let dir = layout::path_of(&self.settings.leader_key);
        let children = match children_synced(&main, &dir).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(()),
            Err(err) => return Err(unavailable(err)),
        };
        for latch in layout::latches(&children) {
            if latch.session != session {
                continue;
            }
            let path = format!("{dir}/{}", latch.name);
            let own = match timed(main.get_data(&path)).await {
                Ok((data, _)) => HolderRecord::decode(&data).is_some_and(|r| r.node == node_id),
                Err(zk::Error::NoNode) => false,
                Err(err) => return Err(unavailable(err)),
            };
            if own {
                match timed(main.delete(&path, None)).await {
                    Ok(()) | Err(zk::Error::NoNode) => {}
                    Err(err) => return Err(unavailable(err)),
                }
            }
        }
        Ok(())
    }
}

/// The leases a coordinator holds, as its watchdogs reach them.
type HeldBy = std::sync::Weak<Mutex<std::collections::HashMap<LeaseId, Held>>>;

/// Closes `lease`'s session once a TTL passed since its last keep-alive, keeps its
/// connection from falling silent ([`beat`]), and says in the log when its connection is
/// lost (Curator's SUSPENDED), back (RECONNECTED) or its session expired (LOST).
async fn watchdog(
    leases: HeldBy,
    lease: LeaseId,
    renewed: Arc<Mutex<Instant>>,
    ttl: Duration,
    mut state: zk::StateWatcher,
) {
    let mut terminated = false;
    let mut beats = tokio::time::interval(super::client::silence_limit(ttl) / BEATS_PER_SILENCE);
    beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let deadline = *renewed.lock().unwrap_or_else(|p| p.into_inner()) + ttl;
        if Instant::now() >= deadline {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = beats.tick() => beat(&leases, &lease),
            now = state.changed(), if !terminated => match now {
                zk::SessionState::Disconnected => tracing::warn!(session = %lease, "the lease's ZooKeeper connection is lost (suspended): no keep-alive until it is back"),
                zk::SessionState::SyncConnected => tracing::info!(session = %lease, "the lease's ZooKeeper connection is back"),
                other => {
                    terminated = other.is_terminated();
                    tracing::warn!(session = %lease, state = %other, "the lease's ZooKeeper session ended");
                }
            },
        }
    }
    tracing::warn!(session = %lease, "no keep-alive within the lease's TTL: closing its ZooKeeper session");
    let Some(leases) = leases.upgrade() else {
        return;
    };
    // Dropping the last client closes the session.
    let held = leases
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&lease);
    if let Some(mut held) = held {
        // The entry's drop aborts its watchdog: not this one, which is about to end anyway.
        held.watchdog = tokio::spawn(async {});
        drop(held);
    }
}

/// Beats per silence limit: as often as the client looks for a silent connection, so that
/// a lease's connection is never idle for more than an eighth of its limit.
const BEATS_PER_SILENCE: u32 = 8;

/// One request of the watchdog's own on `lease`'s session, while it is connected, its
/// answer left unread (the request is sent when it is made). `zookeeper-client` takes a
/// connection silent for its limit (`silence_limit`, 3/5 of the TTL) for lost and connects
/// again, and left to itself sends a ping only once the connection has been idle for 3/8
/// of that limit. When answers start coming late by `L`, the silence lasts from the last
/// answer on time to the answer of the next request, up to 3/8 + 1/8 of the limit plus `L`:
/// latency rising by more than 0.3 × TTL at once would break the lease's connection, its
/// keep-alives failing until it is back. With a beat every eighth of the limit, it takes a
/// rise of 7/8 of it (0.525 × TTL), above the latency a lease's runs are promised to bear
/// (2/3 × TTL − kill_grace − TTL/10) for any `kill_grace` of a 24th of the TTL or more. A
/// beat is no keep-alive: the lease still ends a TTL after the last one.
fn beat(leases: &HeldBy, lease: &LeaseId) {
    let Some(leases) = leases.upgrade() else {
        return;
    };
    let client = leases
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(lease)
        .map(|held| held.client.clone());
    if let Some(client) = client {
        if matches!(
            client.state(),
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
        ) {
            drop(client.check_stat("/"));
        }
    }
}
