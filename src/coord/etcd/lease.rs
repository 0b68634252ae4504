//! [`Leases`] as etcd leases: open (take up the previous lease if etcd still has it and its
//! owner key names this node, else grant one and attach an owner key to it), keep alive
//! (one keep-alive message per renewal), revoke (which deletes every key attached: the
//! campaign key and the claims, in one revision).
//!
//! Whether the lease is fresh enough to act on is the caller's judgement (from when its
//! keep-alives were sent); this file only asks etcd.

use crate::coord::etcd::client::{Kv, LeaseTimeToLive, Op, Range, Txn};
use crate::coord::etcd::layout::{lease_id, lease_number, ttl_seconds, Owner};
use crate::coord::{CoordError, Grant, LeaseId, LeaseSpec, Leases, Renewal};

use super::{not_a_lease, EtcdCoordinator};

/// Whether a previous lease may be taken up: etcd still has it (a lease it does not have
/// answers -1; one with less than a second left answers 0) and its owner key, attached to
/// it, names this node and says it knows claim records (a lease a replica from before
/// records opened is left to end: its owner key keeps this one from writing records).
pub fn is_own_live_lease(
    lease: i64,
    alive: &LeaseTimeToLive,
    owner_key: &str,
    owner: Option<&Kv>,
    node_id: &str,
) -> bool {
    alive.ttl >= 0
        && alive.keys.iter().any(|key| key == owner_key.as_bytes())
        && owner.is_some_and(|kv| {
            let owner = Owner::decode(&kv.value);
            kv.lease == lease && owner.node == node_id && owner.knows_records()
        })
}

impl Leases for EtcdCoordinator {
    fn describe(&self) -> String {
        format!("etcd at {}", self.client.endpoint())
    }

    /// Takes up `spec.previous` if it is still this node's own; otherwise grants a lease
    /// and attaches the owner key.
    async fn open_lease(&self, spec: &LeaseSpec) -> Result<Grant, CoordError> {
        if let Some(previous) = spec.previous.as_ref().and_then(lease_number) {
            let alive = self.client.lease_time_to_live(previous).await?;
            let owner_key = self.layout.owner(previous);
            let owner = self.client.range(&Range::key(owner_key.as_bytes())).await?;
            if is_own_live_lease(
                previous,
                &alive,
                &owner_key,
                owner.kvs.first(),
                &spec.node_id,
            ) {
                return Ok(Grant {
                    lease: lease_id(previous),
                    reused: true,
                });
            }
        }
        let seconds = ttl_seconds(spec.ttl);
        let granted = self.client.lease_grant(seconds).await?;
        if granted.id <= 0 {
            return Err(CoordError::Unavailable(
                "etcd granted a lease without an id".into(),
            ));
        }
        if granted.ttl > seconds {
            tracing::info!(
                asked = seconds,
                granted = granted.ttl,
                "etcd raised the lease TTL to its minimum"
            );
        }
        let owner = Txn {
            success: vec![Op::Put {
                key: self.layout.owner(granted.id).into_bytes(),
                value: Owner::encode(&spec.node_id),
                lease: granted.id,
            }],
            ..Txn::default()
        };
        if let Err(err) = self.client.txn(&owner).await {
            let _ = self.client.lease_revoke(granted.id).await;
            return Err(err.into());
        }
        Ok(Grant {
            lease: lease_id(granted.id),
            reused: false,
        })
    }

    /// One keep-alive; a TTL of 0 means etcd no longer has the lease.
    async fn keep_alive(&self, lease: &LeaseId) -> Result<Renewal, CoordError> {
        let id = lease_number(lease).ok_or_else(|| not_a_lease(lease))?;
        match self.client.lease_keep_alive(id).await {
            Ok(ttl) if ttl > 0 => Ok(Renewal::Alive),
            Ok(_) => Ok(Renewal::Gone),
            Err(err) if err.is_not_found() => Ok(Renewal::Gone),
            Err(err) => Err(err.into()),
        }
    }

    /// Revokes the lease, which deletes its campaign key, owner key and claims at once; a
    /// lease already gone is no error. Closing is this too (the default `close`): nothing
    /// else is tied to a node here.
    async fn revoke(&self, lease: &LeaseId) -> Result<(), CoordError> {
        let Some(id) = lease_number(lease) else {
            return Ok(());
        };
        self.won().remove(lease);
        self.client.lease_revoke(id).await.map_err(CoordError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(ttl: i64, keys: &[&str]) -> LeaseTimeToLive {
        LeaseTimeToLive {
            ttl,
            keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
        }
    }

    fn owner(lease: i64, node: &str) -> Kv {
        Kv {
            key: b"L.owner/a".to_vec(),
            value: Owner::encode(node),
            lease,
            version: 1,
            ..Kv::default()
        }
    }

    /// Only a live lease whose owner key, attached to it, names this node is taken up.
    #[test]
    fn only_a_live_lease_of_this_node_is_taken_up() {
        let key = "L.owner/a";
        assert!(is_own_live_lease(
            10,
            &alive(3, &[key]),
            key,
            Some(&owner(10, "n1")),
            "n1"
        ));
        assert!(!is_own_live_lease(
            10,
            &alive(-1, &[]),
            key,
            Some(&owner(10, "n1")),
            "n1"
        ));
        assert!(!is_own_live_lease(
            10,
            &alive(3, &[key]),
            key,
            Some(&owner(10, "n2")),
            "n1"
        ));
        assert!(!is_own_live_lease(
            10,
            &alive(3, &[key]),
            key,
            Some(&owner(11, "n1")),
            "n1"
        ));
        assert!(!is_own_live_lease(10, &alive(3, &[]), key, None, "n1"));
    }
}
