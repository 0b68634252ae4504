//! A rate per task type (`[handlers.T] rate`), on the in-memory coordinator and the paused
//! clock: no window of the period holds more starts of the type than its rate allows,
//! across two leaders (the second reads the starts the first recorded), and a type held
//! back by its rate holds back no other type.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use super::leading::Leading;
use super::until;
use crate::coord::memory::MemoryCoordinator;
use crate::coord::Coordinator;
use crate::handler::{Handler, HandlerFuture, Registry, TaskContext, TypePolicy};
use crate::observe::Metrics;
use crate::queue::Rate;

/// Records each run's task id and start on the (paused) clock; runs take 10 ms.
struct Starts(Arc<Mutex<Vec<(String, tokio::time::Instant)>>>);

impl Handler for Starts {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let started = tokio::time::Instant::now();
            self.0.lock().unwrap().push((ctx.task_id.clone(), started));
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok(())
        })
    }
}

fn registry(runs: &Arc<Mutex<Vec<(String, tokio::time::Instant)>>>) -> Registry {
    let mut registry = Registry::default();
    registry.register("Drop", Starts(runs.clone()));
    registry.register("Work", Starts(runs.clone()));
    let rated = TypePolicy {
        rate: Some(Rate::parse("3/1s").unwrap()),
        ..TypePolicy::default()
    };
    registry.set_policy("Drop", rated);
    registry
}

#[tokio::test(start_paused = true)]
async fn a_rate_holds_across_leaders_and_holds_back_no_other_type() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let settings = super::default_settings();
    let prefix = settings.queue.prefix.clone();
    for n in 0..9u64 {
        let value = json!({"taskId": format!("d{n}"), "taskTime": n, "taskType": "Drop"});
        let key = format!("{prefix}d{n}");
        memory.put(&key, value.to_string().as_bytes()).unwrap();
    }
    for n in 0..5u64 {
        let value = json!({"taskId": format!("w{n}"), "taskTime": 100 + n, "taskType": "Work"});
        let key = format!("{prefix}w{n}");
        memory.put(&key, value.to_string().as_bytes()).unwrap();
    }
    let runs = Arc::new(Mutex::new(Vec::new()));
    let metrics = Arc::new(Metrics::new(["Drop", "Work"]));
    let first = Leading::start(&coord, &settings, registry(&runs), metrics.clone()).await;
    let drops = |runs: &[(String, tokio::time::Instant)]| {
        runs.iter().filter(|(id, _)| id.starts_with('d')).count()
    };
    until("four Drop runs", || drops(&runs.lock().unwrap()) >= 4).await;
    // The first leader steps down and its lease ends, as after a failover.
    let lease = first.leadership.lease.clone();
    first.shut_down().await;
    coord.revoke(&lease).await.unwrap();
    let second = Leading::start(&coord, &settings, registry(&runs), metrics).await;
    until("every run", || runs.lock().unwrap().len() >= 14).await;
    second.shut_down().await;

    let runs = runs.lock().unwrap().clone();
    let starts: Vec<tokio::time::Instant> = runs
        .iter()
        .filter(|(id, _)| id.starts_with('d'))
        .map(|(_, at)| *at)
        .collect();
    assert_eq!(starts.len(), 9, "every Drop ran once: {runs:?}");
    for at in &starts {
        let window = starts
            .iter()
            .filter(|other| **other >= *at && **other < *at + Duration::from_secs(1))
            .count();
        assert!(
            window <= 3,
            "{window} Drop starts within 1 s of {at:?}: {runs:?}"
        );
    }
    // The Work tasks come after every Drop in taskTime, yet did not wait for the rate:
    // all of them ran before the last Drop.
    let last_drop = starts.iter().max().copied().unwrap();
    let works_before = runs
        .iter()
        .filter(|(id, at)| id.starts_with('w') && *at < last_drop)
        .count();
    assert_eq!(
        works_before, 5,
        "Work was held behind Drop's rate: {runs:?}"
    );
}

/// Records each run's task id and start, and ends in a millisecond (a fast handler).
struct Quick(Arc<Mutex<Vec<(String, tokio::time::Instant)>>>);

impl Handler for Quick {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let started = tokio::time::Instant::now();
            self.0.lock().unwrap().push((ctx.task_id.clone(), started));
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok(())
        })
    }
}

/// No window of a second holds more than 3 of the Drop starts in `runs`.
fn assert_drop_rate(runs: &[(String, tokio::time::Instant)]) {
    let starts: Vec<tokio::time::Instant> = runs
        .iter()
        .filter(|(id, _)| id.starts_with('d'))
        .map(|(_, at)| *at)
        .collect();
    for at in &starts {
        let window = starts
            .iter()
            .filter(|other| **other >= *at && **other < *at + Duration::from_secs(1))
            .count();
        assert!(window <= 3, "{window} Drop starts within 1 s: {runs:?}");
    }
}

/// A rate configured on a type none of the backlog's tasks has costs the others nothing:
/// they are claimed in batches (a few writes for 64 tasks, not one each). Rated tasks that
/// arrive while the batches go are still claimed one by one with their rate counted: no
/// window of the period holds more of their starts than the rate.
#[tokio::test(start_paused = true)]
async fn a_rate_on_another_type_leaves_claims_batched() {
    let memory = Arc::new(MemoryCoordinator::default());
    let counting = Arc::new(super::counting::Counting::new(memory.clone()));
    let coord: Arc<dyn Coordinator> = counting.clone();
    let mut settings = super::default_settings();
    settings.queue.claim_batch = 16;
    let prefix = settings.queue.prefix.clone();
    let put = |id: String, time: u64, kind: &str| {
        let value = json!({"taskId": id, "taskTime": time, "taskType": kind});
        memory
            .put(&format!("{prefix}{id}"), value.to_string().as_bytes())
            .unwrap();
    };
    for n in 0..64u64 {
        put(format!("w{n:02}"), n, "Work");
    }
    let runs = Arc::new(Mutex::new(Vec::new()));
    let metrics = Arc::new(Metrics::new(["Drop", "Work"]));
    let mut registry = registry(&runs);
    registry.register("Work", Quick(runs.clone()));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    until("every Work run", || runs.lock().unwrap().len() >= 64).await;
    let writes = counting.calls.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        writes <= 32,
        "{writes} calls to drain 64 unrated tasks in batches of 16"
    );
    for n in 0..6u64 {
        put(format!("d{n}"), 1000 + n, "Drop");
    }
    until("every Drop run", || runs.lock().unwrap().len() >= 70).await;
    leading.shut_down().await;
    assert_drop_rate(&runs.lock().unwrap());
}

/// Rated tasks that fall due in the middle of a batched drain are not taken by a batch:
/// the batch stops before them, and they are claimed with their rate counted.
#[tokio::test(start_paused = true)]
async fn rated_tasks_falling_due_mid_batch_keep_their_rate() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = super::default_settings();
    settings.queue.claim_batch = 16;
    let prefix = settings.queue.prefix.clone();
    let put = |id: String, value: serde_json::Value| {
        memory
            .put(&format!("{prefix}{id}"), value.to_string().as_bytes())
            .unwrap();
    };
    for n in 0..512u64 {
        let id = format!("w{n:03}");
        put(
            id.clone(),
            json!({"taskId": id, "taskTime": n, "taskType": "Work"}),
        );
    }
    let due = crate::task::rfc3339(chrono::Utc::now() + chrono::Duration::milliseconds(100));
    for n in 0..6u64 {
        let id = format!("d{n}");
        let value = json!({"taskId": id, "taskTime": n, "taskType": "Drop", "runAt": due});
        put(id, value);
    }
    let runs = Arc::new(Mutex::new(Vec::new()));
    let metrics = Arc::new(Metrics::new(["Drop", "Work"]));
    let mut registry = registry(&runs);
    registry.register("Work", Quick(runs.clone()));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    until("every run", || runs.lock().unwrap().len() >= 518).await;
    leading.shut_down().await;
    let runs = runs.lock().unwrap().clone();
    let first_drop = runs.iter().position(|(id, _)| id.starts_with('d')).unwrap();
    assert!(
        first_drop < 500,
        "the Drops fell due after the batches: {runs:?}"
    );
    assert_drop_rate(&runs);
}
