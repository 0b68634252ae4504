//! Shards (`election.shards`): what splitting the queue buys and what it costs.
//!
//! - Throughput: 100 ms handlers that sleep (no exec, no CPU: what counts is the slots),
//!   `queue.concurrency = 8` per replica, tasks over 64 groups; with one shard and one
//!   replica (today's deployment), then 6 shards with 1, 2 and 3 in-process replicas, each
//!   drain started once the replicas share the shards evenly. The ideal is R × 80 tasks/s.
//! - Failover: the time from a SIGKILL of a leading replica's process group until another
//!   leads, at the chaos setup's TTL and lock-delay: the single leader (two replicas, one
//!   shard) against each shard the killed replica led (three replicas, six shards).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::consumer::{settings, Target};
use super::groups::Sleeper;
use super::{progress, summarize, Options, Report, TempDir};
use crate::chaos::{self, signal_group, start_replica_with};
use leaderq::coord::{Coordinator, Edit, Edited, Version};
use leaderq::handler::Registry;

const TASK_TYPE: &str = "BenchShard";
/// What each run takes: the groups' bench's handler time, whose rate it measures with.
const HANDLER_TIME: Duration = super::groups::HANDLER_TIME;
const CONCURRENCY: usize = 8;
const SHARDS: u32 = 6;
const GROUPS: usize = 64;
/// Tasks per replica: about two seconds of runs at the ideal rate.
const TASKS_PER_REPLICA: usize = 160;
const LIMIT: Duration = Duration::from_secs(120);
/// Failovers measured per setup.
const FAILOVERS: usize = 3;

/// The shards each live replica leads, by node.
async fn led(coord: &dyn Coordinator, leader_key: &str) -> BTreeMap<String, usize> {
    let prefix = leaderq::leader::replicas::prefix(leader_key);
    let Ok((stored, _)) = coord.list(&prefix, Version(0), Duration::ZERO).await else {
        return BTreeMap::new();
    };
    leaderq::leader::replicas::view(&stored, chrono::Utc::now())
        .into_iter()
        .filter(|view| view.status != "gone")
        .map(|view| (view.record.node, view.record.led_shards.len()))
        .collect()
}

/// Waits until `replicas` replicas share `shards` shards evenly.
async fn wait_for_balance(
    coord: &dyn Coordinator,
    leader_key: &str,
    shards: u32,
    replicas: usize,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let even = shards as usize / replicas;
    while started.elapsed() < LIMIT {
        let led = led(coord, leader_key).await;
        if led.len() == replicas && led.values().all(|count| *count == even) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{replicas} replicas did not share {shards} shards evenly within {LIMIT:?}")
}

/// Drain rate (tasks/s, first run's start to last run's end) of `replicas` in-process
/// replicas with `shards` shards.
async fn drain(backend: &str, shards: u32, replicas: usize) -> anyhow::Result<(usize, f64)> {
    let target = Target::start(backend)?;
    let dir = TempDir::new()?;
    let (ended_tx, mut ended) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let mut running = Vec::new();
    let mut leader_key = String::new();
    for n in 0..replicas {
        let mut settings = settings(&target, &format!("shard-{n}"), &dir)?;
        settings.queue.concurrency = CONCURRENCY;
        settings.election.shards = shards;
        leader_key = settings.election.leader_key.clone();
        let mut registry = Registry::default();
        registry.register(TASK_TYPE, Sleeper(ended_tx.clone()));
        let token = stop.clone();
        running.push(tokio::spawn(async move {
            if let Err(err) = leaderq::service::consume::run(settings, registry, token).await {
                tracing::error!(error = %err, "bench replica failed");
            }
        }));
    }
    if shards > 1 {
        wait_for_balance(target.coord.as_ref(), &leader_key, shards, replicas).await?;
    }
    let count = TASKS_PER_REPLICA * replicas;
    let tasks: Vec<Edit> = (0..count)
        .map(|n| Edit::Create {
            key: format!("oracleTask/s{n:05}"),
            value: json!({"taskId": format!("s{n:05}"), "taskTime": 1000 + n, "taskType": TASK_TYPE, "taskGroup": format!("group-{}", n % GROUPS)})
                .to_string()
                .into_bytes(),
        })
        .collect();
    for chunk in tasks.chunks(32) {
        if let Edited::Conflict(keys) = target.coord.edit(chunk).await? {
            bail!("enqueue: {keys:?} exist");
        }
    }
    let timed = super::groups::ends(&mut ended, count).await;
    stop.cancel();
    for replica in running {
        let _ = replica.await;
    }
    timed
}

/// The coordinator of the cluster's replicas, electing on `leader_key`.
fn coordinator_on(
    env: &[(String, String)],
    leader_key: &str,
) -> anyhow::Result<std::sync::Arc<dyn Coordinator>> {
    let mut env = env.to_vec();
    env.push(("LEADERQ__ELECTION__LEADER_KEY".into(), leader_key.into()));
    let settings = leaderq::config::Settings::load(None, env)?;
    Ok(leaderq::service::connect::connect(&settings)?)
}

/// The node leading the election `coord` observes, if any.
async fn holder(coord: &dyn Coordinator) -> Option<String> {
    chaos::leader_record(coord).await.map(|record| record.node)
}

/// Failover times: SIGKILL of a leading replica's process group until each election it
/// led has another leader. One shard: two replicas; `shards`: three replicas.
async fn failovers(backend: &str, shards: u32) -> anyhow::Result<Vec<Duration>> {
    let exe = crate::exe::leaderq()?;
    let dir = TempDir::new()?;
    let journal = dir.0.join("journal");
    std::fs::write(&journal, "")?;
    let cluster = testkit::harness::start_cluster(backend, &exe, &dir.0.join("coordinator"))
        .map_err(|why| anyhow::anyhow!("cannot start the {backend} cluster: {why}"))?
        .with_context(|| format!("the {backend} server is not installed"))?;
    let mut env = cluster.env();
    env.push(("LEADERQ__ELECTION__SHARDS".into(), shards.to_string()));
    let base = "consumerLeader";
    let keys: Vec<String> = (0..shards)
        .map(|index| {
            if shards == 1 {
                base.to_string()
            } else {
                format!("{base}-shard-{index}-of-{shards}")
            }
        })
        .collect();
    let coords = keys
        .iter()
        .map(|key| coordinator_on(&cluster.env(), key))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let names: Vec<String> = (0..if shards == 1 { 2 } else { 3 })
        .map(|n| format!("sf-{n}"))
        .collect();
    let mut replicas = Vec::new();
    for name in &names {
        replicas.push(start_replica_with(
            &exe,
            &dir.0,
            &env,
            name,
            0,
            &journal,
            &chaos::CHAOS_SETUP,
        )?);
    }
    let mut times = Vec::new();
    for run in 0..FAILOVERS {
        // Every election led, and (split) evenly.
        let started = Instant::now();
        let holders = loop {
            let mut holders = Vec::new();
            for coord in &coords {
                holders.push(holder(coord.as_ref()).await);
            }
            let balanced = shards == 1
                || led(coords[0].as_ref(), base)
                    .await
                    .values()
                    .filter(|count| **count == 2)
                    .count()
                    == 3;
            if holders.iter().all(Option::is_some) && balanced {
                break holders;
            }
            if started.elapsed() > LIMIT {
                bail!("the elections were not all led within {LIMIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let victim = holders[0].clone().unwrap_or_default();
        let led_by: Vec<usize> = (0..holders.len())
            .filter(|index| holders[*index].as_deref() == Some(victim.as_str()))
            .collect();
        let index = replicas
            .iter()
            .position(|replica| replica.name == victim)
            .context("the leader is one of the replicas")?;
        let killed_at = Instant::now();
        signal_group(replicas[index].child.id(), "KILL");
        let mut left = led_by.clone();
        while !left.is_empty() && killed_at.elapsed() < LIMIT {
            let mut still = Vec::new();
            for shard in left {
                match holder(coords[shard].as_ref()).await {
                    Some(node) if node != victim => times.push(killed_at.elapsed()),
                    _ => still.push(shard),
                }
            }
            left = still;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The victim comes back, on its data dir, for the next run.
        let _ = replicas[index].child.wait();
        replicas[index] = start_replica_with(
            &exe,
            &dir.0,
            &env,
            &victim,
            run as u32 + 1,
            &journal,
            &chaos::CHAOS_SETUP,
        )?;
    }
    Ok(times)
}

pub async fn section(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let backend = options.backend.as_str();
    let mut rows = Vec::new();
    let mut one_rate = None;
    for (shards, replicas) in [(1u32, 1usize), (SHARDS, 1), (SHARDS, 2), (SHARDS, 3)] {
        progress(&format!(
            "shards: {} tasks of {} ms, {replicas} replica(s) at concurrency {CONCURRENCY}, {shards} shard(s)",
            TASKS_PER_REPLICA * replicas,
            HANDLER_TIME.as_millis()
        ));
        let (seen, rate) = drain(backend, shards, replicas).await?;
        if shards == SHARDS && replicas == 1 {
            one_rate = Some(rate);
        }
        let against = one_rate.map_or(String::new(), |one| {
            format!(
                ", {:.2} x the 1-replica rate at {SHARDS} shards",
                rate / one
            )
        });
        let ideal = replicas as f64 * CONCURRENCY as f64 * 1000.0 / HANDLER_TIME.as_millis() as f64;
        report.row(
            format!("shards: drain, {replicas} replica(s) x {CONCURRENCY} slots, {shards} shard(s), tasks/s"),
            format!("{rate:.1}"),
            &format!("ideal {ideal:.0}{against}"),
        );
        rows.push(json!({"shards": shards, "replicas": replicas, "tasks": seen, "per_sec": rate, "ideal_per_sec": ideal}));
    }
    progress(&format!(
        "shards: {FAILOVERS} SIGKILL failovers of the single leader"
    ));
    let single = failovers(backend, 1).await?;
    progress(&format!(
        "shards: {FAILOVERS} SIGKILL failovers of a replica leading 2 of {SHARDS} shards"
    ));
    let split = failovers(backend, SHARDS).await?;
    let median = |times: &[Duration]| -> f64 {
        let mut ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1000.0).collect();
        ms.sort_by(f64::total_cmp);
        ms.get(ms.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let (single_ms, split_ms) = (median(&single), median(&split));
    let spread = summarize(single.clone());
    report.row(
        "shards: SIGKILL failover, single leader, ms (median)".to_string(),
        format!("{single_ms:.0}"),
        &format!("max {:.0}", spread.max),
    );
    report.row(
        format!("shards: SIGKILL failover, each shard of {SHARDS}, ms (median)"),
        format!("{split_ms:.0}"),
        &format!("{:.2} x the single leader's", split_ms / single_ms),
    );
    report.json.insert(
        "shards".into(),
        json!({"backend": backend, "handler_ms": HANDLER_TIME.as_millis() as u64, "concurrency": CONCURRENCY, "drains": rows,
               "failover_single_ms": single_ms, "failover_shard_ms": split_ms}),
    );
    Ok(())
}
