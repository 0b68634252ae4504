//! Scheduled tasks (`runAt`) on every backend's real servers: a task scheduled 2 s ahead
//! does not start before its time and starts at it (woken by its own timer, well before
//! the leader's next watch would end), as its handler's own journal line says; on `leaderq server`, the server counts no request at all while the
//! task waits, as in the same window with no task. On `leaderq server` alone: `tasks list`
//! and `status` show a scheduled task and when it is due, and a `runAt` that cannot be read
//! or lies further ahead than `queue.run_at_max_ahead` is dead-lettered with the reason.

use super::*;

on_every_backend! {
    /// A task scheduled 2 s ahead starts on time and costs the server nothing meanwhile.
    #[tokio::test]
    fn a_scheduled_task_starts_on_time_and_costs_nothing_while_it_waits => starts_on_time();
}

/// How far ahead the task is scheduled, and how late its handler may start: late enough
/// that a loaded machine does not fail the test, early enough that a leader which only
/// noticed the task when its watch ended (tens of seconds here) does. How late it starts on an
/// idle machine is a figure of `leaderq-lab bench --only schedules`, not of a test.
const AHEAD_MS: u128 = 2_000;
const LATE_MAX_MS: i128 = 1_500;
/// The window in which the server's requests are counted: it starts once the leader has
/// seen the task (which takes well under `SEEN_WITHIN`) and ends well before the task is
/// due.
const SEEN_WITHIN: Duration = Duration::from_millis(500);
const WINDOW: Duration = Duration::from_millis(1_400);

/// The replica's settings: the test bed's, a handler that journals its start with the
/// time in ns, and for Consul a TTL and a blocking wait long enough that no renewal and no
/// blocking query's time-out falls within the counted windows.
fn timed_settings(journal: &Path, backend: &str) -> String {
    let base = if backend == "consul" {
        TestSettings::new(journal)
            .ttl("30s")
            .set("consul", "wait", "\"60s\"")
    } else {
        TestSettings::new(journal)
    };
    let j = journal.display();
    base.toml("s1")
        + &format!(
            "\n[handlers.Timed]\nkind = \"exec\"\ncommand = [\"sh\", \"-c\", \"echo \\\"start $TASK_ID $(date +%s%N)\\\" >> {j}\"]\n"
        )
}

/// `runAt` as the producers of each backend's test write it: every accepted form.
fn run_at_value(backend: &str, run_at_ms: u128) -> Value {
    let seconds = format!("{}.{:03}", run_at_ms / 1000, run_at_ms % 1000);
    let time = chrono::DateTime::from_timestamp_millis(run_at_ms as i64).unwrap();
    match backend {
        "consul" => json!(seconds.parse::<f64>().unwrap()),
        "redis" => json!(seconds),
        "etcd" => json!(leaderq::task::rfc3339(time)),
        _ => json!(time
            .with_timezone(&chrono::FixedOffset::east_opt(2 * 3600).unwrap())
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, false)),
    }
}

/// The server's request counts by endpoint and status (`leaderq server` only).
async fn server_requests(addr: &str) -> std::collections::BTreeMap<String, u64> {
    let text = client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counts: std::collections::BTreeMap<String, u64> = text
        .lines()
        .filter_map(|line| line.strip_prefix("leaderq_server_http_requests_total{"))
        .filter_map(|rest| {
            let (labels, count) = rest.split_once("} ")?;
            Some((labels.to_string(), count.trim().parse().ok()?))
        })
        .collect();
    // The replica's own requests are there: the counter is read right.
    assert!(!counts.is_empty(), "no request counted: {text}");
    counts
}

/// What was counted between `before` and `after`, by endpoint and status.
fn requests_between(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> Vec<(String, u64)> {
    after
        .iter()
        .map(|(labels, n)| (labels.clone(), n - before.get(labels).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// One replica leads; a task scheduled `AHEAD_MS` ahead is written. Its handler starts no
/// sooner than its runAt and less than `LATE_MAX_MS` after it. On `leaderq server`, the
/// server counts no request while the task waits (nor in the same window before it).
async fn starts_on_time(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let journal = bed.journal.clone();
    let coord = bed.coord.clone();
    let server = bed
        .cluster
        .env()
        .into_iter()
        .find(|(name, _)| name == "CONSUL_HTTP_ADDR" && backend == "consul")
        .map(|(_, addr)| addr);
    bed.start_replica_with("s1", &timed_settings(&journal, backend));
    let replica = &bed.replicas[0];
    wait_until(Duration::from_secs(30), "a leader", async || {
        let (holder, _) = coord
            .observe(leaderq::coord::Version::default(), Duration::ZERO)
            .await
            .expect("observe");
        holder.lease.ok_or_else(|| replica.log_text())
    })
    .await;
    let idle = match &server {
        Some(addr) => {
            // What a new leader does once (its records, the first prune of the history) is
            // over when it waits on its blocking queries, counted here.
            common::wait_until_blocked(addr, 1).await;
            let before = server_requests(addr).await;
            // Counts what the server answers in a fixed window: nothing, when all is idle.
            tokio::time::sleep(WINDOW).await;
            Some(requests_between(&before, &server_requests(addr).await))
        }
        None => None,
    };

    let run_at_ms = (now_ns() / 1_000_000) + AHEAD_MS;
    let run_at_ns = run_at_ms as i128 * 1_000_000;
    let task = json!({
        "taskId": "timed",
        "taskTime": 1,
        "taskType": "Timed",
        "runAt": run_at_value(backend, run_at_ms),
    });
    let parked = match &server {
        Some(addr) => Some((
            server_requests(addr).await,
            common::metric(addr, "leaderq_server_blocked_queries").await,
        )),
        None => None,
    };
    let create = [leaderq::coord::Edit::Create {
        key: "oracleTask/task_timed".into(),
        value: task.to_string().into_bytes(),
    }];
    assert_eq!(
        coord.edit(&create).await.expect("enqueue"),
        leaderq::coord::Edited::Done
    );
    if let (Some(addr), Some(idle), Some((written, parked))) = (&server, idle, parked) {
        // The leader has seen the task once its blocking query, woken by the write, has
        // answered (a request besides the write) and it waits again on as many queries.
        wait_until(SEEN_WITHIN, "the leader saw the task", async || {
            let answered = requests_between(&written, &server_requests(addr).await);
            let now = common::metric(addr, "leaderq_server_blocked_queries").await;
            let total: u64 = answered.iter().map(|(_, n)| n).sum();
            if total >= 2 && now >= parked {
                Ok(())
            } else {
                Err((answered, now))
            }
        })
        .await;
        let before = server_requests(addr).await;
        // Counts what the server answers in a fixed window while the task waits: nothing.
        tokio::time::sleep(WINDOW).await;
        let waiting = requests_between(&before, &server_requests(addr).await);
        assert!(
            (now_ns() as i128) < run_at_ns,
            "the counted window ended after the task was due: the machine is too slow for this measurement"
        );
        eprintln!(
            "{backend}: requests the server answered in {} ms while the task waited: {waiting:?}; in the same window with no task: {idle:?}",
            WINDOW.as_millis()
        );
        assert_eq!(
            waiting,
            Vec::new(),
            "the leader made requests while the task waited: {}",
            replica.log_text()
        );
    }

    let line = wait_until(
        Duration::from_millis(AHEAD_MS as u64) + Duration::from_secs(20),
        "the scheduled task ran",
        async || {
            let text = std::fs::read_to_string(&journal).unwrap();
            match text.lines().find(|l| l.starts_with("start timed ")) {
                Some(line) => Ok(line.to_string()),
                None => Err(replica.log_text()),
            }
        },
    )
    .await;
    let start_ns: i128 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
    let late_ms = (start_ns - run_at_ns) as f64 / 1e6;
    eprintln!("{backend}: the scheduled task's handler started {late_ms:.1} ms after its runAt");
    assert!(
        start_ns >= run_at_ns,
        "the handler started {:.1} ms before its runAt",
        -late_ms
    );
    assert!(
        start_ns - run_at_ns < LATE_MAX_MS * 1_000_000,
        "the handler started {late_ms:.1} ms after its runAt: {}",
        replica.log_text()
    );
}

/// `leaderq` with the cluster's environment.
fn leaderq_on(env: &[(String, String)], args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leaderq"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "leaderq {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A task scheduled an hour ahead waits, shown as scheduled with its due time by `tasks
/// list` and `status` (text and JSON); one scheduled in the past runs at once; a runAt that
/// is not a time, and one further ahead than `queue.run_at_max_ahead`, are dead-lettered
/// with reasons that say so.
#[tokio::test]
async fn scheduled_tasks_are_listed_with_their_due_time_and_bad_ones_dead_lettered() {
    let Some(mut bed) = TestBed::on("consul") else {
        return;
    };
    let journal = bed.journal.clone();
    let env = bed.cluster.env();
    // The operator's settings, for `tasks list` and `status`.
    let settings = leaderq::config::Settings::load(None, env.clone()).unwrap();
    let coord = bed.coord.clone();
    let now_s = (now_ns() / 1_000_000_000) as i64;
    let later = chrono::DateTime::from_timestamp(now_s + 3600, 0).unwrap();
    let tasks = [
        ("past", json!(now_s - 60)),
        ("later", json!(leaderq::task::rfc3339(later))),
        ("words", json!("next tuesday")),
        ("flag", json!(true)),
        ("far", json!(now_s + 2 * 86_400)),
    ];
    let create: Vec<leaderq::coord::Edit> = tasks
        .iter()
        .enumerate()
        .map(|(n, (id, run_at))| leaderq::coord::Edit::Create {
            key: format!("oracleTask/task_{id}"),
            value: json!({"taskId": id, "taskTime": n, "taskType": "Work", "runAt": run_at})
                .to_string()
                .into_bytes(),
        })
        .collect();
    assert_eq!(
        coord.edit(&create).await.expect("enqueue"),
        leaderq::coord::Edited::Done
    );
    let config = TestSettings::new(&journal)
        .set("queue", "run_at_max_ahead", "\"24h\"")
        .toml("s1");
    bed.start_replica_with("s1", &config);
    let replica = &bed.replicas[0];
    let dead = wait_until(
        Duration::from_secs(30),
        "three dead letters and a run",
        async || {
            let (dead, _) = coord
                .list(
                    "oracleTaskDead/",
                    leaderq::coord::Version::default(),
                    Duration::ZERO,
                )
                .await
                .expect("list");
            let ran = std::fs::read_to_string(&journal).unwrap();
            if dead.len() == 3 && ran.contains("run past ") {
                Ok(dead)
            } else {
                Err(format!(
                    "dead letters {dead:?}, journal {ran:?}: {}",
                    replica.log_text()
                ))
            }
        },
    )
    .await;
    let reason = |id: &str| {
        let letter = dead
            .iter()
            .map(|d| serde_json::from_slice::<Value>(&d.value).unwrap())
            .find(|v| v["taskId"] == id)
            .unwrap_or_else(|| panic!("no dead letter for {id}: {dead:?}"));
        letter["deadReason"].as_str().unwrap().to_string()
    };
    for id in ["words", "flag"] {
        let reason = reason(id);
        assert!(
            reason.starts_with("runAt ")
                && reason.contains("epoch seconds")
                && reason.contains("RFC 3339"),
            "{id}: {reason}"
        );
    }
    let far = reason("far");
    assert!(
        far.starts_with("runAt ") && far.contains("queue.run_at_max_ahead") && far.contains("24h"),
        "{far}"
    );

    let limits = leaderq::operate::waits::Limits::of(&settings);
    let rows = leaderq::operate::tasks::list(coord.as_ref(), &settings.queue, &limits)
        .await
        .unwrap();
    let row = rows
        .iter()
        .find(|r| r.key == "oracleTask/task_later")
        .unwrap_or_else(|| panic!("{rows:?}"));
    assert_eq!(row.state, "scheduled");
    assert_eq!(
        row.due_at.as_deref(),
        Some(leaderq::task::rfc3339(later).as_str())
    );
    let status =
        leaderq::operate::status::status(coord.as_ref(), &settings.queue, &settings.election)
            .await
            .unwrap();
    assert_eq!((status.scheduled, status.pending), (1, 0), "{status:?}");
    assert_eq!(
        status.next_due.as_deref(),
        Some(leaderq::task::rfc3339(later).as_str())
    );
    let listed = leaderq_on(&env, &["tasks", "list"]);
    let line = listed
        .lines()
        .find(|l| l.contains("oracleTask/task_later"))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(
        line.starts_with("scheduled ") && line.contains("in 59m"),
        "{listed}"
    );
    let shown = leaderq_on(&env, &["status"]);
    assert!(
        shown.contains("scheduled:     1")
            && shown.contains(&leaderq::task::rfc3339(later))
            && shown.contains("in 59m"),
        "{shown}"
    );
}
