//! Handler processes that never outlive the lease they run under.
//!
//! Each exec handler runs under a small supervisor: this same executable started as
//! `<exe> __supervise` in a process group of its own (so a terminal's Ctrl-C does not reach
//! it), which starts the handler in another new process group with a clean environment and
//! enforces, on its own clock and whatever the leader does, the kill schedule of `plan.rs`:
//! SIGTERM to the handler's group, `kill_grace`, SIGKILL, all before the lease could end.
//! A supervisor serves one run at a time and, between runs, waits for the next one (the
//! leader keeps it idle): starting this executable costs milliseconds, a run of a small
//! handler about one.
//!
//! - `leader.rs`: the leader's side (start, lease updates, stop, the report).
//! - `process.rs`: the supervisor process itself.
//! - `plan.rs`: the pure kill schedule.
//! - `protocol.rs`: the messages between the two and the shared clock.
//! - `lock.rs`: `handlers.lock`, so a restarted replica waits for the old handlers.
//! - `workers.rs`: the threads a supervisor keeps for its runs' blocking chores.
//! - `tail.rs`: the end of a handler's stdout or stderr, in bounded memory.
//!
//! Which environment a handler gets and how its result becomes a task outcome is
//! `handler.rs`'s business. Linux only (subreaper, CLOCK_BOOTTIME, /proc).

use std::path::PathBuf;
use std::time::Duration;

pub mod leader;
pub mod lock;
pub mod plan;
pub mod process;
pub mod protocol;
pub mod tail;
pub mod workers;

/// The hidden first argument that turns this executable into a supervisor.
pub const SUPERVISE_ARG: &str = "__supervise";

/// The lease's safety margin is this fraction of the session TTL: a handler must be dead
/// `lease_ttl / 10` before the lease deadline (1 s with the default 10 s TTL). It covers
/// the supervisor's wake-up latency, the kernel's time to tear the processes down and any
/// drift between this machine's clock and the coordinator's.
pub const LEASE_MARGIN_DIVISOR: u32 = 10;

/// The safety margin for a session TTL.
pub fn lease_margin(lease_ttl: Duration) -> Duration {
    lease_ttl / LEASE_MARGIN_DIVISOR
}

/// How a replica supervises its exec handlers.
#[derive(Clone, Debug)]
pub struct Supervision {
    /// The executable that answers `__supervise` (`/proc/self/exe` in a replica).
    pub program: PathBuf,
    /// Between SIGTERM and SIGKILL of a handler's group.
    pub kill_grace: Duration,
    /// How long before the lease deadline the handler must be dead.
    pub margin: Duration,
    /// `handlers.lock` in the data dir, absolute; `None` runs without it.
    pub lock_file: Option<PathBuf>,
    /// The supervisors kept between runs, shared by every clone.
    pub pool: leader::Pool,
}

/// Call this first thing in `main` of any program that runs exec handlers (the `leaderq`
/// binary does): when the process was started as a handler supervisor it does that job and
/// exits, and never returns; otherwise it returns at once.
///
/// ```no_run
/// // First line of `main`, before parsing arguments or starting an async runtime:
/// leaderq::supervise::run_if_supervisor();
/// ```
///
/// See `examples/rust_handler.rs`.
pub fn run_if_supervisor() {
    if std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new(SUPERVISE_ARG)) {
        std::process::exit(process::run());
    }
}
