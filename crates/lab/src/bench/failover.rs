//! Handover and failover over real processes: a coordinator from the shared harness (a
//! `leaderq server`, or another backend's cluster) and two `leaderq consume` replicas
//! under a steady flow of tasks; the leader gets SIGTERM (handover) or SIGKILL of its
//! process group (failover), and the gap is the time from the old leader's last task start
//! to the new leader's first, read from the handlers' journal.
//!
//! The third hit, SIGKILL and an immediate restart of the same replica on its data dir, runs
//! with the default TTL and lock-delay and no configured node id, as a user's replica
//! would. What matters there is every gap until the dead process's session and check would
//! have run out, not only the first: the longest time without a task start from the kill
//! until TTL + lock-delay + 5s after it.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

use super::{progress, summarize, Latency, TempDir};
use crate::chaos::{self, now_ns, signal_group, start_replica_with, wait_for_leader, ReplicaSetup};
use leaderq::coord::{Coordinator, Edit};
use leaderq::util::duration;
use testkit::harness;

/// One task every this often while the leader is hit.
const FLOW_INTERVAL: Duration = Duration::from_millis(10);
/// How long the leader runs the flow before it is hit.
const WARM_UP: Duration = Duration::from_millis(400);
/// Restarts measured: each watches TTL + lock-delay + 5s (30s), so fewer than the others.
const RESTART_RUNS: usize = 3;
/// SIGKILL failovers measured at the default settings: each takes about a TTL (and on
/// Consul two TTLs and the lock-delay), so fewer than the others.
const DEFAULTS_RUNS: usize = 3;
/// The settings of config/default.toml: `election.lease_ttl` and `election.lock_delay` (a
/// unit test holds them to it).
const DEFAULTS_SETUP: ReplicaSetup = ReplicaSetup {
    session_ttl: "10s",
    lock_delay: "15s",
    configured_node_id: true,
};
/// A restart may take this much longer than a handover: the new process's start, its
/// session's renewal and the leader key taken again.
const RESTART_ALLOWANCE: Duration = Duration::from_millis(100);
/// The restart runs with the defaults of config/default.toml and a generated node id.
const RESTART_SETUP: ReplicaSetup = ReplicaSetup {
    configured_node_id: false,
    ..DEFAULTS_SETUP
};
/// After a restart, gaps are looked for until TTL + lock-delay + this: by then a session
/// or check of the killed process would have run out and its lock-delay passed.
const RESTART_WATCH_MARGIN: Duration = Duration::from_secs(5);

/// How the leader is hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hit {
    /// SIGTERM to the leader process: a handover.
    Term,
    /// SIGKILL to the leader's process group: a standby takes over when the lease ends.
    Kill,
    /// SIGKILL to the leader's process group, then the same replica started again at once
    /// on its data dir.
    KillRestart,
    /// SIGKILL to the leader's process group, the replicas at the default settings: what a
    /// user's deployment sees when a leader's machine dies.
    KillAtDefaults,
}

impl Hit {
    fn setup(self) -> &'static ReplicaSetup {
        match self {
            Hit::Term | Hit::Kill => &chaos::CHAOS_SETUP,
            Hit::KillRestart => &RESTART_SETUP,
            Hit::KillAtDefaults => &DEFAULTS_SETUP,
        }
    }
}

/// Task starts in the journal: (replica, time in ns since the epoch).
fn starts(journal: &Path) -> Option<Vec<(String, u128)>> {
    let text = std::fs::read_to_string(journal).ok()?;
    Some(
        text.lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                (f.len() >= 5 && f[0] == "S")
                    .then(|| Some((f[3].to_string(), f[4].parse().ok()?)))?
            })
            .collect(),
    )
}

/// The longest time without a task start from the last start at or before `hit_ns` until
/// `until_ns`; the time from the last start to `until_ns` counts if nothing started since.
fn longest_gap(journal: &Path, hit_ns: u128, until_ns: u128) -> Option<Duration> {
    let mut times: Vec<u128> = starts(journal)?.into_iter().map(|(_, at)| at).collect();
    times.sort_unstable();
    let first = times.iter().rposition(|at| *at <= hit_ns)?;
    let mut window: Vec<u128> = times[first..]
        .iter()
        .copied()
        .filter(|at| *at <= until_ns)
        .collect();
    window.push(until_ns);
    let longest = window.windows(2).map(|w| w[1] - w[0]).max()?;
    Some(Duration::from_nanos(longest as u64))
}

/// The pid in the leader's holder record, if leadership is held.
async fn leader_pid(coord: &dyn Coordinator) -> Option<u32> {
    chaos::leader_record(coord).await.map(|record| record.pid)
}

/// Waits until one of `replicas` leads; its index.
async fn wait_for_leading_replica(
    coord: &dyn Coordinator,
    replicas: &[chaos::Replica],
    limit: Duration,
) -> anyhow::Result<usize> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(pid) = leader_pid(coord).await {
            if let Some(index) = replicas.iter().position(|r| r.child.id() == pid) {
                return Ok(index);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("none of the replicas leads within {limit:?}")
}

/// The time from the old leader's last task start (around `hit_ns`) to the first start by
/// another replica after it, from the journal.
fn gap(journal: &Path, old: &str, hit_ns: u128) -> Option<Duration> {
    let starts = starts(journal)?;
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

/// Runs `runs` hits of the leader: the gaps in task starts, and after a SIGKILL, how long
/// until another replica led.
async fn measure(
    exe: &Path,
    backend: &str,
    hit: Hit,
    runs: usize,
) -> anyhow::Result<(Latency, Vec<Duration>)> {
    let dir = TempDir::new()?;
    let journal = dir.0.join("journal");
    std::fs::write(&journal, "")?;
    let server = harness::start_cluster(backend, exe, &dir.0.join("coordinator"))
        .map_err(|why| anyhow::anyhow!("cannot start the {backend} cluster: {why}"))?
        .with_context(|| format!("the {backend} server is not installed"))?;
    let coord = chaos::coordinator_of(server.as_ref())?;
    let env = server.env();
    let setup = hit.setup();
    let mut replicas = vec![
        start_replica_with(exe, &dir.0, &env, "fo-a", 0, &journal, setup)?,
        start_replica_with(exe, &dir.0, &env, "fo-b", 0, &journal, setup)?,
    ];
    let stop = tokio_util::sync::CancellationToken::new();
    let flow = {
        let (coord, stop) = (coord.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.is_cancelled() {
                let body = json!({"taskId": format!("fo{n}"), "taskTime": n, "taskType": "Chaos"});
                let create = [Edit::Create {
                    key: format!("oracleTask/fo{n:08}"),
                    value: body.to_string().into_bytes(),
                }];
                let _ = coord.edit(&create).await;
                n += 1;
                tokio::time::sleep(FLOW_INTERVAL).await;
            }
        })
    };
    let mut gaps = Vec::new();
    let mut elections = Vec::new();
    let mut result = Ok(());
    for _ in 0..runs {
        let index = match wait_for_leading_replica(
            coord.as_ref(),
            &replicas,
            Duration::from_secs(60),
        )
        .await
        {
            Ok(index) => index,
            Err(err) => {
                result = Err(err);
                break;
            }
        };
        tokio::time::sleep(WARM_UP).await;
        let mut leaving = replicas.remove(index);
        let old = leaving.name.clone();
        let hit_ns = now_ns();
        let hit_at = Instant::now();
        match hit {
            Hit::Term => {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &leaving.child.id().to_string()])
                    .status();
            }
            Hit::Kill | Hit::KillRestart | Hit::KillAtDefaults => {
                signal_group(leaving.child.id(), "KILL")
            }
        }
        if hit == Hit::KillRestart {
            let _ = leaving.child.wait();
            replicas.push(start_replica_with(
                exe, &dir.0, &env, &old, 0, &journal, setup,
            )?);
            let ttl = duration::parse(setup.session_ttl).unwrap_or_default();
            let lock_delay = duration::parse(setup.lock_delay).unwrap_or_default();
            let watch = ttl + lock_delay + RESTART_WATCH_MARGIN;
            tokio::time::sleep(watch.saturating_sub(hit_at.elapsed())).await;
            match longest_gap(&journal, hit_ns, hit_ns + watch.as_nanos()) {
                Some(gap) => gaps.push(gap),
                None => {
                    result = Err(anyhow::anyhow!("no task started before the kill"));
                    break;
                }
            }
            continue;
        }
        if let Err(err) = wait_for_leader(coord.as_ref(), &[&old], Duration::from_secs(60)).await {
            result = Err(err);
            break;
        }
        elections.push(hit_at.elapsed());
        // Let the new leader start a few tasks, then read the gap from the journal.
        while hit_at.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if let Some(gap) = gap(&journal, &old, hit_ns) {
                gaps.push(gap);
                break;
            }
        }
        let _ = leaving.child.wait();
        replicas.push(start_replica_with(
            exe, &dir.0, &env, &old, 0, &journal, setup,
        )?);
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
        bail!("no {hit:?} gap could be measured");
    }
    Ok((summarize(gaps), elections))
}

pub async fn section(runs: usize, backend: &str, report: &mut super::Report) -> anyhow::Result<()> {
    let exe = crate::exe::leaderq()?;
    let ttl = duration::parse(chaos::SESSION_TTL).unwrap_or_default();
    let lock_delay = duration::parse(chaos::LOCK_DELAY).unwrap_or_default();
    progress(&format!(
        "failover: {runs} SIGTERM handovers (replicas as processes)"
    ));
    let (handover, _) = measure(&exe, backend, Hit::Term, runs).await?;
    progress(&format!(
        "failover: {runs} SIGKILL failovers (TTL {}, lock-delay {})",
        duration::format(ttl),
        duration::format(lock_delay)
    ));
    let (failover, _) = measure(&exe, backend, Hit::Kill, runs).await?;
    let restart_runs = runs.min(RESTART_RUNS);
    let restart_ttl = duration::parse(RESTART_SETUP.session_ttl).unwrap_or_default();
    let restart_lock_delay = duration::parse(RESTART_SETUP.lock_delay).unwrap_or_default();
    progress(&format!(
        "failover: {restart_runs} SIGKILLs + immediate restarts (TTL {}, lock-delay {}, about {} s each)",
        RESTART_SETUP.session_ttl,
        RESTART_SETUP.lock_delay,
        (restart_ttl + restart_lock_delay + RESTART_WATCH_MARGIN).as_secs() + 1
    ));
    let (restart, _) = measure(&exe, backend, Hit::KillRestart, restart_runs).await?;
    progress(&format!(
        "failover: {DEFAULTS_RUNS} SIGKILL failovers at the default settings (TTL {}, lock-delay {}, Consul only)",
        DEFAULTS_SETUP.session_ttl, DEFAULTS_SETUP.lock_delay
    ));
    let (at_defaults, elected) = measure(&exe, backend, Hit::KillAtDefaults, DEFAULTS_RUNS).await?;
    let elected = summarize(elected);
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
    let restart_budget = handover.max + RESTART_ALLOWANCE.as_secs_f64() * 1000.0;
    report.row(
        format!(
            "failover: SIGKILL + immediate restart, TTL {} lock-delay {}, longest gap ms p50/max ({restart_runs}x)",
            RESTART_SETUP.session_ttl, RESTART_SETUP.lock_delay
        ),
        format!("{:.1}/{:.1}", restart.p50, restart.max),
        &format!(
            "<= {restart_budget:.0} (SIGTERM max + {} ms)",
            RESTART_ALLOWANCE.as_millis()
        ),
    );
    report.row(
        format!(
            "failover: SIGKILL at the default settings, TTL {} (lock-delay {} on Consul), another replica leads after, s p50/max ({DEFAULTS_RUNS}x)",
            DEFAULTS_SETUP.session_ttl, DEFAULTS_SETUP.lock_delay
        ),
        format!("{:.2}/{:.2}", elected.p50 / 1000.0, elected.max / 1000.0),
        peer_at_defaults(backend),
    );
    report.row(
        format!(
            "failover: SIGKILL at the default settings, the next task starts after (the dead leader's task is requeued a TTL after the new leader sees it), s p50/max ({DEFAULTS_RUNS}x)"
        ),
        format!(
            "{:.2}/{:.2}",
            at_defaults.p50 / 1000.0,
            at_defaults.max / 1000.0
        ),
        "",
    );
    report.json.insert(
        "failover".into(),
        json!({
            "sigterm_handover_ms": {"p50": handover.p50, "max": handover.max, "runs": runs},
            "sigkill_failover_ms": {"p50": failover.p50, "max": failover.max, "runs": runs},
            "sigkill_at_defaults_new_leader_ms": {"p50": elected.p50, "max": elected.max, "runs": DEFAULTS_RUNS},
            "sigkill_at_defaults_ms": {"p50": at_defaults.p50, "max": at_defaults.max, "runs": DEFAULTS_RUNS, "lease_ttl": DEFAULTS_SETUP.session_ttl, "lock_delay": DEFAULTS_SETUP.lock_delay},
            "sigkill_restart_longest_gap_ms": {"p50": restart.p50, "max": restart.max, "runs": restart_runs, "session_ttl": RESTART_SETUP.session_ttl, "lock_delay": RESTART_SETUP.lock_delay, "budget_ms": restart_budget},
            "settings": {"session_ttl": duration::format(ttl), "lock_delay": duration::format(lock_delay), "health_check": true},
            "budget_ms": {"two_ttl_plus_lock_delay": budget.as_millis() as u64, "with_health_check_ttl_plus_lock_delay": check_budget.as_millis() as u64},
        }),
    );
    Ok(())
}

/// What a peer's leader election takes after a SIGKILL at its own defaults, the bound for
/// leaderq's at ours: OpenStack tooz, measured beside leaderq (ZooKeeper: a 10 s session;
/// Redis and etcd: a 30 s lease). Consul has no peer figure here.
fn peer_at_defaults(backend: &str) -> &'static str {
    match backend {
        "zookeeper" => "<= 10.4 (tooz, session 10 s)",
        "redis" | "etcd" => "<= 30.0 (tooz, lease 30 s)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The failover "at the default settings" runs with what config/default.toml says.
    #[test]
    fn the_defaults_setup_is_the_defaults() {
        let settings =
            leaderq::config::Settings::load(None, leaderq::config::Env::new()).expect("defaults");
        assert_eq!(
            duration::parse(DEFAULTS_SETUP.session_ttl),
            Ok(settings.election.lease_ttl)
        );
        assert_eq!(
            duration::parse(DEFAULTS_SETUP.lock_delay),
            Ok(settings.election.lock_delay)
        );
    }

    /// The longest gap runs from the last start before the hit through every later start
    /// to the end of the watch, so an outage long after a quick restart is not missed.
    #[test]
    fn longest_gap_covers_the_whole_watch() {
        let temp = tempfile::tempdir().unwrap();
        let journal = temp.path().join("journal");
        let line = |at: u128| format!("S t 1 fo-a {at} 1\n");
        let text: String = [100, 990, 1_010, 1_020, 1_500, 1_600].map(line).concat();
        std::fs::write(&journal, text + "E t 1 fo-a 5000 1\n").unwrap();
        let ns = Duration::from_nanos;
        // The kill at 1,000: 990 → 1,010 → 1,020 → 1,500 (the longest) → 1,600 → 1,700.
        assert_eq!(longest_gap(&journal, 1_000, 1_700), Some(ns(480)));
        // Nothing started after 1,600 until the end of a longer watch.
        assert_eq!(longest_gap(&journal, 1_000, 3_000), Some(ns(1_400)));
        assert_eq!(longest_gap(&journal, 100, 3_000), Some(ns(1_400)));
        // No start before the hit: nothing to measure from.
        assert_eq!(longest_gap(&journal, 50, 3_000), None);
    }
}
