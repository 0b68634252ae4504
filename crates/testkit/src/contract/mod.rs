//! The contract every coordinator passes: the module header of [`leaderq::coord`] as checks
//! that run against any [`Coordinator`]: the in-memory one in unit tests, real servers in
//! the integration tests (`leaderq server` through the Consul backend, a ZooKeeper ensemble,
//! an etcd cluster, a Redis).
//!
//! Each check takes a fresh [`Subject`] (a coordinator nobody else uses, a producer to
//! write tasks with, prefixes of its own and the timing to use) and answers `Ok(())` or
//! what broke. [`CHECKS`] lists them all; [`run_all`] runs them at once and reports every
//! failure. The checks only use the trait and wait with `tokio::time`, so a coordinator on
//! tokio's paused clock runs the whole suite in no real time, and a real server with a 1 s
//! TTL in a few seconds.

mod finish;
mod leadership;
mod queue;
mod support;
mod writes;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use self::finish::*;
pub use self::leadership::*;
pub use self::queue::*;
pub use self::writes::*;
use leaderq::coord::memory::MemoryCoordinator;
use leaderq::coord::{CoordFuture, Coordinator};

/// How the checks write as producers and operators do, outside the coordinator trait (a KV
/// PUT on Consul, a `curl -X DELETE` of the leader key).
pub trait Producer: Send + Sync {
    /// Creates the task at `key` or replaces its value.
    fn put<'a>(&'a self, key: &'a str, value: &'a [u8]) -> CoordFuture<'a, ()>;
    /// Deletes the subject's leader record by hand, as an operator would: Consul's leader
    /// key, etcd's campaign keys, ZooKeeper's latch znodes, Redis's leader key (the record
    /// that says who holds leadership now, not the fencing counter behind it).
    fn delete_leader_record(&self) -> CoordFuture<'_, ()>;
}

/// The in-memory coordinator writes as a producer and deletes its leader record as an
/// operator through its test hooks.
impl Producer for MemoryCoordinator {
    fn put<'a>(&'a self, key: &'a str, value: &'a [u8]) -> CoordFuture<'a, ()> {
        Box::pin(async move { MemoryCoordinator::put(self, key, value) })
    }

    fn delete_leader_record(&self) -> CoordFuture<'_, ()> {
        Box::pin(async move { MemoryCoordinator::delete_leader_record(self) })
    }
}

/// The times a run uses: the backend's shortest TTL keeps the suite fast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// The TTL of every lease the checks open; also the lock-delay where one is wanted.
    pub ttl: Duration,
    /// How long after its last keep-alive the backend may take to end a lease (Consul ends
    /// a session after twice its TTL, and its timer may run a little late).
    pub expiry: Duration,
    /// Whether the backend keeps leadership untaken for a dead holder's lock-delay
    /// (Consul and the in-memory one do; etcd, ZooKeeper and Redis have no such thing and
    /// rely on the fencing token and the holder's own TTL margin instead).
    pub takeover_delay: bool,
    /// Whether `open_lease` takes a live previous lease of the same node up again (Consul,
    /// the in-memory one). ZooKeeper's client cannot hand a session to a new connection, so
    /// there a restart always gets a new lease, after the previous one's leadership was
    /// cleared away: the checks then expect that instead.
    pub lease_reuse: bool,
}

impl Timing {
    /// `ttl`, and an expiry bound of three TTLs.
    pub fn new(ttl: Duration) -> Timing {
        Timing {
            ttl,
            expiry: ttl * 3,
            takeover_delay: true,
            lease_reuse: true,
        }
    }

    /// The same, for a backend without lock-delay: the lock-delay check then only checks
    /// that a resignation and a death both free leadership.
    pub fn without_takeover_delay(self) -> Timing {
        Timing {
            takeover_delay: false,
            ..self
        }
    }

    /// The same, for a backend that cannot take a lease up again from a new process: a
    /// previous lease given to `open_lease` yields a new lease, and the previous lease's
    /// leadership no longer stands in the new one's way.
    pub fn without_lease_reuse(self) -> Timing {
        Timing {
            lease_reuse: false,
            ..self
        }
    }
}

/// What one check runs against. Make a fresh one for every check: a coordinator with a
/// leadership no one else contends for, and prefixes no other check writes under.
#[derive(Clone)]
pub struct Subject {
    /// The coordinator under test.
    pub coord: Arc<dyn Coordinator>,
    /// Writes tasks into that same coordinator.
    pub producer: Arc<dyn Producer>,
    /// Where the checks' tasks live, e.g. `contract/<check>/queue/`.
    pub queue_prefix: String,
    /// Where they dead-letter tasks; must not lie under `queue_prefix`.
    pub dead_prefix: String,
    pub timing: Timing,
}

/// What a check returns: `Err` says what broke.
pub type CheckFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// One check of the contract.
#[derive(Clone, Copy)]
pub struct Check {
    /// The check's function name, a sentence of what it shows.
    pub name: &'static str,
    /// Runs the check on a fresh subject.
    pub run: fn(Subject) -> CheckFuture,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

macro_rules! checks {
    ($($name:ident),* $(,)?) => {
        /// Every check of the contract, in the order of this module.
        pub const CHECKS: &[Check] = &[
            $(Check { name: stringify!($name), run: |subject| Box::pin($name(subject)) }),*
        ];
    };
}

/// Calls the macro `$then` with the name of every check of the contract, in order: the
/// one list of them, from which [`CHECKS`] and the in-memory coordinator's one test per
/// check are both made.
#[macro_export]
macro_rules! with_checks {
    ($then:ident) => {
        $then!(
            one_leader_among_concurrent_campaigners,
            fencing_rises_across_leaders,
            the_token_rises_after_an_operator_deletes_the_leader_record,
            a_win_is_handed_at_least_the_floor_its_record_asks,
            takeover_delay_follows_a_death_not_a_resignation,
            previous_lease_is_taken_up_only_if_alive_and_own,
            deposed_leader_writes_nothing,
            conflict_names_the_key_and_applies_nothing,
            completing_or_moving_a_gone_task_conflicts,
            claim_and_complete_follow_versions,
            finish_deletes_the_task_and_writes_its_record,
            list_gives_versions_and_creation_order,
            list_and_observe_wait_for_a_change_or_the_wait,
            dead_lease_leaves_its_claims_unheld,
            a_claim_within_a_dead_leases_delay_is_deferred,
            move_and_rewrite_keep_the_data,
            write_own_touches_only_own_claims,
            write_own_cannot_complete_or_move_what_it_does_not_hold,
            a_revoked_holder_settles_its_orphan_at_the_version_read,
            over_limit_writes_are_refused_whole,
            keep_alive_of_an_ended_lease_is_gone,
            edits_create_only_new_keys_and_apply_whole,
            put_writes_a_key_whatever_is_there,
            a_leaders_create_writes_only_a_new_key,
        );
    };
}
pub use crate::with_checks;

with_checks!(checks);

/// Runs every check at once, each on a subject from `make(check name)`, each bounded in
/// time; `Err` lists every check that failed and why.
pub async fn run_all<F, Fut>(make: F) -> Result<(), String>
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Subject>,
{
    let mut runs = Vec::new();
    for check in CHECKS {
        let subject = make(check.name).await;
        runs.push((check.name, tokio::spawn(run_one(*check, subject))));
    }
    let mut failures = Vec::new();
    for (name, run) in runs {
        match run.await {
            Ok(Ok(())) => {}
            Ok(Err(why)) => failures.push(format!("{name}: {why}")),
            Err(err) => failures.push(format!("{name}: panicked: {err}")),
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// Runs one check, failing it if it takes far longer than its waits allow (a hang).
pub async fn run_one(check: Check, subject: Subject) -> Result<(), String> {
    let bound = subject.timing.expiry * 10 + Duration::from_secs(10);
    match tokio::time::timeout(bound, (check.run)(subject)).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {bound:?}: a call hangs")),
    }
}
