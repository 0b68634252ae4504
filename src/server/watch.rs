//! Reads and blocking queries: the latest committed snapshot, and queries that wait until
//! their result index passes the client's `index` or their wait (plus Consul's jitter) runs
//! out, woken only by commits that change something they read.
//!
//! `Committed` holds the latest committed state as an immutable snapshot behind an atomic
//! pointer: a read loads it without a lock and never waits for a commit on its way to disk.
//! A query's read runs on a `View` of that snapshot, which records what the read touched
//! (keys, prefixes, tables) in a `WatchSet`. A blocking query then parks under that set; the
//! writer publishes each commit with its `Changes`, and `WatchIndex` finds the parked queries
//! whose set meets them in time proportional to the keys changed and the queries woken, not
//! to the queries parked. A woken query reads again and returns only if its index moved, as
//! Consul's blocking loop does. A read the view cannot attribute falls back to waking on every
//! commit: never missed, only woken more often than needed.
//!
//! Consul (go-memdb over iradix) watches the radix node a read ended on: for a missing key
//! or an empty prefix often the root, so such a query returns on any write under it
//! (hashicorp/consul#9449). Here it wakes only when that key, or something under that
//! prefix, changes: the same answers, without the early returns clients tolerate anyway.
//!
//! This module owns the snapshot pointer and the waiting, not the rules of any endpoint.
//!
//! Size: the watch index, the recording view and publication are one mechanism; its tests
//! are in watch/tests.rs.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::state::{Changes, Check, Config, Entry, KvPrefix, Node, Session, State, TableIndexes};
use super::Core;

/// Consul's `default_query_time`: the wait when a client sends `index` without `wait`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// Consul's `max_query_time`: longer waits are clamped to this.
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// Consul adds up to wait/16 of random jitter (structs.JitterFraction).
const JITTER_FRACTION: u32 = 16;
/// Commits remembered so that a query whose read raced a commit can tell whether that
/// commit touched what it read, instead of reading again; a query further behind reads again.
const RECENT_COMMITS: usize = 64;

/// A client's `?index` and `?wait`, when `index` asks to block.
#[derive(Clone, Copy, Debug)]
pub struct Blocking {
    pub min_index: u64,
    pub wait: Duration,
}

impl Blocking {
    /// `index` absent or 0 means no blocking; `wait` defaults to 5m and is capped at 10m.
    pub fn new(min_index: u64, wait: Option<Duration>) -> Option<Blocking> {
        if min_index == 0 {
            return None;
        }
        let wait = match wait {
            None => DEFAULT_WAIT,
            Some(wait) if wait.is_zero() => DEFAULT_WAIT,
            Some(wait) => wait.min(MAX_WAIT),
        };
        Some(Blocking { min_index, wait })
    }

    fn deadline(&self) -> Instant {
        let jitter_max = self.wait / JITTER_FRACTION;
        let jitter = Duration::from_nanos(fastrand::u64(0..=jitter_max.as_nanos() as u64));
        Instant::now() + self.wait + jitter
    }
}

/// Runs `read` (which returns the result's index and the result) on the latest committed
/// snapshot and, when `blocking` asks for it, again after every commit that touches what it
/// read, until the index passes `min_index` or time is up. On time-out the latest result is
/// returned, whatever its index, as Consul does.
pub async fn query<T>(
    core: &Core,
    blocking: Option<Blocking>,
    read: impl Fn(&View) -> (u64, T),
) -> (u64, T) {
    let deadline = blocking.map(|b| b.deadline());
    loop {
        let snapshot = core.state.load_published();
        let view = View::new(&snapshot.state, blocking.is_some());
        let (index, result) = read(&view);
        let (Some(blocking), Some(deadline)) = (blocking, deadline) else {
            return (index, result);
        };
        if index > blocking.min_index || core.is_closing() {
            return (index, result);
        }
        let mut parked = match core.state.park(snapshot.generation, view.into_watch_set()) {
            Park::Parked(parked) => parked,
            // A commit that touched what we read landed after our snapshot: read again.
            Park::Stale => continue,
            Park::Closed => return (index, result),
        };
        // The snapshot is not needed while we wait; a parked query holds no old state.
        drop(snapshot);
        let woke = {
            // Counted while waiting, also when the client goes away and the wait is dropped.
            let _waiting = Waiting::new(&core.metrics.blocked_queries);
            tokio::select! {
                _ = parked.woken() => true,
                _ = tokio::time::sleep_until(deadline) => false,
            }
        };
        if !woke {
            return (index, result);
        }
        core.metrics.blocked_query_wakeups.inc();
    }
}

/// The tables a query can watch as a whole, beside KV keys and prefixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    Sessions,
    Checks,
    Nodes,
}

/// What one read touched: a commit that changes none of it cannot change the read's result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchSet {
    keys: BTreeSet<String>,
    prefixes: BTreeSet<String>,
    tables: BTreeSet<Table>,
    /// The read used something the view does not attribute: every commit touches it.
    everything: bool,
}

impl WatchSet {
    pub fn key(&mut self, key: &str) {
        if !self.keys.contains(key) {
            self.keys.insert(key.to_string());
        }
    }

    pub fn prefix(&mut self, prefix: &str) {
        if !self.prefixes.contains(prefix) {
            self.prefixes.insert(prefix.to_string());
        }
    }

    pub fn table(&mut self, table: Table) {
        self.tables.insert(table);
    }

    pub fn everything(&mut self) {
        self.everything = true;
    }

    /// Whether a commit with `changes` touches this set. The scan `WatchIndex` avoids; used
    /// for the few commits a parking query may have missed.
    pub fn is_touched_by(&self, changes: &Changes) -> bool {
        if changes.is_empty() {
            return false;
        }
        self.everything
            || changed_tables(changes).any(|table| self.tables.contains(&table))
            || changed_keys(changes).any(|key| {
                self.keys.contains(key) || self.prefixes.iter().any(|p| key.starts_with(p.as_str()))
            })
    }
}

/// KV keys a commit wrote, deleted, tombstoned or reaped.
fn changed_keys(changes: &Changes) -> impl Iterator<Item = &str> {
    changes
        .kv
        .iter()
        .chain(changes.tombstones.iter())
        .map(String::as_str)
}

fn changed_tables(changes: &Changes) -> impl Iterator<Item = Table> {
    [
        (!changes.sessions.is_empty()).then_some(Table::Sessions),
        (!changes.checks.is_empty()).then_some(Table::Checks),
        changes.node.then_some(Table::Nodes),
    ]
    .into_iter()
    .flatten()
}

/// Parked queries indexed by what they watch, so that a commit finds the ones it touches
/// without looking at the others. Pure: ids in, ids out.
#[derive(Debug, Default)]
pub struct WatchIndex {
    sets: HashMap<u64, WatchSet>,
    by_key: HashMap<String, HashSet<u64>>,
    by_prefix: HashMap<String, HashSet<u64>>,
    /// Length of every watched prefix, with how many watched prefixes have it: a changed key
    /// is looked up by its own prefixes of these lengths, so the cost per key is the number
    /// of distinct lengths (a queue prefix or two), not the number of prefixes.
    prefix_lengths: BTreeMap<usize, usize>,
    by_table: HashMap<Table, HashSet<u64>>,
    everything: HashSet<u64>,
}

impl WatchIndex {
    pub fn len(&self) -> usize {
        self.sets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    pub fn insert(&mut self, id: u64, set: WatchSet) {
        for key in &set.keys {
            self.by_key.entry(key.clone()).or_default().insert(id);
        }
        for prefix in &set.prefixes {
            let ids = self.by_prefix.entry(prefix.clone()).or_default();
            if ids.is_empty() {
                *self.prefix_lengths.entry(prefix.len()).or_default() += 1;
            }
            ids.insert(id);
        }
        for table in &set.tables {
            self.by_table.entry(*table).or_default().insert(id);
        }
        if set.everything {
            self.everything.insert(id);
        }
        self.sets.insert(id, set);
    }

    /// Forgets a query; false if it was not there (already woken).
    pub fn remove(&mut self, id: u64) -> bool {
        let Some(set) = self.sets.remove(&id) else {
            return false;
        };
        for key in &set.keys {
            remove_from(&mut self.by_key, key, id);
        }
        for prefix in &set.prefixes {
            if remove_from(&mut self.by_prefix, prefix, id) {
                let length = prefix.len();
                let count = self
                    .prefix_lengths
                    .get_mut(&length)
                    .expect("length counted");
                *count -= 1;
                if *count == 0 {
                    self.prefix_lengths.remove(&length);
                }
            }
        }
        for table in &set.tables {
            remove_from(&mut self.by_table, table, id);
        }
        self.everything.remove(&id);
        true
    }

    /// Removes and returns the queries that a commit with `changes` touches.
    pub fn take_touched(&mut self, changes: &Changes) -> BTreeSet<u64> {
        let mut touched = BTreeSet::new();
        if changes.is_empty() {
            return touched;
        }
        touched.extend(self.everything.iter().copied());
        for table in changed_tables(changes) {
            touched.extend(self.by_table.get(&table).into_iter().flatten().copied());
        }
        for key in changed_keys(changes) {
            touched.extend(self.by_key.get(key).into_iter().flatten().copied());
            for &length in self.prefix_lengths.range(..=key.len()).map(|(l, _)| l) {
                if key.is_char_boundary(length) {
                    let ids = self.by_prefix.get(&key[..length]);
                    touched.extend(ids.into_iter().flatten().copied());
                }
            }
        }
        for id in &touched {
            self.remove(*id);
        }
        touched
    }
}

/// Removes `id` under `key`; true when that left no id under it (and the key was dropped).
fn remove_from<K, Q>(map: &mut HashMap<K, HashSet<u64>>, key: &Q, id: u64) -> bool
where
    K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
    Q: std::hash::Hash + Eq + ?Sized,
{
    let Some(ids) = map.get_mut(key) else {
        return false;
    };
    ids.remove(&id);
    if ids.is_empty() {
        map.remove(key);
        return true;
    }
    false
}

/// A read of one snapshot that records what it touches. It offers the state's reads under
/// the same names, so an endpoint's read code does not change; any other use of the state
/// (through `Deref`) marks the read as touching everything.
pub struct View<'a> {
    state: &'a State,
    /// Off for a read that will not block, which has no use for its watch set.
    recording: bool,
    reads: RefCell<WatchSet>,
}

impl<'a> View<'a> {
    pub fn new(state: &'a State, recording: bool) -> View<'a> {
        View {
            state,
            recording,
            reads: RefCell::new(WatchSet::default()),
        }
    }

    pub fn into_watch_set(self) -> WatchSet {
        self.reads.into_inner()
    }

    fn record(&self, add: impl FnOnce(&mut WatchSet)) {
        if self.recording {
            add(&mut self.reads.borrow_mut());
        }
    }

    /// The global index moves with every write, so a read of it watches everything.
    pub fn index(&self) -> u64 {
        self.record(WatchSet::everything);
        self.state.index()
    }

    /// Table indexes are read beside the table they belong to, which records the watch.
    pub fn tables(&self) -> TableIndexes {
        self.state.tables()
    }

    /// Settings never change while the server runs.
    pub fn config(&self) -> &'a Config {
        self.state.config()
    }

    pub fn kv_get(&self, key: &str) -> Option<&'a Entry> {
        self.record(|set| set.key(key));
        self.state.kv_get(key)
    }

    pub fn kv_list<'b>(
        &'b self,
        prefix: &'b str,
    ) -> impl Iterator<Item = (&'b String, &'b Entry)> + 'b {
        self.record(|set| set.prefix(prefix));
        self.state.kv_list(prefix)
    }

    pub fn kv_prefix_owned(&self, prefix: &str) -> KvPrefix {
        self.record(|set| set.prefix(prefix));
        self.state.kv_prefix_owned(prefix)
    }

    pub fn kv_len(&self) -> usize {
        self.record(|set| set.prefix(""));
        self.state.kv_len()
    }

    pub fn tombstone(&self, key: &str) -> Option<u64> {
        self.record(|set| set.key(key));
        self.state.tombstone(key)
    }

    pub fn kv_key_index(&self, key: &str) -> u64 {
        self.record(|set| set.key(key));
        self.state.kv_key_index(key)
    }

    pub fn kv_prefix_index(&self, prefix: &str) -> u64 {
        self.record(|set| set.prefix(prefix));
        self.state.kv_prefix_index(prefix)
    }

    /// The same, for a reader that went over the prefix's entries already and found the
    /// newest at ModifyIndex `entries` (`State::kv_prefix_index_over`).
    pub fn kv_prefix_index_over(&self, prefix: &str, entries: u64) -> u64 {
        self.record(|set| set.prefix(prefix));
        self.state.kv_prefix_index_over(prefix, entries)
    }

    pub fn session(&self, id: &str) -> Option<&'a Session> {
        self.record(|set| set.table(Table::Sessions));
        self.state.session(id)
    }

    pub fn sessions(&self) -> impl Iterator<Item = &'a Session> {
        self.record(|set| set.table(Table::Sessions));
        self.state.sessions()
    }

    pub fn check(&self, id: &str) -> Option<&'a Check> {
        self.record(|set| set.table(Table::Checks));
        self.state.check(id)
    }

    pub fn checks(&self) -> impl Iterator<Item = &'a Check> {
        self.record(|set| set.table(Table::Checks));
        self.state.checks()
    }

    pub fn node(&self) -> Option<&'a Node> {
        self.record(|set| set.table(Table::Nodes));
        self.state.node()
    }
}

impl std::ops::Deref for View<'_> {
    type Target = State;

    /// A read the view has no method for: watch everything rather than miss a change.
    fn deref(&self) -> &State {
        self.record(WatchSet::everything);
        self.state
    }
}

/// One published commit: the state as of that commit, and its number.
pub struct Published {
    pub generation: u64,
    pub state: Arc<State>,
}

/// The latest committed state, and the queries parked until a commit touches their reads.
pub struct Committed {
    latest: ArcSwap<Published>,
    parked: Mutex<Parked>,
}

struct Parked {
    index: WatchIndex,
    wakers: HashMap<u64, oneshot::Sender<()>>,
    next_id: u64,
    /// The generation `latest` holds; changed only with this lock held.
    generation: u64,
    /// The last commits' changes, oldest first, for queries that parked late.
    recent: VecDeque<(u64, Arc<Changes>)>,
    closed: bool,
}

/// What `park` did with a query.
pub enum Park<'a> {
    Parked(Ticket<'a>),
    /// A commit after the query's snapshot touched what it read.
    Stale,
    /// The server is shutting down.
    Closed,
}

impl Committed {
    pub fn new(state: State) -> Committed {
        Committed {
            latest: ArcSwap::from_pointee(Published {
                generation: 0,
                state: Arc::new(state),
            }),
            parked: Mutex::new(Parked {
                index: WatchIndex::default(),
                wakers: HashMap::new(),
                next_id: 0,
                generation: 0,
                recent: VecDeque::new(),
                closed: false,
            }),
        }
    }

    /// The latest committed state. Never waits: a commit in flight is not visible yet.
    pub fn load(&self) -> Arc<State> {
        self.latest.load().state.clone()
    }

    /// The latest committed state, the way callers of the read lock it replaced ask for it.
    /// `async` only so that such callers compile unchanged; it never waits.
    pub async fn read(&self) -> Arc<State> {
        self.load()
    }

    pub fn load_published(&self) -> Arc<Published> {
        self.latest.load_full()
    }

    fn lock(&self) -> MutexGuard<'_, Parked> {
        // A panic while holding this lock leaves consistent maps behind (each step is a
        // single insert or remove), so a poisoned lock is still usable.
        self.parked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes `state` the latest committed state and wakes the queries `changes` touches.
    /// Only the writer calls it, after the commit that made `changes` is durable.
    pub fn publish(&self, state: State, changes: Changes) -> usize {
        let changes = Arc::new(changes);
        let (previous, woken) = {
            let mut parked = self.lock();
            parked.generation += 1;
            let generation = parked.generation;
            let previous = self.latest.swap(Arc::new(Published {
                generation,
                state: Arc::new(state),
            }));
            parked.recent.push_back((generation, changes.clone()));
            if parked.recent.len() > RECENT_COMMITS {
                parked.recent.pop_front();
            }
            let touched = parked.index.take_touched(&changes);
            let woken: Vec<_> = touched
                .into_iter()
                .filter_map(|id| parked.wakers.remove(&id))
                .collect();
            (previous, woken)
        };
        // Outside the lock: freeing what only the previous snapshot held can take a while.
        drop(previous);
        let count = woken.len();
        for waker in woken {
            let _ = waker.send(());
        }
        count
    }

    /// Parks a query that read the snapshot of `generation` and touched `set`, unless a
    /// later commit already touched it.
    pub fn park(&self, generation: u64, set: WatchSet) -> Park<'_> {
        let mut parked = self.lock();
        if parked.closed {
            return Park::Closed;
        }
        if generation != parked.generation {
            // Commits landed between the read and now; the index will see later ones.
            let missed = parked.generation - generation;
            let known = parked
                .recent
                .iter()
                .filter(|(at, _)| *at > generation)
                .count() as u64;
            let touched = parked
                .recent
                .iter()
                .filter(|(at, _)| *at > generation)
                .any(|(_, changes)| set.is_touched_by(changes));
            if known < missed || touched {
                return Park::Stale;
            }
        }
        let id = parked.next_id;
        parked.next_id += 1;
        let (waker, woken) = oneshot::channel();
        parked.index.insert(id, set);
        parked.wakers.insert(id, waker);
        Park::Parked(Ticket {
            committed: self,
            id,
            woken,
        })
    }

    /// Wakes every parked query and parks no more: the server is shutting down.
    pub fn close(&self) {
        let wakers: Vec<_> = {
            let mut parked = self.lock();
            parked.closed = true;
            parked.index = WatchIndex::default();
            parked.wakers.drain().map(|(_, waker)| waker).collect()
        };
        for waker in wakers {
            let _ = waker.send(());
        }
    }
}

/// A parked query's place; leaving it (woken, timed out or the client gone) unparks it.
pub struct Ticket<'a> {
    committed: &'a Committed,
    id: u64,
    woken: oneshot::Receiver<()>,
}

impl Ticket<'_> {
    /// Resolves when a commit touches the query's reads, or the server closes.
    pub async fn woken(&mut self) {
        let _ = (&mut self.woken).await;
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut parked = self.committed.lock();
        if parked.index.remove(self.id) {
            parked.wakers.remove(&self.id);
        }
    }
}

struct Waiting<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl<'a> Waiting<'a> {
    fn new(gauge: &'a prometheus_client::metrics::gauge::Gauge) -> Waiting<'a> {
        gauge.inc();
        Waiting(gauge)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests;
