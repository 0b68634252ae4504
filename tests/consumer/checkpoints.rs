//! Progress and checkpoints with real processes on every backend's real servers: an exec
//! handler counts to 40, reporting each count as its checkpoint on `LEADERQ_PROGRESS`;
//! the leader records them in the task; the leader is SIGKILLed midway, and the next
//! leader's run starts from the last checkpoint the coordinator acknowledged (given in
//! `LEADERQ_CHECKPOINT`), not from the beginning. A frozen leader's late reports, once it
//! wakes, are refused: the stored checkpoint never goes backwards nor past the rerun's.
//! A retry and a dead letter retried get the checkpoint too, and report lines refused
//! (malformed, oversized) are noted in the attempt's record.

use super::*;

on_every_backend! {
    /// A rerun after a failover starts from the last recorded checkpoint.
    #[tokio::test]
    fn a_rerun_after_a_failover_starts_from_the_last_checkpoint => a_rerun_after_a_failover_starts_from_the_last_checkpoint();
    /// A frozen leader's reports, written once it wakes, never land.
    #[tokio::test]
    fn a_frozen_leaders_late_reports_are_refused => a_frozen_leaders_late_reports_are_refused();
    /// A retry and a dead letter retried start from the checkpoint; bad lines are noted.
    #[tokio::test]
    fn retries_and_retried_dead_letters_get_the_checkpoint => retries_and_retried_dead_letters_get_the_checkpoint();
}

/// The counting handler: reads its start from `$LEADERQ_CHECKPOINT` (0 if none), then
/// counts to `to`, reporting each count before journaling it (`n N NODE ATTEMPT`).
fn counter(journal: &str, to: u32) -> String {
    format!(
        r#"n=$(printf '%s' "${{LEADERQ_CHECKPOINT:-}}" | sed -n 's/.*"n":\([0-9]*\).*/\1/p'); n=${{n:-0}}
while [ "$n" -lt {to} ]; do
  n=$((n+1))
  p=$(awk "BEGIN {{ print $n / {to} }}")
  echo "{{\"checkpoint\":{{\"n\":$n}},\"progress\":$p,\"message\":\"step $n\"}}" >> "$LEADERQ_PROGRESS"
  echo "n $n $NODE $LEADERQ_ATTEMPT" >> {journal}
  sleep 0.1
done"#
    )
}

async fn a_rerun_after_a_failover_starts_from_the_last_checkpoint(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let j = bed.journal.display().to_string();
    let settings = TestSettings::new(&bed.journal).handler("Count", &counter(&j, 40));
    for node in ["ca", "cb"] {
        bed.start_replica_with(node, &settings.toml(node));
    }
    let leader = bed.leader(Duration::from_secs(20)).await;
    bed.produce(
        "count",
        &json!({"taskId": "count", "taskTime": 1, "taskType": "Count"}),
    )
    .expect("produce");
    bed.wait_for_line(Duration::from_secs(30), |line| {
        line[0] == "n" && line[1].parse::<u32>().unwrap_or(0) >= 10
    })
    .await;
    // The leader records the reports in the task while the run goes on.
    let stored = wait_until(
        Duration::from_secs(10),
        "a recorded checkpoint",
        async || {
            let found = bed.coord.get(&["oracleTask/count".to_string()]).await;
            let task: Value = found
                .ok()
                .and_then(|f| f.into_iter().next())
                .and_then(|t| serde_json::from_slice(&t.value).ok())
                .unwrap_or_default();
            match task["checkpoint"]["n"].as_u64() {
                Some(n) if n >= 1 && task["progress"].as_f64().is_some() => Ok(task),
                _ => Err(task),
            }
        },
    )
    .await;
    assert!(stored["progressMessage"].as_str().is_some(), "{stored}");
    // `tasks list` shows the running task's progress, `tasks show` its checkpoint.
    let listed = bed
        .leaderq(&["tasks", "list"])
        .output()
        .expect("tasks list");
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    let row = listed.lines().find(|l| l.contains("oracleTask/count"));
    assert!(
        row.is_some_and(|row| row.starts_with("in_flight ") && row.contains('%')),
        "{listed}"
    );
    let shown = bed
        .leaderq(&["tasks", "show", "count"])
        .output()
        .expect("tasks show");
    let shown = String::from_utf8_lossy(&shown.stdout).to_string();
    assert!(shown.contains("\"checkpoint\""), "{shown}");
    bed.replica(&leader).kill();
    bed.wait_until_empty("oracleTask/", Duration::from_secs(90))
        .await;
    let journal = bed.journal();
    let counts = |mine: bool| -> Vec<u32> {
        journal
            .iter()
            .filter(|line| line[0] == "n" && (line[2] == leader) == mine)
            .map(|line| line[1].parse().unwrap())
            .collect()
    };
    let (first, rerun) = (counts(true), counts(false));
    let text = format!("{journal:?}\n{}", bed.logs());
    let last_of_first = *first.last().expect("the first run counted");
    let start = *rerun.first().expect("the next leader ran the task again");
    assert!(
        start > 1 && start <= last_of_first + 1,
        "the rerun starts from a recorded checkpoint (first run to {last_of_first}, rerun from {start}): {text}"
    );
    assert_eq!(rerun.last(), Some(&40), "{text}");
}

/// The stored checkpoint of `oracleTask/count`, if the task is there and has one.
async fn stored_checkpoint(bed: &TestBed) -> Option<u64> {
    let found = bed
        .coord
        .get(&["oracleTask/count".to_string()])
        .await
        .ok()?;
    let task: Value = serde_json::from_slice(&found.into_iter().next()?.value).ok()?;
    task["checkpoint"]["n"].as_u64()
}

/// The counting handler to 80 on two replicas; the leader is SIGSTOPped past its lease
/// while its run goes on (its supervisor kills it by the lease's deadline, after it wrote
/// counts the frozen leader never recorded), and woken once the other replica reruns the
/// task. Sampled until the task is done, the stored checkpoint never goes backwards and is
/// never more than one past what the rerun journaled: the woken leader's late reports never land.
async fn a_frozen_leaders_late_reports_are_refused(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let j = bed.journal.display().to_string();
    let settings = TestSettings::new(&bed.journal).handler("Count", &counter(&j, 80));
    for node in ["fa", "fb"] {
        bed.start_replica_with(node, &settings.toml(node));
    }
    let leader = bed.leader(Duration::from_secs(20)).await;
    bed.produce(
        "count",
        &json!({"taskId": "count", "taskTime": 1, "taskType": "Count"}),
    )
    .expect("produce");
    bed.wait_for_line(Duration::from_secs(30), |line| {
        line[0] == "n" && line[1].parse::<u32>().unwrap_or(0) >= 10
    })
    .await;
    let frozen = bed.replica(&leader).pid();
    common::signal(frozen, "STOP");
    bed.wait_for_line(Duration::from_secs(60), |line| {
        line[0] == "n" && line[2] != leader
    })
    .await;
    common::signal(frozen, "CONT");
    let rerun_max = |journal: &[Vec<String>]| -> u64 {
        let rerun = journal.iter().filter(|l| l[0] == "n" && l[2] != leader);
        rerun.filter_map(|l| l[1].parse().ok()).max().unwrap_or(0)
    };
    let mut last = 0;
    let started = Instant::now();
    loop {
        let Some(n) = stored_checkpoint(&bed).await else {
            break;
        };
        let journal = bed.journal();
        let text = || format!("{journal:?}\n{}", bed.logs());
        assert!(
            n >= last,
            "the stored checkpoint went back from {last} to {n}: {}",
            text()
        );
        // The rerun reports a count just before it journals it: one ahead at most.
        assert!(
            n <= rerun_max(&journal) + 1,
            "the stored checkpoint {n} is past the rerun's counts: {}",
            text()
        );
        last = n;
        assert!(started.elapsed() < Duration::from_secs(90), "{}", text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(90))
        .await;
    assert_eq!(rerun_max(&bed.journal()), 80, "{}", bed.logs());
}

/// A handler that counts its runs in a file: the first reports a malformed and an
/// oversized line, then a checkpoint, and fails; the second checkpoints again and fails
/// for good (exit 65: dead-lettered); the third, after `leaderq tasks retry`, succeeds.
/// Each journals `got RUN CHECKPOINT`. The retry and the retried dead letter get the last
/// checkpoint, and the first attempt's record notes the two refused lines.
async fn retries_and_retried_dead_letters_get_the_checkpoint(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let j = bed.journal.display().to_string();
    let runs = bed.dir.path().join("runs").display().to_string();
    let script = format!(
        r#"c=$(cat {runs} 2>/dev/null || echo 0); c=$((c+1)); echo $c > {runs}
echo "got $c ${{LEADERQ_CHECKPOINT:-none}}" >> {j}
case $c in
  1) echo 'not json' >> "$LEADERQ_PROGRESS"
     head -c 70000 /dev/zero | tr '\0' x >> "$LEADERQ_PROGRESS"; echo >> "$LEADERQ_PROGRESS"
     echo '{{"checkpoint":{{"n":1}}}}' >> "$LEADERQ_PROGRESS"; exit 1;;
  2) echo '{{"checkpoint":{{"n":2}}}}' >> "$LEADERQ_PROGRESS"; exit 65;;
esac"#
    );
    let settings = TestSettings::new(&bed.journal).handler("Resume", &script);
    bed.start_replica_with("r1", &settings.toml("r1"));
    bed.produce(
        "resume",
        &json!({"taskId": "resume", "taskTime": 1, "taskType": "Resume"}),
    )
    .expect("produce");
    wait_until(Duration::from_secs(60), "the dead letter", async || {
        let (dead, _) = bed
            .coord
            .list(
                "oracleTaskDead/",
                leaderq::coord::Version(0),
                Duration::ZERO,
            )
            .await
            .map_err(|e| e.to_string())?;
        dead.into_iter().next().ok_or_else(|| bed.logs())
    })
    .await;
    let (dead, _) = bed
        .coord
        .list(
            "oracleTaskDead/",
            leaderq::coord::Version(0),
            Duration::ZERO,
        )
        .await
        .unwrap();
    let letter: Value = serde_json::from_slice(&dead[0].value).unwrap();
    assert_eq!(letter["checkpoint"], json!({"n": 2}), "{letter}");
    let note = letter["attemptLog"][0]["note"].as_str().unwrap_or_default();
    assert!(note.starts_with("2 report line(s) refused"), "{letter}");
    let out = bed
        .leaderq(&["tasks", "retry", &dead[0].key])
        .output()
        .expect("tasks retry");
    assert!(out.status.success(), "{out:?}");
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;
    bed.wait_journal(Duration::from_secs(30), "the third run", |journal| {
        journal.len() >= 3
    })
    .await;
    let got: Vec<String> = bed.journal().iter().map(|line| line[2].clone()).collect();
    assert_eq!(got, ["none", r#"{"n":1}"#, r#"{"n":2}"#], "{}", bed.logs());
}
