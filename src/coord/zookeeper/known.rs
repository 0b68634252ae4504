//! What a ZooKeeper coordinator knows without reading it again: the guard of each lease's
//! latest leadership, as its win left it, and the tasks this process claimed, as their
//! claim's `multi` left them. `queue.rs` says why a write may rely on each (its `multi`'s
//! own checks fail if either moved) and reads whatever is not known here.

use std::collections::HashMap;

use zookeeper_client as zk;

use super::plan::{self, Seen, ZkOp};
use super::{election, layout, ZkCoordinator};
use crate::coord::{Effect, FencingToken, Holding, Leadership, LeaseId, TaskOp};

/// A leadership's guard as its win left it: the leader's latch and the marker's version.
#[derive(Clone, Debug)]
pub(super) struct Guarded {
    fencing_token: FencingToken,
    latch: String,
    latch_version: i32,
    marker_version: i32,
}

/// Tasks kept as this process's claims left them, at most; past it the record starts
/// again (a claim not completed here, by a lease that ended, is never looked up again).
const CLAIMED_KEPT: usize = 4_096;

impl ZkCoordinator {
    /// Records the guard of `leadership`, the latest of its lease.
    pub(super) fn remember_guard(
        &self,
        leadership: &Leadership,
        latch: &str,
        latch_version: i32,
        marker_version: i32,
    ) {
        self.guards().insert(
            leadership.lease.clone(),
            Guarded {
                fencing_token: leadership.fencing_token,
                latch: latch.to_string(),
                latch_version,
                marker_version,
            },
        );
    }

    /// The guard of `leadership` if it is the latest its lease won here.
    pub(super) fn known_guard(&self, leadership: &Leadership) -> Option<Vec<ZkOp>> {
        let guards = self.guards();
        let guarded = guards
            .get(&leadership.lease)
            .filter(|g| g.fencing_token == leadership.fencing_token)?;
        Some(election::guard(
            &self.settings.leader_key,
            &guarded.latch,
            guarded.latch_version,
            guarded.marker_version,
        ))
    }

    pub(super) fn forget_guard(&self, leadership: &Leadership) {
        let mut guards = self.guards();
        if guards
            .get(&leadership.lease)
            .is_some_and(|g| g.fencing_token == leadership.fencing_token)
        {
            guards.remove(&leadership.lease);
        }
    }

    /// After a committed write: each task claimed is kept as the claim left it (its new
    /// data version, the marker this session owns); every other task written is dropped.
    pub(super) fn remember_claimed(
        &self,
        session: i64,
        ops: &[TaskOp],
        seen: &HashMap<String, Seen>,
        written: &HashMap<&String, zk::Stat>,
    ) {
        let mut claimed = self.claimed();
        if claimed.len() >= CLAIMED_KEPT {
            claimed.clear();
        }
        for op in ops {
            claimed.remove(op.key());
            let Effect::Put {
                holding: Holding::Writer,
                ..
            } = op.effect()
            else {
                continue;
            };
            let key = &op.key().to_string();
            let (Some(stat), Some(before)) = (written.get(key), seen.get(key)) else {
                continue;
            };
            // A marker created by this claim is empty (version 0); one of this session's
            // own claims is kept as it was.
            let marker = before.claim.map_or(0, |claim| claim.data_version);
            claimed.insert(
                key.clone(),
                Seen {
                    data_version: stat.version,
                    version: layout::task_version(stat.mzxid, stat.pzxid),
                    claim: Some(plan::Claim {
                        owner: session,
                        data_version: marker,
                    }),
                },
            );
        }
    }

    /// After a write that did not commit: the tasks it named are read next time.
    pub(super) fn forget_claimed(&self, ops: &[TaskOp]) {
        let mut claimed = self.claimed();
        for op in ops {
            claimed.remove(op.key());
        }
    }

    fn guards(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseId, Guarded>> {
        self.guards
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn claimed(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        self.claimed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
