//! Bursts of errors on the leader's link to a real coordinator, on every backend: each
//! replica reaches the coordinator through links of its own (`harness::link`), and the
//! leader's are cut (every connection reset, new ones refused) and healed while long
//! handlers run, with one attempt allowed. First one cut long enough that the supervisor
//! stops the run for the lease, healed right after, while the lease still lives at the
//! coordinator (its put back fails in the cut); then ten bursts of one to two seconds. The
//! same lease leads throughout under the same token, no run uses an attempt, nothing is
//! dead-lettered, every task runs to its end, and no two runs overlap.

use super::*;
use testkit::harness::link::{Fault, Links};

on_every_backend! {
    /// A stop for the lease in a burst of errors, and bursts after it, use no attempt.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    fn bursts_of_errors_on_the_leaders_link_use_no_attempt => bursts_on_the_leaders_link();
}

/// How many tasks run (each ten seconds, the first twenty on its first run).
const TASKS: usize = 4;

/// The bursts after the long cut: how many, each one to two seconds, two to three seconds
/// apart. Closer bursts can keep a ZooKeeper client from reconnecting in between (its own
/// back-off between attempts grows to seconds), so that its session, not a stop for the
/// lease, ends the leadership: a fault of another kind.
const BURSTS: usize = 10;

/// One run as the journal shows it: `(task, node, attempt, started, ended)`.
type Run = (String, String, String, u128, u128);

async fn bursts_on_the_leaders_link(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let j = bed.journal.display().to_string();
    // The first run of t0 lasts long enough to be stopped for the lease; a SIGTERM is
    // journaled and ends the run as the supervisor's stop does.
    let script = format!(
        "echo \"start $TASK_ID $NODE $LEADERQ_ATTEMPT $(date +%s%N)\" >> {j}; \
         trap 'echo \"term $TASK_ID $NODE $LEADERQ_ATTEMPT $(date +%s%N)\" >> {j}; exit 143' TERM; \
         if [ $TASK_ID = t0 ] && [ ! -e {j}.long ]; then touch {j}.long; sleep 20 & wait $!; \
         else sleep 10 & wait $!; fi; \
         echo \"end $TASK_ID $NODE $LEADERQ_ATTEMPT $(date +%s%N)\" >> {j}"
    );
    // TTL 9 s, kill grace 3 s: the supervisor stops a run 5.1 s after the last renewal
    // (TTL − TTL/10 − kill grace), and the lease lives 3.9 s longer, time enough to heal
    // the link and renew.
    bed.settings = bed
        .settings
        .clone()
        .ttl("9s")
        .set("queue", "kill_grace", "\"3s\"")
        .set("queue", "max_attempts", "1")
        .handler("Long", &script);
    let mut links = Vec::new();
    for node in ["la", "lb"] {
        let (link, env) = Links::start(bed.cluster.as_ref()).await.unwrap();
        bed.env = env;
        bed.start_replica(node);
        links.push((node, link));
    }
    let tasks: Vec<leaderq::coord::Edit> = (0..TASKS)
        .map(|n| leaderq::coord::Edit::Create {
            key: format!("oracleTask/t{n}"),
            value: json!({"taskId": format!("t{n}"), "taskTime": n, "taskType": "Long"})
                .to_string()
                .into_bytes(),
        })
        .collect();
    assert_eq!(
        bed.coord.edit(&tasks).await.expect("enqueue"),
        leaderq::coord::Edited::Done
    );
    let line = |bed: &TestBed, event: &str, task: &str| {
        bed.journal()
            .into_iter()
            .find(|l| l[0] == event && l[1] == task)
    };
    let started = wait_until(Duration::from_secs(30), "t0 started", async || {
        line(&bed, "start", "t0").ok_or_else(|| bed.logs())
    })
    .await;
    let (_, before) = bed
        .leadership_other_than(None, Duration::from_secs(5))
        .await;
    let leader = started[2].clone();
    let link = &links.iter().find(|(node, _)| *node == leader).unwrap().1;
    link.set(Fault::Cut);
    wait_until(
        Duration::from_secs(12),
        "t0 stopped for the lease",
        async || line(&bed, "term", "t0").ok_or_else(|| bed.logs()),
    )
    .await;
    // Long enough that the put back falls in the cut; short of the lease's end.
    tokio::time::sleep(Duration::from_millis(300)).await;
    link.set(Fault::Clear);
    let mut schedule = Vec::new();
    for _ in 0..BURSTS {
        let (gap, burst) = (fastrand::u64(2000..3000), fastrand::u64(1000..2000));
        schedule.push((gap, burst));
        tokio::time::sleep(Duration::from_millis(gap)).await;
        link.set(Fault::Cut);
        tokio::time::sleep(Duration::from_millis(burst)).await;
        link.set(Fault::Clear);
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(90))
        .await;
    let (_, after) = bed
        .leadership_other_than(None, Duration::from_secs(5))
        .await;
    let journal = bed.journal();
    let text = format!(
        "bursts (gap ms, burst ms) {schedule:?}\n{journal:?}\n----\n{}",
        bed.logs()
    );
    assert_eq!(
        after, before,
        "the leadership changed in the bursts: {text}"
    );
    let (dead, _) = bed.coord.keys("oracleTaskDead/").await.expect("keys");
    assert!(dead.is_empty(), "dead-lettered: {dead:?}: {text}");
    let mut runs: Vec<Run> = Vec::new();
    for l in &journal {
        let at: u128 = l[4].parse().unwrap();
        match l[0].as_str() {
            "start" => runs.push((l[1].clone(), l[2].clone(), l[3].clone(), at, 0)),
            "end" | "term" => {
                let run = runs
                    .iter_mut()
                    .rev()
                    .find(|r| r.0 == l[1] && r.4 == 0)
                    .unwrap_or_else(|| panic!("an end without a start: {text}"));
                run.4 = at;
            }
            _ => {}
        }
    }
    for (task, _, attempt, _, ended) in &runs {
        assert_eq!(attempt, "1", "{task} used an attempt: {text}");
        assert!(*ended > 0, "{task} never ended: {text}");
    }
    for n in 0..TASKS {
        assert!(
            journal
                .iter()
                .any(|l| l[0] == "end" && l[1] == format!("t{n}")),
            "t{n} never ran to its end: {text}"
        );
    }
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            assert!(
                !(a.3 < b.4 && b.3 < a.4),
                "{} and {} overlapped: {text}",
                a.0,
                b.0
            );
        }
    }
}
