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
fn schedules(cluster: &dyn leaderq::tools::harness::Cluster, dir: &Path, args: &[&str]) -> String {
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

async fn leader_node(coord: &dyn leaderq::coord::Coordinator, not: &[&str]) -> String {
    let started = Instant::now();
    loop {
        if let Ok((holder, _)) = coord
            .observe(leaderq::coord::Version::default(), Duration::ZERO)
            .await
        {
            if let (Some(_), Some(record)) = (&holder.lease, &holder.record) {
                if !not.contains(&record.node.as_str()) {
                    return record.node.clone();
                }
            }
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

/// Waits until the queue under `oracleTask/` is empty.
async fn drained(coord: &dyn leaderq::coord::Coordinator, replicas: &[ConsumerProcess]) {
    wait_until_empty(coord, "oracleTask/", replicas, Duration::from_secs(60)).await;
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
    let dir = tempfile::tempdir().unwrap();
    let Some(mut cluster) = common::start_cluster(backend, dir.path()) else {
        return;
    };
    let journal = dir.path().join("journal");
    std::fs::write(&journal, "").unwrap();
    let coord = leaderq::service::connect::connect(
        &leaderq::config::Settings::load(None, cluster.env()).expect("settings"),
    )
    .expect("coordinator");
    let mut replicas: Vec<ConsumerProcess> = ["sa", "sb", "sc"]
        .iter()
        .map(|node| {
            ConsumerProcess::start_with_env(
                "127.0.0.1:1",
                node,
                dir.path(),
                &tick_settings(&journal, node, true),
                &cluster.env(),
            )
        })
        .collect();
    std::fs::write(dir.path().join("schedules.toml"), SCHEDULE).unwrap();
    let applied = schedules(cluster.as_ref(), dir.path(), &["apply", "schedules.toml"]);
    assert!(applied.contains("+ created beat"), "{applied}");
    let started = Instant::now();
    while starts(&journal).len() < 3 {
        assert!(started.elapsed() < Duration::from_secs(30), "no tick ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let killed = leader_node(coord.as_ref(), &[]).await;
    eprintln!("{backend}: SIGKILL of leader {killed}");
    let index = replicas.iter().position(|r| r.node == killed).unwrap();
    replicas[index].kill();
    let frozen = leader_node(coord.as_ref(), &[&killed]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    eprintln!("{backend}: SIGSTOP of leader {frozen} past its lease");
    let pid = replicas.iter().find(|r| r.node == frozen).unwrap().pid();
    common::signal(pid, "STOP");
    leader_node(coord.as_ref(), &[&killed, &frozen]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    common::signal(pid, "CONT");
    tokio::time::sleep(Duration::from_secs(3)).await;
    if cluster.members() > 1 {
        eprintln!("{backend}: SIGKILL and restart of member 0");
        cluster.kill_member(0).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        cluster.restart_member(0).unwrap();
    }
    while started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let paused = schedules(cluster.as_ref(), dir.path(), &["pause", "beat"]);
    assert!(paused.contains("beat paused"), "{paused}");
    // A tick written just before the pause still runs; then nothing more is enqueued.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drained(coord.as_ref(), &replicas).await;
    let listed = schedules(cluster.as_ref(), dir.path(), &["list"]);
    assert!(
        listed.contains("beat") && listed.contains("paused"),
        "{listed}"
    );
    check_ticks(&journal, &replicas, 1);
}

async fn ticks_with_other_settings(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(cluster) = common::start_cluster(backend, dir.path()) else {
        return;
    };
    let journal = dir.path().join("journal");
    std::fs::write(&journal, "").unwrap();
    let coord = leaderq::service::connect::connect(
        &leaderq::config::Settings::load(None, cluster.env()).expect("settings"),
    )
    .expect("coordinator");
    // "sb" has no Tick handler (another task type only): whoever leads, ticks fire once.
    let mut replicas: Vec<ConsumerProcess> = [("sa", true), ("sb", false)]
        .iter()
        .map(|(node, handlers)| {
            ConsumerProcess::start_with_env(
                "127.0.0.1:1",
                node,
                dir.path(),
                &tick_settings(&journal, node, *handlers),
                &cluster.env(),
            )
        })
        .collect();
    std::fs::write(dir.path().join("schedules.toml"), SCHEDULE).unwrap();
    schedules(cluster.as_ref(), dir.path(), &["apply", "schedules.toml"]);
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Hand leadership to the other replica and back by SIGTERM and restart.
    let first = leader_node(coord.as_ref(), &[]).await;
    let index = replicas.iter().position(|r| r.node == first).unwrap();
    replicas[index].terminate();
    leader_node(coord.as_ref(), &[&first]).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    schedules(cluster.as_ref(), dir.path(), &["pause", "beat"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (letters, _) = coord.keys("oracleTaskDead/").await.expect("keys");
    let (queued, _) = coord.keys("oracleTask/").await.expect("keys");
    let mut ticks: Vec<String> = letters
        .iter()
        .chain(&queued)
        .filter_map(|k| k.rsplit("tick_").next().map(str::to_string))
        .collect();
    ticks.extend(starts(&journal).into_iter().map(|(id, _)| id));
    let count = ticks.len();
    ticks.sort();
    ticks.dedup();
    let mut times = enqueued(&replicas);
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
