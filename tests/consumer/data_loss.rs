//! A coordinator that lost all its data, on etcd's, ZooKeeper's and Redis's real servers
//! (the Consul backend's `leaderq server` is in `tests/consumer.rs`): every member killed
//! and started again empty on the same addresses, under replicas that led and ran tasks.
//! Its own counters start over (etcd's revision, ZooKeeper's zxid, Redis's fencing
//! counter), yet every task enqueued after the loss runs under a token above every token
//! handed out before it, and a leader is back within the TTL and a little.
//!
//! Redis's token already follows its clock, so there the earlier tokens are handed out while
//! its clock runs ahead (its counter set a day ahead of `TIME`), and the replicas are
//! restarted with it: what keeps the next token above them is then only the highest token
//! each replica saw, kept in its data dir.

use testkit::harness::redis::{RedisServer, PREFIX};
use testkit::harness::Cluster;

use super::*;

on_every_backend!([etcd, zookeeper] {
    /// A coordinator restarted empty under working replicas never hands out a lower token.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    fn a_coordinator_that_lost_its_data_never_hands_out_a_lower_token => lose_data();
});

/// A Redis restarted empty with its replicas, its clock behind the tokens handed out before,
/// never hands out a lower token: the replicas' data dirs remember the highest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_lost_its_data_with_its_replicas_never_hands_out_a_lower_token() {
    const DAY_MS: u64 = 86_400_000;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let time = server.cli(&[b"TIME"]).unwrap();
    let mut parts = time.split_whitespace().map(|p| p.parse::<u64>().unwrap());
    let now_ms = parts.next().unwrap() * 1_000 + parts.next().unwrap() / 1_000;
    server
        .cli(&[
            b"SET",
            format!("{PREFIX}fencing/consumerLeader").as_bytes(),
            (now_ms + DAY_MS).to_string().as_bytes(),
        ])
        .unwrap();
    lose_data_under(TestBed::with(server), Replicas::Restarted).await;
}

async fn lose_data(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    if backend == "zookeeper" {
        // ZooKeeper refuses a session that has seen a later zxid than its own, so a replica's
        // own session (and the test's) comes back only once it expires, new: as short as the
        // lease here, so that the wait for a leader measures the lease (docs/zookeeper.md).
        bed.env
            .push(("LEADERQ__ZOOKEEPER__SESSION_TIMEOUT".into(), "3s".into()));
        let mut env = bed.cluster.env();
        env.extend(bed.env.iter().cloned());
        bed.coord = toolbox::connect(&env);
    }
    lose_data_under(bed, Replicas::KeptRunning).await;
}

/// What becomes of the replicas while the coordinator loses its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replicas {
    KeptRunning,
    /// SIGKILLed before the loss and started again on their data dirs after it.
    Restarted,
}

/// Enqueues `count` `Work` tasks named `<name>_<n>`, with ids `<name><n>`, one write each
/// (each moves the coordinator's counter), asking again while the coordinator answers a
/// conflict or an error (ZooKeeper's parents are made again after a loss).
async fn enqueue<C: ?Sized + Cluster>(bed: &TestBed<C>, name: &str, count: usize) {
    for n in 0..count {
        let task = [leaderq::coord::Edit::Create {
            key: format!("oracleTask/{name}_{n}"),
            value: json!({"taskId": format!("{name}{n}"), "taskTime": n, "taskType": "Work"})
                .to_string()
                .into_bytes(),
        }];
        wait_until(
            Duration::from_secs(20),
            "a task enqueued",
            async || match bed.coord.edit(&task).await {
                Ok(leaderq::coord::Edited::Done) => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    }
}

/// The tokens of the runs of tasks whose id starts with `name`, as journaled.
fn tokens_of(journal: &[Vec<String>], name: &str) -> Vec<u64> {
    journal
        .iter()
        .filter(|l| l[0] == "run" && l[1].starts_with(name))
        .map(|l| l[2].parse().unwrap())
        .collect()
}

/// Two replicas run ten tasks; the coordinator loses all its data (the replicas kept
/// running, or restarted with it); three more tasks run under tokens above all ten.
async fn lose_data_under<C: ?Sized + Cluster>(mut bed: TestBed<C>, replicas: Replicas) {
    // Enqueued first, so that the first leader wins well above where empty data starts.
    enqueue(&bed, "before", 10).await;
    bed.start_replica("r1");
    bed.start_replica("r2");
    bed.wait_until_empty("oracleTask/", Duration::from_secs(30))
        .await;
    let before = tokens_of(&bed.journal(), "before");
    assert_eq!(before.len(), 10, "{:?}", bed.journal());
    let highest = *before.iter().max().unwrap();
    if replicas == Replicas::Restarted {
        for replica in &mut bed.replicas {
            replica.kill();
        }
        bed.replicas.clear();
    }
    bed.cluster
        .restart_empty()
        .expect("the coordinator restarted empty");
    let restarted = Instant::now();
    if replicas == Replicas::Restarted {
        bed.start_replica("r1");
        bed.start_replica("r2");
    }
    bed.leader(Duration::from_secs(30)).await;
    let back_in = restarted.elapsed();
    eprintln!("a leader was back {back_in:?} after the coordinator restarted empty");
    // TTL 3 s + lock-delay 200 ms + 1 s, and 2 s for a loaded machine.
    assert!(
        back_in < Duration::from_millis(6200),
        "no leader for {back_in:?}\n{}",
        bed.logs()
    );
    enqueue(&bed, "after", 3).await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(30))
        .await;
    let journal = bed.journal();
    let after = tokens_of(&journal, "after");
    assert_eq!(after.len(), 3, "{journal:?}");
    assert!(
        after.iter().all(|token| *token > highest),
        "a token at or below {highest} after the loss: {after:?}\n{journal:?}\n{}",
        bed.logs()
    );
}
