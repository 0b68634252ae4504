//! The etcd coordinator: the [`Coordinator`] seam on etcd v3, as etcd's own `concurrency`
//! package does it, through its JSON gRPC gateway (`client/mod.rs`: endpoints with failover,
//! auth token, CA file; `client/wire.rs`, pure: the gateway's JSON both ways). The gateway
//! rather than a gRPC crate: no `protoc` at build time for users or CI, and a much smaller
//! build. etcd's names (revision, lease, txn, compare) stay in this folder.
//! Each part of the seam in its own file: [`Leases`](crate::coord::Leases) in `lease.rs`,
//! [`Elections`](crate::coord::Elections) in `election.rs`, [`Tasks`](crate::coord::Tasks)
//! in `queue.rs`.
//!
//! In the seam's words:
//! - a lease is an etcd lease of the TTL in whole seconds (rounded up; etcd raises it to its
//!   minimum) with `<leader_key>.owner/<lease-hex>` attached (the node id, and that this
//!   replica knows claim records: `layout::Owner`); keep-alive is one
//!   message to `/v3/lease/keepalive` (TTL 0 = gone), revoke and close are
//!   `/v3/lease/revoke`; a previous lease is taken up if `timetolive` finds it alive with
//!   this node's owner key (`lease.rs`);
//! - leadership is a campaign key `<leader_key>/<lease-hex>` created (compare
//!   `create_revision = 0`) under the lease; the lowest `create_revision` leads; a loser
//!   deletes its key at once (`Held`), a winner writes its record with its floor on the key
//!   and as `<leader_key>` (the last leader's record) in one txn; `observe` reads the first
//!   campaign key and the last leader's record in one txn and waits with a watch from the
//!   revision after the one last seen (`election.rs`);
//! - the queue is the key prefix holding the producers' JSON. The claims one write makes are
//!   one claim record `<leader_key>.held/<lease-hex>/<id>` naming them, under the claiming
//!   lease; a release of record-held tasks writes a release record. The latest record naming
//!   a task says whether it is held (`layout::Holders`). While a lease's owner says its
//!   replica knows no records (a version from before them), claims are claim keys
//!   `<leader_key>.claims/<task>` under the claiming lease instead, and claim keys are
//!   always honoured. `list` reads the tasks, claim keys, records and owners in one txn and
//!   waits with watches on the first three (a claim dying with its lease changes no task
//!   key); a compacted revision answers at once with a fresh read (`queue.rs`). `Claim`
//!   puts the task (and its claim key, if not in a record), `Release` puts the task (and
//!   deletes its claim key, or names it in a release record), `Complete` deletes the task
//!   (and its claim key), `Move` also puts the dead letter (`plan.rs`, pure: ops to one
//!   txn from what each op requires and does, its answer to `Written`, costs). Records
//!   that hold nothing any more are deleted with the next write (`records.rs`, pure, for
//!   those this process wrote) or after a listing (`layout::garbage`). Key layout and
//!   numbers: `layout.rs`.
//!
//! How it keeps each guarantee of [`crate::coord`]:
//! - **One leader.** Campaign keys get rising revisions, so while the first exists no other
//!   becomes first, and a campaigner that is not first withdraws its key. A lease not kept
//!   alive is revoked after its TTL (checked every 500 ms), which deletes its campaign key;
//!   the holder's gate stops a TTL after the last keep-alive it *sent*, so it stops first. An
//!   etcd leader change extends every lease by an election timeout: longer, never shorter.
//!   No lock-delay (`Timing::without_takeover_delay`).
//! - **Fencing.** The token is max(the campaign key's `create_revision`, the floor in its
//!   record). etcd's revision only rises (across restarts and compaction, which drops
//!   history, not the revision), so each new campaign key's `create_revision` is above the
//!   one before. A holder that campaigns again (a restart that took its lease up) deletes
//!   its key and creates it anew. A campaign key deleted by an operator ends that leadership
//!   (the guard) and the next one is created higher. A cluster restored from nothing starts
//!   revisions again: the floor, above the last leader's token and the highest token the
//!   winning replica has seen, keeps each token above the one before (the argument is in
//!   `election.rs`); only a cluster that lost its data while every replica lost its own can
//!   make it go back.
//! - **Guarded writes.** `write` is one `/v3/kv/txn`: compare the campaign key's
//!   `create_revision` with the one its win created (kept by lease in this process, not the
//!   token; a deleted key compares as 0, and a leadership its lease's later win superseded
//!   is `NotLeader` unsent), then per task its
//!   `mod_revision`, and its claim key only where the version cannot say who holds the task
//!   (held by a claim key: it still exists; for `write_own`, the claim key's or claim
//!   record's lease is the writer's), and for a claim record that no owner key moved since
//!   the owners were read, with no failure branch: only after a rollback are the compared
//!   keys read, and the rollback judged on them (`queue.rs` says why that is sound): a
//!   failed guard is `NotLeader`, otherwise the tasks whose compares failed are the
//!   `Conflict`.
//! - **Versions.** `4 × mod_revision`, + 0 when a claim record holds the task, 1 when
//!   nothing does, 2 when a claim key does: a claim dying with its lease writes nothing to
//!   the task, so the low bits move instead. List positions are `4 × revision + 3`, at or
//!   above every version read with them. A record changes only with a write of the tasks
//!   it names (a claim or release puts them), so a task's `mod_revision` stands for its
//!   record too.
//! - **No loss.** A claim record or key is attached to the leader's lease; when the lease
//!   ends etcd deletes it in the same revision as the campaign key, and the task stays,
//!   taken with no holder, for the next leader to requeue. A record is deleted only once no
//!   task's holder depends on it.
//!
//! Write limits: a task op adds at most 3 entries to each of compare, success and failure (a
//! move), the guard and the records at most 6, within etcd's default `--max-txn-ops` of 128; keys and values estimated
//! at 1 MiB under the default `--max-request-bytes` of 1.5 MiB. Errors: gRPC `InvalidArgument`
//! (400) and bad settings are `Refused`, everything else `Unavailable`. Persisting the lease id
//! across restarts (for `LeaseSpec::previous`) is the caller's business.

pub mod client;
mod election;
pub mod layout;
mod lease;
pub mod plan;
mod queue;
pub mod records;
mod settings;

pub use settings::EtcdSettings;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::coord::etcd::client::{Client, ClientConfig};
use crate::coord::etcd::layout::Layout;
use crate::coord::etcd::records::RecordBook;
use crate::coord::{CoordError, Coordinator, FencingToken, Leadership, LeaseId};

/// What the etcd coordinator needs beyond its client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdCoordSettings {
    /// The election's prefix and the last leader's key (`election.leader_key`).
    pub leader_key: String,
}

/// The etcd backend of the coordinator seam. Everything it needs is in etcd, under the
/// keys `layout.rs` names; it keeps only what it learnt of the claim records it wrote
/// (`records.rs`), so that they go as soon as nothing needs them.
pub struct EtcdCoordinator {
    client: Arc<Client>,
    layout: Layout,
    book: Mutex<RecordBook>,
    /// Each lease's latest win here: what its guarded writes check (`election.rs`).
    won: Mutex<HashMap<LeaseId, Won>>,
}

/// A win as the campaign left it: the token handed out, and the `create_revision` of the
/// campaign key, which the guard compares (the token may be above it: `election.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Won {
    token: FencingToken,
    created: i64,
}

/// The etcd backend from its `[etcd]` section and the leader key.
pub fn connect(etcd: &EtcdSettings, leader_key: &str) -> Result<Arc<dyn Coordinator>, CoordError> {
    let client = client_for(etcd)?;
    Ok(Arc::new(EtcdCoordinator::new(
        Arc::new(client),
        EtcdCoordSettings {
            leader_key: leader_key.to_string(),
        },
    )))
}

/// An etcd client from the `[etcd]` settings.
pub fn client_for(etcd: &EtcdSettings) -> Result<Client, CoordError> {
    Client::new(&ClientConfig {
        endpoints: etcd.endpoints.clone(),
        user: etcd.user.clone(),
        password: etcd.password.clone(),
        password_file: etcd.password_file.clone(),
        tls: etcd.tls_files(),
        request_timeout: etcd.request_timeout,
    })
    .map_err(CoordError::from)
}

impl EtcdCoordinator {
    /// A coordinator on `client`; nothing is asked of etcd before the first call.
    pub fn new(client: Arc<Client>, settings: EtcdCoordSettings) -> EtcdCoordinator {
        EtcdCoordinator {
            client,
            layout: Layout::new(&settings.leader_key),
            book: Mutex::new(RecordBook::default()),
            won: Mutex::new(HashMap::new()),
        }
    }

    fn book(&self) -> MutexGuard<'_, RecordBook> {
        self.book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn won(&self) -> MutexGuard<'_, HashMap<LeaseId, Won>> {
        self.won
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The `create_revision` the guard of `leadership`'s writes compares: its campaign key's
    /// as its win created it, if it is its lease's latest win here. `None` for one a later
    /// win of its lease superseded, or that its lease gave up: it leads no more.
    fn guarded_revision(&self, leadership: &Leadership) -> Option<i64> {
        self.won()
            .get(&leadership.lease)
            .filter(|won| won.token == leadership.fencing_token)
            .map(|won| won.created)
    }
}

/// The one place where etcd's errors become the seam's. Only what no retry can fix is
/// `Refused`: a request etcd finds invalid or too large (gRPC `InvalidArgument`, which
/// the gateway answers with 400), a client that cannot be set up, a TLS handshake refused
/// before etcd ever answered (wrong settings: the replica stops naming the setting).
/// Everything else may
/// pass (no leader, an endpoint down, a token being renewed, credentials an operator is
/// fixing) and is `Unavailable`.
impl From<client::Error> for CoordError {
    fn from(err: client::Error) -> CoordError {
        match &err {
            // etcd answers a bad or missing user with InvalidArgument too; as with Consul's
            // ACLs, an operator may be fixing it, so it is retried, with the hint.
            client::Error::Status { message, .. }
                if message.contains("authentication failed")
                    || message.contains("user name is empty") =>
            {
                CoordError::Unavailable(format!("{err}: check etcd.user and etcd.password"))
            }
            client::Error::Status { code, .. } if *code == client::CODE_INVALID_ARGUMENT => {
                CoordError::Refused(format!(
                    "{err}: etcd will not take this request; keep writes within Coordinator::limits"
                ))
            }
            client::Error::Endpoint(_) => {
                CoordError::Refused(format!("{err}: fix the [etcd] settings"))
            }
            client::Error::Settings(_) | client::Error::Tls { at_start: true, .. } => {
                CoordError::Refused(err.to_string())
            }
            client::Error::Tls {
                at_start: false, ..
            } => CoordError::Unavailable(err.to_string()),
            client::Error::Transport { .. }
            | client::Error::Status { .. }
            | client::Error::Decode(_) => CoordError::Unavailable(err.to_string()),
        }
    }
}

/// A lease id that is no etcd lease's: a caller's mistake no retry mends.
fn not_a_lease(lease: &LeaseId) -> CoordError {
    CoordError::Refused(format!(
        "{lease:?} is not an etcd lease id (hex digits): was it persisted by another backend? remove the lease file from the data dir"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Trouble that may pass is Unavailable; an invalid request or bad settings Refused.
    #[test]
    fn etcd_errors_map_to_unavailable_unless_no_retry_can_help() {
        let status = |status: u16, code: i64| client::Error::Status {
            status,
            code,
            message: "x".into(),
        };
        for err in [status(503, 14), status(404, 5), status(401, 16)] {
            assert!(matches!(CoordError::from(err), CoordError::Unavailable(_)));
        }
        let auth = client::Error::Status {
            status: 400,
            code: 3,
            message: "etcdserver: authentication failed, invalid user ID or password".into(),
        };
        assert!(
            matches!(CoordError::from(auth), CoordError::Unavailable(m) if m.contains("etcd.password"))
        );
        for err in [status(400, 3), client::Error::Endpoint("x".into())] {
            assert!(matches!(CoordError::from(err), CoordError::Refused(_)));
        }
    }
}
