//! `leaderq run` takeover: two `leaderq run` processes on the `--backend` cluster, each
//! running a command that journals its start; the leading one gets SIGTERM (a handover:
//! the command stops, leadership is given up) or SIGKILL (the session must end first), and
//! the takeover is the time from the signal to the other command's start.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

use super::{progress, summarize, Latency, Report, TempDir};
use testkit::harness::{self, parent_of, signal_pid};

/// The replicas' TTL and lock-delay: the chaos settings, so the figures compare.
const SESSION_TTL: &str = crate::chaos::SESSION_TTL;
const LOCK_DELAY: &str = crate::chaos::LOCK_DELAY;

const SCRIPT: &str =
    r#"echo "$(date +%s%N) $LEADERQ_FENCING_TOKEN $PPID" >> "$JOURNAL"; exec sleep 1000"#;

fn start(exe: &Path, dir: &Path, env: &[(String, String)], n: u32) -> anyhow::Result<Child> {
    Command::new(exe)
        .args(["run", "--name", "bench", "--data-dir"])
        .arg(dir.join(format!("r{n}")))
        .args(["--kill-grace", "200ms", "--pass-env", "JOURNAL", "--"])
        .args(["sh", "-c", SCRIPT])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("LEADERQ__ELECTION__LEASE_TTL", SESSION_TTL)
        .env("LEADERQ__ELECTION__LOCK_DELAY", LOCK_DELAY)
        .env("LEADERQ__ELECTION__RETRY_INTERVAL", "100ms")
        .env("JOURNAL", dir.join("journal"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start leaderq run")
}

/// The journal's starts: (ns since the epoch, supervisor pid).
fn starts(dir: &Path) -> Vec<(u128, u32)> {
    std::fs::read_to_string(dir.join("journal"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Some((f.first()?.parse().ok()?, f.get(2)?.parse().ok()?))
        })
        .collect()
}

async fn wait_for_starts(dir: &Path, count: usize) -> anyhow::Result<Vec<(u128, u32)>> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        let seen = starts(dir);
        if seen.len() >= count {
            return Ok(seen);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("the command did not start within 60 s")
}

/// `runs` takeovers after `signal` to the leading `leaderq run`.
async fn measure(backend: &str, signal: &str, runs: usize) -> anyhow::Result<Latency> {
    let exe = crate::exe::leaderq()?;
    let dir = TempDir::new()?;
    let cluster = harness::start_cluster(backend, &exe, &dir.0.join("coordinator"))
        .map_err(|why| anyhow::anyhow!("cannot start the {backend} cluster: {why}"))?
        .with_context(|| format!("the {backend} server is not installed"))?;
    let env = cluster.env();
    let mut replicas = vec![start(&exe, &dir.0, &env, 0)?, start(&exe, &dir.0, &env, 1)?];
    let mut gaps = Vec::new();
    for round in 0..runs {
        let seen = wait_for_starts(&dir.0, round + 1).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let supervisor = seen[round].1;
        let leader_pid = parent_of(supervisor).context("the command's supervisor is gone")?;
        let leader = replicas
            .iter()
            .position(|r| r.id() == leader_pid)
            .context("the command does not run under a bench replica")?;
        let hit = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        signal_pid(leader_pid, signal);
        let seen = wait_for_starts(&dir.0, round + 2).await?;
        gaps.push(Duration::from_nanos(
            seen[round + 1].0.saturating_sub(hit) as u64
        ));
        let mut old = replicas.remove(leader);
        let _ = old.wait();
        replicas.push(start(&exe, &dir.0, &env, round as u32 + 2)?);
    }
    for mut replica in replicas {
        let _ = replica.kill();
        let _ = replica.wait();
    }
    drop(cluster);
    Ok(summarize(gaps))
}

pub async fn section(runs: usize, backend: &str, report: &mut Report) -> anyhow::Result<()> {
    progress(&format!(
        "run: {runs} SIGTERM and {runs} SIGKILL takeovers of `leaderq run` on {backend}"
    ));
    let term = measure(backend, "TERM", runs).await?;
    let kill = measure(backend, "KILL", runs).await?;
    report.row(
        format!("run: takeover after SIGTERM of the leading `leaderq run`, ms p50/max ({runs}x)"),
        format!("{:.1}/{:.1}", term.p50, term.max),
        "<= 100 (`consul lock`: lock-delay, 15 s)",
    );
    report.row(
        format!("run: takeover after SIGKILL, TTL {SESSION_TTL} lock-delay {LOCK_DELAY}, s p50/max ({runs}x)"),
        format!("{:.2}/{:.2}", kill.p50 / 1000.0, kill.max / 1000.0),
        "<= 2xTTL+lock-delay+1s (`consul lock`, defaults: 30-45 s)",
    );
    report.json.insert(
        "run".into(),
        json!({
            "backend": backend,
            "sigterm_takeover_ms": {"p50": term.p50, "max": term.max, "runs": runs},
            "sigkill_takeover_ms": {"p50": kill.p50, "max": kill.max, "runs": runs},
            "settings": {"session_ttl": SESSION_TTL, "lock_delay": LOCK_DELAY},
        }),
    );
    Ok(())
}
