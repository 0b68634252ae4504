//! Helpers shared by the integration tests, over the shared process harness
//! (`testkit::harness`): real `leaderq server` processes on free ports with
//! temporary data dirs, replicas, a small HTTP client, the server's metrics and
//! [`wait_until`], the one bounded poll of both test binaries.

#![allow(dead_code)]

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use testkit::harness::consul::LeaderqServer;
use testkit::harness::{Cluster, Proc};

/// A running `leaderq server` (the shared harness's, with this test binary's leaderq);
/// killed when dropped.
pub struct ServerProcess {
    server: LeaderqServer,
    pub addr: String,
    pub data_dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

/// The leaderq binary these tests were built with.
pub fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_leaderq"))
}

/// `backend`'s servers for one test, under `dir`/coord, from the shared harness; `None`
/// when they are not installed (the harness said so, or failed the test under
/// LEADERQ_REQUIRE_SERVERS).
pub fn start_cluster(backend: &str, dir: &Path) -> Option<Box<dyn testkit::harness::Cluster>> {
    testkit::harness::start_cluster(backend, exe(), &dir.join("coord"))
        .unwrap_or_else(|why| panic!("cannot start the {backend} cluster: {why}"))
}

impl ServerProcess {
    /// Starts a server on a free port with a fresh data dir and a 1s session TTL minimum.
    pub fn start() -> ServerProcess {
        ServerProcess::start_in_temp(&[])
    }

    /// Starts a server with extra flags on a free port with a fresh data dir.
    pub fn start_in_temp(extra: &[&str]) -> ServerProcess {
        let temp = tempfile::tempdir().expect("temp dir");
        let dir = temp.path().join("data");
        let mut server = ServerProcess::start_in(&dir, extra).expect("server starts");
        server._temp = Some(temp);
        server
    }

    /// Starts a server on `data_dir`; returns the stderr text if it exits instead of listening.
    pub fn start_in(data_dir: &Path, extra: &[&str]) -> Result<ServerProcess, String> {
        ServerProcess::start_at("127.0.0.1:0", data_dir, extra)
    }

    /// Starts a server on a given address (to restart one where its clients expect it).
    /// The TTL minimum is 1s unless `extra` gives its own `--session-ttl-min`.
    pub fn start_at(
        listen: &str,
        data_dir: &Path,
        extra: &[&str],
    ) -> Result<ServerProcess, String> {
        let server = LeaderqServer::start(exe(), listen, data_dir, extra)?;
        Ok(ServerProcess {
            addr: server.addr.clone(),
            data_dir: data_dir.to_path_buf(),
            server,
            _temp: None,
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// SIGTERM, then waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.terminate_within(std::time::Duration::from_secs(60))
            .expect("the server exits on SIGTERM")
    }

    /// SIGTERM, then waits up to `limit` for the exit; `None` if it is still running then
    /// (it is then killed).
    pub fn terminate_within(
        &mut self,
        limit: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        self.server.terminate(limit)
    }

    /// Hands the temp dir over so a restarted server can reuse the same data.
    pub fn take_temp(&mut self) -> Option<tempfile::TempDir> {
        self._temp.take()
    }
}

/// A server is the Consul backend's cluster, so a test bed can hold it.
impl Cluster for ServerProcess {
    fn backend(&self) -> &'static str {
        self.server.backend()
    }
    fn client_addrs(&self) -> Vec<String> {
        self.server.client_addrs()
    }
    fn env_at(&self, addrs: &[String]) -> Vec<(String, String)> {
        self.server.env_at(addrs)
    }
    fn members(&self) -> usize {
        self.server.members()
    }
    fn kill_member(&mut self, i: usize) -> Result<(), String> {
        self.server.kill_member(i)
    }
    fn restart_member(&mut self, i: usize) -> Result<(), String> {
        self.server.restart_member(i)
    }
    fn restart_empty(&mut self) -> Result<(), String> {
        self.server.restart_empty()
    }
    fn produce(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.server.produce(key, value)
    }
    fn delete_leader_record(&self, leader_key: &str) -> Result<(), String> {
        self.server.delete_leader_record(leader_key)
    }
    fn revoke_leader_lease(&self, leader_key: &str) -> Result<bool, String> {
        self.server.revoke_leader_lease(leader_key)
    }
}

/// Whether a process runs (a zombie does not).
pub fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_string();
            Some(state != "Z")
        })
        .unwrap_or(false)
}

pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// How often [`wait_until`] looks again: short next to every limit the tests use, long
/// enough not to load the machine the servers share.
const POLL: Duration = Duration::from_millis(50);

/// Asks `cond` every [`POLL`] until it answers `Ok` (returned), for at most `limit`; after
/// that panics naming `what` and the last state `cond` saw (its `Err`).
pub async fn wait_until<T, S: Debug>(
    limit: Duration,
    what: &str,
    mut cond: impl AsyncFnMut() -> Result<T, S>,
) -> T {
    let started = Instant::now();
    loop {
        match cond().await {
            Ok(done) => return done,
            Err(state) if started.elapsed() > limit => {
                panic!("{what}: not within {limit:?}; last seen: {state:#?}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// The wall clock in ns since the Unix epoch, as the handlers' `date +%s%N` writes it.
pub fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// The value of the metric `name` (no labels) on the `/metrics` page of the `leaderq
/// server` at `addr`; `None` if the page has no such line.
pub async fn metric(addr: &str, name: &str) -> Option<f64> {
    let text = client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Waits until at least `count` blocking queries are parked on the `leaderq server` at
/// `addr` (its `leaderq_server_blocked_queries` gauge), so a write made next is one they
/// are waiting for.
pub async fn wait_until_blocked(addr: &str, count: usize) {
    wait_until(
        Duration::from_secs(10),
        &format!("{count} blocked queries"),
        async || match metric(addr, "leaderq_server_blocked_queries").await {
            Some(parked) if parked >= count as f64 => Ok(()),
            other => Err(other),
        },
    )
    .await
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// GETs `url` and decodes its JSON body; panics on a transport or decoding error.
pub async fn get_json(url: &str) -> serde_json::Value {
    client()
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The X-Consul-Index header of a response.
pub fn index_of(response: &reqwest::Response) -> u64 {
    response
        .headers()
        .get("X-Consul-Index")
        .expect("X-Consul-Index header")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// A running `leaderq consume` replica; killed when dropped. Its log is `<dir>/<node>.log`.
pub struct ConsumerProcess {
    proc: Proc,
    pub node: String,
    pub log: PathBuf,
}

impl ConsumerProcess {
    /// Starts a replica named `node` against `consul` with the settings in `config_toml`.
    pub fn start(consul: &str, node: &str, dir: &Path, config_toml: &str) -> ConsumerProcess {
        ConsumerProcess::start_with_env(consul, node, dir, config_toml, &[])
    }

    /// The same, with `env` on top (a coordinator's `Cluster::env()`); a kill reaches the
    /// replica alone, so its handlers are left to its supervisor.
    pub fn start_with_env(
        consul: &str,
        node: &str,
        dir: &Path,
        config_toml: &str,
        env: &[(String, String)],
    ) -> ConsumerProcess {
        let (command, log) = consume_command(consul, node, dir, config_toml, env);
        let child = { command }.spawn().expect("spawn leaderq consume");
        ConsumerProcess {
            proc: Proc::adopt(node, child),
            node: node.to_string(),
            log,
        }
    }

    /// The same, in a process group of its own: a kill or a signal reaches its handlers too.
    pub fn start_in_own_group(
        consul: &str,
        node: &str,
        dir: &Path,
        config_toml: &str,
        env: &[(String, String)],
    ) -> ConsumerProcess {
        let (command, log) = consume_command(consul, node, dir, config_toml, env);
        ConsumerProcess {
            proc: Proc::spawn(&format!("replica {node}"), command).expect("spawn leaderq consume"),
            node: node.to_string(),
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// SIGKILL, then reaps it.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Sends `name` ("STOP", "CONT", …).
    pub fn signal(&self, name: &str) {
        self.proc.signal(name);
    }

    /// SIGTERM, then waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.proc.signal("TERM");
        self.proc.child().wait().expect("wait for consumer")
    }

    /// Its exit status if it has exited.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.proc.child().try_wait().ok().flatten()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `leaderq consume` as replica `node` with `config_toml` written beside its log.
fn consume_command(
    consul: &str,
    node: &str,
    dir: &Path,
    config_toml: &str,
    env: &[(String, String)],
) -> (Command, PathBuf) {
    let config = dir.join(format!("{node}.toml"));
    std::fs::write(&config, config_toml).expect("write config");
    let log = dir.join(format!("{node}.log"));
    let mut command = Command::new(exe());
    command
        .args(["consume", "--config"])
        .arg(&config)
        .env("CONSUL_HTTP_ADDR", consul)
        .env("LEADERQ__ELECTION__NODE_ID", node)
        .env("LEADERQ__DATA__DIR", dir.join(node))
        .env("LEADERQ__OBSERVE__LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"));
    (command, log)
}

/// A `?recurse` listing as key -> decoded value bytes.
pub fn values_by_key(entries: &serde_json::Value) -> std::collections::HashMap<String, Vec<u8>> {
    use base64::Engine as _;
    entries
        .as_array()
        .expect("a listing is an array")
        .iter()
        .map(|e| {
            let value = base64::engine::general_purpose::STANDARD
                .decode(e["Value"].as_str().unwrap_or(""))
                .expect("values are base64");
            (e["Key"].as_str().unwrap().to_string(), value)
        })
        .collect()
}
