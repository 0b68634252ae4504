//! The one-at-a-time driver claims the next batch while fast handlers run this one, and a
//! second one when the runs outpace the coordinator.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::counting::Counting;
use super::{default_settings, task, until, Leading};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::Coordinator;
use crate::handler::{Handler, HandlerFuture, Registry, TaskContext};
use crate::observe::Metrics;

/// Records, at each run, how many of the queue's tasks are held by a lease once the run
/// has let the leader's other work go on (a few yields, no time passing).
struct HeldSeen {
    memory: Arc<MemoryCoordinator>,
    prefix: String,
    held: Arc<Mutex<Vec<usize>>>,
}

impl Handler for HeldSeen {
    fn handle<'a>(&'a self, _ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
            let (tasks, _) = self
                .memory
                .list(&self.prefix, crate::coord::Version(0), Duration::ZERO)
                .await
                .unwrap();
            let held = tasks.iter().filter(|t| t.holder.is_some()).count();
            self.held.lock().unwrap().push(held);
            Ok(())
        })
    }
}

/// While a batch of fast runs goes on, the next batch is already being claimed, so the
/// claim's round trip is not added to every batch; every task still runs once, in order.
#[tokio::test(start_paused = true)]
async fn the_next_batch_is_claimed_while_a_batch_runs() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = default_settings();
    settings.queue.claim_batch = 2;
    let prefix = settings.queue.prefix.clone();
    for n in 0..9u64 {
        memory
            .put(&format!("{prefix}k{n}"), &task(&format!("t{n}"), 10 + n))
            .unwrap();
    }
    let held = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register(
        "Work",
        HeldSeen {
            memory: memory.clone(),
            prefix: prefix.clone(),
            held: held.clone(),
        },
    );
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    until("every task ran", || held.lock().unwrap().len() == 9).await;
    leading.shut_down().await;
    assert_eq!(coord.keys(&prefix).await.unwrap().0, Vec::<String>::new());
    let held = held.lock().unwrap().clone();
    assert!(
        held.iter().any(|&n| n > 2),
        "no run saw more than one batch of 2 held: {held:?}"
    );
}

/// Records the order of its runs.
struct InOrder(Arc<Mutex<Vec<String>>>);

impl Handler for InOrder {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            self.0.lock().unwrap().push(ctx.task_id.clone());
            Ok(())
        })
    }
}

/// When the runs finish before the coordinator answers the claim sent ahead, a second claim
/// is sent before that answer comes, so two are on their way at once; the tasks still run
/// once each, in order, and all complete.
#[tokio::test(start_paused = true)]
async fn a_second_claim_goes_out_while_a_slow_coordinator_answers_the_first() {
    let memory = Arc::new(MemoryCoordinator::default());
    let counting = Arc::new(Counting::with_write_delay(
        memory.clone(),
        Duration::from_millis(5),
    ));
    let coord: Arc<dyn Coordinator> = counting.clone();
    let mut settings = default_settings();
    settings.queue.claim_batch = 3;
    let prefix = settings.queue.prefix.clone();
    let order: Vec<String> = (0..20).map(|n| format!("t{n:02}")).collect();
    for (n, id) in order.iter().enumerate() {
        memory
            .put(&format!("{prefix}k{n:02}"), &task(id, 10 + n as u64))
            .unwrap();
    }
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Work", InOrder(runs.clone()));
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    until("every task ran", || {
        runs.lock().unwrap().len() == order.len()
    })
    .await;
    leading.shut_down().await;
    assert_eq!(*runs.lock().unwrap(), order);
    assert_eq!(coord.keys(&prefix).await.unwrap().0, Vec::<String>::new());
    let most = counting
        .most_writing
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(most >= 2, "at most {most} claim on its way at once");
}
