//! `leaderq consume` on Redis: three real replicas on one real `redis-server` (AOF on,
//! `appendfsync always`), tasks written with the producers' documented `redis-cli EVAL`;
//! the leader killed, frozen past its TTL (SIGSTOP) and woken, Redis itself killed and
//! restarted under load; `leaderq enqueue`, `tasks list` and `status` against it.

use std::collections::HashMap;
use std::process::Command;

use leaderq::coord::{Coordinator, TaskOp, Version, Written};
use testkit::harness::redis::{RedisServer, PREFIX};
use testkit::harness::{signal_pid, Cluster};

use super::contract_redis::redis_coordinator;
use super::*;

/// The test bed on one Redis, its replicas each leading a process group of its own (a kill
/// reaches their handlers too).
pub(crate) type RedisBed = TestBed<RedisServer>;

/// A bed on a durable Redis (`appendfsync always`); `None` (the test skips) where Redis is
/// not installed.
pub(crate) fn redis_bed(ttl: &str) -> Option<RedisBed> {
    Some(redis_bed_on(RedisServer::start()?, ttl))
}

/// A bed on `server`, whatever its persistence settings, whose replicas hold leases of
/// `ttl`. One more handler, `Exclusive`: its runs hold a lock on a file, so a second run
/// while the first still lives (a frozen leader's handler left running) writes "overlap".
pub(crate) fn redis_bed_on(server: RedisServer, ttl: &str) -> RedisBed {
    let mut bed = TestBed::with(server);
    let journal = bed.journal.display();
    let exclusive = format!(
        "flock -n {journal}.lock sh -c 'echo \"start $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT\" >> {journal}; sleep 2; echo \"end $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT\" >> {journal}' || echo \"overlap $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT\" >> {journal}"
    );
    bed.settings = bed.settings.ttl(ttl).handler("Exclusive", &exclusive);
    bed.env.push(("LEADERQ__REDIS__WAIT".into(), "5s".into()));
    bed.own_group = true;
    bed
}

impl RedisBed {
    /// How replica `node` exited, once it has, or `None` if it still runs after `limit`.
    pub(crate) async fn exit_of(
        &mut self,
        node: &str,
        limit: Duration,
    ) -> Option<std::process::ExitStatus> {
        let replica = self.replica(node);
        tokio::time::timeout(
            limit,
            wait_until(Duration::MAX, "the replica exits", async || {
                replica.try_wait().ok_or("running")
            }),
        )
        .await
        .ok()
    }
}

fn work(n: u64, seconds: u64) -> Value {
    json!({"taskId": format!("t{n}"), "taskTime": seconds, "taskTaken": false, "taskType": "Work", "taskPara": {"n": n}})
}

/// Writes task `t<n>` under `task_<n>` for each `n` of `numbers`, at times in that order.
fn produce_work(bed: &RedisBed, numbers: std::ops::Range<u64>) {
    for n in numbers {
        bed.produce(&format!("task_{n}"), &work(n, 1_445_599_887 + n))
            .unwrap();
    }
}

/// Waits until `count` tasks have run (`what` names them).
async fn wait_runs(bed: &RedisBed, count: usize, what: &str) {
    bed.wait_journal(Duration::from_secs(30), what, |journal| {
        runs(journal).len() == count
    })
    .await;
}

/// Writes the task `slow` (a second of work) and waits until its run has started.
async fn slow_task_started(bed: &RedisBed) {
    let slow = json!({"taskId": "slow", "taskTime": 1, "taskType": "Slow"});
    bed.produce("slow", &slow).unwrap();
    bed.wait_for_line(Duration::from_secs(10), |l| {
        l[0] == "start" && l[1] == "slow"
    })
    .await;
}

/// The ids of `run` lines in the journal, with how often each ran.
fn runs(journal: &[Vec<String>]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for line in journal.iter().filter(|l| l[0] == "run") {
        *counts.entry(line[1].clone()).or_insert(0) += 1;
    }
    counts
}

/// Three replicas on one Redis run tasks written with the producers' `redis-cli EVAL` in
/// taskTime order, exactly once, on the leader only, and delete them; when the leader is
/// killed, a standby takes over and runs what comes next with a higher fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replicas_run_tasks_once_in_order_and_survive_a_leader_kill() {
    let Some(mut bed) = redis_bed("3s") else {
        return;
    };
    // Batches as configured by default: a handler that runs slow on a loaded machine sends
    // the rest of its batch back, and the leader must still run those before later tasks
    // (this test found the planner claiming a later one first; queue/tests.rs pins it).
    for n in 0..60u64 {
        // Keys in reverse of time order, so order cannot come from key order.
        let seconds = 1_445_599_887 + (n * 7919) % 60 * 10;
        bed.produce(&format!("task_{:03}", 59 - n), &work(n, seconds))
            .unwrap();
    }
    for node in ["r1", "r2", "r3"] {
        bed.start_replica(node);
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;
    let journal = bed.journal();
    assert_eq!(
        journal.len(),
        60,
        "every task runs exactly once: {journal:?}"
    );
    let ids: Vec<u64> = journal.iter().map(|l| l[1][1..].parse().unwrap()).collect();
    let times: Vec<u64> = ids.iter().map(|n| (n * 7919) % 60).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "not in taskTime order: {times:?}\n{journal:?}\n{}",
        bed.logs()
    );
    let nodes: std::collections::HashSet<&String> = journal.iter().map(|l| &l[3]).collect();
    assert_eq!(nodes.len(), 1, "followers ran handlers: {nodes:?}");

    // The leader is killed mid-task: the task its dead lease claimed is taken up again by
    // the standby that wins, and everything written after runs there.
    let (first, before) = bed
        .leadership_other_than(None, Duration::from_secs(10))
        .await;
    slow_task_started(&bed).await;
    bed.replica(&first).kill();
    for n in 100..120u64 {
        bed.produce(&format!("task_{n}"), &work(n, 1_445_599_887 + n))
            .unwrap();
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;
    let (second, after) = bed
        .leadership_other_than(None, Duration::from_secs(10))
        .await;
    assert_ne!(first, second, "the killed leader still leads");
    assert!(after.fencing_token > before.fencing_token);
    let journal = bed.journal();
    let counts = runs(&journal);
    assert_eq!(counts.len(), 80, "a task was lost: {journal:?}");
    assert!(
        counts.values().all(|&c| c == 1),
        "a task ran twice: {counts:?}"
    );
    assert!(
        journal
            .iter()
            .any(|l| l[0] == "end" && l[1] == "slow" && l[3] == second),
        "the dead leader's task did not run to its end on {second}: {journal:?}"
    );
    assert!(journal
        .iter()
        .filter(|l| l[0] == "run" && l[1][1..].parse::<u64>().unwrap() >= 100)
        .all(|l| l[3] == second && l[2].parse::<u64>().unwrap() == after.fencing_token.0));
}

/// A leader frozen (SIGSTOP) past its TTL in the middle of a task loses leadership to a
/// standby, which reruns that task (its supervisor killed the frozen leader's run before
/// the lease could end: the two runs never overlap) and runs what is written meanwhile;
/// once woken (SIGCONT), a write under its old leadership answers NotLeader and changes
/// nothing, and it runs nothing more: every task runs once, those written after the
/// freeze under the new leader's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_frozen_past_its_ttl_is_fenced_off_when_it_wakes() {
    let Some(mut bed) = redis_bed("1s") else {
        return;
    };
    bed.start_replica("r1");
    let (frozen, old) = bed
        .leadership_other_than(None, Duration::from_secs(10))
        .await;
    bed.start_replica("r2");
    for n in 0..3u64 {
        bed.produce(&format!("before_{n}"), &work(n, 1_445_599_887 + n))
            .unwrap();
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(20))
        .await;
    let long = json!({"taskId": "long", "taskTime": 1, "taskType": "Exclusive"});
    bed.produce("long", &long).unwrap();
    bed.wait_for_line(Duration::from_secs(10), |l| {
        l[0] == "start" && l[1] == "long"
    })
    .await;
    let pid = bed.replica(&frozen).pid();
    signal_pid(pid, "STOP");
    let (next, new) = bed
        .leadership_other_than(Some(&old), Duration::from_secs(10))
        .await;
    assert_ne!(next, frozen);
    assert!(new.fencing_token > old.fencing_token);
    for n in 10..15u64 {
        bed.produce(&format!("frozen_{n}"), &work(n, 1_445_599_887 + n))
            .unwrap();
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(20))
        .await;

    // What the woken leader would write, through the same seam, on a task outside the
    // queue (so the new leader leaves it alone): refused by the fencing check, untouched.
    let probe_key = "probe/t99".to_string();
    bed.cluster
        .produce(&probe_key, work(99, 1).to_string().as_bytes())
        .unwrap();
    let probe = bed
        .coord
        .get(std::slice::from_ref(&probe_key))
        .await
        .unwrap();
    let claim = TaskOp::Claim {
        key: probe_key.clone(),
        version: probe[0].version,
        value: b"{\"taskTaken\":true}".to_vec(),
    };
    signal_pid(pid, "CONT");
    let written = bed
        .coord
        .write(&old, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(written, Written::NotLeader);
    let after = bed
        .coord
        .get(std::slice::from_ref(&probe_key))
        .await
        .unwrap();
    assert_eq!(after, probe, "a refused write changed the task");
    for n in 20..25u64 {
        bed.produce(&format!("woken_{n}"), &work(n, 1_445_599_887 + n))
            .unwrap();
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(20))
        .await;
    let journal = bed.journal();
    let counts = runs(&journal);
    assert_eq!(counts.len(), 13, "a task was lost: {journal:?}");
    assert!(
        counts.values().all(|&c| c == 1),
        "a task ran twice: {journal:?}"
    );
    let long: Vec<&Vec<String>> = journal.iter().filter(|l| l[1] == "long").collect();
    assert!(
        long.iter().all(|l| l[0] != "overlap")
            && long.iter().filter(|l| l[0] == "end").count() == 1
            && long.last().is_some_and(|l| l[0] == "end" && l[3] == next),
        "the frozen leader's task ran twice at once, or not to its end on {next}: {journal:?}"
    );
    let after_freeze = journal
        .iter()
        .filter(|l| l[0] == "run" && !["t0", "t1", "t2"].contains(&l[1].as_str()));
    for line in after_freeze {
        assert!(
            line[3] == next && line[2].parse::<u64>().unwrap() >= new.fencing_token.0,
            "{line:?} ran after the freeze, not by {next} under token {}",
            new.fencing_token
        );
    }
}

/// Redis killed (SIGKILL) and restarted while tasks are being written and run: with
/// `appendfsync always` every task whose write was acknowledged runs, and the queue
/// drains; writes refused while Redis is down are retried by the producer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_under_load_loses_no_acknowledged_task() {
    let Some(mut bed) = redis_bed("3s") else {
        return;
    };
    for node in ["r1", "r2", "r3"] {
        bed.start_replica(node);
    }
    bed.leadership_other_than(None, Duration::from_secs(10))
        .await;
    let mut acknowledged = Vec::new();
    for n in 0..150u64 {
        if n == 50 {
            bed.cluster.restart_member(0).unwrap();
        }
        // A write refused while Redis is down is retried, as a producer does.
        wait_until(Duration::from_secs(20), "Redis back", async || {
            bed.produce(&format!("task_{n:03}"), &work(n, 1_445_599_887 + n))
        })
        .await;
        acknowledged.push(format!("t{n}"));
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;
    let counts = runs(&bed.journal());
    let lost: Vec<&String> = acknowledged
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .collect();
    assert!(lost.is_empty(), "acknowledged tasks lost: {lost:?}");
    let twice: Vec<(&String, &usize)> = counts.iter().filter(|(_, &c)| c > 1).collect();
    assert!(twice.is_empty(), "tasks ran more than once: {twice:?}");
}

/// `leaderq enqueue`, `tasks list` and `status` work against Redis through the same
/// settings as the replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_tasks_and_status_work_on_redis() {
    let Some(bed) = redis_bed("3s") else {
        return;
    };
    let leaderq = |args: &[&str]| {
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
    };
    let out = leaderq(&[
        "enqueue",
        "--type",
        "Work",
        "--para",
        "{\"n\":1}",
        "--id",
        "one",
    ]);
    assert!(out.contains("enqueued oracleTask/"), "{out}");
    bed.produce("two", &work(2, 1_445_599_887)).unwrap();
    let list = leaderq(&["tasks", "list"]);
    assert!(list.contains("oracleTask/two"), "{list}");
    assert_eq!(list.matches("oracleTask/").count(), 2, "{list}");
    let status = leaderq(&["status"]);
    assert!(
        status.contains("leader:        none") && status.contains("pending:       2"),
        "{status}"
    );
}

/// What a SIGKILL of Redis loses of acknowledged writes, by persistence setting: nothing
/// with the AOF on (`appendfsync always`, `everysec` or `no`: Redis writes the AOF before
/// it answers, so a process crash leaves it in the kernel's page cache; what `everysec` and
/// `no` lose on an OS crash or power loss cannot be measured here), everything without it.
/// The counts are printed for the durability table in docs/redis.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_kill_loses_no_acknowledged_write_with_the_aof_on() {
    const WRITES: usize = 300;
    for policy in ["always", "everysec", "no", "off"] {
        let Some(mut server) = RedisServer::start_with(policy) else {
            return;
        };
        let coord = redis_coordinator(&server.url(), PREFIX);
        for n in 0..WRITES {
            coord
                .produce(
                    &format!("oracleTask/t{n}"),
                    &work(n as u64, 1).to_string().into_bytes(),
                )
                .await
                .unwrap();
        }
        server.restart_member(0).unwrap();
        let coord = redis_coordinator(&server.url(), PREFIX);
        let (tasks, _) = coord
            .list("oracleTask/", Version(0), Duration::ZERO)
            .await
            .unwrap();
        let lost = WRITES - tasks.len();
        eprintln!(
            "redis kill -9 with appendfsync {policy}: {lost} of {WRITES} acknowledged writes lost"
        );
        if policy == "off" {
            assert_eq!(lost, WRITES, "without persistence a restart keeps tasks?");
        } else {
            assert_eq!(lost, 0, "appendfsync {policy} lost acknowledged writes");
        }
    }
}

/// An operator's `redis-cli DEL` of the task index (`leaderq/tasks`, the sorted set of
/// every task's key) loses no task: the next listing finds the index gone, rebuilds it from
/// the task hashes, and the leader runs them, whether the index went before the replica
/// started or while it led (deleted under a running task, with two more waiting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_index_deleted_by_hand_is_rebuilt_and_no_task_is_lost() {
    let Some(mut bed) = redis_bed("3s") else {
        return;
    };
    let index = format!("{PREFIX}tasks");
    let delete_index = |bed: &RedisBed| {
        let deleted = bed.cluster.cli(&[b"DEL", index.as_bytes()]).unwrap();
        assert_eq!(deleted, "1", "the index was there to delete");
    };
    produce_work(&bed, 0..3);
    delete_index(&bed);
    bed.start_replica("r1");
    wait_runs(&bed, 3, "t0..t2 run").await;

    slow_task_started(&bed).await;
    for n in 3..5u64 {
        bed.produce(&format!("task_{n}"), &work(n, 1_445_599_887 + n))
            .unwrap();
    }
    delete_index(&bed);
    bed.wait_journal(Duration::from_secs(30), "t3 and t4 run", |journal| {
        runs(journal).len() == 5
    })
    .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(10))
        .await;
    let left = bed
        .cluster
        .cli(&[b"KEYS", format!("{PREFIX}task/oracleTask/*").as_bytes()])
        .unwrap();
    assert_eq!(left, "", "task hashes left behind");
    let counts = runs(&bed.journal());
    assert!(
        counts.values().all(|&c| c == 1),
        "a task ran twice: {counts:?}"
    );
}

/// An operator's `redis-cli DEL` of the version counter (`leaderq/version`) starts every
/// version over from 1: the leader, waiting for the queue to move past the version it last
/// read, sees the next listing come back lower, and takes that as a change at once, as
/// Consul's clients reset a blocking index that went backwards. Before, it went on waiting
/// for the counter to climb back, up to the whole wait (60 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_counter_deleted_by_hand_delays_no_task() {
    let Some(mut bed) = redis_bed("3s") else {
        return;
    };
    bed.env.push(("LEADERQ__REDIS__WAIT".into(), "60s".into()));
    // A deployment that has lived a while: its counter far above what a few writes reach.
    let counter = format!("{PREFIX}version");
    bed.cluster
        .cli(&[b"INCRBY", counter.as_bytes(), b"1000000"])
        .unwrap();
    produce_work(&bed, 0..3);
    bed.start_replica("r1");
    wait_runs(&bed, 3, "t0..t2 run").await;
    assert_eq!(bed.cluster.cli(&[b"DEL", counter.as_bytes()]).unwrap(), "1");
    bed.produce("task_3", &work(3, 1_445_599_890)).unwrap();
    bed.wait_journal(Duration::from_secs(20), "t3 runs", |journal| {
        runs(journal).len() == 4
    })
    .await;
}

/// A producer's key that is not UTF-8 (`redis-cli EVAL` of the producers' script with raw
/// bytes) stops nothing: leaderq cannot name it, so its listings and looks leave it out, with
/// a warning that says what to do, and the tasks around it run. It stays where it is (no
/// task is lost): the operator renames or deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_key_that_is_not_utf8_stops_no_listing() {
    let Some(mut bed) = redis_bed("3s") else {
        return;
    };
    let bad: &[u8] = b"oracleTask/task_\xff\xfe";
    let value = work(9, 1_445_599_880).to_string();
    bed.cluster
        .cli(&[
            b"EVAL",
            leaderq::coord::redis::PRODUCE.as_bytes(),
            b"0",
            PREFIX.as_bytes(),
            bad,
            value.as_bytes(),
        ])
        .unwrap();
    produce_work(&bed, 0..3);
    bed.start_replica("r1");
    wait_runs(&bed, 3, "t0..t2 run").await;
    // Tasks that come while it leads are seen too (a look, a listing).
    produce_work(&bed, 3..5);
    wait_runs(&bed, 5, "t3 and t4 run").await;
    let mut hash = format!("{PREFIX}task/").into_bytes();
    hash.extend_from_slice(bad);
    assert_eq!(
        bed.cluster.cli(&[b"EXISTS", &hash]).unwrap(),
        "1",
        "the task that cannot be named is left where it is"
    );
    let log = bed.replica("r1").log_text();
    assert!(
        log.contains("not UTF-8"),
        "the replica says why a task is left alone: {log}"
    );
}
