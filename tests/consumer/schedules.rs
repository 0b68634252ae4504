//! Schedules kept in the coordinator, on every backend's real servers: a schedule applied
//! with `leaderq schedules apply` fires exactly once per tick through a leader SIGKILLed,
//! another frozen past its lease and a coordinator member killed, with every missed tick
//! caught up (`catch_up = "all"`), in order, no run overlapping another; and replicas whose
//! settings differ still fire each tick once.

use super::*;

on_every_backend! {
    /// Every tick is enqueued once through kills, pauses and member losses.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    fn every_tick_is_enqueued_once_through_kills_pauses_and_member_losses => ticks_through_faults();
    /// Replicas whose settings differ fire each tick once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    fn replicas_with_other_settings_fire_each_tick_once => ticks_with_other_settings();
}

const SCHEDULE: &str = r#"
[[schedule]]
name = "beat"
every = "1s"
task_type = "Tick"
task_para = { from = "the schedule" }
catch_up = "all"
"#;

/// A replica's settings: one run at a time, one claim per write (so a killed leader leaves
/// at most its one run to repeat), a `Tick` handler journaling `start|end <taskId> <ns>
/// <node>` unless `handlers` is false.
fn tick_settings(journal: &Path, node: &str, handlers: bool) -> String {
    let j = journal.display();
    let mut config = TestSettings::new(journal)
        .set("queue", "claim_batch", "1")
        .toml(node);
    if handlers {
        config += &format!(
            "\n[handlers.Tick]\nkind = \"exec\"\ncommand = [\"sh\", \"-c\", \"echo \\\"start $TASK_ID $(date +%s%N) {node}\\\" >> {j}; sleep 0.05; echo \\\"end $TASK_ID $(date +%s%N) {node}\\\" >> {j}\"]\n"
        );
    }
    config
}

/// Runs `leaderq schedules ARGS` against the cluster; its stdout.
fn schedules(cluster: &dyn testkit::harness::Cluster, dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leaderq"))
        .arg("schedules")
        .args(args)
        .envs(cluster.env())
        .current_dir(dir)
        .output()
        .expect("run leaderq schedules");
    assert!(
        out.status.success(),
        "leaderq schedules {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// How long a leader may take to be seen, after a kill or a freeze past its lease.
const LEADER_LIMIT: Duration = Duration::from_secs(60);
/// How long a tick may take to start once the schedule fires every second.
const TICK_LIMIT: Duration = Duration::from_secs(30);
/// How many ticks run in all before the schedule is paused: the check wants ten at least.
const TICKS_BEFORE_PAUSE: usize = 12;
/// A tick the leader was enqueuing as the pause landed is written within this time; no
/// signal says "the leader read the pause", so the queue is drained only after it.
const PAUSE_LANDS: Duration = Duration::from_millis(500);

/// The leader's node, once there is one that is none of `not`.
async fn leader_node(bed: &TestBed, not: &[&str]) -> String {
    wait_until(
        LEADER_LIMIT,
        &format!("a leader other than {not:?}"),
        async || {
            let node = bed.leader(LEADER_LIMIT).await;
            if not.contains(&node.as_str()) {
                Err(node)
            } else {
                Ok(node)
            }
        },
    )
    .await
}

/// Waits until a tick starts after the first `seen` start lines, on `by` if given; the
/// number of start lines then.
async fn tick_started(bed: &TestBed, seen: usize, by: Option<&str>) -> usize {
    wait_until(
        TICK_LIMIT,
        &format!("a tick started on {by:?}"),
        async || {
            let runs = starts(&bed.journal);
            let new = runs
                .iter()
                .skip(seen)
                .any(|(_, node)| by.is_none_or(|by| by == node));
            if new {
                Ok(runs.len())
            } else {
                Err((runs, bed.logs()))
            }
        },
    )
    .await
}

/// Waits until `node` has run a tick to its end and the queue is empty: the moment to
/// freeze it with no run of its own cut short (the next tick is most of a second away).
async fn between_ticks(bed: &TestBed, node: &str) {
    wait_until(
        TICK_LIMIT,
        &format!("{node} between two ticks"),
        async || {
            let journal = bed.journal();
            let ended = journal
                .iter()
                .any(|l| l.len() == 4 && l[0] == "end" && l[3] == node);
            let (queued, _) = bed
                .coord
                .keys("oracleTask/")
                .await
                .map_err(|e| e.to_string())?;
            if ended && queued.is_empty() {
                Ok(())
            } else {
                Err(format!("{queued:?}\n{journal:?}"))
            }
        },
    )
    .await
}

/// Waits until at least `count` ticks were enqueued in all (the leaders' log lines).
async fn ticks_enqueued(bed: &TestBed, count: usize) {
    wait_until(
        TICK_LIMIT,
        &format!("{count} ticks enqueued"),
        async || match enqueued(&bed.replicas) {
            ticks if ticks.len() >= count => Ok(()),
            ticks => Err(ticks),
        },
    )
    .await
}

/// Each `(tick id, node)` of the journal's start lines, in the order they were written.
fn starts(journal: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(journal)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let w: Vec<&str> = line.split_whitespace().collect();
            (w.len() == 4 && w[0] == "start").then(|| (w[1].to_string(), w[3].to_string()))
        })
        .collect()
}

/// Every "schedule tick enqueued" line of the replicas' logs, as tick times.
fn enqueued(replicas: &[ConsumerProcess]) -> Vec<String> {
    replicas
        .iter()
        .flat_map(|r| {
            r.log_text()
                .lines()
                .filter(|l| l.contains("schedule tick enqueued"))
                .filter_map(|l| l.split("tick=").nth(1))
                .filter_map(|rest| rest.split_whitespace().next())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The tick ids `beat-<ms>` from `first` to `last` every second.
fn ticks_between(first: &str, last: &str) -> Vec<String> {
    let ms = |id: &str| id.trim_start_matches("beat-").parse::<u64>().unwrap();
    (ms(first)..=ms(last))
        .step_by(1000)
        .map(|at| format!("beat-{at:013}"))
        .collect()
}

/// Checks the ticks run from the first to the last with none missing, each enqueued once
/// (the leaders' own log lines) and run once, except at most `repeats` runs again after a
/// kill of the replica running them, and first run in order of their target time.
fn check_ticks(journal: &Path, replicas: &[ConsumerProcess], repeats: usize) {
    let runs = starts(journal);
    let logs: Vec<String> = replicas.iter().map(|r| r.log_text()).collect();
    let text = format!(
        "{}\n----\n{}",
        std::fs::read_to_string(journal).unwrap_or_default(),
        logs.join("\n----\n")
    );
    assert!(runs.len() >= 10, "too few ticks ran: {text}");
    // A run cut short by a kill runs again after a retry backoff, maybe after later ticks
    // began: the order is that of each tick's first run.
    let mut ids: Vec<String> = Vec::new();
    for (id, _) in &runs {
        if !ids.contains(id) {
            ids.push(id.clone());
        }
    }
    let in_order = ids.windows(2).all(|w| w[0] < w[1]);
    assert!(in_order, "ticks first ran out of order: {ids:?}\n{text}");
    let total = runs.len();
    assert!(
        total - ids.len() <= repeats,
        "{} runs repeated, at most {repeats} allowed: {text}",
        total - ids.len()
    );
    let expected = ticks_between(&ids[0], &ids[ids.len() - 1]);
    assert_eq!(ids, expected, "a tick is missing: {text}");
    let mut times = enqueued(replicas);
    let count = times.len();
    times.sort();
    times.dedup();
    assert_eq!(count, times.len(), "a tick was enqueued twice: {text}");
}

async fn ticks_through_faults(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    for node in ["sa", "sb", "sc"] {
        let config = tick_settings(&bed.journal, node, true);
        bed.start_replica_with(node, &config);
    }
    let dir = bed.dir.path().to_path_buf();
    std::fs::write(dir.join("schedules.toml"), SCHEDULE).unwrap();
    let applied = schedules(bed.cluster.as_ref(), &dir, &["apply", "schedules.toml"]);
    assert!(applied.contains("+ created beat"), "{applied}");
    wait_until(TICK_LIMIT, "three ticks ran", async || {
        match starts(&bed.journal) {
            runs if runs.len() >= 3 => Ok(()),
            runs => Err(runs),
        }
    })
    .await;

    let killed = leader_node(&bed, &[]).await;
    eprintln!("{backend}: SIGKILL of leader {killed}");
    bed.replica(&killed).kill();
    let seen = starts(&bed.journal).len();
    let frozen = leader_node(&bed, &[&killed]).await;
    // The next leader runs ticks of its own before it is frozen.
    tick_started(&bed, seen, Some(&frozen)).await;
    between_ticks(&bed, &frozen).await;
    eprintln!("{backend}: SIGSTOP of leader {frozen} past its lease");
    let pid = bed.replica(&frozen).pid();
    common::signal(pid, "STOP");
    let seen = starts(&bed.journal).len();
    let third = leader_node(&bed, &[&killed, &frozen]).await;
    // The leader after it runs a tick while the frozen one still sleeps.
    tick_started(&bed, seen, Some(&third)).await;
    let seen = starts(&bed.journal).len();
    common::signal(pid, "CONT");
    // Ticks go on once the frozen leader is thawed, past its lease.
    let mut seen = tick_started(&bed, seen, None).await;
    if bed.cluster.members() > 1 {
        eprintln!("{backend}: SIGKILL and restart of member 0");
        bed.cluster.kill_member(0).unwrap();
        // Ticks go on with a member down, and again once it is back.
        seen = tick_started(&bed, seen, None).await;
        bed.cluster.restart_member(0).unwrap();
        tick_started(&bed, seen, None).await;
    }
    wait_until(TICK_LIMIT, "ticks enough ran", async || {
        match starts(&bed.journal) {
            runs if runs.len() >= TICKS_BEFORE_PAUSE => Ok(()),
            runs => Err(runs),
        }
    })
    .await;
    let paused = schedules(bed.cluster.as_ref(), &dir, &["pause", "beat"]);
    assert!(paused.contains("beat paused"), "{paused}");
    // A tick written just before the pause still runs; then nothing more is enqueued.
    tokio::time::sleep(PAUSE_LANDS).await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;
    let listed = schedules(bed.cluster.as_ref(), &dir, &["list"]);
    assert!(
        listed.contains("beat") && listed.contains("paused"),
        "{listed}"
    );
    check_ticks(&bed.journal, &bed.replicas, 1);
}

async fn ticks_with_other_settings(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    // "sb" has no Tick handler (another task type only): whoever leads, ticks fire once.
    for (node, handlers) in [("sa", true), ("sb", false)] {
        let config = tick_settings(&bed.journal, node, handlers);
        bed.start_replica_with(node, &config);
    }
    let dir = bed.dir.path().to_path_buf();
    std::fs::write(dir.join("schedules.toml"), SCHEDULE).unwrap();
    schedules(bed.cluster.as_ref(), &dir, &["apply", "schedules.toml"]);
    ticks_enqueued(&bed, 4).await;
    // Hand leadership to the other replica and back by SIGTERM and restart.
    let first = leader_node(&bed, &[]).await;
    bed.replica(&first).terminate();
    leader_node(&bed, &[&first]).await;
    let before = enqueued(&bed.replicas).len();
    ticks_enqueued(&bed, before + 4).await;
    schedules(bed.cluster.as_ref(), &dir, &["pause", "beat"]);
    // A tick written just before the pause is in the queue or the dead letters by then.
    tokio::time::sleep(PAUSE_LANDS).await;
    let coord = &bed.coord;
    let journal = &bed.journal;
    let replicas = &bed.replicas;
    let (letters, _) = coord.keys("oracleTaskDead/").await.expect("keys");
    let (queued, _) = coord.keys("oracleTask/").await.expect("keys");
    let mut ticks: Vec<String> = letters
        .iter()
        .chain(queued.iter())
        .filter_map(|k| k.rsplit("tick_").next().map(str::to_string))
        .collect();
    ticks.extend(starts(journal).into_iter().map(|(id, _)| id));
    let count = ticks.len();
    ticks.sort();
    ticks.dedup();
    let mut times = enqueued(replicas);
    let enqueues = times.len();
    times.sort();
    times.dedup();
    assert_eq!(enqueues, times.len(), "a tick was enqueued twice");
    assert!(ticks.len() >= 6, "too few ticks: {ticks:?}");
    assert_eq!(
        ticks,
        ticks_between(&ticks[0], &ticks[ticks.len() - 1]),
        "a tick is missing"
    );
    assert_eq!(
        count,
        ticks.len(),
        "a tick ran or was kept twice: {ticks:?}"
    );
}
