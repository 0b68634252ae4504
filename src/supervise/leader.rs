//! The leader's side of a supervised run: start the supervisor in its own process group
//! with a clean environment, hand it the job, forward every move of the lease deadline,
//! ask it to stop on time-out or cancellation, and return only once it reports that the
//! handler and everything it started are gone.
//!
//! If the supervisor dies without a report, the leader kills the handler's process group
//! itself. If the leader dies, the supervisor sees its control socket close.

use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use base64::Engine as _;
use rustix::process::{Pid, Signal};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::plan::StopReason;
use super::protocol::{self, boot_now, kill_by, nanos, Control, Report, Start};
use super::{Supervision, SUPERVISE_ARG};

/// Beyond the kill grace, how long the leader waits for a supervisor that was asked to
/// stop before it kills the supervisor and the handler's group itself.
const BACKSTOP: Duration = Duration::from_secs(2);
/// How long to wait for the supervisor's exit and the end of its stderr after its report.
const AFTERMATH: Duration = Duration::from_secs(2);
/// How much of the handler's stderr is kept.
pub const STDERR_TAIL_BYTES: usize = 2048;

/// One handler run.
pub struct Job<'a> {
    pub command: &'a [String],
    pub env: Vec<(String, String)>,
    pub cwd: Option<&'a Path>,
    pub task_json: &'a [u8],
    pub timeout: Option<Duration>,
    pub cancel: &'a CancellationToken,
    /// The lease the run is bound to: when it stops being confirmed (`None`: it is not).
    pub lease_deadline: watch::Receiver<Option<Instant>>,
    /// The command's stderr goes to ours unchanged (`leaderq run`) instead of being kept
    /// for the failure's message (handlers).
    pub pass_stderr: bool,
}

/// Why the leader asked the supervisor to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked {
    TimedOut,
    Cancelled,
}

/// How a run ended; by then the handler's processes are all gone.
#[derive(Debug)]
pub struct Ended {
    pub status: ExitStatus,
    /// Why the supervisor stopped the handler, if it did.
    pub stopped: Option<StopReason>,
    pub asked: Option<Asked>,
    /// The end of the handler's stderr, at most `STDERR_TAIL_BYTES`.
    pub stderr_tail: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Nothing was started (the supervisor could not start, or refused with a reason).
    #[error("{0}")]
    NotStarted(String),
    /// The supervisor died mid-run; the handler's group was killed.
    #[error("{0}")]
    SupervisorLost(String),
}

/// Runs `job` under a supervisor; returns when the handler's processes are all gone.
pub async fn run(supervision: &Supervision, job: Job<'_>) -> Result<Ended, RunError> {
    let Job {
        command,
        env,
        cwd,
        task_json,
        timeout,
        cancel,
        mut lease_deadline,
        pass_stderr,
    } = job;
    let not_started = |what: &str, e: std::io::Error| RunError::NotStarted(format!("{what}: {e}"));
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| not_started("cannot create the supervisor's control socket", e))?;
    ours.set_nonblocking(true)
        .map_err(|e| not_started("cannot set up the control socket", e))?;
    let ours = tokio::net::UnixStream::from_std(ours)
        .map_err(|e| not_started("cannot set up the control socket", e))?;
    // The command is dropped right after the spawn, and with it our copy of the
    // supervisor's end of the socket: its death must read as EOF here.
    let mut supervisor = tokio::process::Command::new(&supervision.program)
        .arg(SUPERVISE_ARG)
        .env_clear()
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::inherit())
        .stderr(if pass_stderr {
            Stdio::inherit()
        } else {
            Stdio::piped()
        })
        .process_group(0)
        .spawn()
        .map_err(|e| {
            not_started(
                &format!(
                    "cannot start the handler supervisor {}",
                    supervision.program.display()
                ),
                e,
            )
        })?;
    let stderr = supervisor.stderr.take();
    let mut collect = tokio::spawn(async move {
        let mut tail = Vec::new();
        let Some(mut stderr) = stderr else {
            return tail;
        };
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf).await {
            if n == 0 {
                break;
            }
            tail.extend_from_slice(&buf[..n]);
            if tail.len() > STDERR_TAIL_BYTES * 2 {
                tail.drain(..tail.len() - STDERR_TAIL_BYTES);
            }
        }
        let start = tail.len().saturating_sub(STDERR_TAIL_BYTES);
        tail.split_off(start)
    });

    let (read, mut write) = ours.into_split();
    let mut reports = BufReader::new(read).lines();
    let deadline_now = |deadline: Option<Instant>| {
        nanos(kill_by(
            deadline,
            supervision.margin,
            Instant::now(),
            boot_now(),
        ))
    };
    let start = Start {
        command: command.to_vec(),
        env,
        cwd: cwd.map(Path::to_path_buf),
        task_base64: base64::engine::general_purpose::STANDARD.encode(task_json),
        kill_grace_ms: supervision.kill_grace.as_millis() as u64,
        kill_by_ns: deadline_now(*lease_deadline.borrow_and_update()),
        lock_file: supervision.lock_file.clone(),
        leader_pid: std::process::id(),
    };
    // A failed write means the supervisor is already gone: its EOF tells below.
    let _ = write
        .write_all(&protocol::line(&Control::Start(Box::new(start))))
        .await;

    let timeout = async {
        match timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(timeout);
    let backstop = tokio::time::sleep(Duration::MAX / 4);
    tokio::pin!(backstop);
    let mut lease_open = true;
    let mut asked: Option<Asked> = None;
    let mut group: Option<Pid> = None;
    let mut backstop_fired = false;
    let outcome = loop {
        tokio::select! {
            line = reports.next_line() => {
                let report = match line {
                    Ok(Some(text)) => serde_json::from_str::<Report>(&text).ok(),
                    Ok(None) | Err(_) => None,
                };
                match report {
                    Some(Report::Started { pid }) => group = Pid::from_raw(pid as i32),
                    Some(Report::Refused { reason }) => break Err(RunError::NotStarted(reason)),
                    Some(Report::Exited { wait_status, stopped }) => {
                        break Ok((ExitStatus::from_raw(wait_status), stopped));
                    }
                    None => {
                        // The supervisor died without a report: do its job.
                        let Some(group) = group else {
                            break Err(RunError::NotStarted(format!(
                                "{} did not act as a handler supervisor; a program that runs exec handlers must call leaderq::supervise::run_if_supervisor() first thing in main",
                                supervision.program.display()
                            )));
                        };
                        kill_group(group).await;
                        break Err(RunError::SupervisorLost(
                            "the handler supervisor died; the handler's process group was killed".into(),
                        ));
                    }
                }
            }
            changed = lease_deadline.changed(), if lease_open => {
                if changed.is_err() {
                    // Nobody will move the deadline again: the last one stands.
                    lease_open = false;
                    continue;
                }
                let kill_by_ns = deadline_now(*lease_deadline.borrow_and_update());
                let _ = write.write_all(&protocol::line(&Control::Lease { kill_by_ns })).await;
            }
            _ = &mut timeout, if asked.is_none() => {
                asked = Some(Asked::TimedOut);
                let _ = write.write_all(&protocol::line(&Control::Stop)).await;
                backstop.as_mut().reset(Instant::now() + supervision.kill_grace + BACKSTOP);
            }
            _ = cancel.cancelled(), if asked.is_none() => {
                asked = Some(Asked::Cancelled);
                let _ = write.write_all(&protocol::line(&Control::Stop)).await;
                backstop.as_mut().reset(Instant::now() + supervision.kill_grace + BACKSTOP);
            }
            _ = &mut backstop, if !backstop_fired => {
                // The supervisor did not finish in time: kill it; its EOF then leads to
                // killing the handler's group above.
                backstop_fired = true;
                tracing::warn!(program = %supervision.program.display(), "the handler supervisor did not stop the handler in time; killing both");
                let _ = supervisor.start_kill();
            }
        }
    };
    // Close our end: a supervisor still reading sees EOF. Then reap it and read the end of
    // its stderr; after its report both come at once.
    drop(write);
    drop(reports);
    if tokio::time::timeout(AFTERMATH, supervisor.wait())
        .await
        .is_err()
    {
        let _ = supervisor.start_kill();
        let _ = supervisor.wait().await;
    }
    let stderr_tail = match tokio::time::timeout(AFTERMATH, &mut collect).await {
        Ok(Ok(tail)) => tail,
        _ => {
            collect.abort();
            Vec::new()
        }
    };
    let (status, stopped) = outcome?;
    Ok(Ended {
        status,
        stopped,
        asked,
        stderr_tail,
    })
}

/// SIGKILL to the handler's group, then wait (bounded) until nothing is left in it.
async fn kill_group(group: Pid) {
    let started = Instant::now();
    while rustix::process::kill_process_group(group, Signal::KILL).is_ok() {
        if started.elapsed() > AFTERMATH {
            tracing::warn!(
                group = group.as_raw_nonzero().get(),
                "handler processes survive SIGKILL"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The executable that answers `__supervise`: this very one, through /proc so that it
/// still works (and still speaks the same protocol) after the file was replaced by an
/// upgrade.
pub fn this_program() -> PathBuf {
    PathBuf::from("/proc/self/exe")
}
