//! Which parked queries a commit wakes, what a view records, and how a commit is published:
//! plain values in, no server, no clock.

use std::time::Instant;

use super::*;
use crate::server::state::{Command, Config};

fn keys_set(keys: &[&str]) -> WatchSet {
    let mut set = WatchSet::default();
    for key in keys {
        set.key(key);
    }
    set
}

fn prefix_set(prefix: &str) -> WatchSet {
    let mut set = WatchSet::default();
    set.prefix(prefix);
    set
}

fn table_set(table: Table) -> WatchSet {
    let mut set = WatchSet::default();
    set.table(table);
    set
}

fn kv_changes(keys: &[&str]) -> Changes {
    Changes {
        kv: keys.iter().map(|key| key.to_string()).collect(),
        meta: true,
        ..Changes::default()
    }
}

fn ids(ids: &[u64]) -> BTreeSet<u64> {
    ids.iter().copied().collect()
}

/// A written key wakes the queries on that exact key and on every prefix of it, and those
/// watching everything; not a longer key, a longer prefix, another prefix or a table. Woken
/// queries leave the index.
#[test]
fn a_written_key_wakes_its_key_and_prefix_watchers_only() {
    let mut index = WatchIndex::default();
    index.insert(1, keys_set(&["a/b"]));
    index.insert(2, prefix_set("a/"));
    index.insert(3, prefix_set(""));
    index.insert(4, prefix_set("a/b/"));
    index.insert(5, keys_set(&["a/bc"]));
    index.insert(6, table_set(Table::Sessions));
    let mut everything = WatchSet::default();
    everything.everything();
    index.insert(7, everything);
    index.insert(8, prefix_set("b/"));
    index.insert(9, keys_set(&["x", "a/b"]));

    assert_eq!(
        index.take_touched(&kv_changes(&["a/b"])),
        ids(&[1, 2, 3, 7, 9])
    );
    assert_eq!(index.len(), 4);
    assert!(index.take_touched(&kv_changes(&["a/b", "x"])).is_empty());
    assert_eq!(index.take_touched(&kv_changes(&["a/b/c"])), ids(&[4]));
    assert_eq!(
        index.take_touched(&kv_changes(&["b/", "a/bc"])),
        ids(&[5, 8])
    );
    let sessions = Changes {
        sessions: ["s".to_string()].into(),
        ..Changes::default()
    };
    assert_eq!(index.take_touched(&sessions), ids(&[6]));
    assert!(index.is_empty());
}

/// A tombstone written or reaped is a change of its key; each table wakes its own
/// watchers; a commit that changed nothing wakes nobody, not even a watcher of everything.
#[test]
fn tombstones_and_tables_wake_their_watchers_and_an_empty_commit_nobody() {
    let mut index = WatchIndex::default();
    index.insert(1, prefix_set("jobs/"));
    index.insert(2, table_set(Table::Checks));
    index.insert(3, table_set(Table::Nodes));
    index.insert(4, table_set(Table::Sessions));
    let mut everything = WatchSet::default();
    everything.everything();
    index.insert(5, everything);

    assert!(index.take_touched(&Changes::default()).is_empty());
    let reaped = Changes {
        tombstones: ["jobs/1".to_string()].into(),
        ..Changes::default()
    };
    assert_eq!(index.take_touched(&reaped), ids(&[1, 5]));
    let node = Changes {
        node: true,
        checks: ["serfHealth".to_string()].into(),
        ..Changes::default()
    };
    assert_eq!(index.take_touched(&node), ids(&[2, 3]));
    assert_eq!(index.len(), 1);
}

/// A query that leaves (timed out, client gone) is forgotten entirely, prefix lengths
/// included, and is not reported woken later.
#[test]
fn a_removed_query_is_forgotten() {
    let mut index = WatchIndex::default();
    index.insert(1, prefix_set("jobs/"));
    index.insert(2, prefix_set("jobs/"));
    index.insert(3, keys_set(&["jobs/1"]));
    assert!(index.remove(1));
    assert!(!index.remove(1));
    assert_eq!(index.prefix_lengths.get(&5), Some(&1));
    assert!(index.remove(2) && index.remove(3));
    assert!(index.by_key.is_empty() && index.by_prefix.is_empty());
    assert!(index.prefix_lengths.is_empty());
    assert!(index.take_touched(&kv_changes(&["jobs/1"])).is_empty());
}

/// Prefixes are matched on whole characters: a key whose bytes at a watched prefix length
/// fall inside a character is skipped, not split.
#[test]
fn prefixes_match_multibyte_keys_on_character_boundaries() {
    let mut index = WatchIndex::default();
    index.insert(1, prefix_set("é"));
    index.insert(2, prefix_set("a"));
    index.insert(3, prefix_set("éa/"));
    assert_eq!(index.take_touched(&kv_changes(&["éa/1"])), ids(&[1, 3]));
    assert!(index.take_touched(&kv_changes(&["ü"])).is_empty());
}

/// The index wakes exactly the queries that a plain scan of every set says the commit
/// touches, over many generated sets and commits.
#[test]
fn the_index_agrees_with_a_plain_scan() {
    let mut rng = fastrand::Rng::with_seed(11);
    let words = ["", "a", "a/", "a/b", "a/b/", "a/bc", "b", "b/x", "é", "é/1"];
    let pick = |rng: &mut fastrand::Rng| words[rng.usize(..words.len())].to_string();
    for _ in 0..200 {
        let mut index = WatchIndex::default();
        let mut sets = Vec::new();
        for id in 0..8 {
            let mut set = WatchSet::default();
            for _ in 0..rng.usize(0..3) {
                set.key(&pick(&mut rng));
            }
            for _ in 0..rng.usize(0..2) {
                set.prefix(&pick(&mut rng));
            }
            if rng.u8(..10) == 0 {
                set.table(Table::Sessions);
            }
            if rng.u8(..20) == 0 {
                set.everything();
            }
            index.insert(id, set.clone());
            sets.push(set);
        }
        let mut changes = Changes::default();
        for _ in 0..rng.usize(0..3) {
            changes.kv.insert(pick(&mut rng));
        }
        if rng.bool() {
            changes.tombstones.insert(pick(&mut rng));
        }
        if rng.u8(..5) == 0 {
            changes.sessions.insert("s".into());
        }
        let expected: BTreeSet<u64> = (0..8)
            .filter(|id| sets[*id as usize].is_touched_by(&changes))
            .collect();
        assert_eq!(
            index.take_touched(&changes),
            expected,
            "{sets:?} {changes:?}"
        );
    }
}

fn written(state: &State, key: &str, value: &str) -> (State, Changes) {
    let mut next = state.clone();
    next.apply(
        Command::KvSet {
            key: key.into(),
            value: value.into(),
            flags: 0,
        },
        Instant::now(),
    )
    .unwrap();
    let changes = next.take_changes();
    (next, changes)
}

/// A view records each key, prefix and table a read touches; the global index or a read it
/// has no method for records everything.
#[test]
fn a_view_records_what_a_read_touched() {
    let (state, _) = written(&State::new(Config::default(), Instant::now()), "p/1", "x");
    let view = View::new(&state, true);
    assert!(view.kv_get("missing").is_none());
    assert_eq!(view.kv_list("p/").count(), 1);
    assert!(view.kv_prefix_index("q/") > 0);
    assert_eq!(view.sessions().count(), 0);
    let _ = view.tables();
    let mut expected = keys_set(&["missing"]);
    expected.prefix("p/");
    expected.prefix("q/");
    expected.table(Table::Sessions);
    assert_eq!(view.into_watch_set(), expected);

    let view = View::new(&state, true);
    assert!(view.index() > 0);
    assert!(view.into_watch_set().everything);
    let view = View::new(&state, true);
    assert!(view.lock_delay_until("p/1", Instant::now()).is_none());
    assert!(view.into_watch_set().everything);
}

/// Publishing swaps in the new state for every later read and wakes only the parked queries
/// it touches; the others stay parked until they leave.
#[test]
fn publishing_a_commit_shows_it_and_wakes_only_its_readers() {
    let empty = State::new(Config::default(), Instant::now());
    let committed = Committed::new(empty.clone());
    let seen = committed.load_published();
    let Park::Parked(mut on_a) = committed.park(seen.generation, keys_set(&["a"])) else {
        panic!("parks");
    };
    let Park::Parked(mut on_b) = committed.park(seen.generation, keys_set(&["b"])) else {
        panic!("parks");
    };

    let (next, changes) = written(&empty, "a", "1");
    assert_eq!(committed.publish(next, changes), 1);
    assert!(on_a.woken.try_recv().is_ok());
    assert!(on_b.woken.try_recv().is_err());
    assert_eq!(committed.load().kv_get("a").unwrap().value, b"1");
    assert!(
        seen.state.kv_get("a").is_none(),
        "a held snapshot never changes"
    );

    drop(on_b);
    drop(on_a);
    let parked = committed.lock();
    assert!(parked.index.is_empty() && parked.wakers.is_empty());
}

/// A query whose read raced a commit parks if that commit did not touch what it read, reads
/// again if it did, or if it is too far behind to know; after close nothing parks and the
/// parked are woken.
#[test]
fn a_query_behind_the_latest_commit_parks_only_if_it_missed_nothing() {
    let mut state = State::new(Config::default(), Instant::now());
    let committed = Committed::new(state.clone());
    let behind = committed.load_published().generation;
    let (next, changes) = written(&state, "a", "1");
    state = next.clone();
    committed.publish(next, changes);

    assert!(matches!(
        committed.park(behind, keys_set(&["a"])),
        Park::Stale
    ));
    let Park::Parked(mut parked) = committed.park(behind, keys_set(&["b"])) else {
        panic!("a commit to another key is no reason to read again");
    };
    for n in 0..RECENT_COMMITS {
        let (next, changes) = written(&state, "z", &n.to_string());
        state = next.clone();
        committed.publish(next, changes);
    }
    assert!(matches!(
        committed.park(behind, keys_set(&["b"])),
        Park::Stale
    ));

    committed.close();
    assert!(parked.woken.try_recv().is_ok());
    let latest = committed.load_published().generation;
    assert!(matches!(
        committed.park(latest, keys_set(&["b"])),
        Park::Closed
    ));
}
