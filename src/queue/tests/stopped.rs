//! Runs stopped for the lease (the supervisor's kill schedule came first, while the
//! coordinator was answering nothing for a moment) while the same lease goes on leading:
//! the task goes back without using an attempt, whatever happens to the write that puts it
//! back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::leading::Leading;
use super::{default_settings, task};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::{Coordinator, Version};
use crate::handler::{Handler, HandlerError, HandlerFuture, Registry, TaskContext};
use crate::observe::Metrics;

/// How long the coordinator answers nothing: well inside the lease's TTL, so the lease
/// lives on and the same leader goes on leading.
const BLIP: Duration = Duration::from_secs(2);

/// Its first `stops` runs end as a run stopped for the lease does, after making the
/// coordinator unavailable for [`BLIP`] (the stop and the put back fall in the same burst
/// of errors); later runs succeed. Records each run's attempt number.
struct StoppedInABlip {
    memory: Arc<MemoryCoordinator>,
    stops: AtomicUsize,
    attempts: Arc<Mutex<Vec<u32>>>,
}

impl Handler for StoppedInABlip {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            self.attempts.lock().unwrap().push(ctx.attempt);
            let stop = self
                .stops
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if !stop {
                return Ok(());
            }
            self.memory.set_unavailable(true);
            let memory = self.memory.clone();
            tokio::spawn(async move {
                tokio::time::sleep(BLIP).await;
                memory.set_unavailable(false);
            });
            Err(HandlerError {
                interrupted: true,
                ..HandlerError::new("killed: the lease was not confirmed in time")
            })
        })
    }
}

/// A run stopped for the lease in a burst of coordinator errors, whose put back fails in
/// the same burst, costs no attempt: the put back is tried again while the lease lives, and
/// with one attempt allowed the task runs again (as attempt 1) and completes instead of
/// being dead-lettered. Twice in a row, to show the attempt count stays put.
#[tokio::test(start_paused = true)]
async fn a_run_stopped_for_the_lease_in_a_blip_uses_no_attempt() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = default_settings();
    settings.queue.max_attempts = 1;
    let prefix = settings.queue.prefix.clone();
    memory.put(&format!("{prefix}t0"), &task("a", 10)).unwrap();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register(
        "Work",
        StoppedInABlip {
            memory: memory.clone(),
            stops: AtomicUsize::new(2),
            attempts: attempts.clone(),
        },
    );
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    let list = |prefix: String| {
        let memory = memory.clone();
        async move {
            memory
                .list(&prefix, Version(0), Duration::ZERO)
                .await
                .map(|(tasks, _)| tasks.len())
                .unwrap_or(usize::MAX)
        }
    };
    for _ in 0..3000 {
        if list(prefix.clone()).await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..300 {
        if attempts.lock().unwrap().len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    leading.shut_down().await;
    let dead = memory
        .list(&settings.queue.dead_prefix, Version(0), Duration::ZERO)
        .await
        .unwrap()
        .0;
    let dead: Vec<String> = dead
        .iter()
        .map(|t| String::from_utf8_lossy(&t.value).into_owned())
        .collect();
    assert!(dead.is_empty(), "dead-lettered: {dead:?}");
    assert_eq!(list(prefix).await, 0, "the task was not completed");
    assert_eq!(
        *attempts.lock().unwrap(),
        vec![1, 1, 1],
        "a run stopped for the lease used an attempt"
    );
}
