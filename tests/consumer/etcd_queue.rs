//! `leaderq consume` on a real 3-member etcd cluster: replicas pointed at it by
//! `Cluster::env()`, tasks written with `etcdctl put` as producers do. Tasks run in
//! `taskTime` order exactly once and are deleted; a killed leader replica, a killed etcd
//! member (quorum kept), the killed etcd raft leader, a frozen leader replica (SIGSTOP
//! past its lease), a frozen etcd member and a replica restarted on its lease lose
//! nothing, and no two runs of a task overlap. `enqueue`, `tasks list` and `status` work
//! against the cluster too.
//!
//! The handler records `start <taskId> <token> <node> <attempt> <pid>` and `end …`, and
//! `overlap <pid>` if the process of an earlier start is still alive when it starts: the
//! records prove or disprove overlapping runs.

use std::sync::Arc;

use leaderq::coord::etcd::{EtcdCoordSettings, EtcdCoordinator};
use testkit::harness::etcd::EtcdCluster;
use testkit::harness::Cluster;

use super::contract_etcd::etcd_client;
use super::*;

const PREFIX: &str = "oracleTask/";

/// The `Run` handler: it records `overlap` for a live process of an earlier start, then
/// `start`, sleeps `run_for`, and records `end`.
fn run_script(journal: &Path, run_for: &str) -> String {
    let j = journal.display();
    format!(
        "while read ev id tok node att pid; do
  if [ \"$ev\" = start ] && [ -n \"$pid\" ]; then
    st=$(cut -d' ' -f3 /proc/$pid/stat 2>/dev/null)
    if [ -n \"$st\" ] && [ \"$st\" != Z ]; then echo \"overlap $pid\" >> {j}; fi
  fi
done < {j}
echo \"start $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT $$\" >> {j}
sleep {run_for}
echo \"end $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT $$\" >> {j}"
    )
}

/// The test bed on a 3-member etcd cluster.
type EtcdBed = TestBed<EtcdCluster>;

/// A bed whose replicas hold 2 s leases (etcd's minimum here is 1 s) and try a task up to 5
/// times; `None` (the test skips) where etcd is not installed.
fn etcd_bed() -> Option<EtcdBed> {
    let mut bed = TestBed::with(EtcdCluster::start(3).expect("an etcd cluster")?);
    bed.settings = bed
        .settings
        .ttl("2s")
        .set("queue", "max_attempts", "5")
        .set("etcd", "wait", "\"5s\"")
        .set("etcd", "request_timeout", "\"3s\"");
    Some(bed)
}

impl EtcdBed {
    /// Starts replica `node` whose `Run` handler sleeps `run_for` between its records.
    fn start_runner(&mut self, node: &str, run_for: &str) {
        let config = self
            .settings
            .clone()
            .handler("Run", &run_script(&self.journal, run_for))
            .toml(node);
        self.start_replica_with(node, &config);
    }

    fn put(&self, name: &str, task: Value) {
        self.produce(name, &task).expect("etcdctl put");
    }

    /// Every `overlap` record: a run that started while an earlier one still ran.
    fn overlaps(&self) -> Vec<Vec<String>> {
        self.journal()
            .into_iter()
            .filter(|l| l[0] == "overlap")
            .collect()
    }

    /// The task ids that ended, each once, sorted; panics if one ended twice.
    fn ended_once(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .journal()
            .into_iter()
            .filter(|l| l[0] == "end")
            .map(|l| l[1].clone())
            .collect();
        ids.sort();
        let before = ids.len();
        ids.dedup();
        assert_eq!(
            before,
            ids.len(),
            "a task ran to its end twice: {:?}",
            self.journal()
        );
        ids
    }
}

fn task(id: &str, time: u64) -> Value {
    json!({"taskId": id, "taskTime": time.to_string(), "taskTaken": false, "taskType": "Run", "taskPara": {"id": id}})
}

/// Tasks written with `etcdctl put` before the replicas start, and one written after (a
/// watch wakes the leader), run exactly once in taskTime order on one replica and are
/// deleted; `enqueue`, `tasks list` and `status` work against the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_tasks_run_in_order_exactly_once_on_the_leader_only() {
    let Some(mut bed) = etcd_bed() else {
        return;
    };
    for n in 0..20u64 {
        // Keys in reverse of time order, so order cannot come from key order.
        bed.put(
            &format!("task_{:02}", 19 - n),
            task(&format!("t{n:02}"), 1_445_599_887 + n),
        );
    }
    for node in ["r1", "r2", "r3"] {
        bed.start_runner(node, "0");
    }
    let leader = bed.leader(Duration::from_secs(20)).await;
    bed.wait_until_empty(PREFIX, Duration::from_secs(60)).await;
    bed.put("task_late", task("t20", 1));
    bed.wait_for_line(Duration::from_secs(10), |l| l[0] == "end" && l[1] == "t20")
        .await;
    bed.wait_until_empty(PREFIX, Duration::from_secs(10)).await;
    // The claim records went with their tasks.
    bed.wait_until_empty("consumerLeader.held/", Duration::from_secs(10))
        .await;

    let journal = bed.journal();
    let ends: Vec<&Vec<String>> = journal.iter().filter(|l| l[0] == "end").collect();
    let ids: Vec<&str> = ends.iter().map(|l| l[1].as_str()).collect();
    let expected: Vec<String> = (0..=20).map(|n| format!("t{n:02}")).collect();
    assert_eq!(
        ids, expected,
        "not each once in taskTime order: {journal:?}"
    );
    assert!(
        ends.iter().all(|l| l[3] == leader),
        "a standby ran a handler: {journal:?}"
    );
    assert_eq!(bed.overlaps(), Vec::<Vec<String>>::new());

    let output = bed
        .leaderq(&["enqueue", "--type", "Run", "--id", "cli-1"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    bed.wait_for_line(Duration::from_secs(10), |l| {
        l[0] == "end" && l[1] == "cli-1"
    })
    .await;
    let status = bed.leaderq(&["status", "--json"]).output().unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        status.to_string().contains(&leader),
        "status does not name the leader {leader}: {status}"
    );
    let list = bed.leaderq(&["tasks", "list"]).output().unwrap();
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
}

/// A killed leader replica, a killed etcd member and then the killed etcd raft leader,
/// while tasks keep coming: a standby takes over, every task runs to its end once, none
/// is lost, no two runs overlap, and fencing tokens never go down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_and_member_kills_lose_nothing() {
    let Some(mut bed) = etcd_bed() else {
        return;
    };
    for node in ["r1", "r2", "r3"] {
        bed.start_runner(node, "0.2");
    }
    let first = bed.leader(Duration::from_secs(20)).await;
    let mut n = 0u64;
    let mut put_some = |bed: &EtcdBed, count: u64| {
        for _ in 0..count {
            bed.put(&format!("task_{n:03}"), task(&format!("k{n:03}"), n));
            n += 1;
        }
    };
    put_some(&bed, 6);
    bed.wait_for_line(Duration::from_secs(10), |l| l[0] == "start")
        .await;
    bed.replica(&first).kill();
    let killed = Instant::now();
    bed.leader_other_than(&first, Duration::from_secs(20)).await;
    eprintln!(
        "a standby led {:?} after SIGKILL of the leader (lease TTL 2s)",
        killed.elapsed()
    );
    put_some(&bed, 6);

    let follower = (0..3)
        .find(|i| Some(*i) != bed.cluster.leader_member())
        .unwrap();
    bed.cluster.kill_member(follower).unwrap();
    put_some(&bed, 6);
    bed.wait_until_empty(PREFIX, Duration::from_secs(60)).await;
    bed.cluster.restart_member(follower).unwrap();

    let etcd_leader = bed.cluster.leader_member().expect("an etcd leader");
    bed.cluster.kill_member(etcd_leader).unwrap();
    let killed = Instant::now();
    put_some(&bed, 6);
    eprintln!(
        "6 tasks put {:?} after SIGKILL of the etcd leader member",
        killed.elapsed()
    );
    bed.wait_for_line(Duration::from_secs(30), |l| l[0] == "end" && l[1] == "k023")
        .await;
    eprintln!(
        "the last task ran {:?} after SIGKILL of the etcd leader member",
        killed.elapsed()
    );
    bed.wait_until_empty(PREFIX, Duration::from_secs(60)).await;

    let expected: Vec<String> = (0..24).map(|n| format!("k{n:03}")).collect();
    assert_eq!(bed.ended_once(), expected, "{:?}", bed.journal());
    assert_eq!(bed.overlaps(), Vec::<Vec<String>>::new(), "runs overlapped");
    let tokens: Vec<u64> = bed
        .journal()
        .iter()
        .filter(|l| l[0] == "start")
        .map(|l| l[2].parse().unwrap())
        .collect();
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "fencing tokens went down: {tokens:?}"
    );
}

/// The leader replica frozen (SIGSTOP) mid-task past its lease: its handler is killed by
/// the lease deadline, a standby takes over with a higher token and runs the task again;
/// thawed, the old leader writes nothing; the queue drains with no overlapping runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_leader_loses_its_lease_and_nothing_overlaps() {
    let Some(mut bed) = etcd_bed() else {
        return;
    };
    for node in ["r1", "r2"] {
        bed.start_runner(node, "3");
    }
    let leader = bed.leader(Duration::from_secs(20)).await;
    bed.put("task_a", task("a", 1));
    bed.put("task_b", task("b", 2));
    bed.wait_for_line(Duration::from_secs(10), |l| l[0] == "start" && l[1] == "a")
        .await;
    bed.replica(&leader).signal("STOP");
    bed.wait_for_line(Duration::from_secs(20), |l| {
        l[0] == "start" && l[1] == "a" && l[3] != leader
    })
    .await;
    bed.replica(&leader).signal("CONT");
    bed.wait_until_empty(PREFIX, Duration::from_secs(60)).await;
    assert_eq!(bed.overlaps(), Vec::<Vec<String>>::new(), "runs overlapped");
    assert_eq!(bed.ended_once(), ["a", "b"], "{:?}", bed.journal());
    let journal = bed.journal();
    let token_of = |node_is_leader: bool| {
        journal
            .iter()
            .find(|l| l[0] == "start" && l[1] == "a" && (l[3] == leader) == node_is_leader)
            .map(|l| l[2].parse::<u64>().unwrap())
            .unwrap()
    };
    assert!(token_of(false) > token_of(true), "{journal:?}");
    assert!(
        journal.iter().all(|l| l[0] != "end" || l[3] != leader),
        "the frozen leader finished a run: {journal:?}"
    );
}

/// A replica SIGKILLed mid-task and restarted at once on its data dir takes its etcd
/// lease up again (well within the lease's TTL, so no standby is needed), leads with a
/// higher fencing token and runs the task it was cut off from again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_takes_its_lease_up_and_leads_with_a_higher_token() {
    let Some(mut bed) = etcd_bed() else {
        return;
    };
    bed.settings = bed.settings.ttl("8s");
    bed.start_runner("r1", "2");
    bed.leader(Duration::from_secs(20)).await;
    bed.put("task_a", task("a", 1));
    bed.wait_for_line(Duration::from_secs(10), |l| l[0] == "start" && l[1] == "a")
        .await;
    bed.replica("r1").kill();
    bed.replicas.clear();
    let killed = Instant::now();
    bed.start_runner("r1", "2");
    bed.wait_for_line(Duration::from_secs(20), |l| {
        l[0] == "end" && l[1] == "a" && l[4] == "2"
    })
    .await;
    let took = killed.elapsed();
    eprintln!("the task ended on its second run {took:?} after the kill (lease TTL 8s)");
    let log = bed.replicas[0].log_text();
    assert!(
        log.contains("reusing the lease from before the restart"),
        "{log}"
    );
    let journal = bed.journal();
    let tokens: Vec<u64> = journal
        .iter()
        .filter(|l| l[0] == "start")
        .map(|l| l[2].parse().unwrap())
        .collect();
    assert!(
        tokens.len() == 2 && tokens[1] > tokens[0],
        "tokens {tokens:?}: {journal:?}"
    );
    assert!(took < Duration::from_secs(8), "not within the lease's TTL");
    assert_eq!(bed.overlaps(), Vec::<Vec<String>>::new(), "runs overlapped");
    bed.wait_until_empty(PREFIX, Duration::from_secs(10)).await;
}

/// The etcd member every replica talks to first, frozen (SIGSTOP: it accepts connections
/// and never answers): requests time out and move on to the other members, so the queue
/// still drains, with nothing lost and no overlapping runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_etcd_member_loses_nothing() {
    let Some(mut bed) = etcd_bed() else {
        return;
    };
    for node in ["r1", "r2", "r3"] {
        bed.start_runner(node, "0.1");
    }
    bed.leader(Duration::from_secs(20)).await;
    bed.put("task_000", task("f000", 0));
    bed.wait_for_line(Duration::from_secs(10), |l| l[0] == "end")
        .await;
    // Its completion recorded before the freeze: a completion cut off by it would leave
    // the task to run again after the lease is lost (at-least-once, not what this counts).
    bed.wait_until_empty(PREFIX, Duration::from_secs(10)).await;
    bed.cluster.signal_member(0, "STOP");
    let frozen = Instant::now();
    let others = etcd_client(bed.cluster.endpoints()[1..].to_vec());
    for n in 1..8u64 {
        let value = task(&format!("f{n:03}"), n).to_string();
        others
            .put(format!("{PREFIX}task_{n:03}").as_bytes(), value.as_bytes())
            .await
            .expect("a put to the members not frozen");
    }
    bed.coord = Arc::new(EtcdCoordinator::new(
        others,
        EtcdCoordSettings {
            leader_key: "consumerLeader".into(),
        },
    ));
    bed.wait_until_empty(PREFIX, Duration::from_secs(60)).await;
    eprintln!(
        "the queue drained {:?} after an etcd member froze",
        frozen.elapsed()
    );
    bed.cluster.signal_member(0, "CONT");
    let expected: Vec<String> = (0..8).map(|n| format!("f{n:03}")).collect();
    assert_eq!(bed.ended_once(), expected, "{:?}", bed.journal());
    assert_eq!(bed.overlaps(), Vec::<Vec<String>>::new(), "runs overlapped");
}

/// A producer's key that is not UTF-8 (raw bytes in an etcd put), first in claim order,
/// stops nothing: the tasks after it run, each once, and it never runs under a key that is
/// not its own (Redis: `redis_queue::a_task_key_that_is_not_utf8_stops_no_listing`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_key_that_is_not_utf8_stops_nothing() {
    let Some(mut bed) = etcd_bed() else {
        return;
    };
    let client = etcd_client(bed.cluster.endpoints());
    let bad = task("bad", 1_445_599_880).to_string();
    client
        .put(b"oracleTask/task_\xff\xfe", bad.as_bytes())
        .await
        .expect("put a key of raw bytes");
    for n in 0..3u64 {
        bed.put(
            &format!("task_{n}"),
            task(&format!("t{n}"), 1_445_599_887 + n),
        );
    }
    bed.start_runner("r1", "0");
    bed.wait_for_line(Duration::from_secs(30), |l| l[0] == "end" && l[1] == "t2")
        .await;
    assert_eq!(bed.ended_once(), ["t0", "t1", "t2"], "{:?}", bed.journal());
    assert!(
        bed.journal().iter().all(|line| line[1] != "bad"),
        "the task whose key cannot be named ran: {:?}",
        bed.journal()
    );
}
