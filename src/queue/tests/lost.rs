//! Writes applied by the coordinator whose answers never reached the leader: a claim's
//! tasks are put back as they were, without costing an attempt, and a completion (alone
//! or riding a claim) is not written again, so no run is recorded twice.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::counting::Counting;
use super::leading::Leading;
use super::{default_settings, task};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::Coordinator;
use crate::handler::{Handler, HandlerFuture, Registry, TaskContext};
use crate::observe::Metrics;
use crate::task::history::HistoryRecord;

/// Records each run's task id and attempt number.
struct Attempts(Arc<Mutex<Vec<(String, u32)>>>);

impl Handler for Attempts {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            self.0
                .lock()
                .unwrap()
                .push((ctx.task_id.clone(), ctx.attempt));
            Ok(())
        })
    }
}

/// The tasks each test drains, in their order.
const IDS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

/// What a drain left, one attempt allowed: each run's task id and attempt,
/// the dead letters, and the task ids of the history records.
struct Drained {
    runs: Vec<(String, u32)>,
    dead: Vec<crate::coord::StoredTask>,
    recorded: Vec<String>,
}

/// Drains tasks with the ids `IDS` (in that order), claimed up to `claim_batch` at a time,
/// run up to `concurrency` at once, with one attempt allowed, through `counting`, whose
/// knobs the caller set to lose answers.
async fn drain(
    memory: &Arc<MemoryCoordinator>,
    counting: Arc<Counting>,
    claim_batch: usize,
    concurrency: usize,
) -> Drained {
    let coord: Arc<dyn Coordinator> = counting;
    let mut settings = default_settings();
    settings.queue.max_attempts = 1;
    settings.queue.claim_batch = claim_batch;
    settings.queue.concurrency = concurrency;
    let prefix = settings.queue.prefix.clone();
    for (n, id) in IDS.iter().enumerate() {
        memory
            .put(&format!("{prefix}t{n}"), &task(id, 10 + n as u64))
            .unwrap();
    }
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Work", Attempts(runs.clone()));
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    let list = |prefix: &str| {
        let (coord, prefix) = (coord.clone(), prefix.to_string());
        async move {
            coord
                .list(&prefix, crate::coord::Version(0), Duration::ZERO)
                .await
                .unwrap()
                .0
        }
    };
    for _ in 0..1000 {
        if list(&prefix).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Long enough for every completion to be written, however it was retried.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let left = list(&prefix).await;
    assert!(left.is_empty(), "left in the queue: {left:?}");
    leading.shut_down().await;
    let mut recorded: Vec<String> = list(&settings.queue.done_prefix)
        .await
        .iter()
        .flat_map(|s| HistoryRecord::decode_all(&s.key, &s.value))
        .map(|record| record.task_id)
        .collect();
    recorded.sort();
    let dead = list(&settings.queue.dead_prefix).await;
    let runs = runs.lock().unwrap().clone();
    Drained {
        runs,
        dead,
        recorded,
    }
}

/// Each task ran once, as its first attempt, in order; none was dead-lettered; each run
/// has one history record; and every answer the test meant to lose was lost.
fn assert_drained_once(drained: Drained, counting: &Counting) {
    assert!(drained.dead.is_empty(), "dead-lettered: {:?}", drained.dead);
    let once: Vec<(String, u32)> = IDS.iter().map(|id| (id.to_string(), 1)).collect();
    assert_eq!(
        drained.runs, once,
        "each task runs once, as its first attempt"
    );
    let mut ids = IDS.to_vec();
    ids.sort();
    assert_eq!(drained.recorded, ids, "one history record per run");
    let left = |n: &AtomicUsize| n.load(Ordering::SeqCst);
    assert_eq!(
        left(&counting.lose_claim_answers),
        0,
        "claim answers not lost"
    );
    assert_eq!(
        left(&counting.lose_completion_answers),
        0,
        "completion answers not lost"
    );
}

/// Answers to lose: claim writes answered first (`passed`), then claim answers lost, and
/// completion answers lost.
#[derive(Clone, Copy, Default)]
struct Lose {
    passed: usize,
    claims: usize,
    completions: usize,
}

/// Drains `IDS` as [`drain`] does over a coordinator that loses the answers `lose` says,
/// and checks [`assert_drained_once`].
async fn drains_once(lose: Lose, claim_batch: usize, concurrency: usize) {
    let memory = Arc::new(MemoryCoordinator::default());
    let counting = Arc::new(Counting::new(memory.clone()));
    counting.pass_claims.store(lose.passed, Ordering::SeqCst);
    counting
        .lose_claim_answers
        .store(lose.claims, Ordering::SeqCst);
    counting
        .lose_completion_answers
        .store(lose.completions, Ordering::SeqCst);
    let drained = drain(&memory, counting.clone(), claim_batch, concurrency).await;
    assert_drained_once(drained, &counting);
}

/// A claim write that was applied but whose answer was lost leaves its tasks held by the
/// leader's own lease, none of them started. The next listing puts them back as they
/// were, costing no attempt: with two answers lost in a row, each task still runs once.
#[tokio::test(start_paused = true)]
async fn a_claim_whose_answer_was_lost_costs_its_tasks_no_attempt() {
    let lose = Lose {
        claims: 2,
        ..Lose::default()
    };
    drains_once(lose, 32, 1).await;
}

/// A claim whose answer was lost carried completions: they were applied with it, and are
/// not written (nor their runs recorded) again. Claimed two at a time, the fourth claim
/// (lost) carries the completions of `b` and `c`; written again, they would go in one
/// write with those of `d` and `e`, under another record key.
#[tokio::test(start_paused = true)]
async fn the_completions_riding_a_lost_claim_are_recorded_once() {
    let lose = Lose {
        passed: 3,
        claims: 1,
        ..Lose::default()
    };
    drains_once(lose, 2, 1).await;
}

/// A completion whose answer was lost was applied all the same: its tasks are gone and
/// their history recorded. It is not written again, so no run is recorded twice.
#[tokio::test(start_paused = true)]
async fn a_completion_whose_answer_was_lost_is_recorded_once() {
    let lose = Lose {
        completions: 1,
        ..Lose::default()
    };
    drains_once(lose, 32, 1).await;
}

/// The driver of concurrency groups settles the same lost answers the same way: a lost
/// claim, a lost completion, a lost claim carrying completions.
#[tokio::test(start_paused = true)]
async fn with_concurrency_lost_answers_settle_the_same_way() {
    for (passed, claims, completions) in [(0, 1, 0), (0, 0, 1), (2, 1, 0)] {
        let lose = Lose {
            passed,
            claims,
            completions,
        };
        drains_once(lose, 2, 3).await;
    }
}

/// Ends the leader's lease while it runs, and makes the next `fails` reads by key fail.
struct EndsTheLease {
    memory: Arc<MemoryCoordinator>,
    counting: Arc<Counting>,
    lease: Arc<std::sync::OnceLock<crate::coord::LeaseId>>,
    fails: usize,
}

impl Handler for EndsTheLease {
    fn handle<'a>(&'a self, _: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let lease = loop {
                match self.lease.get() {
                    Some(lease) => break lease,
                    None => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            };
            self.memory.expire_lease(lease).unwrap();
            self.counting.fail_gets.store(self.fails, Ordering::SeqCst);
            Ok(())
        })
    }
}

/// A run that ends cleanly after its lease ended is recorded on the orphan it left, by its
/// own replica, even through a coordinator that fails the first reads of it: the next
/// leader would otherwise run it again one fence later.
#[tokio::test(start_paused = true)]
async fn a_clean_end_after_the_lease_ended_is_recorded_through_failed_reads() {
    let memory = Arc::new(MemoryCoordinator::default());
    let counting = Arc::new(Counting::new(memory.clone()));
    let coord: Arc<dyn Coordinator> = counting.clone();
    let settings = default_settings();
    let prefix = settings.queue.prefix.clone();
    memory.put(&format!("{prefix}t0"), &task("a", 10)).unwrap();
    let lease = Arc::new(std::sync::OnceLock::new());
    let mut registry = Registry::default();
    let handler = EndsTheLease {
        memory: memory.clone(),
        counting: counting.clone(),
        lease: lease.clone(),
        fails: 3,
    };
    registry.register("Work", handler);
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    lease.set(leading.leadership.lease.clone()).unwrap();
    leading.ended().await;
    assert_eq!(counting.fail_gets.load(Ordering::SeqCst), 0, "reads failed");
    let (left, _) = memory
        .list(&prefix, crate::coord::Version(0), Duration::ZERO)
        .await
        .unwrap();
    assert!(
        left.is_empty(),
        "the finished run was not recorded: {left:?}"
    );
}
