//! Leadership, on any coordinator: the replica's lease (opened, taken up again after a
//! quick restart, kept alive, revoked) and the campaign for leadership. Written once
//! against [`Coordinator`]; what a lease or a leader key is on Consul, ZooKeeper, Redis or
//! etcd is the backend's business (`coord/`).
//!
//! - `lease.rs`: the replica's own view of its lease and the deadline it publishes.
//! - `gate.rs`: the pure decisions (watch, defer to the previous leader, campaign).
//! - `rotation.rs`: rotate mode's pure decisions (when a term ends, when to contest again).
//! - `replicas.rs`: every replica's record of itself (standbys with their heartbeat).
//! - `timeline.rs`: the leadership timeline (who led when, why each term ended).
//! - `watch.rs`: the leader's watch on its own leadership record during a term.
//! - `renewal.rs`: when keep-alives go out (every TTL/3, answered or not), and why that
//!   keeps the lease under latency.
//! - `faults.rs`: a stall of the renewals only, injected by tests and chaos.
//!
//! The lease id is kept in the data dir (`session`), so a restarted replica asks the
//! coordinator to take it up again; the backend decides whether it still may. What the
//! leader does with its leadership is `queue`'s business.

pub mod faults;
pub mod gate;
pub mod identity;
pub mod lease;
pub mod lifecycle;
pub mod renewal;
pub mod replicas;
pub mod rotation;
pub mod shares;
#[cfg(test)]
mod tests;
pub mod timeline;
pub mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::config::ElectionSettings;
use crate::coord::{
    Campaign, CoordError, Coordinator, FencingToken, HolderRecord, Leadership, LeaseId, LeaseSpec,
    Renewal, Version,
};
use crate::observe::Metrics;
use crate::task::rfc3339;
use crate::util::duration;
pub use lease::Lease;
use renewal::Schedule;

/// One keep-alive's end: which lease it renewed, when it was sent, what came back.
struct Flight {
    id: LeaseId,
    sent_at: Instant,
    answer: Result<Renewal, CoordError>,
}

/// The file in the data dir that keeps the highest fencing token this replica has seen.
const TOKEN_FILE: &str = "fencing-token";

/// Sleeps until `at`; for ever when there is none.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One keep-alive of `lease`, failed if no answer comes within `patience`, or after
/// `stall` while a test stalls the renewals (`faults.rs`).
async fn keep_alive(
    coord: &dyn Coordinator,
    lease: &LeaseId,
    stall: Duration,
    patience: Duration,
) -> Result<Renewal, CoordError> {
    if let Some(stalled) = faults::stalled_renewal(stall).await {
        return Err(stalled);
    }
    tokio::time::timeout(patience, coord.keep_alive(lease))
        .await
        .unwrap_or_else(|_| {
            Err(CoordError::Unavailable(format!(
                "no answer to the lease's keep-alive within {}",
                duration::format(patience)
            )))
        })
}

#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error(transparent)]
    Coord(#[from] CoordError),
    #[error("lease {0} is gone")]
    LeaseLost(LeaseId),
}

pub struct Election {
    coord: Arc<dyn Coordinator>,
    settings: ElectionSettings,
    node_id: String,
    lease_file: PathBuf,
    lease: Arc<Lease>,
    /// Whether the lease kept in the data dir has been offered since start.
    tried_previous: bool,
    /// The lease kept in the data dir, once the coordinator let this process take it up,
    /// until [`Election::take_reused`] hands it on.
    reused: Option<LeaseId>,
    /// The highest fencing token this replica has seen (held, or observed on another
    /// leader), kept in the data dir (`fencing-token`): every campaign asks for a token
    /// above it ([`HolderRecord::floor`]), so that a coordinator that lost its data cannot
    /// hand out a lower one while this replica remembers.
    seen_token: u64,
    token_file: PathBuf,
}

impl Election {
    pub fn new(
        coord: Arc<dyn Coordinator>,
        settings: ElectionSettings,
        node_id: String,
        data_dir: PathBuf,
    ) -> Election {
        let token_file = data_dir.join(TOKEN_FILE);
        let seen_token = std::fs::read_to_string(&token_file)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0);
        Election {
            coord,
            lease: Arc::new(Lease::new(settings.lease_ttl)),
            lease_file: data_dir.join("session"),
            seen_token,
            token_file,
            node_id,
            settings,
            tried_previous: false,
            reused: None,
        }
    }

    /// The lease this process took up from before its restart, once: what that lease holds
    /// was the previous process's, for the caller to settle.
    pub fn take_reused(&mut self) -> Option<LeaseId> {
        self.reused.take()
    }

    pub fn lease(&self) -> Arc<Lease> {
        self.lease.clone()
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Makes sure the replica has a live lease: after a restart, the one its data dir
    /// names if the coordinator lets it take it up, otherwise a new one.
    pub async fn ensure_lease(&mut self) -> Result<LeaseId, ElectionError> {
        if let Some(lease) = self.lease.id() {
            return Ok(lease);
        }
        let previous = if self.tried_previous {
            None
        } else {
            self.tried_previous = true;
            std::fs::read_to_string(&self.lease_file)
                .ok()
                .map(|id| id.trim().to_string())
                .filter(|id| !id.is_empty())
                .map(LeaseId)
        };
        let spec = LeaseSpec {
            node_id: self.node_id.clone(),
            ttl: self.settings.lease_ttl,
            takeover_delay: self.settings.lock_delay,
            previous,
        };
        let sent_at = Instant::now();
        let grant = self.coord.open_lease(&spec).await?;
        if grant.reused {
            tracing::info!(lease = %grant.lease, "reusing the lease from before the restart");
            self.reused = Some(grant.lease.clone());
        } else {
            if let Some(dir) = self.lease_file.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            if let Err(err) = std::fs::write(&self.lease_file, &grant.lease.0) {
                tracing::warn!(file = %self.lease_file.display(), error = %err, "cannot persist the lease id; a restart will not reuse it");
            }
            tracing::info!(lease = %grant.lease, node = %self.node_id, "lease opened");
        }
        self.lease.adopt(&grant.lease, sent_at);
        Ok(grant.lease)
    }

    /// Keeps the lease alive every TTL/3 until `stop`, on schedule whatever the latency
    /// (`renewal.rs`): each keep-alive on a task of its own, waited for at most a TTL, the
    /// lease renewed from the send of each one acknowledged, a failed one followed by
    /// another soon. A lease the coordinator no longer honours is marked lost at once, so
    /// the loops that depend on it notice. The keep-alives still on their way when `stop`
    /// fires are abandoned, and their tasks ended before this returns.
    pub async fn renew_until(
        coord: Arc<dyn Coordinator>,
        lease: Arc<Lease>,
        ttl: Duration,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) {
        let mut schedule = Schedule::new(ttl, Instant::now());
        let mut flights: JoinSet<Flight> = JoinSet::new();
        loop {
            let due = schedule.due(flights.len());
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = sleep_until_some(due) => {
                    let now = Instant::now();
                    let Some(id) = lease.id() else {
                        // Between leases: the loop that opens the next one adopts it.
                        schedule.no_lease(now);
                        continue;
                    };
                    schedule.sent(now);
                    let (coord, retry, patience) =
                        (coord.clone(), schedule.retry(), schedule.patience());
                    flights.spawn(
                        async move {
                            let answer = keep_alive(coord.as_ref(), &id, retry, patience).await;
                            Flight { id, sent_at: now, answer }
                        }
                        .in_current_span(),
                    );
                }
                Some(landed) = flights.join_next() => {
                    let flight = match landed {
                        Ok(flight) => flight,
                        Err(err) => {
                            tracing::warn!(error = %err, "a lease renewal ended abnormally; retrying");
                            schedule.failed(Instant::now());
                            continue;
                        }
                    };
                    match flight.answer {
                        Ok(Renewal::Alive) => {
                            metrics.renewed(flight.sent_at.elapsed());
                            lease.renewed(&flight.id, flight.sent_at);
                        }
                        Ok(Renewal::Gone) => {
                            tracing::warn!(lease = %flight.id, "lease expired or was revoked");
                            lease.mark_lost(&flight.id);
                        }
                        Err(err) => {
                            metrics.coordinator_error(&err);
                            tracing::warn!(error = %err, "lease renewal failed; retrying");
                            schedule.failed(Instant::now());
                        }
                    }
                }
            }
        }
        flights.shutdown().await;
    }

    fn record(&self, lease: &LeaseId) -> HolderRecord {
        HolderRecord {
            node: self.node_id.clone(),
            host: crate::util::hostname(),
            pid: std::process::id(),
            session: lease.0.clone(),
            since: rfc3339(Utc::now()),
            floor: Some(self.seen_token.saturating_add(1)),
        }
    }

    /// Remembers `token` if it is the highest seen yet, in memory and in the data dir.
    fn saw(&mut self, token: FencingToken) {
        if token.0 <= self.seen_token {
            return;
        }
        self.seen_token = token.0;
        if let Err(err) = std::fs::write(&self.token_file, token.0.to_string()) {
            tracing::warn!(file = %self.token_file.display(), error = %err, "cannot keep the highest fencing token seen; after a restart, only the coordinator's own record keeps tokens rising");
        }
    }

    /// Contends for leadership until this replica holds it (`Some`) or `stop` fires
    /// (`None`). Followers wait on the holder and contest as soon as it is free; a refused
    /// attempt on a free leadership (lock-delay) waits `retry_interval` before the next.
    pub async fn campaign(
        &mut self,
        wait: Duration,
        stop: &CancellationToken,
    ) -> Result<Option<Leadership>, ElectionError> {
        let mut after = Version::default();
        let mut deferred = false;
        // The holder last logged, so a standby logs each change of leader once.
        let mut seen: Option<Option<LeaseId>> = None;
        loop {
            let lease = self.ensure_lease().await?;
            let (holder, version) = tokio::select! {
                _ = stop.cancelled() => return Ok(None),
                _ = self.lease.expired() => return Err(ElectionError::LeaseLost(lease)),
                observed = self.coord.observe(after, wait) => observed?,
            };
            after = version;
            self.saw(holder.token);
            if seen.as_ref() != Some(&holder.lease) {
                match (&holder.lease, &holder.record) {
                    (Some(other), record) if *other != lease => tracing::info!(
                        leader = record.as_ref().map_or("?", |r| r.node.as_str()),
                        fencing_token = holder.token.0,
                        "standing by"
                    ),
                    (None, _) => tracing::info!("leadership is free; contending"),
                    _ => {}
                }
                seen = Some(holder.lease.clone());
            }
            let grace = self.settings.prefer_previous_leader;
            match gate::next_step(&holder, &lease, &self.node_id, grace, deferred) {
                gate::Step::Watch => continue,
                gate::Step::Defer(grace) => {
                    deferred = true;
                    tracing::info!(grace = %duration::format(grace), "deferring to the previous leader");
                    tokio::select! {
                        _ = stop.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(grace) => {}
                    }
                    after = Version::default();
                    continue;
                }
                gate::Step::Campaign => {}
            }
            let record = self.record(&lease);
            match self.coord.campaign(&lease, &record).await? {
                Campaign::Won(leadership) => {
                    self.saw(leadership.fencing_token);
                    return Ok(Some(leadership));
                }
                // Another replica won the race: watch it from a fresh look.
                Campaign::Held => after = Version::default(),
                Campaign::Delayed => {
                    tokio::select! {
                        _ = stop.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(self.settings.retry_interval) => {}
                    }
                    after = Version::default();
                }
                Campaign::LeaseGone => {
                    self.lease.mark_lost(&lease);
                    return Err(ElectionError::LeaseLost(lease));
                }
            }
        }
    }

    /// Gives leadership up (no lock-delay applies), then ends the lease so nothing it
    /// claimed stays claimed; the next campaign opens a new one.
    pub async fn step_down(&mut self, leadership: &Leadership) {
        if let Err(err) = self.coord.resign(&leadership.lease).await {
            tracing::warn!(error = %err, "cannot release the leader key");
        }
        self.drop_lease().await;
    }

    /// Rotate mode: gives leadership up (no lock-delay applies) keeping the lease, then
    /// stands back until another replica leads, or for a TTL when none does (it may be
    /// alone), or until `stop`. The next campaign contests again.
    pub async fn rotate(&mut self, leadership: &Leadership, stop: &CancellationToken) {
        if let Err(err) = self.coord.resign(&leadership.lease).await {
            tracing::warn!(error = %err, "cannot release the leader key; stepping down instead");
            self.drop_lease().await;
            return;
        }
        let limit = self.settings.lease_ttl;
        let started = Instant::now();
        let mut after = Version::default();
        loop {
            let left = limit.saturating_sub(started.elapsed());
            let observed = tokio::select! {
                _ = stop.cancelled() => return,
                observed = self.coord.observe(after, left.max(Duration::from_millis(1))) => observed,
            };
            match observed {
                Ok((holder, version)) => {
                    if rotation::stand_back_over(
                        &holder,
                        &leadership.lease,
                        started.elapsed(),
                        limit,
                    ) {
                        if let Some(node) = holder.record.filter(|_| holder.lease.is_some()) {
                            tracing::info!(next_leader = %node.node, "leadership passed on");
                        }
                        return;
                    }
                    after = version;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "cannot watch the leadership while standing back");
                    return;
                }
            }
        }
    }

    /// Revokes the lease (also one believed lost: revoking again is harmless, and if the
    /// coordinator still has it this frees its claims at once) and forgets it.
    pub async fn drop_lease(&mut self) {
        let lease = self.lease.held();
        if let Some(lease) = lease {
            if let Err(err) = self.coord.revoke(&lease).await {
                tracing::warn!(lease = %lease, error = %err, "cannot revoke the lease; it will expire");
            }
        }
        self.lease.forget();
        let _ = std::fs::remove_file(&self.lease_file);
    }

    /// Leaves for good: gives leadership up if this lease holds it, ends the lease and
    /// whatever the backend tied to this replica (Consul: its health check).
    pub async fn leave(&mut self) {
        if let Some(lease) = self.lease.id() {
            if let Err(err) = self.coord.resign(&lease).await {
                tracing::warn!(error = %err, "cannot release the leader key");
            }
        }
        let lease = self.lease.held();
        if let Err(err) = self.coord.close(lease.as_ref()).await {
            tracing::warn!(error = %err, "cannot close the lease");
        }
        self.lease.forget();
        let _ = std::fs::remove_file(&self.lease_file);
    }
}
