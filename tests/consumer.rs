//! Integration tests of `leaderq consume`: real `leaderq server` and consumer processes,
//! real HTTP, handlers that append to a journal file; leaders killed with SIGTERM and
//! SIGKILL. Short TTLs come from the server's `--session-ttl-min 1s` test knob.

// First, so that its macro is in scope in every module below.
#[macro_use]
#[path = "consumer/toolbox.rs"]
mod toolbox;

#[path = "consumer/blips.rs"]
mod blips;
#[path = "consumer/caps.rs"]
mod caps;
#[path = "consumer/catalog.rs"]
mod catalog;
#[path = "consumer/checkpoints.rs"]
mod checkpoints;
mod common;
#[path = "consumer/contract_consul.rs"]
mod contract_consul;
#[path = "consumer/contract_etcd.rs"]
mod contract_etcd;
#[path = "consumer/contract_redis.rs"]
mod contract_redis;
#[path = "consumer/contract_zookeeper.rs"]
mod contract_zookeeper;
#[path = "consumer/coord_consul.rs"]
mod coord_consul;
#[path = "consumer/coordinator_losses.rs"]
mod coordinator_losses;
#[path = "consumer/dashboard.rs"]
mod dashboard;
#[path = "consumer/data_loss.rs"]
mod data_loss;
#[path = "consumer/etcd_queue.rs"]
mod etcd_queue;
#[path = "consumer/gateway.rs"]
mod gateway;
#[path = "consumer/groups.rs"]
mod groups;
#[path = "consumer/hostile_input.rs"]
mod hostile_input;
#[path = "consumer/identity.rs"]
mod identity;
#[path = "consumer/late_answers.rs"]
mod late_answers;
#[path = "consumer/lost_answer.rs"]
mod lost_answer;
#[path = "consumer/ops.rs"]
mod ops;
#[path = "consumer/output.rs"]
mod output;
#[path = "consumer/priority.rs"]
mod priority;
#[path = "consumer/queue_edges.rs"]
mod queue_edges;
#[path = "consumer/rates.rs"]
mod rates;
#[path = "consumer/redis_durability.rs"]
mod redis_durability;
#[path = "consumer/redis_queue.rs"]
mod redis_queue;
#[path = "consumer/retries.rs"]
mod retries;
#[path = "consumer/rotation.rs"]
mod rotation;
#[path = "consumer/run_cmd.rs"]
mod run_cmd;
#[path = "consumer/scheduled_tasks.rs"]
mod scheduled_tasks;
#[path = "consumer/schedules.rs"]
mod schedules;
#[path = "consumer/sentinel.rs"]
mod sentinel;
#[path = "consumer/shards.rs"]
mod shards;
#[path = "consumer/supervise.rs"]
mod supervise;
#[path = "consumer/tls.rs"]
mod tls;
#[path = "consumer/type_pause.rs"]
mod type_pause;
#[path = "consumer/zookeeper_queue.rs"]
mod zookeeper_queue;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{client, get_json, index_of, ConsumerProcess, ServerProcess};
use serde_json::{json, Value};
use toolbox::{now_ns, wait_until, TestBed, TestSettings};

/// Opens a 30 s lease of `node`'s on `coord` and wins the free leadership with it.
async fn leading_on(
    coord: &dyn leaderq::coord::Coordinator,
    node: &str,
) -> (leaderq::coord::LeaseId, leaderq::coord::Leadership) {
    let spec = leaderq::coord::LeaseSpec {
        node_id: node.into(),
        ttl: Duration::from_secs(30),
        takeover_delay: Duration::ZERO,
        previous: None,
    };
    let lease = coord.open_lease(&spec).await.unwrap().lease;
    let leaderq::coord::Campaign::Won(leadership) = coord
        .campaign(&lease, &leaderq::coord::HolderRecord::default())
        .await
        .unwrap()
    else {
        panic!("a free leadership was not won");
    };
    (lease, leadership)
}

/// How long the server stays down in `consumers_recover_after_the_server_restarts`: long
/// enough that the replicas' requests fail meanwhile, as in a real restart.
const SERVER_DOWN: Duration = Duration::from_millis(500);

/// How long a paused queue must stay idle: an unpaused leader runs a put task in well
/// under a second.
const PAUSED_QUIET: Duration = Duration::from_millis(1500);

/// The test bed on a `leaderq server` of its own: the Consul backend, with its HTTP API
/// at hand.
type Bed = TestBed<ServerProcess>;

impl Bed {
    fn new() -> Bed {
        TestBed::consul()
    }

    /// A bed whose replicas use a 1s session TTL, for tests that wait for one to expire.
    fn with_short_ttl() -> Bed {
        let mut bed = TestBed::consul();
        bed.settings = bed.settings.ttl("1s");
        bed
    }

    async fn put_task(&self, name: &str, task: Value) {
        let response = client()
            .put(self.url(&format!("/v1/kv/oracleTask/{name}")))
            .body(task.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.text().await.unwrap(), "true");
    }

    async fn dead_letters(&self) -> HashMap<String, Value> {
        let response = client()
            .get(self.url("/v1/kv/oracleTaskDead/?recurse"))
            .send()
            .await
            .unwrap();
        if response.status() == 404 {
            return HashMap::new();
        }
        let entries: Value = response.json().await.unwrap();
        common::values_by_key(&entries)
            .into_iter()
            .map(|(key, value)| (key, serde_json::from_slice(&value).unwrap()))
            .collect()
    }
}

/// 200 tasks with taskTime as numbers, numeric strings and RFC 3339, queued before the
/// replicas start: each runs exactly once, in taskTime order, on the leader only, and is
/// deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_run_exactly_once_in_order_on_the_leader_only() {
    let mut bed = Bed::new();
    for n in 0..200u64 {
        // Keys in reverse of time order, so order cannot come from key order.
        let seconds = 1_445_599_887 + (n * 7919) % 200 * 10;
        let time = match n % 3 {
            0 => json!(seconds),
            1 => json!(seconds.to_string()),
            _ => json!(chrono::DateTime::from_timestamp(seconds as i64, 0)
                .unwrap()
                .to_rfc3339()),
        };
        let taken = if n % 2 == 0 {
            json!(false)
        } else {
            json!("false")
        };
        bed.put_task(
            &format!("task_{:03}", 199 - n),
            json!({"taskId": format!("t{n}"), "taskTime": time, "taskTaken": taken, "taskType": "Work", "taskPara": {"n": n}}),
        )
        .await;
    }
    for node in ["r1", "r2", "r3"] {
        bed.start_replica(node);
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;
    let journal = bed.journal();
    assert_eq!(journal.len(), 200, "every task runs exactly once");
    let ids: Vec<u64> = journal.iter().map(|l| l[1][1..].parse().unwrap()).collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 200);
    let times: Vec<u64> = ids.iter().map(|n| (n * 7919) % 200).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "not in taskTime order: {times:?}"
    );
    let nodes: std::collections::HashSet<&String> = journal.iter().map(|l| &l[3]).collect();
    assert_eq!(nodes.len(), 1, "followers ran handlers: {nodes:?}");
    let leader = bed.leader(Duration::from_secs(30)).await;
    assert!(nodes.contains(&leader));
}

/// The seed producer's exact curl command enqueues a task that runs and is deleted.
#[tokio::test]
async fn task_written_like_the_seed_producer_is_executed() {
    let mut bed = Bed::new();
    bed.start_replica("r1");
    bed.leader(Duration::from_secs(30)).await;
    let status = std::process::Command::new("curl")
        .args(["-s", "-X", "PUT"])
        .arg(bed.cluster.url("/v1/kv/oracleTask/task_1"))
        .args(["-d", r#"{"taskId":"1","taskTime":"1445599887","taskTaken":false,"taskType":"Work","taskPara":{"name":"users"}}"#])
        .status()
        .expect("curl runs");
    assert!(status.success());
    let line = bed
        .wait_for_line(Duration::from_secs(10), |l| l[0] == "run")
        .await;
    assert_eq!(line[1], "1");
    bed.wait_until_empty("oracleTask/", Duration::from_secs(10))
        .await;
}

/// SIGTERM of the leader mid-queue: it finishes its running task, hands over, and the
/// standby finishes the queue; nothing runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_over_to_a_standby_that_finishes_the_queue() {
    let mut bed = Bed::new();
    bed.start_replica("r1");
    bed.start_replica("r2");
    let first = bed.leader(Duration::from_secs(30)).await;
    for n in 0..6 {
        bed.put_task(
            &format!("task_{n}"),
            json!({"taskId": format!("s{n}"), "taskTime": n, "taskType": "Slow"}),
        )
        .await;
    }
    bed.wait_for_line(Duration::from_secs(10), |l| l[0] == "start")
        .await;
    let status = bed.replica(&first).terminate();
    assert!(status.success(), "leader exit status {status}");
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;
    let journal = bed.journal();
    let ends: Vec<&Vec<String>> = journal.iter().filter(|l| l[0] == "end").collect();
    let mut ids: Vec<&str> = ends.iter().map(|l| l[1].as_str()).collect();
    ids.sort();
    assert_eq!(
        ids,
        ["s0", "s1", "s2", "s3", "s4", "s5"],
        "each task completes once: {journal:?}"
    );
    assert_eq!(
        journal.iter().filter(|l| l[0] == "start").count(),
        6,
        "no task started twice"
    );
    assert!(
        ends.iter().any(|l| l[3] != first),
        "the standby did not take over"
    );
    let tokens: Vec<u64> = ends.iter().map(|l| l[2].parse().unwrap()).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "fencing tokens went down: {tokens:?}"
    );
}

/// SIGKILL of the leader mid-task: its session expires, the task is requeued and the new
/// leader completes it with a higher fencing token; no task is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_task_requeues_it_for_the_new_leader() {
    let mut bed = Bed::with_short_ttl();
    bed.start_replica("r1");
    bed.start_replica("r2");
    let first = bed.leader(Duration::from_secs(30)).await;
    bed.put_task(
        "task_k",
        json!({"taskId": "k", "taskTime": "1", "taskType": "Slow"}),
    )
    .await;
    bed.put_task(
        "task_after",
        json!({"taskId": "after", "taskTime": "2", "taskType": "Work"}),
    )
    .await;
    let started = bed
        .wait_for_line(Duration::from_secs(10), |l| l[0] == "start" && l[1] == "k")
        .await;
    assert_eq!(started[3], first);
    bed.replica(&first).kill();
    let finished = bed
        .wait_for_line(Duration::from_secs(30), |l| {
            l[0] == "end" && l[1] == "k" && l[3] != first
        })
        .await;
    assert!(finished[2].parse::<u64>().unwrap() > started[2].parse::<u64>().unwrap());
    assert_eq!(finished[4], "2", "the interrupted run counts as an attempt");
    bed.wait_until_empty("oracleTask/", Duration::from_secs(30))
        .await;
    assert!(bed
        .journal()
        .iter()
        .any(|l| l[0] == "run" && l[1] == "after"));
}

/// A failing handler is retried with backoff, then the task lands in dead-letter with its
/// attempts and last error.
#[tokio::test]
async fn failing_task_is_retried_then_dead_lettered() {
    let mut bed = Bed::new();
    bed.start_replica("r1");
    bed.put_task(
        "task_f",
        json!({"taskId": "f", "taskTime": 1, "taskType": "Fail", "keep": {"me": true}}),
    )
    .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(20))
        .await;
    let attempts: Vec<String> = bed
        .journal()
        .iter()
        .filter(|l| l[0] == "fail")
        .map(|l| l[4].clone())
        .collect();
    assert_eq!(attempts, ["1", "2", "3"]);
    let dead = bed.dead_letters().await;
    let letter = &dead["oracleTaskDead/task_f"];
    assert_eq!(letter["attempts"], 3);
    assert!(
        letter["lastError"].as_str().unwrap().contains("boom"),
        "{letter}"
    );
    assert!(
        letter["deadReason"]
            .as_str()
            .unwrap()
            .starts_with("failed 3 times"),
        "{letter}"
    );
    assert_eq!(letter["keep"], json!({"me": true}));
    assert_eq!(letter["originalKey"], "oracleTask/task_f");
}

/// Malformed and unknown tasks go to dead-letter with their reasons, and a good task
/// queued among them still runs.
#[tokio::test]
async fn malformed_tasks_are_dead_lettered_and_the_loop_goes_on() {
    let mut bed = Bed::new();
    let raw = |name: &str, body: &str| {
        let url = bed.cluster.url(&format!("/v1/kv/oracleTask/{name}"));
        let body = body.to_string();
        async move { client().put(url).body(body).send().await.unwrap() }
    };
    raw("not_json", "this is not json").await;
    raw("array", "[1,2]").await;
    raw("no_type", r#"{"taskTime":1}"#).await;
    raw("bad_time", r#"{"taskType":"Work","taskTime":"soon"}"#).await;
    raw("unknown", r#"{"taskType":"Nope","taskTime":1}"#).await;
    raw("good", r#"{"taskId":"g","taskType":"Work","taskTime":5}"#).await;
    bed.start_replica("r1");
    bed.wait_until_empty("oracleTask/", Duration::from_secs(20))
        .await;
    assert!(bed.journal().iter().any(|l| l[0] == "run" && l[1] == "g"));
    let dead = bed.dead_letters().await;
    let reason = |name: &str| {
        dead[&format!("oracleTaskDead/{name}")]["deadReason"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(reason("not_json").starts_with("value is not JSON"));
    assert_eq!(reason("array"), "value is a JSON array, not an object");
    assert_eq!(reason("no_type"), "taskType is missing");
    assert!(reason("bad_time").starts_with("taskTime \"soon\""));
    assert_eq!(reason("unknown"), "no handler for taskType \"Nope\"");
    assert_eq!(
        dead["oracleTaskDead/not_json"]["rawValue"],
        "this is not json"
    );
}

/// SIGKILL and restart of the server: the replicas ride it out and finish what is queued
/// after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_recover_after_the_server_restarts() {
    let mut bed = Bed::new();
    bed.start_replica("r1");
    bed.start_replica("r2");
    bed.leader(Duration::from_secs(30)).await;
    bed.put_task(
        "task_before",
        json!({"taskId": "before", "taskTime": 1, "taskType": "Work"}),
    )
    .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(10))
        .await;
    let addr = bed.cluster.addr.clone();
    let data_dir = bed.cluster.data_dir.clone();
    let temp = bed.cluster.take_temp();
    bed.cluster.kill();
    // Down for a while, as in a real restart: the replicas' requests fail meanwhile.
    tokio::time::sleep(SERVER_DOWN).await;
    *bed.cluster =
        ServerProcess::start_at(&addr, &data_dir, &[]).expect("restart on the same port");
    for n in 0..5 {
        bed.put_task(
            &format!("task_after_{n}"),
            json!({"taskId": format!("a{n}"), "taskTime": n, "taskType": "Work"}),
        )
        .await;
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(30))
        .await;
    let journal = bed.journal();
    for n in 0..5 {
        assert_eq!(
            journal.iter().filter(|l| l[1] == format!("a{n}")).count(),
            1,
            "{journal:?}"
        );
    }
    drop(temp);
}

/// `leaderq server` restarted on an empty data directory under a working leader (a
/// coordinator that lost everything, its raft index included): the old leader's run stops
/// before the next leader starts one, a leader is back within TTL + lock-delay + 1 s (with
/// slack for a loaded machine), and every token it hands out is above every token handed
/// out before the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_lost_its_data_never_hands_out_a_lower_token() {
    let mut bed = Bed::new();
    let j = bed.journal.display().to_string();
    bed.settings = bed
        .settings
        .clone()
        .handler(
            "Long",
            &format!("echo $$ > {j}.long; echo \"start $TASK_ID $LEADERQ_FENCING_TOKEN $NODE\" >> {j}; sleep 60"),
        )
        .handler(
            "Check",
            &format!("kill -0 $(cat {j}.long) 2>/dev/null && echo \"overlap $TASK_ID\" >> {j}; echo \"run $TASK_ID $LEADERQ_FENCING_TOKEN $NODE 1\" >> {j}"),
        );
    bed.start_replica("r1");
    bed.start_replica("r2");
    bed.leader(Duration::from_secs(30)).await;
    // Enough writes that the raft index is well above where a new data dir starts.
    for n in 0..20 {
        bed.put_task(
            &format!("before_{n}"),
            json!({"taskId": format!("b{n}"), "taskTime": n, "taskType": "Work"}),
        )
        .await;
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(30))
        .await;
    bed.put_task(
        "long",
        json!({"taskId": "long", "taskTime": 100, "taskType": "Long"}),
    )
    .await;
    wait_until(Duration::from_secs(10), "the long run", async || {
        let journal = bed.journal();
        if journal.iter().any(|l| l[0] == "start") {
            Ok(())
        } else {
            Err(journal)
        }
    })
    .await;
    let before: Vec<u64> = bed
        .journal()
        .iter()
        .filter(|l| l[0] == "run" || l[0] == "start")
        .map(|l| l[2].parse().unwrap())
        .collect();
    let highest = *before.iter().max().unwrap();
    let addr = bed.cluster.addr.clone();
    let wiped = tempfile::tempdir().unwrap();
    let temp = bed.cluster.take_temp();
    bed.cluster.kill();
    tokio::time::sleep(SERVER_DOWN).await;
    let restarted = Instant::now();
    *bed.cluster =
        ServerProcess::start_at(&addr, wiped.path(), &[]).expect("restart on the same port");
    bed.leader(Duration::from_secs(30)).await;
    let back_in = restarted.elapsed();
    eprintln!("a leader was back {back_in:?} after the server restarted empty");
    // TTL 3 s + lock-delay 200 ms + 1 s, and 2 s for a loaded machine.
    assert!(
        back_in < Duration::from_millis(6200),
        "no leader for {back_in:?}\n{}",
        bed.logs()
    );
    for n in 0..3 {
        bed.put_task(
            &format!("after_{n}"),
            json!({"taskId": format!("a{n}"), "taskTime": n, "taskType": "Check"}),
        )
        .await;
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(30))
        .await;
    let journal = bed.journal();
    assert!(
        !journal.iter().any(|l| l[0] == "overlap"),
        "a run started while the old leader's still went on: {journal:?}"
    );
    let after: Vec<u64> = journal
        .iter()
        .filter(|l| l[0] == "run" && l[1].starts_with('a'))
        .map(|l| l[2].parse().unwrap())
        .collect();
    assert_eq!(after.len(), 3, "{journal:?}");
    assert!(
        after.iter().all(|token| *token > highest),
        "a token at or below {highest} after the loss: {after:?}\n{journal:?}"
    );
    drop(temp);
}

/// A producer that re-PUTs a task while it runs never loses its new value: the run's
/// completion leaves the new version queued, and it runs next.
#[tokio::test]
async fn producer_rewrite_during_a_run_is_not_lost() {
    let mut bed = Bed::new();
    bed.start_replica("r1");
    bed.put_task(
        "task_r",
        json!({"taskId": "r1", "taskTime": 1, "taskType": "Slow"}),
    )
    .await;
    bed.wait_for_line(Duration::from_secs(10), |l| l[0] == "start" && l[1] == "r1")
        .await;
    bed.put_task(
        "task_r",
        json!({"taskId": "r2", "taskTime": 1, "taskType": "Slow"}),
    )
    .await;
    bed.wait_for_line(Duration::from_secs(20), |l| l[0] == "end" && l[1] == "r2")
        .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(10))
        .await;
}

/// A leader that is SIGKILLed and restarted at once reuses its persisted session: it leads
/// again at once under a higher fencing token, and the task it was running is put back and
/// rerun under it.
#[tokio::test]
async fn quick_restart_reuses_the_session_and_requeues_the_cut_task() {
    let mut bed = Bed::new();
    bed.start_replica("r1");
    bed.leader(Duration::from_secs(30)).await;
    bed.put_task(
        "task_q",
        json!({"taskId": "q", "taskTime": 1, "taskType": "Slow"}),
    )
    .await;
    let first = bed
        .wait_for_line(Duration::from_secs(10), |l| l[0] == "start" && l[1] == "q")
        .await;
    bed.replica("r1").kill();
    bed.replicas.clear();
    bed.start_replica("r1");
    let again = bed
        .wait_for_line(Duration::from_secs(20), |l| {
            l[0] == "end" && l[1] == "q" && l[4] == "2"
        })
        .await;
    assert!(
        again[2].parse::<u64>().unwrap() > first[2].parse::<u64>().unwrap(),
        "a restart must not reuse a fencing token: {first:?} then {again:?}"
    );
    bed.wait_until_empty("oracleTask/", Duration::from_secs(10))
        .await;
    assert!(bed.replicas[0].log_text().contains("reusing the lease"));
}

/// Bad settings stop the start with the offending key named and a non-zero exit.
#[test]
fn bad_settings_stop_the_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[queue]\nmax_atempts = 3\n").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leaderq"))
        .args(["consume", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("max_atempts") && stderr.contains("queue"),
        "{stderr}"
    );
}

/// The address a replica logged for its observe endpoints.
async fn observe_address(replica: &ConsumerProcess) -> String {
    wait_until(
        Duration::from_secs(10),
        "the observe address in the log",
        async || {
            let log = replica.log_text();
            match log.split("observe endpoints on http://").nth(1) {
                Some(rest) => Ok(rest.split_whitespace().next().unwrap().to_string()),
                None => Err(log),
            }
        },
    )
    .await
}

/// /health, /ready, /leader and /metrics on a replica: the leader shows as leader, and the
/// task counters move when a task runs. The server has its own /metrics.
#[tokio::test]
async fn observe_endpoints_show_leadership_and_counts() {
    let mut bed = Bed::new();
    bed.start_replica("r1");
    let leader = bed.leader(Duration::from_secs(30)).await;
    let observe = observe_address(&bed.replicas[0]).await;
    let get = |path: &str| client().get(format!("http://{observe}{path}")).send();
    assert_eq!(get("/health").await.unwrap().status(), 200);
    assert_eq!(get("/ready").await.unwrap().status(), 200);
    let holder: Value = get("/leader").await.unwrap().json().await.unwrap();
    assert_eq!(holder["node"], json!(leader));
    assert_eq!(holder["this_replica"], true);
    bed.put_task(
        "task_m",
        json!({"taskId": "m", "taskTime": 1, "taskType": "Work"}),
    )
    .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(10))
        .await;
    let metrics = wait_until(
        Duration::from_secs(10),
        "the completion counted",
        async || {
            let text = get("/metrics").await.unwrap().text().await.unwrap();
            if text.contains(r#"leaderq_tasks_completed_total{task_type="Work"} 1"#) {
                Ok(text)
            } else {
                Err(text)
            }
        },
    )
    .await;
    assert!(metrics.contains("leaderq_leader 1"), "{metrics}");
    assert!(metrics.contains(r#"leaderq_tasks_claimed_total{task_type="Work"} 1"#));
    assert!(metrics.contains("leaderq_handler_duration_seconds_bucket"));
    assert!(metrics.contains("leaderq_seconds_since_renewal"));
    let server_metrics = client()
        .get(bed.cluster.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        server_metrics.contains("leaderq_server_http_requests_total"),
        "{server_metrics}"
    );
    assert!(server_metrics.contains("leaderq_server_commit_seconds_bucket"));
}

/// An observe port already in use stops the start with the port and the setting named.
#[test]
fn taken_observe_port_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let data = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leaderq"))
        .arg("consume")
        .env("CONSUL_HTTP_ADDR", "127.0.0.1:1")
        .env("LEADERQ__OBSERVE__LISTEN", format!("127.0.0.1:{port}"))
        .env("LEADERQ__QUEUE__ALLOW_NO_HANDLERS", "true")
        .env("LEADERQ__DATA__DIR", data.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&port.to_string()) && stderr.contains("observe.listen"),
        "{stderr}"
    );
}

fn leaderq(bed: &Bed, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_leaderq"))
        .args(args)
        .env("CONSUL_HTTP_ADDR", &bed.cluster.addr)
        .output()
        .unwrap()
}

/// `tasks list` shows a dead letter with its reason; `tasks retry` brings it back and it
/// runs; unknown keys exit 1 with one line; `purge-dead` asks (refused without a terminal
/// or `--yes`), then clears the prefix.
#[tokio::test]
async fn tasks_cli_lists_retries_and_purges_dead_letters() {
    let mut bed = Bed::new();
    bed.start_replica("r1");
    bed.put_task(
        "task_x",
        json!({"taskId": "x", "taskTime": 1, "taskType": "Flaky"}),
    )
    .await;
    bed.put_task(
        "task_y",
        json!({"taskId": "y", "taskTime": 2, "taskType": "Nope"}),
    )
    .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(20))
        .await;
    let list = leaderq(&bed, &["tasks", "list"]);
    let table = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success(), "{table}");
    assert!(
        table.contains("oracleTaskDead/task_x") && table.contains("failed 3 times"),
        "{table}"
    );
    assert!(table.contains("no handler for taskType"), "{table}");

    let show = leaderq(&bed, &["tasks", "show", "task_x"]);
    assert!(String::from_utf8_lossy(&show.stdout).contains("\"deadReason\""));

    std::fs::write(format!("{}.fixed", bed.journal.display()), "").unwrap();
    let retry = leaderq(&bed, &["tasks", "retry", "task_x"]);
    assert!(
        retry.status.success(),
        "{}",
        String::from_utf8_lossy(&retry.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&retry.stdout).trim(),
        "requeued as oracleTask/task_x"
    );
    let ran = bed
        .wait_for_line(Duration::from_secs(10), |l| l[0] == "run" && l[1] == "x")
        .await;
    assert_eq!(ran[4], "1", "attempts were reset");

    let missing = leaderq(&bed, &["tasks", "show", "nope"]);
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr)
            .trim()
            .lines()
            .count(),
        1
    );
    let not_dead = leaderq(&bed, &["tasks", "retry", "task_zzz"]);
    assert_eq!(not_dead.status.code(), Some(1));

    // Not a terminal to ask on, and no --yes: refused, nothing deleted.
    let unconfirmed = leaderq(&bed, &["tasks", "purge-dead"]);
    assert_eq!(unconfirmed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unconfirmed.stderr).contains("pass --yes"));
    assert_eq!(bed.dead_letters().await.len(), 1);
    let purge = leaderq(&bed, &["tasks", "purge-dead", "--yes"]);
    assert_eq!(
        String::from_utf8_lossy(&purge.stdout).trim(),
        "purged 1 dead letter(s)"
    );
    assert!(bed.dead_letters().await.is_empty());
}

/// `leaderq completions SHELL` prints a script that knows the subcommands and their flags.
#[test]
fn completions_know_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_leaderq"))
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        for word in ["consume", "run", "enqueue", "purge-dead", "--on-loss"] {
            assert!(text.contains(word), "{shell} completions lack {word}");
        }
    }
}

/// `leaderq enqueue` of many files goes on past a task whose key exists, says which, and
/// ends with a summary and exit 1.
#[tokio::test]
async fn enqueue_of_many_files_goes_on_past_a_refused_one_and_sums_up() {
    let bed = Bed::new();
    bed.put_task(
        "task_b",
        json!({"taskId": "b", "taskTime": 1, "taskType": "Work"}),
    )
    .await;
    let mut files = Vec::new();
    for id in ["a", "b", "c"] {
        let file = bed.dir.path().join(format!("{id}.json"));
        std::fs::write(
            &file,
            json!({"taskId": id, "taskTime": 2, "taskType": "Work"}).to_string(),
        )
        .unwrap();
        files.push(file.display().to_string());
    }
    let mut args = vec!["enqueue"];
    args.extend(files.iter().map(String::as_str));
    let out = leaderq(&bed, &args);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("[1/3] enqueued oracleTask/task_a"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[3/3] enqueued oracleTask/task_c"),
        "{stdout}"
    );
    assert!(stdout.contains("enqueued 2 of 3 task(s)"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[2/3] not enqueued: oracleTask/task_b already exists"),
        "{stderr}"
    );
}

/// `leaderq pause` stops the leader claiming (a task put meanwhile stays pending, `status`
/// says paused); `leaderq resume` lets it run.
#[tokio::test]
async fn pause_and_resume_from_the_cli() {
    let mut bed = Bed::new();
    bed.start_replica("p1");
    bed.leader(Duration::from_secs(30)).await;
    let paused = leaderq(&bed, &["pause"]);
    assert!(paused.status.success(), "{paused:?}");
    assert!(String::from_utf8_lossy(&paused.stdout).contains("oracleTask/ paused"));
    bed.put_task(
        "task_p",
        json!({"taskId": "p", "taskTime": 1, "taskType": "Work"}),
    )
    .await;
    // Asserts that nothing happens: a leader that claimed despite the pause would have run
    // the task within this time (it runs a put task in well under a second otherwise).
    tokio::time::sleep(PAUSED_QUIET).await;
    assert!(
        bed.journal().is_empty(),
        "a paused queue ran {:?}",
        bed.journal()
    );
    let status = leaderq(&bed, &["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("paused:        yes"), "{text}");
    assert!(text.contains("pending:       1"), "{text}");
    let resumed = leaderq(&bed, &["resume"]);
    assert!(String::from_utf8_lossy(&resumed.stdout).contains("resumed"));
    bed.wait_until_empty("oracleTask/", Duration::from_secs(30))
        .await;
    assert_eq!(bed.journal().len(), 1);
    let again = leaderq(&bed, &["resume"]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("was not paused"));
}
