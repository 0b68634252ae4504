//! Server measurements: durable PUTs/s, blocking-query wake latency, `?recurse` latency.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

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
