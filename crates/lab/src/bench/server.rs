//! Server measurements: durable PUTs/s, blocking-query wake latency, `?recurse` latency,
//! reads under a write load, and wakes among many blocked queries.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{summarize, Latency, VALUE_BYTES};

/// PUTs acknowledged per second by `clients` concurrent clients over `seconds`.
pub async fn put_rate(
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
pub async fn wake_latency(
    http: &reqwest::Client,
    base: &Arc<String>,
    wakes: usize,
) -> anyhow::Result<Latency> {
    let url = format!("{base}/v1/kv/wake/key");
    // Every write below changes the value: a PUT of an unchanged value is not a change
    // (Consul skips it, and so does leaderq server) and would wake nobody.
    http.put(&url).body("initial").send().await?;
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
pub async fn load_keys(
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

pub async fn recurse_latency(
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

/// GETs of one key, one after another, while `writers` clients PUT as fast as they can for
/// `seconds`: whether a read waits for the commits in flight. Returns the GET latency and
/// the PUTs/s the writers reached. The reader has its own thread and runtime, so that the
/// writers' tasks in this process do not delay it.
pub async fn read_under_writes(
    http: &reqwest::Client,
    base: &Arc<String>,
    writers: usize,
    seconds: f64,
) -> anyhow::Result<(Latency, f64)> {
    let url = format!("{base}/v1/kv/read/key");
    http.put(&url).body("value").send().await?;
    let writing = tokio::spawn({
        let (http, base) = (http.clone(), base.clone());
        async move { put_rate(&http, &base, writers, seconds).await }
    });
    let reader = std::thread::spawn(move || -> anyhow::Result<Vec<Duration>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let http = reqwest::Client::new();
            let until = Instant::now() + Duration::from_secs_f64(seconds);
            let mut samples = Vec::new();
            while Instant::now() < until {
                let started = Instant::now();
                let response = http.get(&url).send().await?;
                let status = response.status();
                response.bytes().await?;
                samples.push(started.elapsed());
                if !status.is_success() {
                    bail!("GET failed: {status}");
                }
            }
            Ok(samples)
        })
    });
    let puts = writing.await??;
    let samples = tokio::task::spawn_blocking(move || reader.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the reader thread panicked"))??;
    Ok((summarize(samples), puts))
}

/// What `watch_fanout` measured.
pub struct Fanout {
    /// From a PUT's acknowledgement to the first byte of its key's watcher's answer (0 when
    /// the watcher had its answer first).
    pub wake: Latency,
    /// The server's CPU time over the write phase, in % of one core.
    pub cpu_percent: f64,
    /// PUTs/s acknowledged in the write phase.
    pub puts_per_sec: f64,
    /// Watchers of keys nobody wrote that returned anyway.
    pub early: usize,
}

/// `watchers` blocking GETs, one per key, parked on the server (`server_pid`), then `rate`
/// PUTs/s for `seconds` to keys drawn without repeats from the watched ones. The watchers
/// speak raw HTTP/1.1, one connection each, so that 10,000 of them cost this process little.
pub async fn watch_fanout(
    http: &reqwest::Client,
    base: &Arc<String>,
    server_pid: u32,
    watchers: usize,
    rate: u32,
    seconds: f64,
) -> anyhow::Result<Fanout> {
    load_keys(http, base, "watch/", watchers).await?;
    let listing: serde_json::Value = http
        .get(format!("{base}/v1/kv/watch/?recurse"))
        .send()
        .await?
        .json()
        .await?;
    let indexes: Vec<u64> = listing
        .as_array()
        .context("the listing is not an array")?
        .iter()
        .map(|entry| entry["ModifyIndex"].as_u64().unwrap_or(1))
        .collect();
    if indexes.len() != watchers {
        bail!("loaded {} keys of {watchers}", indexes.len());
    }

    let addr = base.trim_start_matches("http://").to_string();
    // Connections are opened a few hundred at a time, within the server's accept backlog.
    let opening = Arc::new(tokio::sync::Semaphore::new(256));
    let mut parked = Vec::with_capacity(watchers);
    for (n, index) in indexes.into_iter().enumerate() {
        let (addr, opening) = (addr.clone(), opening.clone());
        parked.push(tokio::spawn(async move {
            let mut stream = {
                let _permit = opening.acquire().await?;
                let mut stream = tokio::net::TcpStream::connect(&addr).await?;
                let request = format!(
                    "GET /v1/kv/watch/{n:08}?index={index}&wait=120s HTTP/1.1\r\nHost: {addr}\r\n\r\n"
                );
                stream.write_all(request.as_bytes()).await?;
                stream
            };
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).await?;
            anyhow::Ok(Instant::now())
        }));
    }
    let started = Instant::now();
    while blocked_queries(http, base).await? < watchers as f64 {
        if started.elapsed() > Duration::from_secs(120) {
            bail!("the watchers did not all block");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut order: Vec<usize> = (0..watchers).collect();
    fastrand::Rng::with_seed(7).shuffle(&mut order);
    let writes = ((rate as f64 * seconds) as usize).min(watchers);
    let cpu_before = cpu_ticks(server_pid)?;
    let phase = Instant::now();
    let mut acks = Vec::with_capacity(writes);
    for (i, &n) in order[..writes].iter().enumerate() {
        tokio::time::sleep_until((phase + Duration::from_secs_f64(i as f64 / rate as f64)).into())
            .await;
        let (http, url) = (http.clone(), format!("{base}/v1/kv/watch/{n:08}"));
        acks.push(tokio::spawn(async move {
            let response = http.put(url).body("written").send().await?;
            if !response.status().is_success() {
                bail!("PUT failed: {}", response.status());
            }
            anyhow::Ok((n, Instant::now()))
        }));
    }
    let mut acknowledged = HashMap::with_capacity(writes);
    for ack in acks {
        let (n, at) = ack.await??;
        acknowledged.insert(n, at);
    }
    let elapsed = phase.elapsed().as_secs_f64();
    let cpu = (cpu_ticks(server_pid)? - cpu_before) as f64 / clock_ticks_per_second();

    let mut samples = Vec::with_capacity(writes);
    let mut early = 0;
    let woken_by = Instant::now() + Duration::from_secs(30);
    for (n, watcher) in parked.into_iter().enumerate() {
        match acknowledged.get(&n) {
            Some(ack) => {
                let woke = tokio::time::timeout_at(woken_by.into(), watcher)
                    .await
                    .context("a written key's watcher never woke")???;
                samples.push(woke.saturating_duration_since(*ack));
            }
            None if watcher.is_finished() => early += 1,
            None => watcher.abort(),
        }
    }
    Ok(Fanout {
        wake: summarize(samples),
        cpu_percent: cpu / elapsed * 100.0,
        puts_per_sec: writes as f64 / elapsed,
        early,
    })
}

/// The server's `leaderq_server_blocked_queries` gauge.
async fn blocked_queries(http: &reqwest::Client, base: &Arc<String>) -> anyhow::Result<f64> {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    text.lines()
        .find_map(|line| {
            line.strip_prefix("leaderq_server_blocked_queries ")?
                .parse()
                .ok()
        })
        .context("the server reports no leaderq_server_blocked_queries")
}

/// User plus system CPU time of a process so far, in clock ticks (`/proc/<pid>/stat`).
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces; the fields after its closing parenthesis do not.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("unexpected /proc/<pid>/stat")?
        .1
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = |at: usize| fields.get(at).and_then(|f| f.parse::<u64>().ok());
    Ok(ticks(11).context("no utime")? + ticks(12).context("no stime")?)
}

fn clock_ticks_per_second() -> f64 {
    rustix::param::clock_ticks_per_second() as f64
}
