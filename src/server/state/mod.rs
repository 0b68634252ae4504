//! The embedded server's rules: KV entries, locks, sessions, checks, the global index and
//! every timer, as a pure state machine.
//!
//! `State::apply(command, now)` runs one write and returns its outcome; `next_deadline()` and
//! `expire(now)` drive session TTLs, check TTLs, lock-delay clean-up and tombstone reaping.
//! Nothing here does I/O, reads the clock or knows about HTTP: `store.rs` persists what
//! `take_changes()` reports, and `http/` turns outcomes into Consul's answers. The rules
//! follow `shared/consul-semantics.md` (newest Consul behaviour where versions differ).
//!
//! By table: `kv.rs` (entries, locks, tombstones, txn), `sessions.rs` (sessions, checks,
//! the node), `catalog.rs` (services); `model.rs` holds the data model, commands and
//! outcomes. This file holds the machine itself: apply, timers, reads.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::collections::BTreeSet;
use std::sync::Arc;

use imbl::{HashMap, OrdMap, Vector};
use std::time::{Duration, Instant};

use crate::util::duration;

pub mod catalog;
mod kv;
mod model;
mod sessions;
pub use catalog::{Service, ServiceCheckSpec, ServiceSpec, Weights};

/// Consul runs a session's timer for TTL times this (structs.SessionTTLMultiplier).
pub const SESSION_TTL_MULTIPLIER: u32 = 2;
/// The largest TTL a session may ask for (structs.SessionTTLMax).
pub const SESSION_TTL_MAX: Duration = Duration::from_secs(24 * 3600);
/// Consul's default `session_ttl_min`; tests lower it with `--session-ttl-min`.
pub const DEFAULT_SESSION_TTL_MIN: Duration = Duration::from_secs(10);
/// Lock-delay is capped at this no matter what a session asks for (structs.MaxLockDelay).
pub const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);
/// Lock-delay of a session that does not choose one.
pub const DEFAULT_LOCK_DELAY: Duration = Duration::from_secs(15);
/// Tombstones keep prefix indexes from going backwards; Consul reaps them after this long.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(15 * 60);
/// How many of the newest tombstones a prefix index looks among before it goes over the
/// prefix's own: enough to step over a few deletes elsewhere, a bounded cost when none is
/// under the prefix.
const RECENT_TOMBSTONES: usize = 64;
/// The node health check every agent has and default sessions are bound to.
pub const SERF_CHECK_ID: &str = "serfHealth";

pub use model::*;

/// The whole state. The writer clones it once per commit to publish an immutable snapshot
/// for readers, so every collection that grows with the data is an `imbl` persistent one: a
/// clone shares its nodes, and a write afterwards copies only the path it changes.
#[derive(Clone)]
pub struct State {
    config: Config,
    index: u64,
    tables: TableIndexes,
    /// Entries behind `Arc`s, so that copying a tree node on write copies pointers, not values.
    kv: OrdMap<String, Arc<Entry>>,
    /// key -> index of the delete that removed it.
    tombstones: OrdMap<String, u64>,
    /// Reap order: tombstones are created with a monotonic `now`, so the front is oldest;
    /// and with a rising index, so the back is newest (a restore queues them by index).
    tombstone_reaps: Vector<(Instant, String, u64)>,
    sessions: OrdMap<String, Session>,
    /// session id -> keys it holds, so invalidation does not scan the whole KV.
    held: HashMap<String, BTreeSet<String>>,
    checks: OrdMap<String, Check>,
    /// The agent's services by id (`catalog.rs`).
    services: OrdMap<String, Service>,
    node: Option<Node>,
    /// In memory only, like Consul's: lost on restart.
    lock_delays: HashMap<String, Instant>,
    session_deadlines: HashMap<String, Instant>,
    check_deadlines: HashMap<String, Instant>,
    changes: Changes,
    /// Set while a txn runs, so mutations can be rolled back.
    undo: Option<Vec<Undo>>,
    /// Whether the write being applied used index `self.index + 1`.
    index_used: bool,
}

impl State {
    /// An empty state whose timers start at `now`.
    pub fn new(config: Config, now: Instant) -> State {
        State::restore(config, Snapshot::default(), now)
    }

    /// Rebuilds the state from what was persisted. Timers start afresh at `now`, as
    /// Consul's do after a leader election; lock-delays are gone, as in Consul.
    pub fn restore(config: Config, snapshot: Snapshot, now: Instant) -> State {
        let mut state = State {
            config,
            index: snapshot.index,
            tables: snapshot.tables,
            kv: OrdMap::new(),
            tombstones: OrdMap::new(),
            tombstone_reaps: Vector::new(),
            sessions: OrdMap::new(),
            held: HashMap::new(),
            checks: OrdMap::new(),
            services: snapshot
                .services
                .into_iter()
                .map(|service| (service.id.clone(), service))
                .collect(),
            node: snapshot.node,
            lock_delays: HashMap::new(),
            session_deadlines: HashMap::new(),
            check_deadlines: HashMap::new(),
            changes: Changes::default(),
            undo: None,
            index_used: false,
        };
        for (key, entry) in snapshot.kv {
            if let Some(session) = &entry.session {
                state
                    .held
                    .entry(session.clone())
                    .or_default()
                    .insert(key.clone());
            }
            state.kv.insert(key, Arc::new(entry));
        }
        // Queued for reaping in the order of their indexes, as they were written (the
        // newest under a prefix is looked for from the back).
        let mut tombstones = snapshot.tombstones;
        tombstones.sort_by_key(|(_, index)| *index);
        for (key, index) in tombstones {
            state
                .tombstone_reaps
                .push_back((now + TOMBSTONE_TTL, key.clone(), index));
            state.tombstones.insert(key, index);
        }
        for session in snapshot.sessions {
            if let Some(ttl) = session.ttl_duration() {
                state
                    .session_deadlines
                    .insert(session.id.clone(), now + ttl * SESSION_TTL_MULTIPLIER);
            }
            state.sessions.insert(session.id.clone(), session);
        }
        for check in snapshot.checks {
            if let Some(ttl) = check.ttl {
                state.check_deadlines.insert(check.id.clone(), now + ttl);
            }
            state.checks.insert(check.id.clone(), check);
        }
        state
    }

    // ----- reads -----

    pub fn index(&self) -> u64 {
        self.index
    }

    pub fn tables(&self) -> TableIndexes {
        self.tables
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn kv_get(&self, key: &str) -> Option<&Entry> {
        self.kv.get(key).map(Arc::as_ref)
    }

    /// Entries whose key starts with `prefix` (a byte prefix), in key order.
    pub fn kv_list<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a String, &'a Entry)> {
        prefix_from(&self.kv, prefix, std::ops::Bound::Included(prefix))
    }

    /// The entries under `prefix` in an owned copy of the KV map (O(1): the map is
    /// persistent), to be walked after this read returns: a large listing is written out
    /// while later commits land, as it stood when it was read.
    pub fn kv_prefix_owned(&self, prefix: &str) -> KvPrefix {
        KvPrefix {
            kv: self.kv.clone(),
            prefix: prefix.to_string(),
        }
    }

    pub fn kv_len(&self) -> usize {
        self.kv.len()
    }

    pub fn tombstone(&self, key: &str) -> Option<u64> {
        self.tombstones.get(key).copied()
    }

    /// X-Consul-Index of a single-key read: the entry's ModifyIndex, or the KV tables'
    /// index when the key is missing; never 0.
    pub fn kv_key_index(&self, key: &str) -> u64 {
        match self.kv.get(key) {
            Some(entry) => entry.modify_index,
            None => self.kv_table_index().max(1),
        }
    }

    /// X-Consul-Index of a prefix listing: the newest entry or tombstone under the prefix,
    /// falling back to the KV tables' index when there is none; never 0.
    pub fn kv_prefix_index(&self, prefix: &str) -> u64 {
        let entries = self
            .kv_list(prefix)
            .map(|(_, entry)| entry.modify_index)
            .max()
            .unwrap_or(0);
        self.kv_prefix_index_over(prefix, entries)
    }

    /// [`State::kv_prefix_index`] for a reader that went over the entries under `prefix`
    /// already, the newest of them at ModifyIndex `entries` (0: none): a listing then
    /// reads its entries once, not twice.
    pub fn kv_prefix_index_over(&self, prefix: &str, entries: u64) -> u64 {
        if prefix.is_empty() {
            return self.kv_table_index().max(1);
        }
        match entries.max(self.newest_tombstone_under(prefix)) {
            0 => self.kv_table_index().max(1),
            index => index,
        }
    }

    /// The index of the newest tombstone under `prefix`, 0 if none. The reap queue holds
    /// tombstones in the order of their indexes, so under a prefix deleted from lately (a
    /// queue being drained, whose tombstones number as many as the tasks it ran in 15
    /// minutes) the newest is among the last few queued; otherwise the prefix's own
    /// tombstones are gone over. A queued tombstone the map no longer holds at that index
    /// (reaped, written again, or rolled back) is passed over.
    fn newest_tombstone_under(&self, prefix: &str) -> u64 {
        let recent = self.tombstone_reaps.iter().rev().take(RECENT_TOMBSTONES);
        for (_, key, index) in recent {
            if key.starts_with(prefix) && self.tombstones.get(key) == Some(index) {
                return *index;
            }
        }
        self.tombstones
            .range::<_, str>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(_, index)| *index)
            .max()
            .unwrap_or(0)
    }

    fn kv_table_index(&self) -> u64 {
        self.tables.kvs.max(self.tables.tombstones)
    }

    pub fn session(&self, id: &str) -> Option<&Session> {
        self.sessions.get(id)
    }

    /// Sessions in ID order, as Consul's memdb iterates them.
    pub fn sessions(&self) -> impl Iterator<Item = &Session> {
        self.sessions.values()
    }

    pub fn check(&self, id: &str) -> Option<&Check> {
        self.checks.get(id)
    }

    pub fn checks(&self) -> impl Iterator<Item = &Check> {
        self.checks.values()
    }

    pub fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }

    pub fn lock_delay_until(&self, key: &str, now: Instant) -> Option<Instant> {
        self.lock_delays
            .get(key)
            .copied()
            .filter(|until| *until > now)
    }

    /// Hands the persistence layer what changed since the last call.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    // ----- writes -----

    /// Applies one write at time `now`.
    pub fn apply(&mut self, command: Command, now: Instant) -> Result<Outcome, ApplyError> {
        self.index_used = false;
        let idx = self.index + 1;
        let outcome = self.dispatch(command, idx, now);
        if self.index_used {
            self.index = idx;
            self.changes.meta = true;
        }
        outcome
    }

    fn dispatch(
        &mut self,
        command: Command,
        idx: u64,
        now: Instant,
    ) -> Result<Outcome, ApplyError> {
        match command {
            Command::KvSet { key, value, flags } => {
                self.kv_set(idx, &key, value, flags);
                Ok(Outcome::Bool(true))
            }
            Command::KvCas {
                key,
                value,
                flags,
                index,
            } => Ok(Outcome::Bool(
                self.kv_cas(idx, &key, value, flags, index).is_some(),
            )),
            Command::KvLock {
                key,
                value,
                flags,
                session,
            } => {
                // Consul checks lock-delay on the leader before anything else, so a key under
                // lock-delay answers `false` even for a session that does not exist.
                if self.lock_delay_until(&key, now).is_some() {
                    return Ok(Outcome::Bool(false));
                }
                let entry = self.kv_lock(idx, &key, value, flags, &session)?;
                Ok(Outcome::Bool(entry.is_some()))
            }
            Command::KvUnlock {
                key,
                value,
                flags,
                session,
            } => {
                let entry = self.kv_unlock(idx, &key, value, flags, &session)?;
                Ok(Outcome::Bool(entry.is_some()))
            }
            Command::KvDelete { key } => {
                self.kv_delete(idx, &key, now);
                Ok(Outcome::Bool(true))
            }
            Command::KvDeleteCas { key, index } => {
                Ok(Outcome::Bool(self.kv_delete_cas(idx, &key, index, now)))
            }
            Command::KvDeleteTree { prefix } => {
                self.kv_delete_tree(idx, &prefix, now);
                Ok(Outcome::Bool(true))
            }
            Command::Txn(ops) => Ok(self.txn(idx, &ops, now)),
            Command::SessionCreate(spec) => self.session_create(idx, spec, now),
            Command::SessionDestroy { id } => {
                self.session_destroy(idx, &id, now);
                Ok(Outcome::Done)
            }
            Command::SessionRenew { id } => Ok(Outcome::Renewed(self.session_renew(&id, now))),
            Command::CheckRegister(spec) => {
                self.check_register(idx, spec, now);
                Ok(Outcome::Done)
            }
            Command::CheckUpdate { id, status, output } => {
                self.check_update(idx, &id, status, output, now)?;
                Ok(Outcome::Done)
            }
            Command::CheckDeregister { id } => {
                self.check_deregister(idx, &id, now)?;
                Ok(Outcome::Done)
            }
            Command::RegisterNode { name, id, address } => {
                self.register_node(idx, name, id, address, now);
                Ok(Outcome::Done)
            }
            Command::ServiceRegister(spec) => Ok(self.service_register(idx, spec, now)),
            Command::ServiceDeregister { id } => self.service_deregister(idx, &id, now),
            Command::Maintenance {
                service,
                enable,
                reason,
            } => self.maintenance(idx, service.as_deref(), enable, reason, now),
        }
    }

    // ----- timers -----

    /// The earliest instant at which `expire` has work to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let sessions = self.session_deadlines.values().min().copied();
        let checks = self.check_deadlines.values().min().copied();
        let tombstones = self.tombstone_reaps.front().map(|(at, _, _)| *at);
        [sessions, checks, tombstones].into_iter().flatten().min()
    }

    /// Runs every timer due at `now`: TTL checks go critical (invalidating their sessions),
    /// TTL sessions are destroyed, lock-delays end and old tombstones are reaped. Each
    /// invalidation is its own write with its own index, as in Consul.
    pub fn expire(&mut self, now: Instant) {
        let mut due_checks: Vec<String> = self
            .check_deadlines
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        due_checks.sort();
        for id in due_checks {
            self.check_deadlines.remove(&id);
            let output = match self.checks.get(&id) {
                Some(check) if !check.output.is_empty() && check.output != "TTL expired" => {
                    format!(
                        "TTL expired (last output before timeout follows): {}",
                        check.output
                    )
                }
                _ => "TTL expired".to_string(),
            };
            self.apply_timer(|state, idx| {
                state.set_check_status(idx, &id, CheckStatus::Critical, output, now);
            });
        }

        let mut due_sessions: Vec<String> = self
            .session_deadlines
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        due_sessions.sort();
        for id in due_sessions {
            self.apply_timer(|state, idx| state.session_destroy(idx, &id, now));
        }

        self.lock_delays.retain(|_, until| *until > now);

        while let Some((at, _, _)) = self.tombstone_reaps.front() {
            if *at > now {
                break;
            }
            let (_, key, index) = self.tombstone_reaps.pop_front().expect("front exists");
            // A newer delete of the same key queued its own reap; leave that tombstone.
            if self.tombstones.get(&key) == Some(&index) {
                self.tombstones.remove(&key);
                self.changes.tombstones.insert(key);
            }
        }
    }

    fn apply_timer(&mut self, write: impl FnOnce(&mut State, u64)) {
        self.index_used = false;
        let idx = self.index + 1;
        write(self, idx);
        if self.index_used {
            self.index = idx;
            self.changes.meta = true;
        }
    }
}

/// A prefix's entries as one read saw them, owned ([`State::kv_prefix_owned`]).
pub struct KvPrefix {
    kv: OrdMap<String, Arc<Entry>>,
    prefix: String,
}

impl KvPrefix {
    /// A prefix of these entries, as a read of a state holding them would take it.
    #[cfg(test)]
    pub fn of(entries: Vec<(String, Entry)>, prefix: &str) -> KvPrefix {
        KvPrefix {
            kv: entries.into_iter().map(|(k, e)| (k, Arc::new(e))).collect(),
            prefix: prefix.to_string(),
        }
    }

    /// Its entries after key `after`, in key order.
    pub fn entries_after<'a>(
        &'a self,
        after: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a Entry)> {
        prefix_from(&self.kv, &self.prefix, std::ops::Bound::Excluded(after))
    }
}

/// The entries of `kv` under `prefix` from `start` on, in key order.
fn prefix_from<'a>(
    kv: &'a OrdMap<String, Arc<Entry>>,
    prefix: &'a str,
    start: std::ops::Bound<&'a str>,
) -> impl Iterator<Item = (&'a String, &'a Entry)> {
    kv.range::<_, str>((start, std::ops::Bound::Unbounded))
        .take_while(move |(key, _)| key.starts_with(prefix))
        .map(|(key, entry)| (key, entry.as_ref()))
}

#[cfg(test)]
mod tests;
