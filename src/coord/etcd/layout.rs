//! Where the etcd backend keeps things, and how etcd's numbers become the seam's: pure.
//!
//! With `election.leader_key = "consumerLeader"`:
//! - `consumerLeader/<lease-hex>`: a campaigner's key, attached to its lease and holding
//!   its [`HolderRecord`]; the one created first (lowest `create_revision`) leads, as in
//!   etcd's `concurrency.Election`, so `etcdctl elect -l consumerLeader` shows the leader;
//! - `consumerLeader`: the last leader's record and token, without a lease, kept for
//!   standbys (`prefer_previous_leader`) and `leaderq status` after it let go;
//! - `consumerLeader.owner/<lease-hex>`: the node id that opened the lease, attached to
//!   it, so a restart takes up only its own lease;
//! - `consumerLeader.claims/<task key>`: a task's claim, attached to the claiming lease,
//!   so it dies with it and the task is seen unheld (an orphan).
//!
//! `.` sorts before `/`, so the owner and claim keys lie outside the campaigners' prefix.
//!
//! A task's version is `2 × mod_revision`, plus 1 when no claim holds it: a claim that
//! dies with its lease writes nothing to the task, yet its version must move (the seam's
//! "versions" rule), and a write conditioned on it must check the claim as well. Queue and
//! leader positions ([`Version`]) are `2 × revision + 1`, so that a listing's position is
//! at or above every version it shows.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use serde::{Deserialize, Serialize};

use crate::coord::{HolderRecord, LeaseId, TaskVersion, Version};

/// The keys of one election and its claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    leader_key: String,
}

impl Layout {
    pub fn new(leader_key: &str) -> Layout {
        Layout {
            leader_key: leader_key.to_string(),
        }
    }

    /// The prefix every campaigner's key lies under.
    pub fn candidates(&self) -> String {
        format!("{}/", self.leader_key)
    }

    pub fn candidate(&self, lease: i64) -> String {
        format!("{}/{lease:x}", self.leader_key)
    }

    /// The last leader's record.
    pub fn last(&self) -> &str {
        &self.leader_key
    }

    pub fn owner(&self, lease: i64) -> String {
        format!("{}.owner/{lease:x}", self.leader_key)
    }

    pub fn claims(&self) -> String {
        format!("{}.claims/", self.leader_key)
    }

    pub fn claim(&self, task_key: &str) -> String {
        format!("{}{task_key}", self.claims())
    }
}

/// The seam's lease id for an etcd lease: its hex form, as `etcdctl` prints it.
pub fn lease_id(lease: i64) -> LeaseId {
    LeaseId(format!("{lease:x}"))
}

/// The etcd lease of a seam lease id; `None` for one that is not an etcd lease's.
pub fn lease_number(lease: &LeaseId) -> Option<i64> {
    i64::from_str_radix(lease.0.trim(), 16)
        .ok()
        .filter(|n| *n > 0)
}

/// A task's version from its `mod_revision` and whether a live claim holds it.
pub fn task_version(mod_revision: i64, held: bool) -> TaskVersion {
    TaskVersion(2 * mod_revision.max(0) as u64 + u64::from(!held))
}

/// The `mod_revision` a task version was read at, and whether it was held then.
pub fn read_version(version: TaskVersion) -> (i64, bool) {
    ((version.0 / 2) as i64, version.0.is_multiple_of(2))
}

/// The position of a read at `revision`.
pub fn position(revision: i64) -> Version {
    Version(2 * revision.max(0) as u64 + 1)
}

/// The revision a position was read at (0 for `Version(0)`, "now").
pub fn revision_of(version: Version) -> i64 {
    (version.0 / 2) as i64
}

/// What the last-leader key holds: the record, and the token it led with.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastLeader {
    #[serde(flatten)]
    pub record: HolderRecord,
    #[serde(default)]
    pub token: u64,
}

impl LastLeader {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(value: &[u8]) -> Option<LastLeader> {
        serde_json::from_slice(value).ok()
    }
}

/// Seconds of an etcd lease for a TTL: whole seconds, rounded up (etcd counts in seconds
/// and raises a TTL below its minimum itself), at least 1.
pub fn ttl_seconds(ttl: std::time::Duration) -> i64 {
    let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    seconds.max(1) as i64
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Campaigners sit under `<leader_key>/` by lease hex; owners and claims sort outside
    /// that prefix.
    #[test]
    fn keys_follow_the_leader_key() {
        let layout = Layout::new("consumerLeader");
        assert_eq!(layout.candidate(255), "consumerLeader/ff");
        assert_eq!(layout.owner(255), "consumerLeader.owner/ff");
        assert_eq!(
            layout.claim("oracleTask/t1"),
            "consumerLeader.claims/oracleTask/t1"
        );
        let prefix = layout.candidates();
        let end = crate::coord::etcd::client::prefix_end(prefix.as_bytes());
        for outside in [
            layout.owner(1),
            layout.claim("q/a"),
            layout.last().to_string(),
        ] {
            assert!(
                !(outside.as_bytes() >= prefix.as_bytes() && outside.as_bytes() < &end[..]),
                "{outside} lies among the candidates"
            );
        }
    }

    /// A claim's death moves the version; versions and positions read back.
    #[test]
    fn versions_move_when_a_claim_dies_and_read_back() {
        let held = task_version(7, true);
        let orphan = task_version(7, false);
        assert_ne!(held, orphan);
        assert_eq!(read_version(held), (7, true));
        assert_eq!(read_version(orphan), (7, false));
        assert!(position(7).0 >= orphan.0 && position(7) > position(6));
        assert_eq!(revision_of(position(7)), 7);
        assert_eq!(revision_of(Version(0)), 0);
    }

    /// Lease ids are hex both ways; anything else is no etcd lease.
    #[test]
    fn lease_ids_are_hex() {
        assert_eq!(lease_id(0x694d8a).0, "694d8a");
        assert_eq!(lease_number(&LeaseId("694d8a".into())), Some(0x694d8a));
        assert_eq!(lease_number(&LeaseId("not-hex".into())), None);
        assert_eq!(lease_number(&LeaseId("0".into())), None);
    }

    /// TTLs round up to whole seconds.
    #[test]
    fn ttls_round_up_to_seconds() {
        assert_eq!(ttl_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(ttl_seconds(Duration::from_secs(15)), 15);
        assert_eq!(ttl_seconds(Duration::from_millis(10)), 1);
    }

    /// The last leader's record reads as a plain holder record too.
    #[test]
    fn the_last_leader_is_a_holder_record_with_a_token() {
        let last = LastLeader {
            record: HolderRecord {
                node: "n1".into(),
                ..HolderRecord::default()
            },
            token: 42,
        };
        let value = last.encode();
        assert_eq!(LastLeader::decode(&value), Some(last.clone()));
        assert_eq!(HolderRecord::decode(&value), Some(last.record));
    }
}
