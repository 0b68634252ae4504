//! The leader's loop driven against the in-memory coordinator with tokio's paused clock:
//! its decisions (claim order, relisting after a conflict, stepping down when leadership
//! is gone) tested without processes, HTTP or sleeps.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{LeadEnd, LeaseRules, Queue};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::{Campaign, Coordinator, HolderRecord, LeaseSpec};
use crate::handler::{Handler, HandlerFuture, Registry, TaskContext};
use crate::leader::{Election, Lease};
use crate::observe::Metrics;
use crate::task::history::HistoryRecord;

mod ahead;
mod checkpoints;
mod counting;
mod fill;
mod groups;
mod leading;
mod lost;
mod output;
mod paused;
mod priority;
mod rates;
mod retries;
mod scheduled;
mod shards;
mod stopped;
mod term;
mod ticker;

use self::leading::Leading;

const TTL: Duration = Duration::from_secs(10);

/// Records the task ids it runs; running `rewrite_on` rewrites another task meanwhile, as
/// a producer would.
struct Recorder {
    ran: Arc<Mutex<Vec<String>>>,
    coord: Arc<MemoryCoordinator>,
    rewrite_on: &'static str,
    rewrite: (String, Vec<u8>),
}

impl Handler for Recorder {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            if ctx.task_id == self.rewrite_on {
                let (key, value) = &self.rewrite;
                self.coord
                    .put(key, value)
                    .expect("the coordinator is available");
            }
            self.ran.lock().unwrap().push(ctx.task_id.clone());
            Ok(())
        })
    }
}

/// A registry whose `Work` handler records the ids it runs in `ran`, rewriting nothing.
fn recording(ran: &Arc<Mutex<Vec<String>>>, memory: &Arc<MemoryCoordinator>) -> Registry {
    let mut registry = Registry::default();
    registry.register(
        "Work",
        Recorder {
            ran: ran.clone(),
            coord: memory.clone(),
            rewrite_on: "",
            rewrite: (String::new(), Vec::new()),
        },
    );
    registry
}

fn task(id: &str, time: u64) -> Vec<u8> {
    json!({"taskId": id, "taskTime": time, "taskType": "Work"})
        .to_string()
        .into_bytes()
}

/// Deletes `key` (a pause flag) as an operator's `resume` does: at the version read.
async fn clear(coord: &Arc<dyn Coordinator>, key: &str) {
    let found = coord.get(&[key.to_string()]).await.unwrap();
    let delete = crate::coord::Edit::Delete {
        key: key.to_string(),
        version: found[0].version,
    };
    coord.edit(&[delete]).await.unwrap();
}

/// Waits, on the paused clock, until `done` holds; fails after a bounded while.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not reached");
}

/// A leader claims in taskTime order (not key order); a task a producer rewrote after it
/// was listed makes its claim conflict, and the leader reads that task again (not the
/// whole queue) and runs the new version once; when leadership is gone, the next claim answers NotLeader and the leader
/// steps down without running the task.
#[tokio::test(start_paused = true)]
async fn lead_claims_in_order_relists_on_conflict_and_steps_down_when_not_leader() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let settings = default_settings();
    let prefix = settings.queue.prefix.clone();
    let key = |name: &str| format!("{prefix}{name}");

    // Key order is the reverse of taskTime order.
    memory.put(&key("t1"), &task("third", 3)).unwrap();
    memory.put(&key("t2"), &task("second", 2)).unwrap();
    memory.put(&key("t3"), &task("first", 1)).unwrap();

    let ran = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register(
        "Work",
        Recorder {
            ran: ran.clone(),
            coord: memory.clone(),
            rewrite_on: "first",
            rewrite: (key("t1"), task("third-rewritten", 3)),
        },
    );
    let metrics = Arc::new(Metrics::new(["Work"]));
    let (leadership, lease, stop) = lone_leader(&coord, &metrics).await;
    let queue = queue_on(&coord, &settings, registry, metrics.clone());
    let shutdown = CancellationToken::new();
    let leading = lead_in_background(queue, &leadership, &lease, &shutdown);

    until("the three tasks ran", || ran.lock().unwrap().len() == 3).await;
    assert_eq!(
        *ran.lock().unwrap(),
        ["first", "second", "third-rewritten"],
        "claimed in taskTime order, the rewritten task in its new version"
    );
    assert_eq!(
        metrics.claim_conflicts.get(),
        1,
        "the stale claim conflicted"
    );
    for _ in 0..1000 {
        if coord.keys(&prefix).await.unwrap().0.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(coord.keys(&prefix).await.unwrap().0, Vec::<String>::new());

    // Leadership is given up behind the leader's back: its next claim is not applied.
    coord.resign(&leadership.lease).await.unwrap();
    memory.put(&key("t4"), &task("late", 4)).unwrap();
    let end = tokio::time::timeout(Duration::from_secs(30), leading)
        .await
        .expect("the leader stepped down in time")
        .unwrap();
    assert!(
        matches!(&end, LeadEnd::StepDown(reason) if reason.contains("lost leadership")),
        "{end:?}"
    );
    assert_eq!(
        ran.lock().unwrap().len(),
        3,
        "no run after leadership was lost"
    );
    assert_eq!(coord.keys(&prefix).await.unwrap().0, [key("t4")]);
    stop.cancel();
}

/// Rotate mode: after `rotate_after_tasks` runs the leader ends its term with
/// `LeadEnd::Rotate`, having run exactly that many tasks in order, recorded them, and put
/// back what it claimed ahead: the rest are still queued, held by no lease. With a time
/// limit, an idle leader's term ends on time, without a listing to wait out.
#[tokio::test(start_paused = true)]
async fn rotate_mode_ends_the_term_after_its_runs_with_nothing_held() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let settings = default_settings();
    let prefix = settings.queue.prefix.clone();
    for n in 0..10u64 {
        memory
            .put(&format!("{prefix}t{n}"), &task(&format!("n{n}"), 100 - n))
            .unwrap();
    }
    let ran = Arc::new(Mutex::new(Vec::new()));
    let registry = recording(&ran, &memory);
    let metrics = Arc::new(Metrics::new(["Work"]));
    let (leadership, lease, stop) = lone_leader(&coord, &metrics).await;
    let mut queue = Queue {
        coord: coord.clone(),
        settings: settings.queue.clone(),
        registry,
        node_id: "n1".into(),
        wait: Duration::from_secs(30),
        metrics: metrics.clone(),
        rotation: Some(crate::leader::rotation::Rotation {
            after: None,
            after_tasks: Some(4),
        }),
        term: Default::default(),
        lease_rules: LeaseRules::from_settings(&settings),
        sharding: Default::default(),
    };
    let shutdown = CancellationToken::new();
    let end = tokio::time::timeout(
        Duration::from_secs(30),
        queue.lead(&leadership, &lease, &shutdown),
    )
    .await
    .expect("the term ended");
    assert_eq!(end, LeadEnd::Rotate);
    assert_eq!(*ran.lock().unwrap(), ["n9", "n8", "n7", "n6"]);
    let (left, _) = coord
        .list(&prefix, crate::coord::Version(0), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(left.len(), 6, "the four runs were recorded, nothing else");
    assert!(
        left.iter().all(|task| task.holder.is_none()),
        "claimed-ahead tasks were put back: {left:?}"
    );

    // A time limit ends an idle term on time, though the listing waits 30 s.
    for task in &left {
        coord
            .edit(&[crate::coord::Edit::Delete {
                key: task.key.clone(),
                version: task.version,
            }])
            .await
            .unwrap();
    }
    queue.rotation = Some(crate::leader::rotation::Rotation {
        after: Some(Duration::from_secs(5)),
        after_tasks: None,
    });
    let began = tokio::time::Instant::now();
    let end = tokio::time::timeout(
        Duration::from_secs(20),
        queue.lead(&leadership, &lease, &shutdown),
    )
    .await
    .expect("the idle term ended before its listing's wait");
    assert_eq!(end, LeadEnd::Rotate);
    assert!(began.elapsed() >= Duration::from_secs(5) && began.elapsed() < Duration::from_secs(6));
    stop.cancel();
}

/// The compiled-in settings, as a replica without a settings file has them.
fn default_settings() -> crate::config::Settings {
    crate::config::Settings::load(None, crate::config::Env::new())
        .expect("the default settings load")
}

/// `queue` leading in a task of its own until it ends; its answer is the task's.
fn lead_in_background(
    queue: Queue,
    leadership: &crate::coord::Leadership,
    lease: &Arc<Lease>,
    shutdown: &CancellationToken,
) -> tokio::task::JoinHandle<LeadEnd> {
    let (leadership, lease, shutdown) = (leadership.clone(), lease.clone(), shutdown.clone());
    tokio::spawn(async move { queue.lead(&leadership, &lease, &shutdown).await })
}

/// The leader's loop as the consumer builds it, in latch mode, on `coord`.
fn queue_on(
    coord: &Arc<dyn Coordinator>,
    settings: &crate::config::Settings,
    registry: Registry,
    metrics: Arc<Metrics>,
) -> Queue {
    Queue {
        coord: coord.clone(),
        settings: settings.queue.clone(),
        registry,
        node_id: "n1".into(),
        wait: Duration::from_secs(1),
        metrics,
        rotation: None,
        term: Default::default(),
        lease_rules: LeaseRules::from_settings(settings),
        sharding: Default::default(),
    }
}

/// A lone leader on `coord`, its lease kept alive until the returned token is cancelled.
async fn lone_leader(
    coord: &Arc<dyn Coordinator>,
    metrics: &Arc<Metrics>,
) -> (crate::coord::Leadership, Arc<Lease>, CancellationToken) {
    let spec = LeaseSpec {
        node_id: "n1".into(),
        ttl: TTL,
        takeover_delay: Duration::ZERO,
        previous: None,
    };
    let grant = coord.open_lease(&spec).await.unwrap();
    let lease = Arc::new(Lease::new(TTL));
    lease.adopt(&grant.lease, tokio::time::Instant::now());
    let record = HolderRecord {
        node: "n1".into(),
        ..HolderRecord::default()
    };
    let Campaign::Won(leadership) = coord.campaign(&grant.lease, &record).await.unwrap() else {
        panic!("a lone lease did not win");
    };
    let stop = CancellationToken::new();
    tokio::spawn(Election::renew_until(
        coord.clone(),
        lease.clone(),
        TTL,
        metrics.clone(),
        stop.clone(),
    ));
    (leadership, lease, stop)
}

/// Fails `bad` permanently and `flaky` once (retryably), and records every run.
struct Failing(Arc<Mutex<Vec<String>>>);

impl Handler for Failing {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            self.0
                .lock()
                .unwrap()
                .push(format!("{}#{}", ctx.task_id, ctx.attempt));
            match (ctx.task_id.as_str(), ctx.attempt) {
                ("bad", _) => Err(crate::handler::HandlerError::permanent("unknown customer")),
                ("flaky", 1) => Err("timeout talking to the bank".into()),
                _ => Ok(()),
            }
        })
    }
}

/// A permanent failure is dead-lettered on its first attempt with the reason; a retryable
/// one is retried.
#[tokio::test(start_paused = true)]
async fn a_permanent_failure_is_dead_lettered_at_once_and_a_retryable_one_retried() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = default_settings();
    settings.queue.backoff_base = Duration::from_millis(10);
    let prefix = settings.queue.prefix.clone();
    let dead_prefix = settings.queue.dead_prefix.clone();
    memory.put(&format!("{prefix}t1"), &task("bad", 1)).unwrap();
    memory
        .put(&format!("{prefix}t2"), &task("flaky", 2))
        .unwrap();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Work", Failing(runs.clone()));
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    until("flaky ran twice", || runs.lock().unwrap().len() == 3).await;
    for _ in 0..1000 {
        if coord.keys(&prefix).await.unwrap().0.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(coord.keys(&prefix).await.unwrap().0, Vec::<String>::new());
    assert_eq!(*runs.lock().unwrap(), ["bad#1", "flaky#1", "flaky#2"]);
    let (dead, _) = coord
        .list(&dead_prefix, crate::coord::Version(0), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    let letter: serde_json::Value = serde_json::from_slice(&dead[0].value).unwrap();
    assert_eq!(letter["taskId"], "bad");
    assert_eq!(letter["attempts"], 1);
    assert!(
        letter["deadReason"]
            .as_str()
            .unwrap()
            .contains("failed permanently (not retried) on attempt 1: unknown customer"),
        "{letter}"
    );
    leading.shut_down().await;
}

/// Records its runs; the task `slow` takes 25 ms on the queue's clock, tokio's (over
/// four times `FAST_HANDLER`: slow at once).
struct SlowOne(Arc<Mutex<Vec<String>>>);

impl Handler for SlowOne {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            if ctx.task_id == "slow" {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            self.0.lock().unwrap().push(ctx.task_id.clone());
            Ok(())
        })
    }
}

/// A slow run in a batch claimed ahead sends the rest of the batch back; those tasks are
/// earlier than the backlog after them, so they still run next: order holds.
#[tokio::test(start_paused = true)]
async fn tasks_sent_back_after_a_slow_run_still_go_before_later_ones() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = default_settings();
    settings.queue.claim_batch = 2;
    let prefix = settings.queue.prefix.clone();
    let order = [
        "first",
        "slow",
        "sent-back",
        "later-1",
        "later-2",
        "later-3",
    ];
    for (n, id) in order.iter().enumerate() {
        memory
            .put(&format!("{prefix}k{n}"), &task(id, 10 + n as u64))
            .unwrap();
    }
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Work", SlowOne(runs.clone()));
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    until("every task ran", || {
        runs.lock().unwrap().len() == order.len()
    })
    .await;
    assert_eq!(*runs.lock().unwrap(), order);
    leading.shut_down().await;
}

/// Records each run with the listings made so far; the task `slow` takes 25 ms on the
/// queue's clock, tokio's (over four times `FAST_HANDLER`: slow at once).
struct ListingsSeen {
    runs: Arc<Mutex<Vec<(String, usize)>>>,
    lists: Arc<std::sync::atomic::AtomicUsize>,
}

impl Handler for ListingsSeen {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            if ctx.task_id == "slow" {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            let lists = self.lists.load(std::sync::atomic::Ordering::SeqCst);
            self.runs.lock().unwrap().push((ctx.task_id.clone(), lists));
            Ok(())
        })
    }
}

/// The tasks a slow run sends back are read again by their keys, not by listing the
/// queue: a backlog is listed once however often a run straddles the fast-handler
/// threshold, and the order holds.
#[tokio::test(start_paused = true)]
async fn tasks_sent_back_after_a_slow_run_are_read_again_without_a_listing() {
    let memory = Arc::new(MemoryCoordinator::default());
    let counting = Arc::new(counting::Counting::new(memory.clone()));
    let coord: Arc<dyn Coordinator> = counting.clone();
    let mut settings = default_settings();
    settings.queue.claim_batch = 4;
    let prefix = settings.queue.prefix.clone();
    let order = [
        "a", "b", "slow", "c", "d", "e", "f", "slow", "g", "h", "i", "j",
    ];
    for (n, id) in order.iter().enumerate() {
        memory
            .put(&format!("{prefix}k{n:02}"), &task(id, 10 + n as u64))
            .unwrap();
    }
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register(
        "Work",
        ListingsSeen {
            runs: runs.clone(),
            lists: counting.lists.clone(),
        },
    );
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    until("every task ran", || {
        runs.lock().unwrap().len() == order.len()
    })
    .await;
    let runs = runs.lock().unwrap().clone();
    let ids: Vec<&str> = runs.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, order);
    assert!(
        runs.iter().all(|(_, lists)| *lists == 1),
        "listed again during the drain: {runs:?}"
    );
    leading.shut_down().await;
}

/// While the pause flag is set the leader claims nothing; once it is cleared the queue
/// runs, in order.
#[tokio::test(start_paused = true)]
async fn a_paused_queue_claims_nothing_until_resumed() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let settings = default_settings();
    let prefix = settings.queue.prefix.clone();
    let flag = super::pause_key(&prefix);
    memory.put(&flag, b"{}").unwrap();
    memory.put(&format!("{prefix}t1"), &task("one", 1)).unwrap();
    memory.put(&format!("{prefix}t2"), &task("two", 2)).unwrap();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register("Work", SlowOne(ran.clone()));
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(ran.lock().unwrap().is_empty(), "a paused queue ran tasks");
    clear(&coord, &flag).await;
    until("both tasks ran", || ran.lock().unwrap().len() == 2).await;
    assert_eq!(*ran.lock().unwrap(), ["one", "two"]);
    leading.shut_down().await;
}

/// Each completion leaves its task's history record in the same write; the leader prunes
/// the history to `history_keep` records on its next look, keeping the newest.
#[tokio::test(start_paused = true)]
async fn completions_leave_history_that_the_leader_prunes_to_its_count() {
    let memory = Arc::new(MemoryCoordinator::default());
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = default_settings();
    settings.queue.history_keep = 2;
    let prefix = settings.queue.prefix.clone();
    let done_prefix = settings.queue.done_prefix.clone();
    for n in 1..=5 {
        memory
            .put(&format!("{prefix}t{n}"), &task(&format!("id{n}"), n))
            .unwrap();
    }
    let ran = Arc::new(Mutex::new(Vec::new()));
    let mut registry = Registry::default();
    registry.register(
        "Work",
        Recorder {
            ran: ran.clone(),
            coord: memory.clone(),
            rewrite_on: "none",
            rewrite: Default::default(),
        },
    );
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;
    until("all five ran", || ran.lock().unwrap().len() == 5).await;
    let read = || async {
        let stored = coord
            .list(&done_prefix, crate::coord::Version(0), Duration::ZERO)
            .await
            .unwrap()
            .0;
        stored
            .iter()
            .flat_map(|s| HistoryRecord::decode_all(&s.key, &s.value))
            .collect::<Vec<_>>()
    };
    let mut records = Vec::new();
    for _ in 0..100 {
        records = read().await;
        if records.len() == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(records.len(), 5, "a record per completion");
    assert!(coord.keys(&prefix).await.unwrap().0.is_empty());
    let record = &records[0];
    assert_eq!(record.outcome, "completed");
    assert_eq!(record.node.as_deref(), Some("n1"));
    assert_eq!(record.fencing_token, Some(leading.leadership.fencing_token));
    // The next look at the history, at most HISTORY_PRUNE_EVERY later, keeps the newest two
    // (records written together are cut, not kept or dropped whole).
    tokio::time::sleep(super::history::HISTORY_PRUNE_EVERY + Duration::from_secs(2)).await;
    let ids: Vec<String> = read().await.into_iter().map(|r| r.task_id).collect();
    assert_eq!(ids, ["id4", "id5"]);
    leading.shut_down().await;
}
