//! A task its producer scheduled (`runAt`), led against the in-memory coordinator on the
//! real clock (a schedule is wall-clock time, which tokio's paused clock does not move): it
//! starts at its time and not before, after a later task that was due, and the leader calls
//! the coordinator's queue not once while it waits.

use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use super::counting::Counting;
use super::{default_settings, task, until, Leading};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::Coordinator;
use crate::handler::{Handler, HandlerFuture, Registry, TaskContext};
use crate::observe::Metrics;

/// Each run's task id and when it started.
type Starts = Arc<Mutex<Vec<(String, DateTime<Utc>)>>>;

/// Records each run's task id and when it started.
struct Stamped(Starts);

impl Handler for Stamped {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            self.0
                .lock()
                .unwrap()
                .push((ctx.task_id.clone(), Utc::now()));
            Ok(())
        })
    }
}

/// A task scheduled 400 ms ahead, with the earliest taskTime, runs after a later task that
/// was due, at its runAt (not before, within 50 ms after), and while it waits the leader
/// makes no call on the queue: its blocking listing waits for a change, its own timer for
/// the time.
#[tokio::test]
async fn a_scheduled_task_starts_at_its_time_with_no_call_while_it_waits() {
    let memory = Arc::new(MemoryCoordinator::default());
    let counting = Arc::new(Counting::new(memory.clone()));
    let coord: Arc<dyn Coordinator> = counting.clone();
    let mut settings = default_settings();
    // No history, so no pruning calls of its own.
    settings.queue.history_keep = 0;
    let prefix = settings.queue.prefix.clone();
    let run_at = DateTime::from_timestamp_millis(Utc::now().timestamp_millis() + 400).unwrap();
    let scheduled = json!({
        "taskId": "timed", "taskTime": 1, "taskType": "Work",
        "runAt": crate::task::rfc3339(run_at),
    });
    memory
        .put(&format!("{prefix}a"), scheduled.to_string().as_bytes())
        .unwrap();
    memory.put(&format!("{prefix}b"), &task("due", 2)).unwrap();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Work", Stamped(runs.clone()));
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics.clone()).await;

    until("the due task ran", || runs.lock().unwrap().len() == 1).await;
    // Its completion recorded, the queue listed again, the wait begun.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = counting.calls.load(Ordering::SeqCst);
    let quiet_until = run_at - chrono::Duration::milliseconds(30);
    tokio::time::sleep((quiet_until - Utc::now()).to_std().unwrap()).await;
    assert_eq!(
        counting.calls.load(Ordering::SeqCst),
        before,
        "the leader called the queue while the scheduled task waited"
    );
    assert_eq!(
        runs.lock().unwrap().len(),
        1,
        "the scheduled task ran early"
    );
    until("the scheduled task ran", || runs.lock().unwrap().len() == 2).await;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs[0].0, "due");
    let (id, started) = &runs[1];
    assert_eq!(id, "timed");
    let late = *started - run_at;
    assert!(
        late >= chrono::Duration::zero() && late < chrono::Duration::milliseconds(50),
        "started {} ms after its runAt",
        late.num_milliseconds()
    );
    leading.shut_down().await;
}
