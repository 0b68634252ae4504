//! The coordinator contract suite (`testkit::contract`), every check, against the etcd
//! backend on a real 3-member etcd cluster on loopback: the same checks the in-memory
//! and Consul coordinators pass.

use std::sync::Arc;

use leaderq::coord::etcd::client::{Client, ClientConfig, Op, Range, Txn};
use leaderq::coord::etcd::{EtcdCoordSettings, EtcdCoordinator};
use leaderq::coord::{CoordError, CoordFuture, Coordinator as _, TaskOp, Version, Written};
use testkit::contract::{self, Producer, Subject, Timing};
use testkit::harness::etcd::EtcdCluster;

use super::*;

/// A producer's plain put, through the gateway (`etcdctl put` is the same request); an
/// operator's `etcdctl del --prefix <leader_key>/` of the campaign keys.
struct PutProducer {
    client: Arc<Client>,
    leader_key: String,
}

impl Producer for PutProducer {
    fn put<'a>(&'a self, key: &'a str, value: &'a [u8]) -> CoordFuture<'a, ()> {
        Box::pin(async move {
            self.client
                .put(key.as_bytes(), value)
                .await
                .map_err(|err| CoordError::Unavailable(err.to_string()))
        })
    }

    fn delete_leader_record(&self) -> CoordFuture<'_, ()> {
        Box::pin(async move {
            let unavailable =
                |err: leaderq::coord::etcd::client::Error| CoordError::Unavailable(err.to_string());
            let candidates = format!("{}/", self.leader_key);
            let found = self
                .client
                .range(&Range::prefix(candidates.as_bytes()))
                .await
                .map_err(unavailable)?;
            let delete = Txn {
                success: found.kvs.into_iter().map(|kv| Op::Delete(kv.key)).collect(),
                ..Txn::default()
            };
            self.client.txn(&delete).await.map_err(unavailable)?;
            Ok(())
        })
    }
}

pub(crate) fn etcd_client(endpoints: Vec<String>) -> Arc<Client> {
    Arc::new(
        Client::new(&ClientConfig {
            endpoints,
            request_timeout: Duration::from_secs(10),
            ..ClientConfig::default()
        })
        .expect("client"),
    )
}

/// The contract suites' lease TTL on etcd (the cluster's short election timeout allows
/// 1 s). The checks run at once, each with leases kept alive every quarter TTL; with 1 s,
/// one run on a machine loaded by other suites saw two campaigns win and a lease end
/// mid-check: leases ending before their renewals came.
const CONTRACT_TTL: Duration = Duration::from_secs(2);

/// Every contract check holds on a 3-member etcd cluster. Each check gets its own leader
/// key and prefixes, so they run at once on one cluster. etcd has no lock-delay.
#[tokio::test]
async fn the_etcd_backend_keeps_the_coordinator_contract() {
    let Some(cluster) = EtcdCluster::start(3).expect("an etcd cluster") else {
        return;
    };
    let endpoints = cluster.endpoints();
    let outcome = contract::run_all(|name| {
        let client = etcd_client(endpoints.clone());
        async move {
            let leader_key = format!("contract/{name}/leader");
            let coord = EtcdCoordinator::new(
                client.clone(),
                EtcdCoordSettings {
                    leader_key: leader_key.clone(),
                },
            );
            Subject {
                coord: Arc::new(coord),
                producer: Arc::new(PutProducer { client, leader_key }),
                queue_prefix: format!("contract/{name}/queue/"),
                dead_prefix: format!("contract/{name}/dead/"),
                timing: Timing::new(CONTRACT_TTL).without_takeover_delay(),
            }
        }
    })
    .await;
    drop(cluster);
    if let Err(failures) = outcome {
        panic!("the etcd backend breaks the contract:\n{failures}");
    }
}

/// A list waiting past a version answers at once with what changed since (a watch from
/// the revision after it, history included), and also when that revision was compacted
/// away (it relists); an observe past a compacted revision likewise.
#[tokio::test]
async fn waits_resume_from_the_last_revision_and_relist_after_compaction() {
    let Some(cluster) = EtcdCluster::start(1).expect("an etcd cluster") else {
        return;
    };
    let client = etcd_client(cluster.endpoints());
    let coord = EtcdCoordinator::new(
        client.clone(),
        EtcdCoordSettings {
            leader_key: "resume/leader".into(),
        },
    );
    let long = Duration::from_secs(20);
    client.put(b"resume/q/a", b"{}").await.unwrap();
    let (_, seen) = coord
        .list("resume/q/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    // Written while nobody waits: the next wait starts from the last revision seen.
    client.put(b"resume/q/b", b"{}").await.unwrap();
    let started = Instant::now();
    let (tasks, moved) = coord.list("resume/q/", seen, long).await.unwrap();
    assert!(started.elapsed() < long / 4 && moved > seen && tasks.len() == 2);

    client.put(b"resume/q/c", b"{}").await.unwrap();
    let (_, now) = coord
        .list("resume/q/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    let revision = leaderq::coord::etcd::layout::revision_of(now).to_string();
    cluster.ctl(&["compact", &revision]).expect("compaction");
    let started = Instant::now();
    let (tasks, relisted) = coord.list("resume/q/", seen, long).await.unwrap();
    assert!(
        started.elapsed() < long / 4 && relisted >= now && tasks.len() == 3,
        "a wait past a compacted revision answered after {:?} with {} tasks at {relisted:?}",
        started.elapsed(),
        tasks.len()
    );
    let started = Instant::now();
    coord.observe(seen, long).await.unwrap();
    assert!(
        started.elapsed() < long / 4,
        "an observe past a compacted revision waited"
    );
}

/// With etcd's auth on, the client signs in with user and password (and a wrong password
/// is an error that says so); the whole contract suite then holds through it.
#[tokio::test]
async fn user_and_password_reach_an_etcd_with_auth_on() {
    let Some(cluster) = EtcdCluster::start(1).expect("an etcd cluster") else {
        return;
    };
    cluster
        .ctl(&["user", "add", "root", "--new-user-password=secret-pw"])
        .unwrap();
    cluster.ctl(&["auth", "enable"]).unwrap();
    let with = |password: &str| {
        Arc::new(
            Client::new(&ClientConfig {
                endpoints: cluster.endpoints(),
                user: "root".into(),
                password: password.into(),
                request_timeout: Duration::from_secs(10),
                ..ClientConfig::default()
            })
            .unwrap(),
        )
    };
    let refused = with("wrong").put(b"auth/x", b"{}").await;
    assert!(
        matches!(&refused, Err(err) if err.to_string().contains("authentication failed")),
        "{refused:?}"
    );
    assert!(etcd_client(cluster.endpoints())
        .put(b"auth/x", b"{}")
        .await
        .is_err());
    let outcome = contract::run_all(|name| {
        let client = with("secret-pw");
        async move {
            let leader_key = format!("auth/{name}/leader");
            Subject {
                coord: Arc::new(EtcdCoordinator::new(
                    client.clone(),
                    EtcdCoordSettings {
                        leader_key: leader_key.clone(),
                    },
                )),
                producer: Arc::new(PutProducer { client, leader_key }),
                queue_prefix: format!("auth/{name}/queue/"),
                dead_prefix: format!("auth/{name}/dead/"),
                timing: Timing::new(CONTRACT_TTL).without_takeover_delay(),
            }
        }
    })
    .await;
    if let Err(failures) = outcome {
        panic!("through etcd auth the contract breaks:\n{failures}");
    }
}

/// A list waiting on a task held by another lease (a deposed leader's, still alive) wakes
/// as soon as that lease ends and its claim dies, though the task's own key is unchanged.
#[tokio::test]
async fn a_waiting_list_wakes_when_a_claim_dies_with_its_lease() {
    let Some(cluster) = EtcdCluster::start(1).expect("an etcd cluster") else {
        return;
    };
    let client = etcd_client(cluster.endpoints());
    let (coord, lease, leadership) = leading(&client, "orphan/leader", "old").await;
    client.put(b"orphan/q/t1", b"{}").await.unwrap();
    let (tasks, _) = coord
        .list("orphan/q/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    let claim = TaskOp::Claim {
        key: "orphan/q/t1".into(),
        version: tasks[0].version,
        value: b"{\"taken\":true}".to_vec(),
    };
    let written = coord.write(&leadership, &[claim]).await.unwrap();
    assert!(matches!(written, Written::Done { .. }), "{written:?}");
    coord.resign(&lease).await.unwrap();
    let (held, seen) = coord
        .list("orphan/q/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(held[0].holder.as_ref(), Some(&lease));

    let long = Duration::from_secs(20);
    // The list waits on a watch of its own before the lease is revoked.
    let waiter = waiting_list(&cluster, &client, "orphan/leader", "orphan/q/", seen, long).await;
    coord.revoke(&lease).await.unwrap();
    let (took, tasks) = waiter.await.unwrap();
    assert!(
        took < long / 4 && tasks[0].holder.is_none() && tasks[0].version != held[0].version,
        "the waiting list answered after {took:?} with {:?}",
        tasks[0]
    );
}

/// A list waiting on one prefix (the schedules' definitions) sleeps through the leader's
/// claims and completions of tasks under another (the queue): their claim records name
/// none of its tasks. Waking on each would relist it once per write of a drain.
#[tokio::test]
async fn a_waiting_list_sleeps_through_records_of_other_prefixes() {
    let Some(cluster) = EtcdCluster::start(1).expect("an etcd cluster") else {
        return;
    };
    let client = etcd_client(cluster.endpoints());
    let (coord, _lease, leadership) = leading(&client, "apart/leader", "n1").await;
    client.put(b"apart/q/t1", b"{}").await.unwrap();
    client.put(b"apart/defs/d1", b"{}").await.unwrap();
    let (_, seen) = coord
        .list("apart/defs/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    let wait = Duration::from_secs(3);
    let waiter = waiting_list(&cluster, &client, "apart/leader", "apart/defs/", seen, wait).await;
    let (tasks, _) = coord
        .list("apart/q/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    let claim = TaskOp::Claim {
        key: "apart/q/t1".into(),
        version: tasks[0].version,
        value: b"{\"taken\":true}".to_vec(),
    };
    let Written::Done { versions, .. } = coord.write(&leadership, &[claim]).await.unwrap() else {
        panic!("the claim was not applied");
    };
    let records = client
        .range(&Range::prefix(b"apart/leader.held/"))
        .await
        .unwrap()
        .kvs;
    assert_eq!(records.len(), 1, "the claim wrote no claim record");
    let complete = TaskOp::Complete {
        key: "apart/q/t1".into(),
        version: versions[0].1,
    };
    let written = coord.write(&leadership, &[complete]).await.unwrap();
    assert!(matches!(written, Written::Done { .. }), "{written:?}");
    let (took, _) = waiter.await.unwrap();
    assert!(
        took >= wait - Duration::from_millis(100),
        "the list of apart/defs/ woke after {took:?} on records of apart/q/"
    );
}

/// A list of `prefix` past `seen`, waiting up to `wait` on its own coordinator for
/// `leader_key`, once it watches (the member holds more watches); answers how long it
/// waited and what it listed.
async fn waiting_list(
    cluster: &EtcdCluster,
    client: &Arc<Client>,
    leader_key: &'static str,
    prefix: &'static str,
    seen: Version,
    wait: Duration,
) -> tokio::task::JoinHandle<(Duration, Vec<leaderq::coord::StoredTask>)> {
    let metrics = format!("{}/metrics", cluster.endpoints()[0]);
    let watchers_before = etcd_watchers(&metrics).await;
    let client = client.clone();
    let waiter = tokio::spawn(async move {
        let coord = EtcdCoordinator::new(
            client,
            EtcdCoordSettings {
                leader_key: leader_key.into(),
            },
        );
        let started = Instant::now();
        let (tasks, _) = coord.list(prefix, seen, wait).await.unwrap();
        (started.elapsed(), tasks)
    });
    wait_until(
        Duration::from_secs(10),
        "the list watching",
        async || match etcd_watchers(&metrics).await {
            now if now > watchers_before => Ok(()),
            now => Err(now),
        },
    )
    .await;
    waiter
}

/// The number of watches the etcd member serving `metrics` (its `/metrics` URL) holds.
async fn etcd_watchers(metrics: &str) -> f64 {
    let text = client()
        .get(metrics)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| {
            line.strip_prefix("etcd_debugging_mvcc_watcher_total ")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no etcd_debugging_mvcc_watcher_total in:\n{text}"))
}

/// A rolling upgrade: while a lease's owner key is a replica's from before claim records
/// (its bare node id), the leader claims with a claim key per task, which that replica
/// honours, even when that replica starts between the leader's read and its claim; once
/// its lease is gone, claims go as one claim record. A task held by a claim key stays
/// held by it.
#[tokio::test]
async fn claim_records_wait_until_every_replica_knows_them() {
    let Some(cluster) = EtcdCluster::start(1).expect("an etcd cluster") else {
        return;
    };
    let client = etcd_client(cluster.endpoints());
    let (coord, lease, leadership) = leading(&client, "upgrade/leader", "new").await;
    for task in ["upgrade/q/t1", "upgrade/q/t2"] {
        client.put(task.as_bytes(), b"{}").await.unwrap();
    }
    let (tasks, _) = coord
        .list("upgrade/q/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    // An older replica starts after that read.
    let old = client.lease_grant(30).await.unwrap().id;
    let owner = Txn {
        success: vec![Op::Put {
            key: format!("upgrade/leader.owner/{old:x}").into_bytes(),
            value: b"old-node".to_vec(),
            lease: old,
        }],
        ..Txn::default()
    };
    client.txn(&owner).await.unwrap();
    let claim = |task: &leaderq::coord::StoredTask| TaskOp::Claim {
        key: task.key.clone(),
        version: task.version,
        value: b"{\"taken\":true}".to_vec(),
    };
    let written = coord.write(&leadership, &[claim(&tasks[0])]).await.unwrap();
    assert!(matches!(written, Written::Done { .. }), "{written:?}");
    let keys = |prefix: &'static str| {
        let client = client.clone();
        async move {
            client
                .range(&Range::prefix(prefix.as_bytes()))
                .await
                .unwrap()
                .kvs
        }
    };
    assert_eq!(keys("upgrade/leader.claims/").await.len(), 1);
    assert!(keys("upgrade/leader.held/").await.is_empty());

    client.lease_revoke(old).await.unwrap();
    let (tasks, _) = coord
        .list("upgrade/q/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    let written = coord.write(&leadership, &[claim(&tasks[1])]).await.unwrap();
    assert!(matches!(written, Written::Done { .. }), "{written:?}");
    let records = keys("upgrade/leader.held/").await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].value, br#"{"claimed":["upgrade/q/t2"]}"#);
    assert_eq!(keys("upgrade/leader.claims/").await.len(), 1);
    let (tasks, _) = coord
        .list("upgrade/q/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    assert!(
        tasks
            .iter()
            .all(|task| task.holder.as_ref() == Some(&lease)),
        "{tasks:?}"
    );
}

/// A coordinator on `client` for `leader_key`, with a 30 s lease of `node`'s that leads.
async fn leading(
    client: &Arc<Client>,
    leader_key: &str,
    node: &str,
) -> (
    EtcdCoordinator,
    leaderq::coord::LeaseId,
    leaderq::coord::Leadership,
) {
    let coord = EtcdCoordinator::new(
        client.clone(),
        EtcdCoordSettings {
            leader_key: leader_key.into(),
        },
    );
    let (lease, leadership) = leading_on(&coord, node).await;
    (coord, lease, leadership)
}
