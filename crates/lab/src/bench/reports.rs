//! What a run's reports and kept output cost: the two figures the operator pays for seeing
//! how far a long task got and what it printed.
//!
//! - **A checkpoint write**: the write the leader makes while a run goes on to record its
//!   latest progress and checkpoint in the task (`TaskOp::Claim` at the claim's current
//!   version, guarded by the leadership; `queue/progress.rs`), made here one after the
//!   other on one claimed task, each at the version the last one answered, as the recorder
//!   makes them. Its latency is what a checkpoint waits before the next may go (a handler
//!   checkpointing faster is coalesced to the latest); its rate, the most one run can
//!   cost the coordinator.
//! - **Kept output**: backlogs of exec tasks drained by one `leaderq consume`, a shell that
//!   prints nothing beside the same shell printing 1 KiB and then 64 KiB (the default
//!   `output_limit`, so a full tail is kept) on each of stdout and stderr, alternating; the
//!   cost per run is its drain's time per task less the quiet one's.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

use super::backlog::{enqueue, measure, start_replica, Drain};
use super::consumer::{Target, TASK_TYPE};
use super::{progress, summarize, Options, Report, TempDir};
use leaderq::coord::{Campaign, HolderRecord, LeaseSpec, TaskOp, Version, Written};

/// Report writes timed on the claimed task.
const WRITES: usize = 2_000;
/// Exec tasks in each kept-output drain, and how many times each drain runs (median).
const OUTPUT_TASKS: usize = 500;
const OUTPUT_ROUNDS: usize = 3;
/// What each run prints, per stream: nothing, a line's worth, the default cap.
const PRINTS: [usize; 3] = [0, 1024, 64 * 1024];

pub async fn section(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let writes = report_writes(&options.backend).await?;
    report.row(
        format!(
            "reports: checkpoint write ({}), ms p50/p99; writes/s one at a time",
            options.backend
        ),
        format!(
            "{:.2}/{:.2}; {:.0}",
            writes.latency.p50, writes.latency.p99, writes.rate
        ),
        "",
    );
    let mut drains: Vec<Vec<Drain>> = vec![Vec::new(); PRINTS.len()];
    for _ in 0..OUTPUT_ROUNDS {
        for (n, bytes) in PRINTS.iter().enumerate() {
            drains[n].push(output_drain(&options.backend, *bytes).await?);
        }
    }
    let medians: Vec<Drain> = drains.into_iter().map(median).collect();
    let quiet = medians[0].rate;
    let mut rows = Vec::new();
    for (bytes, drain) in PRINTS.iter().zip(&medians) {
        let cost_ms = if drain.rate > 0.0 && quiet > 0.0 {
            (1.0 / drain.rate - 1.0 / quiet) * 1e3
        } else {
            0.0
        };
        report.row(
            format!(
                "reports: drain {OUTPUT_TASKS} exec tasks printing {} KiB per stream ({}), tasks/s; ms a run over quiet",
                bytes / 1024,
                options.backend
            ),
            format!("{:.0}; {cost_ms:+.2}", drain.rate),
            "",
        );
        rows.push(json!({
            "bytes_per_stream": bytes,
            "tasks_per_sec": drain.rate.round(),
            "ms_per_run_over_quiet": (cost_ms * 100.0).round() / 100.0,
        }));
    }
    report.json.insert(
        "reports".into(),
        json!({
            "backend": options.backend,
            "checkpoint_write_ms": {"p50": writes.latency.p50, "p99": writes.latency.p99},
            "checkpoint_writes_per_sec": writes.rate.round(),
            "checkpoint_value_bytes": writes.value_bytes,
            "output_drains": rows,
        }),
    );
    Ok(())
}

struct Writes {
    latency: super::Latency,
    rate: f64,
    value_bytes: usize,
}

/// Leads a fresh coordinator, claims one task and times [`WRITES`] report writes on it.
async fn report_writes(backend: &str) -> anyhow::Result<Writes> {
    progress(&format!(
        "reports: {WRITES} checkpoint writes on one claimed task ({backend})"
    ));
    let server = Target::start(backend)?;
    let coord = &server.coord;
    let grant = coord
        .open_lease(&LeaseSpec {
            node_id: "bench-reports".into(),
            // Under ZooKeeper's usual maxSessionTimeout; the writes take seconds.
            ttl: Duration::from_secs(60),
            takeover_delay: Duration::ZERO,
            previous: None,
        })
        .await
        .context("cannot open a lease")?;
    let record = HolderRecord {
        node: "bench-reports".into(),
        host: "bench".into(),
        pid: std::process::id(),
        session: String::new(),
        since: String::new(),
        floor: None,
    };
    let leadership = match coord.campaign(&grant.lease, &record).await? {
        Campaign::Won(leadership) => leadership,
        other => anyhow::bail!("the bench's campaign on a fresh coordinator heard {other:?}"),
    };
    enqueue(coord, 1).await?;
    let (tasks, _) = coord
        .list("oracleTask/", Version(0), Duration::ZERO)
        .await?;
    let task = tasks
        .into_iter()
        .next()
        .context("the enqueued task is not listed")?;
    let Value::Object(mut value) = serde_json::from_slice(&task.value)? else {
        anyhow::bail!("the enqueued task is not a JSON object");
    };
    value.insert("taskTaken".into(), json!(true));
    let mut version = task.version;
    let mut samples = Vec::with_capacity(WRITES);
    let mut value_bytes = 0;
    let started = Instant::now();
    for n in 0..WRITES {
        // A checkpoint as a resumable job keeps one: where it got, and a cursor.
        let fields = leaderq::task::progress::fields(
            Some((n as f64 / WRITES as f64, Some("copying rows"))),
            Some(&json!({"rows": n * 1000, "cursor": format!("ts_{n:08}")})),
        );
        for (name, field) in fields {
            value.insert(name.to_string(), field);
        }
        let bytes = serde_json::to_vec(&value)?;
        value_bytes = bytes.len();
        let ops = [TaskOp::Claim {
            key: task.key.clone(),
            version,
            value: bytes,
        }];
        let sent = Instant::now();
        let written = coord.write(&leadership, &ops).await?;
        samples.push(sent.elapsed());
        let Written::Done { versions, .. } = written else {
            anyhow::bail!("a report write answered {written:?}");
        };
        version = versions
            .iter()
            .find(|(key, _)| *key == task.key)
            .map(|(_, v)| *v)
            .context("a report write answered no version for its task")?;
    }
    let rate = WRITES as f64 / started.elapsed().as_secs_f64();
    Ok(Writes {
        latency: summarize(samples),
        rate,
        value_bytes,
    })
}

/// Drains [`OUTPUT_TASKS`] exec tasks whose handler prints `bytes` on each stream.
async fn output_drain(backend: &str, bytes: usize) -> anyhow::Result<Drain> {
    let server = Target::start(backend)?;
    let dir = TempDir::new()?;
    progress(&format!(
        "reports: {OUTPUT_TASKS} exec tasks printing {bytes} bytes per stream ({backend})"
    ));
    enqueue(&server.coord, OUTPUT_TASKS).await?;
    let script = if bytes == 0 {
        ":".to_string()
    } else {
        format!("printf '%{bytes}s' o; printf '%{bytes}s' e >&2")
    };
    let config = dir.0.join("consume.toml");
    std::fs::write(&config, handler_config(&script))
        .context("cannot write the replica's settings")?;
    let exe = crate::exe::leaderq()?;
    drain_with(&server, &exe, &config, &dir).await
}

fn handler_config(script: &str) -> String {
    let command = serde_json::to_string(&["/bin/sh", "-c", script]).unwrap_or_default();
    format!("[handlers.{TASK_TYPE}]\nkind = \"exec\"\ncommand = {command}\n")
}

async fn drain_with(
    server: &Target,
    exe: &Path,
    config: &Path,
    dir: &TempDir,
) -> anyhow::Result<Drain> {
    let mut child = start_replica(exe, server, config, dir)?;
    let measured = measure(server, &child, OUTPUT_TASKS).await;
    let _ = child.kill();
    let _ = child.wait();
    measured.map(|(drain, _)| drain)
}

fn median(mut runs: Vec<Drain>) -> Drain {
    runs.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    runs.swap_remove(runs.len() / 2)
}
