//! The in-memory coordinator's rules as a pure state machine: leases with TTLs, one
//! leadership with its fencing counter and lock-delay, the tasks with their versions and
//! claims, and the global version every visible change draws from.
//!
//! `State::apply(op, now)` runs one write and returns its outcome; `expire(now)` ends the
//! leases whose TTL ran out and `next_deadline()` says when the next one will. Reads
//! (`holder`, `list`, `keys`, `get`) never change anything. Nothing here reads the clock,
//! waits or knows about tasks' contents: the async shell in `mod.rs` does that. The rules
//! copy Consul's as the embedded server implements them (`shared/consul-semantics.md`),
//! said in the coordinator's words: a lease is a session, leadership is a lock on one key,
//! the fencing token is the `ModifyIndex` of the acquire that won it (here a counter of
//! its own: what matters is that it only rises, also past a record an operator deleted,
//! and is never below the floor the win's record asks for), a version is a `ModifyIndex`.
//!
//! Size: one state machine with every rule of the seam (leases, leadership, tasks, their
//! versions and delays), read as one; its tests are in `tests/`.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

mod edit;

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::coord::{
    Campaign, CoordError, Edit, Edited, Effect, Expected, FencingToken, Grant, HeldBy, Holder,
    HolderRecord, Holding, Leadership, LeaseId, LeaseSpec, Names, Renewal, StoredTask, TaskOp,
    TaskVersion, Version, WriteLimits, Written,
};

/// Lock-delay is capped at this whatever a lease asks for (Consul's `MaxLockDelay`).
pub const MAX_TAKEOVER_DELAY: Duration = Duration::from_secs(60);

/// Operations in one write, the leadership guard included (Consul's txn limit).
pub const DEFAULT_MAX_OPS: usize = 128;

/// Bytes of keys and values in one write (Consul's `txn_max_req_len`, 512 KiB).
pub const DEFAULT_MAX_BYTES: usize = 512 * 1024;

/// The shortest TTL a lease may ask for: the embedded server's floor with its test knob
/// (`--session-ttl-min 1s`), so a setting that works here also works there.
pub const DEFAULT_TTL_MIN: Duration = Duration::from_secs(1);

/// The longest TTL a lease may ask for (Consul's `SessionTTLMax`).
pub const TTL_MAX: Duration = Duration::from_secs(24 * 3600);

/// What a test may change about the in-memory coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Leases asking for less are refused.
    pub ttl_min: Duration,
    /// What `Coordinator::limits` declares and `write` enforces.
    pub limits: WriteLimits,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            ttl_min: DEFAULT_TTL_MIN,
            limits: WriteLimits {
                max_ops: DEFAULT_MAX_OPS,
                max_bytes: DEFAULT_MAX_BYTES,
            },
        }
    }
}

/// One write to the coordinator's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    OpenLease(LeaseSpec),
    KeepAlive(LeaseId),
    Revoke(LeaseId),
    /// Ends the lease as if its TTL had run out (test support).
    Expire(LeaseId),
    Campaign {
        lease: LeaseId,
        record: HolderRecord,
    },
    Resign(LeaseId),
    Write {
        leadership: Leadership,
        ops: Vec<TaskOp>,
    },
    WriteOwn {
        lease: LeaseId,
        ops: Vec<TaskOp>,
    },
    /// A producer's or operator's batch (`Coordinator::edit`).
    Edit(Vec<Edit>),
    /// A producer's write: creates the task or replaces its value, keeping any claim.
    Put {
        key: String,
        value: Vec<u8>,
    },
    /// An operator deletes the leader record (Consul's `DELETE` of the leader key): the
    /// holder, if any, loses leadership at once, with no lock-delay, and the last record
    /// goes; the fencing counter is not the record and stays.
    DeleteLeaderRecord,
}

/// The answer to an [`Op`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Granted(Grant),
    Renewed(Renewal),
    Campaigned(Campaign),
    /// A write's answer (`Write` and `WriteOwn`).
    Written(Written),
    Edited(Edited),
    /// Done, with nothing to say.
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Lease {
    node_id: String,
    ttl: Duration,
    takeover_delay: Duration,
    /// The lease ends when `now` reaches this without a keep-alive.
    deadline: Instant,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Leader {
    holder: Option<LeaseId>,
    record: Option<HolderRecord>,
    /// The last fencing token handed out: raised by one on every acquisition.
    token: FencingToken,
    /// The version of the last change to the three fields above.
    version: u64,
    /// No lease may take leadership before this (set when a holder's lease dies).
    delayed_until: Option<Instant>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Task {
    value: Vec<u8>,
    version: u64,
    created: u64,
    holder: Option<LeaseId>,
}

/// The whole state of one in-memory coordinator.
#[derive(Debug)]
pub struct State {
    config: MemoryConfig,
    /// The global version: raised by one on every write that changes what a reader sees.
    /// Starts at 1 so that no answer carries `Version(0)` ("do not wait"), as Consul never
    /// answers index 0.
    index: u64,
    leases_opened: u64,
    leases: BTreeMap<LeaseId, Lease>,
    leader: Leader,
    tasks: BTreeMap<String, Task>,
    /// The version of the last change to any task (a creation, a write or a deletion).
    tasks_version: u64,
    /// Tasks whose claiming lease died: no lease may claim them before the instant
    /// (Consul sets lock-delay on every key a dying session held).
    claim_delays: BTreeMap<String, Instant>,
}

impl State {
    pub fn new(config: MemoryConfig) -> State {
        State {
            config,
            index: 1,
            leases_opened: 0,
            leases: BTreeMap::new(),
            leader: Leader {
                version: 1,
                ..Leader::default()
            },
            tasks: BTreeMap::new(),
            tasks_version: 1,
            claim_delays: BTreeMap::new(),
        }
    }

    pub fn limits(&self) -> WriteLimits {
        self.config.limits
    }

    /// The global version: it moves exactly when something a reader can see changes.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Runs one write at `now`, after ending the leases whose TTL ran out by then.
    pub fn apply(&mut self, op: Op, now: Instant) -> Result<Outcome, CoordError> {
        self.expire(now);
        match op {
            Op::OpenLease(spec) => self.open_lease(spec, now).map(Outcome::Granted),
            Op::KeepAlive(lease) => Ok(Outcome::Renewed(self.keep_alive(&lease, now))),
            Op::Revoke(lease) | Op::Expire(lease) => {
                self.end_lease(&lease, now);
                Ok(Outcome::Done)
            }
            Op::Campaign { lease, record } => {
                Ok(Outcome::Campaigned(self.campaign(lease, record, now)))
            }
            Op::Resign(lease) => {
                self.resign(&lease);
                Ok(Outcome::Done)
            }
            Op::Write { leadership, ops } => {
                self.check_limits(&ops, 1)?;
                // Consul's guard: the leader key is locked by this lease (check-session) and
                // still at the index of this leadership's acquire (check-index), so a
                // leadership superseded by its own lease's re-campaign writes nothing.
                if self.leader.holder.as_ref() != Some(&leadership.lease)
                    || self.leader.token != leadership.fencing_token
                {
                    return Ok(Outcome::Written(Written::NotLeader));
                }
                Ok(Outcome::Written(self.write(
                    &leadership.lease,
                    &ops,
                    false,
                    now,
                )))
            }
            Op::WriteOwn { lease, ops } => {
                self.check_limits(&ops, 0)?;
                Ok(Outcome::Written(self.write(&lease, &ops, true, now)))
            }
            Op::Edit(ops) => Ok(Outcome::Edited(self.edit(&ops))),
            Op::Put { key, value } => {
                self.index += 1;
                let index = self.index;
                let task = self.tasks.entry(key).or_insert_with(|| Task {
                    value: Vec::new(),
                    version: index,
                    created: index,
                    holder: None,
                });
                task.value = value;
                task.version = index;
                self.tasks_version = index;
                Ok(Outcome::Done)
            }
            Op::DeleteLeaderRecord => {
                if self.leader.holder.is_some() || self.leader.record.is_some() {
                    self.index += 1;
                    self.leader.holder = None;
                    self.leader.record = None;
                    self.leader.version = self.index;
                }
                Ok(Outcome::Done)
            }
        }
    }

    /// When the next lease ends unless it is kept alive: a waiter sleeps no longer.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.leases.values().map(|lease| lease.deadline).min()
    }

    /// Ends, in deadline order, every lease whose deadline is at or before `now`, each at
    /// its own deadline (so its lock-delay runs from when it died, not from when someone
    /// noticed), and forgets lock-delays that are over.
    pub fn expire(&mut self, now: Instant) {
        loop {
            let due = self
                .leases
                .iter()
                .filter(|(_, lease)| lease.deadline <= now)
                .min_by_key(|(_, lease)| lease.deadline)
                .map(|(id, lease)| (id.clone(), lease.deadline));
            let Some((id, deadline)) = due else { break };
            self.end_lease(&id, deadline);
        }
        self.claim_delays.retain(|_, until| *until > now);
        if self.leader.delayed_until.is_some_and(|until| until <= now) {
            self.leader.delayed_until = None;
        }
    }

    /// The leadership as it stands, with its version.
    pub fn holder(&self) -> (Holder, Version) {
        let holder = Holder {
            lease: self.leader.holder.clone(),
            record: self.leader.record.clone(),
            token: self.leader.token,
        };
        (holder, Version(self.leader.version))
    }

    /// The tasks under `prefix` in key order, with the tasks' version.
    pub fn list(&self, prefix: &str) -> (Vec<StoredTask>, Version) {
        let tasks = self
            .under(prefix)
            .map(|(key, task)| stored(key, task))
            .collect();
        (tasks, Version(self.tasks_version))
    }

    /// The keys under `prefix` in order, with the tasks' version.
    pub fn keys(&self, prefix: &str) -> (Names, Version) {
        let mut keys = Names::under(prefix);
        keys.extend(self.under(prefix).map(|(key, _)| key));
        (keys, Version(self.tasks_version))
    }

    /// The tasks at `keys` that exist, in the order asked.
    pub fn get(&self, keys: &[String]) -> Vec<StoredTask> {
        keys.iter()
            .filter_map(|key| self.tasks.get(key).map(|task| stored(key, task)))
            .collect()
    }

    fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a String, &'a Task)> {
        self.tasks
            .range(prefix.to_string()..)
            .take_while(move |(key, _)| key.starts_with(prefix))
    }

    fn open_lease(&mut self, spec: LeaseSpec, now: Instant) -> Result<Grant, CoordError> {
        if spec.ttl < self.config.ttl_min || spec.ttl > TTL_MAX {
            return Err(CoordError::Refused(format!(
                "a lease TTL of {:?} is outside the coordinator's range {:?} to {:?}: set the lease TTL within it",
                spec.ttl, self.config.ttl_min, TTL_MAX
            )));
        }
        if let Some(previous) = &spec.previous {
            if let Some(lease) = self.leases.get_mut(previous) {
                if lease.node_id == spec.node_id && lease.ttl == spec.ttl {
                    lease.deadline = now + lease.ttl;
                    return Ok(Grant {
                        lease: previous.clone(),
                        reused: true,
                    });
                }
                if lease.node_id == spec.node_id {
                    // This node's, but not what it asks for now: give leadership up first
                    // (no lock-delay for that), then end it, as the Consul client does.
                    let previous = previous.clone();
                    self.resign(&previous);
                    self.end_lease(&previous, now);
                }
            }
        }
        self.leases_opened += 1;
        let id = LeaseId(format!("lease-{}", self.leases_opened));
        self.leases.insert(
            id.clone(),
            Lease {
                node_id: spec.node_id,
                ttl: spec.ttl,
                takeover_delay: spec.takeover_delay.min(MAX_TAKEOVER_DELAY),
                deadline: now + spec.ttl,
            },
        );
        Ok(Grant {
            lease: id,
            reused: false,
        })
    }

    /// Frees leadership if `lease` holds it, with no lock-delay.
    fn resign(&mut self, lease: &LeaseId) {
        if self.leader.holder.as_ref() == Some(lease) {
            self.index += 1;
            self.leader.holder = None;
            self.leader.version = self.index;
        }
    }

    fn keep_alive(&mut self, lease: &LeaseId, now: Instant) -> Renewal {
        match self.leases.get_mut(lease) {
            Some(lease) => {
                lease.deadline = now + lease.ttl;
                Renewal::Alive
            }
            None => Renewal::Gone,
        }
    }

    /// Ends `id` as of `at`: leadership and claims it held are freed, each under its
    /// lock-delay, in one change with one version.
    fn end_lease(&mut self, id: &LeaseId, at: Instant) {
        let Some(lease) = self.leases.remove(id) else {
            return;
        };
        let delayed_until = (!lease.takeover_delay.is_zero()).then(|| at + lease.takeover_delay);
        let index = self.index + 1;
        let mut changed = false;
        if self.leader.holder.as_ref() == Some(id) {
            self.leader.holder = None;
            self.leader.version = index;
            if delayed_until.is_some() {
                self.leader.delayed_until = self.leader.delayed_until.max(delayed_until);
            }
            changed = true;
        }
        for (key, task) in &mut self.tasks {
            if task.holder.as_ref() == Some(id) {
                task.holder = None;
                task.version = index;
                self.tasks_version = index;
                if let Some(until) = delayed_until {
                    self.claim_delays.insert(key.clone(), until);
                }
                changed = true;
            }
        }
        if changed {
            self.index = index;
        }
    }

    fn campaign(&mut self, lease: LeaseId, record: HolderRecord, now: Instant) -> Campaign {
        if !self.leases.contains_key(&lease) {
            return Campaign::LeaseGone;
        }
        match &self.leader.holder {
            // Its own lease (a restart took it up): taken anew, so the token rises and no
            // token an earlier run of the replica handed out is ever handed out again.
            Some(holder) if *holder == lease => {}
            Some(_) => return Campaign::Held,
            None if self.leader.delayed_until.is_some_and(|until| until > now) => {
                return Campaign::Delayed
            }
            None => {}
        }
        self.index += 1;
        // Never below the floor the record asks for: the counter after it goes on from the
        // token handed out, as Consul's raft index would from a floor in its record.
        let floor = record.floor.unwrap_or(0);
        self.leader.token.0 = (self.leader.token.0 + 1).max(floor);
        self.leader.holder = Some(lease.clone());
        self.leader.record = Some(record);
        self.leader.version = self.index;
        Campaign::Won(Leadership {
            lease,
            fencing_token: self.leader.token,
        })
    }

    fn check_limits(&self, ops: &[TaskOp], guard: usize) -> Result<(), CoordError> {
        let limits = self.config.limits;
        let count = ops.len() + guard;
        if count > limits.max_ops {
            return Err(CoordError::Refused(format!(
                "a write of {count} operations is over the coordinator's limit of {}: write fewer tasks at once",
                limits.max_ops
            )));
        }
        let bytes: usize = ops.iter().map(op_bytes).sum();
        if bytes > limits.max_bytes {
            return Err(CoordError::Refused(format!(
                "a write of {bytes} bytes of keys and values is over the coordinator's limit of {}: write fewer or smaller tasks at once",
                limits.max_bytes
            )));
        }
        Ok(())
    }

    /// Applies `ops` for `lease` all or nothing. Each op sees the ops before it in the
    /// batch; every op that fails is named. `own` (a write without leadership) also
    /// requires every task written to be held by `lease`.
    fn write(&mut self, lease: &LeaseId, ops: &[TaskOp], own: bool, now: Instant) -> Written {
        let index = self.index + 1;
        // What the batch changes, looked up before the stored tasks: `None` is a deletion.
        let mut staged: BTreeMap<String, Option<Task>> = BTreeMap::new();
        let mut failed: Vec<String> = Vec::new();
        // Claims refused for a while (a dead lease's takeover delay), as Consul checks
        // them: before anything else, so they are the answer when there are any.
        let mut deferred: Vec<String> = Vec::new();
        let mut versions = Vec::new();
        for op in ops {
            let key = op.key();
            let current = match staged.get(key) {
                Some(task) => task.clone(),
                None => self.tasks.get(key).cloned(),
            };
            let requires = op.requires();
            match (requires.task, op.effect(), &current) {
                (Expected::Absent, Effect::Put { value, .. }, _) => {
                    // Only a lease's leadership creates, never its own claims.
                    if own || current.is_some() {
                        fail(&mut failed, key);
                        continue;
                    }
                    let created = Task {
                        value: value.to_vec(),
                        version: index,
                        created: index,
                        holder: None,
                    };
                    staged.insert(key.to_string(), Some(created));
                    continue;
                }
                (Expected::VersionOrGone(_), Effect::Delete { record }, None) if !own => {
                    // Gone already (an operator deleted it under the claim): finished all
                    // the same, as on Consul, whose delete-cas of a missing key succeeds.
                    if let Some(record) = record {
                        stage_record(&mut staged, &self.tasks, record.key, record.value, index);
                    }
                    continue;
                }
                _ => {}
            }
            let Some(task) = current.filter(|task| task.version == op.version().0) else {
                fail(&mut failed, key);
                continue;
            };
            let held_by_lease = task.holder.as_ref() == Some(lease);
            if own && !held_by_lease {
                fail(&mut failed, key);
                continue;
            }
            let allowed = match requires.held_by {
                HeldBy::Any => true,
                HeldBy::FreeOrWriter => task.holder.is_none() || held_by_lease,
                HeldBy::Writer => held_by_lease,
                HeldBy::Free => task.holder.is_none(),
            };
            if !allowed {
                fail(&mut failed, key);
                continue;
            }
            match op.effect() {
                Effect::Put { value, holding } => {
                    if holding == Holding::Writer
                        && self.claim_delays.get(key).is_some_and(|until| *until > now)
                    {
                        fail(&mut deferred, key);
                        continue;
                    }
                    let holder = match holding {
                        Holding::Writer => Some(lease.clone()),
                        Holding::Nobody => None,
                        Holding::Unchanged => task.holder.clone(),
                    };
                    let written = Task {
                        value: value.to_vec(),
                        version: index,
                        created: task.created,
                        holder,
                    };
                    staged.insert(key.to_string(), Some(written));
                    if op.answers_version() {
                        versions.push((key.to_string(), TaskVersion(index)));
                    }
                }
                Effect::Delete { record } => {
                    staged.insert(key.to_string(), None);
                    if let Some(record) = record {
                        stage_record(&mut staged, &self.tasks, record.key, record.value, index);
                    }
                }
            }
        }
        if !deferred.is_empty() {
            return Written::Deferred(deferred);
        }
        if !failed.is_empty() {
            return Written::Conflict(failed);
        }
        if !staged.is_empty() {
            self.index = index;
            self.tasks_version = index;
            for (key, task) in staged {
                match task {
                    Some(task) => {
                        self.tasks.insert(key, task);
                    }
                    None => {
                        self.tasks.remove(&key);
                    }
                }
            }
        }
        Written::Done {
            versions,
            fencing_token: self.leader.token,
        }
    }
}

/// Names `key` among the failed ones, once.
fn fail(failed: &mut Vec<String>, key: &str) {
    if !failed.iter().any(|k| k == key) {
        failed.push(key.to_string());
    }
}

/// Stages `value` under `to`, the record a move or a finish writes. Like a producer's
/// write: an existing task keeps its place and claim.
fn stage_record(
    staged: &mut BTreeMap<String, Option<Task>>,
    tasks: &BTreeMap<String, Task>,
    to: &str,
    value: &[u8],
    index: u64,
) {
    let target = match staged.get(to) {
        Some(task) => task.clone(),
        None => tasks.get(to).cloned(),
    };
    let (created, holder) = target.map_or((index, None), |task| (task.created, task.holder));
    staged.insert(
        to.to_string(),
        Some(Task {
            value: value.to_vec(),
            version: index,
            created,
            holder,
        }),
    );
}

/// The bytes an op carries: its keys and its value.
pub(crate) fn op_bytes(op: &TaskOp) -> usize {
    op.key().len() + op.record_key().map_or(0, str::len) + op.value_len()
}

fn stored(key: &str, task: &Task) -> StoredTask {
    StoredTask {
        key: key.to_string(),
        value: task.value.clone(),
        version: TaskVersion(task.version),
        created: task.created,
        holder: task.holder.clone(),
    }
}
