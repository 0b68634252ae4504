//! A split queue's leader (`Sharding`) driven against the in-memory coordinator on a
//! paused clock: it claims only its shard's tasks, leaves the others untouched, and counts
//! another shard's run of a capped type against the cap; asked to hand its shard over, its
//! term ends as a rotation does, with nothing held.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{default_settings, lead_in_background, lone_leader, queue_on, until, LeadEnd};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::{Coordinator, Edit, Edited, TaskOp, Version, Written};
use crate::observe::Metrics;
use crate::queue::Sharding;
use crate::task::shard::{shard_of, Shard};

/// Shard 0 of 2 runs exactly the tasks whose group hashes to it, and leaves the other
/// shard's unclaimed.
#[tokio::test(start_paused = true)]
async fn a_shard_leader_claims_only_its_shards_tasks_and_hands_over_on_request() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = default_settings();
    settings.queue.concurrency = 4;
    let prefix = settings.queue.prefix.clone();
    let mut mine = Vec::new();
    for n in 0..20u64 {
        let (key, group) = (format!("{prefix}t{n}"), format!("g{}", n % 10));
        let value = json!({"taskId": format!("t{n}"), "taskTime": n, "taskType": "Work", "taskGroup": group});
        memory.put(&key, value.to_string().as_bytes()).unwrap();
        if shard_of(&key, &group, 2) == 0 {
            mine.push(format!("t{n}"));
        }
    }
    assert!(
        !mine.is_empty() && mine.len() < 20,
        "both shards have tasks"
    );
    let ran = Arc::new(Mutex::new(Vec::new()));
    let registry = super::recording(&ran, &memory);
    let metrics = Arc::new(Metrics::new(["Work"]));
    let (leadership, lease, stop) = lone_leader(&coord, &metrics).await;
    let (asked, handover) = tokio::sync::watch::channel(false);
    let mut queue = queue_on(&coord, &settings, registry, metrics);
    queue.sharding = Sharding {
        shard: Some(Shard { index: 0, count: 2 }),
        handover: Some(handover),
        slots: None,
    };
    let shutdown = CancellationToken::new();
    let term = lead_in_background(queue, &leadership, &lease, &shutdown);
    until("shard 0's tasks ran", || {
        ran.lock().unwrap().len() == mine.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut done = ran.lock().unwrap().clone();
    done.sort();
    mine.sort();
    assert_eq!(done, mine, "only shard 0's tasks ran");
    let (left, _) = coord
        .list(&prefix, Version(0), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        left.len(),
        20 - mine.len(),
        "the other shard's tasks are there"
    );
    assert!(
        left.iter().all(|task| task.holder.is_none()),
        "and unclaimed"
    );

    asked.send_replace(true);
    let end = tokio::time::timeout(Duration::from_secs(10), term)
        .await
        .expect("the term ended when asked")
        .unwrap();
    assert_eq!(end, LeadEnd::Rotate);
    stop.cancel();
}

/// A type capped at one run waits while another shard's leader runs one of its tasks.
#[tokio::test(start_paused = true)]
async fn another_shards_run_counts_against_a_types_cap() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = default_settings();
    settings.queue.concurrency = 4;
    let prefix = settings.queue.prefix.clone();
    // One task in each shard, both of the capped type.
    let in_shard = |want: u32| {
        (0..100)
            .map(|n| format!("g{n}"))
            .find(|group| shard_of("k", group, 2) == want)
            .unwrap()
    };
    let (mine, theirs) = (in_shard(0), in_shard(1));
    for (name, group) in [("ours", &mine), ("theirs", &theirs)] {
        let value = json!({"taskId": name, "taskTime": 1, "taskType": "Work", "taskGroup": group});
        memory
            .put(&format!("{prefix}{name}"), value.to_string().as_bytes())
            .unwrap();
    }
    let metrics = Arc::new(Metrics::new(["Work"]));
    // The other shard's leader claims its task and keeps it running.
    let (other, _other_lease, other_stop) = lone_leader(&coord, &metrics).await;
    let listed = coord.get(&[format!("{prefix}theirs")]).await.unwrap();
    let claim = [TaskOp::Claim {
        key: listed[0].key.clone(),
        version: listed[0].version,
        value: listed[0].value.clone(),
    }];
    assert!(matches!(
        coord.write(&other, &claim).await.unwrap(),
        Written::Done { .. }
    ));
    coord.resign(&other.lease).await.unwrap();

    let ran = Arc::new(Mutex::new(Vec::new()));
    let mut registry = super::recording(&ran, &memory);
    let mut policy = registry.policy("Work");
    policy.concurrency = Some(1);
    registry.set_policy("Work", policy);
    let (leadership, lease, stop) = lone_leader(&coord, &metrics).await;
    let mut queue = queue_on(&coord, &settings, registry, metrics);
    queue.sharding = Sharding {
        shard: Some(Shard { index: 0, count: 2 }),
        handover: None,
        slots: None,
    };
    let shutdown = CancellationToken::new();
    let term = lead_in_background(queue, &leadership, &lease, &shutdown);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        ran.lock().unwrap().is_empty(),
        "the cap is taken by the other shard's run"
    );
    // The other shard's run ends (its task deleted as its completion would): ours starts.
    let held = coord.get(&[format!("{prefix}theirs")]).await.unwrap();
    let delete = [Edit::Delete {
        key: held[0].key.clone(),
        version: held[0].version,
    }];
    assert_eq!(coord.edit(&delete).await.unwrap(), Edited::Done);
    until("ours ran", || ran.lock().unwrap().len() == 1).await;
    shutdown.cancel();
    let _ = term.await;
    other_stop.cancel();
    stop.cancel();
}
