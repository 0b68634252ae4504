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
//! Knows nothing of the election beyond a role channel; `coord/consul/client/service.rs`
//! does the I/O.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::ElectionSettings;
use crate::coord::consul::client::{Client, ServiceCheck, ServiceRegistration};

/// Pause before registering again after a failed attempt.
const RETRY: Duration = Duration::from_secs(1);
/// What the election's check says about itself; the same text keeps re-registrations no-ops.
pub const CHECK_NOTES: &str =
    "passed by a leaderq replica while its loop is alive; its session dies with it";

/// What a replica is doing, as its catalog tag says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Standby,
    Leader,
}

impl Role {
    pub fn tag(self) -> &'static str {
        match self {
            Role::Standby => "standby",
            Role::Leader => "leader",
        }
    }
}

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

/// The registration of this replica in `role`, with its TTL check when the election uses
/// one (`check_id`).
pub fn registration(
    settings: &ElectionSettings,
    node_id: &str,
    observe: Option<SocketAddr>,
    check_id: Option<&str>,
    role: Role,
) -> ServiceRegistration {
    let (address, port) = service_address(observe);
    ServiceRegistration {
        id: node_id.to_string(),
        name: settings.service_name.clone(),
        tags: vec![role.tag().to_string()],
        address,
        port,
        meta: vec![("version".into(), env!("CARGO_PKG_VERSION").into())],
        checks: check_id
            .map(|id| ServiceCheck {
                id: id.to_string(),
                name: format!("leaderq {node_id}"),
                ttl: settings.session_ttl,
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

    fn settings() -> ElectionSettings {
        crate::config::Settings::load(None, crate::config::Env::new())
            .unwrap()
            .election
    }

    /// The instance is named after the setting, identified by the node id, reached at the
    /// observe address, tagged with its role and checked by the replica's own TTL check.
    #[test]
    fn registration_describes_the_replica() {
        let observe: SocketAddr = "10.1.2.3:9464".parse().unwrap();
        let r = registration(
            &settings(),
            "r1",
            Some(observe),
            Some("leaderq:r1"),
            Role::Leader,
        );
        assert_eq!(r.name, "leaderq");
        assert_eq!(r.id, "r1");
        assert_eq!((r.address.as_str(), r.port), ("10.1.2.3", 9464));
        assert_eq!(r.tags, vec!["leader"]);
        assert_eq!(r.checks[0].id, "leaderq:r1");
        assert_eq!(r.checks[0].ttl, settings().session_ttl);
        let bare = registration(&settings(), "r1", None, None, Role::Standby);
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
