//! What the leader and a supervisor say to each other over the supervisor's stdin, a Unix
//! socket: one JSON object per line each way. And the clock they share.
//!
//! Leader → supervisor, for each run: `start`, then `lease` whenever the lease deadline
//! moves, and `stop`. Supervisor → leader: `started` (the handler's pid, which is also its
//! process group id) or `refused`, then `exited` once the handler and every process it
//! started are gone. The next `start` comes only after that run's `exited` or `refused`;
//! a `lease` or `stop` that crossed the end of its run is ignored.
//!
//! Clock: deadlines travel as absolute CLOCK_BOOTTIME readings, which both processes read
//! from the same kernel. Absolute, so a message that waits in the socket (a paused leader)
//! cannot stretch a deadline; CLOCK_BOOTTIME rather than CLOCK_MONOTONIC, because it keeps
//! counting while the machine is suspended, as the coordinator's clock does.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::plan::StopReason;

/// Everything the supervisor needs to run one handler.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Start {
    /// argv of the handler; never a shell.
    pub command: Vec<String>,
    /// The handler's complete environment.
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// The task's JSON, base64 so that any bytes survive the line protocol.
    pub task_base64: String,
    pub kill_grace_ms: u64,
    /// CLOCK_BOOTTIME nanoseconds by which the handler must be dead.
    pub kill_by_ns: u64,
    /// Held shared while the handler lives (see `lock.rs`).
    pub lock_file: Option<PathBuf>,
    /// The leader's pid: a supervisor whose parent is already someone else starts nothing.
    pub leader_pid: u32,
    /// Keep the handler's stderr for the report (its end: `STDERR_TAIL_BYTES`, or
    /// `keep_bytes` if more) instead of passing it to the supervisor's own.
    pub keep_stderr: bool,
    /// Keep the end of the handler's stdout too (`keep_bytes`), while still passing all of
    /// it to the supervisor's own stdout.
    #[serde(default)]
    pub keep_stdout: bool,
    /// How much of each kept stream to report (`[queue] output_limit`).
    #[serde(default)]
    pub keep_bytes: usize,
}

/// How much of a handler's stderr is kept.
pub const STDERR_TAIL_BYTES: usize = 2048;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Control {
    Start(Box<Start>),
    Lease { kill_by_ns: u64 },
    Stop,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Report {
    /// The handler runs as `pid`, in the new process group `pid`.
    Started { pid: u32 },
    /// Nothing was started.
    Refused { reason: String },
    /// The handler and everything it started are gone. `wait_status` is the raw status
    /// of the handler process; `stopped` says why the supervisor stopped it, if it did;
    /// `stderr_tail` and `stdout_tail` (base64) are the ends of its streams that were
    /// kept, each `*_dropped` the bytes printed before that end.
    Exited {
        wait_status: i32,
        stopped: Option<StopReason>,
        #[serde(default)]
        stderr_tail: String,
        #[serde(default)]
        stderr_dropped: u64,
        #[serde(default)]
        stdout_tail: String,
        #[serde(default)]
        stdout_dropped: u64,
    },
}

/// One line of the protocol.
pub fn line<T: Serialize>(message: &T) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(message).expect("protocol messages serialize");
    bytes.push(b'\n');
    bytes
}

/// CLOCK_BOOTTIME now.
pub fn boot_now() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// The CLOCK_BOOTTIME time by which a handler must be dead, given the lease deadline on the
/// leader's clock (`None`: the lease is not confirmed at all), the safety margin, and one
/// reading of both clocks taken together (`now`, `boot_now`). A deadline already past, or
/// none, gives a time in the past: kill at once.
pub fn kill_by(
    deadline: Option<Instant>,
    margin: Duration,
    now: Instant,
    boot_now: Duration,
) -> Duration {
    match deadline {
        None => Duration::ZERO,
        Some(deadline) => {
            (boot_now + deadline.saturating_duration_since(now)).saturating_sub(margin)
        }
    }
}

pub fn nanos(time: Duration) -> u64 {
    u64::try_from(time.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The deadline keeps its distance from now on the other clock, less the margin; a past
    /// or missing deadline means at once.
    #[test]
    fn kill_by_converts_the_lease_deadline() {
        let now = Instant::now();
        let boot = Duration::from_secs(1_000);
        let margin = Duration::from_millis(1_500);
        assert_eq!(
            kill_by(Some(now + Duration::from_secs(15)), margin, now, boot),
            Duration::from_millis(1_013_500)
        );
        assert_eq!(
            kill_by(Some(now), margin, now + Duration::from_secs(3), boot),
            Duration::from_millis(998_500)
        );
        assert_eq!(kill_by(None, margin, now, boot), Duration::ZERO);
    }

    /// Messages survive the line protocol, a task with newlines and odd bytes included.
    #[test]
    fn messages_round_trip_as_single_lines() {
        let start = Control::Start(Box::new(Start {
            command: vec!["sh".into(), "-c".into(), "echo 'a\nb'".into()],
            env: vec![("PATH".into(), "/bin".into())],
            cwd: None,
            task_base64: "AAEC".into(),
            kill_grace_ms: 5_000,
            kill_by_ns: 7,
            lock_file: Some("/tmp/x.lock".into()),
            leader_pid: 42,
            keep_stderr: true,
            keep_stdout: true,
            keep_bytes: 65_536,
        }));
        let bytes = line(&start);
        assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1);
        assert_eq!(serde_json::from_slice::<Control>(&bytes).unwrap(), start);
        let exited = Report::Exited {
            wait_status: 9,
            stopped: Some(StopReason::Lease),
            stderr_tail: "AAEC".into(),
            stderr_dropped: 3,
            stdout_tail: "AAED".into(),
            stdout_dropped: 0,
        };
        assert_eq!(
            serde_json::from_slice::<Report>(&line(&exited)).unwrap(),
            exited
        );
        assert_eq!(
            String::from_utf8(line(&Control::Stop)).unwrap(),
            "{\"op\":\"stop\"}\n"
        );
    }

    /// CLOCK_BOOTTIME moves forward.
    #[test]
    fn boot_clock_moves_forward() {
        let a = boot_now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(boot_now() > a);
    }
}
