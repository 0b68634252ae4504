//! The producers' front door against the coordinator's own write: how fast tasks are
//! enqueued through `leaderq gateway` (one per request from one client and from 16 at
//! once, each with its Idempotency-Key, and in bulk, arrays of 1,000), beside the native
//! create (one per call from one client and from 16, and in the coordinator's
//! transaction-sized batches, as `enqueue` writes a backlog). Each way on its own prefix
//! of the same fresh coordinator, so that no way writes over another's keys.

use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use serde_json::json;

use super::consumer::{task_body, Target};
use super::{progress, Options, Report};
use leaderq::coord::{Coordinator, Edit, Edited};

/// Tasks each one-at-a-time way writes, and the bulk ways.
const ONE_BY_ONE: usize = 2_000;
const BULK: usize = 20_000;
/// Tasks in one bulk request.
const BULK_REQUEST: usize = 1_000;
/// Clients writing at once in the concurrent ways.
const CLIENTS: usize = 16;
const TOKEN: &str = "bench-gateway-token-0123456789abcdef";

/// The gateway child, killed when dropped.
struct Gateway {
    child: Child,
    base: String,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_gateway(server: &Target) -> anyhow::Result<Gateway> {
    let exe = crate::exe::leaderq()?;
    let mut child = Command::new(&exe)
        .args(["gateway", "--listen", "127.0.0.1:0"])
        .envs(server.env.iter().map(|(k, v)| (k, v)))
        .env("LEADERQ__GATEWAY__TOKEN", TOKEN)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {} gateway", exe.display()))?;
    let stdout = child.stdout.take().context("the gateway's stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    let base = line
        .trim()
        .strip_prefix("gateway: ")
        .and_then(|url| url.strip_suffix("/v1/tasks"))
        .map(str::to_string);
    let gateway = Gateway {
        child,
        base: base.unwrap_or_default(),
    };
    anyhow::ensure!(!gateway.base.is_empty(), "the gateway said {line:?}");
    Ok(gateway)
}

pub async fn section(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let backend = options.backend.as_str();
    let server = Target::start(backend)?;
    let gateway = start_gateway(&server)?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS)
        .build()?;
    let mut rows = Vec::new();
    progress(&format!(
        "gateway: {ONE_BY_ONE} native creates, one at a time ({backend})"
    ));
    let native_one = native_each(&server.coord, "n1-", ONE_BY_ONE, 1).await?;
    rows.push(("native create, one per call, 1 client", native_one));
    let native_many = native_each(&server.coord, "n16-", ONE_BY_ONE, CLIENTS).await?;
    rows.push(("native create, one per call, 16 clients", native_many));
    progress(&format!(
        "gateway: {BULK} native creates in batches ({backend})"
    ));
    let started = Instant::now();
    super::backlog::enqueue(&server.coord, BULK).await?;
    rows.push((
        "native create, transaction-sized batches",
        BULK as f64 / started.elapsed().as_secs_f64(),
    ));
    progress(&format!(
        "gateway: {ONE_BY_ONE} POSTs of one task ({backend})"
    ));
    let door_one = door_each(&http, &gateway.base, "g1-", ONE_BY_ONE, 1).await?;
    rows.push(("front door, one task per request, 1 client", door_one));
    let door_many = door_each(&http, &gateway.base, "g16-", ONE_BY_ONE, CLIENTS).await?;
    rows.push(("front door, one task per request, 16 clients", door_many));
    progress(&format!(
        "gateway: {BULK} tasks in POSTs of {BULK_REQUEST} ({backend})"
    ));
    let door_bulk = door_bulk(&http, &gateway.base, "gb-", BULK).await?;
    rows.push(("front door, arrays of 1,000 tasks", door_bulk));
    let mut json_rows = serde_json::Map::new();
    for (way, rate) in rows {
        report.row(
            format!("gateway: enqueue, {way} ({backend}), tasks/s"),
            format!("{rate:.0}"),
            "",
        );
        json_rows.insert(way.to_string(), json!(rate.round()));
    }
    report.json.insert(
        "gateway".into(),
        json!({"backend": backend, "tasks_per_sec": json_rows}),
    );
    Ok(())
}

/// Runs `one(n)` for every `n` below `count`, from `clients` at once (client `c` takes
/// `c`, `c + clients`, …); answers the tasks per second.
async fn in_clients<F, Fut>(count: usize, clients: usize, one: F) -> anyhow::Result<f64>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..clients {
        let one = one.clone();
        tasks.spawn(async move {
            for n in (client..count).step_by(clients) {
                one(n).await?;
            }
            Ok::<(), anyhow::Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// `count` native creates under `oracleTask/<prefix>…`, one per call, from `clients` at once.
async fn native_each(
    coord: &Arc<dyn Coordinator>,
    prefix: &str,
    count: usize,
    clients: usize,
) -> anyhow::Result<f64> {
    let (coord, prefix) = (coord.clone(), prefix.to_string());
    in_clients(count, clients, move |n| {
        let (coord, id) = (coord.clone(), format!("{prefix}t{n:06}"));
        async move {
            let edit = [Edit::Create {
                key: format!("oracleTask/{id}"),
                value: task_body(&id).into_bytes(),
            }];
            match coord.edit(&edit).await? {
                Edited::Done => Ok(()),
                other => anyhow::bail!("a native create answered {other:?}"),
            }
        }
    })
    .await
}

/// `count` POSTs of one task each (its key the Idempotency-Key), from `clients` at once.
async fn door_each(
    http: &reqwest::Client,
    base: &str,
    prefix: &str,
    count: usize,
    clients: usize,
) -> anyhow::Result<f64> {
    let (http, url, prefix) = (http.clone(), format!("{base}/v1/tasks"), prefix.to_string());
    in_clients(count, clients, move |n| {
        let (http, url, id) = (http.clone(), url.clone(), format!("{prefix}t{n:06}"));
        async move {
            let answer = http
                .post(&url)
                .header("Authorization", format!("Bearer {TOKEN}"))
                .header("Content-Type", "application/json")
                .header("Idempotency-Key", format!("task_{id}"))
                .body(task_body(&id))
                .send()
                .await?;
            let status = answer.status();
            anyhow::ensure!(status.is_success(), "the front door answered {status}");
            Ok(())
        }
    })
    .await
}

/// `count` tasks in POSTs of [`BULK_REQUEST`], one request at a time.
async fn door_bulk(
    http: &reqwest::Client,
    base: &str,
    prefix: &str,
    count: usize,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    for first in (0..count).step_by(BULK_REQUEST) {
        let tasks: Vec<serde_json::Value> = (first..(first + BULK_REQUEST).min(count))
            .map(|n| {
                let id = format!("{prefix}t{n:06}");
                serde_json::from_str(&task_body(&id)).unwrap_or_default()
            })
            .collect();
        let answer = http
            .post(format!("{base}/v1/tasks"))
            .header("Authorization", format!("Bearer {TOKEN}"))
            .json(&tasks)
            .send()
            .await?;
        let status = answer.status();
        anyhow::ensure!(status.is_success(), "a bulk request answered {status}");
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}
