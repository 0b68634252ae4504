//! A replica's identity over real processes: one replica per data dir, a node id that
//! survives a restart (so its check and session do), a fencing token that rises across a
//! restart, and settings that can never work stopping the start with a message.
//!
//! These replicas are started by hand (not through `Bed::start_replica`) because the cases
//! need what the bed hides: no configured node id, a data dir shared or reused, a process
//! group to kill with its handler, a server without the TTL test knob.

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, ExitStatus, Stdio};

use super::*;

/// A `leaderq consume` in its own process group, with no node id unless `env` sets one.
struct Replica {
    child: Child,
    log: PathBuf,
}

impl Replica {
    fn start(
        bed: &Bed,
        name: &str,
        config: &str,
        data_dir: &Path,
        env: &[(&str, &str)],
    ) -> Replica {
        let config_path = bed.dir.path().join(format!("{name}.toml"));
        std::fs::write(&config_path, config).expect("write config");
        let log = bed.dir.path().join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_leaderq"))
            .args(["consume", "--config"])
            .arg(&config_path)
            .env("CONSUL_HTTP_ADDR", &bed.cluster.addr)
            .env("LEADERQ__DATA__DIR", data_dir)
            .env("LEADERQ__OBSERVE__LISTEN", "127.0.0.1:0")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .process_group(0)
            .spawn()
            .expect("spawn leaderq consume");
        Replica { child, log }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL to the replica and its handler (its process group): a crash.
    fn kill_group(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }

    /// The exit status, if the replica exits within `limit`.
    async fn exit_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let child = &mut self.child;
        // Bounded by the time-out, not by `wait_until`: the callers assert on `None`, with
        // the replica's log.
        let exited = wait_until(Duration::MAX, "the replica exits", async || {
            child.try_wait().expect("try_wait").ok_or("running")
        });
        tokio::time::timeout(limit, exited).await.ok()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill_group();
        }
    }
}

/// The leader key as it stands: holder value, ModifyIndex (the holder's fencing token) and
/// session; `None` when unheld.
async fn holder(bed: &Bed) -> Option<(Value, u64, String)> {
    let response = client()
        .get(bed.cluster.url("/v1/kv/consumerLeader"))
        .send()
        .await
        .unwrap();
    if response.status() != 200 {
        return None;
    }
    let entries: Value = response.json().await.unwrap();
    let session = entries[0].get("Session")?.as_str()?.to_string();
    let value = base64::engine::general_purpose::STANDARD
        .decode(entries[0]["Value"].as_str()?)
        .ok()?;
    Some((
        serde_json::from_slice(&value).ok()?,
        entries[0]["ModifyIndex"].as_u64()?,
        session,
    ))
}

/// Waits until the leader key is held by the process `pid`; returns its fencing token and
/// session.
async fn held_by(bed: &Bed, pid: u32, limit: Duration) -> (u64, String) {
    wait_until(limit, &format!("pid {pid} leads"), async || {
        match holder(bed).await {
            Some((value, token, session)) if value["pid"] == json!(pid) => Ok((token, session)),
            other => Err(other),
        }
    })
    .await
}

/// The agent's checks, by id.
async fn agent_checks(bed: &Bed) -> serde_json::Map<String, Value> {
    let checks: Value = get_json(&bed.cluster.url("/v1/agent/checks")).await;
    checks.as_object().cloned().unwrap_or_default()
}

fn leaderq_checks(checks: &serde_json::Map<String, Value>) -> Vec<(&String, &Value)> {
    checks
        .iter()
        .filter(|(id, _)| id.starts_with("leaderq:"))
        .collect()
}

/// Two replicas started with the same settings on one data dir (two containers sharing a
/// volume): the second stops at once, naming the pid that holds the dir and what to do,
/// and every task runs once, on the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_replica_on_a_data_dir_in_use_stops_with_a_message() {
    let bed = Bed::new();
    let data = bed.dir.path().join("shared");
    let first = Replica::start(&bed, "first", &bed.settings.toml("first"), &data, &[]);
    held_by(&bed, first.pid(), Duration::from_secs(20)).await;
    let mut second = Replica::start(&bed, "second", &bed.settings.toml("second"), &data, &[]);
    let status = second.exit_within(Duration::from_secs(10)).await;
    let log = second.log_text();
    assert!(
        status.is_some_and(|s| !s.success()),
        "the second replica on {} kept running ({status:?}):\n{log}",
        data.display()
    );
    assert!(
        log.contains(&format!("pid {}", first.pid()))
            && log.contains("data dir")
            && log.contains("--data-dir"),
        "{log}"
    );
    for n in 0..5 {
        bed.put_task(
            &format!("task_{n}"),
            json!({"taskId": format!("d{n}"), "taskTime": n, "taskType": "Work"}),
        )
        .await;
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(20))
        .await;
    let journal = bed.journal();
    assert_eq!(journal.len(), 5, "each task runs once: {journal:?}");
    assert!(journal.iter().all(|l| l[3] == "first"), "{journal:?}");
}

/// A leader with no configured node id is SIGKILLed (with its handler) and started again at
/// once on the same data dir: it leads again within moments under a strictly higher
/// fencing token, reruns the cut task under it, and leaves exactly one check, passing,
/// which stays passing after the dead process's TTL has run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_immediate_restart_leads_again_under_a_higher_token() {
    let bed = Bed::new();
    let ttl = Duration::from_secs(3);
    let data = bed.dir.path().join("restarting");
    let config = bed.settings.toml("r");
    let mut first = Replica::start(&bed, "first", &config, &data, &[]);
    let (token_before, _) = held_by(&bed, first.pid(), Duration::from_secs(20)).await;
    bed.put_task(
        "task_q",
        json!({"taskId": "q", "taskTime": 1, "taskType": "Slow"}),
    )
    .await;
    let cut = bed
        .wait_for_line(Duration::from_secs(10), |l| l[0] == "start" && l[1] == "q")
        .await;
    first.kill_group();
    let killed = Instant::now();
    let second = Replica::start(&bed, "second", &config, &data, &[]);
    let (token_after, session) = held_by(&bed, second.pid(), Duration::from_secs(20)).await;
    let leaderless = killed.elapsed();
    assert!(
        leaderless < ttl,
        "leaderless for {leaderless:?} after the restart:\n{}",
        second.log_text()
    );
    assert!(
        token_after > token_before,
        "the restarted leader kept fencing token {token_before} (now {token_after})"
    );
    let rerun = bed
        .wait_for_line(Duration::from_secs(20), |l| {
            l[0] == "end" && l[1] == "q" && l[4] == "2"
        })
        .await;
    assert!(
        rerun[2].parse::<u64>().unwrap() > cut[2].parse::<u64>().unwrap(),
        "the cut task reran under the fencing token it first ran under: {:?}",
        bed.journal()
    );
    let checks = agent_checks(&bed).await;
    let ours = leaderq_checks(&checks);
    assert_eq!(ours.len(), 1, "one check per replica: {checks:?}");
    assert_eq!(ours[0].1["Status"], "passing", "{checks:?}");
    // The dead process's check and session would have run out by now.
    while killed.elapsed() < ttl + Duration::from_secs(1) {
        let checks = agent_checks(&bed).await;
        assert!(
            leaderq_checks(&checks)
                .iter()
                .all(|(_, check)| check["Status"] == "passing"),
            "a check went critical after the restart: {checks:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, _, still) = holder(&bed).await.expect("a leader");
    assert_eq!(still, session, "the restarted leader lost its session");
}

/// A critical check left by an older version (`leaderq:<host>-<pid>`) whose process is gone
/// is deregistered at start; one whose pid still runs on this host is left alone.
#[tokio::test]
async fn stale_check_of_a_dead_pid_on_this_host_is_deregistered() {
    let mut bed = Bed::new();
    let host = leaderq::util::hostname();
    let mut gone = Command::new("true").spawn().unwrap();
    let dead_pid = gone.id();
    gone.wait().unwrap();
    let stale = format!("leaderq:{host}-{dead_pid}");
    let alive = format!("leaderq:{host}-{}", std::process::id());
    for id in [&stale, &alive] {
        let body =
            json!({"ID": id, "Name": id.replacen(':', " ", 1), "TTL": "30s", "Status": "critical"});
        let response = client()
            .put(bed.cluster.url("/v1/agent/check/register"))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    bed.start_replica("r1");
    bed.leader(Duration::from_secs(30)).await;
    let checks = wait_until(
        Duration::from_secs(10),
        "the stale check gone",
        async || {
            let checks = agent_checks(&bed).await;
            if checks.contains_key(&stale) {
                Err((checks, bed.replicas[0].log_text()))
            } else {
                Ok(checks)
            }
        },
    )
    .await;
    assert!(checks.contains_key(&alive), "{checks:?}");
}

/// A session TTL below the server's minimum (a server without the test knob: 10s, as
/// Consul) stops the start with the setting named, and leaves no check behind.
#[tokio::test]
async fn session_ttl_below_the_server_minimum_stops_the_start() {
    let temp = tempfile::tempdir().unwrap();
    let server =
        ServerProcess::start_in(&temp.path().join("server"), &["--session-ttl-min", "10s"])
            .expect("server starts");
    let bed = TestBed::with(server);
    let mut replica = Replica::start(
        &bed,
        "short",
        &TestSettings::new(&bed.journal).toml("$NODE"),
        &bed.dir.path().join("short"),
        &[],
    );
    let status = replica.exit_within(Duration::from_secs(10)).await;
    let log = replica.log_text();
    assert!(status.is_some_and(|s| !s.success()), "{status:?}\n{log}");
    assert!(
        log.contains("election.lease_ttl") && log.contains("3s"),
        "{log}"
    );
    let checks = agent_checks(&bed).await;
    assert!(leaderq_checks(&checks).is_empty(), "{checks:?}");
}

/// An exec handler whose program is missing, not on PATH or not executable stops the start
/// with the handler's taskType and the program named.
#[tokio::test]
async fn handler_program_that_cannot_run_stops_the_start() {
    let bed = Bed::new();
    let not_executable = bed.dir.path().join("not-executable.sh");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    let cases = [
        ("/nonexistent/leaderq-test-program".to_string(), "not found"),
        ("leaderq-no-such-program".to_string(), "PATH"),
        (not_executable.display().to_string(), "not executable"),
    ];
    for (n, (program, reason)) in cases.iter().enumerate() {
        let config =
            format!("[handlers.Work]\nkind = \"exec\"\ncommand = [{program:?}, \"--flag\"]\n");
        let mut replica = Replica::start(
            &bed,
            &format!("bad{n}"),
            &config,
            &bed.dir.path().join(format!("bad{n}")),
            &[],
        );
        let status = replica.exit_within(Duration::from_secs(10)).await;
        let log = replica.log_text();
        assert!(
            status.is_some_and(|s| !s.success()),
            "{program}: {status:?}\n{log}"
        );
        assert!(
            log.contains("handlers.Work") && log.contains(program.as_str()) && log.contains(reason),
            "{program}: {log}"
        );
    }
}

/// A replica with no handler at all refuses to start (it would dead-letter every task)
/// unless `queue.allow_no_handlers` says so; with it, it joins the election.
#[tokio::test]
async fn replica_without_handlers_refuses_to_start_unless_allowed() {
    let bed = Bed::new();
    let mut refused = Replica::start(&bed, "none", "", &bed.dir.path().join("none"), &[]);
    let status = refused.exit_within(Duration::from_secs(10)).await;
    let log = refused.log_text();
    assert!(status.is_some_and(|s| !s.success()), "{status:?}\n{log}");
    assert!(log.contains("queue.allow_no_handlers"), "{log}");
    let allowed = Replica::start(
        &bed,
        "allowed",
        "",
        &bed.dir.path().join("allowed"),
        &[("LEADERQ__QUEUE__ALLOW_NO_HANDLERS", "true")],
    );
    held_by(&bed, allowed.pid(), Duration::from_secs(20)).await;
}
