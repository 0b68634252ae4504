//! Handlers never outlive the lease they started under: a handler that forks (a shell with
//! a background worker) is killed as a whole on SIGKILL or SIGSTOP of the leader, on
//! time-out, step-down and shutdown; a restarted replica waits for the previous process's
//! handlers; Ctrl-C does not reach handlers; handlers get a clean environment.
//!
//! The forking handler checks, before it starts its worker, whether any process of an
//! earlier run of any task is still alive, and writes `overlap <pid>` if one is: the
//! workers' own records prove or disprove overlapping runs.

use super::*;

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};

/// A shell handler that records `overlap <pid>` for every live process of an earlier run,
/// starts `sleep 30` in the background, records
/// `start <taskId> <attempt> <shell pid> <worker pid> <node>` and waits for its worker.
/// `prelude` runs first (e.g. `trap '' TERM` to ignore SIGTERM).
fn forking_handler(journal: &Path, node: &str, prelude: &str) -> String {
    let j = journal.display();
    let script = format!(
        "{prelude}
while read ev id att a b rest; do
  if [ \"$ev\" = start ]; then
    for p in $a $b; do
      st=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null)
      if [ -n \"$st\" ] && [ \"$st\" != Z ]; then echo \"overlap $p\" >> {j}; fi
    done
  fi
done < {j}
sleep 30 &
echo \"start $TASK_ID $LEADERQ_ATTEMPT $$ $! {node}\" >> {j}
wait"
    );
    serde_json::to_string(&["sh", "-c", &script]).unwrap()
}

/// Replica settings with a given TTL, a 500 ms kill grace, more `[queue]` keys (TOML
/// values) and handler tables.
fn replica_settings(journal: &Path, ttl: &str, queue: &[(&str, &str)], handlers: &str) -> String {
    let mut settings = TestSettings::new(journal)
        .ttl(ttl)
        .set("queue", "kill_grace", "\"500ms\"");
    for (key, value) in queue {
        settings = settings.set("queue", key, value);
    }
    settings.toml("") + handlers
}

/// Settings whose `Fork` handler is `forking_handler`.
fn fork_settings(
    bed: &Bed,
    node: &str,
    ttl: &str,
    queue: &[(&str, &str)],
    handler: &str,
) -> String {
    let command = forking_handler(&bed.journal, node, "");
    replica_settings(
        &bed.journal,
        ttl,
        queue,
        &format!("[handlers.Fork]\nkind = \"exec\"\ncommand = {command}\n{handler}"),
    )
}

/// Waits until none of `pids` is alive; returns how long that took, or panics after `limit`.
async fn wait_dead(pids: &[u32], limit: Duration) -> Duration {
    let started = Instant::now();
    wait_until(limit, "the handler processes gone", async || {
        let living: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|p| common::process_alive(*p))
            .collect();
        if living.is_empty() {
            Ok(started.elapsed())
        } else {
            Err(living)
        }
    })
    .await
}

/// The shell's and the worker's pids from a `start` line.
fn pids(start: &[String]) -> Vec<u32> {
    vec![start[3].parse().unwrap(), start[4].parse().unwrap()]
}

fn overlaps(bed: &Bed) -> Vec<Vec<String>> {
    bed.journal()
        .into_iter()
        .filter(|l| l[0] == "overlap")
        .collect()
}

async fn wait_for_start(bed: &Bed, id: &str, attempt: &str, limit: Duration) -> Vec<String> {
    bed.wait_for_line(limit, |l| l[0] == "start" && l[1] == id && l[2] == attempt)
        .await
}

/// SIGKILL of the leader's PID alone (as the OOM killer does): the forking handler and its
/// worker are gone at once, long before the session could expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_leader_pid_kills_its_forking_handler_at_once() {
    let mut bed = Bed::new();
    let config = fork_settings(&bed, "r1", "3s", &[], "");
    let replica = ConsumerProcess::start(&bed.cluster.addr, "r1", bed.dir.path(), &config);
    bed.replicas.push(replica);
    bed.leader(Duration::from_secs(30)).await;
    bed.put_task(
        "task_f",
        json!({"taskId": "f", "taskTime": 1, "taskType": "Fork"}),
    )
    .await;
    let start = wait_for_start(&bed, "f", "1", Duration::from_secs(10)).await;
    bed.replica("r1").kill();
    let took = wait_dead(&pids(&start), Duration::from_secs(1)).await;
    eprintln!("handler group gone {took:?} after SIGKILL of the leader");
}

/// A supervisor kept from an earlier run serves the next one, and the leader's death
/// still kills that run's whole group at once, and the supervisor with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_supervisor_runs_the_next_task_and_dies_with_its_leader() {
    let mut bed = Bed::new();
    let quick = serde_json::to_string(&[
        "sh",
        "-c",
        &format!("echo \"quick $TASK_ID $PPID\" >> {}", bed.journal.display()),
    ])
    .unwrap();
    let config = fork_settings(
        &bed,
        "r1",
        "3s",
        &[],
        &format!("[handlers.Quick]\nkind = \"exec\"\ncommand = {quick}\n"),
    );
    let replica = ConsumerProcess::start(&bed.cluster.addr, "r1", bed.dir.path(), &config);
    bed.replicas.push(replica);
    bed.leader(Duration::from_secs(30)).await;
    bed.put_task(
        "task_q",
        json!({"taskId": "q", "taskTime": 1, "taskType": "Quick"}),
    )
    .await;
    let first = bed
        .wait_for_line(Duration::from_secs(10), |l| l[0] == "quick")
        .await;
    bed.put_task(
        "task_f",
        json!({"taskId": "f", "taskTime": 2, "taskType": "Fork"}),
    )
    .await;
    let start = wait_for_start(&bed, "f", "1", Duration::from_secs(10)).await;
    let supervisor = testkit::harness::parent_of(start[3].parse().unwrap()).unwrap();
    assert_eq!(
        first[2],
        supervisor.to_string(),
        "the second run has a supervisor of its own"
    );
    bed.replica("r1").kill();
    let mut all = pids(&start);
    all.push(supervisor);
    let took = wait_dead(&all, Duration::from_secs(1)).await;
    eprintln!("handler group and kept supervisor gone {took:?} after SIGKILL of the leader");
}

/// A replica SIGKILLed and restarted at once on the same data dir does not start work while
/// the previous process's handlers are still alive (here they ignore SIGTERM, so they live
/// until the kill grace runs out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_replica_waits_for_the_previous_handlers() {
    let mut bed = Bed::new();
    let command = forking_handler(&bed.journal, "r1", "trap '' TERM");
    let config = replica_settings(
        &bed.journal,
        "3s",
        &[],
        &format!("[handlers.Fork]\nkind = \"exec\"\ncommand = {command}\n"),
    )
    .replace("kill_grace = \"500ms\"", "kill_grace = \"1s\"");
    let replica = ConsumerProcess::start(&bed.cluster.addr, "r1", bed.dir.path(), &config);
    bed.replicas.push(replica);
    bed.leader(Duration::from_secs(30)).await;
    bed.put_task(
        "task_r",
        json!({"taskId": "r", "taskTime": 1, "taskType": "Fork"}),
    )
    .await;
    let first = wait_for_start(&bed, "r", "1", Duration::from_secs(10)).await;
    bed.replica("r1").kill();
    bed.replicas.clear();
    let replica = ConsumerProcess::start(&bed.cluster.addr, "r1", bed.dir.path(), &config);
    bed.replicas.push(replica);
    wait_for_start(&bed, "r", "2", Duration::from_secs(20)).await;
    assert_eq!(overlaps(&bed), Vec::<Vec<String>>::new(), "runs overlapped");
    assert!(pids(&first).iter().all(|p| !common::process_alive(*p)));
    let log = bed.replicas[0].log_text();
    assert!(
        log.contains("waiting for the handlers of a previous leaderq process"),
        "{log}"
    );
}

/// SIGSTOP of the leader (a paused VM): its handler group is killed by the lease deadline,
/// before the standby takes over and runs the task again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_the_leader_kills_its_handler_by_the_lease_deadline() {
    let mut bed = Bed::new();
    for node in ["r1", "r2"] {
        let config = fork_settings(&bed, node, "2s", &[], "");
        let replica = ConsumerProcess::start(&bed.cluster.addr, node, bed.dir.path(), &config);
        bed.replicas.push(replica);
    }
    let leader = bed.leader(Duration::from_secs(30)).await;
    bed.put_task(
        "task_s",
        json!({"taskId": "s", "taskTime": 1, "taskType": "Fork"}),
    )
    .await;
    let start = wait_for_start(&bed, "s", "1", Duration::from_secs(10)).await;
    assert_eq!(start[5], leader);
    let pid = bed.replica(&leader).pid();
    common::signal(pid, "STOP");
    // The lease was last renewed before the stop, so its deadline is within one TTL (2s).
    let took = wait_dead(&pids(&start), Duration::from_secs(2)).await;
    eprintln!("handler group gone {took:?} after SIGSTOP of the leader");
    let again = wait_for_start(&bed, "s", "2", Duration::from_secs(20)).await;
    assert_ne!(again[5], leader);
    assert_eq!(overlaps(&bed), Vec::<Vec<String>>::new(), "runs overlapped");
    common::signal(pid, "CONT");
}

/// A TCP proxy between one replica and the server that can be cut, as a network partition.
struct Partition {
    pub addr: String,
    cut: tokio_util::sync::CancellationToken,
    accept: tokio::task::JoinHandle<()>,
}

impl Partition {
    async fn start(server: &str) -> Partition {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cut = tokio_util::sync::CancellationToken::new();
        let server = server.to_string();
        let stop = cut.clone();
        let accept = tokio::spawn(async move {
            let tracker = tokio_util::task::TaskTracker::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                if stop.is_cancelled() {
                    continue;
                }
                let server = server.clone();
                let stop = stop.clone();
                tracker.spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&server).await else {
                        return;
                    };
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    }
                });
            }
        });
        Partition { addr, cut, accept }
    }

    /// Drops every connection through the proxy and refuses new ones.
    fn cut(&self) {
        self.cut.cancel();
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.cut.cancel();
        self.accept.abort();
    }
}

/// A partitioned leader whose handler forks: the handler and its worker are killed before
/// the standby (on the other side of the partition) takes over and runs the task again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_leader_kills_its_forking_handler_before_the_takeover() {
    let mut bed = Bed::new();
    let partition = Partition::start(&bed.cluster.addr).await;
    let config = fork_settings(&bed, "r1", "2s", &[], "");
    let replica = ConsumerProcess::start(&partition.addr, "r1", bed.dir.path(), &config);
    bed.replicas.push(replica);
    assert_eq!(bed.leader(Duration::from_secs(30)).await, "r1");
    let config = fork_settings(&bed, "r2", "2s", &[], "");
    let replica = ConsumerProcess::start(&bed.cluster.addr, "r2", bed.dir.path(), &config);
    bed.replicas.push(replica);
    bed.put_task(
        "task_p",
        json!({"taskId": "p", "taskTime": 1, "taskType": "Fork"}),
    )
    .await;
    let start = wait_for_start(&bed, "p", "1", Duration::from_secs(10)).await;
    partition.cut();
    // The last renewal that got through was sent before the cut: the lease deadline is
    // within one TTL (2s) of it.
    let took = wait_dead(&pids(&start), Duration::from_secs(2)).await;
    eprintln!("handler group gone {took:?} after the partition");
    let again = wait_for_start(&bed, "p", "2", Duration::from_secs(20)).await;
    assert_eq!(again[5], "r2");
    assert_eq!(overlaps(&bed), Vec::<Vec<String>>::new(), "runs overlapped");
}

/// A time-out kills the handler's whole process group before the task is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_whole_handler_group_before_the_retry() {
    let mut bed = Bed::new();
    let config = fork_settings(&bed, "r1", "3s", &[], "timeout = \"500ms\"\n");
    let replica = ConsumerProcess::start(&bed.cluster.addr, "r1", bed.dir.path(), &config);
    bed.replicas.push(replica);
    bed.put_task(
        "task_t",
        json!({"taskId": "t", "taskTime": 1, "taskType": "Fork"}),
    )
    .await;
    let first = wait_for_start(&bed, "t", "1", Duration::from_secs(10)).await;
    wait_for_start(&bed, "t", "2", Duration::from_secs(10)).await;
    assert_eq!(overlaps(&bed), Vec::<Vec<String>>::new(), "runs overlapped");
    assert!(pids(&first).iter().all(|p| !common::process_alive(*p)));
}

/// A leader whose session is destroyed steps down and kills the handler's whole group
/// before the task runs again; the run it stopped for the lost session uses no attempt
/// (it puts the task back on the orphan its session left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_down_kills_the_whole_handler_group() {
    let mut bed = Bed::new();
    let config = fork_settings(&bed, "r1", "3s", &[], "");
    let replica = ConsumerProcess::start(&bed.cluster.addr, "r1", bed.dir.path(), &config);
    bed.replicas.push(replica);
    bed.leader(Duration::from_secs(30)).await;
    bed.put_task(
        "task_d",
        json!({"taskId": "d", "taskTime": 1, "taskType": "Fork"}),
    )
    .await;
    let first = wait_for_start(&bed, "d", "1", Duration::from_secs(10)).await;
    let entries: Value = get_json(&bed.cluster.url("/v1/kv/consumerLeader")).await;
    let session = entries[0]["Session"].as_str().unwrap().to_string();
    let destroyed = client()
        .put(bed.cluster.url(&format!("/v1/session/destroy/{session}")))
        .send()
        .await
        .unwrap();
    assert_eq!(destroyed.status(), 200);
    let second = bed
        .wait_for_line(Duration::from_secs(20), |l| {
            l[0] == "start" && l[1] == "d" && l[3] != first[3]
        })
        .await;
    assert_eq!(
        second[2], "1",
        "the stopped run used an attempt: {second:?}"
    );
    assert_eq!(overlaps(&bed), Vec::<Vec<String>>::new(), "runs overlapped");
    assert!(pids(&first).iter().all(|p| !common::process_alive(*p)));
    assert!(bed.replicas[0].log_text().contains("stepping down"));
}

/// On SIGTERM a handler that outlives the shutdown grace is killed with its whole group
/// before the replica exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_kills_the_whole_handler_group_before_exit() {
    let mut bed = Bed::new();
    let config = fork_settings(&bed, "r1", "3s", &[("shutdown_grace", "\"300ms\"")], "");
    let replica = ConsumerProcess::start(&bed.cluster.addr, "r1", bed.dir.path(), &config);
    bed.replicas.push(replica);
    bed.put_task(
        "task_g",
        json!({"taskId": "g", "taskTime": 1, "taskType": "Fork"}),
    )
    .await;
    let first = wait_for_start(&bed, "g", "1", Duration::from_secs(10)).await;
    let status = bed.replica("r1").terminate();
    assert!(status.success(), "{status}");
    let living: Vec<u32> = pids(&first)
        .into_iter()
        .filter(|p| common::process_alive(*p))
        .collect();
    assert!(living.is_empty(), "{living:?} outlived the replica");
}

/// A worker that leaves the handler's process group and session (`setsid`) is still
/// killed before the task is retried: the supervisor is its subreaper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaped_workers_are_killed_too() {
    let mut bed = Bed::new();
    let command =
        forking_handler(&bed.journal, "r1", "").replace("sleep 30 &", "setsid sleep 30 &");
    let config = replica_settings(
        &bed.journal,
        "3s",
        &[],
        &format!("[handlers.Fork]\nkind = \"exec\"\ncommand = {command}\ntimeout = \"500ms\"\n"),
    );
    let replica = ConsumerProcess::start(&bed.cluster.addr, "r1", bed.dir.path(), &config);
    bed.replicas.push(replica);
    bed.put_task(
        "task_x",
        json!({"taskId": "x", "taskTime": 1, "taskType": "Fork"}),
    )
    .await;
    let first = wait_for_start(&bed, "x", "1", Duration::from_secs(10)).await;
    wait_for_start(&bed, "x", "2", Duration::from_secs(10)).await;
    assert_eq!(overlaps(&bed), Vec::<Vec<String>>::new(), "runs overlapped");
    assert!(pids(&first).iter().all(|p| !common::process_alive(*p)));
}

/// If the supervisor itself is killed, the leader kills the handler's process group, and
/// the task is retried only after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_supervisor_leaves_the_leader_to_kill_the_handler() {
    let mut bed = Bed::new();
    let config = fork_settings(&bed, "r1", "3s", &[], "");
    let replica = ConsumerProcess::start(&bed.cluster.addr, "r1", bed.dir.path(), &config);
    bed.replicas.push(replica);
    bed.put_task(
        "task_v",
        json!({"taskId": "v", "taskTime": 1, "taskType": "Fork"}),
    )
    .await;
    let first = wait_for_start(&bed, "v", "1", Duration::from_secs(10)).await;
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", first[3])).unwrap();
    let supervisor: u32 = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let cmdline = std::fs::read(format!("/proc/{supervisor}/cmdline")).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("__supervise"),
        "the handler's parent is not a supervisor"
    );
    common::signal(supervisor, "KILL");
    wait_dead(&pids(&first), Duration::from_secs(2)).await;
    wait_for_start(&bed, "v", "2", Duration::from_secs(10)).await;
    assert_eq!(overlaps(&bed), Vec::<Vec<String>>::new(), "runs overlapped");
}

/// A replica started as its own process group, like a shell job, with extra environment.
struct Job {
    child: Child,
}

impl Job {
    fn start(bed: &Bed, node: &str, config_toml: &str, env: &[(&str, &str)]) -> Job {
        let config = bed.dir.path().join(format!("{node}.toml"));
        std::fs::write(&config, config_toml).unwrap();
        let log = bed.dir.path().join(format!("{node}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_leaderq"))
            .args(["consume", "--config"])
            .arg(&config)
            .env("CONSUL_HTTP_ADDR", &bed.cluster.addr)
            .env("LEADERQ__ELECTION__NODE_ID", node)
            .env("LEADERQ__DATA__DIR", bed.dir.path().join(node))
            .env("LEADERQ__OBSERVE__LISTEN", "127.0.0.1:0")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        Job { child }
    }

    /// Waits for the exit, at most `limit`.
    async fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        wait_until(limit, "the replica exits", async || {
            self.child.try_wait().unwrap().ok_or("running")
        })
        .await
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Ctrl-C in a terminal (SIGINT to the replica's whole process group) does not reach the
/// handler: it finishes within the shutdown grace and its task completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_does_not_reach_handlers_which_finish_within_the_grace() {
    let bed = Bed::new();
    let j = bed.journal.display();
    let script = format!("echo \"start $TASK_ID\" >> {j}; sleep 1; echo \"end $TASK_ID\" >> {j}");
    let command = serde_json::to_string(&["sh", "-c", &script]).unwrap();
    let config = replica_settings(
        &bed.journal,
        "3s",
        &[],
        &format!("[handlers.Job]\nkind = \"exec\"\ncommand = {command}\n"),
    );
    let mut job = Job::start(&bed, "r1", &config, &[]);
    bed.put_task(
        "task_c",
        json!({"taskId": "c", "taskTime": 1, "taskType": "Job"}),
    )
    .await;
    bed.wait_for_line(Duration::from_secs(10), |l| l[0] == "start")
        .await;
    let status = Command::new("kill")
        .args(["-INT", "--", &format!("-{}", job.child.id())])
        .status()
        .unwrap();
    assert!(status.success());
    job.wait(Duration::from_secs(15)).await;
    assert!(
        bed.journal().iter().any(|l| l[0] == "end" && l[1] == "c"),
        "the handler was interrupted: {:?}",
        bed.journal()
    );
    bed.wait_until_empty("oracleTask/", Duration::from_secs(5))
        .await;
}

/// A handler's environment is the allow-list, `pass_env`, `env` and the task's variables:
/// the replica's Consul token and LEADERQ__ settings never reach it; it runs in `cwd`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_get_a_clean_environment_and_their_cwd() {
    let bed = Bed::new();
    let out = bed.dir.path().join("env.out");
    let workdir = bed.dir.path().join("work");
    std::fs::create_dir(&workdir).unwrap();
    let script = format!("env > {0}; echo \"cwd=$(pwd)\" >> {0}", out.display());
    let command = serde_json::to_string(&["sh", "-c", &script]).unwrap();
    let config = replica_settings(
        &bed.journal,
        "3s",
        &[],
        &format!(
            "[handlers.Env]\nkind = \"exec\"\ncommand = {command}\ncwd = {:?}\n\
             env = {{ GREETING = \"hello\", TASK_ID = \"overridden\" }}\npass_env = [\"PASSED\"]\n",
            workdir.display().to_string()
        ),
    );
    let _job = Job::start(
        &bed,
        "r1",
        &config,
        &[
            ("CONSUL_HTTP_TOKEN", "secret-token"),
            ("LEADERQ__QUEUE__MAX_ATTEMPTS", "2"),
            ("NOT_PASSED", "no"),
            ("PASSED", "yes"),
            ("LANG", "C.UTF-8"),
        ],
    );
    bed.put_task(
        "task_e",
        json!({"taskId": "e", "taskTime": 1, "taskType": "Env"}),
    )
    .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(10))
        .await;
    let text = std::fs::read_to_string(&out).unwrap();
    let env: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    for secret in [
        "CONSUL_HTTP_TOKEN",
        "LEADERQ__QUEUE__MAX_ATTEMPTS",
        "NOT_PASSED",
    ] {
        assert!(!env.contains_key(secret), "{secret} reached the handler");
    }
    assert_eq!(env.get("LANG"), Some(&"C.UTF-8"));
    assert!(env.contains_key("PATH"));
    assert_eq!(env.get("TASK_ID"), Some(&"e"));
    assert_eq!(env.get("TASK_TYPE"), Some(&"Env"));
    assert_eq!(env.get("TASK_KEY"), Some(&"oracleTask/task_e"));
    assert_eq!(env.get("LEADERQ_ATTEMPT"), Some(&"1"));
    assert!(env.contains_key("LEADERQ_FENCING_TOKEN"));
    assert_eq!(env.get("GREETING"), Some(&"hello"));
    assert_eq!(env.get("PASSED"), Some(&"yes"));
    assert_eq!(env.get("cwd"), Some(&workdir.to_str().unwrap()));
}

mod exec_handler {
    //! The exec handler driven through the library, with the `leaderq` binary as its
    //! supervisor.

    use std::time::Duration;

    use leaderq::coord::FencingToken;
    use leaderq::handler::{ExecHandler, Handler, OutputSlot, TaskContext};
    use leaderq::supervise::Supervision;
    use tokio_util::sync::CancellationToken;

    fn ctx() -> TaskContext {
        TaskContext {
            key: "oracleTask/t1".into(),
            task_id: "t1".into(),
            task_type: "Demo".into(),
            task_json: br#"{"taskId":"t1"}"#.to_vec(),
            attempt: 2,
            fencing_token: FencingToken(9),
            cancel: CancellationToken::new(),
            lease_deadline: TaskContext::unbounded_lease(),
            output: OutputSlot::default(),
            progress: Default::default(),
        }
    }

    fn exec(command: &[&str], timeout: Option<Duration>) -> ExecHandler {
        ExecHandler {
            command: command.iter().map(|s| s.to_string()).collect(),
            timeout,
            env: vec![("PATH".into(), std::env::var("PATH").unwrap())],
            cwd: None,
            supervision: Supervision {
                program: env!("CARGO_BIN_EXE_leaderq").into(),
                kill_grace: Duration::from_millis(500),
                margin: Duration::from_millis(100),
                lock_file: None,
                pool: Default::default(),
            },
            permanent_exit_codes: vec![65],
        }
    }

    fn sh(script: &str) -> ExecHandler {
        exec(&["sh", "-c", script], None)
    }

    /// A run's streams are kept to their last `limit` bytes, however much it prints (here
    /// 64 MiB of stderr, never held whole), with a count of what came before; a failure's
    /// message still carries the end of stderr.
    #[tokio::test]
    async fn exec_output_keeps_the_end_of_each_stream_however_long() {
        let context = TaskContext {
            output: OutputSlot::new(1000),
            ..ctx()
        };
        let script =
            "echo hello; head -c 67108864 /dev/zero | tr '\\0' y >&2; echo bye >&2; exit 3";
        let err = sh(script).handle(&context).await.unwrap_err();
        assert!(err.message.ends_with("yyybye"), "{}", err.message);
        let output = context.output.take().expect("output kept");
        assert_eq!(output.stdout, b"hello\n");
        assert_eq!(output.stdout_dropped, 0);
        assert_eq!(output.stderr.len(), 1000);
        assert!(
            output.stderr.ends_with(b"yyybye\n"),
            "{:?}",
            &output.stderr[990..]
        );
        assert_eq!(output.stderr_dropped, 67_108_864 + 4 - 1000);
        // A slot that keeps nothing is left empty.
        let plain = ctx();
        sh("echo hello").handle(&plain).await.unwrap();
        assert_eq!(plain.output.take(), None);
    }

    /// Runs one after the other share one supervisor; one that died while idle is
    /// replaced, and the run goes on.
    #[tokio::test]
    async fn a_supervisor_is_kept_between_runs_and_replaced_once_dead() {
        let handler = exec(&["true"], None);
        handler.handle(&ctx()).await.unwrap();
        let kept = handler.supervision.pool.idle_pids();
        assert_eq!(kept.len(), 1, "{kept:?}");
        handler.handle(&ctx()).await.unwrap();
        assert_eq!(handler.supervision.pool.idle_pids(), kept);
        let pid = kept[0];
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
        // Dead: a zombie until its parent, this process, reaps it. The bound only guards
        // against a hang.
        let zombie = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| Some(stat.rsplit_once(')')?.1.trim_start().starts_with('Z')))
                .unwrap_or(false)
        };
        for _ in 0..3000 {
            if zombie() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(zombie(), "the killed supervisor {pid} is not dead yet");
        handler.handle(&ctx()).await.unwrap();
        let now = handler.supervision.pool.idle_pids();
        assert_eq!(now.len(), 1, "{now:?}");
        assert_ne!(now, kept);
    }

    /// The command gets the task on stdin and its identity in the environment.
    #[tokio::test]
    async fn exec_passes_task_on_stdin_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let script = format!(
            "cat > {0}; echo \" $TASK_ID $TASK_TYPE $TASK_KEY $LEADERQ_ATTEMPT $LEADERQ_FENCING_TOKEN\" >> {0}",
            out.display()
        );
        sh(&script).handle(&ctx()).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(out).unwrap(),
            "{\"taskId\":\"t1\"} t1 Demo oracleTask/t1 2 9\n"
        );
    }

    /// A task larger than the stdin pipe reaches a handler that starts reading late whole
    /// (the supervisor writes what the pipe takes, a kept thread the rest); the same
    /// supervisor then serves a small task, which ends at once.
    #[tokio::test]
    async fn a_task_larger_than_the_pipe_reaches_a_slow_reader_whole() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let handler = sh(&format!("sleep 0.3; cat > {}", out.display()));
        let large = TaskContext {
            task_json: format!(r#"{{"taskId":"t1","taskPara":"{}"}}"#, "x".repeat(300_000))
                .into_bytes(),
            ..ctx()
        };
        handler.handle(&large).await.unwrap();
        assert!(
            std::fs::read(&out).unwrap() == large.task_json,
            "the handler read {} of {} bytes",
            std::fs::metadata(&out).unwrap().len(),
            large.task_json.len()
        );
        let kept = handler.supervision.pool.idle_pids();
        handler.handle(&ctx()).await.unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), ctx().task_json);
        assert_eq!(handler.supervision.pool.idle_pids(), kept);
    }

    /// A handler that exits 0 and leaves workers behind, in its group and in a session of
    /// their own, or only the latter: the run ends (a success) once the supervisor killed
    /// them, not when they end by themselves (in 300 s; the 20 s bound only guards against
    /// that wait).
    #[tokio::test]
    async fn what_a_handler_leaves_behind_is_killed_before_its_run_ends() {
        for (leaves, workers) in [
            (
                "sleep 300 & echo $! >> {0}; setsid sleep 300 & echo $! >> {0}",
                2,
            ),
            ("setsid sleep 300 & echo $! >> {0}", 1),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let pids = dir.path().join("pids");
            let script = format!(
                "{}; exit 0",
                leaves.replace("{0}", &pids.display().to_string())
            );
            let handler = sh(&script);
            let ran = tokio::time::timeout(Duration::from_secs(20), handler.handle(&ctx())).await;
            let left: Vec<u32> = std::fs::read_to_string(&pids)
                .unwrap()
                .lines()
                .map(|pid| pid.parse().unwrap())
                .collect();
            if ran.is_err() {
                for pid in &left {
                    crate::common::signal(*pid, "KILL");
                }
                panic!("the run of `{script}` waited for what it left behind: {left:?}");
            }
            ran.unwrap().unwrap();
            assert_eq!(left.len(), workers, "{left:?}");
            let living: Vec<u32> = left
                .into_iter()
                .filter(|pid| crate::common::process_alive(*pid))
                .collect();
            assert!(
                living.is_empty(),
                "{living:?} outlived the run of `{script}`"
            );
        }
    }

    /// A non-zero exit is a failure carrying the tail of stderr; a missing program cannot
    /// start.
    #[tokio::test]
    async fn exec_failure_reports_stderr_tail() {
        let err = sh("echo 'disk full' >&2; exit 3")
            .handle(&ctx())
            .await
            .unwrap_err();
        assert!(
            err.message.contains("exit status: 3") && err.message.ends_with("disk full"),
            "{err}"
        );
        let err = exec(&["/nonexistent/handler"], None)
            .handle(&ctx())
            .await
            .unwrap_err();
        assert!(err.message.contains("cannot start"), "{err}");
        assert!(
            !err.permanent,
            "a failure is retried unless it says otherwise"
        );
    }

    /// An exit code listed in `permanent_exit_codes` (65 by default) is a permanent
    /// failure; any other is retried.
    #[tokio::test]
    async fn permanent_exit_codes_mark_a_failure_permanent() {
        let err = sh("echo 'bad input' >&2; exit 65")
            .handle(&ctx())
            .await
            .unwrap_err();
        assert!(err.permanent, "{err:?}");
        assert!(err.message.contains("bad input"), "{err}");
        let err = sh("exit 64").handle(&ctx()).await.unwrap_err();
        assert!(!err.permanent, "{err:?}");
    }

    /// Time-out and cancellation stop the command instead of waiting for it.
    #[tokio::test]
    async fn exec_timeout_and_cancel_kill_the_command() {
        let slow = exec(&["sleep", "30"], Some(Duration::from_millis(100)));
        let err = slow.handle(&ctx()).await.unwrap_err();
        assert!(err.message.contains("timed out"), "{err}");
        let context = ctx();
        let cancel = context.cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            cancel.cancel();
        });
        let err = sh("sleep 30").handle(&context).await.unwrap_err();
        assert!(err.message.contains("cancelled"), "{err}");
    }

    /// A lease deadline that passes kills the command even though nobody cancels it; a
    /// lease renewed in time lets it finish.
    #[tokio::test]
    async fn exec_is_killed_when_its_lease_is_not_confirmed() {
        let in_one_second = || Some(tokio::time::Instant::now() + Duration::from_secs(1));
        let (_renew, deadline) = tokio::sync::watch::channel(in_one_second());
        let context = TaskContext {
            lease_deadline: deadline,
            ..ctx()
        };
        let started = std::time::Instant::now();
        let err = sh("sleep 30").handle(&context).await.unwrap_err();
        assert!(err.message.contains("lease"), "{err}");
        // SIGTERM at 1s - 100ms margin - 500ms grace; sh dies of it at once.
        let took = started.elapsed();
        assert!(took < Duration::from_millis(900), "{took:?}");

        let (renew, deadline) = tokio::sync::watch::channel(in_one_second());
        let context = TaskContext {
            lease_deadline: deadline,
            ..ctx()
        };
        let renewer = tokio::spawn(async move {
            for _ in 0..15 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = renew.send(in_one_second());
            }
        });
        sh("sleep 1").handle(&context).await.unwrap();
        renewer.await.unwrap();
    }

    /// A program that does not answer `__supervise` is named in a clear error.
    #[tokio::test]
    async fn a_program_that_is_no_supervisor_is_a_clear_error() {
        let mut handler = sh("true");
        handler.supervision.program = "/bin/true".into();
        let err = handler.handle(&ctx()).await.unwrap_err();
        assert!(err.message.contains("run_if_supervisor"), "{err}");
    }
}
