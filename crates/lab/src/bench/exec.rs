//! The exec measurement: what supervision adds to a handler's run, and how fast one
//! `leaderq consume` drains a backlog of exec tasks.
//!
//! In this process, alternating in rounds so that the machine's load falls on all alike:
//! a bare fork and exec of `/bin/true` (`std::process::Command`, waited for), the same
//! under leaderq's supervision as a handler runs (`supervise::leader::run`, the supervisor
//! kept between runs), and under a supervisor started for each run (how leaderq ran
//! handlers before it kept them). The supervision's cost per run is its run's time less the
//! bare one's.
//!
//! Then backlogs of `/bin/true` exec tasks (250, 2,000 and 10,000 by default) on a fresh
//! coordinator each, drained by one child `leaderq consume` (and by `--baseline-exe`'s,
//! alternating, when given), timed from its election to an empty queue, as the backlog
//! section does; each rate is printed with its ratio to the bare fork's, and the last
//! backlog's to the first's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::backlog::{enqueue, measure, start_replica, Drain};
use super::consumer::{Target, TASK_TYPE};
use super::{progress, Options, Report, TempDir};
use leaderq::handler::TaskContext;
use leaderq::supervise::leader::{Job, Pool};
use leaderq::supervise::Supervision;

/// Backlogs drained when none are given.
pub const DEFAULT_EXEC_BACKLOGS: [usize; 3] = [250, 2_000, 10_000];
/// The program every run starts.
const PROGRAM: &str = "/bin/true";
/// Rounds of the per-run measurement, each running every way `RUNS_PER_ROUND` times.
const ROUNDS: usize = 7;
const RUNS_PER_ROUND: usize = 100;
/// A supervisor started per run costs milliseconds: fewer of those per round.
const FRESH_RUNS_PER_ROUND: usize = 20;
/// How many times a backlog is drained (median reported): small ones are quick and noisy.
fn drains_for(backlog: usize) -> usize {
    if backlog <= 2_000 {
        3
    } else {
        1
    }
}

/// Mean time per run of each way, in seconds, medians over the rounds.
struct PerRun {
    bare: f64,
    kept: f64,
    fresh: f64,
}

pub async fn section(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    progress(&format!(
        "exec: {PROGRAM} bare, supervised (kept), supervised (one supervisor per run), {ROUNDS} rounds"
    ));
    let per_run = per_run().await?;
    let bare_rate = 1.0 / per_run.bare;
    report.row(
        format!("exec: bare fork+exec of {PROGRAM} in-process, runs/s (ms a run)"),
        format!("{bare_rate:.0} ({:.2})", per_run.bare * 1e3),
        "",
    );
    report.row(
        "exec: supervision's cost per run above the bare fork, ms (supervisor kept)",
        format!("{:.2}", (per_run.kept - per_run.bare) * 1e3),
        "<= 1",
    );
    report.row(
        "exec: the same with a supervisor started per run (before), ms",
        format!("{:.2}", (per_run.fresh - per_run.bare) * 1e3),
        "",
    );
    let exes: Vec<(&str, PathBuf)> = {
        let mut exes = vec![("leaderq", crate::exe::leaderq()?)];
        if let Some(baseline) = &options.baseline_exe {
            exes.push(("baseline", baseline.clone()));
        }
        exes
    };
    let mut rows = Vec::new();
    for &backlog in &options.exec_backlogs {
        let mut runs: Vec<Vec<Drain>> = vec![Vec::new(); exes.len()];
        for _ in 0..drains_for(backlog) {
            for (n, (_, exe)) in exes.iter().enumerate() {
                runs[n].push(drain(&options.backend, exe, backlog).await?);
            }
        }
        for (n, drains) in runs.into_iter().enumerate() {
            rows.push((exes[n].0, median(drains)));
        }
    }
    let mut json_rows = Vec::new();
    for (name, _) in &exes {
        let mine: Vec<&Drain> = rows
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, d)| d)
            .collect();
        let first = mine.first().map_or(0.0, |d| d.rate);
        for d in &mine {
            report.row(
                format!(
                    "exec: drain {} {PROGRAM} tasks, 1 `leaderq consume` ({name}, {}), tasks/s; ÷ bare fork; ÷ first",
                    d.backlog, options.backend
                ),
                format!(
                    "{:.0}{}; {:.2}; {:.2}",
                    d.rate,
                    if d.drained < d.backlog {
                        format!(" ({} of {} in {:.0} s)", d.drained, d.backlog, d.seconds)
                    } else {
                        String::new()
                    },
                    d.rate / bare_rate,
                    if first > 0.0 { d.rate / first } else { 0.0 }
                ),
                if *name == "leaderq" {
                    ">= 0.5; >= 0.8"
                } else {
                    ""
                },
            );
            json_rows.push(json!({
                "exe": name,
                "backlog": d.backlog,
                "drained": d.drained,
                "tasks_per_sec": d.rate.round(),
                "vs_bare": (d.rate / bare_rate * 100.0).round() / 100.0,
                "vs_first": if first > 0.0 { (d.rate / first * 100.0).round() / 100.0 } else { 0.0 },
            }));
        }
    }
    report.json.insert(
        "exec".into(),
        json!({
            "backend": options.backend,
            "program": PROGRAM,
            "bare_ms": per_run.bare * 1e3,
            "supervised_ms": per_run.kept * 1e3,
            "supervised_fresh_ms": per_run.fresh * 1e3,
            "supervision_cost_ms": (per_run.kept - per_run.bare) * 1e3,
            "drains": json_rows,
        }),
    );
    Ok(())
}

/// The three ways of running `PROGRAM`, alternating in rounds.
async fn per_run() -> anyhow::Result<PerRun> {
    // leaderq's own supervisor (`leaderq __supervise`), as a replica starts it.
    let program = crate::exe::leaderq()?;
    let supervision = |pool: Pool| Supervision {
        program: program.clone(),
        kill_grace: Duration::from_secs(1),
        margin: Duration::from_millis(100),
        lock_file: None,
        pool,
    };
    let kept = supervision(Pool::default());
    // Warm up: the kept supervisor is started here, not in a round.
    supervised(&kept).await?;
    bare()?;
    let (mut bares, mut keeps, mut freshes) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let started = Instant::now();
        for _ in 0..RUNS_PER_ROUND {
            bare()?;
        }
        bares.push(started.elapsed().as_secs_f64() / RUNS_PER_ROUND as f64);
        let started = Instant::now();
        for _ in 0..RUNS_PER_ROUND {
            supervised(&kept).await?;
        }
        keeps.push(started.elapsed().as_secs_f64() / RUNS_PER_ROUND as f64);
        let started = Instant::now();
        for _ in 0..FRESH_RUNS_PER_ROUND {
            // A new pool each run: its supervisor is started for the run, and exits when
            // the pool is dropped, as one started per run did.
            supervised(&supervision(Pool::default())).await?;
        }
        freshes.push(started.elapsed().as_secs_f64() / FRESH_RUNS_PER_ROUND as f64);
    }
    Ok(PerRun {
        bare: middle(bares),
        kept: middle(keeps),
        fresh: middle(freshes),
    })
}

fn bare() -> anyhow::Result<()> {
    let status = Command::new(PROGRAM)
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("cannot run {PROGRAM}"))?;
    anyhow::ensure!(status.success(), "{PROGRAM} failed: {status}");
    Ok(())
}

async fn supervised(supervision: &Supervision) -> anyhow::Result<()> {
    let command = [PROGRAM.to_string()];
    let cancel = CancellationToken::new();
    let ended = leaderq::supervise::leader::run(
        supervision,
        Job {
            command: &command,
            env: Vec::new(),
            cwd: None,
            task_json: b"{}",
            timeout: None,
            cancel: &cancel,
            lease_deadline: TaskContext::unbounded_lease(),
            pass_stderr: false,
            keep_output: 0,
        },
    )
    .await
    .map_err(|err| anyhow::anyhow!("supervised {PROGRAM}: {err}"))?;
    anyhow::ensure!(
        ended.status.success(),
        "supervised {PROGRAM} failed: {}",
        ended.status
    );
    Ok(())
}

fn middle(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn median(mut runs: Vec<Drain>) -> Drain {
    runs.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    runs.swap_remove(runs.len() / 2)
}

/// Enqueues `backlog` tasks on a fresh coordinator and drains them with one `exe consume`
/// whose handler for the bench's taskType runs `PROGRAM`.
async fn drain(backend: &str, exe: &Path, backlog: usize) -> anyhow::Result<Drain> {
    let server = Target::start(backend)?;
    let dir = TempDir::new()?;
    progress(&format!(
        "exec: enqueueing {backlog} tasks, draining them with {}",
        exe.display()
    ));
    enqueue(&server.coord, backlog).await?;
    let config = dir.0.join("consume.toml");
    std::fs::write(
        &config,
        format!("[handlers.{TASK_TYPE}]\nkind = \"exec\"\ncommand = [\"{PROGRAM}\"]\n"),
    )
    .context("cannot write the replica's settings")?;
    let mut child = start_replica(exe, &server, &config, &dir)?;
    let measured = measure(&server, &child, backlog).await;
    let _ = child.kill();
    let _ = child.wait();
    measured.map(|(drain, _)| drain)
}
