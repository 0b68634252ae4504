//! The state machine's data model: KV entries, sessions, checks, the node, transaction
//! ops and results, the commands `State::apply` takes and the outcomes and errors it
//! answers, what a commit changed, and the durable snapshot.

use super::*;

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
    pub(super) fn same_content(&self, other: &Entry) -> bool {
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
pub(super) enum Undo {
    Kv(String, Option<Arc<Entry>>),
    Tombstone(String, Option<u64>),
}
