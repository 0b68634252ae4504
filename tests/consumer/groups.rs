//! Concurrency groups with real processes on every backend's real servers (a backend whose
//! server is missing is skipped, or fails the test under LEADERQ_REQUIRE_SERVERS): with
//! `queue.concurrency = 4`, exec handlers of different `taskGroup`s run at once, never two
//! of one group, and each group in `taskTime` order.

use super::*;

macro_rules! on_every_backend {
    ($($backend:ident),* $(,)?) => {
        $(
            mod $backend {
                #[tokio::test]
                async fn groups_run_side_by_side_never_within_one() {
                    super::groups_run_side_by_side_never_within_one(stringify!($backend)).await;
                }
            }
        )*
    };
}

on_every_backend!(consul, etcd, redis, zookeeper);

/// One run as its handler journaled it: task id, group, start and end (ns).
struct Run {
    id: String,
    group: String,
    started: u128,
    ended: u128,
}

async fn groups_run_side_by_side_never_within_one(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(cluster) = common::start_cluster(backend, dir.path()) else {
        return;
    };
    let journal = dir.path().join("journal");
    std::fs::write(&journal, "").unwrap();
    let coord = leaderq::coord::connect(
        &leaderq::config::Settings::load(None, cluster.env()).expect("settings"),
    )
    .expect("coordinator");
    // Four groups of three and three tasks without a group, interleaved in taskTime; keys
    // in the reverse order.
    let mut tasks = Vec::new();
    for n in 0..15u64 {
        let group = ["a", "b", "c", "d", ""][(n % 5) as usize];
        let id = format!("{}{n:02}", if group.is_empty() { "none" } else { group });
        let mut value = json!({"taskId": id, "taskTime": 1000 + n, "taskType": "Grouped"});
        if !group.is_empty() {
            value["taskGroup"] = json!(group);
        }
        tasks.push(leaderq::coord::Edit::Create {
            key: format!("oracleTask/task_{:02}", 99 - n),
            value: value.to_string().into_bytes(),
        });
    }
    assert_eq!(
        coord.edit(&tasks).await.expect("enqueue"),
        leaderq::coord::Edited::Done
    );
    let journal_path = journal.display();
    let config = settings(&journal, "3s")
        .replace("$NODE", "groups")
        .replace("[queue]\n", "[queue]\nconcurrency = 4\n")
        + &format!(
            r#"
[handlers.Grouped]
kind = "exec"
command = ["sh", "-c", "echo \"start $TASK_ID $(date +%s%N)\" >> {journal_path}; sleep 0.3; echo \"end $TASK_ID $(date +%s%N)\" >> {journal_path}"]
"#
        );
    let replica = ConsumerProcess::start_with_env(
        "127.0.0.1:1",
        "groups",
        dir.path(),
        &config,
        &cluster.env(),
    );
    let started = Instant::now();
    loop {
        let (keys, _) = coord.keys("oracleTask/").await.expect("keys");
        if keys.is_empty() {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            panic!("{keys:?} left after 60 s:\n{}", replica.log_text());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = std::fs::read_to_string(&journal).unwrap();
    let mut runs: Vec<Run> = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let at: u128 = words[2].parse().unwrap();
        match words[0] {
            "start" => runs.push(Run {
                id: words[1].to_string(),
                group: words[1]
                    .trim_end_matches(|c: char| c.is_ascii_digit())
                    .to_string(),
                started: at,
                ended: 0,
            }),
            _ => {
                let run = runs
                    .iter_mut()
                    .find(|run| run.id == words[1] && run.ended == 0)
                    .unwrap_or_else(|| panic!("an end without a start: {text}"));
                run.ended = at;
            }
        }
    }
    assert_eq!(runs.len(), 15, "each task ran once: {text}");
    assert!(
        runs.iter().all(|run| run.ended > 0),
        "every run ended: {text}"
    );
    for group in ["a", "b", "c", "d", "none"] {
        let mut own: Vec<&Run> = runs.iter().filter(|run| run.group == group).collect();
        own.sort_by_key(|run| run.started);
        let ids: Vec<&str> = own.iter().map(|run| run.id.as_str()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted, "group {group} in taskTime order: {text}");
        for pair in own.windows(2) {
            assert!(
                pair[0].ended <= pair[1].started,
                "{} and {} of group {group} overlapped: {text}",
                pair[0].id,
                pair[1].id
            );
        }
    }
    let most = runs
        .iter()
        .map(|run| {
            runs.iter()
                .filter(|other| other.started <= run.started && run.started < other.ended)
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(
        (2..=4).contains(&most),
        "runs of different groups overlap, at most 4 at once (saw {most}): {text}"
    );
}
