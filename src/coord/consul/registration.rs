//! A replica in the agent's service catalog: it registers itself as an instance of
//! `election.service_name` (id = its node id, address and port = its observe endpoint, tag
//! `leader` or `standby`), keeps the tag current as its role changes, and deregisters on
//! shutdown, so `/v1/health/service/leaderq?passing` (or the Consul UI) shows who leads.
//!
//! Health: the registration carries the replica's own TTL check (`leaderq:<node-id>`, the one
//! its session is bound to and its renewer passes), so the instance passes exactly while
//! the replica is alive and renewing. The election registers that check as a node check
//! when it creates a session; the next re-registration (every TTL/3) binds it to the service
//! again, which keeps a dead replica's critical check from failing the other instances.
//!
//! The Consul coordinator's answer to [`Coordinator::announce`](crate::coord::Coordinator::announce):
//! knows nothing of the election beyond a role channel; `client/service.rs` does the I/O.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::coord::consul::client::{Client, ServiceCheck, ServiceRegistration};
use crate::coord::{Announcement, Role};

/// Pause before registering again after a failed attempt.
const RETRY: Duration = Duration::from_secs(1);
/// What the election's check says about itself; the same text keeps re-registrations no-ops.
pub const CHECK_NOTES: &str =
    "passed by a leaderq replica while its loop is alive; its session dies with it";

/// The address and port the instance is reached at: the observe endpoint. An address for
/// every interface is left empty, so the catalog shows the agent's node address (Consul
/// refuses an unspecified service address).
pub fn service_address(observe: Option<SocketAddr>) -> (String, u16) {
    match observe {
        Some(addr) if addr.ip().is_unspecified() => (String::new(), addr.port()),
        Some(addr) => (addr.ip().to_string(), addr.port()),
        None => (String::new(), 0),
    }
}

/// The registration of the replica `replica` describes in `role`, with its TTL check when
/// the election uses one (`check_id`).
pub fn registration(
    replica: &Announcement,
    check_id: Option<&str>,
    role: Role,
) -> ServiceRegistration {
    let node_id = &replica.node_id;
    let (address, port) = service_address(replica.address);
    ServiceRegistration {
        id: node_id.to_string(),
        name: replica.service_name.clone(),
        tags: vec![role.tag().to_string()],
        address,
        port,
        meta: vec![("version".into(), env!("CARGO_PKG_VERSION").into())],
        checks: check_id
            .map(|id| ServiceCheck {
                id: id.to_string(),
                name: format!("leaderq {node_id}"),
                ttl: replica.lease_ttl,
                notes: CHECK_NOTES.to_string(),
            })
            .into_iter()
            .collect(),
    }
}

/// Keeps `registration` in the catalog with the tag of the current `role`: registers at
/// once, again whenever the role changes and every `period`, until `stop`; then
/// deregisters. Call it with `stop` cancelled only after the replica resigned, so that the
/// check its session is bound to goes with the session, not before it.
pub async fn keep_registered(
    client: Arc<Client>,
    registration: ServiceRegistration,
    mut role: watch::Receiver<Role>,
    period: Duration,
    stop: CancellationToken,
) {
    loop {
        let current = *role.borrow_and_update();
        let mut wanted = registration.clone();
        wanted.tags = vec![current.tag().to_string()];
        let next = match client.service_register(&wanted).await {
            Ok(()) => period,
            Err(err) => {
                tracing::warn!(error = %err, service = %wanted.name, "cannot register the replica in the service catalog; retrying");
                RETRY
            }
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            changed = role.changed() => if changed.is_err() { stop.cancelled().await; break },
            _ = tokio::time::sleep(next) => {}
        }
    }
    if let Err(err) = client.service_deregister(&registration.id).await {
        tracing::warn!(error = %err, "cannot deregister the replica from the service catalog");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(address: Option<SocketAddr>) -> Announcement {
        Announcement {
            node_id: "r1".into(),
            service_name: "leaderq".into(),
            address,
            lease_ttl: Duration::from_secs(15),
        }
    }

    /// The instance is named after the setting, identified by the node id, reached at the
    /// observe address, tagged with its role and checked by the replica's own TTL check.
    #[test]
    fn registration_describes_the_replica() {
        let observe: SocketAddr = "10.1.2.3:9464".parse().unwrap();
        let r = registration(&replica(Some(observe)), Some("leaderq:r1"), Role::Leader);
        assert_eq!(r.name, "leaderq");
        assert_eq!(r.id, "r1");
        assert_eq!((r.address.as_str(), r.port), ("10.1.2.3", 9464));
        assert_eq!(r.tags, vec!["leader"]);
        assert_eq!(r.checks[0].id, "leaderq:r1");
        assert_eq!(r.checks[0].ttl, Duration::from_secs(15));
        let bare = registration(&replica(None), None, Role::Standby);
        assert!(bare.checks.is_empty());
        assert_eq!(bare.tags, vec!["standby"]);
    }

    /// An address for every interface leaves the agent's own; no observe endpoint, no port.
    #[test]
    fn unspecified_addresses_are_left_to_the_agent() {
        assert_eq!(
            service_address(Some("0.0.0.0:9464".parse().unwrap())),
            (String::new(), 9464)
        );
        assert_eq!(
            service_address(Some("[::]:1".parse().unwrap())),
            (String::new(), 1)
        );
        assert_eq!(service_address(None), (String::new(), 0));
    }
}
