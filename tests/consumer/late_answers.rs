//! Answers from the coordinator that come back late, on every backend's real servers: a
//! proxy in front of each member (`testkit::harness::link`) delays every byte on
//! its way back to the leader, while the leader's requests arrive on time. Below the bound
//! the settings promise (`docs/handlers.md`: 2/3 × TTL − kill_grace − TTL/10), no run is
//! stopped and leadership stays where it is, however long the latency lasts; past it, the
//! leader's run is stopped before its lease could end at the coordinator, so before
//! another replica starts the task again.

use super::*;
use testkit::harness::link::{Fault, Links};
use toolbox::{first_run, runs_in, Reaper};

on_every_backend! {
    /// Answers 0.4 of a TTL late for ten TTLs stop no run and move no leadership; answers
    /// later than the bound stop the run before another replica starts it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    fn late_answers_stop_no_run_within_the_bound_and_stop_it_first_past_it => late_answers();
}

/// The lease TTL: short, so that ten of them pass in half a minute, and at or above every
/// backend's floor on the harness's servers.
const TTL: &str = "3s";

/// With it the bound is 2/3 × 3 s − 0.35 s − 0.3 s = 1.35 s, above [`WITHIN`] by 0.15 s.
/// And a leader that renewed only once the previous answer was in (the lease aged by twice
/// the latency) would have kept 3 s − 2 × 1.2 s = 0.6 s of its lease, less than the 0.65 s
/// a run's kill sequence needs: its run would be stopped.
const KILL_GRACE: &str = "350ms";

/// The latency below the bound: 0.4 of the TTL.
const WITHIN: Duration = Duration::from_millis(1200);

/// How long that latency lasts: ten TTLs.
const WITHIN_FOR: Duration = Duration::from_secs(30);

/// The latency past the bound, and past 2/3 of the TTL: the lease goes stale at the leader
/// between answers, whatever the renewals do.
const PAST: Duration = Duration::from_millis(2400);

/// How long the task's run sleeps: longer than the test, so that only a stop ends it.
const RUN_SECS: u64 = 60;

/// How often the test looks at the journal and the leader record while answers are late.
const LOOK_EVERY: Duration = Duration::from_millis(250);

async fn late_answers(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let (link, env) = Links::start(bed.cluster.as_ref())
        .await
        .expect("a proxy in front of every member");
    let journal = bed.journal.clone();
    let j = journal.display();
    let settings = bed
        .settings
        .clone()
        .ttl(TTL)
        .set("queue", "kill_grace", &format!("\"{KILL_GRACE}\""))
        .handler(
            "Long",
            &format!(
                "echo \"start $TASK_ID $(date +%s%N) $NODE $$ $LEADERQ_FENCING_TOKEN\" >> {j}; sleep {RUN_SECS}; echo \"end $TASK_ID $(date +%s%N) $NODE $$\" >> {j}"
            ),
        );
    // r1 reaches the coordinator through the proxy and leads; r2 stands by, reaching it
    // directly.
    bed.env = env;
    bed.start_replica_with("r1", &settings.toml("r1"));
    assert_eq!(bed.leader(Duration::from_secs(30)).await, "r1");
    bed.env.clear();
    bed.start_replica_with("r2", &settings.toml("r2"));
    let task = leaderq::coord::Edit::Create {
        key: "oracleTask/task_long".into(),
        value: json!({"taskId": "long", "taskTime": 1, "taskType": "Long"})
            .to_string()
            .into_bytes(),
    };
    bed.coord.edit(&[task]).await.expect("enqueue");
    let first = first_run(&journal, &bed.replicas).await;
    assert_eq!(first.node, "r1", "{}", bed.logs());
    let (_, leadership) = bed
        .leadership_other_than(None, Duration::from_secs(10))
        .await;
    let reaper = Reaper::start(&journal);
    let state = |bed: &TestBed| {
        format!(
            "{}\n----\n{}",
            std::fs::read_to_string(&journal).unwrap_or_default(),
            bed.logs()
        )
    };

    link.set(Fault::Delay(WITHIN));
    let began = std::time::Instant::now();
    while began.elapsed() < WITHIN_FOR {
        tokio::time::sleep(LOOK_EVERY).await;
        let into = began.elapsed();
        let runs = runs_in(&std::fs::read_to_string(&journal).unwrap());
        assert!(
            runs.len() == 1 && reaper.gone(first.pid).is_none(),
            "{backend}: the run was stopped {into:?} into answers {WITHIN:?} late: {}",
            state(&bed)
        );
        let (holder, _) = bed
            .coord
            .observe(leaderq::coord::Version(0), Duration::ZERO)
            .await
            .expect("observe");
        assert!(
            holder.lease.as_ref() == Some(&leadership.lease)
                && holder.token == leadership.fencing_token,
            "{backend}: leadership moved {into:?} into answers {WITHIN:?} late (now {:?} under {}): {}",
            holder.lease,
            holder.token,
            state(&bed)
        );
    }

    link.set(Fault::Delay(PAST));
    let past_at = now_ns();
    let next = wait_until(
        Duration::from_secs(30),
        "another replica runs the task",
        async || {
            let runs = runs_in(&std::fs::read_to_string(&journal).unwrap());
            match runs.into_iter().find(|run| run.node != "r1") {
                Some(run) => Ok(run),
                None => Err(state(&bed)),
            }
        },
    )
    .await;
    let gone = reaper.stop();
    let stopped = *gone
        .get(&first.pid)
        .unwrap_or_else(|| panic!("{backend}: r1's run still runs: {}", state(&bed)));
    eprintln!(
        "{backend}: answers {PAST:?} late stopped the run after {} ms; r2 started it {} ms later",
        (stopped - past_at) / 1_000_000,
        next.started.saturating_sub(stopped) / 1_000_000
    );
    assert!(
        stopped < next.started,
        "{backend}: r2's run began before r1's was gone: {}",
        state(&bed)
    );
    assert!(
        next.token > first.token,
        "{backend}: r2 ran under token {}, not above r1's {}: {}",
        next.token,
        first.token,
        state(&bed)
    );
    drop(bed);
    drop(link);
}
