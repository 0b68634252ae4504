//! The election's pure decisions: given the holder a replica observed, what it does next.
//! No I/O and no clock; `mod.rs` performs what these return.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::time::Duration;

use crate::coord::{Holder, LeaseId};

/// What a replica does after observing the holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Another lease leads: watch for the next change.
    Watch,
    /// Leadership is free, but the last leader was another node and this replica prefers
    /// to let it come back: wait this long, then look again.
    Defer(Duration),
    /// Try to take leadership. Also when this very lease holds it already (a restart took
    /// its lease up): taking it anew raises the fencing token above any an earlier run of
    /// this replica handed out.
    Campaign,
}

/// Decides the next step. `prefer_previous` is `election.prefer_previous_leader`;
/// `deferred` says whether this replica has deferred once already in this campaign.
pub fn next_step(
    holder: &Holder,
    mine: &LeaseId,
    node_id: &str,
    prefer_previous: Duration,
    deferred: bool,
) -> Step {
    match &holder.lease {
        Some(lease) if lease == mine => Step::Campaign,
        Some(_) => Step::Watch,
        None => {
            let previous_elsewhere = holder
                .record
                .as_ref()
                .is_some_and(|record| record.node != node_id);
            if !prefer_previous.is_zero() && !deferred && previous_elsewhere {
                Step::Defer(prefer_previous)
            } else {
                Step::Campaign
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::{FencingToken, HolderRecord};

    fn holder(lease: Option<&str>, node: Option<&str>) -> Holder {
        Holder {
            lease: lease.map(|l| LeaseId(l.into())),
            record: node.map(|node| HolderRecord {
                node: node.into(),
                ..HolderRecord::default()
            }),
            token: FencingToken(7),
        }
    }

    const GRACE: Duration = Duration::from_secs(5);

    /// A held leadership is watched; a free one is contested; one held by this very lease
    /// (a restart) is taken anew.
    #[test]
    fn replicas_contest_only_free_or_own_leadership() {
        let mine = LeaseId("me".into());
        let step = |h: &Holder| next_step(h, &mine, "a", Duration::ZERO, false);
        assert_eq!(step(&holder(Some("other"), Some("b"))), Step::Watch);
        assert_eq!(step(&holder(None, Some("b"))), Step::Campaign);
        assert_eq!(step(&holder(None, None)), Step::Campaign);
        assert_eq!(step(&holder(Some("me"), Some("a"))), Step::Campaign);
    }

    /// With prefer_previous_leader, a replica that was not the last leader defers once;
    /// the last leader itself, and a replica that deferred already, contest at once.
    #[test]
    fn prefer_previous_leader_defers_others_once() {
        let mine = LeaseId("me".into());
        let free_after_b = holder(None, Some("b"));
        assert_eq!(
            next_step(&free_after_b, &mine, "a", GRACE, false),
            Step::Defer(GRACE)
        );
        assert_eq!(
            next_step(&free_after_b, &mine, "a", GRACE, true),
            Step::Campaign
        );
        assert_eq!(
            next_step(&holder(None, Some("a")), &mine, "a", GRACE, false),
            Step::Campaign
        );
        assert_eq!(
            next_step(&holder(None, None), &mine, "a", GRACE, false),
            Step::Campaign
        );
    }
}
