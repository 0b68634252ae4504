//! The contract suite (testkit's) on the in-memory coordinator, one test per check on
//! tokio's paused clock, and coordinators with one fault each that the suite must catch.
//! An integration test, not a unit test of `coord::memory`: testkit links leaderq as a
//! crate of its own, whose types a unit test's `crate::` ones are not.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leaderq::coord::memory::MemoryCoordinator;
use leaderq::coord::{
    Campaign, CoordFuture, Coordinator, Edit, Edited, FencingToken, Grant, Holder, HolderRecord,
    Leadership, LeaseId, LeaseSpec, Names, Renewal, StoredTask, TaskOp, Version, WriteCost,
    WriteLimits, Written,
};
use testkit::contract::{self, Subject, Timing};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn subject() -> Subject {
    let coord = Arc::new(MemoryCoordinator::default());
    Subject {
        coord: coord.clone(),
        producer: coord,
        queue_prefix: "queue/".into(),
        dead_prefix: "dead/".into(),
        timing: Timing::new(secs(1)),
    }
}

macro_rules! contract_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[doc = concat!("The contract's `", stringify!($name), "` on the in-memory coordinator.")]
            #[tokio::test(start_paused = true)]
            async fn $name() {
                let check = contract::CHECKS
                    .iter()
                    .find(|check| check.name == stringify!($name))
                    .expect("a check of that name");
                if let Err(why) = contract::run_one(*check, subject()).await {
                    panic!("{why}");
                }
            }
        )*

        /// Every check of the contract has its test here.
        #[test]
        fn every_contract_check_runs_on_the_memory_coordinator() {
            let here = [$(stringify!($name)),*];
            for check in contract::CHECKS {
                assert!(here.contains(&check.name), "{} has no test here", check.name);
            }
        }
    };
}

testkit::with_checks!(contract_tests);

/// `run_all` runs every check and passes on a coordinator that keeps the contract.
#[tokio::test(start_paused = true)]
async fn run_all_passes_on_the_memory_coordinator() {
    let result = contract::run_all(|_| async { subject() }).await;
    assert_eq!(result, Ok(()));
}

/// What a [`Broken`] coordinator gets wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// A campaign on held leadership wins too.
    TwoLeaders,
    /// Every leadership gets token 1.
    SameToken,
    /// A batch with a conflict still applies the ops that would succeed alone.
    PartialWrites,
    /// `list` and `observe` answer at once, whatever the version.
    NoWaiting,
    /// Tokens count wins since the leader record was last deleted, as Consul's LockIndex
    /// of a key created anew does.
    TokenRestartsWithTheRecord,
}

/// The in-memory coordinator with one fault, to show the contract catches it; and, for
/// `TokenRestartsWithTheRecord`, the inner token at the last deletion of the record.
struct Broken(MemoryCoordinator, Fault, AtomicU64);

impl Broken {
    fn new(fault: Fault) -> Broken {
        Broken(MemoryCoordinator::default(), fault, AtomicU64::new(0))
    }

    /// The token this coordinator hands out for the inner one's `token`.
    fn token(&self, token: FencingToken) -> FencingToken {
        match self.1 {
            Fault::TokenRestartsWithTheRecord => {
                FencingToken(token.0 - self.2.load(Ordering::SeqCst))
            }
            _ => token,
        }
    }
}

impl Coordinator for Broken {
    fn describe(&self) -> String {
        format!("in-memory coordinator with {:?}", self.1)
    }
    fn open_lease<'a>(&'a self, spec: &'a LeaseSpec) -> CoordFuture<'a, Grant> {
        self.0.open_lease(spec)
    }
    fn keep_alive<'a>(&'a self, lease: &'a LeaseId) -> CoordFuture<'a, Renewal> {
        self.0.keep_alive(lease)
    }
    fn revoke<'a>(&'a self, lease: &'a LeaseId) -> CoordFuture<'a, ()> {
        self.0.revoke(lease)
    }
    fn close<'a>(&'a self, lease: Option<&'a LeaseId>) -> CoordFuture<'a, ()> {
        self.0.close(lease)
    }
    fn observe(&self, after: Version, wait: Duration) -> CoordFuture<'_, (Holder, Version)> {
        Box::pin(async move {
            let after = match self.1 {
                Fault::NoWaiting => Version(0),
                _ => after,
            };
            let (holder, version) = self.0.observe(after, wait).await?;
            let token = self.token(holder.token);
            Ok((Holder { token, ..holder }, version))
        })
    }
    fn campaign<'a>(
        &'a self,
        lease: &'a LeaseId,
        record: &'a HolderRecord,
    ) -> CoordFuture<'a, Campaign> {
        Box::pin(async move {
            let answer = self.0.campaign(lease, record).await?;
            Ok(match (self.1, answer) {
                (Fault::TwoLeaders, Campaign::Held) => Campaign::Won(Leadership {
                    lease: lease.clone(),
                    fencing_token: FencingToken(1),
                }),
                (Fault::SameToken, Campaign::Won(leadership)) => Campaign::Won(Leadership {
                    fencing_token: FencingToken(1),
                    ..leadership
                }),
                (Fault::TokenRestartsWithTheRecord, Campaign::Won(leadership)) => {
                    Campaign::Won(Leadership {
                        fencing_token: self.token(leadership.fencing_token),
                        ..leadership
                    })
                }
                (_, answer) => answer,
            })
        })
    }
    fn resign<'a>(&'a self, lease: &'a LeaseId) -> CoordFuture<'a, ()> {
        self.0.resign(lease)
    }
    fn list<'a>(
        &'a self,
        prefix: &'a str,
        after: Version,
        wait: Duration,
    ) -> CoordFuture<'a, (Vec<StoredTask>, Version)> {
        match self.1 {
            Fault::NoWaiting => self.0.list(prefix, Version(0), wait),
            _ => self.0.list(prefix, after, wait),
        }
    }
    fn keys<'a>(&'a self, prefix: &'a str) -> CoordFuture<'a, (Names, Version)> {
        self.0.keys(prefix)
    }
    fn get<'a>(&'a self, keys: &'a [String]) -> CoordFuture<'a, Vec<StoredTask>> {
        self.0.get(keys)
    }
    fn write<'a>(
        &'a self,
        leadership: &'a Leadership,
        ops: &'a [TaskOp],
    ) -> CoordFuture<'a, Written> {
        Box::pin(async move {
            let answer = self.0.write(leadership, ops).await?;
            if self.1 == Fault::PartialWrites && matches!(answer, Written::Conflict(_)) {
                for op in ops {
                    self.0.write(leadership, std::slice::from_ref(op)).await?;
                }
            }
            Ok(match answer {
                Written::Done {
                    versions,
                    fencing_token,
                } => Written::Done {
                    versions,
                    fencing_token: self.token(fencing_token),
                },
                other => other,
            })
        })
    }
    fn write_own<'a>(&'a self, lease: &'a LeaseId, ops: &'a [TaskOp]) -> CoordFuture<'a, Written> {
        self.0.write_own(lease, ops)
    }
    fn edit<'a>(&'a self, ops: &'a [Edit]) -> CoordFuture<'a, Edited> {
        self.0.edit(ops)
    }
    fn limits(&self) -> WriteLimits {
        self.0.limits()
    }
    fn cost(&self, op: &TaskOp) -> WriteCost {
        self.0.cost(op)
    }
    fn guard_cost(&self) -> WriteCost {
        self.0.guard_cost()
    }
}

async fn run_broken(fault: Fault, check: &str) -> Result<(), String> {
    let check = contract::CHECKS
        .iter()
        .find(|c| c.name == check)
        .expect("a check of that name");
    let broken = Arc::new(Broken::new(fault));
    // Tasks go to the coordinator under test, not to another one.
    let subject = Subject {
        coord: broken.clone(),
        producer: Arc::new(ProducerOf(broken)),
        ..subject()
    };
    contract::run_one(*check, subject).await
}

/// Writes tasks through the inner coordinator of a [`Broken`] one.
struct ProducerOf(Arc<Broken>);

impl contract::Producer for ProducerOf {
    fn put<'a>(&'a self, key: &'a str, value: &'a [u8]) -> CoordFuture<'a, ()> {
        contract::Producer::put(&self.0 .0, key, value)
    }

    fn delete_leader_record(&self) -> CoordFuture<'_, ()> {
        Box::pin(async move {
            let broken = &self.0;
            if broken.1 == Fault::TokenRestartsWithTheRecord {
                let (holder, _) = broken.0.observe(Version(0), Duration::ZERO).await?;
                broken.2.store(holder.token.0, Ordering::SeqCst);
            }
            contract::Producer::delete_leader_record(&broken.0).await
        })
    }
}

/// The contract catches two leaders, a token that does not rise, one that restarts with a
/// leader record deleted by hand (Consul's LockIndex alone), a batch applied in part and
/// reads that do not wait, each in the check that is about it.
#[tokio::test(start_paused = true)]
async fn the_contract_catches_broken_coordinators() {
    for (fault, check) in [
        (Fault::TwoLeaders, "one_leader_among_concurrent_campaigners"),
        (Fault::SameToken, "fencing_rises_across_leaders"),
        (
            Fault::PartialWrites,
            "conflict_names_the_key_and_applies_nothing",
        ),
        (
            Fault::NoWaiting,
            "list_and_observe_wait_for_a_change_or_the_wait",
        ),
        (
            Fault::TokenRestartsWithTheRecord,
            "the_token_rises_after_an_operator_deletes_the_leader_record",
        ),
    ] {
        let result = run_broken(fault, check).await;
        assert!(result.is_err(), "{check} passed with {fault:?}");
        println!("{fault:?}: {check}: {}", result.unwrap_err());
    }
}

/// `run_all` names every check that fails.
#[tokio::test(start_paused = true)]
async fn run_all_names_the_failed_checks() {
    let result = contract::run_all(|_| async {
        let broken = Arc::new(Broken::new(Fault::TwoLeaders));
        Subject {
            coord: broken.clone(),
            producer: Arc::new(ProducerOf(broken)),
            ..subject()
        }
    })
    .await;
    let failures = result.expect_err("two leaders pass the contract");
    assert!(
        failures.contains("one_leader_among_concurrent_campaigners: "),
        "{failures}"
    );
}
