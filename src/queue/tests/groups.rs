//! Concurrency groups (`queue.concurrency` above 1) driven against the in-memory
//! coordinator on a paused clock: runs overlap but never within a group, a group keeps its
//! order through a retry, waits for a previous leader's run, and runs stop when leadership
//! is lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{default_settings, lead_in_background, lone_leader, queue_on, until, LeadEnd, Leading};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::Coordinator;
use crate::handler::{Handler, HandlerFuture, Registry, TaskContext};
use crate::observe::Metrics;

/// A producer's write of task `id` at `key`, of `group` if given, for the `Work` handler.
fn put_grouped(memory: &MemoryCoordinator, key: &str, id: &str, time: u64, group: Option<&str>) {
    let mut value = json!({"taskId": id, "taskTime": time, "taskType": "Work"});
    if let Some(group) = group {
        value["taskGroup"] = json!(group);
    }
    memory.put(key, value.to_string().as_bytes()).unwrap();
}

/// Records each run's start and end on the (paused) clock, taking 100 ms a run; `c1`
/// fails its first attempt.
struct Timed(Arc<Mutex<Vec<TimedRun>>>);

/// Task id, attempt, start and end of one run.
type TimedRun = (String, u32, tokio::time::Instant, tokio::time::Instant);

impl Handler for Timed {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let started = tokio::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.0.lock().unwrap().push((
                ctx.task_id.clone(),
                ctx.attempt,
                started,
                tokio::time::Instant::now(),
            ));
            if ctx.task_id == "c1" && ctx.attempt == 1 {
                return Err("the database was busy".into());
            }
            Ok(())
        })
    }
}

/// With `concurrency = 3`, runs overlap, but never two of one `taskGroup` (tasks without
/// one form a group), each group runs in taskTime order, and a group whose task failed
/// waits for its retry before its next task.
#[tokio::test(start_paused = true)]
async fn concurrency_groups_overlap_runs_but_never_within_a_group() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = default_settings();
    settings.queue.concurrency = 3;
    // Retries fall due on the wall clock, which the paused one does not move.
    settings.queue.backoff_base = Duration::from_millis(1);
    let prefix = settings.queue.prefix.clone();
    let tasks: [(&str, u64, Option<&str>); 9] = [
        ("a1", 1, Some("a")),
        ("b1", 2, Some("b")),
        ("a2", 3, Some("a")),
        ("c1", 4, Some("c")),
        ("a3", 5, Some("a")),
        ("c2", 6, Some("c")),
        ("n1", 7, None),
        ("b2", 8, Some("b")),
        ("n2", 9, None),
    ];
    // Key order is the reverse of taskTime order.
    for (n, (id, time, group)) in tasks.iter().enumerate() {
        put_grouped(&memory, &format!("{prefix}t{}", 9 - n), id, *time, *group);
    }
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Work", Timed(runs.clone()));
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics.clone()).await;
    until("every task ran (c1 twice)", || {
        runs.lock().unwrap().len() == 10
    })
    .await;
    for _ in 0..1000 {
        if coord.keys(&prefix).await.unwrap().0.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(coord.keys(&prefix).await.unwrap().0, Vec::<String>::new());
    leading.shut_down().await;

    let runs = runs.lock().unwrap().clone();
    let group_of = |id: &str| {
        tasks
            .iter()
            .find(|(task, ..)| *task == id)
            .map(|(_, _, group)| group.unwrap_or(""))
            .unwrap()
    };
    let mut by_start = runs.clone();
    by_start.sort_by_key(|(_, _, started, _)| *started);
    for group in ["a", "b", "c", ""] {
        let order: Vec<String> = by_start
            .iter()
            .filter(|(id, ..)| group_of(id) == group)
            .map(|(id, attempt, ..)| format!("{id}#{attempt}"))
            .collect();
        let expected: Vec<String> = match group {
            "a" => vec!["a1#1", "a2#1", "a3#1"],
            "b" => vec!["b1#1", "b2#1"],
            "c" => vec!["c1#1", "c1#2", "c2#1"],
            _ => vec!["n1#1", "n2#1"],
        }
        .into_iter()
        .map(String::from)
        .collect();
        assert_eq!(
            order, expected,
            "group {group:?} in taskTime order, retry first"
        );
    }
    let mut most = 0;
    for (id, _, started, ended) in &runs {
        for (other, _, other_started, other_ended) in &runs {
            let overlap = other_started < ended && started < other_ended;
            if std::ptr::eq(id, other) || !overlap {
                continue;
            }
            assert_ne!(group_of(id), group_of(other), "{id} and {other} overlapped");
        }
        let at_once = runs
            .iter()
            .filter(|(_, _, s, e)| s <= started && started < e)
            .count();
        most = most.max(at_once);
    }
    assert_eq!(most, 3, "up to concurrency runs at once, no more");
}

/// A group whose task a previous leader's lease still holds is busy for the new leader:
/// its other tasks wait until that lease ends and the task is requeued and run, while
/// other groups go on.
#[tokio::test(start_paused = true)]
async fn a_group_held_by_a_previous_leaders_lease_waits_for_it() {
    use crate::coord::{TaskOp, Written};
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = default_settings();
    settings.queue.concurrency = 4;
    let prefix = settings.queue.prefix.clone();
    let put = |name: &str, time: u64, group: &str| {
        put_grouped(&memory, &format!("{prefix}{name}"), name, time, Some(group));
    };
    put("a1", 1, "a");
    put("a2", 2, "a");
    put("b1", 3, "b");
    let metrics = Arc::new(Metrics::new(["Work"]));
    // A first leader claims a1 and gives leadership up, its lease still alive.
    let (old, _old_lease, old_stop) = lone_leader(&coord, &metrics).await;
    let (listed, _) = coord
        .list(&prefix, crate::coord::Version(0), Duration::ZERO)
        .await
        .unwrap();
    let a1 = listed.iter().find(|t| t.key.ends_with("a1")).unwrap();
    let claim = [TaskOp::Claim {
        key: a1.key.clone(),
        version: a1.version,
        value: a1.value.clone(),
    }];
    assert!(matches!(
        coord.write(&old, &claim).await.unwrap(),
        Written::Done { .. }
    ));
    coord.resign(&old.lease).await.unwrap();

    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Work", Timed(runs.clone()));
    let leading = Leading::start(&coord, &settings, registry, metrics.clone()).await;
    let ran = |runs: &Arc<Mutex<Vec<TimedRun>>>| -> Vec<String> {
        runs.lock().unwrap().iter().map(|r| r.0.clone()).collect()
    };
    until("b1 ran", || ran(&runs) == ["b1"]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(ran(&runs), ["b1"], "a2 waits while a1 is held");
    // The previous leader's lease ends: a1 is requeued and runs, then a2.
    old_stop.cancel();
    memory.expire_lease(&old.lease).unwrap();
    until("a1 and a2 ran", || ran(&runs).len() == 3).await;
    assert_eq!(ran(&runs), ["b1", "a1", "a2"]);
    leading.shut_down().await;
}

/// Runs for a minute unless cancelled; records how it ended.
struct Long(Arc<Mutex<Vec<String>>>);

impl Handler for Long {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            tokio::select! {
                _ = ctx.cancel.cancelled() => {
                    self.0.lock().unwrap().push(format!("{} cancelled", ctx.task_id));
                    Err("cancelled".into())
                }
                _ = tokio::time::sleep(Duration::from_secs(60)) => {
                    self.0.lock().unwrap().push(format!("{} done", ctx.task_id));
                    Ok(())
                }
            }
        })
    }
}

/// With runs in progress, a claim that finds leadership gone stops them at once, as a
/// lost lease would, instead of letting them finish under a lost leadership.
#[tokio::test(start_paused = true)]
async fn losing_leadership_mid_runs_stops_the_other_runs() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = default_settings();
    settings.queue.concurrency = 4;
    let prefix = settings.queue.prefix.clone();
    let put = |name: &str, time: u64, group: &str| {
        put_grouped(&memory, &format!("{prefix}{name}"), name, time, Some(group));
    };
    put("long", 1, "a");
    let ended = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Work", Long(ended.clone()));
    let metrics = Arc::new(Metrics::new(["Work"]));
    let (leadership, lease, stop) = lone_leader(&coord, &metrics).await;
    let queue = queue_on(&coord, &settings, registry, metrics.clone());
    let shutdown = CancellationToken::new();
    let began = tokio::time::Instant::now();
    let leading = lead_in_background(queue, &leadership, &lease, &shutdown);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Leadership goes behind the leader's back; its next claim finds out.
    coord.resign(&leadership.lease).await.unwrap();
    put("next", 2, "b");
    let end = leading.await.unwrap();
    assert!(matches!(end, LeadEnd::StepDown(_)), "{end:?}");
    assert_eq!(*ended.lock().unwrap(), ["long cancelled"]);
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "stopped at once, not after the run's minute: {:?}",
        began.elapsed()
    );
    stop.cancel();
}

/// With `concurrency = 4`, a type capped at 1 (`[handlers.T] concurrency`) never runs two
/// at once, while the other type's tasks, later in taskTime, run beside it: a type at its
/// cap holds back no other.
#[tokio::test(start_paused = true)]
async fn a_capped_type_runs_within_its_cap_and_holds_back_no_other() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = default_settings();
    settings.queue.concurrency = 4;
    let prefix = settings.queue.prefix.clone();
    for n in 0..6u64 {
        let (kind, id) = if n < 3 {
            ("Index", format!("i{n}"))
        } else {
            ("Work", format!("w{n}"))
        };
        let value = json!({"taskId": id, "taskTime": n, "taskType": kind, "taskGroup": id});
        memory
            .put(&format!("{prefix}{id}"), value.to_string().as_bytes())
            .unwrap();
    }
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Index", Timed(runs.clone()));
    registry.register("Work", Timed(runs.clone()));
    let one_at_a_time = crate::handler::TypePolicy {
        concurrency: Some(1),
        ..Default::default()
    };
    registry.set_policy("Index", one_at_a_time);
    let metrics = Arc::new(Metrics::new(["Index", "Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    until("six runs", || runs.lock().unwrap().len() == 6).await;
    let runs = runs.lock().unwrap().clone();
    let of = |prefix: &str| -> Vec<&TimedRun> {
        runs.iter()
            .filter(|run| run.0.starts_with(prefix))
            .collect()
    };
    let overlap = |a: &TimedRun, b: &TimedRun| a.2 < b.3 && b.2 < a.3;
    let index = of("i");
    for (n, a) in index.iter().enumerate() {
        for b in &index[n + 1..] {
            assert!(!overlap(a, b), "two Index runs at once: {a:?} {b:?}");
        }
    }
    let beside = of("w")
        .iter()
        .filter(|work| overlap(work, index[0]))
        .count();
    assert_eq!(
        beside, 3,
        "the Work tasks ran beside the first Index run: {runs:?}"
    );
    leading.shut_down().await;
}
