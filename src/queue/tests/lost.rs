//! A claim write applied by the coordinator whose answer never reached the leader: what it
//! claimed is put back as it was, without costing an attempt.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::counting::Counting;
use super::leading::Leading;
use super::{default_settings, task};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::Coordinator;
use crate::handler::{Handler, HandlerFuture, Registry, TaskContext};
use crate::observe::Metrics;

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

/// A claim write that was applied but whose answer was lost leaves its tasks held by the
/// leader's own lease, none of them started. The next listing puts them back as they
/// were, costing no attempt: with one attempt allowed and two answers lost in a row, each
/// task still runs once, as its first attempt, in order, and nothing is dead-lettered.
#[tokio::test(start_paused = true)]
async fn a_claim_whose_answer_was_lost_costs_its_tasks_no_attempt() {
    let memory = Arc::new(MemoryCoordinator::default());
    let counting = Arc::new(Counting::new(memory.clone()));
    counting
        .lose_claim_answers
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let coord: Arc<dyn Coordinator> = counting.clone();
    let mut settings = default_settings();
    settings.queue.max_attempts = 1;
    let prefix = settings.queue.prefix.clone();
    let dead_prefix = settings.queue.dead_prefix.clone();
    for (n, id) in ["one", "two", "three"].iter().enumerate() {
        memory
            .put(&format!("{prefix}t{n}"), &task(id, 10 + n as u64))
            .unwrap();
    }
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Work", Attempts(runs.clone()));
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    for _ in 0..1000 {
        let (left, _) = coord
            .list(&prefix, crate::coord::Version(0), Duration::ZERO)
            .await
            .unwrap();
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (dead, _) = coord
        .list(&dead_prefix, crate::coord::Version(0), Duration::ZERO)
        .await
        .unwrap();
    assert!(dead.is_empty(), "dead-lettered: {dead:?}");
    let runs = runs.lock().unwrap().clone();
    assert_eq!(
        runs,
        [("one".into(), 1), ("two".into(), 1), ("three".into(), 1)],
        "each task runs once, as its first attempt"
    );
    assert_eq!(
        counting
            .lose_claim_answers
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no answer was lost"
    );
    leading.shut_down().await;
}
