//! The consumer service (`leaderq consume`): joins the election, leads the queue when it
//! wins, stands by when it does not, and shuts down in order.
//!
//! Start: refuse settings that can never work (no handler at all, an exec handler whose
//! program cannot run), lock the data dir and take the node id (`leader/identity.rs`), connect
//! the coordinator the settings name (`coord::connect`; the Consul backend removes the
//! checks older versions left behind at its first lease); a lease TTL the coordinator
//! refuses stops it too.
//!
//! Then it waits until no handler of a previous process on its data dir is alive
//! (`supervise/lock.rs`).
//!
//! Loop: make sure there is a lease, campaign for leadership (`leader`), and while leading
//! let `queue` drain the queue. Stepping down revokes the lease so nothing it claimed
//! stays claimed. On shutdown: stop claiming, let the running handler finish within
//! `shutdown_grace`, give leadership up and close the lease (`Election::leave`). The
//! replica's service registration is Consul's own and runs only with that backend.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::config::Settings;
use crate::coord::consul::client::{self as consul, Client};
use crate::coord::CoordError;
use crate::handler::Registry;
use crate::leader::identity::{DataDir, IdentityError};
use crate::leader::{Election, ElectionError};
use crate::observe::{self, Metrics, Observed};
use crate::queue::{LeadEnd, Queue};

/// Beyond the kill grace, how long a starting replica waits for the handlers of a previous
/// process on its data dir: their supervisors kill them at once when that process dies,
/// so only a stuck kill takes longer.
const PREVIOUS_HANDLERS_SLACK: Duration = Duration::from_secs(5);

/// Back-off while the coordinator cannot be reached: doubles from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_LAST: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error(transparent)]
    Consul(#[from] consul::Error),
    #[error(transparent)]
    Coord(#[from] CoordError),
    #[error("{0}")]
    Observe(String),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// Settings that can never work; the message names the setting and what to do.
    #[error("{0}")]
    Settings(String),
    #[error("{0}")]
    PreviousHandlers(String),
}

/// Refuses to start a replica whose handlers can never work: none at all (unless
/// `queue.allow_no_handlers`), or an exec handler whose program is missing or not
/// executable. `path` is the `PATH` the handlers will be started with.
pub fn check_handlers(
    settings: &Settings,
    registry: &Registry,
    path: Option<&std::ffi::OsStr>,
) -> Result<(), String> {
    if registry.task_types().next().is_none() && !settings.queue.allow_no_handlers {
        return Err("no handler is configured, so every task would be dead-lettered: add a [handlers.<taskType>] section (see config/default.toml), or set queue.allow_no_handlers = true if that is what you want".into());
    }
    for (task_type, handler) in &settings.handlers {
        if handler.kind != crate::config::HandlerKind::Exec {
            continue;
        }
        let program = handler.command.first().map(String::as_str).unwrap_or("");
        if let Err(reason) = crate::handler::find_program(program, path) {
            return Err(format!(
                "handlers.{task_type}.command: the program cannot run: {reason}; install it, fix the path, or make it executable"
            ));
        }
    }
    Ok(())
}

/// A Consul client from the `[consul]` settings (admin commands, service registration).
pub fn client(settings: &Settings) -> Result<Client, consul::Error> {
    crate::coord::consul::client_for(settings)
}

/// How a term of `consume` ended, as the leadership timeline says it.
fn term_ended(end: &LeadEnd) -> String {
    match end {
        LeadEnd::Shutdown => "resigned (shut down)".to_string(),
        LeadEnd::Rotate => "rotated".to_string(),
        LeadEnd::StepDown(reason) => format!("stepped down: {reason}"),
    }
}

/// Leads one term while watching the leadership record and ticking the queue's schedules:
/// a loss seen at the coordinator deposes the lease at once, which stops the runs
/// (SIGTERM, then SIGKILL after the kill grace) and ends the term, instead of waiting for
/// the next renewal to fail. The ticker stops with the term.
async fn lead_watched(
    queue: &Queue,
    coord: &dyn crate::coord::Coordinator,
    leadership: &crate::coord::Leadership,
    lease: &crate::leader::Lease,
    wait: Duration,
    shutdown: &CancellationToken,
) -> LeadEnd {
    lease.begin_term();
    let lead = queue.lead(leadership, lease, shutdown);
    let watch = crate::leader::watch::until_lost(coord, leadership, wait);
    let ticker = crate::schedule::ticker::tick_while_leading(
        coord,
        leadership,
        lease,
        &queue.settings.prefix,
        &queue.node_id,
        wait,
    );
    tokio::pin!(lead, watch, ticker);
    let (mut watching, mut ticking) = (true, true);
    loop {
        tokio::select! {
            end = &mut lead => return end,
            () = &mut ticker, if ticking => ticking = false,
            reason = &mut watch, if watching => {
                watching = false;
                tracing::warn!(fencing_token = leadership.fencing_token, %reason, "stopping every run and stepping down");
                queue.metrics.leadership_lost();
                lease.depose(&reason);
            }
        }
    }
}

/// Runs one replica until `shutdown` is cancelled.
pub async fn run(
    settings: Settings,
    registry: Registry,
    shutdown: CancellationToken,
) -> Result<(), ConsumerError> {
    check_handlers(&settings, &registry, std::env::var_os("PATH").as_deref())
        .map_err(ConsumerError::Settings)?;
    if settings.observe.enabled && settings.observe.dashboard {
        crate::ui::auth::check_listen(settings.observe.listen, settings.observe.admin_token())
            .map_err(ConsumerError::Settings)?;
    }
    // Held until this function returns: the dir's session and node id are this replica's.
    let data_dir = DataDir::lock(&settings.data.dir)?;
    let node_id = data_dir.node_id(&settings.election.node_id)?;
    // Every line this replica logs carries its node id.
    let span = tracing::info_span!("replica", node = %node_id);
    async move {
        let coord = crate::coord::connect(&settings)?;
        // A process that ran on this data dir before may have left handlers that its
        // supervisors are still killing: do nothing before they are gone.
        crate::supervise::lock::wait_for_previous_handlers(
            &crate::supervise::lock::lock_file(&settings.data.dir),
            settings.queue.kill_grace + PREVIOUS_HANDLERS_SLACK,
        )
        .await
        .map_err(ConsumerError::PreviousHandlers)?;
        let mut election = Election::new(
            coord.clone(),
            settings.election.clone(),
            node_id.clone(),
            data_dir.path().to_path_buf(),
        );
        let metrics = Arc::new(Metrics::new(registry.task_types()));
        let queue = Queue {
            coord: coord.clone(),
            settings: settings.queue.clone(),
            registry: registry.clone(),
            node_id: node_id.clone(),
            wait: settings.watch_wait(),
            metrics: metrics.clone(),
            rotation: crate::leader::rotation::Rotation::from_settings(&settings.election),
            term: Default::default(),
            lease_rules: crate::queue::LeaseRules::from_settings(&settings),
        };
        let task_types: Vec<&str> = registry.task_types().collect();
        tracing::info!(node = %node_id, coordinator = %coord.describe(), prefix = %settings.queue.prefix, ?task_types, "consumer starting");

        let tracker = TaskTracker::new();
        let stop_renewer = CancellationToken::new();
        let observed = Arc::new(Observed {
            metrics: metrics.clone(),
            lease: election.lease(),
            coord: coord.clone(),
            alive: std::sync::atomic::AtomicBool::new(true),
        });
        let mut observe_address = None;
        if settings.observe.enabled {
            let listener = observe::bind(settings.observe.listen)
                .await
                .map_err(ConsumerError::Observe)?;
            let address = listener
                .local_addr()
                .map_err(|e| ConsumerError::Observe(e.to_string()))?;
            tracing::info!(%address, "observe endpoints on http://{address} (/metrics, /health, /ready, /leader{})", if settings.observe.dashboard { ", /ui/" } else { "" });
            observe_address = Some(address);
            let mut app = observe::router(observed.clone());
            if settings.observe.dashboard {
                let ui = crate::ui::Ui::new(
                    coord.clone(),
                    settings.clone(),
                    stop_renewer.clone(),
                    tracker.clone(),
                );
                app = app.merge(crate::ui::router(ui));
            }
            let stop = stop_renewer.clone();
            tracker.spawn(async move {
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(async move { stop.cancelled().await })
                    .await;
                if let Err(err) = served {
                    tracing::warn!(error = %err, "observe endpoints stopped");
                }
            }.in_current_span());
        }
        tracker.spawn(Election::renew_until(
            coord.clone(),
            election.lease(),
            settings.election.session_ttl,
            metrics.clone(),
            stop_renewer.clone(),
        ).in_current_span());
        // In the service catalog with its role as tag, deregistered after `leave` below. The
        // catalog is Consul's: the registration talks to it directly, on that backend only.
        let (role, role_changes) =
            tokio::sync::watch::channel(crate::observe::registration::Role::Standby);
        if settings.election.register_service
            && settings.coordinator.backend == crate::config::Backend::Consul
        {
            let client = Arc::new(client(&settings)?);
            let check_id = crate::coord::consul::check_id(&node_id);
            let check = settings.election.health_check.then_some(check_id.as_str());
            let registration = crate::observe::registration::registration(
                &settings.election,
                &node_id,
                observe_address,
                check,
                crate::observe::registration::Role::Standby,
            );
            tracker.spawn(crate::observe::registration::keep_registered(
                client,
                registration,
                role_changes,
                settings.election.session_ttl / 3,
                stop_renewer.clone(),
            ).in_current_span());
        }
        // This replica's record of itself (standbys with their heartbeat, for `status`).
        let (standing, standing_changes) =
            tokio::sync::watch::channel(crate::leader::replicas::Standing::default());
        {
            let prefix = crate::leader::replicas::prefix(&settings.election.leader_key);
            let me = crate::leader::replicas::Me {
                node: node_id.clone(),
                key: format!("{prefix}{node_id}"),
                prefix,
                every: settings.election.session_ttl / 3,
                started_at: crate::task::rfc3339(chrono::Utc::now()),
            };
            tracker.spawn(
                crate::leader::replicas::keep_present(
                    coord.clone(),
                    me,
                    election.lease(),
                    standing_changes,
                    stop_renewer.clone(),
                )
                .in_current_span(),
            );
        }
        tracker.close();

        let mut backoff = BACKOFF_FIRST;
        let mut refused = None;
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            // A lease taken up from before a restart may still hold the previous process's
            // claims (its runs are gone: see above): put them back before standing by, or
            // a leader would wait on them for as long as this replica keeps the lease alive.
            if election.ensure_lease().await.is_ok() {
                if let Some(lease) = election.take_reused() {
                    queue.release_previous(&lease).await;
                }
            }
            match election.campaign(settings.watch_wait(), &shutdown).await {
                Ok(None) => break,
                Ok(Some(leadership)) => {
                    backoff = BACKOFF_FIRST;
                    tracing::info!(node = %node_id, session = %leadership.lease, fencing_token = leadership.fencing_token, "became leader");
                    let lease = election.lease();
                    metrics.leading(Some(leadership.fencing_token));
                    role.send_replace(crate::observe::registration::Role::Leader);
                    standing.send_replace(crate::leader::replicas::Standing {
                        leading: Some(leadership.fencing_token),
                    });
                    let leader_key = &settings.election.leader_key;
                    let term = crate::leader::timeline::start_logged(coord.as_ref(), leader_key, &node_id, leadership.fencing_token).await;
                    let end = lead_watched(&queue, coord.as_ref(), &leadership, &lease, settings.watch_wait(), &shutdown).await;
                    // Said before leadership is given up, so that the next leader reads it.
                    crate::leader::timeline::end_logged(coord.as_ref(), leader_key, term, term_ended(&end)).await;
                    metrics.leading(None);
                    role.send_replace(crate::observe::registration::Role::Standby);
                    standing.send_replace(crate::leader::replicas::Standing { leading: None });
                    match end {
                        LeadEnd::Shutdown => break,
                        LeadEnd::Rotate => {
                            tracing::info!(node = %node_id, fencing_token = leadership.fencing_token, "rotating: giving leadership up and standing back");
                            election.rotate(&leadership, &shutdown).await;
                        }
                        LeadEnd::StepDown(reason) => {
                            tracing::warn!(node = %node_id, fencing_token = leadership.fencing_token, %reason, "stepping down");
                            // Resign first (no lock-delay), then end the lease so that every
                            // task it still holds goes back to the queue.
                            election.step_down(&leadership).await;
                        }
                    }
                }
                Err(ElectionError::Coord(CoordError::Refused(reason))) => {
                    refused = Some(reason);
                    break;
                }
                Err(ElectionError::LeaseLost(session)) => {
                    tracing::warn!(%session, "session lost; creating a new one");
                    election.drop_lease().await;
                }
                Err(ElectionError::Coord(err)) => {
                    metrics.coordinator_error(&err);
                    tracing::warn!(error = %err, retry_in = ?backoff, "coordinator request failed; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(BACKOFF_LAST);
                }
            }
        }
        tracing::info!(node = %node_id, "shutting down: releasing leadership and session");
        election.leave().await;
        observed
            .alive
            .store(false, std::sync::atomic::Ordering::Relaxed);
        stop_renewer.cancel();
        tracker.wait().await;
        if let Some(reason) = refused {
            return Err(ConsumerError::Settings(reason));
        }
        tracing::info!(node = %node_id, "consumer stopped");
        Ok(())
    }
    .instrument(span)
    .await
}
