//! Who is there: every replica (leader or standby) keeps a small record of itself under
//! [`prefix`] (derived from the leader key, so that queues sharing a coordinator keep
//! apart), written every heartbeat with an unconditional `Edit::Put`, since the seam lists
//! no other lease. `leaderq status` and the dashboard read them; a record whose heartbeat
//! is older than [`GONE_AFTER`] heartbeats shows as `gone`, and the leader deletes those
//! older than [`PRUNE_AFTER`] heartbeats. The pure part (views and pruning, time in) is
//! tested with scripted instants; [`keep_present`] only does the I/O.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::coord::{Coordinator, Edit, FencingToken, StoredTask, TaskVersion, Version};
use crate::task::rfc3339;

/// A record not renewed for this many heartbeats belongs to a replica that is gone.
pub const GONE_AFTER: u32 = 3;
/// The leader deletes records not renewed for this many heartbeats.
pub const PRUNE_AFTER: u32 = 20;

/// Where the replicas of the election on `leader_key` keep their records, one key per
/// node: under [`crate::config::OWN_NAMESPACE`], which no queue prefix may overlap (checked
/// at start).
pub fn prefix(leader_key: &str) -> String {
    format!("{}replicas/{leader_key}/", crate::config::OWN_NAMESPACE)
}

/// What a replica says of itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaRecord {
    pub node: String,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub pid: u32,
    /// `leader` or `standby`.
    pub state: String,
    /// The fencing token while it leads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<FencingToken>,
    /// Its lease, if it has one.
    #[serde(default)]
    pub lease: String,
    #[serde(default)]
    pub started_at: String,
    /// When it last wrote this record (RFC 3339).
    pub heartbeat_at: String,
    /// How often it writes it.
    pub heartbeat_every_ms: u64,
    /// The shard count it runs with (`election.shards`; records written before shards
    /// existed: 1).
    #[serde(default = "one_shard")]
    pub shards: u32,
    /// The shards it leads, with their fencing tokens (a split queue only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub led_shards: Vec<LedShard>,
}

fn one_shard() -> u32 {
    1
}

/// A shard a replica leads, in its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LedShard {
    pub shard: u32,
    pub fencing_token: FencingToken,
}

/// A record as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaView {
    #[serde(flatten)]
    pub record: ReplicaRecord,
    /// `leader`, `standby` or `gone` (no heartbeat for GONE_AFTER periods).
    pub status: String,
    /// Seconds since its last heartbeat.
    pub last_seen_seconds: i64,
}

fn heartbeat_of(record: &ReplicaRecord) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(&record.heartbeat_at)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// How long without a heartbeat `periods` heartbeats of `record` last.
fn periods(record: &ReplicaRecord, periods: u32) -> chrono::Duration {
    chrono::Duration::milliseconds(record.heartbeat_every_ms.max(1) as i64 * i64::from(periods))
}

/// The records as seen at `now`, leader first, then by node; values that are not records
/// are skipped.
pub fn view(stored: &[StoredTask], now: DateTime<Utc>) -> Vec<ReplicaView> {
    let mut views: Vec<ReplicaView> = stored
        .iter()
        .filter_map(|s| serde_json::from_slice::<ReplicaRecord>(&s.value).ok())
        .map(|record| {
            let seen = heartbeat_of(&record);
            let age = seen.map_or(chrono::Duration::MAX, |at| now - at);
            let status = if age > periods(&record, GONE_AFTER) {
                "gone".to_string()
            } else {
                record.state.clone()
            };
            ReplicaView {
                last_seen_seconds: seen.map_or(-1, |at| (now - at).num_seconds().max(0)),
                status,
                record,
            }
        })
        .collect();
    views.sort_by(|a, b| {
        (a.status != "leader", a.status == "gone", &a.record.node).cmp(&(
            b.status != "leader",
            b.status == "gone",
            &b.record.node,
        ))
    });
    views
}

/// The stored records to delete at `now`: not renewed for PRUNE_AFTER heartbeats, or not
/// records at all.
pub fn to_prune(stored: &[StoredTask], now: DateTime<Utc>) -> Vec<(String, TaskVersion)> {
    stored
        .iter()
        .filter(|s| {
            match serde_json::from_slice::<ReplicaRecord>(&s.value)
                .ok()
                .and_then(|r| heartbeat_of(&r).map(|at| (r, at)))
            {
                Some((record, at)) => now - at > periods(&record, PRUNE_AFTER),
                None => true,
            }
        })
        .map(|s| (s.key.clone(), s.version))
        .collect()
}

/// Who this replica is, for its record.
#[derive(Clone, Debug)]
pub struct Me {
    pub node: String,
    pub key: String,
    pub prefix: String,
    pub every: Duration,
    pub started_at: String,
    /// The shard count it runs with.
    pub shards: u32,
}

/// This replica's standing, as the service loop publishes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Standing {
    /// The fencing token while it leads (a split queue: its lowest shard's).
    pub leading: Option<FencingToken>,
    /// The shards it leads, a split queue only.
    pub shards: Vec<LedShard>,
}

fn record(me: &Me, lease: &super::Lease, standing: &Standing) -> ReplicaRecord {
    ReplicaRecord {
        node: me.node.clone(),
        host: crate::util::hostname(),
        pid: std::process::id(),
        state: if standing.leading.is_some() {
            "leader"
        } else {
            "standby"
        }
        .into(),
        fencing_token: standing.leading,
        lease: lease.id().map(|id| id.0).unwrap_or_default(),
        started_at: me.started_at.clone(),
        heartbeat_at: rfc3339(Utc::now()),
        heartbeat_every_ms: me.every.as_millis() as u64,
        shards: me.shards,
        led_shards: standing.shards.clone(),
    }
}

/// Writes this replica's record every `me.every` and at once when its standing changes;
/// while it leads, also deletes the records of replicas long gone. On `stop` it deletes
/// its own record. Errors are logged at debug and left for the next heartbeat: presence is
/// for operators and must never disturb the replica.
pub async fn keep_present(
    coord: std::sync::Arc<dyn Coordinator>,
    me: Me,
    lease: std::sync::Arc<super::Lease>,
    mut standing: watch::Receiver<Standing>,
    stop: CancellationToken,
) {
    loop {
        let now = standing.borrow_and_update().clone();
        let value = serde_json::to_vec(&record(&me, &lease, &now)).expect("a record serializes");
        let put = [Edit::Put {
            key: me.key.clone(),
            value,
        }];
        if let Err(err) = coord.edit(&put).await {
            tracing::debug!(error = %err, "cannot write this replica's record; trying at the next heartbeat");
        }
        if now.leading.is_some() {
            prune(coord.as_ref(), &me.prefix).await;
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            changed = standing.changed() => if changed.is_err() { stop.cancelled().await; break },
            _ = tokio::time::sleep(me.every) => {}
        }
    }
    let keys = [me.key.clone()];
    if let Ok(mine) = coord.get(&keys).await {
        let delete: Vec<Edit> = mine
            .into_iter()
            .map(|s| Edit::Delete {
                key: s.key,
                version: s.version,
            })
            .collect();
        let _ = coord.edit(&delete).await;
    }
}

async fn prune(coord: &dyn Coordinator, prefix: &str) {
    let Ok((stored, _)) = coord.list(prefix, Version(0), Duration::ZERO).await else {
        return;
    };
    let delete: Vec<Edit> = to_prune(&stored, Utc::now())
        .into_iter()
        .map(|(key, version)| Edit::Delete { key, version })
        .collect();
    if !delete.is_empty() {
        tracing::info!(
            count = delete.len(),
            "deleting the records of replicas long gone"
        );
        let _ = coord.edit(&delete).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn stored(node: &str, state: &str, heartbeat: i64, every_ms: u64) -> StoredTask {
        let record = ReplicaRecord {
            node: node.into(),
            state: state.into(),
            heartbeat_at: rfc3339(Utc.timestamp_opt(heartbeat, 0).unwrap()),
            heartbeat_every_ms: every_ms,
            shards: 1,
            ..ReplicaRecord::default()
        };
        StoredTask {
            key: format!("p/{node}"),
            value: serde_json::to_vec(&record).unwrap(),
            version: TaskVersion(7),
            ..StoredTask::default()
        }
    }

    /// A replica is shown as it says until it misses GONE_AFTER heartbeats, then as gone;
    /// the leader comes first, the gone last.
    #[test]
    fn a_replica_without_heartbeats_shows_as_gone() {
        let now = Utc.timestamp_opt(1000, 0).unwrap();
        let records = [
            stored("c", "standby", 990, 1000),
            stored("b", "standby", 999, 1000),
            stored("a", "leader", 1000, 1000),
        ];
        let views = view(&records, now);
        let shown: Vec<(&str, &str, i64)> = views
            .iter()
            .map(|v| {
                (
                    v.record.node.as_str(),
                    v.status.as_str(),
                    v.last_seen_seconds,
                )
            })
            .collect();
        assert_eq!(
            shown,
            [("a", "leader", 0), ("b", "standby", 1), ("c", "gone", 10)]
        );
    }

    /// Records go after PRUNE_AFTER missed heartbeats, and values that are no records at
    /// once; recent ones stay.
    #[test]
    fn records_long_gone_are_pruned() {
        let now = Utc.timestamp_opt(1000, 0).unwrap();
        let mut junk = stored("j", "standby", 0, 1);
        junk.value = b"not a record".to_vec();
        let records = [
            stored("old", "standby", 1000 - 21, 1000),
            stored("new", "standby", 1000 - 19, 1000),
            junk,
        ];
        assert_eq!(
            to_prune(&records, now),
            [
                ("p/old".to_string(), TaskVersion(7)),
                ("p/j".to_string(), TaskVersion(7))
            ]
        );
    }
}
