//! The Consul coordinator: the [`Coordinator`] seam on Consul's HTTP API (a real cluster or
//! `leaderq server`), through the typed client in [`crate::coord::consul::client`]. Consul's
//! names (session, lock-delay, `ModifyIndex`, acquire) stay in this folder.
//!
//! In the seam's words:
//! - a lease is a session `leaderq:<node-id>` (TTL, LockDelay, behaviour `release`) bound to
//!   `serfHealth` and (with `health_check`) to a TTL check of the same name, registered
//!   passing at open and passed at every keep-alive (`lease.rs`); keep-alive is renew + pass,
//!   revoke is destroy, close also releases the leader key and deregisters the checks no open
//!   lease uses; `leftovers.rs` decides whether a previous session is taken up;
//! - leadership is the leader key locked for the session in a transaction, its value the
//!   [`HolderRecord`](crate::coord::HolderRecord); `observe` is a blocking GET on it (the
//!   index reset when it goes back, early unchanged answers paced to `MIN_REQUERY`)
//!   (`election.rs`);
//! - the queue is the KV prefix: a task's version is its `ModifyIndex` (`CreateIndex` orders
//!   ties), its holder the lock's `Session` (`layout.rs`); a put that takes or gives up a
//!   claim is `check-index` + `lock` / `unlock` with the writer's session, one that leaves
//!   it `cas`, a create `cas` at index 0, a delete `delete-cas` (+ `set` of its record)
//!   (`queue.rs`, and `plan.rs`, pure: ops to Consul verbs after the guard, from what each
//!   op requires and does, and a transaction's answer to `Written`).
//!
//! Each part of the seam is implemented in its own file: [`Leases`](crate::coord::Leases)
//! in `lease.rs`, [`Elections`](crate::coord::Elections) in `election.rs`,
//! [`Tasks`](crate::coord::Tasks) in `queue.rs`; the typed HTTP client is `client/`, the
//! settings `settings.rs`. This file holds the type, its constructor and the one mapping of
//! Consul's errors.
//!
//! How it keeps each guarantee of [`crate::coord`]:
//! - **One leader.** One session holds a lock. A session not renewed is invalidated at the
//!   latest after TTL × 2 (Consul's multiplier), so never before the holder's own view (a TTL
//!   from the last renewal it *sent*) ran out; a bound check gone critical invalidates it at
//!   once. The key then stays under lock-delay (capped at 60 s): an acquire answers `Delayed`
//!   until a holder that had not noticed is past its own deadline. `resign` is `?release`,
//!   which sets no lock-delay, so a clean handover is immediate.
//! - **Fencing.** The token is the higher of the leader key's `ModifyIndex` as the winning
//!   write left it (the raft index of that write, one global counter that only rises and is
//!   kept in the raft log and snapshots; `leaderq server` persists it with every commit) and
//!   the floor that write put in the holder record (`election.rs`): one above the last
//!   record's token and above the highest token the replica has seen. A key deleted and
//!   created anew is won by a new write at a higher index; its `LockIndex` would start
//!   again at 1 (and a plain PUT sets it to 0), so it is never the token. The floor keeps
//!   tokens rising past a cluster (or a `leaderq server` data dir) that lost its data and
//!   counts its index from 1 again. While held, only a write of the key moves its
//!   `ModifyIndex` (a renew writes nothing); an operator's PUT moves it, and the guard then
//!   ends that leadership. A lease that finds the key already its own (a restart took its
//!   session up) unlocks and locks it in one transaction, a new write with a higher floor.
//! - **Guarded writes.** `write` is one `/v1/txn` that opens with `check-session` (the
//!   leadership's session) and `check-index` (the index its win wrote) on the leader key; a
//!   session check alone would let an operator's PUT through, since a PUT keeps the lock's
//!   session. Consul applies all ops or none: a failed check answers `NotLeader`, any other
//!   failed op `Conflict` with its task's key. The checks return the leader key as the
//!   commit saw it; the token it stands for is `Written::Done`'s. `write_own` is the same
//!   without the checks.
//! - **Versions.** Every write moves a key's `ModifyIndex`, and each op is conditioned on it.
//!   A `delete-cas` of a key already gone succeeds, so `Complete` and `Move` of a task
//!   someone deleted answer `Done`.
//! - **No loss.** A claim locks the task with the leader's session, whose behaviour is
//!   `release`: when the session ends Consul clears the lock and keeps the value, so the task
//!   stays, taken with no holder, for the next leader to requeue.
//!
//! Write limits: `consul.txn_max_ops` operations counting the guard (128, what Consul 1.6 and
//! later and `leaderq server` accept; 64 for an older Consul; the guard is two, a claim two, a
//! completion one, a move three) and about 236 KiB of keys and values (a 480 KiB body budget
//! under Consul's 512 KiB; values grow by 4/3 in base64 and a claim sends its key twice).
//!
//! Consul's errors become [`CoordError`] in one place, the `From` below: a 413, a key that
//! cannot travel in a URL and a session TTL outside the server's bounds are `Refused`;
//! everything else (network, 429, 5xx, ACL) is `Unavailable`. Persisting the lease id across
//! restarts (for `LeaseSpec::previous`) is the caller's business.

pub mod client;
mod election;
mod layout;
mod lease;
mod leftovers;
mod plan;
mod queue;
pub mod registration;
mod settings;

pub use layout::{check_id, stored_task};
pub use settings::ConsulSettings;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::coord::consul::client::{self as consul, Client};
use crate::coord::{CoordError, Coordinator, FencingToken, LeaseId};

/// What the Consul coordinator needs beyond its client; from `[election]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsulCoordSettings {
    /// The key whose lock is leadership (`election.leader_key`).
    pub leader_key: String,
    /// Bind each lease to a TTL check passed at every keep-alive (`election.health_check`),
    /// so that a replica whose loop hangs loses its session, not only a dead node.
    pub health_check: bool,
    /// Operations one transaction may carry (`consul.txn_max_ops`: 128 since Consul 1.6,
    /// 64 before).
    pub txn_max_ops: usize,
    /// Appended to the node's check id (`layout::check_id`): each shard of a split queue has
    /// a coordinator and leases of its own, and its own check, so that one shard's lease
    /// ending deregisters no check another shard's session is bound to.
    pub check_suffix: String,
}

/// The Consul backend of the coordinator seam. One per replica; it may hold several leases
/// (tests open more than one), and remembers what it tied to each: its check and the
/// holder record it wrote to the leader key.
pub struct ConsulCoordinator {
    client: Arc<Client>,
    settings: ConsulCoordSettings,
    tied: Mutex<Tied>,
    /// Whether the checks older versions left on this host were looked at (first open only).
    stale_checks_looked_at: AtomicBool,
}

/// What this coordinator registered or wrote for its leases, to undo it when they end.
#[derive(Default)]
struct Tied {
    /// Checks registered with the agent and not yet deregistered.
    checks: BTreeSet<String>,
    /// Each open lease and its check (none while health checks are off).
    leases: HashMap<LeaseId, Option<String>>,
    /// The holder record each lease wrote when it won, written back when it releases the
    /// key, so that the last holder's record stays for standbys.
    records: HashMap<LeaseId, Vec<u8>>,
    /// The leader key's `ModifyIndex` as each lease's latest win wrote it, with the token
    /// that win handed out: what the guard of its writes checks (the token may be above
    /// the index, `election.rs`).
    won_at: HashMap<LeaseId, (u64, FencingToken)>,
}

/// The Consul backend from its `[consul]` section, the leader key and whether leases are
/// bound to a TTL check (`election.health_check`).
pub fn connect(
    section: &ConsulSettings,
    leader_key: &str,
    health_check: bool,
    check_suffix: &str,
) -> Result<Arc<dyn Coordinator>, CoordError> {
    let client = client_for(section)?;
    Ok(Arc::new(ConsulCoordinator::new(
        Arc::new(client),
        ConsulCoordSettings {
            leader_key: leader_key.to_string(),
            health_check,
            txn_max_ops: section.txn_max_ops,
            check_suffix: check_suffix.to_string(),
        },
    )))
}

/// A Consul client from the `[consul]` settings.
pub fn client_for(section: &ConsulSettings) -> Result<Client, consul::Error> {
    Client::new(&consul::ClientConfig {
        addresses: section.addresses.clone(),
        token: section.token.clone(),
        token_file: section.token_file.clone(),
        tls: section.tls_files(),
        request_timeout: section.request_timeout,
    })
}

impl ConsulCoordinator {
    /// A coordinator on `client` (its addresses, token and time-outs are the `[consul]`
    /// settings); nothing is asked of Consul before the first call.
    pub fn new(client: Arc<Client>, settings: ConsulCoordSettings) -> ConsulCoordinator {
        ConsulCoordinator {
            client,
            settings,
            tied: Mutex::new(Tied::default()),
            stale_checks_looked_at: AtomicBool::new(false),
        }
    }

    /// Never held across an await: every use takes what it needs and lets go.
    fn tied(&self) -> MutexGuard<'_, Tied> {
        self.tied
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The one place where Consul's errors become the seam's. Only what no retry can fix is
/// `Refused`: a transaction over Consul's limits (413), a key that cannot travel in a URL,
/// a client that cannot be set up, a TLS handshake refused before Consul ever answered
/// (wrong settings: the replica stops at start naming the setting; later, a rotation gone
/// wrong may be fixed, and it is `Unavailable`). Everything else may pass (network, overload, a leader
/// election, an ACL an operator is fixing) and is `Unavailable`, as the consumer has always
/// retried it. A refused session TTL is mapped where the session is created (`lease.rs`).
impl From<consul::Error> for CoordError {
    fn from(err: consul::Error) -> CoordError {
        match &err {
            consul::Error::Status { code: 413, .. } => CoordError::Refused(format!(
                "{err}: the write is over Consul's transaction limits; keep writes within Coordinator::limits"
            )),
            consul::Error::Key(_) => CoordError::Refused(format!(
                "{err}; such a task can only be moved away, by a transaction (which carries keys in its body)"
            )),
            consul::Error::Address(_) => {
                CoordError::Refused(format!("{err}: fix the [consul] settings"))
            }
            consul::Error::Settings(_) | consul::Error::Tls { at_start: true, .. } => {
                CoordError::Refused(err.to_string())
            }
            consul::Error::Tls { at_start: false, .. } => CoordError::Unavailable(err.to_string()),
            consul::Error::Transport { .. }
            | consul::Error::Status { .. }
            | consul::Error::Decode(_) => CoordError::Unavailable(err.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Transient trouble is Unavailable; only a write over the limits, a key that cannot be
    /// addressed or a client that cannot be set up is Refused.
    #[test]
    fn consul_errors_map_to_unavailable_unless_no_retry_can_help() {
        let status = |code: u16| consul::Error::Status {
            code,
            body: "x".into(),
        };
        for err in [
            status(429),
            status(500),
            status(503),
            status(403),
            consul::Error::Decode("eof".into()),
        ] {
            assert!(
                matches!(CoordError::from(err), CoordError::Unavailable(_)),
                "not unavailable"
            );
        }
        for err in [
            status(413),
            consul::Error::Key("a/../b".into()),
            consul::Error::Address("x".into()),
        ] {
            assert!(matches!(CoordError::from(err), CoordError::Refused(_)));
        }
    }
}
