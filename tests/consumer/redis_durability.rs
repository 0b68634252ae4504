//! What leaderq does with a Redis that can lose acknowledged writes, on real
//! `redis-server` processes: a replica refuses one without the AOF or with an eviction
//! policy, naming the Redis setting and `redis.accept_data_loss` (while `leaderq enqueue`
//! and `status` still work); with the loss accepted, and whatever an operator deletes, the
//! fencing token never goes back: not after a restart that emptied Redis, not after a `DEL`
//! of the counter or a `FLUSHALL`, not when Redis's clock is behind a token already seen;
//! and a counter past 2^53 - 1 is refused rather than handed out.

use std::process::Command;
use std::sync::Arc;

use leaderq::coord::redis::RedisCoordinator;
use leaderq::coord::{Campaign, Coordinator, FencingToken, HolderRecord, LeaseSpec};
use testkit::harness::redis::{RedisServer, PREFIX};
use testkit::harness::Cluster;

use super::contract_redis::redis_coordinator;
use super::redis_queue::{redis_bed_on, RedisBed};
use super::*;

/// How long a refusing replica may take to exit: it connects, reads Redis's settings and
/// stops, so this only guards against a replica that never stops.
const EXIT_LIMIT: Duration = Duration::from_secs(30);

/// Starts replica `node` on `bed` and returns its log once it has exited, failing the
/// test if it does not exit or exits with success.
async fn refusal(bed: &mut RedisBed, node: &str) -> String {
    bed.start_replica(node);
    let status = bed.exit_of(node, EXIT_LIMIT).await;
    let log = bed.logs();
    match status {
        None => panic!("{node} still runs after {EXIT_LIMIT:?}:\n{log}"),
        Some(status) => assert!(!status.success(), "{node} exited with success:\n{log}"),
    }
    log
}

/// `leaderq <args>` with the bed's settings; its standard output, failing the test if it
/// fails.
fn leaderq(bed: &RedisBed, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_leaderq"))
        .args(args)
        .envs(bed.cluster.env())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "leaderq {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// A replica against a Redis run with `appendonly no` stops at start with a message that
/// names `appendonly` and the leaderq setting that accepts the risk; `leaderq enqueue` and
/// `status`, which never lead, still work against it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_refuses_a_redis_without_the_aof_and_names_the_setting_that_accepts_it() {
    let Some(server) = RedisServer::start_with("off") else {
        return;
    };
    let mut bed = redis_bed_on(server, "3s");
    let log = refusal(&mut bed, "r1").await;
    assert!(
        log.contains("appendonly") && log.contains("redis.accept_data_loss"),
        "the refusal names neither appendonly nor redis.accept_data_loss:\n{log}"
    );
    let out = leaderq(
        &bed,
        &["enqueue", "--type", "Work", "--para", "{}", "--id", "one"],
    );
    assert!(out.contains("enqueued oracleTask/"), "{out}");
    let status = leaderq(&bed, &["status"]);
    assert!(status.contains("pending:       1"), "{status}");
}

/// A replica against a Redis whose `maxmemory-policy` may evict keys stops at start,
/// naming the policy and `redis.accept_data_loss`: read with `CONFIG GET`, then, once the
/// user may not run CONFIG, from `INFO memory`; once it may run neither, the message says
/// the settings cannot be read and how to accept the risk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_refuses_a_redis_that_may_evict_keys_read_through_config_or_info() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    server
        .cli(&[b"CONFIG", b"SET", b"maxmemory-policy", b"allkeys-lru"])
        .unwrap();
    let mut bed = redis_bed_on(server, "3s");
    let log = refusal(&mut bed, "r1").await;
    assert!(
        log.contains("maxmemory-policy") && log.contains("allkeys-lru"),
        "the refusal does not name the eviction policy:\n{log}"
    );
    assert!(log.contains("redis.accept_data_loss"), "{log}");

    bed.cluster
        .cli(&[b"ACL", b"SETUSER", b"default", b"-config"])
        .unwrap();
    let log = refusal(&mut bed, "r2").await;
    let r2 = log.split("---- r2").nth(1).unwrap_or_default();
    assert!(
        r2.contains("maxmemory-policy") && r2.contains("allkeys-lru"),
        "without CONFIG the policy is not read from INFO:\n{log}"
    );

    bed.cluster
        .cli(&[b"ACL", b"SETUSER", b"default", b"-info"])
        .unwrap();
    let log = refusal(&mut bed, "r3").await;
    let r3 = log.split("---- r3").nth(1).unwrap_or_default();
    assert!(
        r3.contains("cannot be read") && r3.contains("redis.accept_data_loss"),
        "a Redis whose settings cannot be read is not refused with how to accept it:\n{log}"
    );
}

/// With `redis.accept_data_loss = true` replicas run on a Redis without persistence, and
/// when it is killed (SIGKILL) and restarted empty on the same port, the leader elected
/// next holds a higher token than the one before, though the counter restarted from
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_loss_accepted_a_redis_restarted_empty_still_hands_out_a_higher_token() {
    let Some(server) = RedisServer::start_with("off") else {
        return;
    };
    let mut bed = redis_bed_on(server, "1s");
    bed.env
        .push(("LEADERQ__REDIS__ACCEPT_DATA_LOSS".into(), "true".into()));
    bed.start_replica("r1");
    bed.start_replica("r2");
    let (_, before) = bed
        .leadership_other_than(None, Duration::from_secs(20))
        .await;
    bed.cluster.restart_member(0).unwrap();
    let (_, after) = bed
        .leadership_other_than(Some(&before), Duration::from_secs(20))
        .await;
    assert!(
        after.fencing_token > before.fencing_token,
        "the token went from {} to {} across a restart that emptied Redis",
        before.fencing_token,
        after.fencing_token
    );
}

/// Opens a lease for `node` and campaigns with it; the token won.
async fn win(coord: &RedisCoordinator, node: &str) -> FencingToken {
    let grant = coord
        .open_lease(&LeaseSpec {
            node_id: node.into(),
            ttl: Duration::from_secs(10),
            takeover_delay: Duration::ZERO,
            previous: None,
        })
        .await
        .unwrap();
    let record = HolderRecord {
        node: node.into(),
        ..HolderRecord::default()
    };
    match coord.campaign(&grant.lease, &record).await.unwrap() {
        Campaign::Won(leadership) => {
            coord.resign(&leadership.lease).await.unwrap();
            leadership.fencing_token
        }
        other => panic!("{node} did not win a free leadership: {other:?}"),
    }
}

/// An operator's `DEL` of the fencing counter, then a `FLUSHALL` seen by a coordinator
/// that has observed nothing before, never make the next token lower than or equal to the
/// last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_fencing_counter_or_flushing_redis_never_sends_the_token_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let coord = redis_coordinator(&server.url(), PREFIX);
    let first = win(&coord, "n1").await;
    server
        .cli(&[b"DEL", format!("{PREFIX}fencing/consumerLeader").as_bytes()])
        .unwrap();
    let second = win(&coord, "n1").await;
    assert!(
        second > first,
        "after DEL of the counter: {first} then {second}"
    );
    server.cli(&[b"FLUSHALL"]).unwrap();
    let fresh: Arc<RedisCoordinator> = redis_coordinator(&server.url(), PREFIX);
    let third = win(&fresh, "n2").await;
    assert!(third > second, "after FLUSHALL: {second} then {third}");
}

/// A token issued while Redis's clock ran an hour ahead (here: a counter that far ahead)
/// stays below the next one this replica wins after the counter is lost, though Redis's
/// clock is now behind it: the replica passes the highest token it has seen as a floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_a_replica_has_seen_stays_below_its_next_when_the_redis_clock_is_behind() {
    const HOUR_MS: u64 = 3_600_000;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let time = server.cli(&[b"TIME"]).unwrap();
    let mut parts = time.split_whitespace().map(|p| p.parse::<u64>().unwrap());
    let now_ms = parts.next().unwrap() * 1_000 + parts.next().unwrap() / 1_000;
    let ahead = (now_ms + HOUR_MS).to_string();
    server
        .cli(&[
            b"SET",
            format!("{PREFIX}fencing/consumerLeader").as_bytes(),
            ahead.as_bytes(),
        ])
        .unwrap();
    let coord = redis_coordinator(&server.url(), PREFIX);
    let first = win(&coord, "n1").await;
    assert!(
        first.0 > now_ms + HOUR_MS,
        "{first} is not past the counter"
    );
    server.cli(&[b"FLUSHALL"]).unwrap();
    let second = win(&coord, "n1").await;
    assert!(
        second > first,
        "after the counter was lost with Redis's clock behind: {first} then {second}"
    );
}

/// A fencing counter set past 2^53 - 1 (by something other than leaderq) is refused with
/// the key named, and the campaign takes no leadership: a token past it could not be read
/// exactly as a JSON number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_counter_past_2_53_is_refused_and_takes_no_leadership() {
    use leaderq::coord::{CoordError, Version};
    let Some(server) = RedisServer::start() else {
        return;
    };
    server
        .cli(&[
            b"SET",
            format!("{PREFIX}fencing/consumerLeader").as_bytes(),
            (1u64 << 53).to_string().as_bytes(),
        ])
        .unwrap();
    let coord = redis_coordinator(&server.url(), PREFIX);
    let grant = coord
        .open_lease(&LeaseSpec {
            node_id: "n1".into(),
            ttl: Duration::from_secs(10),
            takeover_delay: Duration::ZERO,
            previous: None,
        })
        .await
        .unwrap();
    let answer = coord.campaign(&grant.lease, &HolderRecord::default()).await;
    match answer {
        Err(CoordError::Refused(why)) => {
            assert!(why.contains("fencing/consumerLeader"), "{why}")
        }
        other => panic!("a counter past 2^53 - 1 answered {other:?}"),
    }
    let (holder, _) = coord.observe(Version(0), Duration::ZERO).await.unwrap();
    assert_eq!(holder.lease, None, "the refused campaign took leadership");
}
