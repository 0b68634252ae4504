//! `leaderq run -- COMMAND`: leader-gate any program (a cron job, a scheduler, a singleton
//! daemon) on any coordinator backend. Each replica contends for the leader key of its
//! NAME (`leaderq/run/<NAME>/leader`); the winner starts the command under the same
//! supervision as exec handlers (`supervise/`): its own process group, a clean environment
//! plus `LEADERQ_FENCING_TOKEN`, `LEADERQ_LEADER_ID` and `LEADERQ_NAME`, and killed
//! (SIGTERM, kill grace, SIGKILL) before its lease could end, whatever `leaderq run`
//! does, and at once if `leaderq run` dies.
//!
//! While the command runs, the replica watches the leadership: if another lease holds it
//! or this lease is not renewed within its TTL, the command is stopped (then `--on-loss`
//! says whether to exit 75 or contest again). When the command exits, leadership is
//! given up so another replica can take it; `--restart` says whether to contest again
//! and start it anew (with backoff; `--handover` stands back first so another replica
//! leads). SIGTERM or SIGINT stops the command gracefully, gives leadership up and exits
//! with the command's status. The decisions are `plan.rs`'s; this file does the I/O.
//!
//! With `--every` or `--cron` the replica keeps leadership and runs the command once per
//! tick instead (`periodic.rs`).
//!
//! Data dir: `--data-dir`, else `<data.dir>/run/<NAME>`, else the first of
//! `<NAME>-2`, `<NAME>-3`, … that no other process holds, so several replicas on one
//! machine each keep an identity (node id, lease) across restarts.

pub mod periodic;
pub mod plan;

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::config::{HandlerKind, HandlerSettings, Settings};
use crate::coord::{Coordinator, Leadership, Version};
use crate::leader::identity::{DataDir, IdentityError};
use crate::leader::lifecycle::{Replica, TermEnd, Work};
use crate::leader::Lease;
use crate::observe::Metrics;
use crate::supervise::leader::{Asked, Job};
use crate::supervise::{self, Supervision};
use plan::{Event, Exit, Next, Policy};

/// Back-off while the coordinator cannot be reached between ticks.
const COORD_BACKOFF: Duration = Duration::from_secs(1);

/// Data dirs tried on one machine for one NAME before giving up.
const MAX_SLOTS: usize = 64;

/// What `leaderq run` was asked to do.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub name: String,
    pub command: Vec<String>,
    pub policy: Policy,
    /// `--data-dir`: this replica's own dir (no slot search).
    pub data_dir: Option<PathBuf>,
    /// Environment variables passed to the command beyond the allow-list.
    pub pass_env: Vec<String>,
    /// `--every` or `--cron`: the periodic form, the command run once per tick.
    pub schedule: Option<crate::schedule::Schedule>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Input refused before anything was sent; the message says what to change.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Coord(#[from] crate::coord::CoordError),
}

/// The leader key of a run named `name`, once `name` passed the key rule.
pub fn leader_key(name: &str) -> Result<String, RunError> {
    crate::task::key::check_id(name).map_err(|reason| {
        RunError::Refused(format!(
            "--name {name:?} cannot name a run: {reason}; use letters, digits, '.', '_' or '-'"
        ))
    })?;
    Ok(format!("leaderq/run/{name}/leader"))
}

/// `settings` for a run named `name`: its leader key, and a data dir of its own.
pub fn settings_for(mut settings: Settings, name: &str) -> Result<Settings, RunError> {
    settings.election.leader_key = leader_key(name)?;
    // The catalog entry is a consumer's; a run registers no service.
    settings.election.register_service = false;
    Ok(settings)
}

/// Locks `--data-dir`, or the first free slot under `<data.dir>/run/`.
fn lock_data_dir(settings: &Settings, options: &RunOptions) -> Result<DataDir, RunError> {
    if let Some(dir) = &options.data_dir {
        return Ok(DataDir::lock(dir)?);
    }
    let base = settings.data.dir.join("run");
    for slot in 1..=MAX_SLOTS {
        let dir = match slot {
            1 => base.join(&options.name),
            n => base.join(format!("{}-{n}", options.name)),
        };
        match DataDir::lock(&dir) {
            Ok(locked) => return Ok(locked),
            Err(IdentityError::InUse { .. }) => continue,
            Err(err) => return Err(err.into()),
        }
    }
    Err(RunError::Refused(format!(
        "{MAX_SLOTS} replicas of run {:?} already use data dirs under {}: give this one its own with --data-dir",
        options.name,
        base.display()
    )))
}

/// Runs until the command ends for good, leadership is lost (with `--on-loss exit`) or
/// `shutdown` fires; the exit code `leaderq run` should end with.
pub async fn run(
    settings: Settings,
    options: RunOptions,
    shutdown: CancellationToken,
) -> Result<i32, RunError> {
    let program = options.command.first().cloned().unwrap_or_default();
    crate::handler::find_program(&program, std::env::var_os("PATH").as_deref())
        .map_err(|reason| RunError::Refused(format!("the command cannot run: {reason}")))?;
    let data_dir = lock_data_dir(&settings, &options)?;
    let node_id = data_dir.node_id(&settings.election.node_id)?;
    // Every line this replica logs carries its node id, as `consume`'s do.
    let span = tracing::info_span!("replica", node = %node_id);
    lead_command(settings, options, shutdown, data_dir, node_id)
        .instrument(span)
        .await
}

/// `run` once its data dir is locked and its node id known.
async fn lead_command(
    settings: Settings,
    options: RunOptions,
    shutdown: CancellationToken,
    data_dir: DataDir,
    node_id: String,
) -> Result<i32, RunError> {
    let coord = crate::service::connect::connect(&settings)?;
    let lock_file = supervise::lock::lock_file(data_dir.path());
    supervise::lock::wait_for_previous_handlers(
        &lock_file,
        settings.queue.kill_grace + Duration::from_secs(5),
    )
    .await
    .map_err(RunError::Refused)?;
    let supervision = Supervision {
        program: supervise::leader::this_program(),
        kill_grace: settings.queue.kill_grace,
        margin: supervise::lease_margin(settings.election.lease_ttl),
        lock_file: std::path::absolute(&lock_file).ok(),
        pool: Default::default(),
    };
    let parent: Vec<(String, String)> = std::env::vars().collect();
    let base_env = crate::handler::handler_env(
        &parent,
        &HandlerSettings {
            kind: HandlerKind::Exec,
            command: options.command.clone(),
            timeout: None,
            env: Default::default(),
            pass_env: options.pass_env.clone(),
            cwd: None,
            permanent_exit_codes: Vec::new(),
            max_attempts: None,
            backoff_base: None,
            backoff_max: None,
            priority: None,
            concurrency: None,
            rate: None,
        },
    );
    let mut replica = Replica::new(
        coord.clone(),
        &settings.election,
        &node_id,
        data_dir.path(),
        Arc::new(Metrics::new(std::iter::empty::<&str>())),
        settings.watch_wait(),
    );
    let tracker = TaskTracker::new();
    let stop_renewer = CancellationToken::new();
    replica.renew(settings.election.lease_ttl, &tracker, stop_renewer.clone());
    tracker.close();
    tracing::info!(name = %options.name, node = %node_id, coordinator = %coord.describe(), command = ?options.command, "run starting");
    let mut work = Command {
        supervision: &supervision,
        options: &options,
        base_env: &base_env,
        node_id: &node_id,
        lease: replica.election.lease(),
        coord: coord.as_ref(),
        wait: settings.watch_wait(),
        shutdown: &shutdown,
        quick_failures: 0,
        delay: Duration::ZERO,
    };
    let ended = replica.live(&mut work, &shutdown).await;
    stop_renewer.cancel();
    tracker.wait().await;
    let code = ended.map_err(RunError::Refused)?;
    tracing::info!(name = %options.name, node = %node_id, code, "run stopped");
    Ok(code)
}

/// `run`'s part of the replica's life: a term runs the command (once, or once per tick with
/// `--every`/`--cron`), and `plan.rs` says what comes after it.
struct Command<'a> {
    supervision: &'a Supervision,
    options: &'a RunOptions,
    base_env: &'a [(String, String)],
    node_id: &'a str,
    lease: Arc<Lease>,
    coord: &'a dyn Coordinator,
    wait: Duration,
    shutdown: &'a CancellationToken,
    /// Runs in a row that failed quickly (`plan::quick_failures_after`).
    quick_failures: u32,
    /// The pause before the command starts again, once leadership is won.
    delay: Duration,
}

impl Work for Command<'_> {
    async fn before_term(&mut self, leadership: &Leadership) -> Option<TermEnd> {
        if self.delay.is_zero() {
            return None;
        }
        tracing::info!(delay = %crate::util::duration::format(self.delay), "restarting the command after a pause");
        let lost = watch_leadership(self.coord, leadership, &self.lease, self.wait);
        tokio::select! {
            _ = self.shutdown.cancelled() => Some(TermEnd::StepDown { reason: "shut down".into(), stop: Some(0) }),
            _ = lost => Some(TermEnd::StepDown { reason: "leadership lost".into(), stop: None }),
            _ = tokio::time::sleep(self.delay) => None,
        }
    }

    async fn lead(&mut self, leadership: &Leadership) -> (TermEnd, String) {
        let options = self.options;
        let event = match &options.schedule {
            Some(schedule) => {
                let ticks = periodic::Ticks {
                    schedule,
                    key: periodic::ticks_key(&options.name),
                    node_id: self.node_id,
                };
                let leading = periodic::Leading {
                    supervision: self.supervision,
                    options,
                    base_env: self.base_env,
                    leadership,
                    lease: &self.lease,
                    coord: self.coord,
                    wait: self.wait,
                    shutdown: self.shutdown,
                };
                periodic::lead_periodic(&ticks, &leading).await
            }
            None => {
                lead(
                    self.supervision,
                    options,
                    self.base_env,
                    self.node_id,
                    leadership,
                    &self.lease,
                    self.coord,
                    self.wait,
                    self.shutdown,
                    None,
                )
                .await
            }
        };
        let said = match event {
            Event::Exited {
                exit: plan::Exit::Code(code),
                ..
            } => format!("resigned (the command exited with {code})"),
            Event::Exited {
                exit: plan::Exit::Signal(signal),
                ..
            } => format!("resigned (the command was killed by signal {signal})"),
            Event::Lost => "lost leadership; the command was stopped".to_string(),
            Event::Shutdown { .. } => "resigned (shut down)".to_string(),
        };
        self.quick_failures = plan::quick_failures_after(event, self.quick_failures);
        let end = match plan::next(options.policy, event, self.quick_failures) {
            Next::Exit(code) if event == Event::Lost => {
                tracing::warn!(name = %options.name, "leadership lost; exiting with {code}");
                TermEnd::Lost { stop: Some(code) }
            }
            Next::Exit(code) => TermEnd::Finished { code },
            Next::Again { delay, stand_back } => {
                self.delay = delay;
                if event == Event::Lost {
                    TermEnd::Lost { stop: None }
                } else {
                    TermEnd::Done { stand_back }
                }
            }
        };
        (end, said)
    }
}

/// Resolves when `leadership` is lost: seen lost at the coordinator (the record deleted,
/// rewritten or held by another lease), or this lease gone or not renewed within its TTL.
/// A coordinator that cannot be asked does not count as a loss by itself: the lease's own
/// deadline decides.
async fn watch_leadership(
    coord: &dyn Coordinator,
    leadership: &Leadership,
    lease: &Lease,
    wait: Duration,
) {
    tokio::select! {
        reason = crate::leader::watch::until_lost(coord, leadership, wait) => {
            tracing::warn!(fencing_token = leadership.fencing_token.0, %reason, "stopping the command");
        }
        _ = lease.expired() => {}
    }
}

/// Runs the command once under `leadership`, until it exits, leadership is lost or
/// `shutdown` fires; by the time this returns, every process it started is gone.
#[allow(clippy::too_many_arguments)]
async fn lead(
    supervision: &Supervision,
    options: &RunOptions,
    base_env: &[(String, String)],
    node_id: &str,
    leadership: &Leadership,
    lease: &Arc<Lease>,
    coord: &dyn Coordinator,
    wait: Duration,
    shutdown: &CancellationToken,
    tick: Option<DateTime<Utc>>,
) -> Event {
    let mut env: Vec<(String, String)> = base_env
        .iter()
        .filter(|(name, _)| !name.starts_with("LEADERQ_"))
        .cloned()
        .collect();
    env.extend([
        (
            "LEADERQ_FENCING_TOKEN".to_string(),
            leadership.fencing_token.to_string(),
        ),
        ("LEADERQ_LEADER_ID".to_string(), node_id.to_string()),
        ("LEADERQ_NAME".to_string(), options.name.clone()),
    ]);
    if let Some(tick) = tick {
        env.push((
            "LEADERQ_TICK".to_string(),
            crate::schedule::store::rfc3339_ms(tick),
        ));
    }
    let cancel = CancellationToken::new();
    let job = Job {
        command: &options.command,
        env,
        cwd: None,
        task_json: b"",
        timeout: None,
        cancel: &cancel,
        lease_deadline: lease.deadline_watch(),
        pass_stderr: true,
        keep_output: 0,
    };
    let started = Instant::now();
    tracing::info!(name = %options.name, fencing_token = leadership.fencing_token.0, command = ?options.command, "starting the command");
    let running = supervise::leader::run(supervision, job);
    tokio::pin!(running);
    let lost = watch_leadership(coord, leadership, lease, wait);
    tokio::pin!(lost);
    let mut why: Option<Event> = None;
    let ended = loop {
        tokio::select! {
            ended = &mut running => break ended,
            _ = &mut lost, if why.is_none() => {
                tracing::warn!(name = %options.name, fencing_token = leadership.fencing_token.0, "leadership lost; stopping the command");
                why = Some(Event::Lost);
                cancel.cancel();
            }
            _ = shutdown.cancelled(), if why.is_none() => {
                tracing::info!(name = %options.name, "stopping the command");
                why = Some(Event::Shutdown { exit: None });
                cancel.cancel();
            }
        }
    };
    let exit = match &ended {
        Ok(ended) => Some(exit_of(ended.status)),
        Err(err) => {
            tracing::error!(error = %err, "the command could not run under its supervisor");
            None
        }
    };
    if let Ok(ended) = &ended {
        if ended.asked.is_none() && ended.stopped.is_some() {
            // The supervisor stopped it on its own: the lease was not confirmed in time.
            tracing::warn!(name = %options.name, "the command was stopped: the lease was not confirmed in time");
            return Event::Lost;
        }
        if ended.asked == Some(Asked::Cancelled) && why.is_none() {
            why = Some(Event::Lost);
        }
    }
    match why {
        Some(Event::Shutdown { .. }) => Event::Shutdown { exit },
        Some(event) => event,
        None => Event::Exited {
            exit: exit.unwrap_or(Exit::Code(127)),
            ran: started.elapsed(),
        },
    }
}

fn exit_of(status: std::process::ExitStatus) -> Exit {
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code(code),
        (None, Some(signal)) => Exit::Signal(signal),
        (None, None) => Exit::Code(1),
    }
}

/// `--wait-leader`: who holds leadership of run `name` now, and whether this node would
/// lead (leadership is free, or held by this node): `(description, would_lead)`.
pub async fn who_leads(
    settings: &Settings,
    options: &RunOptions,
) -> Result<(String, bool), RunError> {
    let coord = crate::service::connect::connect(settings)?;
    let (holder, _) = coord.observe(Version(0), Duration::ZERO).await?;
    let own_node = own_node_id(settings, options);
    Ok(match (&holder.lease, &holder.record) {
        (None, _) => ("none".to_string(), true),
        (Some(lease), Some(record)) => (
            format!(
                "{} (fencing token {}, since {}, session {lease})",
                record.node, holder.token, record.since
            ),
            own_node.as_deref() == Some(record.node.as_str()),
        ),
        (Some(lease), None) => (format!("session {lease}"), false),
    })
}

/// This replica's node id if one is configured or kept in its data dir already.
fn own_node_id(settings: &Settings, options: &RunOptions) -> Option<String> {
    if !settings.election.node_id.is_empty() {
        return Some(settings.election.node_id.clone());
    }
    let dir: PathBuf = options
        .data_dir
        .clone()
        .unwrap_or_else(|| settings.data.dir.join("run").join(&options.name));
    read_node_id(&dir)
}

fn read_node_id(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join(crate::leader::identity::NODE_ID_FILE))
        .ok()
        .map(|id| id.trim().to_string())
        .filter(|id| !id.is_empty())
}
