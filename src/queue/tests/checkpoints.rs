//! A Rust handler's reports on the in-memory coordinator and the paused clock: its progress
//! and checkpoint are recorded in the task while it runs, the failed run's retry keeps the
//! checkpoint, and the rerun gets it from `TaskContext::checkpoint`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::leading::Leading;
use super::until;
use crate::coord::memory::MemoryCoordinator;
use crate::coord::Coordinator;
use crate::handler::{Handler, HandlerFuture, Registry, TaskContext};
use crate::observe::Metrics;

/// Reports a checkpoint and progress, then fails its first run after a while; records the
/// checkpoint each run was given.
struct Resumes(Arc<Mutex<Vec<Option<Value>>>>);

impl Handler for Resumes {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            self.0.lock().unwrap().push(ctx.checkpoint());
            ctx.progress.checkpoint(json!({"n": ctx.attempt}));
            ctx.progress.progress(0.5, Some("half way"));
            if ctx.attempt > 1 {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            Err("the copy broke off".into())
        })
    }
}

/// Recorded while it runs; kept by the retry; given to the rerun.
#[tokio::test(start_paused = true)]
async fn a_retry_starts_from_the_checkpoint_its_failed_run_recorded() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = super::default_settings();
    settings.queue.backoff_base = Duration::from_millis(10);
    let key = format!("{}t1", settings.queue.prefix);
    let task = json!({"taskId": "copy", "taskTime": 1, "taskType": "Copy"});
    memory.put(&key, task.to_string().as_bytes()).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Copy", Resumes(seen.clone()));
    let metrics = Arc::new(Metrics::new(["Copy"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    let stored = Arc::new(Mutex::new(Value::Null));
    for _ in 0..200 {
        if let Some(found) = coord.get(std::slice::from_ref(&key)).await.unwrap().pop() {
            let value: Value = serde_json::from_slice(&found.value).unwrap();
            if value["checkpoint"] == json!({"n": 1}) {
                *stored.lock().unwrap() = value;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stored = stored.lock().unwrap().clone();
    assert_eq!(stored["progress"], json!(0.5), "{stored}");
    assert_eq!(stored["progressMessage"], json!("half way"), "{stored}");
    assert_eq!(stored["taskTaken"], json!(true), "{stored}");
    until("two runs", || seen.lock().unwrap().len() >= 2).await;
    assert_eq!(*seen.lock().unwrap(), [None, Some(json!({"n": 1}))]);
    leading.shut_down().await;
}

/// Checkpoints every millisecond for a second, then succeeds.
struct Chatty;

impl Handler for Chatty {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            for n in 0..1000 {
                ctx.progress.checkpoint(json!({"n": n}));
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Ok(())
        })
    }
}

/// A handler checkpointing a thousand times a second costs the coordinator a few writes,
/// not one per round trip: the task's versions, sampled every millisecond while it runs,
/// move at most once per `CHECKPOINT_EVERY` (and once for its claim).
#[tokio::test(start_paused = true)]
async fn a_handler_checkpointing_in_a_tight_loop_is_written_a_few_times_a_second() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let settings = super::default_settings();
    let key = format!("{}t1", settings.queue.prefix);
    let task = json!({"taskId": "copy", "taskTime": 1, "taskType": "Copy"});
    memory.put(&key, task.to_string().as_bytes()).unwrap();
    let mut registry = Registry::default();
    registry.register("Copy", Chatty);
    let metrics = Arc::new(Metrics::new(["Copy"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    let mut versions = Vec::new();
    let mut last = None;
    for _ in 0..3000 {
        let Some(found) = coord.get(std::slice::from_ref(&key)).await.unwrap().pop() else {
            if last.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        if last != Some(found.version) {
            last = Some(found.version);
            let value: Value = serde_json::from_slice(&found.value).unwrap();
            versions.push(value["checkpoint"].clone());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let written = versions.iter().filter(|v| !v.is_null()).count();
    assert!(
        written >= 2,
        "the checkpoints were not recorded: {versions:?}"
    );
    let most = 1 + (1000 / crate::task::progress::CHECKPOINT_EVERY.as_millis()) as usize;
    assert!(
        written <= most,
        "{written} checkpoint writes in a second (at most {most}): {versions:?}"
    );
    leading.shut_down().await;
}

/// Checkpoints once (the next read of the coordinator failing), then, after a while, fails
/// its first run if it is told to (or succeeds); records each run's attempt.
struct FailsOnce(Arc<Mutex<Vec<u32>>>, Arc<super::counting::Counting>, bool);

impl Handler for FailsOnce {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            self.0.lock().unwrap().push(ctx.attempt);
            if ctx.attempt > 1 {
                return Ok(());
            }
            self.1.fail_gets.store(1, Ordering::SeqCst);
            ctx.progress.checkpoint(json!({"n": 1}));
            tokio::time::sleep(Duration::from_secs(2)).await;
            match self.2 {
                true => Err("the copy broke off".into()),
                false => Ok(()),
            }
        })
    }
}

/// A report write applied whose answer was lost, and whose read to find out failed too:
/// the run's claim has moved without the run knowing. Once the run ends the leader looks
/// again, finds its own write there, and settles at that version: the failed run's retry is
/// counted (the rerun is attempt 2), and a successful run is recorded done, not put back to
/// run again as if a producer had rewritten the task.
#[tokio::test(start_paused = true)]
async fn a_report_write_whose_answer_was_lost_still_lets_the_run_settle() {
    assert_eq!(lost_report_answer_then(true).await, [1, 2]);
    assert_eq!(lost_report_answer_then(false).await, [1]);
}

/// The attempts of the runs of one task whose first run's report answer was lost (and
/// the read after it failed), its first run failing or not.
async fn lost_report_answer_then(fail: bool) -> Vec<u32> {
    let memory = Arc::new(MemoryCoordinator::default());
    let counting = Arc::new(super::counting::Counting::new(memory.clone()));
    counting.pass_claims.store(1, Ordering::SeqCst);
    counting.lose_claim_answers.store(1, Ordering::SeqCst);
    let coord: Arc<dyn Coordinator> = counting.clone();
    let mut settings = super::default_settings();
    settings.queue.backoff_base = Duration::from_millis(10);
    let key = format!("{}t1", settings.queue.prefix);
    let task = json!({"taskId": "copy", "taskTime": 1, "taskType": "Copy"});
    memory.put(&key, task.to_string().as_bytes()).unwrap();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Copy", FailsOnce(attempts.clone(), counting.clone(), fail));
    let metrics = Arc::new(Metrics::new(["Copy"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    let prefix = settings.queue.prefix.clone();
    for _ in 0..100 {
        let (tasks, _) = coord
            .list(&prefix, crate::coord::Version(0), Duration::ZERO)
            .await
            .unwrap();
        if tasks.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let left = |n: &AtomicUsize| n.load(Ordering::SeqCst);
    assert_eq!(left(&counting.lose_claim_answers), 0, "no answer was lost");
    assert_eq!(left(&counting.fail_gets), 0, "no read failed");
    leading.shut_down().await;
    let runs = attempts.lock().unwrap().clone();
    runs
}
