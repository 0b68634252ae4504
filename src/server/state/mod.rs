//! The embedded server's rules: KV entries, locks, sessions, checks, the global index and
//! every timer, as a pure state machine.
//!
//! `State::apply(command, now)` runs one write and returns its outcome; `next_deadline()` and
//! `expire(now)` drive session TTLs, check TTLs, lock-delay clean-up and tombstone reaping.
//! Nothing here does I/O, reads the clock or knows about HTTP: `store.rs` persists what
//! `take_changes()` reports, and `http.rs` turns outcomes into Consul's answers. The rules
//! follow `shared/consul-semantics.md` (newest Consul behaviour where versions differ).
//!
//! Size: Consul's KV, lock, session and check rules as one pure machine (services are in
//! catalog.rs); splitting it by table is still to do.

use std::collections::BTreeSet;
use std::sync::Arc;

use imbl::{HashMap, OrdMap, Vector};
use std::time::{Duration, Instant};

use crate::util::duration;

pub mod catalog;
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
/// The node health check every agent has and default sessions are bound to.
pub const SERF_CHECK_ID: &str = "serfHealth";

/// Settings of the state machine that a deployment may change.
#[derive(Clone, Debug)]
pub struct Config {
    pub session_ttl_min: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            session_ttl_min: DEFAULT_SESSION_TTL_MIN,
        }
    }
}

/// One KV entry. The key is the map key it is stored under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// An empty value reads back as `null`, as an empty PUT body does in Consul.
    pub value: Vec<u8>,
    pub flags: u64,
    pub session: Option<String>,
    pub lock_index: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

impl Entry {
    /// Consul's `DirEntry.Equal`: a write that changes none of these is skipped.
    fn same_content(&self, other: &Entry) -> bool {
        self.lock_index == other.lock_index
            && self.flags == other.flags
            && self.value == other.value
            && self.session == other.session
    }
}

/// What happens to a session's locks when it is invalidated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behavior {
    Release,
    Delete,
}

impl Behavior {
    pub fn as_str(self) -> &'static str {
        match self {
            Behavior::Release => "release",
            Behavior::Delete => "delete",
        }
    }
}

/// A service check a session is bound to (`ServiceChecks` element).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceCheck {
    pub id: String,
    pub namespace: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub id: String,
    pub name: String,
    pub node: String,
    pub lock_delay: Duration,
    pub behavior: Behavior,
    /// The TTL exactly as the client wrote it; `""` means none.
    pub ttl: String,
    pub node_checks: Vec<String>,
    pub service_checks: Option<Vec<ServiceCheck>>,
    /// The deprecated `Checks` field, kept as Consul keeps it.
    pub checks: Vec<String>,
    pub create_index: u64,
    pub modify_index: u64,
}

impl Session {
    /// Every check whose failure invalidates this session.
    pub fn bound_checks(&self) -> impl Iterator<Item = &str> {
        self.checks
            .iter()
            .chain(self.node_checks.iter())
            .map(String::as_str)
            .chain(
                self.service_checks
                    .iter()
                    .flatten()
                    .map(|check| check.id.as_str()),
            )
    }

    /// The TTL as a duration; `None` when the session has no TTL. Stored TTLs were
    /// validated at creation, so a parse failure here means "no TTL".
    pub fn ttl_duration(&self) -> Option<Duration> {
        if self.ttl.is_empty() {
            return None;
        }
        duration::parse(&self.ttl).ok().filter(|ttl| !ttl.is_zero())
    }
}

/// A session as requested, after the HTTP layer applied Consul's defaults.
#[derive(Clone, Debug)]
pub struct SessionSpec {
    /// Chosen by the caller (a fresh UUID) so that this module stays deterministic.
    pub id: String,
    pub name: String,
    pub node: String,
    pub lock_delay: Duration,
    /// Validated here, because Consul rejects a bad one with a 500 from the server.
    pub behavior: String,
    pub ttl: String,
    pub node_checks: Vec<String>,
    pub service_checks: Option<Vec<ServiceCheck>>,
    pub checks: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckStatus {
    Passing,
    Warning,
    Critical,
}

impl CheckStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Passing => "passing",
            CheckStatus::Warning => "warning",
            CheckStatus::Critical => "critical",
        }
    }

    pub fn parse(text: &str) -> Option<CheckStatus> {
        match text {
            "passing" => Some(CheckStatus::Passing),
            "warning" => Some(CheckStatus::Warning),
            "critical" => Some(CheckStatus::Critical),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub id: String,
    pub name: String,
    pub status: CheckStatus,
    pub notes: String,
    pub output: String,
    pub service_id: String,
    /// `Some` for TTL checks registered through the agent API; `None` for `serfHealth`.
    pub ttl: Option<Duration>,
    pub create_index: u64,
    pub modify_index: u64,
}

#[derive(Clone, Debug)]
pub struct CheckSpec {
    pub id: String,
    pub name: String,
    pub status: CheckStatus,
    pub notes: String,
    pub output: String,
    pub service_id: String,
    pub ttl: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub id: String,
    pub address: String,
    pub create_index: u64,
    pub modify_index: u64,
}

/// The last index at which each table changed, as Consul's `index` table keeps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableIndexes {
    pub kvs: u64,
    pub tombstones: u64,
    pub sessions: u64,
    pub nodes: u64,
    pub checks: u64,
    /// The agent's services (`catalog.rs`).
    pub services: u64,
}

/// One operation of a `/v1/txn` request (the `KV` member of an op).
#[derive(Clone, Debug, Default)]
pub struct TxnOp {
    pub verb: String,
    pub key: String,
    pub value: Vec<u8>,
    pub flags: u64,
    pub index: u64,
    pub session: String,
}

impl TxnOp {
    /// Whether Consul routes this verb through raft (a write) or answers it locally.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "set" | "delete" | "delete-cas" | "delete-tree" | "cas" | "lock" | "unlock"
        )
    }
}

/// A txn result: the entry an op returned, with its value when the op was a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnResult {
    pub key: String,
    pub entry: Entry,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnError {
    pub op_index: usize,
    pub what: String,
}

/// Every write the server accepts. Reads do not go through `apply`.
#[derive(Clone, Debug)]
pub enum Command {
    KvSet {
        key: String,
        value: Vec<u8>,
        flags: u64,
    },
    KvCas {
        key: String,
        value: Vec<u8>,
        flags: u64,
        index: u64,
    },
    KvLock {
        key: String,
        value: Vec<u8>,
        flags: u64,
        session: String,
    },
    KvUnlock {
        key: String,
        value: Vec<u8>,
        flags: u64,
        session: String,
    },
    KvDelete {
        key: String,
    },
    KvDeleteCas {
        key: String,
        index: u64,
    },
    KvDeleteTree {
        prefix: String,
    },
    Txn(Vec<TxnOp>),
    SessionCreate(SessionSpec),
    SessionDestroy {
        id: String,
    },
    SessionRenew {
        id: String,
    },
    CheckRegister(CheckSpec),
    CheckUpdate {
        id: String,
        status: CheckStatus,
        output: String,
    },
    CheckDeregister {
        id: String,
    },
    /// Registers the agent's node and its passing `serfHealth` check. A different node
    /// replaces the old one, which invalidates the old node's sessions as in Consul.
    RegisterNode {
        name: String,
        id: String,
        address: String,
    },
    /// A service and its TTL checks (`catalog.rs`).
    ServiceRegister(ServiceSpec),
    ServiceDeregister {
        id: String,
    },
    /// Node maintenance (`service: None`) or one service's, on or off.
    Maintenance {
        service: Option<String>,
        enable: bool,
        reason: String,
    },
}

/// The expected results of a write. Failures a client caused are `ApplyError`s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// KV writes: `true`/`false` as the HTTP API answers them.
    Bool(bool),
    SessionCreated(String),
    /// A renew: the session, or `None` when it does not exist.
    Renewed(Option<Session>),
    /// A txn that applied every op.
    TxnCommitted(Vec<TxnResult>),
    /// A txn that applied nothing; every failing op is listed.
    TxnFailed(Vec<TxnError>),
    Done,
}

/// Errors that Consul reports from its server (HTTP 500) or agent (HTTP 404).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("missing session")]
    MissingSession,
    #[error("invalid session {}", duration::quote(.0))]
    InvalidSession(String),
    #[error("Missing node registration")]
    MissingNode,
    #[error("Invalid Behavior setting '{0}'")]
    InvalidBehavior(String),
    #[error("Session TTL '{ttl}' invalid: {reason}")]
    TtlSyntax { ttl: String, reason: String },
    #[error("Invalid Session TTL '{nanos}', must be between [{min}={max}]")]
    TtlRange {
        nanos: u128,
        min: String,
        max: String,
    },
    #[error("Missing check '{0}' registration")]
    MissingCheck(String),
    #[error("Check '{0}' is in critical state")]
    CriticalCheck(String),
    #[error("Unknown check ID {}. Ensure that the check ID is passed, not the check name.", duration::quote(.0))]
    UnknownCheck(String),
    #[error("CheckID {} does not have associated TTL", duration::quote(.0))]
    NotTtlCheck(String),
    #[error("Unknown service ID {}. Ensure that the service ID is passed, not the service name.", duration::quote(.0))]
    UnknownService(String),
}

/// What changed since the last `take_changes`, by identity; `store.rs` writes the current
/// value of each (or deletes it when it is gone), and `watch.rs` wakes the blocked queries
/// that read one of them.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    pub kv: BTreeSet<String>,
    pub tombstones: BTreeSet<String>,
    pub sessions: BTreeSet<String>,
    pub checks: BTreeSet<String>,
    pub services: BTreeSet<String>,
    pub node: bool,
    pub meta: bool,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.kv.is_empty()
            && self.tombstones.is_empty()
            && self.sessions.is_empty()
            && self.checks.is_empty()
            && self.services.is_empty()
            && !self.node
            && !self.meta
    }
}

/// Everything durable, as `store.rs` loads it at start.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub index: u64,
    pub tables: TableIndexes,
    pub kv: Vec<(String, Entry)>,
    pub tombstones: Vec<(String, u64)>,
    pub sessions: Vec<Session>,
    pub checks: Vec<Check>,
    pub services: Vec<Service>,
    pub node: Option<Node>,
}

/// A record of what a txn overwrote, replayed backwards when the txn fails.
#[derive(Clone)]
enum Undo {
    Kv(String, Option<Arc<Entry>>),
    Tombstone(String, Option<u64>),
}

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
    /// Reap order: tombstones are created with a monotonic `now`, so the front is oldest.
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
    pub fn new(config: Config) -> State {
        State::restore(config, Snapshot::default(), Instant::now())
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
        for (key, index) in snapshot.tombstones {
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
        self.kv
            .range::<_, str>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(move |(key, _)| key.starts_with(prefix))
            .map(|(key, entry)| (key, entry.as_ref()))
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
        if prefix.is_empty() {
            return self.kv_table_index().max(1);
        }
        let entries = self
            .kv_list(prefix)
            .map(|(_, entry)| entry.modify_index)
            .max()
            .unwrap_or(0);
        let tombstones = self
            .tombstones
            .range::<_, str>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(_, index)| *index)
            .max()
            .unwrap_or(0);
        match entries.max(tombstones) {
            0 => self.kv_table_index().max(1),
            index => index,
        }
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

    // ----- KV primitives (shared by the KV endpoint and txn) -----

    fn put_entry(&mut self, key: &str, entry: Entry) {
        let entry = Arc::new(entry);
        let old = self.kv.insert(key.to_string(), entry.clone());
        self.reindex_holder(key, old.as_deref(), Some(&entry));
        if let Some(undo) = &mut self.undo {
            undo.push(Undo::Kv(key.to_string(), old));
        }
        self.changes.kv.insert(key.to_string());
    }

    fn remove_entry(&mut self, key: &str) -> Option<Arc<Entry>> {
        let old = self.kv.remove(key)?;
        if let Some(undo) = &mut self.undo {
            undo.push(Undo::Kv(key.to_string(), Some(old.clone())));
        }
        self.reindex_holder(key, Some(&old), None);
        self.changes.kv.insert(key.to_string());
        Some(old)
    }

    fn reindex_holder(&mut self, key: &str, old: Option<&Entry>, new: Option<&Entry>) {
        let old_session = old.and_then(|entry| entry.session.as_deref());
        let new_session = new.and_then(|entry| entry.session.as_deref());
        if old_session == new_session {
            return;
        }
        if let Some(session) = old_session {
            if let Some(keys) = self.held.get_mut(session) {
                keys.remove(key);
                if keys.is_empty() {
                    self.held.remove(session);
                }
            }
        }
        if let Some(session) = new_session {
            self.held
                .entry(session.to_string())
                .or_default()
                .insert(key.to_string());
        }
    }

    fn put_tombstone(&mut self, key: &str, idx: u64, now: Instant) {
        let old = self.tombstones.insert(key.to_string(), idx);
        if let Some(undo) = &mut self.undo {
            undo.push(Undo::Tombstone(key.to_string(), old));
        }
        self.tombstone_reaps
            .push_back((now + TOMBSTONE_TTL, key.to_string(), idx));
        self.changes.tombstones.insert(key.to_string());
        self.tables.tombstones = idx;
    }

    fn touch_kvs(&mut self, idx: u64) {
        self.tables.kvs = idx;
        self.index_used = true;
    }

    /// Consul's `kvsSetTxn`: writes value, flags and lock index from the request, keeps or
    /// replaces the session, and skips a write that would change nothing.
    fn kv_write(&mut self, idx: u64, key: &str, mut entry: Entry, update_session: bool) -> Entry {
        let existing = self.kv.get(key);
        entry.create_index = existing.map_or(idx, |e| e.create_index);
        if !update_session {
            entry.session = existing.and_then(|e| e.session.clone());
        }
        if let Some(existing) = existing {
            if existing.same_content(&entry) {
                entry.modify_index = existing.modify_index;
                return entry;
            }
        }
        entry.modify_index = idx;
        self.put_entry(key, entry.clone());
        self.touch_kvs(idx);
        entry
    }

    fn kv_set(&mut self, idx: u64, key: &str, value: Vec<u8>, flags: u64) -> Entry {
        let entry = Entry {
            value,
            flags,
            session: None,
            lock_index: 0,
            create_index: 0,
            modify_index: 0,
        };
        self.kv_write(idx, key, entry, false)
    }

    /// `None` when the check-and-set lost: index 0 means "only if absent".
    fn kv_cas(
        &mut self,
        idx: u64,
        key: &str,
        value: Vec<u8>,
        flags: u64,
        cas: u64,
    ) -> Option<Entry> {
        let existing = self.kv.get(key);
        let matches = match (cas, existing) {
            (0, None) => true,
            (0, Some(_)) | (_, None) => false,
            (cas, Some(entry)) => entry.modify_index == cas,
        };
        matches.then(|| self.kv_set(idx, key, value, flags))
    }

    fn validate_session(&self, session: &str) -> Result<(), ApplyError> {
        if session.is_empty() {
            return Err(ApplyError::MissingSession);
        }
        if !self.sessions.contains_key(session) {
            return Err(ApplyError::InvalidSession(session.to_string()));
        }
        Ok(())
    }

    /// `Ok(None)` when another session holds the lock. Lock-delay is the caller's check.
    fn kv_lock(
        &mut self,
        idx: u64,
        key: &str,
        value: Vec<u8>,
        flags: u64,
        session: &str,
    ) -> Result<Option<Entry>, ApplyError> {
        self.validate_session(session)?;
        let lock_index = match self.kv.get(key) {
            Some(existing) => match existing.session.as_deref() {
                Some(holder) if holder == session => existing.lock_index,
                Some(_) => return Ok(None),
                None => existing.lock_index + 1,
            },
            None => 1,
        };
        let entry = Entry {
            value,
            flags,
            session: Some(session.to_string()),
            lock_index,
            create_index: 0,
            modify_index: 0,
        };
        Ok(Some(self.kv_write(idx, key, entry, true)))
    }

    /// `Ok(None)` when the key is missing or not held by `session`. Release never sets
    /// lock-delay.
    fn kv_unlock(
        &mut self,
        idx: u64,
        key: &str,
        value: Vec<u8>,
        flags: u64,
        session: &str,
    ) -> Result<Option<Entry>, ApplyError> {
        if session.is_empty() {
            return Err(ApplyError::MissingSession);
        }
        let Some(existing) = self.kv.get(key) else {
            return Ok(None);
        };
        if existing.session.as_deref() != Some(session) {
            return Ok(None);
        }
        let entry = Entry {
            value,
            flags,
            session: None,
            lock_index: existing.lock_index,
            create_index: 0,
            modify_index: 0,
        };
        Ok(Some(self.kv_write(idx, key, entry, true)))
    }

    fn kv_delete(&mut self, idx: u64, key: &str, now: Instant) -> bool {
        if self.remove_entry(key).is_none() {
            return false;
        }
        self.put_tombstone(key, idx, now);
        self.touch_kvs(idx);
        true
    }

    /// A missing key counts as deleted; a key at another index does not.
    fn kv_delete_cas(&mut self, idx: u64, key: &str, cas: u64, now: Instant) -> bool {
        match self.kv.get(key) {
            None => true,
            Some(entry) if entry.modify_index != cas => false,
            Some(_) => self.kv_delete(idx, key, now),
        }
    }

    fn kv_delete_tree(&mut self, idx: u64, prefix: &str, now: Instant) {
        let keys: Vec<String> = self.kv_list(prefix).map(|(key, _)| key.clone()).collect();
        if keys.is_empty() {
            return;
        }
        for key in &keys {
            self.remove_entry(key);
        }
        // One tombstone stands for the whole prefix; none for the root, whose readers
        // already see the table index.
        if !prefix.is_empty() {
            self.put_tombstone(prefix, idx, now);
        }
        self.touch_kvs(idx);
    }

    // ----- transactions -----

    fn txn(&mut self, idx: u64, ops: &[TxnOp], now: Instant) -> Outcome {
        let tables_before = self.tables;
        self.undo = Some(Vec::new());
        let mut results = Vec::new();
        let mut errors = Vec::new();
        for (op_index, op) in ops.iter().enumerate() {
            match self.txn_op(idx, op, now) {
                Ok(found) => results.extend(found),
                // Consul carries on after a failed op so that every failure is reported.
                Err(what) => errors.push(TxnError { op_index, what }),
            }
        }
        let undo = self.undo.take().unwrap_or_default();
        if errors.is_empty() {
            return Outcome::TxnCommitted(results);
        }
        for record in undo.into_iter().rev() {
            match record {
                Undo::Kv(key, old) => {
                    let current = match old {
                        Some(entry) => self.kv.insert(key.clone(), entry),
                        None => self.kv.remove(&key),
                    };
                    let restored = self.kv.get(&key).cloned();
                    self.reindex_holder(&key, current.as_deref(), restored.as_deref());
                }
                Undo::Tombstone(key, old) => match old {
                    Some(index) => {
                        self.tombstones.insert(key, index);
                    }
                    None => {
                        self.tombstones.remove(&key);
                    }
                },
            }
        }
        self.tables = tables_before;
        self.index_used = false;
        Outcome::TxnFailed(errors)
    }

    fn txn_op(&mut self, idx: u64, op: &TxnOp, now: Instant) -> Result<Vec<TxnResult>, String> {
        let key = op.key.as_str();
        let quoted = duration::quote(key);
        let write_result = |entry: Entry| {
            vec![TxnResult {
                key: key.to_string(),
                entry: Entry {
                    value: Vec::new(),
                    ..entry
                },
            }]
        };
        match op.verb.as_str() {
            "set" => Ok(write_result(self.kv_set(
                idx,
                key,
                op.value.clone(),
                op.flags,
            ))),
            "cas" => self
                .kv_cas(idx, key, op.value.clone(), op.flags, op.index)
                .map(write_result)
                .ok_or_else(|| format!("failed to set key {quoted}, index is stale")),
            "lock" => {
                if self.lock_delay_until(key, now).is_some() {
                    return Err(format!("failed to lock key {quoted} due to lock delay"));
                }
                match self.kv_lock(idx, key, op.value.clone(), op.flags, &op.session) {
                    Ok(Some(entry)) => Ok(write_result(entry)),
                    Ok(None) => Err(format!("failed to lock key {quoted}, lock is already held")),
                    Err(err) => Err(err.to_string()),
                }
            }
            "unlock" => match self.kv_unlock(idx, key, op.value.clone(), op.flags, &op.session) {
                Ok(Some(entry)) => Ok(write_result(entry)),
                Ok(None) => Err(format!(
                    "failed to unlock key {quoted}, lock isn't held, or is held by another session"
                )),
                Err(err) => Err(err.to_string()),
            },
            "delete" => {
                self.kv_delete(idx, key, now);
                Ok(Vec::new())
            }
            "delete-cas" => {
                if self.kv_delete_cas(idx, key, op.index, now) {
                    Ok(Vec::new())
                } else {
                    Err(format!("failed to delete key {quoted}, index is stale"))
                }
            }
            "delete-tree" => {
                self.kv_delete_tree(idx, key, now);
                Ok(Vec::new())
            }
            "get" => match self.kv_get(key) {
                Some(entry) => Ok(vec![TxnResult {
                    key: key.to_string(),
                    entry: entry.clone(),
                }]),
                None => Err(format!("key {quoted} doesn't exist")),
            },
            "get-or-empty" => {
                let entry = self.kv_get(key).cloned().unwrap_or(Entry {
                    value: Vec::new(),
                    flags: 0,
                    session: None,
                    lock_index: 0,
                    create_index: 0,
                    modify_index: 0,
                });
                Ok(vec![TxnResult {
                    key: key.to_string(),
                    entry,
                }])
            }
            "get-tree" => Ok(self
                .kv_list(key)
                .map(|(key, entry)| TxnResult {
                    key: key.clone(),
                    entry: entry.clone(),
                })
                .collect()),
            "check-index" => match self.kv_get(key) {
                None => Err(format!("failed to check index, key {quoted} doesn't exist")),
                Some(entry) if entry.modify_index != op.index => Err(format!(
                    "failed index check for key {quoted}, current modify index {} != {}",
                    entry.modify_index, op.index
                )),
                Some(entry) => Ok(write_result(entry.clone())),
            },
            "check-session" => match self.kv_get(key) {
                None => Err(format!(
                    "failed to check session, key {quoted} doesn't exist"
                )),
                Some(entry) if entry.session.as_deref().unwrap_or("") != op.session => {
                    Err(format!(
                        "failed session check for key {quoted}, current session {} != {}",
                        duration::quote(entry.session.as_deref().unwrap_or("")),
                        duration::quote(&op.session)
                    ))
                }
                Some(entry) => Ok(write_result(entry.clone())),
            },
            "check-not-exists" => match self.kv_get(key) {
                Some(_) => Err(format!("key {quoted} exists")),
                None => Ok(Vec::new()),
            },
            other => Err(format!("unknown KV verb {}", duration::quote(other))),
        }
    }

    // ----- sessions -----

    fn session_create(
        &mut self,
        idx: u64,
        spec: SessionSpec,
        now: Instant,
    ) -> Result<Outcome, ApplyError> {
        let behavior = match spec.behavior.as_str() {
            "" | "release" => Behavior::Release,
            "delete" => Behavior::Delete,
            other => return Err(ApplyError::InvalidBehavior(other.to_string())),
        };
        let mut ttl_duration = None;
        if !spec.ttl.is_empty() {
            let ttl = duration::parse(&spec.ttl).map_err(|reason| ApplyError::TtlSyntax {
                ttl: spec.ttl.clone(),
                reason,
            })?;
            if !ttl.is_zero() {
                if ttl < self.config.session_ttl_min || ttl > SESSION_TTL_MAX {
                    return Err(ApplyError::TtlRange {
                        nanos: ttl.as_nanos(),
                        min: duration::format(self.config.session_ttl_min),
                        max: duration::format(SESSION_TTL_MAX),
                    });
                }
                ttl_duration = Some(ttl);
            }
        }
        if self.node.as_ref().map(|node| node.name.as_str()) != Some(spec.node.as_str()) {
            return Err(ApplyError::MissingNode);
        }
        let session = Session {
            id: spec.id,
            name: spec.name,
            node: spec.node,
            lock_delay: spec.lock_delay,
            behavior,
            ttl: spec.ttl,
            node_checks: spec.node_checks,
            service_checks: spec.service_checks,
            checks: spec.checks,
            create_index: idx,
            modify_index: idx,
        };
        for check_id in session.bound_checks() {
            match self.checks.get(check_id) {
                None => return Err(ApplyError::MissingCheck(check_id.to_string())),
                Some(check) if check.status == CheckStatus::Critical => {
                    return Err(ApplyError::CriticalCheck(check_id.to_string()))
                }
                Some(_) => {}
            }
        }
        if let Some(ttl) = ttl_duration {
            self.session_deadlines
                .insert(session.id.clone(), now + ttl * SESSION_TTL_MULTIPLIER);
        }
        let id = session.id.clone();
        self.changes.sessions.insert(id.clone());
        self.sessions.insert(id.clone(), session);
        self.tables.sessions = idx;
        self.index_used = true;
        Ok(Outcome::SessionCreated(id))
    }

    /// Invalidates a session: its locks are released or deleted per its behavior, each
    /// with lock-delay, and the session is gone. Unknown ids are a no-op.
    fn session_destroy(&mut self, idx: u64, id: &str, now: Instant) {
        self.session_deadlines.remove(id);
        let Some(session) = self.sessions.remove(id) else {
            return;
        };
        self.changes.sessions.insert(id.to_string());
        self.tables.sessions = idx;
        self.index_used = true;
        let delay = session.lock_delay.min(MAX_LOCK_DELAY);
        let keys = self.held.remove(id).unwrap_or_default();
        for key in keys {
            match session.behavior {
                Behavior::Release => {
                    if let Some(mut entry) = self.kv_get(&key).cloned() {
                        entry.session = None;
                        entry.modify_index = idx;
                        self.put_entry(&key, entry);
                        self.touch_kvs(idx);
                    }
                }
                Behavior::Delete => {
                    self.kv_delete(idx, &key, now);
                }
            }
            if !delay.is_zero() {
                self.lock_delays.insert(key, now + delay);
            }
        }
    }

    /// Renewing only resets the timer: no index, nothing to persist.
    fn session_renew(&mut self, id: &str, now: Instant) -> Option<Session> {
        let session = self.sessions.get(id)?.clone();
        if let Some(ttl) = session.ttl_duration() {
            self.session_deadlines
                .insert(id.to_string(), now + ttl * SESSION_TTL_MULTIPLIER);
        }
        Some(session)
    }

    // ----- checks and the node -----

    fn check_register(&mut self, idx: u64, spec: CheckSpec, now: Instant) {
        let create_index = self.checks.get(&spec.id).map_or(idx, |c| c.create_index);
        let check = Check {
            id: spec.id.clone(),
            name: spec.name,
            status: spec.status,
            notes: spec.notes,
            output: spec.output,
            service_id: spec.service_id,
            ttl: Some(spec.ttl),
            create_index,
            modify_index: idx,
        };
        self.check_deadlines.insert(spec.id.clone(), now + spec.ttl);
        self.checks.insert(spec.id.clone(), check);
        self.changes.checks.insert(spec.id.clone());
        self.tables.checks = idx;
        self.index_used = true;
        if spec.status == CheckStatus::Critical {
            self.invalidate_sessions_bound_to(idx, &spec.id, now);
        }
    }

    fn check_update(
        &mut self,
        idx: u64,
        id: &str,
        status: CheckStatus,
        output: String,
        now: Instant,
    ) -> Result<(), ApplyError> {
        let check = self
            .checks
            .get(id)
            .filter(|_| id != SERF_CHECK_ID)
            .ok_or_else(|| ApplyError::UnknownCheck(id.to_string()))?;
        let Some(ttl) = check.ttl else {
            return Err(ApplyError::NotTtlCheck(id.to_string()));
        };
        self.check_deadlines.insert(id.to_string(), now + ttl);
        self.set_check_status(idx, id, status, output, now);
        Ok(())
    }

    /// A status change is a catalog write; an output-only change is kept (and persisted)
    /// without a new index, as the agent defers such syncs; nothing changed means nothing to
    /// write. Going critical invalidates every session bound to the check.
    fn set_check_status(
        &mut self,
        idx: u64,
        id: &str,
        status: CheckStatus,
        output: String,
        now: Instant,
    ) {
        let Some(check) = self.checks.get_mut(id) else {
            return;
        };
        if check.status == status {
            if check.output != output {
                check.output = output;
                self.changes.checks.insert(id.to_string());
            }
            return;
        }
        check.status = status;
        check.output = output;
        check.modify_index = idx;
        self.changes.checks.insert(id.to_string());
        self.tables.checks = idx;
        self.index_used = true;
        if status == CheckStatus::Critical {
            self.invalidate_sessions_bound_to(idx, id, now);
        }
    }

    fn check_deregister(&mut self, idx: u64, id: &str, now: Instant) -> Result<(), ApplyError> {
        if id == SERF_CHECK_ID || !self.checks.contains_key(id) {
            return Err(ApplyError::UnknownCheck(id.to_string()));
        }
        self.checks.remove(id);
        self.check_deadlines.remove(id);
        self.changes.checks.insert(id.to_string());
        self.tables.checks = idx;
        self.index_used = true;
        self.invalidate_sessions_bound_to(idx, id, now);
        Ok(())
    }

    fn invalidate_sessions_bound_to(&mut self, idx: u64, check_id: &str, now: Instant) {
        let bound: Vec<String> = self
            .sessions
            .values()
            .filter(|session| session.bound_checks().any(|id| id == check_id))
            .map(|session| session.id.clone())
            .collect();
        for id in bound {
            self.session_destroy(idx, &id, now);
        }
    }

    fn register_node(&mut self, idx: u64, name: String, id: String, address: String, now: Instant) {
        if let Some(node) = &self.node {
            if node.name == name && node.id == id && node.address == address {
                return;
            }
            if node.name != name {
                // Deregistering a node invalidates its sessions and removes its checks.
                let sessions: Vec<String> = self.sessions.keys().cloned().collect();
                for session in sessions {
                    self.session_destroy(idx, &session, now);
                }
                let checks: Vec<String> = self.checks.keys().cloned().collect();
                for check in checks {
                    self.checks.remove(&check);
                    self.check_deadlines.remove(&check);
                    self.changes.checks.insert(check);
                }
                self.tables.checks = idx;
            }
        }
        let create_index = match &self.node {
            Some(node) if node.name == name => node.create_index,
            _ => idx,
        };
        self.node = Some(Node {
            name,
            id,
            address,
            create_index,
            modify_index: idx,
        });
        self.changes.node = true;
        self.tables.nodes = idx;
        if !self.checks.contains_key(SERF_CHECK_ID) {
            self.checks.insert(
                SERF_CHECK_ID.to_string(),
                Check {
                    id: SERF_CHECK_ID.to_string(),
                    name: "Serf Health Status".to_string(),
                    status: CheckStatus::Passing,
                    notes: String::new(),
                    output: "Agent alive and reachable".to_string(),
                    service_id: String::new(),
                    ttl: None,
                    create_index: idx,
                    modify_index: idx,
                },
            );
            self.changes.checks.insert(SERF_CHECK_ID.to_string());
            self.tables.checks = idx;
        }
        self.index_used = true;
    }
}

#[cfg(test)]
mod tests;
