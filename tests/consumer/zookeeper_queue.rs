//! `leaderq consume` on ZooKeeper: three real replicas pointed at a real 3-member ensemble
//! by `Cluster::env()`, tasks written as ZooKeeper producers do (`zkCli.sh create`), and
//! the faults of ZooKeeper's world: a replica SIGKILLed, an ensemble member SIGKILLed, a
//! leader frozen (SIGSTOP) past its session timeout.

use testkit::harness::zookeeper::Ensemble;
use testkit::harness::Cluster;

use super::contract_zookeeper::{producer_client, ZnodeProducer};
use super::*;

/// `Long`, a 4 s handler that takes a lock on the journal and writes `overlap` instead of
/// running if another run of any task still holds it.
fn long_script(journal: &Path) -> String {
    let j = journal.display();
    format!(
        "exec 9>>{j}.lock
if flock -n 9; then
echo \"start $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT\" >> {j}
sleep 4
echo \"end $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT\" >> {j}
else
echo \"overlap $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT\" >> {j}
fi
"
    )
}

/// The test bed on a 3-member ensemble.
type ZkBed = TestBed<Ensemble>;

/// A bed on a fresh ensemble under `chroot`, its replicas with 2 s sessions and the `Long`
/// handler; `None` (skipped) without ZooKeeper.
fn zk_bed(chroot: &str) -> Option<ZkBed> {
    let ensemble = Ensemble::start(3)?
        .and_then(|e| e.with_chroot(chroot))
        .expect("the ensemble starts");
    let mut bed = TestBed::with(ensemble);
    bed.settings = bed
        .settings
        .ttl("2s")
        .handler("Long", &long_script(&bed.journal))
        .set("zookeeper", "wait", "\"5s\"");
    Some(bed)
}

fn runs_of<'a>(journal: &'a [Vec<String>], event: &str) -> Vec<&'a Vec<String>> {
    journal.iter().filter(|line| line[0] == event).collect()
}

fn task(id: u32, task_type: &str, time: u64) -> Vec<u8> {
    json!({"taskId": id.to_string(), "taskType": task_type, "taskTime": time})
        .to_string()
        .into_bytes()
}

/// Tasks created with `zkCli.sh create` run in taskTime order, each once, and are deleted;
/// a SIGKILLed leader's standby takes over with a higher fencing token and loses nothing;
/// `leaderq enqueue`, `tasks list` and `status` work against the ensemble.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zkcli_tasks_run_in_order_once_and_a_killed_leader_loses_nothing() {
    let Some(mut bed) = zk_bed("/queue") else {
        return;
    };
    // A ZooKeeper producer needs the parent; the replicas also create it on start.
    bed.cluster.zkcli(&["create", "/oracleTask"]).unwrap();
    for (id, time) in [(1, 400), (2, 300), (3, 200), (4, 100)] {
        bed.cluster
            .produce(&format!("oracleTask/task_{id}"), &task(id, "Work", time))
            .unwrap();
    }
    for node in ["zk-a", "zk-b", "zk-c"] {
        bed.start_replica(node);
    }
    bed.wait_journal(Duration::from_secs(60), "four runs", |j| {
        runs_of(j, "run").len() >= 4
    })
    .await;
    let journal = bed.journal();
    let runs = runs_of(&journal, "run");
    let ids: Vec<&str> = runs.iter().map(|r| r[1].as_str()).collect();
    assert_eq!(
        ids,
        ["4", "3", "2", "1"],
        "not in taskTime order: {journal:?}"
    );
    let leader = runs[0][3].clone();
    let token: u64 = runs[0][2].parse().unwrap();
    assert!(runs.iter().all(|r| r[3] == leader), "{journal:?}");

    // Delivery is at-least-once: a run whose completion is not written yet runs again
    // after a crash. Killed once all four are completed, nothing may run twice.
    bed.wait_until_empty("oracleTask/", Duration::from_secs(10))
        .await;
    let at = bed.replicas.iter().position(|r| r.node == leader).unwrap();
    bed.replicas[at].kill();
    let killed_at = Instant::now();
    for id in [5, 6] {
        bed.cluster
            .produce(&format!("oracleTask/task_{id}"), &task(id, "Work", 500))
            .unwrap();
    }
    bed.wait_journal(Duration::from_secs(60), "six runs", |j| {
        runs_of(j, "run").len() >= 6
    })
    .await;
    eprintln!(
        "after the leader's SIGKILL, two zkCli.sh creates ran on a standby within {:?} (TTL 2s)",
        killed_at.elapsed()
    );
    let journal = bed.journal();
    let runs = runs_of(&journal, "run");
    let mut ids: Vec<&str> = runs.iter().map(|r| r[1].as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["1", "2", "3", "4", "5", "6"], "{journal:?}");
    for run in &runs[4..] {
        assert_ne!(run[3], leader, "{journal:?}");
        assert!(run[2].parse::<u64>().unwrap() > token, "{journal:?}");
    }

    let enqueued = bed
        .leaderq(&["enqueue", "--type", "Work", "--id", "e1"])
        .output()
        .unwrap();
    assert!(enqueued.status.success(), "{enqueued:?}");
    bed.wait_journal(Duration::from_secs(30), "the enqueued task", |j| {
        j.iter().any(|r| r[0] == "run" && r[1] == "e1")
    })
    .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(10))
        .await;
    let status = bed.leaderq(&["status", "--json"]).output().unwrap();
    assert!(status.status.success(), "{status:?}");
    let report: Value = serde_json::from_slice(&status.stdout).unwrap();
    let new_leader = report["leader"]["node"].as_str().unwrap_or_default();
    assert!(
        ["zk-a", "zk-b", "zk-c"].contains(&new_leader) && new_leader != leader,
        "{report}"
    );
    assert_eq!(report["pending"], 0, "{report}");
    let listed = bed.leaderq(&["tasks", "list", "--json"]).output().unwrap();
    assert!(listed.status.success(), "{listed:?}");
    assert_eq!(
        serde_json::from_slice::<Value>(&listed.stdout).unwrap(),
        json!([])
    );
    let journal = bed.journal();
    assert_eq!(runs_of(&journal, "run").len(), 7, "{journal:?}");
}

/// With one ensemble member SIGKILLed (quorum kept) the queue goes on; a leader frozen
/// (SIGSTOP) mid-task past its session timeout loses its session, its handler is killed
/// before a standby runs the task again, and no two runs ever overlap; the member, started
/// again, rejoins and the queue still goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_kill_stops_nothing_and_a_frozen_leader_never_overlaps() {
    let Some(mut bed) = zk_bed("/faults") else {
        return;
    };
    for node in ["zk-a", "zk-b", "zk-c"] {
        bed.start_replica(node);
    }
    let producer = ZnodeProducer {
        client: producer_client(&bed.cluster.connect()).await,
        leader_key: "consumerLeader".into(),
    };
    use testkit::contract::Producer as _;
    producer
        .put("oracleTask/task_1", &task(1, "Work", 1))
        .await
        .unwrap();
    bed.wait_journal(Duration::from_secs(60), "the first run", |j| {
        !runs_of(j, "run").is_empty()
    })
    .await;

    let member = bed.cluster.leader().unwrap_or(0);
    bed.cluster.kill_member(member).unwrap();
    for id in [2, 3] {
        producer
            .put(&format!("oracleTask/task_{id}"), &task(id, "Work", 2))
            .await
            .unwrap();
    }
    bed.wait_journal(Duration::from_secs(60), "runs with a member down", |j| {
        runs_of(j, "run").len() >= 3
    })
    .await;

    producer
        .put("oracleTask/task_9", &task(9, "Long", 3))
        .await
        .unwrap();
    bed.wait_journal(Duration::from_secs(30), "the long run's start", |j| {
        !runs_of(j, "start").is_empty()
    })
    .await;
    let frozen = bed.journal().iter().find(|r| r[0] == "start").unwrap()[3].clone();
    let at = bed.replicas.iter().position(|r| r.node == frozen).unwrap();
    let pid = bed.replicas[at].pid();
    common::signal(pid, "STOP");
    let frozen_at = Instant::now();
    bed.wait_journal(Duration::from_secs(30), "a standby's run", |j| {
        j.iter().any(|r| r[0] == "start" && r[3] != frozen)
    })
    .await;
    eprintln!(
        "a frozen leader's task ran again on a standby {:?} after SIGSTOP (session timeout 2s)",
        frozen_at.elapsed()
    );
    common::signal(pid, "CONT");
    bed.wait_journal(Duration::from_secs(30), "the long run's end", |j| {
        !runs_of(j, "end").is_empty()
    })
    .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(15))
        .await;
    let journal = bed.journal();
    assert!(runs_of(&journal, "overlap").is_empty(), "{journal:?}");
    let ends = runs_of(&journal, "end");
    assert_eq!(ends.len(), 1, "{journal:?}");
    assert_ne!(ends[0][3], frozen, "{journal:?}");
    let starts = runs_of(&journal, "start");
    assert!(
        starts[1][2].parse::<u64>().unwrap() > starts[0][2].parse::<u64>().unwrap(),
        "{journal:?}"
    );
    let mut ids: Vec<&str> = runs_of(&journal, "run")
        .iter()
        .map(|r| r[1].as_str())
        .collect();
    ids.sort();
    // A member kill can cut the leader's connection while a completion is in flight; its
    // outcome unknown, the task may run again (at-least-once; never two runs at once,
    // checked above). Seen once under load: task 2 ran twice, one after the other.
    if ids.len() > 3 {
        eprintln!("a task ran again across the member kill: {journal:?}");
        ids.dedup();
    }
    let told: Vec<String> = bed
        .replicas
        .iter()
        .flat_map(|r| {
            r.log_text()
                .lines()
                .filter(|l| l.contains("task_2") || l.contains("task_3") || l.contains("WARN"))
                .map(|l| format!("{}: {l}", r.node))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(ids, ["1", "2", "3"], "{journal:?}\n{}", told.join("\n"));

    // The killed member comes back on its own data and the queue still goes on.
    bed.cluster.restart_member(member).unwrap();
    producer
        .put("oracleTask/task_4", &task(4, "Work", 4))
        .await
        .unwrap();
    bed.wait_journal(Duration::from_secs(30), "a run after the restart", |j| {
        j.iter().any(|r| r[0] == "run" && r[1] == "4")
    })
    .await;
}

/// A leader SIGKILLed and started again at once on its data dir does not wait out its old
/// session (which ZooKeeper keeps for the whole session timeout): it clears its old latch
/// znode and leads again well within that timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leader_does_not_wait_for_its_old_session() {
    let Some(mut bed) = zk_bed("/restart") else {
        return;
    };
    bed.settings = bed.settings.ttl("8s");
    bed.start_replica("zk-a");
    let producer = ZnodeProducer {
        client: producer_client(&bed.cluster.connect()).await,
        leader_key: "consumerLeader".into(),
    };
    use testkit::contract::Producer as _;
    producer
        .put("oracleTask/task_1", &task(1, "Work", 1))
        .await
        .unwrap();
    bed.wait_journal(Duration::from_secs(30), "the first run", |j| {
        !runs_of(j, "run").is_empty()
    })
    .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(10))
        .await;
    bed.replicas[0].kill();
    let restarted = Instant::now();
    bed.replicas.clear();
    bed.start_replica("zk-a");
    producer
        .put("oracleTask/task_2", &task(2, "Work", 2))
        .await
        .unwrap();
    bed.wait_journal(Duration::from_secs(30), "a run after the restart", |j| {
        runs_of(j, "run").len() >= 2
    })
    .await;
    let took = restarted.elapsed();
    eprintln!("a restarted leader ran a new task {took:?} after its SIGKILL (session timeout 8s)");
    assert!(
        took < Duration::from_secs(6),
        "it waited for its old session: {took:?}"
    );
    let journal = bed.journal();
    assert!(
        journal[1][2].parse::<u64>().unwrap() > journal[0][2].parse::<u64>().unwrap(),
        "{journal:?}"
    );
}
