//! `leaderq chaos`: a cluster of real processes (one `leaderq server`, three
//! `leaderq consume` replicas) runs thousands of tasks while leaders are SIGKILLed, paused
//! past their TTL and the server is killed and restarted; then the run is audited.
//!
//! Each replica runs in its own process group, so a kill or pause takes its handler with it,
//! as a machine failure would. The handler appends `S`/`E` lines (task, fencing token,
//! replica, time, attempt) to a journal; replicas log JSON. The audit checks: no task lost,
//! repeats only where a replica was killed or paused mid-task, no unexplained overlap of
//! runs under different fencing tokens, no completion committed under a stale fencing
//! token (each completion logs the leader key's LockIndex its transaction saw), and the
//! longest time without a working leader.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use serde_json::{json, Value};

/// Replica settings for chaos: short TTL and lock-delay so failovers take seconds, a
/// handler time-out that turns hangs into retries.
pub(crate) const SESSION_TTL: &str = "2s";
pub(crate) const LOCK_DELAY: &str = "1s";
/// The chaos handler's time-out (in the replicas' settings below).
const HANDLER_TIMEOUT: Duration = Duration::from_secs(2);
/// A replica or server killed by the chaos is started again after this long.
const RESTART_AFTER: Duration = Duration::from_millis(500);

#[derive(Clone, Debug)]
pub struct ChaosOptions {
    pub tasks: usize,
    /// Leader SIGKILLs.
    pub kills: usize,
    /// Leader pauses (SIGSTOP for longer than the TTL, then SIGCONT).
    pub pauses: usize,
    /// Server SIGKILL-and-restarts.
    pub server_restarts: usize,
    /// Seconds between chaos events: a random pick from this range.
    pub interval: (f64, f64),
    pub seed: u64,
}

impl ChaosOptions {
    pub fn full() -> ChaosOptions {
        ChaosOptions {
            tasks: 10_000,
            kills: 6,
            pauses: 2,
            server_restarts: 2,
            interval: (2.0, 5.0),
            seed: 1,
        }
    }

    pub fn short() -> ChaosOptions {
        ChaosOptions {
            tasks: 500,
            kills: 2,
            pauses: 1,
            server_restarts: 1,
            interval: (0.3, 0.8),
            seed: 1,
        }
    }
}

/// The audit's findings.
#[derive(Debug, Default, Serialize)]
pub struct Audit {
    pub tasks: usize,
    pub completed: usize,
    pub lost: Vec<String>,
    pub dead_letters: usize,
    /// Tasks whose handler completed more than once, with the reason.
    pub repeats: BTreeMap<String, String>,
    pub unexplained_repeats: Vec<String>,
    pub overlaps: usize,
    pub unexplained_overlaps: Vec<String>,
    pub completions: usize,
    pub stale_completions: Vec<String>,
    pub max_without_leader_ms: u64,
    pub events: Vec<String>,
    pub seconds: f64,
}

impl Audit {
    pub fn passed(&self) -> bool {
        self.lost.is_empty()
            && self.unexplained_repeats.is_empty()
            && self.unexplained_overlaps.is_empty()
            && self.stale_completions.is_empty()
            && self.dead_letters == 0
    }
}

/// One chaos event, for the audit: who was hit, how, when.
#[derive(Clone, Debug)]
struct Event {
    at_ns: u128,
    replica: String,
    /// For pauses: when the replica was resumed.
    until_ns: u128,
    kind: &'static str,
}

pub(crate) fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

pub(crate) fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([format!("-{signal}"), "--".into(), format!("-{pgid}")])
        .status();
}

pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) addr: String,
}

pub(crate) fn start_server(exe: &Path, listen: &str, data_dir: &Path) -> anyhow::Result<Server> {
    let mut child = Command::new(exe)
        .args([
            "server",
            "--session-ttl-min",
            "1s",
            "--listen",
            listen,
            "--data-dir",
        ])
        .arg(data_dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start leaderq server")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("no stdout")?).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("leaderq server listening on http://")
        .context("leaderq server did not start")?
        .to_string();
    Ok(Server { child, addr })
}

pub(crate) struct Replica {
    pub(crate) name: String,
    pub(crate) child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    /// Kills the replica's whole process group, its handler included.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            signal_group(self.child.id(), "KILL");
            let _ = self.child.wait();
        }
    }
}

fn handler_script(journal: &Path, replica: &str) -> String {
    let j = journal.display();
    format!(
        "echo \"S $TASK_ID $LEADERQ_FENCING_TOKEN {replica} $(date +%s%N) $LEADERQ_ATTEMPT\" >> {j}; \
         case \"$TASK_ID\" in \
           *f) if [ \"$LEADERQ_ATTEMPT\" = 1 ]; then echo 'chaos: planned failure' >&2; exit 1; fi;; \
           *h) if [ \"$LEADERQ_ATTEMPT\" = 1 ]; then sleep 30; fi;; \
         esac; \
         echo \"E $TASK_ID $LEADERQ_FENCING_TOKEN {replica} $(date +%s%N) $LEADERQ_ATTEMPT\" >> {j}"
    )
}

pub(crate) fn start_replica(
    exe: &Path,
    dir: &Path,
    consul: &str,
    name: &str,
    journal: &Path,
) -> anyhow::Result<Replica> {
    use std::os::unix::process::CommandExt as _;
    let config = dir.join(format!("{name}.toml"));
    let command = serde_json::to_string(&["sh", "-c", &handler_script(journal, name)])?;
    std::fs::write(
        &config,
        format!(
            "[election]\nsession_ttl = \"{SESSION_TTL}\"\nlock_delay = \"{LOCK_DELAY}\"\nretry_interval = \"200ms\"\n\
             [consul]\nwait = \"5s\"\nrequest_timeout = \"3s\"\n\
             [queue]\nmax_attempts = 5\nbackoff_base = \"50ms\"\nbackoff_max = \"500ms\"\nshutdown_grace = \"5s\"\nkill_grace = \"500ms\"\n\
             [observe]\nenabled = false\n\
             [handlers.Chaos]\nkind = \"exec\"\ncommand = {command}\ntimeout = \"2s\"\n"
        ),
    )?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))?;
    let child = Command::new(exe)
        .args(["--log-format", "json", "consume", "--config"])
        .arg(&config)
        .env("CONSUL_HTTP_ADDR", consul)
        .env("LEADERQ__ELECTION__NODE_ID", name)
        .env("LEADERQ__DATA__DIR", dir.join(name))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start replica {name}"))?;
    Ok(Replica {
        name: name.to_string(),
        child,
    })
}

async fn leader_session(http: &reqwest::Client, consul: &str) -> Option<(String, String)> {
    let response = http
        .get(format!("http://{consul}/v1/kv/consumerLeader"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    let entries: Value = response.json().await.ok()?;
    let session = entries[0].get("Session")?.as_str()?.to_string();
    let value = entries[0]["Value"].as_str()?;
    let holder: Value = serde_json::from_slice(
        &base64::Engine::decode(&base64::engine::general_purpose::STANDARD, value).ok()?,
    )
    .ok()?;
    Some((holder["node"].as_str()?.to_string(), session))
}

/// Waits until a replica other than those in `not` leads; returns its name.
pub(crate) async fn wait_for_leader(
    http: &reqwest::Client,
    consul: &str,
    not: &[&str],
    limit: Duration,
) -> anyhow::Result<String> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some((node, _)) = leader_session(http, consul).await {
            if !not.contains(&node.as_str()) {
                return Ok(node);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("no new leader within {limit:?}")
}

async fn enqueue(
    http: &reqwest::Client,
    consul: &str,
    count: usize,
) -> anyhow::Result<Vec<String>> {
    let ids: Vec<String> = (0..count)
        .map(|n| {
            let suffix = if n % 97 == 5 {
                "f"
            } else if n % 331 == 7 {
                "h"
            } else {
                ""
            };
            format!("c{n:05}{suffix}")
        })
        .collect();
    let chunks: Vec<Vec<String>> = ids
        .chunks(count.div_ceil(16).max(1))
        .map(|c| c.to_vec())
        .collect();
    let mut tasks = Vec::new();
    for chunk in chunks {
        let http = http.clone();
        let consul = consul.to_string();
        tasks.push(tokio::spawn(async move {
            for id in chunk {
                let body = json!({"taskId": id, "taskTime": id[1..6].parse::<u64>().unwrap_or(0), "taskType": "Chaos"});
                let response = http
                    .put(format!("http://{consul}/v1/kv/oracleTask/{id}"))
                    .body(body.to_string())
                    .send()
                    .await?;
                if !response.status().is_success() {
                    bail!("enqueue failed: {}", response.status());
                }
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(ids)
}

async fn queue_is_empty(http: &reqwest::Client, consul: &str) -> bool {
    matches!(
        http.get(format!("http://{consul}/v1/kv/oracleTask/?keys"))
            .timeout(Duration::from_secs(2))
            .send()
            .await,
        Ok(response) if response.status() == reqwest::StatusCode::NOT_FOUND
    )
}

pub async fn run(options: ChaosOptions) -> anyhow::Result<Audit> {
    let exe = std::env::current_exe().context("cannot find the leaderq binary")?;
    let dir = std::env::temp_dir().join(format!("leaderq-chaos-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(&exe, &dir, options).await;
    if result.as_ref().is_ok_and(Audit::passed) {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("chaos: kept the run's files in {}", dir.display());
    }
    result
}

async fn run_in(exe: &Path, dir: &Path, options: ChaosOptions) -> anyhow::Result<Audit> {
    let started = Instant::now();
    let journal = dir.join("journal");
    std::fs::write(&journal, "")?;
    let server_dir = dir.join("server");
    let mut server = start_server(exe, "127.0.0.1:0", &server_dir)?;
    let consul = server.addr.clone();
    let http = reqwest::Client::new();
    eprintln!("chaos: enqueueing {} tasks", options.tasks);
    let ids = enqueue(&http, &consul, options.tasks).await?;

    let names = ["chaos-1", "chaos-2", "chaos-3"];
    let mut replicas: Vec<Replica> = Vec::new();
    for name in names {
        replicas.push(start_replica(exe, dir, &consul, name, &journal)?);
    }
    let mut events: Vec<Event> = Vec::new();
    let mut max_without_leader = Duration::ZERO;
    let mut rng = fastrand::Rng::with_seed(options.seed);
    let mut plan: Vec<&'static str> = Vec::new();
    plan.extend(std::iter::repeat_n("kill", options.kills));
    plan.extend(std::iter::repeat_n("pause", options.pauses));
    plan.extend(std::iter::repeat_n("server", options.server_restarts));
    rng.shuffle(&mut plan);
    wait_for_leader(&http, &consul, &[], Duration::from_secs(30)).await?;

    for kind in plan {
        let pause = options.interval.0 + rng.f64() * (options.interval.1 - options.interval.0);
        tokio::time::sleep(Duration::from_secs_f64(pause)).await;
        if queue_is_empty(&http, &consul).await {
            eprintln!("chaos: queue drained before every event ran");
            break;
        }
        let Some((leader, _)) = leader_session(&http, &consul).await else {
            continue;
        };
        let hit = Instant::now();
        match kind {
            "kill" => {
                let index = replicas
                    .iter()
                    .position(|r| r.name == leader)
                    .context("unknown leader")?;
                let mut replica = replicas.remove(index);
                eprintln!("chaos: SIGKILL leader {leader}");
                signal_group(replica.child.id(), "KILL");
                let _ = replica.child.wait();
                events.push(Event {
                    at_ns: now_ns(),
                    replica: leader.clone(),
                    until_ns: u128::MAX,
                    kind: "kill",
                });
                wait_for_leader(&http, &consul, &[&leader], Duration::from_secs(60)).await?;
                max_without_leader = max_without_leader.max(hit.elapsed());
                tokio::time::sleep(RESTART_AFTER).await;
                replicas.push(start_replica(exe, dir, &consul, &leader, &journal)?);
            }
            "pause" => {
                let replica = replicas
                    .iter()
                    .find(|r| r.name == leader)
                    .context("unknown leader")?;
                eprintln!("chaos: SIGSTOP leader {leader} past its TTL");
                let at_ns = now_ns();
                signal_group(replica.child.id(), "STOP");
                wait_for_leader(&http, &consul, &[&leader], Duration::from_secs(60)).await?;
                max_without_leader = max_without_leader.max(hit.elapsed());
                tokio::time::sleep(Duration::from_secs(1)).await;
                signal_group(replica.child.id(), "CONT");
                events.push(Event {
                    at_ns,
                    replica: leader.clone(),
                    until_ns: now_ns(),
                    kind: "pause",
                });
            }
            _ => {
                eprintln!("chaos: SIGKILL and restart the server");
                let _ = server.child.kill();
                let _ = server.child.wait();
                events.push(Event {
                    at_ns: now_ns(),
                    replica: "server".into(),
                    until_ns: 0,
                    kind: "server",
                });
                tokio::time::sleep(RESTART_AFTER).await;
                server = start_server(exe, &consul, &server_dir)?;
                wait_for_leader(&http, &consul, &[], Duration::from_secs(60)).await?;
            }
        }
    }

    eprintln!("chaos: waiting for the queue to drain");
    let drain_started = Instant::now();
    while !queue_is_empty(&http, &consul).await {
        if drain_started.elapsed() > Duration::from_secs(600) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let dead: usize = match http
        .get(format!("http://{consul}/v1/kv/oracleTaskDead/?keys"))
        .send()
        .await
    {
        Ok(response) if response.status().is_success() => response
            .json::<Vec<String>>()
            .await
            .map(|k| k.len())
            .unwrap_or(0),
        _ => 0,
    };
    for replica in &replicas {
        signal_group(replica.child.id(), "TERM");
    }
    for mut replica in replicas {
        let _ = replica.child.wait();
    }
    let _ = server.child.kill();
    let _ = server.child.wait();

    let mut audit = audit(dir, &journal, &ids, &events)?;
    audit.dead_letters = dead;
    audit.max_without_leader_ms = max_without_leader.as_millis() as u64;
    audit.seconds = started.elapsed().as_secs_f64();
    audit.events = events
        .iter()
        .map(|e| format!("{} {}", e.kind, e.replica))
        .collect();
    Ok(audit)
}

/// One handler run from the journal.
#[derive(Clone, Debug)]
struct RunRecord {
    token: u64,
    replica: String,
    start: u128,
    end: Option<u128>,
}

fn audit(dir: &Path, journal: &Path, ids: &[String], events: &[Event]) -> anyhow::Result<Audit> {
    let mut runs: HashMap<String, Vec<RunRecord>> = HashMap::new();
    for line in std::fs::read_to_string(journal)?.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 {
            continue;
        }
        let (id, token, replica, at) = (
            f[1].to_string(),
            f[2].parse().unwrap_or(0),
            f[3].to_string(),
            f[4].parse().unwrap_or(0),
        );
        let list = runs.entry(id).or_default();
        match f[0] {
            "S" => list.push(RunRecord {
                token,
                replica,
                start: at,
                end: None,
            }),
            "E" => {
                if let Some(run) = list
                    .iter_mut()
                    .rev()
                    .find(|r| r.replica == replica && r.token == token && r.end.is_none())
                {
                    run.end = Some(at);
                }
            }
            _ => {}
        }
    }
    let mut audit = Audit {
        tasks: ids.len(),
        ..Audit::default()
    };
    // A run with no end line ended when its replica was killed (or, paused, resumed and
    // cancelled it); otherwise it failed or timed out within the handler's time-out.
    let end_of = |run: &RunRecord| -> u128 {
        run.end.unwrap_or_else(|| {
            events
                .iter()
                .filter(|e| e.replica == run.replica && e.at_ns >= run.start)
                .map(|e| {
                    if e.kind == "pause" {
                        e.until_ns
                    } else {
                        e.at_ns
                    }
                })
                .min()
                .unwrap_or(run.start + HANDLER_TIMEOUT.as_nanos())
        })
    };
    // A run is explained as cut short if its replica was killed or paused after it started.
    let hit_during = |run: &RunRecord| {
        events.iter().any(|e| {
            e.replica == run.replica
                && e.at_ns >= run.start
                && run.end.is_none_or(|end| e.at_ns <= end + 5_000_000_000)
        })
    };
    for id in ids {
        let list = runs.get(id).cloned().unwrap_or_default();
        let completed: Vec<&RunRecord> = list.iter().filter(|r| r.end.is_some()).collect();
        if completed.is_empty() {
            audit.lost.push(id.clone());
            continue;
        }
        audit.completed += 1;
        if completed.len() > 1 {
            // The first run's completion was never recorded; that is allowed only if its
            // replica was killed or paused after the run started and before the task ran
            // again (a Consul outage is retried, never a reason).
            let (first, second) = (completed[0], completed[1]);
            let hit_before_rerun = events.iter().any(|e| {
                e.replica == first.replica && e.at_ns >= first.start && e.at_ns <= second.start
            });
            if hit_before_rerun {
                audit.repeats.insert(
                    id.clone(),
                    format!(
                        "replica {} was killed or paused after its run",
                        first.replica
                    ),
                );
            } else {
                audit.repeats.insert(id.clone(), "unexplained".into());
                audit.unexplained_repeats.push(id.clone());
            }
        }
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if a.token == b.token {
                    continue;
                }
                if a.start < end_of(b) && b.start < end_of(a) {
                    audit.overlaps += 1;
                    let older = if a.token < b.token { a } else { b };
                    if !hit_during(older) {
                        audit
                            .unexplained_overlaps
                            .push(format!("{id}: tokens {} and {}", a.token, b.token));
                    }
                }
            }
        }
    }
    // Completions: each logs the fencing token it ran under and the leader key's LockIndex
    // its committing transaction saw; they differ only if a stale leader completed a task.
    for entry in std::fs::read_dir(dir)? {
        let path: PathBuf = entry?.path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        for line in std::fs::read_to_string(&path)?.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if event["message"] != "task completed" {
                continue;
            }
            audit.completions += 1;
            let token = event["fencing_token"].as_u64().unwrap_or(0);
            let seen = event["leader_lock_index"].as_u64().unwrap_or(0);
            if token != seen {
                audit.stale_completions.push(format!(
                    "{}: fencing token {token}, leader key at commit {seen}",
                    event["task_key"].as_str().unwrap_or("?")
                ));
            }
        }
    }
    Ok(audit)
}

/// Prints the audit as a report.
pub fn print(audit: &Audit) {
    println!(
        "chaos run: {} tasks in {:.0}s; events: {}",
        audit.tasks,
        audit.seconds,
        audit.events.join(", ")
    );
    let verdict = |ok: bool| if ok { "ok" } else { "FAILED" };
    println!(
        "  tasks lost:                               {:>6}  {}",
        audit.lost.len(),
        verdict(audit.lost.is_empty())
    );
    println!(
        "  tasks dead-lettered:                      {:>6}  {}",
        audit.dead_letters,
        verdict(audit.dead_letters == 0)
    );
    println!(
        "  tasks completed more than once:           {:>6}  ({} unexplained) {}",
        audit.repeats.len(),
        audit.unexplained_repeats.len(),
        verdict(audit.unexplained_repeats.is_empty())
    );
    for (id, why) in audit.repeats.iter().take(10) {
        println!("    {id}: {why}");
    }
    println!(
        "  runs overlapping under different tokens:  {:>6}  ({} unexplained) {}",
        audit.overlaps,
        audit.unexplained_overlaps.len(),
        verdict(audit.unexplained_overlaps.is_empty())
    );
    println!(
        "  completions audited:                      {:>6}",
        audit.completions
    );
    println!(
        "  completions under a stale fencing token:  {:>6}  {}",
        audit.stale_completions.len(),
        verdict(audit.stale_completions.is_empty())
    );
    println!(
        "  longest time without a working leader:    {:>6} ms",
        audit.max_without_leader_ms
    );
    println!(
        "  verdict: {}",
        if audit.passed() {
            "all invariants hold"
        } else {
            "INVARIANT BROKEN"
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, journal: &str, log: &str) -> PathBuf {
        let path = dir.join("journal");
        std::fs::write(&path, journal).unwrap();
        std::fs::write(dir.join("r1.log"), log).unwrap();
        path
    }

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// A clean journal passes; a task with no completed run is lost.
    #[test]
    fn audit_finds_lost_tasks() {
        let dir = tempfile::tempdir().unwrap();
        let journal = write(
            dir.path(),
            "S a 1 r1 10 1\nE a 1 r1 20 1\nS b 1 r1 30 1\n",
            "",
        );
        let audit = audit(dir.path(), &journal, &ids(&["a", "b"]), &[]).unwrap();
        assert_eq!(audit.lost, ["b"]);
        assert!(!audit.passed());
        let journal = write(dir.path(), "S a 1 r1 10 1\nE a 1 r1 20 1\n", "");
        assert!(audit_ok(dir.path(), &journal, &["a"]));
    }

    fn audit_ok(dir: &Path, journal: &Path, names: &[&str]) -> bool {
        audit(dir, journal, &ids(names), &[]).unwrap().passed()
    }

    /// A repeat is explained only by a kill or pause of the first run's replica.
    #[test]
    fn audit_explains_repeats_by_events() {
        let dir = tempfile::tempdir().unwrap();
        let journal = write(
            dir.path(),
            "S a 1 r1 10 1\nE a 1 r1 20 1\nS a 2 r2 40 2\nE a 2 r2 50 2\n",
            "",
        );
        let unexplained = audit(dir.path(), &journal, &ids(&["a"]), &[]).unwrap();
        assert_eq!(unexplained.unexplained_repeats, ["a"]);
        let kill = Event {
            at_ns: 25,
            replica: "r1".into(),
            until_ns: u128::MAX,
            kind: "kill",
        };
        let explained = audit(dir.path(), &journal, &ids(&["a"]), &[kill]).unwrap();
        assert!(explained.passed(), "{explained:?}");
        assert_eq!(explained.repeats.len(), 1);
    }

    /// Overlapping runs under different tokens are flagged unless the older one was hit.
    #[test]
    fn audit_flags_unexplained_overlaps() {
        let dir = tempfile::tempdir().unwrap();
        let journal = write(
            dir.path(),
            "S a 1 r1 10 1\nS a 2 r2 15 2\nE a 2 r2 30 2\nE a 1 r1 40 1\n",
            "",
        );
        let audit = audit(dir.path(), &journal, &ids(&["a"]), &[]).unwrap();
        assert_eq!(audit.overlaps, 1);
        assert_eq!(audit.unexplained_overlaps.len(), 1);
    }

    /// A completion whose transaction saw another fencing token is a stale completion.
    #[test]
    fn audit_flags_stale_completions() {
        let dir = tempfile::tempdir().unwrap();
        let log = concat!(
            r#"{"message":"task completed","task_key":"q/a","fencing_token":3,"leader_lock_index":3}"#,
            "\n",
            r#"{"message":"task completed","task_key":"q/b","fencing_token":3,"leader_lock_index":4}"#,
            "\n"
        );
        let journal = write(
            dir.path(),
            "S a 3 r1 10 1\nE a 3 r1 20 1\nS b 3 r1 30 1\nE b 3 r1 40 1\n",
            log,
        );
        let audit = audit(dir.path(), &journal, &ids(&["a", "b"]), &[]).unwrap();
        assert_eq!(audit.completions, 2);
        assert_eq!(audit.stale_completions.len(), 1);
        assert!(!audit.passed());
    }
}
