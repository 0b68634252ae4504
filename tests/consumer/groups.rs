//! Concurrency groups with real processes on every backend's real servers (a backend whose
//! server is missing is skipped, or fails the test under LEADERQ_REQUIRE_SERVERS): with
//! `queue.concurrency = 4`, exec handlers of different `taskGroup`s run at once, never two
//! of one group, and each group in `taskTime` order; and when the leader is SIGKILLed
//! or SIGSTOPped mid-runs, nothing is lost and the next leader starts no task of a group
//! before the first leader's run of that group is gone.

use super::*;

on_every_backend! {
    /// Groups run side by side, never two runs of one group at once.
    #[tokio::test]
    fn groups_run_side_by_side_never_within_one => groups_run_side_by_side_never_within_one();
    /// A SIGKILLed leader's groups wait for its runs to die.
    #[tokio::test]
    fn a_killed_leaders_groups_wait_for_its_runs_to_die => a_killed_leaders_groups_wait_for_its_runs_to_die();
    /// A SIGSTOPped leader's group runs die before the next leader runs their groups.
    #[tokio::test]
    fn a_frozen_leaders_group_runs_die_before_the_next_leader_runs_their_groups => a_frozen_leaders_group_runs_die_before_the_next_leader_runs_their_groups();
}

/// One run as its handler journaled it: task id, group, start and end (ns).
struct Run {
    id: String,
    group: String,
    started: u128,
    ended: u128,
}

async fn groups_run_side_by_side_never_within_one(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let journal = bed.journal.clone();
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
        bed.coord.edit(&tasks).await.expect("enqueue"),
        leaderq::coord::Edited::Done
    );
    let journal_path = journal.display();
    let config = TestSettings::new(&journal)
        .set("queue", "concurrency", "4")
        .toml("groups")
        + &format!(
            r#"
[handlers.Grouped]
kind = "exec"
command = ["sh", "-c", "echo \"start $TASK_ID $(date +%s%N)\" >> {journal_path}; sleep 0.3; echo \"end $TASK_ID $(date +%s%N)\" >> {journal_path}"]
"#
        );
    bed.start_replica_with("groups", &config);
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;
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

/// A bed with two replicas with `concurrency = 4` on `backend`'s servers, whose `Grouped`
/// handler journals `start <taskId> <ns> <node> <shell pid>`, sleeps `run_for` and journals
/// `end <taskId> <ns> <node>`; and the node that leads them.
async fn leading_pair(backend: &str, run_for: &str) -> Option<(TestBed, String)> {
    let mut bed = TestBed::on(backend)?;
    for node in ["ka", "kb"] {
        let journal_path = bed.journal.display();
        let config = TestSettings::new(&bed.journal)
            .set("queue", "concurrency", "4")
            .toml(node)
            + &format!(
                r#"
[handlers.Grouped]
kind = "exec"
command = ["sh", "-c", "echo \"start $TASK_ID $(date +%s%N) {node} $$\" >> {journal_path}; sleep {run_for}; echo \"end $TASK_ID $(date +%s%N) {node}\" >> {journal_path}"]
"#
            );
        bed.start_replica_with(node, &config);
    }
    let leader = bed.leader(Duration::from_secs(20)).await;
    Some((bed, leader))
}

/// Enqueues `count` `Grouped` tasks over the groups a, b and c in turn (ids `a00`,
/// `b01`, …), in taskTime order.
async fn enqueue_grouped(coord: &dyn leaderq::coord::Coordinator, count: u64) {
    let tasks: Vec<leaderq::coord::Edit> = (0..count)
        .map(|n| {
            let group = ["a", "b", "c"][(n % 3) as usize];
            leaderq::coord::Edit::Create {
                key: format!("oracleTask/task_{n:02}"),
                value: json!({"taskId": format!("{group}{n:02}"), "taskTime": 1000 + n, "taskType": "Grouped", "taskGroup": group})
                    .to_string()
                    .into_bytes(),
            }
        })
        .collect();
    assert_eq!(
        coord.edit(&tasks).await.expect("enqueue"),
        leaderq::coord::Edited::Done
    );
}

/// Waits until `count` runs have started; the journal then.
async fn wait_for_starts(bed: &TestBed, count: usize) -> String {
    wait_until(
        Duration::from_secs(30),
        &format!("{count} runs"),
        async || {
            let text = std::fs::read_to_string(&bed.journal).unwrap();
            if text.lines().filter(|l| l.starts_with("start")).count() >= count {
                Ok(text)
            } else {
                Err(text)
            }
        },
    )
    .await
}

/// The runs the journal holds, as (id, node, start, end, shell pid); `end` is 0 for a run
/// that never journaled its end.
fn journaled_runs(text: &str) -> Vec<(String, String, u128, u128, u32)> {
    let mut runs: Vec<(String, String, u128, u128, u32)> = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let at: u128 = words[2].parse().unwrap();
        if words[0] == "start" {
            runs.push((
                words[1].into(),
                words[3].into(),
                at,
                0,
                words[4].parse().unwrap(),
            ));
        } else if let Some(run) = runs
            .iter_mut()
            .find(|r| r.0 == words[1] && r.1 == words[3] && r.3 == 0)
        {
            run.3 = at;
        }
    }
    runs
}

/// Every task of `count` ran to its end, and no two runs of one group overlapped.
fn assert_groups_never_overlapped(
    runs: &[(String, String, u128, u128, u32)],
    count: u64,
    text: &str,
) {
    for n in 0..count {
        let id = format!("{}{n:02}", ["a", "b", "c"][(n % 3) as usize]);
        assert!(
            text.lines().any(|l| l.starts_with(&format!("end {id} "))),
            "{id} never ran to its end: {text}"
        );
    }
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            let same_group = a.0[..1] == b.0[..1];
            let overlap = a.2 < b.3 && b.2 < a.3;
            assert!(
                !(same_group && overlap),
                "{} on {} and {} on {} of one group overlapped: {text}",
                a.0,
                a.1,
                b.0,
                b.1
            );
        }
    }
}

/// Two replicas with `concurrency = 4` over three groups of 0.5 s runs (so a free slot
/// always has a task of a running group to refuse); the leader's PID is
/// SIGKILLed while its runs are going (their supervisors kill them at once). Every task
/// still ends, and the runs of a group never overlap, across the two leaders: a run that
/// never ended counts as going until the kill.
async fn a_killed_leaders_groups_wait_for_its_runs_to_die(backend: &str) {
    let Some((mut bed, leader)) = leading_pair(backend, "0.5").await else {
        return;
    };
    enqueue_grouped(bed.coord.as_ref(), 15).await;
    // Kill the leader once its second wave of runs has started.
    wait_for_starts(&bed, 5).await;
    bed.replica(&leader).kill();
    let killed_at = now_ns();
    bed.wait_until_empty("oracleTask/", Duration::from_secs(90))
        .await;
    let text = std::fs::read_to_string(&bed.journal).unwrap();
    // A run the kill cut short ends at the kill.
    let mut runs = journaled_runs(&text);
    for run in runs.iter_mut().filter(|r| r.3 == 0) {
        assert_eq!(
            run.1, leader,
            "only the killed leader's runs end unrecorded: {text}"
        );
        run.3 = killed_at;
    }
    assert_groups_never_overlapped(&runs, 15, &text);
    assert!(
        runs.iter().any(|r| r.1 != leader),
        "the other replica took over: {text}"
    );
}

/// The same pair with runs of 4 s, longer than the 3 s TTL; the leader is frozen
/// (SIGSTOP, a paused VM) while its first three runs, one per group, are going. Their
/// supervisors kill them by the lease deadline, each seen gone (its shell's pid) before the
/// other replica starts a task of its group; the frozen leader, woken once the other leads,
/// runs nothing more. Every task still ends, and no two runs of one group overlap.
async fn a_frozen_leaders_group_runs_die_before_the_next_leader_runs_their_groups(backend: &str) {
    let Some((mut bed, leader)) = leading_pair(backend, "4").await else {
        return;
    };
    enqueue_grouped(bed.coord.as_ref(), 6).await;
    let text = wait_for_starts(&bed, 3).await;
    let frozen = bed.replica(&leader).pid();
    common::signal(frozen, "STOP");
    let frozen_at = now_ns();
    // When each of the frozen leader's runs is gone, polled often: the times measured are
    // the runs' ends in the overlap check.
    let cut = journaled_runs(&text);
    let mut gone: HashMap<u32, u128> = HashMap::new();
    while gone.len() < cut.len() {
        for run in &cut {
            if !gone.contains_key(&run.4) && !common::process_alive(run.4) {
                gone.insert(run.4, now_ns());
            }
        }
        assert!(
            now_ns() - frozen_at < 10_000_000_000,
            "the frozen leader's runs are still alive 10 s later: {:?}",
            cut.iter()
                .filter(|r| !gone.contains_key(&r.4))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Woken once the other replica has started a run.
    bed.wait_journal(
        Duration::from_secs(30),
        "the other replica took over",
        |journal| {
            journal
                .iter()
                .any(|l| l.len() == 5 && l[0] == "start" && l[3] != leader)
        },
    )
    .await;
    common::signal(frozen, "CONT");
    bed.wait_until_empty("oracleTask/", Duration::from_secs(90))
        .await;
    let text = std::fs::read_to_string(&bed.journal).unwrap();
    let mut runs = journaled_runs(&text);
    for run in runs.iter_mut() {
        if run.1 == leader {
            assert!(
                run.2 < frozen_at,
                "the frozen leader started {} after it was woken: {text}",
                run.0
            );
        }
        if run.3 == 0 {
            run.3 = *gone
                .get(&run.4)
                .unwrap_or_else(|| panic!("{} never ended: {text}", run.0));
        }
    }
    assert_groups_never_overlapped(&runs, 6, &text);
}
