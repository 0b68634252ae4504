//! The leader's watch on its own leadership record, for as long as a term lasts: the
//! record deleted, released or rewritten, or held by another lease, means the leadership
//! is gone *now*, not at the next renewal. `consume` and `run` both keep it; what to do
//! about a loss (stop the runs, step down) is theirs.
//!
//! The watch is the backend's `observe`: Consul's blocking read of the leader key (as
//! `api.Lock`'s monitor does), etcd's watch on the election prefix, ZooKeeper's watch on the
//! leader's own latch, Redis's changes channel with its poll. A coordinator that cannot be
//! asked is no loss by itself: the lease's own deadline decides that.

use std::time::Duration;

use crate::coord::{Coordinator, Holder, Leadership, Version};

/// After a failed observe, how long before the next: the lease's deadline, not this
/// watch, bounds how long a leader may act without the coordinator.
const OBSERVE_BACKOFF: Duration = Duration::from_millis(200);

/// Why `holder`, as observed, is not `leadership` any more; `None` while it still is.
pub fn lost(holder: &Holder, leadership: &Leadership) -> Option<String> {
    match &holder.lease {
        None => Some("leadership lost at the coordinator: the leader record was deleted or released (lease revoked or ended, or an operator's edit)".into()),
        Some(lease) if *lease != leadership.lease => Some(format!(
            "leadership lost at the coordinator: lease {lease} holds it now"
        )),
        Some(_) if holder.token != leadership.fencing_token => Some(format!(
            "leadership lost at the coordinator: the leader record was rewritten (fencing token {} there, {} won)",
            holder.token, leadership.fencing_token
        )),
        Some(_) => None,
    }
}

/// Resolves with the reason once `leadership` is seen lost at the coordinator.
pub async fn until_lost(
    coord: &dyn Coordinator,
    leadership: &Leadership,
    wait: Duration,
) -> String {
    let mut after = Version::default();
    loop {
        match coord.observe(after, wait).await {
            Ok((holder, version)) => {
                if let Some(reason) = lost(&holder, leadership) {
                    return reason;
                }
                after = version;
            }
            Err(err) => {
                tracing::debug!(error = %err, "cannot observe the leadership; the lease's deadline decides meanwhile");
                after = Version::default();
                tokio::time::sleep(OBSERVE_BACKOFF).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::{FencingToken, LeaseId};

    fn leadership() -> Leadership {
        Leadership {
            lease: LeaseId("a".into()),
            fencing_token: FencingToken(7),
        }
    }

    fn holder(lease: Option<&str>, token: u64) -> Holder {
        Holder {
            lease: lease.map(|l| LeaseId(l.into())),
            record: None,
            token: FencingToken(token),
        }
    }

    /// The record as won is no loss; deleted or released, another lease's, or rewritten
    /// under another token each is, with its reason.
    #[test]
    fn a_leadership_is_lost_when_its_record_is_gone_taken_or_rewritten() {
        assert_eq!(lost(&holder(Some("a"), 7), &leadership()), None);
        assert!(lost(&holder(None, 7), &leadership())
            .unwrap()
            .contains("deleted or released"));
        assert!(lost(&holder(Some("b"), 8), &leadership())
            .unwrap()
            .contains("lease b holds it"));
        assert!(lost(&holder(Some("a"), 9), &leadership())
            .unwrap()
            .contains("rewritten"));
    }
}
