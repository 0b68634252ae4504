//! A backlog whose values are more than a listing holds (`VALUES_HELD`): the tasks past it
//! are held without their values and read again, a window at a time, as the claims reach
//! them; every task runs once, in `taskTime` order, and a read that fails lists again.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::counting::Counting;
use super::{default_settings, lead_in_background, lone_leader, queue_on, until};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::Coordinator;
use crate::observe::Metrics;
use crate::queue::sort::VALUES_HELD;

/// Tasks whose values add up to more than VALUES_HELD, their keys in the reverse of their
/// `taskTime` order (so the listing's first values, the ones held, are the last to run);
/// `fail_gets` reads of values fail first. Answers the task ids in the order they ran and
/// the reads of values made.
async fn drain_beyond_the_values_held(fail_gets: usize) -> (Vec<String>, usize, usize) {
    let memory = Arc::new(MemoryCoordinator::default());
    let counting = Arc::new(Counting::new(memory.clone()));
    counting.fail_gets.store(fail_gets, Ordering::SeqCst);
    let coord: Arc<dyn Coordinator> = counting.clone();
    let settings = default_settings();
    let prefix = settings.queue.prefix.clone();
    let padding = "x".repeat(256 << 10);
    let count = VALUES_HELD / padding.len() + 24;
    for n in 0..count {
        let value = json!({
            "taskId": format!("t{n:03}"),
            "taskTime": n + 1,
            "taskType": "Work",
            "taskPara": {"padding": padding},
        });
        let key = format!("{prefix}k{:03}", count - n);
        memory.put(&key, value.to_string().as_bytes()).unwrap();
    }
    let ran = Arc::new(Mutex::new(Vec::new()));
    let registry = super::recording(&ran, &memory);
    let metrics = Arc::new(Metrics::new(["Work"]));
    let (leadership, lease, stop) = lone_leader(&coord, &metrics).await;
    let queue = queue_on(&coord, &settings, registry, metrics);
    let shutdown = CancellationToken::new();
    let leading = lead_in_background(queue, &leadership, &lease, &shutdown);
    until("every task ran", || ran.lock().unwrap().len() >= count).await;
    shutdown.cancel();
    leading.await.unwrap();
    stop.cancel();
    let ran = ran.lock().unwrap().clone();
    (
        ran,
        counting.gets.load(Ordering::SeqCst),
        counting.got_keys.load(Ordering::SeqCst),
    )
}

fn in_time_order(count: usize) -> Vec<String> {
    (0..count).map(|n| format!("t{n:03}")).collect()
}

/// The tasks past the values held are read again as the claims reach them, a window at a
/// time: every task runs once, in `taskTime` order.
#[tokio::test(start_paused = true)]
async fn tasks_held_without_their_values_are_read_again_and_run_once_in_order() {
    let (ran, gets, got) = drain_beyond_the_values_held(0).await;
    assert_eq!(ran, in_time_order(ran.len()));
    assert!(gets >= 1, "no value was read again");
    assert!(
        got >= 24,
        "{got} values read again, fewer than the tasks past those held"
    );
}

/// A read of values that fails lists the queue again: nothing is lost or run twice.
#[tokio::test(start_paused = true)]
async fn a_failed_read_of_values_lists_again_and_loses_nothing() {
    let (ran, gets, _) = drain_beyond_the_values_held(2).await;
    assert_eq!(ran, in_time_order(ran.len()));
    assert!(
        gets >= 3,
        "the failed reads were not followed by one that succeeded"
    );
}
