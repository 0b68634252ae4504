//! The etcd coordinator: the [`Coordinator`] seam on etcd v3, through its JSON gRPC
//! gateway (`client.rs`), as etcd's own `concurrency` package does it, each part in its own
//! file ([`Leases`](crate::coord::Leases) in `lease.rs`,
//! [`Elections`](crate::coord::Elections) in `election.rs`, [`Tasks`](crate::coord::Tasks)
//! in `queue.rs`):
//!
//! - a lease is an etcd lease (grant with the TTL in whole seconds, keep-alive, revoke),
//!   with an owner key naming the node attached to it (`lease.rs`);
//! - leadership is a campaign key `<leader_key>/<lease-hex>` under the lease; the one with
//!   the lowest `create_revision` leads and that revision is the fencing token, which
//!   rises across leaders because revisions do (`election.rs`);
//! - the queue is the key prefix holding the producers' JSON; a task's version is its
//!   `mod_revision` and whether a claim key (attached to the claiming lease) holds it; each
//!   guarded write is one transaction comparing the campaign key's `create_revision` with
//!   the token (`queue.rs`, `txn.rs`); waiting is a watch from the revision last seen.
//!
//! Key layout and numbers: `layout.rs`. What each guarantee of the seam rests on is written
//! in ARCHITECTURE.md ("Coordinators"). Persisting the lease id across restarts (for
//! `LeaseSpec::previous`) is the caller's business.

pub mod client;
mod election;
pub mod layout;
mod lease;
mod queue;
mod settings;
pub mod txn;

pub use settings::EtcdSettings;

use std::sync::Arc;

use crate::coord::etcd::client::{Client, ClientConfig};
use crate::coord::etcd::layout::Layout;
use crate::coord::{CoordError, Coordinator, LeaseId};

/// What the etcd coordinator needs beyond its client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdCoordSettings {
    /// The election's prefix and the last leader's key (`election.leader_key`).
    pub leader_key: String,
}

/// The etcd backend of the coordinator seam. It keeps no state of its own: everything it
/// needs is in etcd, under the keys `layout.rs` names.
pub struct EtcdCoordinator {
    client: Arc<Client>,
    layout: Layout,
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
        ca_file: etcd.ca_file.clone(),
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
        }
    }
}

/// The one place where etcd's errors become the seam's. Only what no retry can fix is
/// `Refused`: a request etcd finds invalid or too large (gRPC `InvalidArgument`, which
/// the gateway answers with 400), a client that cannot be set up. Everything else may
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
            client::Error::CaFile { .. } | client::Error::Endpoint(_) => {
                CoordError::Refused(format!("{err}: fix the [etcd] settings"))
            }
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
