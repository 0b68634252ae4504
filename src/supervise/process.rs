//! The supervisor process (`<exe> __supervise`): runs handlers, one at a time, each in a
//! new process group, and makes sure that group, and everything the handler started, is
//! gone by the time the lease it runs under could end, whatever happens to the leader.
//!
//! One supervisor serves run after run for as long as its leader lives (the leader keeps
//! the idle ones, `leader.rs`), so a run costs the handler's own fork and exec, not also
//! the start of this executable. Runs never overlap in one supervisor: each is over
//! (handler, leftovers and escaped descendants all gone, reported `exited`) before the next
//! `start` is read, so whatever it adopts as their subreaper belongs to the one run going.
//!
//! Plain threads, no async runtime: a control thread reads the leader's messages for the
//! supervisor's life (EOF: the leader is gone), a reaper waits for every child of a run
//! (as a child subreaper, orphaned descendants become its children too), and the main
//! thread follows `plan.rs`. The reaper, and the run's other blocking chores, run on
//! threads kept between runs (`workers.rs`).

use std::fs::File;
use std::io::{BufRead, BufReader, Read as _, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine as _;
use rustix::process::{Pid, Signal, WaitOptions};

use super::plan::{Progress, Step, StopReason};
use super::protocol::{self, boot_now, Control, Report, Start, STDERR_TAIL_BYTES};
use super::tail::Tail;
use super::workers::Workers;

/// While only members of the handler's group that are not our children remain (no
/// subreaper), how often to look whether they are gone.
const GROUP_POLL: Duration = Duration::from_millis(20);
/// Once every process of a run is gone, how long to wait for the end of its kept streams
/// (a process outside the run that was handed a pipe could hold it open).
const STREAM_END: Duration = Duration::from_secs(2);

enum Event {
    Control(Control),
    LeaderGone,
    HandlerExited(i32),
    NoChildren,
}

/// Runs the supervisor over the control socket on stdin; returns the exit code.
pub fn run() -> i32 {
    let control = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => UnixStream::from(fd),
        Err(err) => {
            eprintln!("leaderq supervisor: no control socket on stdin: {err}");
            return 2;
        }
    };
    let reader = BufReader::new(match control.try_clone() {
        Ok(stream) => stream,
        Err(err) => {
            eprintln!("leaderq supervisor: {err}");
            return 2;
        }
    });
    // Orphaned descendants of a handler become our children, so they can be found,
    // killed and reaped. Linux only; without it the process group is all we can reach.
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    let (events, inbox) = mpsc::channel();
    let control_events = events.clone();
    std::thread::spawn(move || read_control(reader, control_events));
    let mut report = control;
    let workers = Workers::default();
    let mut served = 0u64;
    loop {
        match inbox.recv() {
            Ok(Event::Control(Control::Start(start))) => {
                served += 1;
                match supervise(*start, &events, &inbox, &mut report, &workers) {
                    Ok(Served::Ready) => {}
                    Ok(Served::LeaderGone) => return 0,
                    Err(reason) => {
                        let _ = report.write_all(&protocol::line(&Report::Refused { reason }));
                    }
                }
            }
            // Lease moves and stops that crossed the end of the run they were meant for.
            Ok(Event::Control(_)) => {}
            Ok(Event::LeaderGone) | Err(_) => return 0,
            Ok(Event::HandlerExited(_) | Event::NoChildren) => {}
        }
        if served == 0 {
            eprintln!("leaderq supervisor: the first message is not a start: run by leaderq only");
            return 2;
        }
    }
}

/// How a run ended for the supervisor.
enum Served {
    /// Ready for the next run.
    Ready,
    /// The leader is gone: nothing more will come.
    LeaderGone,
}

/// Starts the handler and follows it to the end; `Err` when nothing was started.
fn supervise(
    start: Start,
    events: &mpsc::Sender<Event>,
    inbox: &mpsc::Receiver<Event>,
    report: &mut UnixStream,
    workers: &Workers,
) -> Result<Served, String> {
    let lock = match &start.lock_file {
        Some(path) => Some(lock_shared(path)?),
        None => None,
    };
    // The leader may have died before the lock was ours; then a restarted replica may
    // already have checked the lock and be running: start nothing.
    let parent = rustix::process::getppid().map_or(0, |pid| pid.as_raw_nonzero().get() as u32);
    if parent != start.leader_pid {
        return Err("the leader is gone".into());
    }
    let (program, args) = start
        .command
        .split_first()
        .ok_or_else(|| "exec handler has an empty command".to_string())?;
    let task = base64::engine::general_purpose::STANDARD
        .decode(&start.task_base64)
        .map_err(|e| format!("task is not base64: {e}"))?;
    // The handler's stderr: ours (the leader's), or a pipe whose end is kept for the
    // report; its stdout: ours, or a pipe whose every read is passed on to ours and whose
    // end is kept too. The pipes' ends are close-on-exec; the spawn gives the handler its
    // own copies.
    let (stderr, stderr_tail) = match start.keep_stderr {
        true => kept_stream(workers, start.keep_bytes.max(STDERR_TAIL_BYTES), false)?,
        false => (Stdio::inherit(), None),
    };
    let (stdout, stdout_tail) = match start.keep_stdout {
        true => kept_stream(workers, start.keep_bytes, true)?,
        false => (Stdio::inherit(), None),
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(start.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0);
    if let Some(cwd) = &start.cwd {
        command.current_dir(cwd);
    }
    let spawned = command.spawn();
    // Our copies of the pipes' writing ends go with the command: the readers see the end
    // of the streams once the handler's processes are gone.
    drop(command);
    let mut child = spawned.map_err(|e| format!("cannot start {program}: {e}"))?;
    // The handler holds the lock too (the spawn above inherited the lock's descriptor, see
    // `lock_shared`): should this supervisor be killed, the lock still lasts as long as
    // the handler, and a restarted replica keeps waiting for it. Ours is released when
    // this function returns, after everything is gone.
    let _lock = lock;
    let pid = child.id();
    let group = Pid::from_raw(pid as i32).expect("a child's pid is positive");
    let _ = report.write_all(&protocol::line(&Report::Started { pid }));

    let mut stdin = child.stdin.take().expect("stdin is piped");
    // std's Child is never waited for: the reaper thread below reaps every child, this one
    // included, so it must be the only one calling wait.
    drop(child);
    // What the pipe takes now is written here; the rest, which waits for the handler to
    // read, by a worker. Dropping our end tells the handler the task is all there.
    let written = write_now(&mut stdin, &task);
    if written < task.len() {
        workers.run(move || write_rest(stdin, &task[written..]));
    } else {
        drop(stdin);
    }
    let reaper_events = events.clone();
    workers.run(move || reap(pid as i32, reaper_events));

    let kill_grace = Duration::from_millis(start.kill_grace_ms);
    let mut progress = Progress {
        kill_by: Duration::from_nanos(start.kill_by_ns),
        ..Progress::default()
    };
    let mut wait_status: Option<i32> = None;
    let mut stopped: Option<StopReason> = None;
    let mut no_children = false;
    let mut leader_gone = false;
    loop {
        if no_children && group_gone(group) {
            break;
        }
        let now = boot_now();
        let until = match progress.next(kill_grace, now) {
            Step::Term(reason) => {
                if wait_status.is_none() {
                    stopped = reason;
                }
                progress.term_sent_at = Some(now);
                signal_all(group, Signal::TERM);
                continue;
            }
            Step::Kill => {
                progress.last_kill_at = Some(now);
                signal_all(group, Signal::KILL);
                continue;
            }
            Step::SleepUntil(at) => at,
        };
        let mut timeout = until.saturating_sub(now);
        if no_children {
            timeout = timeout.min(GROUP_POLL);
        }
        let event = match inbox.recv_timeout(timeout) {
            Ok(event) => event,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            // Every sender gone: nothing more can happen but the schedule.
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(timeout);
                continue;
            }
        };
        let now = boot_now();
        match event {
            Event::Control(Control::Lease { kill_by_ns }) => {
                progress.kill_by = Duration::from_nanos(kill_by_ns);
            }
            Event::Control(Control::Stop) => progress.stop(now, Some(StopReason::Requested)),
            Event::Control(Control::Start(_)) => {
                // One run at a time: the leader starts the next only after `exited`.
                eprintln!("leaderq supervisor: ignoring a start during a run");
            }
            Event::LeaderGone => {
                leader_gone = true;
                progress.stop(now, Some(StopReason::LeaderGone));
            }
            Event::HandlerExited(status) => {
                wait_status = Some(status);
                // Whatever it left behind runs outside any run: stop it too.
                if !group_gone(group) || has_children() {
                    progress.stop(now, None);
                }
            }
            Event::NoChildren => no_children = true,
        }
    }
    // Both waits share one bound: the streams end together, with the run's processes.
    let ends_by = std::time::Instant::now() + STREAM_END;
    let (stderr_tail, stderr_dropped) = stream_end(stderr_tail, ends_by);
    let (stdout_tail, stdout_dropped) = stream_end(stdout_tail, ends_by);
    let base64 = &base64::engine::general_purpose::STANDARD;
    let exited = Report::Exited {
        wait_status: wait_status.unwrap_or(0),
        stopped,
        stderr_tail: base64.encode(stderr_tail),
        stderr_dropped,
        stdout_tail: base64.encode(stdout_tail),
        stdout_dropped,
    };
    let _ = report.write_all(&protocol::line(&exited));
    Ok(if leader_gone {
        Served::LeaderGone
    } else {
        Served::Ready
    })
}

/// Writes what of `bytes` the pipe takes without waiting; returns how much, or all of it
/// when the reader is gone (a handler may close its stdin unread).
fn write_now(pipe: &mut std::process::ChildStdin, bytes: &[u8]) -> usize {
    if rustix::io::ioctl_fionbio(&*pipe, true).is_err() {
        return 0;
    }
    let written = feed(pipe, bytes, false);
    let _ = rustix::io::ioctl_fionbio(&*pipe, false);
    written
}

/// Writes the rest of a task as the handler reads it, then closes the pipe; stops if the
/// handler closes it first.
fn write_rest(mut pipe: std::process::ChildStdin, bytes: &[u8]) {
    feed(&mut pipe, bytes, true);
}

/// Writes `bytes` to a handler's stdin, waiting while the pipe is full if `wait`, else
/// stopping there; returns how much was written, or all of it once the reader is gone.
fn feed(pipe: &mut std::process::ChildStdin, bytes: &[u8], wait: bool) -> usize {
    let mut written = 0;
    while written < bytes.len() {
        match pipe.write(&bytes[written..]) {
            Ok(0) => break,
            Ok(n) => written += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            // Full, on a pipe left non-blocking (`write_now` could not undo it).
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock && wait => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(_) => return bytes.len(),
        }
    }
    written
}

/// The end of a kept stream, as it reaches the leader.
type StreamEnd = mpsc::Receiver<(Vec<u8>, u64)>;

/// A pipe for one of the handler's streams whose reader, on a worker, keeps the last
/// `keep` bytes and, if `pass_on`, writes every read on to our own stdout.
fn kept_stream(
    workers: &Workers,
    keep: usize,
    pass_on: bool,
) -> Result<(Stdio, Option<StreamEnd>), String> {
    let (read, write) =
        std::io::pipe().map_err(|e| format!("cannot make a pipe for the handler: {e}"))?;
    let (sender, end) = mpsc::channel();
    workers.run(move || {
        let _ = sender.send(read_tail(read, keep, pass_on));
    });
    Ok((Stdio::from(write), Some(end)))
}

/// What a kept stream's reader found by `by`: its end and the bytes before it (nothing,
/// for a stream not kept or one still held open).
fn stream_end(end: Option<StreamEnd>, by: std::time::Instant) -> (Vec<u8>, u64) {
    let wait = by.saturating_duration_since(std::time::Instant::now());
    end.and_then(|end| end.recv_timeout(wait).ok())
        .unwrap_or_default()
}

/// Reads a run's stream to its end; keeps the last `keep` bytes, however much comes, and
/// passes each read on to our stdout if `pass_on` (what the handler's stdout did before it
/// was kept: the replica's log keeps it). Answers the end and the bytes before it.
fn read_tail(mut stream: std::io::PipeReader, keep: usize, pass_on: bool) -> (Vec<u8>, u64) {
    let mut tail = Tail::new(keep);
    let mut buf = [0u8; 8192];
    let mut ours = pass_on.then(std::io::stdout);
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                tail.push(&buf[..n]);
                // A stdout of ours that is gone no longer takes it; the tail still does.
                if let Some(out) = &mut ours {
                    if out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
                        ours = None;
                    }
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    tail.into_parts()
}

/// Opens `path` and takes a shared lock on it, leaving the descriptor open across exec so
/// that the handler inherits it (only the handler is spawned after this).
fn lock_shared(path: &std::path::Path) -> Result<File, String> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    file.lock_shared()
        .map_err(|e| format!("cannot lock {}: {e}", path.display()))?;
    rustix::io::fcntl_setfd(&file, rustix::io::FdFlags::empty())
        .map_err(|e| format!("cannot pass {} on to the handler: {e}", path.display()))?;
    Ok(file)
}

fn read_control(reader: BufReader<UnixStream>, events: mpsc::Sender<Event>) {
    for line in reader.lines() {
        let Ok(line) = line else { break };
        match serde_json::from_str::<Control>(&line) {
            Ok(control) => {
                if events.send(Event::Control(control)).is_err() {
                    return;
                }
            }
            Err(err) => eprintln!("leaderq supervisor: ignoring a bad control message: {err}"),
        }
    }
    let _ = events.send(Event::LeaderGone);
}

/// Reaps every child until there is none left; reports the handler's own status.
fn reap(handler: i32, events: mpsc::Sender<Event>) {
    loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, status))) => {
                if pid.as_raw_nonzero().get() == handler {
                    let _ = events.send(Event::HandlerExited(status.as_raw()));
                }
            }
            Ok(None) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => {
                let _ = events.send(Event::NoChildren);
                return;
            }
        }
    }
}

/// Whether no process is left in the handler's group.
fn group_gone(group: Pid) -> bool {
    rustix::process::test_kill_process_group(group) == Err(rustix::io::Errno::SRCH)
}

/// Signals the handler's group, and each of our own children that left it.
fn signal_all(group: Pid, signal: Signal) {
    let _ = rustix::process::kill_process_group(group, signal);
    for child in children() {
        if child != group {
            let _ = rustix::process::kill_process(child, signal);
        }
    }
}

/// Whether this process has a child, exited or not (reaped ones are no longer children).
/// One system call: `children()` reads a file per thread.
fn has_children() -> bool {
    use rustix::process::{waitid, WaitId, WaitIdOptions};
    // Without a child, even one still running, the call fails with ECHILD.
    let options = WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT | WaitIdOptions::EXITED;
    !matches!(waitid(WaitId::All, options), Err(rustix::io::Errno::CHILD))
}

/// This process's children. Only children: their pids cannot be reused before we reap
/// them, so signalling them never hits a stranger. Each thread's `children` file lists
/// its own (orphans may be adopted by any thread); without those files (a kernel built
/// without CONFIG_PROC_CHILDREN), every process's parent is read instead.
fn children() -> Vec<Pid> {
    match children_by_thread() {
        Some(children) => children,
        None => children_by_parent(),
    }
}

/// `None` without the files. A thread that ends while they are read hands its children
/// to another, maybe one already read: the files are read again, a few times, before
/// every process's parent is.
fn children_by_thread() -> Option<Vec<Pid>> {
    'again: for _ in 0..3 {
        let mut children = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").ok()? {
            let path = task.ok()?.path().join("children");
            let list = match std::fs::read_to_string(path) {
                Ok(list) => list,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue 'again,
                Err(_) => return None,
            };
            children.extend(
                list.split_whitespace()
                    .filter_map(|pid| Pid::from_raw(pid.parse().ok()?)),
            );
        }
        return Some(children);
    }
    None
}

fn children_by_parent() -> Vec<Pid> {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let parent: i32 = parent_of(&stat)?;
            (parent == me).then(|| Pid::from_raw(pid)).flatten()
        })
        .collect()
}

/// The parent pid in a /proc/<pid>/stat line: the second field after the command name,
/// which is in parentheses and may itself contain spaces and parentheses.
fn parent_of(stat: &str) -> Option<i32> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ways of listing children find a child of this process, and it is seen to
    /// have one.
    #[test]
    fn children_are_found() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(child.id() as i32).unwrap();
        assert!(children_by_thread().unwrap().contains(&pid));
        assert!(children_by_parent().contains(&pid));
        assert!(has_children());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// A task larger than the pipe is written in part without waiting, and whole once the
    /// handler reads; one whose handler closed its stdin counts as written.
    #[test]
    fn a_task_reaches_the_handler_whole_however_large() {
        let task: Vec<u8> = (0..300_000u32).map(|n| (n % 251) as u8).collect();
        let mut cat = Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = cat.stdin.take().unwrap();
        let written = write_now(&mut stdin, &task);
        assert!(written > 0 && written < task.len(), "{written}");
        let rest = task[written..].to_vec();
        let writer = std::thread::spawn(move || write_rest(stdin, &rest));
        let mut read = Vec::new();
        cat.stdout.take().unwrap().read_to_end(&mut read).unwrap();
        writer.join().unwrap();
        cat.wait().unwrap();
        assert!(
            read == task,
            "cat read {} of {} bytes",
            read.len(),
            task.len()
        );

        let mut gone = Command::new("true").stdin(Stdio::piped()).spawn().unwrap();
        let mut stdin = gone.stdin.take().unwrap();
        gone.wait().unwrap();
        assert_eq!(write_now(&mut stdin, &task), task.len());
    }

    /// The parent pid is read after the last parenthesis, whatever the command name holds.
    #[test]
    fn parent_pid_is_read_past_odd_command_names() {
        assert_eq!(parent_of("42 (sleep) S 7 42 42 0"), Some(7));
        assert_eq!(parent_of("42 (a) b (c) R 9 42"), Some(9));
        assert_eq!(parent_of("garbage"), None);
    }
}
