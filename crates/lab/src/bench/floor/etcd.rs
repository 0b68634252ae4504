//! The floor client on etcd, through its JSON gateway as the etcd backend talks to it: a
//! lease, a leader key created with it, one range over the queue, then transactions that
//! compare the leader key's `create_revision` and each task's `mod_revision`, and put the
//! marked tasks and delete the done ones, with an empty failure branch.

use anyhow::{bail, Context};
use base64::Engine as _;
use serde_json::{json, Value};

use super::{marked, timed, Counters, Floor, Listed, BATCH, LEADER_KEY, LEASE_TTL_SECS, PREFIX};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A 64-bit number as the gateway writes it (a string) or a plain JSON number.
fn number(value: &Value) -> Option<i64> {
    value
        .as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| value.as_i64())
}

async fn call(http: &reqwest::Client, url: String, body: Value) -> anyhow::Result<Value> {
    let answer = http.post(&url).json(&body).send().await?;
    if !answer.status().is_success() {
        bail!("{url}: {}", answer.text().await?);
    }
    Ok(answer.json().await?)
}

pub(super) async fn drain(endpoint: &str) -> anyhow::Result<Floor> {
    let http = reqwest::Client::new();
    let granted = call(
        &http,
        format!("{endpoint}/v3/lease/grant"),
        json!({"TTL": LEASE_TTL_SECS}),
    )
    .await?;
    let lease = number(&granted["ID"]).context("no lease ID in the answer")?;
    let won = call(
        &http,
        format!("{endpoint}/v3/kv/txn"),
        json!({
            "compare": [{"key": b64(LEADER_KEY.as_bytes()), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": b64(LEADER_KEY.as_bytes()), "value": b64(b"floor"), "lease": lease.to_string()}}],
        }),
    )
    .await?;
    if won["succeeded"].as_bool() != Some(true) {
        bail!("the floor client could not create {LEADER_KEY}");
    }
    let created = number(&won["header"]["revision"]).context("no revision")?;
    let drained = timed(run(&http, endpoint, created)).await;
    let _ = call(
        &http,
        format!("{endpoint}/v3/lease/revoke"),
        json!({"ID": lease.to_string()}),
    )
    .await;
    drained
}

async fn run(http: &reqwest::Client, endpoint: &str, created: i64) -> anyhow::Result<usize> {
    let engine = base64::engine::general_purpose::STANDARD;
    let mut end = PREFIX.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    let listed = call(
        http,
        format!("{endpoint}/v3/kv/range"),
        json!({"key": b64(PREFIX.as_bytes()), "range_end": b64(&end)}),
    )
    .await?;
    let mut tasks = Vec::new();
    for kv in listed["kvs"].as_array().into_iter().flatten() {
        let key = engine.decode(kv["key"].as_str().unwrap_or_default())?;
        let value = engine.decode(kv["value"].as_str().unwrap_or_default())?;
        tasks.push(Listed {
            key: String::from_utf8(key)?,
            version: number(&kv["mod_revision"]).context("no mod_revision")?,
            marked: marked(&value),
        });
    }
    let guard = json!({"key": b64(LEADER_KEY.as_bytes()), "target": "CREATE", "result": "EQUAL", "create_revision": created.to_string()});
    let mut done: Vec<(String, i64)> = Vec::new();
    let mut drained = 0;
    let mut batches = tasks.chunks(BATCH);
    loop {
        let batch = batches.next().unwrap_or_default();
        if batch.is_empty() && done.is_empty() {
            break;
        }
        let mut compare = vec![guard.clone()];
        let mut success = Vec::new();
        for task in batch {
            compare.push(json!({"key": b64(task.key.as_bytes()), "target": "MOD", "result": "EQUAL", "mod_revision": task.version.to_string()}));
            success.push(json!({"request_put": {"key": b64(task.key.as_bytes()), "value": b64(&task.marked)}}));
        }
        for (key, revision) in &done {
            compare.push(json!({"key": b64(key.as_bytes()), "target": "MOD", "result": "EQUAL", "mod_revision": revision.to_string()}));
            success.push(json!({"request_delete_range": {"key": b64(key.as_bytes())}}));
        }
        let answer = call(
            http,
            format!("{endpoint}/v3/kv/txn"),
            json!({"compare": compare, "success": success}),
        )
        .await?;
        if answer["succeeded"].as_bool() != Some(true) {
            bail!("the floor client's transaction failed: {answer}");
        }
        // Every put of one transaction is at its revision.
        let revision = number(&answer["header"]["revision"]).context("no revision")?;
        drained += done.len();
        done = batch
            .iter()
            .map(|task| (task.key.clone(), revision))
            .collect();
    }
    Ok(drained)
}

/// Each member's /metrics, summed: ranges (inside transactions too) served by all; puts
/// and deletes of one member (every member applies every write); CPU of all.
pub(super) async fn counters(endpoints: &str) -> Option<Counters> {
    let mut counters = Counters {
        cpu_seconds: Some(0.0),
        ..Counters::default()
    };
    for endpoint in endpoints.split(',') {
        let text = reqwest::get(format!("{endpoint}/metrics"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let value = |name: &str| -> f64 {
            text.lines()
                .filter(|line| line.split([' ', '{']).next() == Some(name))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        counters.reads += value("etcd_mvcc_range_total");
        counters.writes = counters
            .writes
            .max(value("etcd_mvcc_put_total") + value("etcd_mvcc_delete_total"));
        counters.cpu_seconds = counters
            .cpu_seconds
            .map(|cpu| cpu + value("process_cpu_seconds_total"));
    }
    Some(counters)
}
