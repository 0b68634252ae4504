//! Consumer measurements against a real coordinator from the shared harness (a `leaderq
//! server` process, or another backend's cluster with `--backend`): dispatch latency on an
//! idle queue, drain throughput with 1 and 3 replicas, drains of 300 B and 20 KB tasks,
//! the order window (how long an earlier task PUT during a backlog waits), handover after
//! a shutdown signal, and the RSS of an idle `leaderq consume` process.
//!
//! Latency and throughput replicas run in this process with a handler that records when
//! it starts, which is exactly how a library user runs leaderq; the consumer code path is
//! the same as `leaderq consume`'s. The RSS is read from a real child process. Tasks are
//! written as `leaderq enqueue` writes them (create-only, through the coordinator seam),
//! so every backend is measured by the same code.
//!
//! Size: one measurement per consumer row of the bench table.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{mib, progress, rss_of, summarize, Options, Report, TempDir};
use crate::chaos::wait_for_leader;
use leaderq::config::Settings;
use leaderq::coord::{Coordinator, Edit, Edited};
use leaderq::handler::{Handler, HandlerFuture, Registry, TaskContext};
use testkit::harness::{self, Cluster};

pub(super) const TASK_TYPE: &str = "Bench";
/// Clients that enqueue the drain backlog concurrently.
const ENQUEUE_CLIENTS: usize = 32;
/// Steady flow during handover measurements: one task per this interval.
const FLOW_INTERVAL: Duration = Duration::from_millis(2);
/// Value sizes of the sized drains: the small and large tasks.
const SIZED_DRAINS: [(&str, usize); 2] = [("300 B", 300), ("20 KB", 20_000)];
/// A sized drain stops after this long and reports the rate so far, so that a stalling
/// queue is measured instead of hanging the bench.
const SIZED_DRAIN_LIMIT: Duration = Duration::from_secs(60);
/// Rounds of the sized drains, alternating sizes; the best of each size is reported, which
/// keeps a moment of load from elsewhere on the machine out of the comparison.
const SIZED_ROUNDS: usize = 3;
/// Backlog the order-window measurement PUTs earlier tasks into.
const ORDER_BACKLOG: usize = 8_000;
/// Pause between two earlier tasks of the order-window measurement.
const ORDER_PROBE_INTERVAL: Duration = Duration::from_millis(10);
/// The backlog's taskTime; the earlier tasks use 1 (1970).
pub(super) const BACKLOG_TASK_TIME: &str = "1445599887";

/// A no-op handler that reports (task id, replica, start instant).
struct Recorder {
    replica: String,
    starts: mpsc::UnboundedSender<(String, String, Instant)>,
}

impl Handler for Recorder {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        let _ = self
            .starts
            .send((ctx.task_id.clone(), self.replica.clone(), Instant::now()));
        Box::pin(async { Ok(()) })
    }
}

/// A coordinator for one measurement: its processes, and the seam to write and read it.
pub(super) struct Target {
    pub(super) coord: Arc<dyn Coordinator>,
    pub(super) env: Vec<(String, String)>,
    _cluster: Box<dyn Cluster>,
    _dir: TempDir,
}

impl Target {
    pub(super) fn start(backend: &str) -> anyhow::Result<Target> {
        let exe = crate::exe::leaderq()?;
        let dir = TempDir::new()?;
        let cluster = harness::start_cluster(backend, &exe, &dir.0.join("coordinator"))
            .map_err(|why| anyhow::anyhow!("cannot start the {backend} cluster: {why}"))?
            .with_context(|| format!("the {backend} server is not installed"))?;
        Ok(Target {
            coord: crate::chaos::coordinator_of(cluster.as_ref())?,
            env: cluster.env(),
            _cluster: cluster,
            _dir: dir,
        })
    }
}

impl Target {
    /// On `leaderq server`: its HTTP requests so far by endpoint, from its /metrics.
    pub(super) async fn requests(&self) -> Option<std::collections::BTreeMap<String, f64>> {
        let addr = self
            .env
            .iter()
            .find(|(key, _)| key == "CONSUL_HTTP_ADDR")
            .map(|(_, addr)| addr.clone())?;
        let text = reqwest::get(format!("http://{addr}/metrics"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let mut by_endpoint: std::collections::BTreeMap<String, f64> = Default::default();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("leaderq_server_http_requests_total{") else {
                continue;
            };
            let endpoint = rest
                .split("endpoint=\"")
                .nth(1)
                .and_then(|e| e.split('"').next())
                .unwrap_or("?")
                .to_string();
            let count: f64 = line.rsplit(' ').next()?.parse().ok()?;
            *by_endpoint.entry(endpoint).or_default() += count;
        }
        Some(by_endpoint)
    }
}

/// An in-process replica with its own shutdown token.
pub(super) struct Replica {
    name: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

pub(super) fn settings(target: &Target, name: &str, dir: &TempDir) -> anyhow::Result<Settings> {
    let mut env = target.env.clone();
    env.extend([
        ("LEADERQ__ELECTION__NODE_ID".to_string(), name.to_string()),
        (
            "LEADERQ__DATA__DIR".to_string(),
            dir.0.join(name).display().to_string(),
        ),
        ("LEADERQ__OBSERVE__ENABLED".to_string(), "false".to_string()),
    ]);
    Ok(Settings::load(None, env)?)
}

pub(super) fn start_replica(
    target: &Target,
    name: &str,
    dir: &TempDir,
    starts: &mpsc::UnboundedSender<(String, String, Instant)>,
) -> anyhow::Result<Replica> {
    let settings = settings(target, name, dir)?;
    let mut registry = Registry::default();
    registry.register(
        TASK_TYPE,
        Recorder {
            replica: name.to_string(),
            starts: starts.clone(),
        },
    );
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move {
        if let Err(err) = leaderq::service::consume::run(settings, registry, token).await {
            tracing::error!(error = %err, "bench replica failed");
        }
    });
    Ok(Replica {
        name: name.to_string(),
        stop,
        task,
    })
}

pub(super) async fn stop_all(replicas: Vec<Replica>) {
    for replica in &replicas {
        replica.stop.cancel();
    }
    for replica in replicas {
        let _ = replica.task.await;
    }
}

pub(super) fn task_body(id: &str) -> String {
    task_body_at(id, BACKLOG_TASK_TIME)
}

/// A no-op task at `task_time`.
pub(super) fn task_body_at(id: &str, task_time: &str) -> String {
    json!({"taskId": id, "taskTime": task_time, "taskTaken": false, "taskType": TASK_TYPE, "taskPara": {}})
        .to_string()
}

/// A task whose JSON value is `bytes` long (padded in `taskPara`), at `task_time`.
fn sized_task_body(id: &str, task_time: &str, bytes: usize) -> String {
    let bare = json!({"taskId": id, "taskTime": task_time, "taskTaken": false, "taskType": TASK_TYPE, "taskPara": {"pad": ""}})
        .to_string();
    let pad = "x".repeat(bytes.saturating_sub(bare.len()));
    json!({"taskId": id, "taskTime": task_time, "taskTaken": false, "taskType": TASK_TYPE, "taskPara": {"pad": pad}})
        .to_string()
}

async fn put_task(coord: &dyn Coordinator, id: &str) -> anyhow::Result<()> {
    put_body(coord, id, task_body(id)).await
}

/// Creates task `id` as `leaderq enqueue` does.
pub(super) async fn put_body(
    coord: &dyn Coordinator,
    id: &str,
    body: String,
) -> anyhow::Result<()> {
    let create = [Edit::Create {
        key: format!("oracleTask/{id}"),
        value: body.into_bytes(),
    }];
    match coord.edit(&create).await? {
        Edited::Done => Ok(()),
        Edited::Conflict(keys) => bail!("enqueue: {keys:?} exist"),
    }
}

/// How long the bench waits for a replica to win the election.
pub(super) const LEADER_LIMIT: Duration = Duration::from_secs(30);

pub async fn section(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let backend = options.backend.as_str();

    // Dispatch latency on an idle queue.
    let server = Target::start(backend)?;
    let dir = TempDir::new()?;
    let (starts_tx, mut starts) = mpsc::unbounded_channel();
    let replica = start_replica(&server, "bench-1", &dir, &starts_tx)?;
    wait_for_leader(server.coord.as_ref(), &[], LEADER_LIMIT).await?;
    progress(&format!(
        "consumer: dispatch latency, {} tasks one at a time",
        options.dispatches
    ));
    let mut samples = Vec::with_capacity(options.dispatches);
    for n in 0..options.dispatches {
        let id = format!("d{n}");
        put_task(server.coord.as_ref(), &id).await?;
        let acknowledged = Instant::now();
        let (started_id, _, at) = tokio::time::timeout(Duration::from_secs(10), starts.recv())
            .await
            .context("a task was not dispatched within 10s")?
            .context("replica stopped")?;
        if started_id != id {
            bail!("dispatched {started_id}, expected {id}");
        }
        samples.push(at.saturating_duration_since(acknowledged));
        // Let the completion land so that the next task meets an idle queue.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let dispatch = summarize(samples);
    stop_all(vec![replica]).await;
    drop(server);

    // Drain throughput.
    let mut drain = HashMap::new();
    let mut requests_per_task: HashMap<usize, serde_json::Value> = HashMap::new();
    for replicas in [1usize, 3] {
        let server = Target::start(backend)?;
        let dir = TempDir::new()?;
        progress(&format!(
            "consumer: enqueueing {} tasks",
            options.drain_tasks
        ));
        enqueue_backlog(&server.coord, options.drain_tasks).await?;
        progress(&format!("consumer: draining with {replicas} replica(s)"));
        let requests_before = server.requests().await;
        let (starts_tx, mut starts) = mpsc::unbounded_channel();
        let started = Instant::now();
        let mut running = Vec::new();
        for n in 1..=replicas {
            running.push(start_replica(
                &server,
                &format!("drain-{n}"),
                &dir,
                &starts_tx,
            )?);
        }
        let mut seen = 0;
        while seen < options.drain_tasks {
            tokio::time::timeout(Duration::from_secs(60), starts.recv())
                .await
                .context("drain stalled for 60s")?
                .context("replicas stopped")?;
            seen += 1;
        }
        wait_until_empty(server.coord.as_ref()).await?;
        let rate = options.drain_tasks as f64 / started.elapsed().as_secs_f64();
        drain.insert(replicas, rate);
        stop_all(running).await;
        // What the drain cost in round trips to the server, per task, by endpoint.
        if let (Some(before), Some(after)) = (requests_before, server.requests().await) {
            let per_task: std::collections::BTreeMap<String, f64> = after
                .into_iter()
                .map(|(endpoint, count)| {
                    let spent = count - before.get(&endpoint).copied().unwrap_or(0.0);
                    let per = spent / options.drain_tasks as f64;
                    (endpoint, (per * 1000.0).round() / 1000.0)
                })
                .filter(|(_, per)| *per > 0.0)
                .collect();
            let per_task = json!(per_task);
            progress(&format!(
                "consumer: server requests per task drained with {replicas} replica(s): {per_task}"
            ));
            requests_per_task.insert(replicas, per_task);
        }
    }

    // Drains of 300 B and 20 KB tasks, one replica: large values must not slow the claim
    // path down by more than their transfer costs.
    let mut sized: Vec<(&str, Vec<Drained>)> = SIZED_DRAINS
        .iter()
        .map(|(label, _)| (*label, Vec::new()))
        .collect();
    'rounds: for _ in 0..SIZED_ROUNDS {
        for (n, (_, bytes)) in SIZED_DRAINS.iter().enumerate() {
            let drained = sized_drain(backend, options.sized_drain_tasks, *bytes).await?;
            let stalled = drained.seen < options.sized_drain_tasks;
            sized[n].1.push(drained);
            // A drain that stalls would stall again: one measurement of it is enough.
            if stalled {
                break 'rounds;
            }
        }
    }
    let best = |runs: &[Drained]| -> (usize, f64) {
        runs.iter()
            .map(|d| (d.seen, d.rate))
            .fold(
                (0, 0.0),
                |best, run| if run.1 > best.1 { run } else { best },
            )
    };

    let order = order_window(backend, options.order_probes).await?;

    // Handover after a shutdown signal, under a steady flow of tasks.
    let server = Target::start(backend)?;
    let dir = TempDir::new()?;
    let (starts_tx, mut starts) = mpsc::unbounded_channel();
    let mut replicas = vec![
        start_replica(&server, "h-0", &dir, &starts_tx)?,
        start_replica(&server, "h-1", &dir, &starts_tx)?,
    ];
    let flow_stop = CancellationToken::new();
    let flow = {
        let coord = server.coord.clone();
        let stop = flow_stop.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.is_cancelled() {
                let _ = put_task(coord.as_ref(), &format!("f{n}")).await;
                n += 1;
                tokio::time::sleep(FLOW_INTERVAL).await;
            }
        })
    };
    let last_start: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    progress(&format!(
        "consumer: {} handovers after a shutdown signal",
        options.handovers
    ));
    let mut gaps = Vec::new();
    for round in 0..options.handovers {
        let old = wait_for_leader(server.coord.as_ref(), &[], LEADER_LIMIT).await?;
        // Let the old leader run the flow for a moment.
        let warm = Instant::now() + Duration::from_millis(200);
        while Instant::now() < warm {
            if let Ok(Some((_, replica, at))) =
                tokio::time::timeout(Duration::from_millis(50), starts.recv()).await
            {
                last_start
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(replica, at);
            }
        }
        let position = replicas
            .iter()
            .position(|r| r.name == old)
            .context("leader is not ours")?;
        let leaving = replicas.remove(position);
        leaving.stop.cancel();
        // The first start by anyone else ends the gap; the old leader's last start begins it.
        let first_new = loop {
            let (_, replica, at) = tokio::time::timeout(Duration::from_secs(30), starts.recv())
                .await
                .context("no task started after the handover within 30s")?
                .context("replicas stopped")?;
            if replica == old {
                last_start
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(replica, at);
            } else {
                break at;
            }
        };
        let _ = leaving.task.await;
        let old_last = last_start
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&old)
            .copied();
        if let Some(old_last) = old_last {
            gaps.push(first_new.saturating_duration_since(old_last));
        }
        replicas.push(start_replica(
            &server,
            &format!("h-{}", round + 2),
            &dir,
            &starts_tx,
        )?);
    }
    flow_stop.cancel();
    let _ = flow.await;
    stop_all(replicas).await;
    let handover = summarize(gaps);
    drop(server);

    // RSS of an idle `leaderq consume` process (leading an empty queue).
    let server = Target::start(backend)?;
    let dir = TempDir::new()?;
    let exe = crate::exe::leaderq()?;
    let mut child = Command::new(exe)
        .arg("consume")
        .envs(server.env.iter().map(|(k, v)| (k, v)))
        .env("LEADERQ__DATA__DIR", dir.0.join("idle"))
        .env("LEADERQ__OBSERVE__LISTEN", "127.0.0.1:0")
        // It runs no task, so it needs no handler; without this it refuses to start.
        .env("LEADERQ__QUEUE__ALLOW_NO_HANDLERS", "true")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start leaderq consume")?;
    wait_for_leader(server.coord.as_ref(), &[], LEADER_LIMIT).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (idle_rss, _) = rss_of(child.id()).unwrap_or((0, 0));
    let _ = child.kill();
    let _ = child.wait();

    report.row(
        "consumer: dispatch PUT -> handler start, ms p50/p99",
        format!("{:.2}/{:.2}", dispatch.p50, dispatch.p99),
        "<= 5 / 25",
    );
    report.row(
        format!(
            "consumer: drain {} no-op tasks, 1 replica, tasks/s",
            options.drain_tasks
        ),
        format!("{:.0}", drain[&1]),
        ">= 1000",
    );
    report.row(
        format!(
            "consumer: drain {} no-op tasks, 3 replicas, tasks/s",
            options.drain_tasks
        ),
        format!("{:.0}", drain[&3]),
        ">= 1000",
    );
    for (label, runs) in &sized {
        let (seen, rate) = best(runs);
        let result = if seen < options.sized_drain_tasks {
            format!("{rate:.0} ({seen} in 60 s)")
        } else {
            format!("{rate:.0}")
        };
        report.row(
            format!(
                "consumer: drain {} tasks of {label}, 1 replica, best of {}, tasks/s",
                options.sized_drain_tasks,
                runs.len()
            ),
            result,
            if *label == "20 KB" {
                ">= 1/3 of 300 B"
            } else {
                ""
            },
        );
    }
    report.row(
        format!(
            "consumer: order window, earlier task during a backlog ({}x): ms p50/max, later tasks started max",
            order.probes
        ),
        format!(
            "{:.1}/{:.1}, {}",
            order.latency.p50, order.latency.max, order.max_later
        ),
        "one batch or 50 ms",
    );
    report.row(
        format!(
            "consumer: handover after shutdown signal, ms p50/max ({}x)",
            options.handovers
        ),
        format!("{:.1}/{:.1}", handover.p50, handover.max),
        "<= 100",
    );
    report.row(
        "consumer: idle `leaderq consume` RSS, MiB",
        format!("{:.1}", mib(idle_rss)),
        "<= 30 MB",
    );
    report.json.insert(
        "consumer".into(),
        json!({
            "dispatch_ms": {"p50": dispatch.p50, "p99": dispatch.p99, "max": dispatch.max, "tasks": options.dispatches},
            "drain_tasks_per_sec": {"tasks": options.drain_tasks, "replicas_1": drain[&1].round(), "replicas_3": drain[&3].round()},
            "drain_server_requests_per_task": {"replicas_1": requests_per_task.get(&1), "replicas_3": requests_per_task.get(&3)},
            "sized_drain_tasks_per_sec": sized.iter().map(|(label, runs)| json!({"value": label, "tasks": options.sized_drain_tasks, "best": best(runs).1.round(), "runs": runs.iter().map(|d| json!({"drained": d.seen, "rate": d.rate.round()})).collect::<Vec<_>>()})).collect::<Vec<_>>(),
            "order_window": {"probes": order.probes, "ms_p50": order.latency.p50, "ms_max": order.latency.max, "later_tasks_started_max": order.max_later, "backlog": ORDER_BACKLOG},
            "handover_ms": {"p50": handover.p50, "max": handover.max, "runs": options.handovers},
            "idle_rss_mib": mib(idle_rss),
        }),
    );
    Ok(())
}

/// How far a sized drain got, and its rate.
struct Drained {
    seen: usize,
    rate: f64,
}

/// Drains `count` tasks of `bytes` with one replica on a fresh server.
async fn sized_drain(backend: &str, count: usize, bytes: usize) -> anyhow::Result<Drained> {
    let server = Target::start(backend)?;
    let dir = TempDir::new()?;
    progress(&format!("consumer: enqueueing {count} tasks of {bytes} B"));
    enqueue_sized(&server.coord, count, bytes).await?;
    progress(&format!("consumer: draining {count} tasks of {bytes} B"));
    let (starts_tx, mut starts) = mpsc::unbounded_channel();
    let started = Instant::now();
    let replica = start_replica(&server, "sized-1", &dir, &starts_tx)?;
    let mut seen = 0;
    while seen < count {
        let left = SIZED_DRAIN_LIMIT.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, starts.recv()).await {
            Ok(Some(_)) => seen += 1,
            Ok(None) => bail!("replica stopped"),
            Err(_) => break,
        }
    }
    let rate = seen as f64 / started.elapsed().as_secs_f64();
    stop_all(vec![replica]).await;
    Ok(Drained { seen, rate })
}

/// How long earlier tasks PUT during a backlog waited.
struct OrderWindow {
    probes: usize,
    latency: super::Latency,
    /// The most backlog tasks that started after an earlier task's PUT was acknowledged
    /// and before it started.
    max_later: usize,
}

/// PUTs `probes` tasks with an earlier taskTime, one every ORDER_PROBE_INTERVAL, while one
/// replica drains a backlog of no-op tasks; measures how long each waited and how many
/// later tasks started meanwhile.
async fn order_window(backend: &str, probes: usize) -> anyhow::Result<OrderWindow> {
    let server = Target::start(backend)?;
    let dir = TempDir::new()?;
    progress(&format!(
        "consumer: order window, {probes} earlier tasks during a backlog of {ORDER_BACKLOG}"
    ));
    enqueue_backlog(&server.coord, ORDER_BACKLOG).await?;
    let (starts_tx, mut starts) = mpsc::unbounded_channel();
    let replica = start_replica(&server, "order-1", &dir, &starts_tx)?;
    let mut events: Vec<(String, Instant)> = Vec::new();
    let (id, _, at) = tokio::time::timeout(Duration::from_secs(30), starts.recv())
        .await
        .context("the backlog did not start within 30s")?
        .context("replica stopped")?;
    events.push((id, at));
    let mut acknowledged = Vec::with_capacity(probes);
    for n in 0..probes {
        let id = format!("e{n:03}");
        put_body(server.coord.as_ref(), &id, sized_task_body(&id, "1", 0)).await?;
        acknowledged.push((id, Instant::now()));
        let until = Instant::now() + ORDER_PROBE_INTERVAL;
        while let Ok(Some((id, _, at))) = tokio::time::timeout_at(until.into(), starts.recv()).await
        {
            events.push((id, at));
        }
    }
    let mut early_left = acknowledged
        .iter()
        .filter(|(id, _)| !events.iter().any(|(e, _)| e == id))
        .count();
    while early_left > 0 {
        let (id, _, at) = tokio::time::timeout(Duration::from_secs(60), starts.recv())
            .await
            .context("an earlier task did not start within 60s")?
            .context("replica stopped")?;
        if id.starts_with('e') {
            early_left -= 1;
        }
        events.push((id, at));
    }
    stop_all(vec![replica]).await;
    let mut samples = Vec::with_capacity(probes);
    let mut max_later = 0;
    for (id, put_at) in &acknowledged {
        let started_at = events
            .iter()
            .find(|(e, _)| e == id)
            .map(|(_, at)| *at)
            .context("an earlier task never started")?;
        let later = events
            .iter()
            .filter(|(e, at)| e.starts_with('b') && *at > *put_at && *at < started_at)
            .count();
        max_later = max_later.max(later);
        samples.push(started_at.saturating_duration_since(*put_at));
    }
    Ok(OrderWindow {
        probes,
        latency: summarize(samples),
        max_later,
    })
}

async fn enqueue_sized(
    coord: &Arc<dyn Coordinator>,
    count: usize,
    bytes: usize,
) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for client in 0..ENQUEUE_CLIENTS {
        let coord = coord.clone();
        tasks.push(tokio::spawn(async move {
            for n in (client..count).step_by(ENQUEUE_CLIENTS) {
                let id = format!("s{n:06}");
                let body = sized_task_body(&id, BACKLOG_TASK_TIME, bytes);
                put_body(coord.as_ref(), &id, body).await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

async fn enqueue_backlog(coord: &Arc<dyn Coordinator>, count: usize) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for client in 0..ENQUEUE_CLIENTS {
        let coord = coord.clone();
        tasks.push(tokio::spawn(async move {
            for n in (client..count).step_by(ENQUEUE_CLIENTS) {
                put_task(coord.as_ref(), &format!("b{n:06}")).await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

async fn wait_until_empty(coord: &dyn Coordinator) -> anyhow::Result<()> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        if coord.keys("oracleTask/").await?.0.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("queue not empty 60s after the last task started")
}
