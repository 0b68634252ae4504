//! The queue's edges: values too large for a claim transaction, taskTime order while the
//! leader works through a backlog, and hostile `attempts`/`notBefore` values.

use super::*;

/// Extra handlers for these tests. `Paced` takes about 50 ms and writes
/// `start <taskId> <epoch ns>`; `Steady` writes `run <taskId>` and takes just over the
/// 5 ms under which the leader claims batches (so it claims one task at a time); `FailOnce` fails its first attempt (`fail <taskId> <ns>`)
/// and then behaves like `Paced`.
fn paced_handlers(journal: &Path) -> String {
    let journal = journal.display();
    format!(
        r#"
[handlers.Paced]
kind = "exec"
command = ["sh", "-c", "echo \"start $TASK_ID $(date +%s%N)\" >> {journal}; sleep 0.05"]
[handlers.Steady]
kind = "exec"
command = ["sh", "-c", "echo \"run $TASK_ID\" >> {journal}; sleep 0.006"]
[handlers.FailOnce]
kind = "exec"
command = ["sh", "-c", "if [ \"$LEADERQ_ATTEMPT\" -gt 1 ]; then echo \"start $TASK_ID $(date +%s%N)\" >> {journal}; sleep 0.05; else echo \"fail $TASK_ID $(date +%s%N)\" >> {journal}; exit 1; fi"]
"#
    )
}

fn start_paced_replica(bed: &mut Bed, node: &str) {
    let config = bed.settings.toml(node) + &paced_handlers(&bed.journal);
    let replica = ConsumerProcess::start(&bed.cluster.addr, node, bed.dir.path(), &config);
    bed.replicas.push(replica);
}

/// The leader key's session and ModifyIndex (the holder's fencing token).
async fn leader_key(bed: &Bed) -> (String, u64) {
    let entries: Value = get_json(&bed.cluster.url("/v1/kv/consumerLeader")).await;
    (
        entries[0]["Session"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        entries[0]["ModifyIndex"].as_u64().unwrap(),
    )
}

/// `(event, taskId, epoch ns)` of the journal lines the paced handlers wrote.
fn paced_events(bed: &Bed) -> Vec<(String, String, u128)> {
    bed.journal()
        .into_iter()
        .filter(|l| l.len() == 3)
        .map(|l| (l[0].clone(), l[1].clone(), l[2].parse().unwrap()))
        .collect()
}

async fn wait_for_event(bed: &Bed, event: &str, id: &str) -> u128 {
    let line = bed
        .wait_for_line(Duration::from_secs(30), |l| {
            l.len() == 3 && l[0] == event && l[1] == id
        })
        .await;
    line[2].parse().unwrap()
}

/// One task too large for any claim transaction (400 KB, 533 KB base64) among normal and
/// 150 KB tasks: the others all run, the huge one lands in dead-letter with the reason and
/// its original key, and the leader never steps down (same session, same fencing token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_task_is_dead_lettered_and_never_blocks_the_queue_or_the_leadership() {
    let mut bed = Bed::new();
    bed.start_replica("r1");
    bed.leader(Duration::from_secs(30)).await;
    let before = leader_key(&bed).await;
    let mut expected = Vec::new();
    for n in 0..10 {
        let id = format!("n{n}");
        bed.put_task(
            &format!("task_{id}"),
            json!({"taskId": id, "taskTime": 10 + n, "taskType": "Work"}),
        )
        .await;
        expected.push(id);
    }
    bed.put_task(
        "huge",
        json!({"taskId": "huge", "taskTime": 5, "taskType": "Work", "taskPara": {"blob": "x".repeat(400_000)}}),
    )
    .await;
    // Each fits a claim on its own; three of them do not fit one transaction together.
    for n in 0..4 {
        let id = format!("m{n}");
        bed.put_task(
            &format!("task_{id}"),
            json!({"taskId": id, "taskTime": 6 + n, "taskType": "Work", "taskPara": {"blob": "y".repeat(150_000)}}),
        )
        .await;
        expected.push(id);
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(30))
        .await;
    let mut ran: Vec<String> = bed
        .journal()
        .iter()
        .filter(|l| l[0] == "run")
        .map(|l| l[1].clone())
        .collect();
    ran.sort();
    expected.sort();
    assert_eq!(ran, expected, "every other task runs exactly once");
    let dead = bed.dead_letters().await;
    let letter = &dead["oracleTaskDead/huge"];
    assert_eq!(letter["originalKey"], "oracleTask/huge", "{letter}");
    assert_eq!(letter["taskId"], "huge");
    assert_eq!(letter["taskType"], "Work");
    let reason = letter["deadReason"].as_str().unwrap();
    assert!(reason.contains("too large"), "{reason}");
    assert_eq!(
        dead.len(),
        1,
        "only the huge task is dead: {:?}",
        dead.keys()
    );
    let log = bed.replicas[0].log_text();
    assert!(!log.contains("stepping down"), "{log}");
    assert_eq!(leader_key(&bed).await, before, "the leadership changed");
}

/// A task with an earlier taskTime PUT while the leader works through a backlog of ~50 ms
/// tasks is claimed right after the run in progress: at most one backlog task starts
/// between its PUT and its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn earlier_task_put_during_a_backlog_is_claimed_next() {
    let mut bed = Bed::new();
    for n in 0..40 {
        bed.put_task(
            &format!("b{n:02}"),
            json!({"taskId": format!("b{n:02}"), "taskTime": 100 + n, "taskType": "Paced"}),
        )
        .await;
    }
    start_paced_replica(&mut bed, "r1");
    bed.wait_for_line(Duration::from_secs(30), |l| l.len() == 3 && l[1] == "b02")
        .await;
    let put_at = now_ns();
    bed.put_task(
        "early",
        json!({"taskId": "early", "taskTime": 1, "taskType": "Paced"}),
    )
    .await;
    let started = wait_for_event(&bed, "start", "early").await;
    let later: Vec<String> = paced_events(&bed)
        .into_iter()
        .filter(|(_, id, at)| id.starts_with('b') && *at > put_at && *at < started)
        .map(|(_, id, _)| id)
        .collect();
    eprintln!(
        "early task started {:.1} ms after its PUT, after {} later task(s)",
        (started.saturating_sub(put_at)) as f64 / 1e6,
        later.len()
    );
    assert!(
        later.len() <= 1,
        "later tasks started before the earlier one: {later:?}\n{}",
        bed.replicas[0].log_text()
    );
    bed.wait_until_empty("oracleTask/", Duration::from_secs(30))
        .await;
}

/// A pending task that a producer rewrites in place with an earlier taskTime (its key is
/// not new, so no look at the names sees it) is moved up by the next listing, which the
/// leader reads while it claims and merges (after 256 claims of a 300-task backlog, one at
/// a time), not left for its old turn at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_rewritten_earlier_in_place_is_moved_up_by_the_next_listing() {
    let mut bed = Bed::new();
    for n in 0..300 {
        bed.put_task(
            &format!("b{n:03}"),
            json!({"taskId": format!("b{n:03}"), "taskTime": 1000 + n, "taskType": "Steady"}),
        )
        .await;
    }
    start_paced_replica(&mut bed, "r1");
    bed.wait_for_line(Duration::from_secs(30), |l| l.len() >= 2 && l[1] == "b010")
        .await;
    bed.put_task(
        "b299",
        json!({"taskId": "b299", "taskTime": 1, "taskType": "Steady"}),
    )
    .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;
    let order: Vec<String> = bed
        .journal()
        .into_iter()
        .filter(|l| l.len() >= 2 && l[0] == "run")
        .map(|l| l[1].clone())
        .collect();
    let at = |id: &str| order.iter().position(|ran| ran == id);
    eprintln!(
        "the rewritten task ran {}th of {}",
        at("b299").map_or(0, |n| n + 1),
        order.len()
    );
    assert_eq!(order.len(), 300, "every task ran once: {order:?}");
    assert!(
        at("b299") < at("b280"),
        "the rewritten task waited for its old turn: {order:?}\n{}",
        bed.replicas[0].log_text()
    );
}

/// A retry whose backoff passes while the leader works through a backlog of later tasks
/// is claimed right after the run in progress, not after the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_that_becomes_due_during_a_backlog_is_claimed_next() {
    let mut bed = Bed::new();
    bed.put_task(
        "retry",
        json!({"taskId": "retry", "taskTime": 1, "taskType": "FailOnce"}),
    )
    .await;
    for n in 0..40 {
        bed.put_task(
            &format!("b{n:02}"),
            json!({"taskId": format!("b{n:02}"), "taskTime": 100 + n, "taskType": "Paced"}),
        )
        .await;
    }
    start_paced_replica(&mut bed, "r1");
    let failed = wait_for_event(&bed, "fail", "retry").await;
    let started = wait_for_event(&bed, "start", "retry").await;
    // backoff_base 50 ms plus up to 20% jitter, from about when the handler exited.
    let due = failed + 80_000_000;
    let later: Vec<String> = paced_events(&bed)
        .into_iter()
        .filter(|(_, id, at)| id.starts_with('b') && *at > due && *at < started)
        .map(|(_, id, _)| id)
        .collect();
    eprintln!(
        "retry started {:.1} ms after its failure, {} later task(s) after it was due",
        (started.saturating_sub(failed)) as f64 / 1e6,
        later.len()
    );
    assert!(
        later.len() <= 1,
        "later tasks started before the due retry: {later:?}\n{}",
        bed.replicas[0].log_text()
    );
    bed.wait_until_empty("oracleTask/", Duration::from_secs(30))
        .await;
}

/// `attempts` near and beyond u32::MAX, negative or junk, and `notBefore` far in the
/// future, negative or junk: no panic, no wrap, no stall. Attempts saturate at u32::MAX (a
/// failure then dead-letters at once); a notBefore further ahead than leaderq ever writes
/// (backoff_max + 20%) or not a time is ignored, so the task runs now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_attempts_and_not_before_values_neither_wrap_nor_stall() {
    let mut bed = Bed::new();
    let tasks = [
        (
            "at_max",
            json!({"attempts": 4_294_967_295u64, "taskType": "Work"}),
        ),
        (
            "over_max",
            json!({"attempts": 4_294_967_297u64, "taskType": "Fail"}),
        ),
        ("float", json!({"attempts": 1e30, "taskType": "Work"})),
        ("negative", json!({"attempts": -3, "taskType": "Work"})),
        ("text", json!({"attempts": "7", "taskType": "Work"})),
        ("junk", json!({"attempts": "many", "taskType": "Work"})),
        (
            "far",
            json!({"notBefore": "9999-12-31T23:59:59Z", "taskType": "Work"}),
        ),
        ("past", json!({"notBefore": -5, "taskType": "Work"})),
        ("garbage", json!({"notBefore": "soon", "taskType": "Work"})),
        ("enormous", json!({"notBefore": 1e300, "taskType": "Work"})),
    ];
    for (n, (id, fields)) in tasks.iter().enumerate() {
        let mut task = fields.clone();
        task["taskId"] = json!(id);
        task["taskTime"] = json!(n);
        bed.put_task(&format!("task_{id}"), task).await;
    }
    bed.start_replica("r1");
    bed.wait_until_empty("oracleTask/", Duration::from_secs(20))
        .await;
    let journal = bed.journal();
    let attempt_of = |id: &str| -> Vec<String> {
        journal
            .iter()
            .filter(|l| l[1] == id)
            .map(|l| format!("{} {}", l[0], l[4]))
            .collect()
    };
    assert_eq!(attempt_of("at_max"), ["run 4294967295"]);
    assert_eq!(attempt_of("over_max"), ["fail 4294967295"]);
    assert_eq!(attempt_of("float"), ["run 4294967295"]);
    assert_eq!(attempt_of("negative"), ["run 1"]);
    assert_eq!(attempt_of("text"), ["run 8"]);
    assert_eq!(attempt_of("junk"), ["run 1"]);
    for id in ["far", "past", "garbage", "enormous"] {
        assert_eq!(attempt_of(id), ["run 1"], "{id}");
    }
    let dead = bed.dead_letters().await;
    assert_eq!(dead.len(), 1, "{:?}", dead.keys());
    assert_eq!(
        dead["oracleTaskDead/task_over_max"]["attempts"],
        4_294_967_295u64
    );
    let log = bed.replicas[0].log_text();
    assert!(!log.contains("panicked"), "{log}");
}

/// A task whose key is under another session's lock-delay (its holder's session was just
/// destroyed) cannot be claimed for a while: the tasks after it run meanwhile, and it runs
/// once the delay is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_under_lock_delay_does_not_hold_up_the_others() {
    let mut bed = Bed::new();
    bed.start_replica("r1");
    bed.leader(Duration::from_secs(30)).await;
    let http = client();
    let session: Value = http
        .put(bed.cluster.url("/v1/session/create"))
        .body(json!({"Name": "other-program", "LockDelay": "3s"}).to_string())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session = session["ID"].as_str().unwrap().to_string();
    // Another program holds the first task's key, then its session ends: lock-delay starts.
    let acquired = http
        .put(
            bed.cluster
                .url(&format!("/v1/kv/oracleTask/task_delayed?acquire={session}")),
        )
        .body(json!({"taskId": "delayed", "taskTime": 1, "taskType": "Work"}).to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(acquired, "true");
    let destroyed = http
        .put(bed.cluster.url(&format!("/v1/session/destroy/{session}")))
        .send()
        .await
        .unwrap();
    assert!(destroyed.status().is_success());
    let put_at = Instant::now();
    for n in 0..5 {
        bed.put_task(
            &format!("task_{n}"),
            json!({"taskId": format!("later{n}"), "taskTime": 10 + n, "taskType": "Work"}),
        )
        .await;
    }
    bed.wait_for_line(Duration::from_secs(20), |l| {
        l[0] == "run" && l[1] == "later4"
    })
    .await;
    let later_done = put_at.elapsed();
    bed.wait_until_empty("oracleTask/", Duration::from_secs(20))
        .await;
    let journal = bed.journal();
    assert!(
        later_done < Duration::from_secs(2),
        "the later tasks waited {later_done:?} for the one under lock-delay: {journal:?}"
    );
    assert_eq!(
        journal.iter().filter(|l| l[1] == "delayed").count(),
        1,
        "{journal:?}"
    );
    // Tried about once a second while the delay lasts, not in a loop.
    let log = bed.replicas[0].log_text();
    let tries = log
        .matches("task refused for a while by the coordinator")
        .count();
    assert!((1..=6).contains(&tries), "{tries} tries:\n{log}");
}
