//! The operator's memory and control with real replicas on the embedded server: the
//! history of finished tasks, the leadership timeline, the replicas' records (standbys in
//! `status`), and `tasks cancel|delete|retry --all`.

use super::*;

/// `leaderq` with `args` against the bed's server; its stdout parsed as JSON.
fn leaderq_json(bed: &Bed, args: &[&str]) -> Value {
    let output = leaderq(bed, args);
    assert!(
        output.status.success(),
        "leaderq {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "leaderq {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// Polls `leaderq args` until `done` holds for its JSON, for at most `limit`.
async fn wait_for_json(
    bed: &Bed,
    args: &[&str],
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    wait_until(limit, &format!("leaderq {args:?} shows it"), async || {
        let value = leaderq_json(bed, args);
        if done(&value) {
            Ok(value)
        } else {
            Err(value)
        }
    })
    .await
}

/// A completed task leaves a history record (node, fencing token, attempts, duration)
/// written by its completion; a dead letter shows as a failed one; `--type` and `--failed`
/// filter them.
#[tokio::test]
async fn finished_tasks_are_listed_in_history_with_their_run() {
    let mut bed = Bed::new();
    bed.start_replica("r1");
    bed.leader(Duration::from_secs(30)).await;
    bed.put_task(
        "task_ok",
        json!({"taskId": "ok", "taskTime": 1, "taskType": "Work"}),
    )
    .await;
    bed.put_task(
        "task_bad",
        json!({"taskId": "bad", "taskTime": 2, "taskType": "Fail"}),
    )
    .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(20))
        .await;
    let all = wait_for_json(
        &bed,
        &["tasks", "history", "--json"],
        Duration::from_secs(5),
        |v| v.as_array().is_some_and(|a| a.len() == 2),
    )
    .await;
    let token: u64 = bed
        .wait_for_line(Duration::from_secs(1), |l| l[0] == "run")
        .await[2]
        .parse()
        .unwrap();
    let done = all
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["outcome"] == "completed")
        .unwrap_or_else(|| panic!("no completed record: {all}"));
    assert_eq!(done["key"], "oracleTask/task_ok");
    assert_eq!(done["taskId"], "ok");
    assert_eq!(done["taskType"], "Work");
    assert_eq!(done["node"], "r1");
    assert_eq!(done["attempts"], 1);
    assert_eq!(done["fencingToken"], token);
    assert!(done["durationMs"].is_u64(), "{done}");
    assert!(done["recordKey"]
        .as_str()
        .unwrap()
        .starts_with("oracleTaskDone/"));
    let failed = leaderq_json(&bed, &["tasks", "history", "--failed", "--json"]);
    let failed = failed.as_array().unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["outcome"], "dead");
    assert_eq!(failed[0]["taskId"], "bad");
    assert_eq!(failed[0]["attempts"], 3);
    assert!(failed[0]["lastError"].as_str().unwrap().contains("boom"));
    assert_eq!(failed[0]["node"], "r1");
    assert_eq!(failed[0]["fencingToken"], token);
    let work = leaderq_json(&bed, &["tasks", "history", "--type", "Work", "--json"]);
    assert_eq!(work.as_array().unwrap().len(), 1, "{work}");
    let table = leaderq(&bed, &["tasks", "history"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("completed") && table.contains("dead"),
        "{table}"
    );
}

/// The status's replicas, once `done` holds for them.
async fn wait_for_replicas(
    bed: &Bed,
    limit: Duration,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let status = wait_for_json(bed, &["status", "--json"], limit, |v| {
        v["replicas"].as_array().is_some_and(|r| done(r))
    })
    .await;
    status["replicas"].as_array().unwrap().clone()
}

fn status_of<'a>(replicas: &'a [Value], node: &str) -> Option<&'a str> {
    replicas
        .iter()
        .find(|r| r["node"] == node)
        .and_then(|r| r["status"].as_str())
}

/// `status` lists the leader and its standbys with their heartbeats; the timeline records
/// each term with its fencing token and why the one before ended: first, a resignation at
/// SIGTERM (the replica's record goes with it), an expired lease after SIGKILL (its record
/// shows as gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_standbys_and_the_timeline_says_why_each_term_ended() {
    let mut bed = Bed::with_short_ttl();
    for node in ["r1", "r2", "r3"] {
        bed.start_replica(node);
    }
    let first = bed.leader(Duration::from_secs(30)).await;
    let replicas = wait_for_replicas(&bed, Duration::from_secs(10), |r| {
        r.len() == 3 && r.iter().filter(|r| r["status"] == "standby").count() == 2
    })
    .await;
    assert_eq!(
        replicas[0]["node"],
        first.as_str(),
        "the leader first: {replicas:?}"
    );
    assert_eq!(replicas[0]["status"], "leader");
    assert!(replicas[0]["fencingToken"].is_u64(), "{replicas:?}");
    for replica in &replicas {
        assert!(
            replica["lastSeenSeconds"].as_i64().unwrap() <= 2,
            "{replica}"
        );
        assert!(replica["heartbeatAt"].is_string(), "{replica}");
    }
    let timeline = leaderq_json(&bed, &["status", "--timeline", "--json"]);
    assert_eq!(timeline[0]["node"], first.as_str(), "{timeline}");
    assert_eq!(timeline[0]["previousEnd"], "first");

    let status = bed.replica(&first).terminate();
    assert!(status.success());
    let timeline = wait_for_json(
        &bed,
        &["status", "--timeline", "--json"],
        Duration::from_secs(10),
        |t| t.as_array().is_some_and(|t| t.len() == 2),
    )
    .await;
    let second = timeline[0]["node"].as_str().unwrap().to_string();
    assert_ne!(second, first);
    assert_eq!(
        timeline[0]["previousEnd"], "resigned (shut down)",
        "{timeline}"
    );
    assert_eq!(timeline[1]["ended"], "resigned (shut down)", "{timeline}");
    assert!(timeline[0]["fencingToken"].as_u64() > timeline[1]["fencingToken"].as_u64());
    wait_for_replicas(&bed, Duration::from_secs(5), |r| {
        r.len() == 2 && status_of(r, &second) == Some("leader")
    })
    .await;

    bed.replica(&second).kill();
    let timeline = wait_for_json(
        &bed,
        &["status", "--timeline", "--json"],
        Duration::from_secs(15),
        |t| t.as_array().is_some_and(|t| t.len() == 3),
    )
    .await;
    assert_ne!(timeline[0]["node"], second.as_str());
    assert!(
        timeline[0]["previousEnd"]
            .as_str()
            .unwrap()
            .starts_with("expired lease"),
        "{timeline}"
    );
    let third = timeline[0]["node"].as_str().unwrap().to_string();
    let replicas = wait_for_replicas(&bed, Duration::from_secs(5), |r| {
        status_of(r, &second) == Some("gone") && status_of(r, &third) == Some("leader")
    })
    .await;
    assert_eq!(replicas.len(), 2, "{replicas:?}");
    let text = leaderq(&bed, &["status", "--timeline"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("expired lease") && text.contains("(leading)"),
        "{text}"
    );
}

/// `tasks cancel` of a pending task dead-letters it at once; of a running one, the leader
/// stops its handler (a 30 s sleep, gone within seconds) and dead-letters it as cancelled;
/// `tasks delete` removes a pending task or a dead letter but refuses a running one;
/// `tasks retry --all --type` brings back only the dead letters of that type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_delete_and_retry_all_act_on_pending_running_and_dead_tasks() {
    let mut bed = Bed::new();
    let journal = bed.journal.display().to_string();
    let config = bed.settings.toml("r1")
        + &format!(
            "[handlers.Long]\nkind = \"exec\"\ncommand = [\"sh\", \"-c\", \"echo start $TASK_ID >> {journal}; sleep 30; echo end $TASK_ID >> {journal}\"]\n"
        );
    let replica = ConsumerProcess::start(&bed.cluster.addr, "r1", bed.dir.path(), &config);
    bed.replicas.push(replica);
    bed.leader(Duration::from_secs(30)).await;

    // Paused, so that these two stay pending.
    assert!(leaderq(&bed, &["pause"]).status.success());
    bed.put_task(
        "task_p1",
        json!({"taskId": "p1", "taskTime": 1, "taskType": "Work"}),
    )
    .await;
    bed.put_task(
        "task_p2",
        json!({"taskId": "p2", "taskTime": 2, "taskType": "Work"}),
    )
    .await;
    let cancelled = leaderq(&bed, &["tasks", "cancel", "task_p1"]);
    assert!(
        cancelled.status.success(),
        "{}",
        String::from_utf8_lossy(&cancelled.stderr)
    );
    let dead = bed.dead_letters().await;
    let letter = &dead["oracleTaskDead/task_p1"];
    assert!(
        letter["deadReason"]
            .as_str()
            .unwrap()
            .starts_with("cancelled"),
        "{letter}"
    );
    let deleted = leaderq(&bed, &["tasks", "delete", "oracleTask/task_p2"]);
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    let listed = leaderq_json(&bed, &["tasks", "list", "--json"]);
    assert_eq!(
        listed.as_array().unwrap().len(),
        1,
        "only the dead letter: {listed}"
    );
    assert!(leaderq(&bed, &["resume"]).status.success());

    bed.put_task(
        "task_long",
        json!({"taskId": "long", "taskTime": 3, "taskType": "Long"}),
    )
    .await;
    bed.wait_for_line(Duration::from_secs(10), |l| {
        l[0] == "start" && l[1] == "long"
    })
    .await;
    let refused = leaderq(&bed, &["tasks", "delete", "task_long"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is running"));
    let started = Instant::now();
    let cancelled = leaderq(&bed, &["tasks", "cancel", "task_long"]);
    let said = String::from_utf8_lossy(&cancelled.stdout);
    assert!(
        cancelled.status.success() && said.contains("cancelled: moved to oracleTaskDead/task_long"),
        "{said}{}",
        String::from_utf8_lossy(&cancelled.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let dead = bed.dead_letters().await;
    let letter = &dead["oracleTaskDead/task_long"];
    assert!(
        letter["deadReason"]
            .as_str()
            .unwrap()
            .starts_with("cancelled"),
        "{letter}"
    );
    assert!(
        !bed.journal().iter().any(|l| l[0] == "end"),
        "the handler ran on"
    );

    let retried = leaderq(&bed, &["tasks", "retry", "--all", "--type", "Work"]);
    let said = String::from_utf8_lossy(&retried.stdout);
    assert!(
        retried.status.success() && said.contains("requeued 1 dead letter"),
        "{said}"
    );
    assert!(
        retried.stderr.is_empty(),
        "no progress into a pipe: {:?}",
        String::from_utf8_lossy(&retried.stderr)
    );
    bed.wait_for_line(Duration::from_secs(10), |l| l[0] == "run" && l[1] == "p1")
        .await;
    let deleted = leaderq(&bed, &["tasks", "delete", "oracleTaskDead/task_long"]);
    assert!(deleted.status.success());
    assert!(bed.dead_letters().await.is_empty());
}

/// The id given to `enqueue --id` finds the task in `tasks show`, `cancel` and `delete`,
/// as its key and its name do.
#[tokio::test]
async fn an_enqueued_id_names_the_task_for_show_and_delete() {
    let bed = Bed::new();
    let enqueued = leaderq(&bed, &["enqueue", "--type", "Work", "--id", "abc"]);
    assert!(enqueued.status.success());
    for name in ["abc", "task_abc", "oracleTask/task_abc"] {
        let shown = leaderq(&bed, &["tasks", "show", name]);
        let said = String::from_utf8_lossy(&shown.stdout);
        assert!(
            shown.status.success() && said.contains("oracleTask/task_abc"),
            "tasks show {name}: {said}{}",
            String::from_utf8_lossy(&shown.stderr)
        );
    }
    let deleted = leaderq(&bed, &["tasks", "delete", "abc"]);
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    let missing = leaderq(&bed, &["tasks", "show", "abc"]);
    assert_eq!(missing.status.code(), Some(1));
}

on_every_backend! {
    /// History, replica records and the timeline are kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    fn history_replicas_and_timeline_are_kept => history_replicas_and_timeline_are_kept();
}

/// Polls `read` until `done` holds for what it answers, for at most `limit`.
async fn until_it<T: std::fmt::Debug, F: std::future::Future<Output = T>>(
    limit: Duration,
    read: impl Fn() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    wait_until(limit, "the awaited answer", async || {
        let value = read().await;
        if done(&value) {
            Ok(value)
        } else {
            Err(value)
        }
    })
    .await
}

/// On every backend's real servers: completions leave history records, the replicas'
/// records show a leader and a standby, and the timeline records each term with why the one
/// before ended (the seam's `Edit::Put` and listings of leaderq's own prefixes).
async fn history_replicas_and_timeline_are_kept(backend: &str) {
    use leaderq::operate::{history as ops_history, leadership, status};
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    // The operator's settings, for the prefixes the records are kept under.
    let settings = leaderq::config::Settings::load(None, bed.cluster.env()).expect("settings");
    let coord = bed.coord.clone();
    let coord = coord.as_ref();
    let tasks: Vec<leaderq::coord::Edit> = (0..3u64)
        .map(|n| leaderq::coord::Edit::Create {
            key: format!("oracleTask/task_{n}"),
            value: json!({"taskId": format!("h{n}"), "taskTime": 1000 + n, "taskType": "Work"})
                .to_string()
                .into_bytes(),
        })
        .collect();
    assert_eq!(
        coord.edit(&tasks).await.expect("enqueue"),
        leaderq::coord::Edited::Done
    );
    for node in ["ops-a", "ops-b"] {
        bed.start_replica(node);
    }
    let limit = Duration::from_secs(30);
    let filter = ops_history::HistoryFilter::default();
    let history = until_it(
        limit,
        || ops_history::history(coord, &settings.queue, &filter),
        |h| h.as_ref().is_ok_and(|h| h.len() == 3),
    )
    .await
    .unwrap();
    assert!(history
        .iter()
        .all(|r| r.outcome == "completed" && r.fencing_token.is_some()));
    assert_eq!(history[2].task_id, "h0", "newest first: {history:?}");
    let seen = until_it(
        limit,
        || status::replicas(coord, &settings.election),
        |r| {
            r.as_ref()
                .is_ok_and(|r| r.len() == 2 && r[0].status == "leader" && r[1].status == "standby")
        },
    )
    .await
    .unwrap();
    let first = seen[0].record.node.clone();
    let timeline = leadership::timeline(coord, &settings.election, 10)
        .await
        .unwrap();
    assert_eq!(timeline.len(), 1, "{timeline:?}");
    assert_eq!(
        (timeline[0].node.as_str(), timeline[0].previous_end.as_str()),
        (first.as_str(), "first")
    );
    assert!(bed.replica(&first).terminate().success());
    let timeline = until_it(
        limit,
        || leadership::timeline(coord, &settings.election, 10),
        |t| t.as_ref().is_ok_and(|t| t.len() == 2),
    )
    .await
    .unwrap();
    assert_ne!(timeline[0].node, first);
    assert_eq!(timeline[0].previous_end, "resigned (shut down)");
    assert!(timeline[0].fencing_token > timeline[1].fencing_token);
    let seen = status::replicas(coord, &settings.election).await.unwrap();
    assert_eq!(
        seen.len(),
        1,
        "a replica that shut down took its record along: {seen:?}"
    );
}

/// `leaderq run` records its terms too: a command that failed and was restarted shows as a
/// term that ended with its exit status, in `status --name NAME --timeline`.
#[tokio::test]
async fn leaderq_run_records_its_terms_in_the_timeline() {
    let bed = Bed::new();
    let flag = bed.dir.path().join("once");
    let flaky = format!(
        "if [ -f {0} ]; then exit 0; fi; touch {0}; exit 3",
        flag.display()
    );
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_leaderq"))
        .args([
            "run",
            "--name",
            "job",
            "--restart",
            "on-failure",
            "--data-dir",
        ])
        .arg(bed.dir.path().join("run"))
        .args(["--", "sh", "-c", &flaky])
        .env("CONSUL_HTTP_ADDR", &bed.cluster.addr)
        .env("LEADERQ__ELECTION__LEASE_TTL", "2s")
        .env("LEADERQ__ELECTION__LOCK_DELAY", "200ms")
        .env("LEADERQ__QUEUE__KILL_GRACE", "200ms")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let timeline = leaderq_json(&bed, &["status", "--name", "job", "--timeline", "--json"]);
    let terms = timeline.as_array().unwrap();
    assert_eq!(terms.len(), 2, "{timeline}");
    assert_eq!(terms[1]["previousEnd"], "first");
    assert_eq!(terms[1]["ended"], "resigned (the command exited with 3)");
    assert_eq!(
        terms[0]["previousEnd"],
        "resigned (the command exited with 3)"
    );
    assert_eq!(terms[0]["ended"], "resigned (the command exited with 0)");
    assert!(terms[0]["fencingToken"].as_u64() > terms[1]["fencingToken"].as_u64());
}
