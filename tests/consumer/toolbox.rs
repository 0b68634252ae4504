//! The consumer tests' toolbox: [`on_every_backend!`] (one module of tests per backend),
//! [`wait_until`] (the one bounded poll, shared with the server tests from `tests/common`),
//! [`TestSettings`] (the replicas' settings), [`TestBed`] (a coordinator from the shared
//! harness, a directory, a journal and the replicas), and the runs a journal shows with
//! [`Reaper`], which notes when each run's shell is gone. Processes, the HTTP client, the
//! server's metrics and the harness's `Cluster`s live in `tests/common` and
//! `testkit::harness`; what a test checks stays in the test.
//!
//! A backend whose server is not installed skips the test, and says so where it is seen
//! (see `testkit::harness::external`); under `LEADERQ_REQUIRE_SERVERS` it fails it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leaderq::coord::{Coordinator, Leadership, Version};
use testkit::harness::Cluster;

use super::common::{self, ConsumerProcess, ServerProcess};
pub use super::common::{now_ns, wait_until};

/// One module per backend (all four, or those in a leading `[..]`), each holding every test
/// given: `fn name => scenario(args…);` becomes a test `name` that awaits
/// `super::scenario(backend, args…)`; the attributes before `fn` (its `///` line and
/// `#[tokio::test]`) go on the test.
macro_rules! on_every_backend {
    ([$($backend:ident),+ $(,)?] $tests:tt) => {
        $( on_every_backend!(@module $backend $tests); )+
    };
    (@module $backend:ident {
        $( $(#[$meta:meta])* fn $name:ident => $scenario:ident($($arg:expr),* $(,)?); )*
    }) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;

            $(
                $(#[$meta])*
                async fn $name() {
                    super::$scenario(stringify!($backend) $(, $arg)*).await;
                }
            )*
        }
    };
    ($($tests:tt)*) => {
        on_every_backend!([consul, etcd, redis, zookeeper] { $($tests)* });
    };
}

/// The lines of a journal file, each split at white space.
pub fn read_journal(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| line.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// The replicas' settings, built once per test: short TTLs, a short lock-delay, fast
/// retries, and the journal handlers (`Work`, `Slow`, `Flaky`, `Fail`) that write
/// `<event> <taskId> <fencing token> <node> <attempt>` lines to the journal. `set` and
/// `handler` change or add what a test needs; `toml(node)` is one replica's file.
#[derive(Clone, Debug)]
pub struct TestSettings {
    /// Sections in order, each with its keys and their TOML values.
    sections: Vec<(String, Vec<(String, String)>)>,
}

impl TestSettings {
    /// The defaults, with a 3 s TTL: short, yet not so short that a loaded CI machine
    /// stalls a renewal past it.
    pub fn new(journal: &Path) -> TestSettings {
        let j = journal.display();
        let mut settings = TestSettings {
            sections: Vec::new(),
        };
        settings = settings
            .set("consul", "wait", "\"5s\"")
            .set("election", "lease_ttl", "\"3s\"")
            .set("election", "lock_delay", "\"200ms\"")
            .set("election", "retry_interval", "\"100ms\"")
            .set("queue", "max_attempts", "3")
            .set("queue", "backoff_base", "\"50ms\"")
            .set("queue", "backoff_max", "\"200ms\"")
            .set("queue", "shutdown_grace", "\"10s\"")
            .set("queue", "kill_grace", "\"200ms\"");
        settings
            .handler("Work", &format!("echo \"run $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT\" >> {j}"))
            .handler("Slow", &format!("echo \"start $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT\" >> {j}; sleep 1; echo \"end $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT\" >> {j}"))
            .handler("Flaky", &format!("test -f {j}.fixed && echo \"run $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT\" >> {j}"))
            .handler("Fail", &format!("echo \"fail $TASK_ID $LEADERQ_FENCING_TOKEN $NODE $LEADERQ_ATTEMPT\" >> {j}; echo boom >&2; exit 1"))
    }

    /// The lease TTL (`election.lease_ttl`).
    pub fn ttl(self, ttl: &str) -> TestSettings {
        self.set("election", "lease_ttl", &format!("\"{ttl}\""))
    }

    /// `[section] key = value` (`value` is TOML), replacing what was there.
    pub fn set(mut self, section: &str, key: &str, value: &str) -> TestSettings {
        let at = match self.sections.iter().position(|(name, _)| name == section) {
            Some(at) => at,
            None => {
                self.sections.push((section.to_string(), Vec::new()));
                self.sections.len() - 1
            }
        };
        let keys = &mut self.sections[at].1;
        match keys.iter_mut().find(|(name, _)| name == key) {
            Some(entry) => entry.1 = value.to_string(),
            None => keys.push((key.to_string(), value.to_string())),
        }
        self
    }

    /// An exec handler for `task_type` running `script` with `sh -c` (`$NODE` in it
    /// becomes the replica's name).
    pub fn handler(self, task_type: &str, script: &str) -> TestSettings {
        let command = serde_json::to_string(&["sh", "-c", script]).unwrap();
        self.set(&format!("handlers.{task_type}"), "kind", "\"exec\"")
            .set(&format!("handlers.{task_type}"), "command", &command)
    }

    /// The settings file of replica `node`.
    pub fn toml(&self, node: &str) -> String {
        let mut text = String::new();
        for (section, keys) in &self.sections {
            text.push_str(&format!("[{section}]\n"));
            for (key, value) in keys {
                text.push_str(&format!("{key} = {value}\n"));
            }
        }
        text.replace("$NODE", node)
    }
}

/// A coordinator of any backend, a directory, a journal, replicas of `leaderq consume`
/// pointed at it and a coordinator of the test's own to look with. `C` is the harness's
/// cluster type where a test needs its own calls (an etcd member's role, `zkCli.sh`).
pub struct TestBed<C: ?Sized + Cluster = dyn Cluster> {
    pub cluster: Box<C>,
    pub dir: tempfile::TempDir,
    pub journal: PathBuf,
    pub settings: TestSettings,
    pub replicas: Vec<ConsumerProcess>,
    /// More environment for the replicas started from now on.
    pub env: Vec<(String, String)>,
    /// Replicas started from now on lead a process group of their own, killed whole.
    pub own_group: bool,
    pub coord: Arc<dyn Coordinator>,
}

impl TestBed {
    /// A bed on `backend`'s servers from the shared harness; `None` (the test skips)
    /// where they are not installed.
    pub fn on(backend: &str) -> Option<TestBed> {
        let dir = tempfile::tempdir().unwrap();
        let cluster = common::start_cluster(backend, dir.path())?;
        Some(TestBed::in_dir(cluster, dir))
    }
}

impl TestBed<ServerProcess> {
    /// A bed on a `leaderq server` of its own (the Consul backend).
    pub fn consul() -> TestBed<ServerProcess> {
        TestBed::with(ServerProcess::start())
    }

    pub fn url(&self, path: &str) -> String {
        self.cluster.url(path)
    }
}

impl<C: Cluster> TestBed<C> {
    /// A bed on `cluster`, started by the test.
    pub fn with(cluster: C) -> TestBed<C> {
        TestBed::in_dir(Box::new(cluster), tempfile::tempdir().unwrap())
    }
}

impl<C: ?Sized + Cluster> TestBed<C> {
    /// A bed on `cluster`, in `dir` (which the test may have used already).
    pub fn in_dir(cluster: Box<C>, dir: tempfile::TempDir) -> TestBed<C> {
        let journal = dir.path().join("journal");
        std::fs::write(&journal, "").unwrap();
        let coord = connect(&cluster.env());
        TestBed {
            settings: TestSettings::new(&journal),
            cluster,
            dir,
            journal,
            replicas: Vec::new(),
            env: Vec::new(),
            own_group: false,
            coord,
        }
    }

    /// Starts replica `node` with the bed's settings.
    pub fn start_replica(&mut self, node: &str) {
        let config = self.settings.toml(node);
        self.start_replica_with(node, &config);
    }

    /// Starts replica `node` with the settings file `config`.
    pub fn start_replica_with(&mut self, node: &str, config: &str) {
        let mut env = self.cluster.env();
        env.extend(self.env.iter().cloned());
        let start = if self.own_group {
            ConsumerProcess::start_in_own_group
        } else {
            ConsumerProcess::start_with_env
        };
        let replica = start("127.0.0.1:1", node, self.dir.path(), config, &env);
        self.replicas.push(replica);
    }

    pub fn replica(&mut self, node: &str) -> &mut ConsumerProcess {
        self.replicas
            .iter_mut()
            .find(|r| r.node == node)
            .expect("a replica of that name")
    }

    /// Every replica's log, for a failure's message.
    pub fn logs(&self) -> String {
        logs_of(&self.replicas)
    }

    pub fn journal(&self) -> Vec<Vec<String>> {
        read_journal(&self.journal)
    }

    /// A producer's write of task `name` under `oracleTask/`, with the backend's own tool.
    pub fn produce(&self, name: &str, task: &serde_json::Value) -> Result<(), String> {
        self.cluster
            .produce(&format!("oracleTask/{name}"), task.to_string().as_bytes())
    }

    /// `leaderq ARGS` pointed at the cluster.
    pub fn leaderq(&self, args: &[&str]) -> std::process::Command {
        let mut command = std::process::Command::new(common::exe());
        command
            .args(args)
            .envs(self.cluster.env())
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null());
        command
    }

    /// Waits until the journal has a line matching `predicate`; that line.
    pub async fn wait_for_line(
        &self,
        limit: Duration,
        predicate: impl Fn(&[String]) -> bool,
    ) -> Vec<String> {
        wait_until(limit, "a journal line", async || {
            let journal = self.journal();
            match journal.iter().find(|l| predicate(l)) {
                Some(line) => Ok(line.clone()),
                None => Err((journal, self.logs())),
            }
        })
        .await
    }

    /// Waits until `done` holds of the journal.
    pub async fn wait_journal(
        &self,
        limit: Duration,
        what: &str,
        done: impl Fn(&[Vec<String>]) -> bool,
    ) {
        wait_until(limit, what, async || {
            let journal = self.journal();
            if done(&journal) {
                Ok(())
            } else {
                Err((journal, self.logs()))
            }
        })
        .await
    }

    /// Waits until nothing is left under `prefix`.
    pub async fn wait_until_empty(&self, prefix: &str, limit: Duration) {
        wait_until_empty(self.coord.as_ref(), prefix, &self.replicas, limit).await
    }

    /// The leadership held now, once there is one whose lease is not `old`'s: its node
    /// and its lease and token.
    pub async fn leadership_other_than(
        &self,
        old: Option<&Leadership>,
        limit: Duration,
    ) -> (String, Leadership) {
        wait_until(limit, "a leader", async || {
            let (holder, _) = self
                .coord
                .observe(Version(0), Duration::ZERO)
                .await
                .map_err(|e| e.to_string())?;
            match (holder.lease, holder.record) {
                (Some(lease), Some(record)) if old.is_none_or(|old| old.lease != lease) => {
                    let leadership = Leadership {
                        lease,
                        fencing_token: holder.token,
                    };
                    Ok((record.node, leadership))
                }
                (lease, record) => Err(format!("{lease:?} {record:?}\n{}", self.logs())),
            }
        })
        .await
    }

    /// The leader's node, once there is one.
    pub async fn leader(&self, limit: Duration) -> String {
        self.leadership_other_than(None, limit).await.0
    }

    /// The leader's node, once there is one that is not `old`.
    pub async fn leader_other_than(&self, old: &str, limit: Duration) -> String {
        wait_until(limit, &format!("a leader other than {old}"), async || {
            let node = self.leader(limit).await;
            if node == old {
                Err(node)
            } else {
                Ok(node)
            }
        })
        .await
    }
}

/// Waits until `coord` holds nothing under `prefix` (a coordinator that is being restarted
/// is asked again); on time-out the message holds what is left and the `replicas`' logs.
pub async fn wait_until_empty(
    coord: &dyn Coordinator,
    prefix: &str,
    replicas: &[ConsumerProcess],
    limit: Duration,
) {
    wait_until(limit, &format!("{prefix} drained"), async || {
        match coord.keys(prefix).await {
            Ok((keys, _)) if keys.is_empty() => Ok(()),
            Ok((keys, _)) => Err(format!("{keys:?} left\n{}", logs_of(replicas))),
            Err(e) => Err(format!("{e}")),
        }
    })
    .await
}

/// Every replica's log, for a failure's message.
pub fn logs_of(replicas: &[ConsumerProcess]) -> String {
    replicas
        .iter()
        .map(|r| format!("---- {}\n{}", r.node, r.log_text()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A coordinator of the test's own, set up as `leaderq` would be with `env`.
pub fn connect(env: &[(String, String)]) -> Arc<dyn Coordinator> {
    let settings =
        leaderq::config::Settings::load(None, env.to_vec()).expect("settings from the env");
    leaderq::service::connect::connect(&settings).expect("a coordinator")
}

/// One run as its handler journaled it: `start <task id> <ns> <node> <shell pid> <fencing
/// token>`, then `end <task id> <ns> <node> [<shell pid>]` if it ran to its end.
#[derive(Debug)]
pub struct Run {
    pub id: String,
    pub node: String,
    pub started: u128,
    /// 0 until its end is journaled or its shell is seen gone.
    pub ended: u128,
    pub pid: u32,
    pub token: u64,
}

/// Asserts that every run of `runs` that started after `lost_at` holds a token above the
/// lost leadership's, the one `first` ran under (`what`: the loss, for the message).
pub fn assert_tokens_above<'a>(
    runs: impl IntoIterator<Item = &'a Run>,
    first: &Run,
    lost_at: u128,
    what: &str,
    text: &str,
) {
    for run in runs.into_iter().filter(|run| run.started > lost_at) {
        assert!(
            run.token > first.token,
            "{what}: {} ran under token {}, not above the lost leadership's {}: {text}",
            run.id,
            run.token,
            first.token
        );
    }
}

/// The runs a journal of such lines shows, in the order they started.
pub fn runs_in(text: &str) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let at: u128 = words[2].parse().unwrap();
        if words[0] == "start" {
            runs.push(Run {
                id: words[1].into(),
                node: words[3].into(),
                started: at,
                ended: 0,
                pid: words[4].parse().unwrap(),
                token: words[5].parse().unwrap(),
            });
        } else if let Some(run) = runs.iter_mut().find(|r| {
            // An end names its shell's pid where it can: one node may run a task twice.
            let pid = words.get(4).and_then(|p| p.parse::<u32>().ok());
            r.id == words[1] && r.node == words[3] && r.ended == 0 && pid.is_none_or(|p| p == r.pid)
        }) {
            run.ended = at;
        }
    }
    runs
}

/// Watches the journal's runs from a thread, noting when each run's shell is first seen
/// gone: the end of a run cut before it could journal one.
pub struct Reaper {
    gone: Arc<Mutex<HashMap<u32, u128>>>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Reaper {
    pub fn start(journal: &Path) -> Reaper {
        let gone = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (journal, noted, stopped) = (journal.to_path_buf(), gone.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let text = std::fs::read_to_string(&journal).unwrap_or_default();
                for run in runs_in(&text) {
                    let mut noted = noted.lock().unwrap();
                    if !noted.contains_key(&run.pid) && !common::process_alive(run.pid) {
                        noted.insert(run.pid, now_ns());
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Reaper { gone, stop, thread }
    }

    /// When the shell `pid` was seen gone, once it was.
    pub fn gone(&self, pid: u32) -> Option<u128> {
        self.gone.lock().unwrap().get(&pid).copied()
    }

    /// Stops watching; when each shell seen gone was.
    pub fn stop(self) -> HashMap<u32, u128> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        Arc::into_inner(self.gone).unwrap().into_inner().unwrap()
    }
}

/// The first run the journal shows, once there is one.
pub async fn first_run(journal: &Path, replicas: &[ConsumerProcess]) -> Run {
    wait_until(Duration::from_secs(30), "a first run", async || {
        let text = std::fs::read_to_string(journal).unwrap();
        runs_in(&text)
            .into_iter()
            .next()
            .ok_or_else(|| logs_of(replicas))
    })
    .await
}
