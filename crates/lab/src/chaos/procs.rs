//! The replicas a chaos run (and the failover bench) drives: `leaderq consume` processes
//! in their own process groups, pointed at the coordinator by its environment, and the
//! handler they run, a wrapper that forks a worker which journals its own life. (The
//! coordinator itself comes from the shared harness, `testkit::harness`.)

use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;

/// Replica settings for chaos: short TTL and lock-delay so failovers take seconds, a
/// handler time-out that turns hangs into retries.
pub(crate) const SESSION_TTL: &str = "2s";
pub(crate) const LOCK_DELAY: &str = "1s";
/// The replicas' `queue.kill_grace`.
pub(crate) const KILL_GRACE: &str = "500ms";

pub(crate) fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

pub(crate) use testkit::harness::{signal_group, signal_pid};

pub(crate) struct Replica {
    pub(crate) name: String,
    /// Which start of this replica (same name, same data dir) this process is.
    pub(crate) incarnation: u32,
    pub(crate) child: Child,
}

impl Drop for Replica {
    /// Kills the replica's process group; its handlers, in groups of their own, are then
    /// stopped by leaderq's own supervision, which is what chaos tests.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            signal_group(self.child.id(), "KILL");
            let _ = self.child.wait();
        }
    }
}

/// The worker: journals its start, a heartbeat every 50 ms while it works, and how it
/// ended. `…f` tasks fail their first attempt, `…h` hang on it (until the handler
/// time-out), `…s` work for half a second.
fn worker_script(journal: &Path, replica: &str, incarnation: u32) -> String {
    format!(
        r#"j='{journal}'; r='{replica}'; inc={incarnation}
rec() {{ echo "$1 $TASK_ID $LEADERQ_FENCING_TOKEN $r $(date +%s%N) $LEADERQ_ATTEMPT $$ $inc" >> "$j"; }}
trap 'rec T; exit 143' TERM
rec S
beats=0
case "$TASK_ID" in
  *f) if [ "$LEADERQ_ATTEMPT" = 1 ]; then rec F; echo 'chaos: planned failure' >&2; exit 1; fi;;
  *h) if [ "$LEADERQ_ATTEMPT" = 1 ]; then beats=600; fi;;
  *s) beats=10;;
esac
i=0
while [ "$i" -lt "$beats" ]; do sleep 0.05; rec H; i=$((i+1)); done
rec E
"#,
        journal = journal.display()
    )
}

/// A replica's election settings, and whether its node id is configured (as `name`) or
/// left to the replica (generated and kept in its data dir).
pub(crate) struct ReplicaSetup {
    pub(crate) session_ttl: &'static str,
    pub(crate) lock_delay: &'static str,
    pub(crate) configured_node_id: bool,
}

/// The chaos replicas' setup: short TTL and lock-delay, node id = replica name.
pub(crate) const CHAOS_SETUP: ReplicaSetup = ReplicaSetup {
    session_ttl: SESSION_TTL,
    lock_delay: LOCK_DELAY,
    configured_node_id: true,
};

/// Starts replica `name` in its own process group, on its own data dir under `dir` (kept
/// across restarts; `incarnation` counts the starts), with a handler that forks: `sh -c`
/// runs the worker in the background and waits for it, as wrapper scripts do.
pub(crate) fn start_replica_with(
    exe: &Path,
    dir: &Path,
    env: &[(String, String)],
    name: &str,
    incarnation: u32,
    journal: &Path,
    setup: &ReplicaSetup,
) -> anyhow::Result<Replica> {
    use std::os::unix::process::CommandExt as _;
    let worker = dir.join(format!("{name}.{incarnation}.worker.sh"));
    std::fs::write(&worker, worker_script(journal, name, incarnation))?;
    let wrapper = format!("sh '{}' & wait $!", worker.display());
    let command = serde_json::to_string(&["sh", "-c", &wrapper])?;
    let config = dir.join(format!("{name}.toml"));
    let (ttl, lock_delay) = (setup.session_ttl, setup.lock_delay);
    std::fs::write(
        &config,
        format!(
            "[election]\nlease_ttl = \"{ttl}\"\nlock_delay = \"{lock_delay}\"\nretry_interval = \"200ms\"\n\
             [consul]\nwait = \"5s\"\nrequest_timeout = \"3s\"\n\
             [queue]\nmax_attempts = 5\nbackoff_base = \"50ms\"\nbackoff_max = \"500ms\"\nshutdown_grace = \"5s\"\nkill_grace = \"{KILL_GRACE}\"\n\
             [observe]\nenabled = false\n\
             [handlers.Chaos]\nkind = \"exec\"\ncommand = {command}\ntimeout = \"2s\"\n"
        ),
    )?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))?;
    let mut command = Command::new(exe);
    command
        .args(["--log-format", "json", "consume", "--config"])
        .arg(&config)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("LEADERQ__DATA__DIR", dir.join(name))
        .env("RUST_LOG", "info");
    if setup.configured_node_id {
        command.env("LEADERQ__ELECTION__NODE_ID", name);
    }
    let child = command
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start replica {name}"))?;
    Ok(Replica {
        name: name.to_string(),
        incarnation,
        child,
    })
}
