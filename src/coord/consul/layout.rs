//! How the domain is laid out in Consul: a task is a KV entry under the queue's prefix (its
//! version the entry's `ModifyIndex`, `CreateIndex` ordering ties, its holder the lock's
//! `Session`); the leadership is the leader key, locked by the holder's session and holding
//! its [`HolderRecord`], whose token is read from the key's `ModifyIndex` and the record's
//! floor (`election.rs` says why); a lease is the session `leaderq:<node-id>`, bound to the
//! TTL check of the same id. Reading these shapes back into the seam's types is here.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use crate::coord::consul::client::KvPair;
use crate::coord::{FencingToken, Holder, HolderRecord, LeaseId, StoredTask, TaskVersion};

/// The id (and name suffix) of a node's check and session: `leaderq:<node-id>`.
pub fn check_id(node_id: &str) -> String {
    format!("leaderq:{node_id}")
}

/// A KV entry as the queue sees it.
pub fn stored_task(pair: KvPair) -> StoredTask {
    StoredTask {
        key: pair.key,
        value: pair.value,
        version: TaskVersion(pair.modify_index),
        created: pair.create_index,
        holder: pair.session.map(LeaseId),
    }
}

/// The token a held leader key stands for: the higher of its `ModifyIndex` (what the
/// win's write left) and its record's floor.
pub fn token_of(entry: &KvPair) -> FencingToken {
    let floor = HolderRecord::decode(&entry.value).and_then(|record| record.floor);
    FencingToken(entry.modify_index.max(floor.unwrap_or(0)))
}

/// The leadership as the leader key shows it. While the key is held, its token is
/// [`token_of`] it: nothing writes a held key but its holder's win, unless an operator
/// rewrites it, which also ends that leadership (the guard checks the index). A free key's
/// `ModifyIndex` is its release's (or its session's end), no token at all, so a free
/// leadership reports 0 (the next win reads the last record's floor all the same).
pub fn holder_of(entry: Option<KvPair>) -> Holder {
    match entry {
        None => Holder::default(),
        Some(entry) => Holder {
            record: HolderRecord::decode(&entry.value),
            token: if entry.session.is_some() {
                token_of(&entry)
            } else {
                FencingToken(0)
            },
            lease: entry.session.map(LeaseId),
        },
    }
}

/// The floor a win over `entry` (the leader key as read, if any) must write: above the
/// `asked` floor (the campaigning replica's) and above every token the key stood for. A
/// free key's index is its release's, above its holder's win's, so it counts too.
pub fn floor_over(entry: Option<&KvPair>, asked: Option<u64>) -> u64 {
    let last = entry.map_or(0, |entry| token_of(entry).0);
    last.saturating_add(1).max(asked.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The leader key written at `modify_index`; its LockIndex is 1, as on a key created
    /// anew, whatever that index.
    fn entry(session: Option<&str>, modify_index: u64, value: &[u8]) -> KvPair {
        KvPair {
            key: "consumerLeader".into(),
            value: value.to_vec(),
            flags: 0,
            session: session.map(str::to_string),
            lock_index: 1,
            create_index: 1,
            modify_index,
        }
    }

    fn pair(key: &str, modify_index: u64, lock_index: u64) -> KvPair {
        KvPair {
            key: key.into(),
            value: Vec::new(),
            flags: 0,
            session: None,
            lock_index,
            create_index: 1,
            modify_index,
        }
    }

    /// A KV entry's ModifyIndex is the task's version, CreateIndex its creation, its lock
    /// session the lease holding its claim.
    #[test]
    fn kv_entries_become_stored_tasks() {
        let mut entry = pair("q/a", 9, 2);
        entry.create_index = 4;
        entry.value = b"{}".to_vec();
        entry.session = Some("s1".into());
        assert_eq!(
            stored_task(entry),
            StoredTask {
                key: "q/a".into(),
                value: b"{}".to_vec(),
                version: TaskVersion(9),
                created: 4,
                holder: Some(LeaseId("s1".into())),
            }
        );
    }

    /// The holder is the lock's session, the record the value if it is one, the token the
    /// ModifyIndex (not the LockIndex); a free key keeps the last record but no token; no
    /// key is nobody.
    #[test]
    fn the_holder_is_read_from_the_leader_key() {
        let record = HolderRecord {
            node: "web-1".into(),
            session: "s1".into(),
            ..HolderRecord::default()
        };
        let held = holder_of(Some(entry(Some("s1"), 4, &record.encode())));
        assert_eq!(held.lease, Some(LeaseId("s1".into())));
        assert_eq!(held.record, Some(record.clone()));
        assert_eq!(held.token, FencingToken(4));
        let free = holder_of(Some(entry(None, 4, &record.encode())));
        assert_eq!(free.lease, None);
        assert_eq!(free.record, Some(record));
        assert_eq!(free.token, FencingToken(0));
        let foreign = holder_of(Some(entry(Some("s2"), 2, b"not json")));
        assert_eq!(foreign.record, None);
        assert_eq!(holder_of(None), Holder::default());
    }

    /// A win's floor is above the token the key stood for (its index, or its record's
    /// floor if higher, held or free) and never below the floor the replica asked for: a
    /// key whose index started over (a coordinator that lost its data) still yields a
    /// higher token than the record it holds.
    #[test]
    fn a_win_writes_a_floor_above_every_token_the_key_stood_for() {
        let record = |floor: Option<u64>| {
            HolderRecord {
                node: "web-1".into(),
                floor,
                ..HolderRecord::default()
            }
            .encode()
        };
        assert_eq!(floor_over(None, None), 1);
        assert_eq!(floor_over(None, Some(157)), 157);
        let old = entry(None, 40, &record(None));
        assert_eq!(floor_over(Some(&old), None), 41);
        assert_eq!(floor_over(Some(&old), Some(90)), 90);
        let wiped = entry(Some("s2"), 7, &record(Some(157)));
        assert_eq!(token_of(&wiped), FencingToken(157));
        assert_eq!(holder_of(Some(wiped.clone())).token, FencingToken(157));
        assert_eq!(floor_over(Some(&wiped), Some(100)), 158);
        let caught_up = entry(Some("s2"), 400, &record(Some(157)));
        assert_eq!(token_of(&caught_up), FencingToken(400));
    }
}
