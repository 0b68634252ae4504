//! A Rust handler's reports on the in-memory coordinator and the paused clock: its progress
//! and checkpoint are recorded in the task while it runs, the failed run's retry keeps the
//! checkpoint, and the rerun gets it from `TaskContext::checkpoint`.

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
