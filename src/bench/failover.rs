//! Handover and failover over real processes: a server and two `leaderq consume` replicas
//! under a steady flow of tasks; the leader gets SIGTERM (handover) or SIGKILL of its
//! process group (failover), and the gap is the time from the old leader's last task start
//! to the new leader's first, read from the handlers' journal.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

use super::{progress, summarize, Latency, TempDir};
use crate::chaos::{self, now_ns, signal_group, start_replica, start_server, wait_for_leader};
use crate::server::duration;

/// One task every this often while the leader is hit.
const FLOW_INTERVAL: Duration = Duration::from_millis(10);
/// How long the leader runs the flow before it is hit.
const WARM_UP: Duration = Duration::from_millis(400);

/// The time from the old leader's last task start (around `hit_ns`) to the first start by
/// another replica after it, from the journal.
fn gap(journal: &Path, old: &str, hit_ns: u128) -> Option<Duration> {
    let text = std::fs::read_to_string(journal).ok()?;
    let starts: Vec<(&str, u128)> = text
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() >= 5 && f[0] == "S").then(|| Some((f[3], f[4].parse().ok()?)))?
        })
        .collect();
    // A SIGTERMed leader may still start tasks while it drains; a SIGKILLed one cannot.
    let last_old = starts
        .iter()
        .filter(|(replica, at)| *replica == old && *at <= hit_ns + 1_000_000_000)
        .map(|(_, at)| *at)
        .max()?;
    let first_new = starts
        .iter()
        .filter(|(replica, at)| *replica != old && *at > last_old)
        .map(|(_, at)| *at)
        .min()?;
    Some(Duration::from_nanos((first_new - last_old) as u64))
}

/// Runs `runs` hits of `signal` ("TERM" to the process, "KILL" to its group).
async fn measure(exe: &Path, signal: &str, runs: usize) -> anyhow::Result<Latency> {
    let dir = TempDir::new()?;
    let journal = dir.0.join("journal");
    std::fs::write(&journal, "")?;
    let server = start_server(exe, "127.0.0.1:0", &dir.0.join("server"))?;
    let consul = server.addr.clone();
    let http = reqwest::Client::new();
    let mut replicas = vec![
        start_replica(exe, &dir.0, &consul, "fo-a", &journal)?,
        start_replica(exe, &dir.0, &consul, "fo-b", &journal)?,
    ];
    let stop = tokio_util::sync::CancellationToken::new();
    let flow = {
        let (http, consul, stop) = (http.clone(), consul.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.is_cancelled() {
                let body = json!({"taskId": format!("fo{n}"), "taskTime": n, "taskType": "Chaos"});
                let _ = http
                    .put(format!("http://{consul}/v1/kv/oracleTask/fo{n:08}"))
                    .body(body.to_string())
                    .send()
                    .await;
                n += 1;
                tokio::time::sleep(FLOW_INTERVAL).await;
            }
        })
    };
    let mut gaps = Vec::new();
    let mut result = Ok(());
    for _ in 0..runs {
        let old = match wait_for_leader(&http, &consul, &[], Duration::from_secs(60)).await {
            Ok(old) => old,
            Err(err) => {
                result = Err(err);
                break;
            }
        };
        tokio::time::sleep(WARM_UP).await;
        let index = replicas
            .iter()
            .position(|r| r.name == old)
            .context("leader is not ours")?;
        let mut leaving = replicas.remove(index);
        let hit_ns = now_ns();
        let hit = Instant::now();
        match signal {
            "TERM" => {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &leaving.child.id().to_string()])
                    .status();
            }
            _ => signal_group(leaving.child.id(), "KILL"),
        }
        if let Err(err) = wait_for_leader(&http, &consul, &[&old], Duration::from_secs(60)).await {
            result = Err(err);
            break;
        }
        // Let the new leader start a few tasks, then read the gap from the journal.
        while hit.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if let Some(gap) = gap(&journal, &old, hit_ns) {
                gaps.push(gap);
                break;
            }
        }
        let _ = leaving.child.wait();
        replicas.push(start_replica(exe, &dir.0, &consul, &old, &journal)?);
    }
    stop.cancel();
    let _ = flow.await;
    for replica in &mut replicas {
        signal_group(replica.child.id(), "KILL");
        let _ = replica.child.wait();
    }
    drop(server);
    result?;
    if gaps.is_empty() {
        bail!("no {signal} gap could be measured");
    }
    Ok(summarize(gaps))
}

pub async fn section(runs: usize, report: &mut super::Report) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the leaderq binary")?;
    let ttl = duration::parse(chaos::SESSION_TTL).unwrap_or_default();
    let lock_delay = duration::parse(chaos::LOCK_DELAY).unwrap_or_default();
    progress(&format!(
        "failover: {runs} SIGTERM handovers (replicas as processes)"
    ));
    let handover = measure(&exe, "TERM", runs).await?;
    progress(&format!(
        "failover: {runs} SIGKILL failovers (TTL {}, lock-delay {})",
        duration::format(ttl),
        duration::format(lock_delay)
    ));
    let failover = measure(&exe, "KILL", runs).await?;
    let budget = ttl * 2 + lock_delay;
    let check_budget = ttl + lock_delay;
    report.row(
        format!("failover: SIGTERM handover, processes, ms p50/max ({runs}x)"),
        format!("{:.1}/{:.1}", handover.p50, handover.max),
        "<= 100",
    );
    report.row(
        format!(
            "failover: SIGKILL, TTL {} lock-delay {}, s p50/max ({runs}x)",
            duration::format(ttl),
            duration::format(lock_delay)
        ),
        format!("{:.2}/{:.2}", failover.p50 / 1000.0, failover.max / 1000.0),
        &format!(
            "<= {:.1} (2xTTL+lock-delay+1s)",
            (budget + Duration::from_secs(1)).as_secs_f64()
        ),
    );
    report.json.insert(
        "failover".into(),
        json!({
            "sigterm_handover_ms": {"p50": handover.p50, "max": handover.max, "runs": runs},
            "sigkill_failover_ms": {"p50": failover.p50, "max": failover.max, "runs": runs},
            "settings": {"session_ttl": duration::format(ttl), "lock_delay": duration::format(lock_delay), "health_check": true},
            "budget_ms": {"two_ttl_plus_lock_delay": budget.as_millis() as u64, "with_health_check_ttl_plus_lock_delay": check_budget.as_millis() as u64},
        }),
    );
    Ok(())
}
