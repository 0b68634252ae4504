//! `leaderq consume` on Redis behind Sentinel: real `redis-server` processes (a primary and
//! two replicas) and three real `redis-sentinel`s; two replicas of leaderq drain a queue
//! through the sentinels while the primary is SIGKILLed and a replica promoted, then while an
//! operator's failover demotes the new one. With the replica wait on, every task whose
//! enqueue was acknowledged runs and the fencing tokens never fall nor repeat across leaders;
//! without it a replica refuses to lead unless `redis.accept_data_loss` says so. A replica
//! promoted without the last writes still hands out a higher token, and the contract suite
//! holds through Sentinel with the wait on. The failover drain runs again with every link on
//! TLS (data nodes and sentinels asking for client certificates).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use leaderq::coord::redis::{Layout, RedisCoordSettings, RedisCoordinator};
use leaderq::coord::{Campaign, Coordinator, Edit, Edited, FencingToken, HolderRecord, LeaseSpec};
use testkit::contract::{self, Subject, Timing};
use testkit::harness::sentinel::{RedisSentinels, MASTER_NAME};
use testkit::harness::Cluster;

use super::contract_redis::ScriptProducer;
use super::*;

/// The test bed on Redis behind Sentinel.
type SentinelBed = TestBed<RedisSentinels>;

/// A bed whose replicas hold 3 s leases and run `Step` tasks: a journal line, then a tenth
/// of a second of work, so that a drain lasts long enough to be cut by a failover.
fn sentinel_bed(cluster: RedisSentinels) -> SentinelBed {
    let mut bed = TestBed::with(cluster);
    let journal = bed.journal.display().to_string();
    bed.settings = bed.settings.ttl("3s").handler(
        "Step",
        &format!("echo \"run $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT\" >> {journal}; sleep 0.1"),
    );
    bed.env.push(("LEADERQ__REDIS__WAIT".into(), "5s".into()));
    bed.own_group = true;
    bed
}

fn step(n: u64) -> Vec<u8> {
    json!({"taskId": format!("t{n}"), "taskTime": 1_445_599_887 + n, "taskType": "Step"})
        .to_string()
        .into_bytes()
}

/// Enqueues task `n` through leaderq's own write (as `leaderq enqueue` does), asking again
/// while Redis fails over; whether it was acknowledged (a create that finds the key there
/// was applied by an earlier attempt whose answer was lost: not counted).
async fn enqueue(bed: &SentinelBed, n: u64) -> bool {
    let key = format!("oracleTask/t{n:03}");
    wait_until(
        Duration::from_secs(60),
        "an enqueue acknowledged",
        async || match bed
            .coord
            .edit(&[Edit::Create {
                key: key.clone(),
                value: step(n),
            }])
            .await
        {
            Ok(Edited::Done) => Ok(true),
            Ok(Edited::Conflict(_)) => Ok(false),
            Err(err) => Err(err.to_string()),
        },
    )
    .await
}

/// A coordinator of the test's own through `cluster`'s sentinels, its keys under `prefix`,
/// each write waiting for `wait_replicas` replicas (with none, the loss is accepted).
fn sentinel_coordinator(
    cluster: &RedisSentinels,
    prefix: &str,
    wait_replicas: u32,
) -> Arc<RedisCoordinator> {
    let sentinels = cluster
        .client_addrs()
        .iter()
        .map(|addr| {
            let (host, port) = addr.rsplit_once(':').unwrap();
            (host.to_string(), port.parse().unwrap())
        })
        .collect();
    Arc::new(
        RedisCoordinator::new(RedisCoordSettings {
            url: String::new(),
            password: String::new(),
            password_file: None,
            sentinels,
            master_name: MASTER_NAME.into(),
            sentinel_password: String::new(),
            sentinel_tls: false,
            wait_replicas,
            wait_replicas_timeout: Duration::from_secs(2),
            layout: Layout {
                prefix: prefix.to_string(),
                leader: "consumerLeader".into(),
            },
            request_timeout: Duration::from_secs(10),
            accept_data_loss: wait_replicas == 0,
            tls: Default::default(),
        })
        .expect("a redis coordinator"),
    )
}

/// Opens a 1 s lease of `node`'s on `coord` and campaigns with it until it wins (the
/// leadership may be held by a lease that has yet to expire); the token it won.
async fn win(coord: &RedisCoordinator, node: &str) -> (leaderq::coord::LeaseId, FencingToken) {
    let spec = LeaseSpec {
        node_id: node.into(),
        ttl: Duration::from_secs(1),
        takeover_delay: Duration::ZERO,
        previous: None,
    };
    wait_until(Duration::from_secs(60), "a win", async || {
        let lease = coord
            .open_lease(&spec)
            .await
            .map_err(|e| e.to_string())?
            .lease;
        match coord
            .campaign(&lease, &HolderRecord::default())
            .await
            .map_err(|e| e.to_string())?
        {
            Campaign::Won(leadership) => Ok((lease, leadership.fencing_token)),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// The fencing token does not depend on Redis's data: the replicas are stopped and cut off
/// while a second leadership is won on the primary alone, the primary is SIGKILLed and a replica
/// that never saw that win promoted; a coordinator that has seen no token still wins one
/// above it. Meanwhile an enqueue without the replica wait is acknowledged, and lost with
/// the primary; one with the wait is answered with an error instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_a_promoted_replica_that_missed_the_last_win_hands_out_a_higher_token() {
    let Some(mut cluster) = RedisSentinels::start() else {
        return;
    };
    let first = sentinel_coordinator(&cluster, "fence/", 0);
    let (lease, one) = win(&first, "a").await;
    wait_until(
        Duration::from_secs(10),
        "the replicas have the win",
        async || {
            let all = (1..3).all(|i| {
                cluster
                    .cli_of(i, &[b"GET", b"fence/fencing/consumerLeader"])
                    .is_ok_and(|token| token == one.to_string())
            });
            if all {
                Ok(())
            } else {
                Err("not yet")
            }
        },
    )
    .await;
    let old = cluster.primary().unwrap();
    let replicas: Vec<usize> = (0..3).filter(|&i| i != old).collect();
    // Stopped, then cut off: what the primary writes next reaches no replica (a stopped
    // replica still finds in its socket what was sent before it was cut).
    for &i in &replicas {
        cluster.signal_member(i, "STOP");
    }
    cluster
        .cli_of(old, &[b"CLIENT", b"KILL", b"TYPE", b"replica"])
        .unwrap();
    first.resign(&lease).await.unwrap();
    let second = sentinel_coordinator(&cluster, "fence/", 0);
    let (_, two) = win(&second, "b").await;
    assert!(two > one);
    // Meanwhile an enqueue without the wait is acknowledged, one with it is not.
    let create = |key: &str| {
        vec![Edit::Create {
            key: key.into(),
            value: step(1),
        }]
    };
    assert_eq!(
        second.edit(&create("queue/unwaited")).await,
        Ok(Edited::Done)
    );
    let waiting = sentinel_coordinator(&cluster, "fence/", 1);
    let refused = waiting.edit(&create("queue/waited")).await.unwrap_err();
    assert!(
        refused.to_string().contains("0 of the 1 replica"),
        "{refused}"
    );
    let task = b"fence/task/queue/unwaited";
    assert_eq!(cluster.cli_of(old, &[b"EXISTS", task]).unwrap(), "1");
    cluster.kill_member(old).unwrap();
    for &i in &replicas {
        cluster.signal_member(i, "CONT");
    }
    let new = cluster.promoted_other_than(old).unwrap();
    let stored = cluster
        .cli_of(new, &[b"GET", b"fence/fencing/consumerLeader"])
        .unwrap();
    assert_eq!(
        stored,
        one.to_string(),
        "the promoted replica has the second win"
    );
    let third = sentinel_coordinator(&cluster, "fence/", 0);
    let (_, three) = win(&third, "c").await;
    assert!(
        three > two,
        "token {three} after the failover, not above {two} handed out before it"
    );
}

/// Every contract check holds through Sentinel with every write waiting for a replica:
/// the same checks one Redis passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_with_the_replica_wait_the_redis_backend_keeps_the_contract() {
    let Some(cluster) = RedisSentinels::start() else {
        return;
    };
    let url = cluster.primary_url().unwrap();
    let outcome = contract::run_all(|name| {
        let prefix = format!("contract/{name}/");
        let coord = sentinel_coordinator(&cluster, &prefix, 1);
        let producer = ScriptProducer {
            coord: coord.clone(),
            url: url.clone(),
            leader_key: format!("{prefix}leader/consumerLeader"),
        };
        async move {
            Subject {
                coord,
                producer: Arc::new(producer),
                queue_prefix: "queue/".into(),
                dead_prefix: "dead/".into(),
                timing: Timing::new(Duration::from_secs(1)).without_takeover_delay(),
            }
        }
    })
    .await;
    if let Err(failures) = outcome {
        panic!("the Redis backend behind Sentinel breaks the contract:\n{failures}");
    }
}

/// Two replicas drain a queue through Sentinel with `redis.wait_replicas = 1`; the primary
/// is SIGKILLed mid-drain and a replica promoted; the replicas follow the new primary, and
/// again when an operator's `SENTINEL FAILOVER` demotes that one; every task whose enqueue
/// was acknowledged runs, and in the journal's order the fencing tokens never fall, nor does
/// one token serve two replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_acknowledged_tasks_survive_a_failover_and_tokens_never_fall() {
    let Some(cluster) = RedisSentinels::start() else {
        return;
    };
    survive_failovers(sentinel_bed(cluster)).await;
}

/// The same on a hardened deployment: the data nodes serve TLS alone and ask every client
/// for a certificate (replicating over TLS), and so do the sentinels; the replicas of leaderq
/// reach both with the certificates from `[redis]` (`sentinel_tls = true`), checking the data
/// nodes' against `server_name`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_over_tls_acknowledged_tasks_survive_a_failover() {
    let dir = tempfile::tempdir().unwrap();
    let pki = testkit::harness::pki::Pki::generate(dir.path()).expect("certificates");
    let Some(cluster) = RedisSentinels::start_tls(&pki, true) else {
        return;
    };
    let mut bed = sentinel_bed(cluster);
    // The data nodes' certificates checked against a name, not the address the sentinels
    // give: the connection leaderq makes again itself at each failover.
    bed.env.push((
        "LEADERQ__REDIS__SERVER_NAME".into(),
        testkit::harness::pki::SERVER_NAME.into(),
    ));
    survive_failovers(bed).await;
}

async fn survive_failovers(mut bed: SentinelBed) {
    for node in ["r1", "r2"] {
        bed.start_replica(node);
    }
    bed.leader(Duration::from_secs(20)).await;
    let mut acknowledged = Vec::new();
    for n in 0..40 {
        if enqueue(&bed, n).await {
            acknowledged.push(format!("t{n}"));
        }
    }
    bed.wait_journal(Duration::from_secs(30), "the drain under way", |j| {
        j.len() >= 5
    })
    .await;
    let old = bed.cluster.primary().expect("a primary");
    bed.cluster.kill_member(old).unwrap();
    for n in 40..80 {
        if enqueue(&bed, n).await {
            acknowledged.push(format!("t{n}"));
        }
    }
    let new = bed.cluster.promoted_other_than(old).unwrap();
    assert_ne!(new, old);
    bed.wait_until_empty("oracleTask/", Duration::from_secs(120))
        .await;
    // Then a failover with the primary alive: Sentinel demotes it and closes its clients;
    // the replicas leave it for the one promoted. (The primary now: on a loaded machine the
    // sentinels may have taken the one promoted for down too, and promoted the other.)
    let new = bed.cluster.primary().unwrap_or(new);
    bed.cluster.replicating(new, old).unwrap();
    bed.cluster.failover().unwrap();
    let third = bed.cluster.promoted_other_than(new).unwrap();
    assert_ne!(third, old);
    for n in 80..90 {
        if enqueue(&bed, n).await {
            acknowledged.push(format!("t{n}"));
        }
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(120))
        .await;
    let journal = bed.journal();
    let logs = bed.logs();
    assert!(
        logs.contains("the Redis primary (was"),
        "no replica said it follows the new primary:\n{logs}"
    );
    let ran: HashSet<&String> = journal.iter().map(|l| &l[1]).collect();
    let lost: Vec<&String> = acknowledged.iter().filter(|id| !ran.contains(id)).collect();
    assert!(
        lost.is_empty(),
        "acknowledged tasks lost: {lost:?}\n{journal:?}\n{}",
        bed.logs()
    );
    let mut holder: HashMap<u64, &String> = HashMap::new();
    let mut highest = 0u64;
    for line in &journal {
        let token: u64 = line[2].parse().unwrap();
        assert!(
            token >= highest,
            "token {token} fell below {highest}: {journal:?}"
        );
        highest = token;
        let node = holder.entry(token).or_insert(&line[3]);
        assert_eq!(
            *node, &line[3],
            "token {token} served two replicas: {journal:?}"
        );
    }
    let twice = journal.len() - ran.len();
    if std::env::var_os("LEADERQ_TEST_LOGS").is_some() {
        eprintln!("{logs}");
    }
    eprintln!(
        "{} acknowledged of 90, {} runs, {twice} run again, {} tokens",
        acknowledged.len(),
        journal.len(),
        holder.len()
    );
}

/// Through Sentinel without `redis.wait_replicas`, a replica refuses to lead, naming both
/// ways out (the wait, or `redis.accept_data_loss`); with the loss accepted it leads and
/// runs a task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_without_the_wait_a_replica_refuses_unless_the_loss_is_accepted() {
    let Some(cluster) = RedisSentinels::start() else {
        return;
    };
    let mut bed = sentinel_bed(cluster);
    bed.env
        .push(("LEADERQ__REDIS__WAIT_REPLICAS".into(), "0".into()));
    bed.start_replica("r1");
    let status = wait_until(Duration::from_secs(30), "r1 exits", async || {
        bed.replica("r1").try_wait().ok_or("running")
    })
    .await;
    let log = bed.logs();
    assert!(!status.success(), "r1 exited with success:\n{log}");
    for named in ["redis.wait_replicas", "redis.accept_data_loss = true"] {
        assert!(log.contains(named), "{named:?} missing:\n{log}");
    }
    bed.env
        .push(("LEADERQ__REDIS__ACCEPT_DATA_LOSS".into(), "true".into()));
    bed.start_replica("r2");
    assert!(enqueue(&bed, 1).await);
    bed.wait_for_line(Duration::from_secs(30), |l| {
        l[0] == "run" && l[1] == "t1" && l[3] == "r2"
    })
    .await;
}
