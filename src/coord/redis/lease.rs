//! [`Leases`] on Redis: a lease is a random id's key, a hash `{node, ttl}` with a PX TTL,
//! opened (or taken up, if it is still this node's with the same TTL), renewed with the
//! leader key it holds, and ended, each by one script that checks it is still there
//! (`scripts.rs`). Redis's persistence settings are judged before every lease
//! (`durability.rs`).

use std::time::Duration;

use super::client::Source;
use super::layout::text;
use super::{bad_answer, RedisCoordinator};
use crate::coord::{CoordError, Grant, LeaseId, LeaseSpec, Leases, Renewal};

/// Leases shorter than this are refused: a keep-alive every third of it must get through.
pub const TTL_MIN: Duration = Duration::from_secs(1);

impl Leases for RedisCoordinator {
    fn describe(&self) -> String {
        match &self.source {
            Source::Server(addr) => match addr {
                addr @ redis::ConnectionAddr::Tcp(..) => format!("Redis at {addr}"),
                addr => format!("Redis at {addr} (TLS)"),
            },
            Source::Sentinel(_) => match self.current_address() {
                Some(addr) => format!(
                    "Redis primary {:?} at {addr} (through Sentinel)",
                    self.settings.master_name
                ),
                None => format!(
                    "Redis primary {:?} (through the sentinels at {})",
                    self.settings.master_name,
                    self.settings
                        .sentinels
                        .iter()
                        .map(|(host, port)| format!("{host}:{port}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            },
        }
    }

    async fn open_lease(&self, spec: &LeaseSpec) -> Result<Grant, CoordError> {
        if spec.ttl < TTL_MIN {
            return Err(CoordError::Refused(format!(
                "a lease TTL of {:?} is below the Redis coordinator's minimum of {TTL_MIN:?}: raise election.lease_ttl",
                spec.ttl
            )));
        }
        self.check_durability().await?;
        let previous = spec.previous.as_ref().map_or("", |lease| lease.0.as_str());
        let ttl = spec.ttl.as_millis().to_string();
        let new = uuid::Uuid::new_v4().to_string();
        let reply = self
            .write_fields(
                &self.scripts.open,
                &[
                    previous.as_bytes(),
                    spec.node_id.as_bytes(),
                    ttl.as_bytes(),
                    new.as_bytes(),
                ],
            )
            .await?;
        match reply.as_slice() {
            [kind, id] => Ok(Grant {
                lease: LeaseId(text(id).map_err(bad_answer)?),
                reused: kind.as_slice() == b"reused",
            }),
            _ => Err(bad_answer(format!("open answered {} fields", reply.len()))),
        }
    }

    /// One script, sent whole: one round trip (with its `WAIT`, if any), also on a Redis
    /// that lost its script cache.
    async fn keep_alive(&self, lease: &LeaseId) -> Result<Renewal, CoordError> {
        let answer: String = self
            .write_text(&self.scripts.keep_alive, &[lease.0.as_bytes()])
            .await?;
        Ok(if answer == "alive" {
            Renewal::Alive
        } else {
            Renewal::Gone
        })
    }

    /// Ends the lease by the script that checks it is still there. Closing is this too (the
    /// default `close`): nothing but the lease is tied to a node here.
    async fn revoke(&self, lease: &LeaseId) -> Result<(), CoordError> {
        self.write::<String>(&self.scripts.revoke, &[lease.0.as_bytes()])
            .await
            .map(drop)
    }
}
