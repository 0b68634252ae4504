//! Retry policy per task type, on the in-memory coordinator and the paused clock: a type
//! whose `max_attempts` is 1 is dead-lettered at its first failure while another type's
//! task is retried up to the queue's `max_attempts`, and a task's own `maxAttempts` beats
//! its type's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use super::leading::Leading;
use super::until;
use crate::coord::memory::MemoryCoordinator;
use crate::coord::{Coordinator, Version};
use crate::handler::{Handler, HandlerFuture, Registry, TaskContext, TypePolicy};
use crate::observe::Metrics;

/// Fails every run, recording `id#attempt`.
struct AlwaysFails(Arc<Mutex<Vec<String>>>);

impl Handler for AlwaysFails {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let run = format!("{}#{}", ctx.task_id, ctx.attempt);
            self.0.lock().unwrap().push(run);
            Err("the database refused the connection".into())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn each_type_and_task_gets_its_own_number_of_attempts() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = super::default_settings();
    settings.queue.max_attempts = 3;
    settings.queue.backoff_base = Duration::from_millis(10);
    let (prefix, dead_prefix) = (
        settings.queue.prefix.clone(),
        settings.queue.dead_prefix.clone(),
    );
    let put = |key: &str, value: serde_json::Value| {
        memory
            .put(&format!("{prefix}{key}"), value.to_string().as_bytes())
            .unwrap()
    };
    put(
        "t1",
        json!({"taskId": "drop", "taskTime": 1, "taskType": "DropTableSpace"}),
    );
    put(
        "t2",
        json!({"taskId": "index", "taskTime": 2, "taskType": "CreateIndex"}),
    );
    put(
        "t3",
        json!({"taskId": "drop-twice", "taskTime": 3, "taskType": "DropTableSpace", "maxAttempts": "2"}),
    );
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("DropTableSpace", AlwaysFails(runs.clone()));
    registry.register("CreateIndex", AlwaysFails(runs.clone()));
    let never_again = TypePolicy {
        max_attempts: Some(1),
        ..TypePolicy::default()
    };
    registry.set_policy("DropTableSpace", never_again);
    let metrics = Arc::new(Metrics::new(["DropTableSpace", "CreateIndex"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    until("six runs", || runs.lock().unwrap().len() >= 6).await;
    for _ in 0..1000 {
        if coord.keys(&prefix).await.unwrap().0.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(coord.keys(&prefix).await.unwrap().0, Vec::<String>::new());
    let mut ran = runs.lock().unwrap().clone();
    ran.sort();
    assert_eq!(
        ran,
        [
            "drop#1",
            "drop-twice#1",
            "drop-twice#2",
            "index#1",
            "index#2",
            "index#3"
        ]
    );
    let (dead, _) = coord
        .list(&dead_prefix, Version(0), Duration::ZERO)
        .await
        .unwrap();
    let mut attempts: Vec<(String, u64)> = dead
        .iter()
        .map(|letter| {
            let letter: serde_json::Value = serde_json::from_slice(&letter.value).unwrap();
            let id = letter["taskId"].as_str().unwrap().to_string();
            (id, letter["attempts"].as_u64().unwrap())
        })
        .collect();
    attempts.sort();
    assert_eq!(
        attempts,
        [
            ("drop".into(), 1),
            ("drop-twice".into(), 2),
            ("index".into(), 3)
        ]
    );
    leading.shut_down().await;
}
