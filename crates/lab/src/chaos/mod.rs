//! `leaderq-lab chaos`: a cluster of real processes (a coordinator started by the shared
//! harness: one `leaderq server`, or a ZooKeeper, Redis or etcd cluster; three `leaderq
//! consume` replicas, each reaching the coordinator through links of its own,
//! `harness::link`) runs thousands of tasks while leaders are SIGKILLed (process group, or
//! PID only, or PID only and restarted at once), paused past their lease, partitioned
//! away, hit by bursts of errors (every connection reset for one to two seconds) and by
//! answers that come late (0.4 × TTL, for three TTLs), coordinator members are killed and
//! restarted, and leadership is lost at the coordinator by an operator's hand (the leader
//! record deleted, the lease revoked) or by renewals that stall while claims still go
//! through; then the run is audited (`audit.rs`). Bursts and late answers are faults a
//! leader rides out: they move no leadership and use no attempt. Everything the driver
//! reads of the coordinator (the leader, what is left of the queue) it reads through the
//! coordinator seam, so the run is the same on every backend.
//!
//! The handler forks, as wrapper scripts do: `sh -c` starts a worker and waits for it, and
//! the worker journals its own start, heartbeats and end with its fencing token. So the
//! audit sees what the work did, not what leaderq believes it did, and a handler that
//! outlives its leader shows up as an overlap.

mod audit;
mod procs;
mod report;

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

use leaderq::coord::{Coordinator, Edit, Version};
use testkit::harness::link::{Fault, Links};
use testkit::harness::{self, Cluster as CoordCluster};

pub use audit::Audit;
use audit::Event;
use procs::signal_pid;
pub(crate) use procs::{
    now_ns, signal_group, start_replica_with, Replica, ReplicaSetup, CHAOS_SETUP, LOCK_DELAY,
    SESSION_TTL,
};
pub use report::print;

/// How late the coordinator's answers to the leader come in a "latency" event, as a share
/// of the bound within which no run is stopped and no leadership moves (2/3 TTL − kill
/// grace − TTL/10: 0.63 s with the chaos settings, about 0.3 × TTL).
const LATE_SHARE: f64 = 0.8;

/// The "latency" event's delay on every answer, and how long it lasts (three TTLs).
fn late_answers() -> anyhow::Result<(Duration, Duration)> {
    let parse = |text| leaderq::util::duration::parse(text).map_err(|why| anyhow::anyhow!(why));
    let (ttl, kill_grace) = (parse(SESSION_TTL)?, parse(procs::KILL_GRACE)?);
    let bound = (ttl * 2 / 3).saturating_sub(kill_grace + leaderq::supervise::lease_margin(ttl));
    Ok((bound.mul_f64(LATE_SHARE), ttl * 3))
}

/// A replica or server killed by the chaos is started again after this long.
const RESTART_AFTER: Duration = Duration::from_millis(500);
/// How long a hit waits for the leader to be inside a slow run, so that the hit cuts a
/// running handler rather than the gap between two.
const BUSY_WAIT: Duration = Duration::from_secs(3);

#[derive(Clone, Debug)]
pub struct ChaosOptions {
    pub tasks: usize,
    /// SIGKILLs of the leader's process group (a machine failure).
    pub kills: usize,
    /// SIGKILLs of the leader's process alone (the OOM killer, `kill -9 <pid>`).
    pub pid_kills: usize,
    /// SIGKILLs of the leader's process alone, restarted at once on the same data dir.
    pub restarts: usize,
    /// SIGSTOPs of the leader's process past its lease, then SIGCONT.
    pub pauses: usize,
    /// The leader cut off the coordinator (its links blackhole) until another replica leads.
    pub partitions: usize,
    /// Bursts of errors on the leader's links: every connection reset for one to two
    /// seconds, then healed.
    pub bursts: usize,
    /// The coordinator's answers to the leader held 0.4 × TTL, for three TTLs.
    pub latencies: usize,
    /// Coordinator member SIGKILL-and-restarts (the server, on `leaderq server`).
    pub server_restarts: usize,
    /// The leader record deleted by hand while the leader works.
    pub record_deletions: usize,
    /// The leader's lease ended by hand while it works (not on ZooKeeper: no tool does).
    pub revocations: usize,
    /// The leader's renewals alone stalled until another replica leads.
    pub renewal_stalls: usize,
    /// Every this many tasks, one works for half a second (so hits find a handler running).
    pub slow_every: usize,
    /// Seconds between chaos events: a random pick from this range.
    pub interval: (f64, f64),
    pub seed: u64,
    /// The coordinator backend (`[coordinator] backend`): "consul" runs `leaderq server`.
    pub backend: String,
}

impl ChaosOptions {
    pub fn full() -> ChaosOptions {
        ChaosOptions {
            tasks: 10_000,
            kills: 2,
            pid_kills: 2,
            restarts: 2,
            pauses: 2,
            partitions: 2,
            bursts: 2,
            latencies: 2,
            server_restarts: 2,
            record_deletions: 2,
            revocations: 2,
            renewal_stalls: 2,
            slow_every: 100,
            interval: (2.0, 5.0),
            seed: 1,
            backend: "consul".into(),
        }
    }

    pub fn short() -> ChaosOptions {
        ChaosOptions {
            tasks: 400,
            kills: 1,
            pid_kills: 1,
            restarts: 1,
            pauses: 1,
            partitions: 1,
            bursts: 1,
            latencies: 1,
            server_restarts: 1,
            record_deletions: 1,
            revocations: 1,
            renewal_stalls: 1,
            slow_every: 10,
            interval: (0.3, 0.8),
            seed: 1,
            backend: "consul".into(),
        }
    }
}

/// The leader's holder record, read through the coordinator seam; `None` when nobody
/// leads or the coordinator does not answer within 2 s.
pub(crate) async fn leader_record(coord: &dyn Coordinator) -> Option<leaderq::coord::HolderRecord> {
    let observed = tokio::time::timeout(
        Duration::from_secs(2),
        coord.observe(Version(0), Duration::ZERO),
    )
    .await;
    let (holder, _) = observed.ok()?.ok()?;
    holder.lease?;
    holder.record
}

/// The leader's node name.
pub(crate) async fn leader_node(coord: &dyn Coordinator) -> Option<String> {
    leader_record(coord).await.map(|record| record.node)
}

/// Waits until a replica other than those in `not` leads; returns its name.
pub(crate) async fn wait_for_leader(
    coord: &dyn Coordinator,
    not: &[&str],
    limit: Duration,
) -> anyhow::Result<String> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(node) = leader_node(coord).await {
            if !not.contains(&node.as_str()) {
                return Ok(node);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("no new leader within {limit:?}")
}

/// The coordinator a cluster's replicas use, as `leaderq` itself builds it from the
/// cluster's environment.
pub(crate) fn coordinator_of(cluster: &dyn CoordCluster) -> anyhow::Result<Arc<dyn Coordinator>> {
    let settings = leaderq::config::Settings::load(None, cluster.env())?;
    Ok(leaderq::service::connect::connect(&settings)?)
}

/// Creates the run's tasks (create-only writes through the seam, a batch at a time).
async fn enqueue(
    coord: &Arc<dyn Coordinator>,
    count: usize,
    slow_every: usize,
) -> anyhow::Result<Vec<String>> {
    let ids: Vec<String> = (0..count)
        .map(|n| {
            let suffix = if n % 97 == 5 {
                "f"
            } else if n % 331 == 7 {
                "h"
            } else if n % slow_every.max(1) == 3 {
                "s"
            } else {
                ""
            };
            format!("c{n:05}{suffix}")
        })
        .collect();
    let mut writers = Vec::new();
    for chunk in ids.chunks(count.div_ceil(8).max(1)) {
        let coord = coord.clone();
        let chunk = chunk.to_vec();
        writers.push(tokio::spawn(async move {
            for batch in chunk.chunks(32) {
                let edits: Vec<Edit> = batch
                    .iter()
                    .map(|id| Edit::Create {
                        key: format!("oracleTask/{id}"),
                        value: json!({"taskId": id, "taskTime": id[1..6].parse::<u64>().unwrap_or(0), "taskType": "Chaos"})
                            .to_string()
                            .into_bytes(),
                    })
                    .collect();
                match coord.edit(&edits).await? {
                    leaderq::coord::Edited::Done => {}
                    leaderq::coord::Edited::Conflict(keys) => bail!("enqueue: {keys:?} exist"),
                }
            }
            anyhow::Ok(())
        }));
    }
    for writer in writers {
        writer.await??;
    }
    Ok(ids)
}

/// How many keys are under `prefix`; `None` if the coordinator does not answer.
async fn count_under(coord: &dyn Coordinator, prefix: &str) -> Option<usize> {
    let keys = tokio::time::timeout(Duration::from_secs(2), coord.keys(prefix)).await;
    keys.ok()?.ok().map(|(keys, _)| keys.len())
}

async fn queue_is_empty(coord: &dyn Coordinator) -> bool {
    count_under(coord, "oracleTask/").await == Some(0)
}

pub async fn run(options: ChaosOptions) -> anyhow::Result<Audit> {
    let exe = crate::exe::leaderq()?;
    let dir = std::env::temp_dir().join(format!("leaderq-chaos-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    let cluster = harness::start_cluster(&options.backend, &exe, &dir.join("coordinator"))
        .map_err(|why| anyhow::anyhow!("cannot start the {} cluster: {why}", options.backend))?
        .with_context(|| format!("the {} server is not installed", options.backend))?;
    let result = run_in(&exe, &dir, cluster, options).await;
    if result.as_ref().is_ok_and(Audit::passed) {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("chaos: kept the run's files in {}", dir.display());
    }
    result
}

/// Waits (up to `BUSY_WAIT`) until the journal's newest record is a slow run of `leader`
/// under way, so the hit lands while a handler works.
async fn wait_until_busy(journal: &Path, leader: &str) {
    let started = Instant::now();
    while started.elapsed() < BUSY_WAIT {
        if last_record(journal).is_some_and(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            f.len() >= 4 && matches!(f[0], "S" | "H") && f[1].ends_with('s') && f[3] == leader
        }) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn last_record(journal: &Path) -> Option<String> {
    let mut file = std::fs::File::open(journal).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(512))).ok()?;
    let mut tail = String::new();
    file.read_to_string(&mut tail).ok()?;
    tail.lines().last().map(str::to_string)
}

/// The leader key the replicas contend for (the default `election.leader_key`).
const LEADER_KEY: &str = "consumerLeader";

/// The file whose existence stalls `replica`'s renewals.
fn stall_file(dir: &Path, replica: &str) -> std::path::PathBuf {
    dir.join(format!("{replica}.stall-renewals"))
}

/// The replicas by name, each with the environment that points it at the coordinator
/// through its own links, and how often it started.
struct Cluster<'a> {
    exe: &'a Path,
    dir: &'a Path,
    journal: &'a Path,
    replicas: Vec<Replica>,
    /// Each replica's links and the environment that goes through them.
    links: HashMap<String, (Links, Vec<(String, String)>)>,
}

impl Cluster<'_> {
    fn start(&mut self, name: &str, incarnation: u32) -> anyhow::Result<()> {
        let (_, env) = self.links.get(name).context("a replica without links")?;
        let mut env = env.clone();
        env.push((
            leaderq::leader::faults::STALL_RENEWALS_ENV.into(),
            stall_file(self.dir, name).display().to_string(),
        ));
        let replica = start_replica_with(
            self.exe,
            self.dir,
            &env,
            name,
            incarnation,
            self.journal,
            &CHAOS_SETUP,
        )?;
        self.replicas.push(replica);
        Ok(())
    }

    fn take(&mut self, name: &str) -> anyhow::Result<Replica> {
        let index = self
            .replicas
            .iter()
            .position(|r| r.name == name)
            .context("unknown leader")?;
        Ok(self.replicas.remove(index))
    }

    /// Switches `name`'s links to `fault`.
    fn fault(&self, name: &str, fault: Fault) -> anyhow::Result<()> {
        let (links, _) = self.links.get(name).context("unknown leader")?;
        links.set(fault);
        Ok(())
    }

    fn get(&self, name: &str) -> anyhow::Result<&Replica> {
        self.replicas
            .iter()
            .find(|r| r.name == name)
            .context("unknown leader")
    }
}

async fn run_in(
    exe: &Path,
    dir: &Path,
    mut coordinator: Box<dyn CoordCluster>,
    options: ChaosOptions,
) -> anyhow::Result<Audit> {
    let started = Instant::now();
    let journal = dir.join("journal");
    std::fs::write(&journal, "")?;
    let coord = coordinator_of(coordinator.as_ref())?;
    eprintln!(
        "chaos: enqueueing {} tasks on {}",
        options.tasks,
        coord.describe()
    );
    let ids = enqueue(&coord, options.tasks, options.slow_every).await?;

    let mut cluster = Cluster {
        exe,
        dir,
        journal: &journal,
        replicas: Vec::new(),
        links: HashMap::new(),
    };
    for name in ["chaos-1", "chaos-2", "chaos-3"] {
        let links = Links::start(coordinator.as_ref()).await?;
        cluster.links.insert(name.to_string(), links);
        cluster.start(name, 0)?;
    }
    let mut member_hits = 0usize;
    let mut events: Vec<Event> = Vec::new();
    let mut max_without_leader = Duration::ZERO;
    let mut rng = fastrand::Rng::with_seed(options.seed);
    let mut plan: Vec<&'static str> = Vec::new();
    plan.extend(std::iter::repeat_n("kill", options.kills));
    plan.extend(std::iter::repeat_n("kill-pid", options.pid_kills));
    plan.extend(std::iter::repeat_n("restart", options.restarts));
    plan.extend(std::iter::repeat_n("pause", options.pauses));
    plan.extend(std::iter::repeat_n("partition", options.partitions));
    plan.extend(std::iter::repeat_n("burst", options.bursts));
    plan.extend(std::iter::repeat_n("latency", options.latencies));
    plan.extend(std::iter::repeat_n("server", options.server_restarts));
    plan.extend(std::iter::repeat_n(
        "delete-record",
        options.record_deletions,
    ));
    plan.extend(std::iter::repeat_n("revoke", options.revocations));
    plan.extend(std::iter::repeat_n("stall", options.renewal_stalls));
    rng.shuffle(&mut plan);
    wait_for_leader(coord.as_ref(), &[], Duration::from_secs(30)).await?;

    for kind in plan {
        let pause = options.interval.0 + rng.f64() * (options.interval.1 - options.interval.0);
        tokio::time::sleep(Duration::from_secs_f64(pause)).await;
        if queue_is_empty(coord.as_ref()).await {
            eprintln!("chaos: queue drained before every event ran");
            break;
        }
        let Some(leader) = leader_node(coord.as_ref()).await else {
            continue;
        };
        if kind != "server" {
            wait_until_busy(&journal, &leader).await;
        }
        let hit = Instant::now();
        let at_ns = now_ns();
        let incarnation = match kind {
            "server" => 0,
            _ => cluster.get(&leader)?.incarnation,
        };
        match kind {
            "kill" | "kill-pid" | "restart" => {
                let mut replica = cluster.take(&leader)?;
                eprintln!("chaos: {kind} leader {leader}");
                match kind {
                    "kill" => signal_group(replica.child.id(), "KILL"),
                    _ => signal_pid(replica.child.id(), "KILL"),
                }
                let _ = replica.child.wait();
                if kind == "restart" {
                    cluster.start(&leader, incarnation + 1)?;
                    wait_for_leader(coord.as_ref(), &[], Duration::from_secs(60)).await?;
                } else {
                    wait_for_leader(coord.as_ref(), &[&leader], Duration::from_secs(60)).await?;
                    max_without_leader = max_without_leader.max(hit.elapsed());
                    tokio::time::sleep(RESTART_AFTER).await;
                    cluster.start(&leader, incarnation + 1)?;
                }
            }
            "delete-record" | "revoke" => {
                eprintln!("chaos: {kind} of leader {leader}'s leadership by hand");
                let done = match kind {
                    "revoke" => coordinator.revoke_leader_lease(LEADER_KEY),
                    _ => coordinator.delete_leader_record(LEADER_KEY).map(|()| true),
                }
                .map_err(|why| anyhow::anyhow!(why))?;
                if !done {
                    eprintln!(
                        "chaos: {} has no tool to {kind}; skipped",
                        coordinator.backend()
                    );
                    continue;
                }
                wait_for_leader(coord.as_ref(), &[], Duration::from_secs(60)).await?;
                max_without_leader = max_without_leader.max(hit.elapsed());
            }
            "stall" => {
                eprintln!("chaos: stall leader {leader}'s renewals until another leads");
                let stall = stall_file(dir, &leader);
                std::fs::write(&stall, "")?;
                let other =
                    wait_for_leader(coord.as_ref(), &[&leader], Duration::from_secs(60)).await;
                std::fs::remove_file(&stall)?;
                other?;
                max_without_leader = max_without_leader.max(hit.elapsed());
            }
            "pause" | "partition" => {
                let pid = cluster.get(&leader)?.child.id();
                eprintln!("chaos: {kind} leader {leader} past its lease");
                match kind {
                    "pause" => signal_pid(pid, "STOP"),
                    _ => cluster.fault(&leader, Fault::Blackhole)?,
                }
                wait_for_leader(coord.as_ref(), &[&leader], Duration::from_secs(60)).await?;
                max_without_leader = max_without_leader.max(hit.elapsed());
                tokio::time::sleep(Duration::from_secs(1)).await;
                match kind {
                    "pause" => signal_pid(pid, "CONT"),
                    _ => cluster.fault(&leader, Fault::Clear)?,
                }
            }
            "burst" => {
                let burst = Duration::from_millis(rng.u64(1000..2000));
                eprintln!("chaos: burst of errors on leader {leader}'s link for {burst:?}");
                cluster.fault(&leader, Fault::Cut)?;
                tokio::time::sleep(burst).await;
                cluster.fault(&leader, Fault::Clear)?;
            }
            "latency" => {
                let (late, lasting) = late_answers()?;
                eprintln!("chaos: leader {leader}'s answers {late:?} late for {lasting:?}");
                cluster.fault(&leader, Fault::Delay(late))?;
                tokio::time::sleep(lasting).await;
                cluster.fault(&leader, Fault::Clear)?;
            }
            _ => {
                let member = member_hits % coordinator.members();
                member_hits += 1;
                eprintln!(
                    "chaos: SIGKILL and restart {} member {member}",
                    coordinator.backend()
                );
                coordinator
                    .kill_member(member)
                    .map_err(|why| anyhow::anyhow!(why))?;
                tokio::time::sleep(RESTART_AFTER).await;
                coordinator
                    .restart_member(member)
                    .map_err(|why| anyhow::anyhow!(why))?;
                wait_for_leader(coord.as_ref(), &[], Duration::from_secs(60)).await?;
            }
        }
        events.push(Event {
            at_ns,
            replica: if kind == "server" {
                // Which coordinator process was hit: the server, or a cluster's member.
                match coordinator.members() {
                    1 => coordinator.backend().to_string(),
                    n => format!(
                        "{}-member-{}",
                        coordinator.backend(),
                        (member_hits + n - 1) % n
                    ),
                }
            } else {
                leader
            },
            incarnation,
            kind,
        });
    }

    eprintln!("chaos: waiting for the queue to drain");
    let drain_started = Instant::now();
    while !queue_is_empty(coord.as_ref()).await {
        if drain_started.elapsed() > Duration::from_secs(600) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let dead = count_under(coord.as_ref(), "oracleTaskDead/")
        .await
        .unwrap_or(0);
    for replica in &cluster.replicas {
        signal_pid(replica.child.id(), "TERM");
    }
    for mut replica in cluster.replicas.drain(..) {
        let _ = replica.child.wait();
    }
    drop(coordinator);

    let mut audit = audit::audit(dir, &journal, &ids, &events)?;
    audit.dead_letters = dead;
    audit.max_without_leader_ms = max_without_leader.as_millis() as u64;
    audit.seconds = started.elapsed().as_secs_f64();
    audit.events = events
        .iter()
        .map(|e| format!("{} {}", e.kind, e.replica))
        .collect();
    Ok(audit)
}
