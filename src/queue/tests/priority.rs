//! Priority on the in-memory coordinator and the paused clock: a type's default priority
//! puts its tasks before earlier ones of other types, a task's own `taskPriority` wins
//! over its type's, and within one priority the order is `taskTime`'s.

use std::sync::{Arc, Mutex};

use serde_json::json;

use super::leading::Leading;
use super::until;
use crate::coord::memory::MemoryCoordinator;
use crate::coord::Coordinator;
use crate::handler::{Handler, HandlerFuture, Registry, TaskContext, TypePolicy};
use crate::observe::Metrics;

/// Records the ids it runs, in order.
struct Journal(Arc<Mutex<Vec<String>>>);

impl Handler for Journal {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            self.0.lock().unwrap().push(ctx.task_id.clone());
            Ok(())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn priority_goes_first_then_task_time() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let settings = super::default_settings();
    let prefix = settings.queue.prefix.clone();
    let tasks = [
        json!({"taskId": "w1", "taskTime": 1, "taskType": "Work"}),
        json!({"taskId": "w2", "taskTime": 2, "taskType": "Work"}),
        json!({"taskId": "never-first", "taskTime": 0, "taskType": "Work", "taskPriority": -1}),
        json!({"taskId": "urgent", "taskTime": 100, "taskType": "Urgent"}),
        json!({"taskId": "calm", "taskTime": 50, "taskType": "Urgent", "taskPriority": "0"}),
        json!({"taskId": "first", "taskTime": 200, "taskType": "Work", "taskPriority": 9}),
    ];
    for (n, task) in tasks.iter().enumerate() {
        let key = format!("{prefix}t{n}");
        memory.put(&key, task.to_string().as_bytes()).unwrap();
    }
    let ran = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Work", Journal(ran.clone()));
    registry.register("Urgent", Journal(ran.clone()));
    let urgent = TypePolicy {
        priority: Some(5),
        ..TypePolicy::default()
    };
    registry.set_policy("Urgent", urgent);
    let metrics = Arc::new(Metrics::new(["Work", "Urgent"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    until("every task ran", || {
        ran.lock().unwrap().len() == tasks.len()
    })
    .await;
    assert_eq!(
        *ran.lock().unwrap(),
        ["first", "urgent", "w1", "w2", "calm", "never-first"]
    );
    leading.shut_down().await;
}
