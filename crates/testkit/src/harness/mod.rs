//! The one process harness: what the integration tests, `leaderq-lab bench` and `leaderq-lab
//! chaos` use to run real servers and replicas. Child processes that die with their owner,
//! signals to a process or its group, free loopback ports, bounded waits for readiness,
//! and the rule for external coordinators (ZooKeeper, Redis, etcd):
//!
//! - installed: the caller starts it (one folder per backend below this one);
//! - missing on a developer's machine: [`external`] prints one line naming the test and
//!   what to install, past the test harness's capture, and the test skips;
//! - missing where [`REQUIRE_ENV`] is set (CI): [`external`] panics, so the test fails.
//!
//! `link.rs` puts proxies that cut, blackhole or delay in front of a cluster's members,
//! which [`Cluster::env_at`] points a replica at.

pub mod consul;
pub mod link;
pub mod pki;
pub mod redis;
pub mod sentinel;
pub mod zookeeper;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub mod etcd;

/// Set (to anything but "" or "0") where a missing external server is a failure, not a
/// skip: `.ci/run` sets it.
pub const REQUIRE_ENV: &str = "LEADERQ_REQUIRE_SERVERS";

/// Whether [`REQUIRE_ENV`] is set.
pub fn servers_required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The first of `candidates` that exists as a file (a bare name is looked up in `PATH`).
/// `None`, after one line on stderr naming `install` (what to install), when there is
/// none; panics instead when [`servers_required`].
pub fn external(candidates: &[&str], install: &str) -> Option<PathBuf> {
    if let Some(found) = candidates.iter().find_map(|c| which(c)) {
        return Some(found);
    }
    let message = format!(
        "{} not found: install {install} to run this test",
        candidates.join(" or ")
    );
    assert!(!servers_required(), "{message} ({REQUIRE_ENV} is set)");
    say_skipped(&message);
    None
}

/// One line on stderr: `skipped <test>: <why>`. Written to the stderr handle itself, not
/// with `eprintln!`: the test harness captures `eprintln!` and shows it only for a test
/// that fails, and a skipped test passes. The test is named after the thread it runs on
/// (the test harness names each test's thread so); elsewhere the line has no name.
fn say_skipped(why: &str) {
    use std::io::Write as _;
    let test = std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .map(|name| format!(" {name}"))
        .unwrap_or_default();
    // One write of the whole line, so that it does not interleave with the harness's own.
    let line = format!("skipped{test}: {why}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

fn which(candidate: &str) -> Option<PathBuf> {
    let path = Path::new(candidate);
    if path.components().count() > 1 {
        return path.is_file().then(|| path.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|dirs| {
        std::env::split_paths(&dirs)
            .map(|dir| dir.join(candidate))
            .find(|full| full.is_file())
    })
}

/// A loopback port nobody listens on now, for a server the harness starts. Taken below
/// Linux's ephemeral range (32768 and up), where the kernel picks the local ports of
/// outgoing connections and of binds to port 0: a port picked there and released could be
/// taken by any connection before the server binds it (an etcd member once failed to
/// start so, with the tests' many connections). Handed out in turn, from a start that
/// differs per process, each checked free by a bind; the kernel's pick if none is.
pub fn free_port() -> u16 {
    /// The ports handed out: `LOW..LOW + SPAN`.
    const LOW: usize = 20_000;
    const SPAN: usize = 12_000;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let start = std::process::id() as usize * 7_919;
    for _ in 0..SPAN {
        let port = (LOW + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("bind a loopback port")
}

/// Polls `ready` every 50 ms until it holds or `limit` passes; `Err` names `what`.
pub fn wait_for(
    limit: Duration,
    what: &str,
    mut ready: impl FnMut() -> bool,
) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if ready() {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(format!("{what}: not within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The parent of process `pid`, from /proc; `None` once it is gone.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: the fields follow its last ')'.
    stat.rsplit(") ")
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Sends `signal` ("KILL", "STOP", "CONT", "TERM", …) to the one process `pid`.
pub fn signal_pid(pid: u32, signal: &str) {
    signal_target(&pid.to_string(), signal);
}

/// Sends `signal` to the process group `pgid`.
pub fn signal_group(pgid: u32, signal: &str) {
    signal_target(&format!("-{pgid}"), signal);
}

fn signal_target(target: &str, signal: &str) {
    let _ = Command::new("kill")
        .args([format!("-{signal}").as_str(), "--", target])
        .status();
}

/// A running coordinator (one server, or an ensemble or cluster of members) as the tests,
/// bench and chaos drive it, whatever the backend. Each backend's folder below this one
/// implements it; dropping it stops every member.
pub trait Cluster: Send {
    /// The backend's name as `[coordinator] backend` takes it ("consul", "zookeeper", …).
    fn backend(&self) -> &'static str;
    /// The environment that points `leaderq` (consume, enqueue, tasks, status) at it:
    /// `LEADERQ__COORDINATOR__BACKEND` and the backend's own section.
    fn env(&self) -> Vec<(String, String)> {
        self.env_at(&self.client_addrs())
    }
    /// Where each member serves its clients (`host:port`), in order.
    fn client_addrs(&self) -> Vec<String>;
    /// The environment of [`Cluster::env`] with `addrs` in place of the members' own
    /// client addresses, in their order: what points `leaderq` at proxies of them.
    fn env_at(&self, addrs: &[String]) -> Vec<(String, String)>;
    /// How many members it has.
    fn members(&self) -> usize;
    /// SIGKILLs member `i` (no-op if it is down).
    fn kill_member(&mut self, i: usize) -> Result<(), String>;
    /// Starts member `i` again on its own data, and waits until it serves.
    fn restart_member(&mut self, i: usize) -> Result<(), String>;
    /// SIGKILLs every member, removes all their data and starts them again, empty, on the
    /// same addresses, and waits until they serve: a coordinator that lost all its data
    /// (its counters start over), as its clients find it where they left it.
    fn restart_empty(&mut self) -> Result<(), String>;
    /// Writes a task as a producer does, with the backend's plain write (a KV PUT, a
    /// znode create, `etcdctl put`, the documented Redis command): creates or replaces.
    fn produce(&self, key: &str, value: &[u8]) -> Result<(), String>;
    /// An operator deletes the leadership record of `leader_key` by hand, with the
    /// backend's own tool (`curl -X DELETE`, `etcdctl del`, `redis-cli DEL`, `zkCli.sh
    /// delete` of the leader's latch), while the lease that held it lives on.
    fn delete_leader_record(&self, leader_key: &str) -> Result<(), String>;
    /// An operator ends the lease holding `leader_key` by hand (Consul: destroy the
    /// session; etcd: revoke the lease; Redis: delete the lease key). `Ok(false)` where the
    /// backend's operators have no such tool (a ZooKeeper session ends only with its
    /// client).
    fn revoke_leader_lease(&self, leader_key: &str) -> Result<bool, String>;
}

/// The backends a [`Cluster`] can be started for, by `[coordinator] backend` name: every
/// backend leaderq has.
pub use leaderq::config::BACKENDS;

/// Starts a cluster of `backend` under `dir` (members' data and logs), with `exe` as the
/// leaderq binary where the backend is `leaderq server`. `Ok(None)` when the backend's
/// server is not installed (the message said what to install).
pub fn start_cluster(
    backend: &str,
    exe: &Path,
    dir: &Path,
) -> Result<Option<Box<dyn Cluster>>, String> {
    match backend {
        "consul" => {
            let server =
                consul::LeaderqServer::start(exe, "127.0.0.1:0", &dir.join("server"), &[])?;
            Ok(Some(Box::new(server)))
        }
        "etcd" => Ok(etcd::EtcdCluster::start(3)?.map(|c| Box::new(c) as Box<dyn Cluster>)),
        "redis" => Ok(redis::RedisServer::start().map(|r| Box::new(r) as Box<dyn Cluster>)),
        "zookeeper" => match zookeeper::Ensemble::start(3) {
            None => Ok(None),
            Some(ensemble) => Ok(Some(Box::new(ensemble?))),
        },
        other => Err(format!(
            "no backend {other:?}: pick one of {}",
            BACKENDS.join(", ")
        )),
    }
}

/// A child process killed (SIGKILL, with its process group if it leads one) when dropped.
pub struct Proc {
    child: Option<Child>,
    /// What it is, for messages ("zookeeper member 2").
    pub name: String,
    group: bool,
}

impl Proc {
    /// Spawns `command` in a process group of its own (so a kill reaches whatever it
    /// forks, as the JVM wrapper scripts do).
    pub fn spawn(name: &str, mut command: Command) -> Result<Proc, String> {
        use std::os::unix::process::CommandExt as _;
        let child = command
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        Ok(Proc {
            child: Some(child),
            name: name.to_string(),
            group: true,
        })
    }

    /// Wraps a child spawned elsewhere; killed alone (not its group) when dropped.
    pub fn adopt(name: &str, child: Child) -> Proc {
        Proc {
            child: Some(child),
            name: name.to_string(),
            group: false,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The child, for its pipes.
    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("a process not yet reaped")
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Sends `signal` (to its group if it leads one).
    pub fn signal(&self, signal: &str) {
        let pid = self.pid();
        if pid == 0 {
            return;
        }
        if self.group {
            signal_group(pid, signal);
        } else {
            signal_pid(pid, signal);
        }
    }

    /// SIGKILL, then reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                self.signal_child(&child, "KILL");
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits up to `limit` for the exit; SIGKILL after that. The exit
    /// status, if it exited by itself.
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        self.signal_child(&child, "TERM");
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if start.elapsed() > limit {
                self.signal_child(&child, "KILL");
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal_child(&self, child: &Child, signal: &str) {
        if self.group {
            signal_group(child.id(), signal);
        } else {
            signal_pid(child.id(), signal);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_is_none_and_a_present_one_is_found() {
        if !servers_required() {
            assert_eq!(external(&["leaderq-no-such-program"], "nothing"), None);
        }
        assert!(external(&["sh"], "a shell").is_some());
    }

    #[test]
    fn a_dropped_proc_is_killed() {
        let mut command = Command::new("sleep");
        command.arg("30");
        let proc = Proc::spawn("sleep", command).expect("spawn sleep");
        let pid = proc.pid();
        drop(proc);
        let alive = Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .contains(") Z ");
        assert!(!alive, "sleep {pid} outlived its Proc");
    }
}
