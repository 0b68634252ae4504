//! A task type paused on its own (`leaderq pause --type T`), on the in-memory coordinator
//! and the paused clock: its tasks are set aside while the other types drain, and an idle
//! leader notices the resume without a change to the queue.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{clear, default_settings, lead_in_background, lone_leader, queue_on, until, SlowOne};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::Coordinator;
use crate::handler::Registry;
use crate::observe::Metrics;
use crate::queue::LeadEnd;

/// A paused type starts nothing while the other type drains, its tasks set aside (the
/// later ones of the other type are not held behind them); resumed, they run, noticed
/// by the idle leader without a change to the queue. A type paused while the leader works
/// through a listing is claimed no more from the next look on.
#[tokio::test(start_paused = true)]
async fn a_paused_type_starts_nothing_while_others_drain_until_resumed() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let settings = default_settings();
    let prefix = settings.queue.prefix.clone();
    let flag = crate::queue::paused_type_key(&prefix, "Held").unwrap();
    memory.put(&flag, b"{}").unwrap();
    let put = |key: &str, id: &str, time: u64, kind: &str| {
        let value = json!({"taskId": id, "taskTime": time, "taskType": kind});
        memory
            .put(&format!("{prefix}{key}"), value.to_string().as_bytes())
            .unwrap()
    };
    put("t1", "held", 1, "Held");
    put("t2", "free", 2, "Work");
    let ran = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Work", SlowOne(ran.clone()));
    registry.register("Held", SlowOne(ran.clone()));
    let metrics = Arc::new(Metrics::new(["Work", "Held"]));
    let (leadership, lease, renewals) = lone_leader(&coord, &metrics).await;
    let mut queue = queue_on(&coord, &settings, registry, metrics);
    // A listing waits a minute for a change: only the leader's own look at the paused
    // types notices a resume sooner.
    queue.wait = Duration::from_secs(60);
    let shutdown = CancellationToken::new();
    let leading = lead_in_background(queue, &leadership, &lease, &shutdown);
    until("the free task ran", || ran.lock().unwrap().len() == 1).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(*ran.lock().unwrap(), ["free"], "a paused type ran");
    clear(&coord, &flag).await;
    until("the held task ran once resumed", || {
        ran.lock().unwrap().len() == 2
    })
    .await;
    assert_eq!(*ran.lock().unwrap(), ["free", "held"]);
    shutdown.cancel();
    assert_eq!(leading.await.unwrap(), LeadEnd::Shutdown);
    renewals.cancel();
}
