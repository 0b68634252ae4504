//! The shards of a split queue among the replicas (`election.shards`), and moving a
//! deployment from one shard count to another.
//!
//! **Shares.** Each shard is an election of its own. A replica contends for a shard only
//! while it leads fewer than its share, ⌈S / live replicas⌉, counting the replicas whose
//! records are fresh (`replicas.rs`); a shard left without a leader for [`VACANT_GRACE`]
//! is contended for by any replica, so that a replica that died costs its shards no more
//! than its lease, whatever the records say yet. The replica leading the most hands its
//! highest shard over (the term ends as a rotation does: its runs end first) while another
//! leads two fewer, or it is over its share and another under: one handover at a time, to
//! a replica that contends at once.
//!
//! **Moving S.** The count the deployment runs with is recorded under
//! [`record_key`] (absent: 1). A replica whose count is not the recorded one contends for
//! nothing; it records its own once every leader key of the recorded count is free and no
//! live replica runs with the recorded count, then looks once more that those keys are
//! free before it contends. A replica that wins reads the record again and gives the win
//! up if it names another count. Either the winner's read comes after the move was
//! recorded (it gives up), or its win came before the mover's second look (the mover sees
//! it and waits): the two counts never lead at once while one move is under way.
//!
//! Pure: decisions take what was observed and answer what to do.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long a shard stays without a leader before a replica at its share contends too.
pub const VACANT_GRACE: Duration = Duration::from_millis(500);

/// Where the shard count of the election on `leader_key` is recorded.
pub fn record_key(leader_key: &str) -> String {
    format!("{}shards/{leader_key}", crate::config::OWN_NAMESPACE)
}

/// The recorded shard count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardsRecord {
    pub shards: u32,
}

impl ShardsRecord {
    /// The count a stored value records: absent, 1; a value that is not a record, `None`.
    pub fn read(value: Option<&[u8]>) -> Option<u32> {
        match value {
            None => Some(1),
            Some(value) => serde_json::from_slice::<ShardsRecord>(value)
                .ok()
                .map(|record| record.shards.max(1)),
        }
    }
}

/// How many shards a replica leads at most: ⌈S / live⌉ (a replica counts itself).
pub fn share(shards: u32, live: usize) -> usize {
    (shards as usize).div_ceil(live.max(1))
}

/// Whether a replica leading `led` shards contends for one now (under its share), or only
/// once the shard has been free for [`VACANT_GRACE`].
pub fn contends_at_once(led: usize, share: usize) -> bool {
    led < share
}

/// Whether a replica, `me`, hands one shard over now, each live replica of its count
/// (itself among them) given as its node and how many shards it leads. Only the replica
/// leading the most (the first node by name among equals) does, and only while it leads
/// more than its share and another leads less, or two more than another: so that a joining
/// replica gets its share one handover at a time, each to a replica under its share.
pub fn hands_over(me: &str, replicas: &[(&str, usize)], share: usize) -> bool {
    let Some(&(donor, most)) = replicas
        .iter()
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)))
    else {
        return false;
    };
    let least = replicas.iter().map(|(_, led)| *led).min().unwrap_or(most);
    donor == me && (most >= least + 2 || (most > share && least < share))
}

/// The shard a replica gives up first: its highest.
pub fn to_give(led: &BTreeSet<u32>) -> Option<u32> {
    led.last().copied()
}

/// The slots (runs at once) of the `rank`-th of the `led` shards a replica leads, so that
/// they add up to the replica's `concurrency` (each at least one).
pub fn slots(concurrency: usize, rank: usize, led: usize) -> usize {
    let led = led.max(1);
    (concurrency / led + usize::from(rank < concurrency % led)).max(1)
}

/// What a replica running with `mine` shards does about the recorded count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Move {
    /// The recorded count is its own: contend.
    Contend,
    /// Record its own count, then look again that the old keys are free.
    Record,
    /// Stand by, for the reason given.
    StandBy(String),
}

/// What a replica with `mine` shards does, the record naming `recorded` (`None`: a value
/// that is not a record), every leader key of the recorded count being free or not, and
/// `others_on_recorded` live replicas still running with the recorded count.
pub fn next_move(
    mine: u32,
    recorded: Option<u32>,
    old_keys_free: bool,
    others_on_recorded: usize,
) -> Move {
    let Some(recorded) = recorded else {
        return Move::StandBy(
            "the recorded shard count is not a record leaderq wrote; delete it to go on".into(),
        );
    };
    if recorded == mine {
        return Move::Contend;
    }
    if others_on_recorded > 0 {
        return Move::StandBy(format!(
            "the deployment runs with election.shards = {recorded} and this replica with {mine}: standing by until every replica runs with {mine} ({others_on_recorded} still on {recorded})"
        ));
    }
    if !old_keys_free {
        return Move::StandBy(format!(
            "moving from election.shards = {recorded} to {mine}: waiting for the leaders of the {recorded} shards to step down"
        ));
    }
    Move::Record
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_is_the_shards_over_the_live_replicas_rounded_up() {
        assert_eq!(share(6, 3), 2);
        assert_eq!(share(6, 4), 2);
        assert_eq!(share(6, 1), 6);
        assert_eq!(share(6, 0), 6);
        assert_eq!(share(2, 3), 1);
        assert_eq!(share(7, 2), 4);
        assert!(contends_at_once(1, 2));
        assert!(!contends_at_once(2, 2));
    }

    /// The replica leading the most hands one shard over while another leads two fewer,
    /// or it is over its share and another under; equals decide by node name.
    #[test]
    fn the_replica_leading_the_most_hands_one_over() {
        let joined = [("sa", 2), ("sb", 2), ("sc", 2), ("sd", 0)];
        assert!(hands_over("sa", &joined, 2));
        assert!(!hands_over("sb", &joined, 2));
        assert!(!hands_over("sd", &joined, 2));
        let balanced = [("sa", 1), ("sb", 2), ("sc", 2), ("sd", 1)];
        assert!(!hands_over("sb", &balanced, 2));
        let alone = [("sa", 6), ("sb", 0), ("sc", 0)];
        assert!(hands_over("sa", &alone, 2));
        let over = [("sa", 3), ("sb", 2), ("sc", 1)];
        assert!(hands_over("sa", &over, 2));
        assert!(!hands_over("sa", &[("sa", 6)], 6));
        assert_eq!(to_give(&[0, 4, 5].into()), Some(5));
        assert_eq!(to_give(&BTreeSet::new()), None);
    }

    /// A replica's slots are spread over the shards it leads, the first ones taking the
    /// remainder; every shard has one at least.
    #[test]
    fn a_replicas_slots_are_spread_over_its_shards() {
        let spread = |concurrency, led| -> Vec<usize> {
            (0..led).map(|rank| slots(concurrency, rank, led)).collect()
        };
        assert_eq!(spread(8, 6), [2, 2, 1, 1, 1, 1]);
        assert_eq!(spread(8, 3), [3, 3, 2]);
        assert_eq!(spread(8, 2), [4, 4]);
        assert_eq!(spread(1, 3), [1, 1, 1]);
        assert!(spread(8, 0).is_empty());
    }

    /// A replica contends under its own count; under another it stands by while the old
    /// count still runs anywhere, then records its own.
    #[test]
    fn a_move_waits_for_the_old_count_to_be_gone() {
        assert_eq!(next_move(4, Some(4), false, 3), Move::Contend);
        assert!(
            matches!(next_move(4, Some(2), true, 1), Move::StandBy(why) if why.contains("1 still on 2"))
        );
        assert!(
            matches!(next_move(4, Some(2), false, 0), Move::StandBy(why) if why.contains("step down"))
        );
        assert_eq!(next_move(4, Some(2), true, 0), Move::Record);
        assert!(matches!(next_move(1, None, true, 0), Move::StandBy(_)));
        assert_eq!(ShardsRecord::read(None), Some(1));
        assert_eq!(ShardsRecord::read(Some(br#"{"shards":4}"#)), Some(4));
        assert_eq!(ShardsRecord::read(Some(b"junk")), None);
        assert_eq!(
            record_key("consumerLeader"),
            "leaderq/shards/consumerLeader"
        );
    }
}
