//! The floor client on `leaderq server` (Consul's HTTP API): a session, the leader key
//! acquired with it, one `?recurse` listing, then `/v1/txn`s of `check-session` on the
//! leader key, a `cas` per task marked and a `delete-cas` per task done.

use std::collections::HashMap;

use anyhow::{bail, Context};
use base64::Engine as _;
use serde_json::{json, Value};

use super::{marked, timed, Counters, Floor, Listed, BATCH, LEADER_KEY, LEASE_TTL_SECS, PREFIX};

pub(super) async fn drain(addr: &str) -> anyhow::Result<Floor> {
    let http = reqwest::Client::new();
    let base = format!("http://{addr}");
    let created: Value = http
        .put(format!("{base}/v1/session/create"))
        .json(&json!({"Name": "leaderq-floor", "TTL": format!("{LEASE_TTL_SECS}s"), "LockDelay": "0s", "Behavior": "release"}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let session = created["ID"]
        .as_str()
        .context("no session ID in the answer")?
        .to_string();
    let acquired: bool = http
        .put(format!("{base}/v1/kv/{LEADER_KEY}?acquire={session}"))
        .body("floor")
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    if !acquired {
        bail!("the floor client could not acquire {LEADER_KEY}");
    }
    let drained = timed(run(&http, &base, &session)).await;
    let _ = http
        .put(format!("{base}/v1/session/destroy/{session}"))
        .send()
        .await;
    drained
}

async fn run(http: &reqwest::Client, base: &str, session: &str) -> anyhow::Result<usize> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let answer = http
        .get(format!("{base}/v1/kv/{PREFIX}?recurse"))
        .send()
        .await?;
    let entries: Vec<Value> = if answer.status() == reqwest::StatusCode::NOT_FOUND {
        Vec::new()
    } else {
        answer.error_for_status()?.json().await?
    };
    let mut tasks = Vec::with_capacity(entries.len());
    for entry in entries {
        let value = b64.decode(entry["Value"].as_str().unwrap_or_default())?;
        tasks.push(Listed {
            key: entry["Key"].as_str().context("no Key")?.to_string(),
            version: entry["ModifyIndex"].as_u64().context("no ModifyIndex")?,
            marked: marked(&value),
        });
    }
    let guard = json!({"KV": {"Verb": "check-session", "Key": LEADER_KEY, "Session": session}});
    let mut done: Vec<(String, u64)> = Vec::new();
    let mut drained = 0;
    let mut batches = tasks.chunks(BATCH);
    loop {
        let batch = batches.next().unwrap_or_default();
        if batch.is_empty() && done.is_empty() {
            break;
        }
        let mut ops = vec![guard.clone()];
        for task in batch {
            ops.push(json!({"KV": {"Verb": "cas", "Key": task.key, "Value": b64.encode(&task.marked), "Index": task.version}}));
        }
        for (key, index) in &done {
            ops.push(json!({"KV": {"Verb": "delete-cas", "Key": key, "Index": index}}));
        }
        let answer = http.put(format!("{base}/v1/txn")).json(&ops).send().await?;
        if !answer.status().is_success() {
            bail!(
                "the floor client's transaction failed: {}",
                answer.text().await?
            );
        }
        let results: Value = answer.json().await?;
        let indexes: HashMap<&str, u64> = results["Results"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| Some((r["KV"]["Key"].as_str()?, r["KV"]["ModifyIndex"].as_u64()?)))
            .collect();
        drained += done.len();
        done = batch
            .iter()
            .map(|task| {
                indexes
                    .get(task.key.as_str())
                    .map(|index| (task.key.clone(), *index))
                    .with_context(|| format!("no index for {} in the answer", task.key))
            })
            .collect::<anyhow::Result<_>>()?;
    }
    Ok(drained)
}

/// `leaderq server`'s HTTP requests so far, from its /metrics (which does not count its
/// own reads): a transaction counts as a write, any other request as a read; and its CPU
/// time.
pub(super) async fn counters(addr: &str) -> Option<Counters> {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let mut counters = Counters::default();
    for line in text.lines() {
        if let Some(seconds) = line.strip_prefix("process_cpu_seconds_total ") {
            counters.cpu_seconds = seconds.trim().parse().ok();
            continue;
        }
        let Some(rest) = line.strip_prefix("leaderq_server_http_requests_total{") else {
            continue;
        };
        let endpoint = rest.split("endpoint=\"").nth(1)?.split('"').next()?;
        let count: f64 = line.rsplit(' ').next()?.parse().ok()?;
        if endpoint == "Txn" {
            counters.writes += count;
        } else {
            counters.reads += count;
        }
    }
    Some(counters)
}
