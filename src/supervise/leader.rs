//! The leader's side of a supervised run: hand the job to a supervisor (an idle one kept
//! from an earlier run, or one started now in its own process group with a clean
//! environment), forward every move of the lease deadline, ask it to stop on time-out or
//! cancellation, and return only once it reports that the handler and everything it
//! started are gone; then keep it for the next run.
//!
//! If the supervisor dies without a report, the leader kills the handler's process group
//! itself, and the supervisor is not kept. If the leader dies, every supervisor, idle or
//! not, sees its control socket close.

use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use rustix::process::{Pid, Signal};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::plan::StopReason;
use super::protocol::{self, boot_now, kill_by, nanos, Control, Report, Start};
use super::{Supervision, SUPERVISE_ARG};

/// Beyond the kill grace, how long the leader waits for a supervisor that was asked to
/// stop before it kills the supervisor and the handler's group itself.
const BACKSTOP: Duration = Duration::from_secs(2);
/// How long to wait for a supervisor's exit once it is not kept.
const AFTERMATH: Duration = Duration::from_secs(2);
/// How much of the handler's stderr is kept.
pub const STDERR_TAIL_BYTES: usize = protocol::STDERR_TAIL_BYTES;

/// Supervisors between runs, each ready for its next: as many as runs went on at once
/// (one per run at a time; up to `queue.concurrency` in a replica). Shared by the clones of
/// a `Supervision`. An idle supervisor holds nothing (no lock, no process) and exits when
/// the leader does, as its control socket closes.
#[derive(Clone, Default)]
pub struct Pool(Arc<Mutex<Vec<Supervisor>>>);

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idle = self.0.lock().map_or(0, |idle| idle.len());
        f.debug_struct("Pool").field("idle", &idle).finish()
    }
}

impl Pool {
    /// An idle supervisor that is still alive, if any.
    fn take(&self) -> Option<Supervisor> {
        let mut idle = self.0.lock().ok()?;
        while let Some(mut supervisor) = idle.pop() {
            if matches!(supervisor.child.try_wait(), Ok(None)) {
                return Some(supervisor);
            }
        }
        None
    }

    fn keep(&self, supervisor: Supervisor) {
        if let Ok(mut idle) = self.0.lock() {
            idle.push(supervisor);
        }
    }

    /// How many supervisors are idle.
    pub fn idle(&self) -> usize {
        self.0.lock().map_or(0, |idle| idle.len())
    }

    /// The pids of the idle supervisors.
    pub fn idle_pids(&self) -> Vec<u32> {
        self.0.lock().map_or(Vec::new(), |idle| {
            idle.iter().filter_map(|s| s.child.id()).collect()
        })
    }
}

/// A supervisor process and the leader's ends of its control socket.
struct Supervisor {
    child: tokio::process::Child,
    reports: Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

impl Supervisor {
    /// Starts `program` as a supervisor: its own process group (a terminal's Ctrl-C does
    /// not reach it), a clean environment, the control socket on its stdin, our stdout
    /// and stderr.
    fn start(program: &Path) -> Result<Supervisor, RunError> {
        let not_started =
            |what: &str, e: std::io::Error| RunError::NotStarted(format!("{what}: {e}"));
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| not_started("cannot create the supervisor's control socket", e))?;
        ours.set_nonblocking(true)
            .map_err(|e| not_started("cannot set up the control socket", e))?;
        let ours = tokio::net::UnixStream::from_std(ours)
            .map_err(|e| not_started("cannot set up the control socket", e))?;
        // The command is dropped right after the spawn, and with it our copy of the
        // supervisor's end of the socket: its death must read as EOF here.
        let child = tokio::process::Command::new(program)
            .arg(SUPERVISE_ARG)
            .env_clear()
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .map_err(|e| {
                not_started(
                    &format!("cannot start the handler supervisor {}", program.display()),
                    e,
                )
            })?;
        let (read, write) = ours.into_split();
        Ok(Supervisor {
            child,
            reports: BufReader::new(read).lines(),
            write,
        })
    }

    /// Closes our end (a supervisor still reading sees EOF), then reaps it, killing it if
    /// it does not exit by itself.
    async fn end(self) {
        let Supervisor {
            mut child,
            reports,
            write,
        } = self;
        drop(write);
        drop(reports);
        if tokio::time::timeout(AFTERMATH, child.wait()).await.is_err() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

/// One handler run.
#[derive(Clone)]
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
    /// How much of the end of each stream to keep for the run's kept output (`[queue]
    /// output_limit`); 0 keeps none, and stdout goes to ours untouched.
    pub keep_output: usize,
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
    /// The end of the handler's stderr: at most `STDERR_TAIL_BYTES`, or the job's
    /// `keep_output` if more.
    pub stderr_tail: Vec<u8>,
    /// Bytes of stderr before that end.
    pub stderr_dropped: u64,
    /// The end of the handler's stdout, at most the job's `keep_output`.
    pub stdout_tail: Vec<u8>,
    /// Bytes of stdout before that end.
    pub stdout_dropped: u64,
}

/// What the supervisor reported of a run's end.
type Reported = (ExitStatus, Option<StopReason>, Streams);

/// The kept ends of a run's streams: stderr's end and bytes before, stdout's.
type Streams = ((Vec<u8>, u64), (Vec<u8>, u64));

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Nothing was started (the supervisor could not start, or refused with a reason).
    #[error("{0}")]
    NotStarted(String),
    /// The supervisor died mid-run; the handler's group was killed.
    #[error("{0}")]
    SupervisorLost(String),
}

/// Runs `job` under a supervisor; returns when the handler's processes are all gone. A
/// kept supervisor is used if one is idle; one that went while idle (killed, out of
/// memory) and so ends without a word to the run's start hands the run to a new one.
pub async fn run(supervision: &Supervision, job: Job<'_>) -> Result<Ended, RunError> {
    if let Some(kept) = supervision.pool.take() {
        match run_on(supervision, kept, job.clone()).await {
            Attempt::Ran(ended) => return ended,
            Attempt::Silent => {
                tracing::debug!("a kept handler supervisor had gone; starting a new one");
            }
        }
    }
    let fresh = Supervisor::start(&supervision.program)?;
    match run_on(supervision, fresh, job).await {
        Attempt::Ran(ended) => ended,
        Attempt::Silent => Err(RunError::NotStarted(format!(
            "{} did not act as a handler supervisor; a program that runs exec handlers must call leaderq::supervise::run_if_supervisor() first thing in main",
            supervision.program.display()
        ))),
    }
}

/// A run on one supervisor: how it ended, or that the supervisor ended without a word
/// (not even that the handler started).
enum Attempt {
    Ran(Result<Ended, RunError>),
    Silent,
}

async fn run_on(supervision: &Supervision, mut supervisor: Supervisor, job: Job<'_>) -> Attempt {
    let Job {
        command,
        env,
        cwd,
        task_json,
        timeout,
        cancel,
        mut lease_deadline,
        pass_stderr,
        keep_output,
    } = job;
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
        keep_stderr: !pass_stderr,
        keep_stdout: keep_output > 0,
        keep_bytes: keep_output,
    };
    let Supervisor {
        child,
        reports,
        write,
    } = &mut supervisor;
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
    let mut answered = false;
    let outcome = loop {
        tokio::select! {
            line = reports.next_line() => {
                let report = match line {
                    Ok(Some(text)) => serde_json::from_str::<Report>(&text).ok(),
                    Ok(None) | Err(_) => None,
                };
                match report {
                    Some(Report::Started { pid }) => group = Pid::from_raw(pid as i32),
                    Some(Report::Refused { reason }) => {
                        answered = true;
                        break Some(Err(RunError::NotStarted(reason)));
                    }
                    Some(Report::Exited { wait_status, stopped, stderr_tail, stderr_dropped, stdout_tail, stdout_dropped }) => {
                        let decode = |tail: String| base64::engine::general_purpose::STANDARD
                            .decode(tail)
                            .unwrap_or_default();
                        answered = true;
                        let streams = ((decode(stderr_tail), stderr_dropped), (decode(stdout_tail), stdout_dropped));
                        let report: Reported = (ExitStatus::from_raw(wait_status), stopped, streams);
                        break Some(Ok(report));
                    }
                    None => {
                        // The supervisor died without a report: do its job.
                        let Some(group) = group else {
                            break None;
                        };
                        kill_group(group).await;
                        break Some(Err(RunError::SupervisorLost(
                            "the handler supervisor died; the handler's process group was killed".into(),
                        )));
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
                let _ = child.start_kill();
            }
        }
    };
    // A supervisor that answered for its run (`exited` or `refused`) serves the next one;
    // one that died, or was killed by the backstop, is ended.
    if answered && !backstop_fired {
        supervision.pool.keep(supervisor);
    } else {
        supervisor.end().await;
    }
    let Some(outcome) = outcome else {
        return Attempt::Silent;
    };
    Attempt::Ran(outcome.map(|(status, stopped, streams)| {
        let ((stderr_tail, stderr_dropped), (stdout_tail, stdout_dropped)) = streams;
        Ended {
            status,
            stopped,
            asked,
            stderr_tail,
            stderr_dropped,
            stdout_tail,
            stdout_dropped,
        }
    }))
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
