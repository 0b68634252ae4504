//! The coordinator contract suite (`testkit::contract`), every check, against the Redis
//! backend on a real `redis-server` (AOF on, `appendfsync always`): the same checks the
//! in-memory and Consul coordinators pass.

use std::sync::Arc;

use leaderq::coord::redis::{Layout, RedisCoordSettings, RedisCoordinator};
use leaderq::coord::{CoordError, CoordFuture, Coordinator, Edit, Edited, Version};
use testkit::contract::{self, Producer, Subject, Timing};
use testkit::harness::redis::RedisServer;

use super::*;

/// The producers' documented script, run by the coordinator's own connection; an
/// operator's `redis-cli DEL` of the leader key.
pub(crate) struct ScriptProducer {
    pub(crate) coord: Arc<RedisCoordinator>,
    pub(crate) url: String,
    /// The leader key's full name: `<prefix>leader/<leader name>`.
    pub(crate) leader_key: String,
}

impl Producer for ScriptProducer {
    fn put<'a>(&'a self, key: &'a str, value: &'a [u8]) -> CoordFuture<'a, ()> {
        Box::pin(self.coord.produce(key, value))
    }

    fn delete_leader_record(&self) -> CoordFuture<'_, ()> {
        Box::pin(async move {
            let unavailable = |err: redis::RedisError| CoordError::Unavailable(err.to_string());
            let client = redis::Client::open(self.url.as_str()).map_err(unavailable)?;
            let mut connection = client
                .get_multiplexed_async_connection()
                .await
                .map_err(unavailable)?;
            redis::cmd("DEL")
                .arg(&self.leader_key)
                .query_async::<i64>(&mut connection)
                .await
                .map_err(unavailable)?;
            Ok(())
        })
    }
}

/// A coordinator on `url` whose keys all live under `prefix`.
pub(crate) fn redis_coordinator(url: &str, prefix: &str) -> Arc<RedisCoordinator> {
    Arc::new(
        RedisCoordinator::new(RedisCoordSettings {
            url: url.to_string(),
            password: String::new(),
            password_file: None,
            sentinels: Vec::new(),
            master_name: String::new(),
            sentinel_password: String::new(),
            sentinel_tls: false,
            wait_replicas: 0,
            wait_replicas_timeout: Duration::from_secs(1),
            layout: Layout {
                prefix: prefix.to_string(),
                leader: "consumerLeader".into(),
            },
            request_timeout: Duration::from_secs(10),
            accept_data_loss: false,
            tls: Default::default(),
        })
        .expect("a redis coordinator"),
    )
}

/// Every contract check holds on one real Redis. Each check gets its own key prefix, so
/// they run at once. Redis has no lock-delay: the fencing token and the holder's own TTL
/// margin stand in for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_backend_keeps_the_coordinator_contract() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let outcome = contract::run_all(|name| {
        let prefix = format!("contract/{name}/");
        let coord = redis_coordinator(&url, &prefix);
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
        panic!("the Redis backend breaks the contract:\n{failures}");
    }
}

/// A queue larger than a page of keys (4,096) and of tasks (256): a look reads every key
/// once, in order, page after page, and a listing every task; nothing is read twice or
/// left out where one page ends and the next begins, a key that is not UTF-8 ending a page
/// included (it alone is left out). The same after the index of task keys was deleted by
/// hand, or a rebuild of it was cut short: the next read rebuilds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_listings_page_through_a_queue_larger_than_a_page() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let coord = redis_coordinator(&server.url(), "paging/");
    let keys: Vec<String> = (0..4_500).map(|n| format!("queue/t{n:05}")).collect();
    for chunk in keys.chunks(128) {
        let creates: Vec<Edit> = chunk
            .iter()
            .map(|key| Edit::Create {
                key: key.clone(),
                value: br#"{"taskType":"Work","taskTime":"1"}"#.to_vec(),
            })
            .collect();
        assert_eq!(coord.edit(&creates).await.unwrap(), Edited::Done);
    }
    coord
        .edit(&[Edit::Create {
            key: "queue0".into(),
            value: b"{}".to_vec(),
        }])
        .await
        .unwrap();
    let (names, _) = coord.keys("queue/").await.unwrap();
    assert_eq!(
        names, keys,
        "every key once, in order, and none beside the prefix"
    );
    let (listed, _) = coord
        .list("queue/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    let listed: Vec<String> = listed.into_iter().map(|task| task.key).collect();
    assert_eq!(listed, keys);

    // A producer's key that is not UTF-8, the last member of the first full page: left out
    // of looks and listings, and the next page still begins right after it.
    let bad: &[u8] = b"queue/t04094\xff";
    server
        .cli(&[
            b"EVAL",
            leaderq::coord::redis::PRODUCE.as_bytes(),
            b"0",
            b"paging/",
            bad,
            br#"{"taskType":"Work","taskTime":"1"}"#,
        ])
        .unwrap();
    let (names, _) = coord.keys("queue/").await.unwrap();
    assert_eq!(names, keys, "a look leaves the key it cannot name out");
    let (listed, _) = coord
        .list("queue/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    let listed: Vec<String> = listed.into_iter().map(|task| task.key).collect();
    assert_eq!(listed, keys, "a listing leaves the key it cannot name out");
    server.cli(&[b"ZREM", b"paging/tasks", bad]).unwrap();
    server
        .cli(&[b"DEL", &[&b"paging/task/"[..], bad].concat()])
        .unwrap();

    // The index deleted by hand is rebuilt from the task hashes (more than a page of them,
    // in several SCAN steps) by the next read, whichever; its mark is never a key, even
    // at the head of a full page (the prefix "").
    let mut every: Vec<String> = keys.clone();
    every.push("queue0".into());
    for how in ["keys", "list", "keys cut short", "list cut short"] {
        if how.ends_with("cut short") {
            // A rebuild stopped halfway (its process killed) leaves the mark above 0, and
            // the index wanting: the next read rebuilds again.
            server.cli(&[b"ZADD", b"paging/tasks", b"1", b""]).unwrap();
            server
                .cli(&[b"ZREM", b"paging/tasks", b"queue/t00007"])
                .unwrap();
        } else {
            server.cli(&[b"DEL", b"paging/tasks"]).unwrap();
        }
        let read: Vec<String> = if how.starts_with("keys") {
            coord.keys("").await.unwrap().0.iter().collect()
        } else {
            let (listed, _) = coord.list("", Version(0), Duration::ZERO).await.unwrap();
            listed.into_iter().map(|task| task.key).collect()
        };
        assert!(
            read == every,
            "{how} after the index was deleted: {} keys",
            read.len()
        );
    }
}

/// Waits wake without polling: a `list` waiting past the queue's version answers within
/// a fraction of the fallback poll after a producer's write (the channel's message), and an
/// `observe` answers as the leader key expires (its PTTL: the poll only looks at the
/// counter, which an expiry does not move), never before the lease's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_wake_on_the_channel_and_at_the_lease_expiry() {
    use leaderq::coord::{Campaign, Coordinator, HolderRecord, LeaseSpec, Version};
    use tokio::time::Instant;

    let Some(server) = RedisServer::start() else {
        return;
    };
    let coord = redis_coordinator(&server.url(), "wake/");
    let (_, version) = coord.list("q/", Version(0), Duration::ZERO).await.unwrap();
    let waiter = {
        let coord = coord.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let (tasks, _) = coord
                .list("q/", version, Duration::from_secs(20))
                .await
                .unwrap();
            (tasks.len(), started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let producer = redis_coordinator(&server.url(), "wake/");
    let written = Instant::now();
    producer.produce("q/t1", b"{}").await.unwrap();
    let (count, _) = waiter.await.unwrap();
    let woken = written.elapsed();
    assert_eq!(count, 1);
    assert!(
        woken < Duration::from_millis(500),
        "a waiting list answered {woken:?} after the write"
    );
    assert!(coord.messages_heard() > 0, "no message on the channel");

    let opened = Instant::now();
    let grant = coord
        .open_lease(&LeaseSpec {
            node_id: "n1".into(),
            ttl: Duration::from_secs(1),
            takeover_delay: Duration::ZERO,
            previous: None,
        })
        .await
        .unwrap();
    let record = HolderRecord {
        node: "n1".into(),
        ..HolderRecord::default()
    };
    let won = coord.campaign(&grant.lease, &record).await.unwrap();
    assert!(matches!(won, Campaign::Won(_)), "{won:?}");
    let (_, version) = coord.observe(Version(0), Duration::ZERO).await.unwrap();
    let (holder, _) = coord
        .observe(version, Duration::from_secs(20))
        .await
        .unwrap();
    let freed = opened.elapsed();
    assert_eq!(holder.lease, None);
    assert!(
        freed >= Duration::from_secs(1) && freed < Duration::from_secs(3),
        "the leadership of a 1s lease not kept alive was seen free after {freed:?}"
    );
}

/// A waiting `list` sleeps through the leader's claims and completions of tasks under
/// another prefix (each publishes the prefix it wrote under; before, a schedules waiter
/// read its prefix again at every write of a drain), and still wakes at once for a write of
/// its own prefix; the leadership's waiter answers nothing meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_list_sleeps_through_writes_of_other_prefixes() {
    use leaderq::coord::{Coordinator, TaskOp, Written};
    use tokio::time::Instant;

    let Some(server) = RedisServer::start() else {
        return;
    };
    let coord = redis_coordinator(&server.url(), "apart/");
    let (_, leadership) = leading_on(coord.as_ref(), "n1").await;
    for key in ["q/t1", "q/t2", "defs/d1"] {
        coord.produce(key, b"{}").await.unwrap();
    }
    let (_, seen) = coord
        .list("defs/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    let (_, held) = coord.observe(Version(0), Duration::ZERO).await.unwrap();
    let waiting = |prefix: &'static str| {
        let coord = coord.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            coord
                .list(prefix, seen, Duration::from_secs(20))
                .await
                .unwrap();
            started.elapsed()
        })
    };
    let observing = {
        let coord = coord.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            coord.observe(held, Duration::from_secs(3)).await.unwrap();
            started.elapsed()
        })
    };
    let defs = waiting("defs/");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let (tasks, _) = coord.list("q/", Version(0), Duration::ZERO).await.unwrap();
    for task in tasks {
        let claim = TaskOp::Claim {
            key: task.key.clone(),
            version: task.version,
            value: b"{\"taken\":true}".to_vec(),
        };
        let Written::Done { versions, .. } = coord.write(&leadership, &[claim]).await.unwrap()
        else {
            panic!("the claim of {} was not applied", task.key);
        };
        let complete = TaskOp::Complete {
            key: task.key,
            version: versions[0].1,
        };
        let written = coord.write(&leadership, &[complete]).await.unwrap();
        assert!(matches!(written, Written::Done { .. }), "{written:?}");
    }
    let wrote = started.elapsed();
    let slept = defs.await.unwrap();
    // The counter moved: the waiter's fallback poll (every second) reads again then.
    assert!(
        slept >= Duration::from_millis(800),
        "the list of defs/ answered {slept:?} after writes of q/ that took {wrote:?}"
    );
    let defs = waiting("defs/");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (tasks, _) = coord
        .list("defs/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    let written = Instant::now();
    let rewrite = TaskOp::Rewrite {
        key: tasks[0].key.clone(),
        version: tasks[0].version,
        value: b"{\"v\":2}".to_vec(),
    };
    let answer = coord.write(&leadership, &[rewrite]).await.unwrap();
    assert!(matches!(answer, Written::Done { .. }), "{answer:?}");
    defs.await.unwrap();
    let woken = written.elapsed();
    assert!(
        woken < Duration::from_millis(500),
        "the list of defs/ answered {woken:?} after a write of defs/"
    );
    let observed = observing.await.unwrap();
    assert!(
        observed >= Duration::from_secs(3) - Duration::from_millis(100),
        "the leadership's waiter answered after {observed:?}, on writes of tasks"
    );
}

/// A listing of a backlog larger than one page of the listing script (600 tasks of 20 KB,
/// 12 MB of values) answers every task, once, in key order. Before the listing was paged,
/// one answer held the whole backlog, and a backlog of 2,000 such tasks never drained.
#[tokio::test]
async fn a_large_backlog_of_large_tasks_lists_whole_and_in_order() {
    use leaderq::coord::{Coordinator, Edit, Edited, Version};
    let Some(server) = RedisServer::start() else {
        return;
    };
    let coord = redis_coordinator(&server.url(), "paged/");
    let pad = "x".repeat(20_000);
    let keys: Vec<String> = (0..600).map(|n| format!("queue/t{n:04}")).collect();
    for chunk in keys.chunks(20) {
        let edits: Vec<Edit> = chunk
            .iter()
            .map(|key| Edit::Create {
                key: key.clone(),
                value: format!("{{\"pad\":\"{pad}\"}}").into_bytes(),
            })
            .collect();
        assert_eq!(coord.edit(&edits).await.unwrap(), Edited::Done);
    }
    let (tasks, version) = coord
        .list("queue/", Version(0), Duration::ZERO)
        .await
        .unwrap();
    let listed: Vec<&str> = tasks.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(listed, keys.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(tasks.iter().all(|t| t.value.len() > 20_000));
    assert!(version > Version(0));
}

/// `redis.password_file` is read again when a connection is made again: the password
/// rotated (the file rewritten, then Redis's `requirepass`), the connection in use goes on;
/// once Redis drops it, the next connection logs in with the new password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_file_rewritten_is_used_by_the_next_connection() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("redis-password");
    std::fs::write(&file, "first-secret\n").unwrap();
    server
        .cli(&[b"CONFIG", b"SET", b"requirepass", b"first-secret"])
        .unwrap();
    let coord = super::toolbox::connect(&[
        ("LEADERQ__COORDINATOR__BACKEND".into(), "redis".into()),
        ("LEADERQ__REDIS__URL".into(), server.url()),
        (
            "LEADERQ__REDIS__PASSWORD_FILE".into(),
            file.display().to_string(),
        ),
    ]);
    let create = |key: &str| {
        vec![Edit::Create {
            key: key.into(),
            value: b"{}".to_vec(),
        }]
    };
    assert_eq!(coord.edit(&create("queue/a")).await, Ok(Edited::Done));
    std::fs::write(&file, "second-secret\n").unwrap();
    let auth = |password: &'static str| -> Vec<&'static [u8]> {
        vec![b"--no-auth-warning", b"-a", password.as_bytes()]
    };
    let mut set = auth("first-secret");
    set.extend([&b"CONFIG"[..], b"SET", b"requirepass", b"second-secret"]);
    server.cli(&set).unwrap();
    assert_eq!(coord.edit(&create("queue/b")).await, Ok(Edited::Done));
    // The coordinator's connection is subscribed to the changes channel: a pubsub client.
    for kind in [&b"normal"[..], b"pubsub"] {
        let mut kill = auth("second-secret");
        kill.extend([&b"CLIENT"[..], b"KILL", b"TYPE", kind]);
        server.cli(&kill).unwrap();
    }
    wait_until(
        Duration::from_secs(20),
        "a write with the new password",
        async || coord.edit(&create("queue/c")).await,
    )
    .await;
    let (keys, _) = coord.keys("queue/").await.unwrap();
    assert_eq!(keys.len(), 3);
}
