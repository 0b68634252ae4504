//! The coordinator seam: what leaderq needs from Consul, ZooKeeper, Redis or etcd, said in
//! the domain's words: a lease (open, keep alive, revoke), leadership (observe the holder,
//! campaign, resign; winning yields a [`Leadership`] with a fencing token) and the queue
//! (list tasks with a version, wait for changes, write a batch of task operations guarded
//! by leadership). Every answer the caller branches on is a value ([`Campaign`],
//! [`Written`]); only "the coordinator cannot be asked right now" and "it will never
//! accept this" are errors ([`CoordError`]).
//!
//! A backend is one folder below this one and must guarantee, whatever its primitives:
//! - **one leader**: at most one lease holds leadership at a time, and a lease that is not
//!   kept alive loses it within its TTL (plus the backend's own delay, such as Consul's
//!   lock-delay), never sooner than the holder's own view of the lease allows;
//! - **fencing**: the token of each new leadership is strictly greater than every token
//!   handed out before, across leases, restarts, coordinator restarts and an operator's
//!   deletion of the leader record (so never a per-key counter that a key created anew
//!   starts again, such as Consul's `LockIndex`);
//! - **guarded writes**: a [`Coordinator::write`] is applied all or nothing, and only while
//!   the given leadership still holds (its lease, under its token: not one its lease's
//!   re-campaign superseded, nor one whose record an operator deleted or rewrote);
//!   otherwise it answers [`Written::NotLeader`];
//! - **versions**: every task carries a version that changes on every write to it, and a
//!   write conditioned on a version that moved answers [`Written::Conflict`];
//! - **no loss**: a task claimed by a lease that ends is still in the queue, marked held
//!   by a lease that no longer exists, so the next leader can requeue it.
//!
//! How each backend provides them is written in its own module header (`consul`,
//! `zookeeper`, `redis`, `etcd`, `memory`); the contract suite (testkit's `contract`, beside
//! this crate) checks them on each.
//!
//! The seam is cut in three, in the domain's words, each trait with the guarantees it
//! carries: [`Leases`] (open, keep alive, revoke, close), [`Elections`] (observe,
//! campaign, resign) and [`Tasks`] (list, keys, get, write, write_own, edit and what a
//! write may carry). A backend implements each as native `async fn`s, in the file that owns
//! that part: every backend folder has the same files (`<backend>/lease.rs`, `election`,
//! `queue`, the pure `plan` and `layout`, `settings` and `client/`). Callers hold an
//! `Arc<dyn Coordinator>`: [`Coordinator`] is the one dyn-compatible trait, and one blanket
//! impl below gives it to every type that implements the three, boxing each future
//! ([`CoordFuture`]) so no backend does. A test double that wraps another coordinator may
//! implement [`Coordinator`] directly instead.
//!
//! Read top-down: the three traits, the dyn-compatible one and the blanket impl first, then
//! the seam's vocabulary they speak (leases, leadership, tasks and their answers). What each
//! queue write ([`TaskOp`]) requires and does is stated once, in `op.rs`.
//!
//! Size: the seam's vocabulary (leases, leadership, tasks and their answers), its three
//! traits, the dyn-compatible one callers hold and the blanket impl between them are one
//! contract, read together; the backends are the folders below.

pub mod consul;
pub mod etcd;
pub mod memory;
mod names;
mod op;
pub mod redis;
pub mod zookeeper;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use names::{shared_len, Names};
pub use op::{Effect, Expected, HeldBy, Holding, Record, Requirement, TaskOp};

/// The lease half of a backend: a replica's proof of life, which its leadership and its
/// claims are tied to.
///
/// Guarantees (module header): a lease that is not kept alive ends within its TTL (plus the
/// backend's own delay, such as Consul's lock-delay, before its leadership can be taken),
/// never sooner than the holder's own view of the lease allows; whatever it held then goes
/// with it (**one leader**), and the tasks it claimed stay in the queue, held by a lease
/// that no longer exists (**no loss**).
pub trait Leases: Send + Sync {
    /// Where it is (an address for logs and status).
    fn describe(&self) -> String;

    /// Opens a lease (or takes up `spec.previous`), after removing what earlier runs of
    /// this node left behind that would get in the way.
    fn open_lease(
        &self,
        spec: &LeaseSpec,
    ) -> impl Future<Output = Result<Grant, CoordError>> + Send;

    /// Keeps the lease alive for another TTL.
    fn keep_alive(
        &self,
        lease: &LeaseId,
    ) -> impl Future<Output = Result<Renewal, CoordError>> + Send;

    /// Ends the lease: its leadership and claims are freed at once (no lock-delay for a
    /// leadership given up before).
    fn revoke(&self, lease: &LeaseId) -> impl Future<Output = Result<(), CoordError>> + Send;

    /// Ends the lease and whatever the backend tied to this node: the replica is leaving.
    /// The default revokes the lease, if one is given: for a backend that ties nothing else
    /// to a node.
    fn close(
        &self,
        lease: Option<&LeaseId>,
    ) -> impl Future<Output = Result<(), CoordError>> + Send {
        async move {
            match lease {
                Some(lease) => self.revoke(lease).await,
                None => Ok(()),
            }
        }
    }

    /// A task that keeps the replica `replica` describes in the coordinator's own service
    /// catalog, tagged with its current role from `roles`, until `stop`, then takes it out
    /// (Consul's catalog, so that its UI and DNS show who leads). `None`, the default: the
    /// backend has no catalog. The caller spawns it and cancels `stop` only after leaving,
    /// so that whatever the lease is bound to goes with the lease.
    fn announce(
        &self,
        replica: Announcement,
        roles: tokio::sync::watch::Receiver<Role>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Option<Pin<Box<dyn Future<Output = ()> + Send + 'static>>> {
        let _ = (replica, roles, stop);
        None
    }
}

/// The leadership half of a backend: one election, contended with leases.
///
/// Guarantees (module header): **one leader**: at most one lease holds leadership at a
/// time, and loses it with its lease; **fencing**: the token of each new leadership is
/// strictly greater than every token handed out before, across leases, restarts,
/// coordinator restarts and an operator's deletion of the leader record (never a per-key
/// counter that a key created anew starts again, such as Consul's `LockIndex`).
pub trait Elections: Send + Sync {
    /// The holder once its version is past `after` (at once for `Version(0)`), or after
    /// `wait` unchanged.
    fn observe(
        &self,
        after: Version,
        wait: Duration,
    ) -> impl Future<Output = Result<(Holder, Version), CoordError>> + Send;

    /// Takes leadership with `lease` if it is free. A lease that already holds it (a
    /// restart that took up its lease) takes it anew, so its token rises.
    fn campaign(
        &self,
        lease: &LeaseId,
        record: &HolderRecord,
    ) -> impl Future<Output = Result<Campaign, CoordError>> + Send;

    /// Gives leadership up (no lock-delay applies), if `lease` holds it.
    fn resign(&self, lease: &LeaseId) -> impl Future<Output = Result<(), CoordError>> + Send;
}

/// The queue half of a backend: tasks with versions, read, waited on and written in
/// batches.
///
/// Guarantees (module header): **guarded writes**: a [`Tasks::write`] is applied all or
/// nothing, and only while the given leadership still holds (its lease, under its token:
/// not one its lease's re-campaign superseded, nor one whose record an operator deleted or
/// rewrote); otherwise it answers [`Written::NotLeader`]; **versions**: every task carries
/// a version that changes on every write to it, and a write conditioned on a version that
/// moved answers [`Written::Conflict`]; **no loss**: a task claimed by a lease that ends
/// is still listed, held by a lease that no longer exists.
pub trait Tasks: Send + Sync {
    /// The tasks under `prefix`, in key order, once the queue's version is past `after` (at
    /// once for `Version(0)`), or after `wait` unchanged.
    fn list(
        &self,
        prefix: &str,
        after: Version,
        wait: Duration,
    ) -> impl Future<Output = Result<(Vec<StoredTask>, Version), CoordError>> + Send;

    /// [`Tasks::list`], each entry handed to `each` as it is read rather than all answered
    /// together, so that a caller keeping less than the entries (the leader, of a large
    /// backlog) never holds the whole listing. The same entries, in the same order, at the
    /// same version; an error may come after some were handed on. By default, `list`'s
    /// entries handed on one by one; a backend that reads its listing in pieces hands each
    /// on as it arrives.
    fn list_each(
        &self,
        prefix: &str,
        after: Version,
        wait: Duration,
        each: &mut (dyn FnMut(StoredTask) + Send),
    ) -> impl Future<Output = Result<Version, CoordError>> + Send {
        async move { hand_on(self.list(prefix, after, wait).await, each) }
    }

    /// The keys under `prefix` and the queue's version, without values: a cheap look.
    fn keys(
        &self,
        prefix: &str,
    ) -> impl Future<Output = Result<(Names, Version), CoordError>> + Send;

    /// The tasks at `keys` that exist.
    fn get(
        &self,
        keys: &[String],
    ) -> impl Future<Output = Result<Vec<StoredTask>, CoordError>> + Send;

    /// Applies `ops` all or nothing, only while `leadership` holds.
    fn write(
        &self,
        leadership: &Leadership,
        ops: &[TaskOp],
    ) -> impl Future<Output = Result<Written, CoordError>> + Send;

    /// Applies `ops` to tasks this lease itself holds, without the leadership guard: puts
    /// back claimed tasks that never started, or settles runs that ended, after leadership
    /// is lost. All or nothing: `Done` if applied, else `Conflict` naming the tasks the
    /// lease no longer holds (or all of them, once the lease itself is gone); never
    /// `NotLeader`.
    fn write_own(
        &self,
        lease: &LeaseId,
        ops: &[TaskOp],
    ) -> impl Future<Output = Result<Written, CoordError>> + Send;

    /// Applies a producer's or operator's `ops` all or nothing, without any leadership.
    fn edit(&self, ops: &[Edit]) -> impl Future<Output = Result<Edited, CoordError>> + Send;

    /// How much one write may carry.
    fn limits(&self) -> WriteLimits;

    /// What `op` costs against [`Tasks::limits`].
    fn cost(&self, op: &TaskOp) -> WriteCost;

    /// What the leadership guard of a [`Tasks::write`] costs.
    fn guard_cost(&self) -> WriteCost;
}

/// A coordinator as callers hold it (`Arc<dyn Coordinator>`, chosen at start from the
/// settings): [`Leases`], [`Elections`] and [`Tasks`] in one dyn-compatible trait, each
/// future boxed. Every backend has it through the blanket impl below; see the module header
/// for what each must guarantee, and each method's namesake in those traits for what it
/// does.
pub trait Coordinator: Send + Sync {
    /// [`Leases::describe`].
    fn describe(&self) -> String;

    /// [`Leases::open_lease`].
    fn open_lease<'a>(&'a self, spec: &'a LeaseSpec) -> CoordFuture<'a, Grant>;
    /// [`Leases::keep_alive`].
    fn keep_alive<'a>(&'a self, lease: &'a LeaseId) -> CoordFuture<'a, Renewal>;
    /// [`Leases::revoke`].
    fn revoke<'a>(&'a self, lease: &'a LeaseId) -> CoordFuture<'a, ()>;
    /// [`Leases::close`].
    fn close<'a>(&'a self, lease: Option<&'a LeaseId>) -> CoordFuture<'a, ()>;

    /// [`Elections::observe`].
    fn observe(&self, after: Version, wait: Duration) -> CoordFuture<'_, (Holder, Version)>;
    /// [`Elections::campaign`].
    fn campaign<'a>(
        &'a self,
        lease: &'a LeaseId,
        record: &'a HolderRecord,
    ) -> CoordFuture<'a, Campaign>;
    /// [`Elections::resign`].
    fn resign<'a>(&'a self, lease: &'a LeaseId) -> CoordFuture<'a, ()>;

    /// [`Tasks::list`].
    fn list<'a>(
        &'a self,
        prefix: &'a str,
        after: Version,
        wait: Duration,
    ) -> CoordFuture<'a, (Vec<StoredTask>, Version)>;
    /// [`Tasks::list_each`]; by default `list`'s entries handed on, for a double that
    /// implements this trait directly.
    fn list_each<'a>(
        &'a self,
        prefix: &'a str,
        after: Version,
        wait: Duration,
        each: &'a mut (dyn FnMut(StoredTask) + Send),
    ) -> CoordFuture<'a, Version> {
        Box::pin(async move { hand_on(self.list(prefix, after, wait).await, each) })
    }
    /// [`Tasks::keys`].
    fn keys<'a>(&'a self, prefix: &'a str) -> CoordFuture<'a, (Names, Version)>;
    /// [`Tasks::get`].
    fn get<'a>(&'a self, keys: &'a [String]) -> CoordFuture<'a, Vec<StoredTask>>;
    /// [`Tasks::write`].
    fn write<'a>(
        &'a self,
        leadership: &'a Leadership,
        ops: &'a [TaskOp],
    ) -> CoordFuture<'a, Written>;
    /// [`Tasks::write_own`].
    fn write_own<'a>(&'a self, lease: &'a LeaseId, ops: &'a [TaskOp]) -> CoordFuture<'a, Written>;
    /// [`Tasks::edit`].
    fn edit<'a>(&'a self, ops: &'a [Edit]) -> CoordFuture<'a, Edited>;
    /// [`Tasks::limits`].
    fn limits(&self) -> WriteLimits;
    /// [`Tasks::cost`].
    fn cost(&self, op: &TaskOp) -> WriteCost;
    /// [`Tasks::guard_cost`].
    fn guard_cost(&self) -> WriteCost;

    /// [`Leases::announce`]; `None` by default, for a double that implements this trait
    /// directly.
    fn announce(
        &self,
        replica: Announcement,
        roles: tokio::sync::watch::Receiver<Role>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Option<Pin<Box<dyn Future<Output = ()> + Send + 'static>>> {
        let _ = (replica, roles, stop);
        None
    }
}

/// A listing's entries handed to `each` one by one, as `list_each` does by default.
fn hand_on(
    listed: Result<(Vec<StoredTask>, Version), CoordError>,
    each: &mut (dyn FnMut(StoredTask) + Send),
) -> Result<Version, CoordError> {
    let (entries, version) = listed?;
    entries.into_iter().for_each(each);
    Ok(version)
}

/// The one place the seam's futures are boxed: every backend that implements the three
/// traits is a [`Coordinator`]. The calls name their trait, since both have the method.
impl<C: Leases + Elections + Tasks> Coordinator for C {
    fn describe(&self) -> String {
        Leases::describe(self)
    }

    fn open_lease<'a>(&'a self, spec: &'a LeaseSpec) -> CoordFuture<'a, Grant> {
        Box::pin(Leases::open_lease(self, spec))
    }

    fn keep_alive<'a>(&'a self, lease: &'a LeaseId) -> CoordFuture<'a, Renewal> {
        Box::pin(Leases::keep_alive(self, lease))
    }

    fn revoke<'a>(&'a self, lease: &'a LeaseId) -> CoordFuture<'a, ()> {
        Box::pin(Leases::revoke(self, lease))
    }

    fn close<'a>(&'a self, lease: Option<&'a LeaseId>) -> CoordFuture<'a, ()> {
        Box::pin(Leases::close(self, lease))
    }

    fn observe(&self, after: Version, wait: Duration) -> CoordFuture<'_, (Holder, Version)> {
        Box::pin(Elections::observe(self, after, wait))
    }

    fn campaign<'a>(
        &'a self,
        lease: &'a LeaseId,
        record: &'a HolderRecord,
    ) -> CoordFuture<'a, Campaign> {
        Box::pin(Elections::campaign(self, lease, record))
    }

    fn resign<'a>(&'a self, lease: &'a LeaseId) -> CoordFuture<'a, ()> {
        Box::pin(Elections::resign(self, lease))
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
        after: Version,
        wait: Duration,
    ) -> CoordFuture<'a, (Vec<StoredTask>, Version)> {
        Box::pin(Tasks::list(self, prefix, after, wait))
    }

    fn list_each<'a>(
        &'a self,
        prefix: &'a str,
        after: Version,
        wait: Duration,
        each: &'a mut (dyn FnMut(StoredTask) + Send),
    ) -> CoordFuture<'a, Version> {
        Box::pin(Tasks::list_each(self, prefix, after, wait, each))
    }

    fn keys<'a>(&'a self, prefix: &'a str) -> CoordFuture<'a, (Names, Version)> {
        Box::pin(Tasks::keys(self, prefix))
    }

    fn get<'a>(&'a self, keys: &'a [String]) -> CoordFuture<'a, Vec<StoredTask>> {
        Box::pin(Tasks::get(self, keys))
    }

    fn write<'a>(
        &'a self,
        leadership: &'a Leadership,
        ops: &'a [TaskOp],
    ) -> CoordFuture<'a, Written> {
        Box::pin(Tasks::write(self, leadership, ops))
    }

    fn write_own<'a>(&'a self, lease: &'a LeaseId, ops: &'a [TaskOp]) -> CoordFuture<'a, Written> {
        Box::pin(Tasks::write_own(self, lease, ops))
    }

    fn edit<'a>(&'a self, ops: &'a [Edit]) -> CoordFuture<'a, Edited> {
        Box::pin(Tasks::edit(self, ops))
    }

    fn limits(&self) -> WriteLimits {
        Tasks::limits(self)
    }

    fn cost(&self, op: &TaskOp) -> WriteCost {
        Tasks::cost(self, op)
    }

    fn guard_cost(&self) -> WriteCost {
        Tasks::guard_cost(self)
    }

    fn announce(
        &self,
        replica: Announcement,
        roles: tokio::sync::watch::Receiver<Role>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Option<Pin<Box<dyn Future<Output = ()> + Send + 'static>>> {
        Leases::announce(self, replica, roles, stop)
    }
}

/// The future every coordinator call returns: boxed, so the seam can be a trait object
/// chosen at start from the settings.
pub type CoordFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, CoordError>> + Send + 'a>>;

/// Why a coordinator call did not answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CoordError {
    /// Unreachable, or an error that may pass (overload, leader election, restart):
    /// try again after a pause.
    #[error("{0}")]
    Unavailable(String),
    /// A request the coordinator will never accept as configured (a TTL below its minimum,
    /// a batch over its limits): retrying cannot help; the message says what to change.
    #[error("{0}")]
    Refused(String),
}

/// A position in the coordinator's history of changes, for waiting on the next one
/// (Consul's index, etcd's revision, ZooKeeper's zxid). 0 means "now, without waiting".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u64);

/// A leadership's fencing token: strictly greater than every token handed out before,
/// across leases, restarts, coordinator restarts and an operator's deletion of the leader
/// record, so never reused (the **fencing** guarantee). Whoever receives work under a
/// token can refuse a lower one. It prints as the bare number, as logs, records and
/// `LEADERQ_FENCING_TOKEN` carry it; only a backend reads the number inside.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct FencingToken(pub u64);

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

/// A task's version: it changes on every write to the task, and a write conditioned on a
/// version that moved answers a conflict (the **versions** guarantee). Only equality means
/// anything to a caller: the order and arithmetic of the numbers are the backend's own
/// (Consul's `ModifyIndex`, etcd's revisions, ZooKeeper's and Redis's counters), kept
/// inside it. `TaskVersion(0)` conditions a write on a key that must not exist yet. It
/// prints as the bare number, as logs and records carry it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct TaskVersion(pub u64);

impl std::fmt::Display for TaskVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

/// A lease's id as the coordinator knows it (Consul session, etcd lease, ZooKeeper
/// session, Redis token).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub String);

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a replica asks for when it opens a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSpec {
    /// The replica's stable node id: names the lease and whatever the backend ties to it.
    pub node_id: String,
    /// How long the lease lives without a keep-alive.
    pub ttl: Duration,
    /// How long leadership, and every task this lease held, stay untaken after it dies (0:
    /// none; `election.lock_delay`, Consul's lock-delay, the one backend that has one).
    pub takeover_delay: Duration,
    /// The lease this replica held before a restart, to take up again if the coordinator
    /// still honours it and it is still this replica's own.
    pub previous: Option<LeaseId>,
}

/// An open lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub lease: LeaseId,
    /// Whether this is `LeaseSpec::previous`, taken up again.
    pub reused: bool,
}

/// The answer to a keep-alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    Alive,
    /// The coordinator ended the lease (expired, revoked): whatever it held is gone.
    Gone,
}

/// Who the leader says it is, stored with the leadership for operators and standbys.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderRecord {
    pub node: String,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub pid: u32,
    #[serde(default)]
    pub session: String,
    #[serde(default)]
    pub since: String,
    /// The lowest fencing token this holder's win may be handed: above every token its
    /// replica has seen. Every backend hands out the higher of the two, and keeps the floor
    /// in its record for the next win: its own counter (Consul's raft index, etcd's
    /// revision, ZooKeeper's zxid, Redis's stored token) starts over when the coordinator
    /// loses its data, and a token then never falls while some replica remembers a higher
    /// one. Absent in records of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<u64>,
}

impl HolderRecord {
    /// The record in a stored value; `None` for a value that is not one (another program's).
    pub fn decode(value: &[u8]) -> Option<HolderRecord> {
        serde_json::from_slice(value).ok()
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The leadership as observed: who holds it (if anyone) and the last record written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    /// The lease holding leadership now; `None` when it is free.
    pub lease: Option<LeaseId>,
    /// The last holder's record, kept after it let go (for `prefer_previous_leader`).
    pub record: Option<HolderRecord>,
    /// The current leadership's fencing token. While leadership is free: the last one
    /// where the backend keeps it, 0 where it does not (Consul: a free key's index is its
    /// release's, not a token).
    pub token: FencingToken,
}

/// A won election: what the leader needs to act and to prove it still leads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    pub lease: LeaseId,
    /// Strictly greater than every token handed out before.
    pub fencing_token: FencingToken,
}

/// The answer to one attempt at leadership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Campaign {
    Won(Leadership),
    /// Another lease holds it: watch the holder and try when it is free.
    Held,
    /// It is free but may not be taken yet (Consul's lock-delay): try again after a pause.
    Delayed,
    /// The lease asked with is gone: open a new one.
    LeaseGone,
}

/// A task as the coordinator stores it; parsing it is `task`'s business.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredTask {
    pub key: String,
    pub value: Vec<u8>,
    /// Changes on every write of the task (Consul `ModifyIndex`, etcd `mod_revision`).
    pub version: TaskVersion,
    /// When the task was first written, for ordering ties (Consul `CreateIndex`).
    pub created: u64,
    /// The lease holding the task's claim, if one still does.
    pub holder: Option<LeaseId>,
}

/// The answer to a guarded write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Written {
    /// Applied. `versions` holds each claimed or released task's new version, in the order
    /// of the ops; `fencing_token` is the leadership's token as the commit saw it.
    Done {
        versions: Vec<(String, TaskVersion)>,
        fencing_token: FencingToken,
    },
    /// This leadership no longer holds: nothing was applied.
    NotLeader,
    /// A task's version moved (or it went): nothing was applied. The keys that failed.
    Conflict(Vec<String>),
    /// The coordinator refuses to let these tasks be claimed for a while, though nothing
    /// moved them (a lease that died holding them leaves them untakeable for its
    /// takeover delay, as Consul's lock-delay does): nothing was applied. The caller tries
    /// them again later and the rest of the batch now, without reading them again.
    Deferred(Vec<String>),
}

/// `Conflict` on every task of `ops`: the answer to a lease's own write once the lease is
/// gone, when none of its claims is its to settle any more.
pub(crate) fn conflict_on_all(ops: &[TaskOp]) -> Written {
    Written::Conflict(ops.iter().map(|op| op.key().to_string()).collect())
}

/// A producer's or an operator's write, outside any leadership: `leaderq enqueue`, `tasks
/// retry` and `tasks purge-dead`, and a replica's own records (heartbeat, timeline). A batch of them applies all or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Edit {
    /// Creates `key` holding `value`; conflicts if the key exists (a task is never
    /// overwritten by accident).
    Create { key: String, value: Vec<u8> },
    /// Deletes `key` if it is still at `version`.
    Delete { key: String, version: TaskVersion },
    /// Writes `key` holding `value` whatever is there (creates or replaces it): for
    /// records that only their writer updates, such as a replica's heartbeat, never for
    /// tasks. Never conflicts on its own; a batch with a failing op applies none.
    Put { key: String, value: Vec<u8> },
    /// Writes `value` to the task at `key` if it is still at `version`, with no claim on
    /// it; conflicts if it moved or went. For the one writer that may settle a task outside
    /// any leadership: the replica whose claim it was, after its lease ended (revoked,
    /// expired) and its run is over, putting back what the run left, as read at `version`.
    Replace {
        key: String,
        version: TaskVersion,
        value: Vec<u8>,
    },
}

impl Edit {
    pub fn key(&self) -> &str {
        match self {
            Edit::Create { key, .. }
            | Edit::Delete { key, .. }
            | Edit::Put { key, .. }
            | Edit::Replace { key, .. } => key,
        }
    }
}

/// The answer to [`Coordinator::edit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Edited {
    Done,
    /// A key to create exists, or one to delete moved or went: nothing was applied. The
    /// keys that failed.
    Conflict(Vec<String>),
}

/// What a write, or one op of it, costs against [`WriteLimits`], in the backend's own
/// units (Consul: transaction operations and encoded body bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteCost {
    pub ops: usize,
    pub bytes: usize,
}

impl std::ops::Add for WriteCost {
    type Output = WriteCost;
    fn add(self, other: WriteCost) -> WriteCost {
        WriteCost {
            ops: self.ops + other.ops,
            bytes: self.bytes + other.bytes,
        }
    }
}

impl std::iter::Sum for WriteCost {
    fn sum<I: Iterator<Item = WriteCost>>(costs: I) -> WriteCost {
        costs.fold(WriteCost::default(), |a, b| a + b)
    }
}

/// How much one [`Coordinator::write`] may carry, in the units of [`WriteCost`]: the
/// planner keeps batches within it, and a backend refuses a batch over it whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteLimits {
    pub max_ops: usize,
    pub max_bytes: usize,
}

impl WriteLimits {
    pub fn admits(&self, cost: WriteCost) -> bool {
        cost.ops <= self.max_ops && cost.bytes <= self.max_bytes
    }
}

/// What `ops` cost written by `coord`, with the leadership guard (`write`) or without it
/// (`write_own`).
pub fn batch_cost(coord: &dyn Coordinator, ops: &[TaskOp], guarded: bool) -> WriteCost {
    let guard = if guarded {
        coord.guard_cost()
    } else {
        WriteCost::default()
    };
    guard + ops.iter().map(|op| coord.cost(op)).sum()
}

/// Refuses, whole, a batch over `coord`'s limits: what every backend does before it
/// sends one.
pub fn admit(coord: &dyn Coordinator, ops: &[TaskOp], guarded: bool) -> Result<(), CoordError> {
    let cost = batch_cost(coord, ops, guarded);
    let limits = coord.limits();
    if limits.admits(cost) {
        return Ok(());
    }
    Err(CoordError::Refused(format!(
        "a write of {} operations and {} bytes is over the coordinator's limits of {} and {}: write fewer or smaller tasks at once",
        cost.ops, cost.bytes, limits.max_ops, limits.max_bytes
    )))
}

/// A replica as [`Coordinator::announce`] tells a service catalog of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announcement {
    /// Its node id, the instance's id.
    pub node_id: String,
    /// The service it is an instance of (`election.service_name`).
    pub service_name: String,
    /// Where its observe endpoints listen, if they do.
    pub address: Option<std::net::SocketAddr>,
    /// Its lease's TTL, which a health check bound to the lease uses too.
    pub lease_ttl: Duration,
}

/// What a replica is doing, as a service catalog's tag says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Standby,
    Leader,
}

impl Role {
    pub fn tag(self) -> &'static str {
        match self {
            Role::Standby => "standby",
            Role::Leader => "leader",
        }
    }
}
