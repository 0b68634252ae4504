//! `leaderq bench`: measures the embedded server as a client sees it. It starts its own
//! `leaderq server` process on a free port with a temporary data dir, drives it over HTTP
//! and prints a table (or one JSON object).
//!
//! Measured: durable PUTs/s with 1 and 32 clients, blocking-query wake latency after the
//! write that changes its result, `?recurse` latency over 10,000 keys, and the RSS of a
//! fresh server holding 100,000 keys of 300 bytes. Numbers only; targets are judged by people.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

/// Size of the values written by the load phases, as in the memory target.
const VALUE_BYTES: usize = 300;

#[derive(Clone, Debug)]
pub struct Options {
    /// Seconds each throughput phase runs.
    pub seconds: f64,
    /// Keys loaded for the memory measurement.
    pub memory_keys: usize,
    /// Keys listed by the `?recurse` measurement.
    pub recurse_keys: usize,
    /// Blocking-query wake-ups measured.
    pub wakes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seconds: 3.0,
            memory_keys: 100_000,
            recurse_keys: 10_000,
            wakes: 200,
        }
    }
}

/// A `leaderq server` child process for the benchmark, killed on drop.
struct ServerChild {
    child: Child,
    base: String,
    _dir: TempDir,
}

impl ServerChild {
    fn start() -> anyhow::Result<ServerChild> {
        let dir = TempDir::new()?;
        let exe = std::env::current_exe().context("cannot find the leaderq binary")?;
        let mut child = Command::new(exe)
            .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&dir.0)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start leaderq server")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("no stdout")?).read_line(&mut line)?;
        let Some(addr) = line.trim().strip_prefix("leaderq server listening on ") else {
            let _ = child.kill();
            bail!("leaderq server did not start");
        };
        Ok(ServerChild {
            base: addr.to_string(),
            child,
            _dir: dir,
        })
    }

    /// Current and peak resident set size in bytes, from /proc.
    fn rss(&self) -> Option<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find(|line| line.starts_with(name))?
                .split_whitespace()
                .nth(1)?
                .parse::<u64>()
                .ok()
                .map(|kib| kib * 1024)
        };
        Some((field("VmRSS:")?, field("VmHWM:")?))
    }
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary directory removed on drop (the benchmark is a binary, not a test).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<TempDir> {
        let path = std::env::temp_dir().join(format!("leaderq-bench-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Latency summary in milliseconds.
#[derive(Clone, Copy, Debug)]
struct Latency {
    p50: f64,
    p99: f64,
    max: f64,
}

fn summarize(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1000.0
    };
    Latency {
        p50: at(0.5),
        p99: at(0.99),
        max: at(1.0),
    }
}

fn progress(message: &str) {
    eprintln!("bench: {message}");
}

pub async fn run(options: Options, as_json: bool) -> anyhow::Result<()> {
    let server = ServerChild::start()?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let base = Arc::new(server.base.clone());

    progress(&format!(
        "durable PUTs with 1 client for {}s",
        options.seconds
    ));
    let put_1 = put_rate(&http, &base, 1, options.seconds).await?;
    progress(&format!(
        "durable PUTs with 32 clients for {}s",
        options.seconds
    ));
    let put_32 = put_rate(&http, &base, 32, options.seconds).await?;
    progress(&format!(
        "blocking-query wake latency, {} wake-ups",
        options.wakes
    ));
    let wake = wake_latency(&http, &base, options.wakes).await?;
    progress(&format!(
        "loading {} keys for ?recurse",
        options.recurse_keys
    ));
    load_keys(&http, &base, "recurse/", options.recurse_keys).await?;
    let recurse = recurse_latency(&http, &base, "recurse/", options.recurse_keys).await?;
    drop(server);
    // A fresh server, so that it holds exactly the keys the memory target names.
    let server = ServerChild::start()?;
    let base = Arc::new(server.base.clone());
    progress(&format!(
        "loading {} keys into a fresh server for RSS",
        options.memory_keys
    ));
    load_keys(&http, &base, "memory/", options.memory_keys).await?;
    let (rss, peak) = server.rss().unwrap_or((0, 0));

    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    if as_json {
        let report = json!({
            "server": {
                "put_per_sec_1_client": put_1.round(),
                "put_per_sec_32_clients": put_32.round(),
                "wake_ms": {"p50": wake.p50, "p99": wake.p99, "max": wake.max},
                "recurse_ms": {"keys": options.recurse_keys, "p50": recurse.p50, "p99": recurse.p99, "max": recurse.max},
                "rss_mib": {"keys": options.memory_keys, "value_bytes": VALUE_BYTES, "rss": mib(rss), "peak": mib(peak)},
            }
        });
        println!("{report}");
    } else {
        println!("{:<48} {:>14}", "embedded server", "result");
        println!("{:<48} {:>14.0}", "durable KV PUTs/s, 1 client", put_1);
        println!("{:<48} {:>14.0}", "durable KV PUTs/s, 32 clients", put_32);
        println!(
            "{:<48} {:>14}",
            "blocking-query wake after write, ms p50/p99",
            format!("{:.2}/{:.2}", wake.p50, wake.p99)
        );
        println!(
            "{:<48} {:>14}",
            format!("?recurse over {} keys, ms p50/p99", options.recurse_keys),
            format!("{:.1}/{:.1}", recurse.p50, recurse.p99)
        );
        println!(
            "{:<48} {:>14}",
            format!(
                "server RSS, {} keys x {VALUE_BYTES} B, MiB (peak)",
                options.memory_keys
            ),
            format!("{:.1} ({:.1})", mib(rss), mib(peak))
        );
    }
    Ok(())
}

/// PUTs acknowledged per second by `clients` concurrent clients over `seconds`.
async fn put_rate(
    http: &reqwest::Client,
    base: &Arc<String>,
    clients: usize,
    seconds: f64,
) -> anyhow::Result<f64> {
    let value = "v".repeat(VALUE_BYTES);
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for client in 0..clients {
        let http = http.clone();
        let base = base.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            while Instant::now() < until {
                let url = format!("{base}/v1/kv/put/{clients}/{client}/{done}");
                let response = http.put(url).body(value.clone()).send().await?;
                if !response.status().is_success() {
                    bail!("PUT failed: {}", response.status());
                }
                done += 1;
            }
            Ok(done)
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Time from a PUT being acknowledged to a blocked GET on that key returning.
async fn wake_latency(
    http: &reqwest::Client,
    base: &Arc<String>,
    wakes: usize,
) -> anyhow::Result<Latency> {
    let url = format!("{base}/v1/kv/wake/key");
    http.put(&url).body("0").send().await?;
    let mut samples = Vec::with_capacity(wakes);
    for n in 0..wakes {
        let index = http
            .get(&url)
            .send()
            .await?
            .headers()
            .get("X-Consul-Index")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .context("no X-Consul-Index")?;
        let waiter = {
            let http = http.clone();
            let url = format!("{url}?index={index}&wait=30s");
            tokio::spawn(async move {
                let response = http.get(url).send().await;
                (Instant::now(), response.map(|r| r.status()))
            })
        };
        // Give the waiter time to reach the server and block before writing.
        tokio::time::sleep(Duration::from_millis(5)).await;
        http.put(&url).body(n.to_string()).send().await?;
        let acknowledged = Instant::now();
        let (woke, status) = waiter.await?;
        if !status?.is_success() {
            bail!("blocking GET failed");
        }
        samples.push(woke.saturating_duration_since(acknowledged));
    }
    Ok(summarize(samples))
}

/// Writes `count` keys of VALUE_BYTES under `prefix` with 32 concurrent clients.
async fn load_keys(
    http: &reqwest::Client,
    base: &Arc<String>,
    prefix: &str,
    count: usize,
) -> anyhow::Result<()> {
    const CLIENTS: usize = 32;
    let value = "x".repeat(VALUE_BYTES);
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let http = http.clone();
        let base = base.clone();
        let value = value.clone();
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            for n in (client..count).step_by(CLIENTS) {
                let response = http
                    .put(format!("{base}/v1/kv/{prefix}{n:08}"))
                    .body(value.clone())
                    .send()
                    .await?;
                if !response.status().is_success() {
                    bail!("PUT failed: {}", response.status());
                }
            }
            Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

async fn recurse_latency(
    http: &reqwest::Client,
    base: &Arc<String>,
    prefix: &str,
    expected: usize,
) -> anyhow::Result<Latency> {
    let mut samples = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        let body = http
            .get(format!("{base}/v1/kv/{prefix}?recurse"))
            .send()
            .await?
            .bytes()
            .await?;
        samples.push(started.elapsed());
        let entries: serde_json::Value = serde_json::from_slice(&body)?;
        if entries.as_array().map(Vec::len) != Some(expected) {
            bail!("?recurse returned the wrong number of keys");
        }
    }
    Ok(summarize(samples))
}
