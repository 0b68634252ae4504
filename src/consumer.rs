//! The consumer service (`leaderq consume`): joins the election, leads the queue when it
//! wins, stands by when it does not, and shuts down in order.
//!
//! Start: refuse settings that can never work (no handler at all, an exec handler whose
//! program cannot run), lock the data dir and take the node id (`identity.rs`), remove
//! checks older versions left behind; a session TTL the server refuses stops it too.
//!
//! Then it waits until no handler of a previous process on its data dir is alive
//! (`supervise/lock.rs`).
//!
//! Loop: make sure there is a session, campaign for the leader key, and while leading let
//! `queue.rs` drain the queue. Stepping down destroys the session so nothing it locked stays
//! locked. On shutdown: stop claiming, let the running handler finish within
//! `shutdown_grace`, release the leader key, destroy the session, deregister the check.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Settings;
use crate::consul::{self, Client, ClientConfig};
use crate::election::{Election, ElectionError};
use crate::handler::Registry;
use crate::identity::{DataDir, IdentityError};
use crate::observe::{self, Metrics, Observed};
use crate::queue::{LeadEnd, Queue};

/// Beyond the kill grace, how long a starting replica waits for the handlers of a previous
/// process on its data dir: their supervisors kill them at once when that process dies,
/// so only a stuck kill takes longer.
const PREVIOUS_HANDLERS_SLACK: Duration = Duration::from_secs(5);

/// Back-off while Consul cannot be reached: doubles from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_LAST: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error(transparent)]
    Consul(#[from] consul::Error),
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

pub fn client(settings: &Settings) -> Result<Client, consul::Error> {
    Client::new(&ClientConfig {
        addresses: settings.consul.addresses.clone(),
        token: settings.consul.token.clone(),
        ca_file: settings.consul.ca_file.clone(),
        request_timeout: settings.consul.request_timeout,
    })
}

/// Runs one replica until `shutdown` is cancelled.
pub async fn run(
    settings: Settings,
    registry: Registry,
    shutdown: CancellationToken,
) -> Result<(), ConsumerError> {
    check_handlers(&settings, &registry, std::env::var_os("PATH").as_deref())
        .map_err(ConsumerError::Settings)?;
    // Held until this function returns: the dir's session and node id are this replica's.
    let data_dir = DataDir::lock(&settings.data.dir)?;
    let node_id = data_dir.node_id(&settings.election.node_id)?;
    let client = Arc::new(client(&settings)?);
    // A process that ran on this data dir before may have left handlers that its
    // supervisors are still killing: do nothing before they are gone.
    crate::supervise::lock::wait_for_previous_handlers(
        &crate::supervise::lock::lock_file(&settings.data.dir),
        settings.queue.kill_grace + PREVIOUS_HANDLERS_SLACK,
    )
    .await
    .map_err(ConsumerError::PreviousHandlers)?;
    let mut election = Election::new(
        client.clone(),
        settings.election.clone(),
        node_id.clone(),
        data_dir.path().to_path_buf(),
    );
    let metrics = Arc::new(Metrics::new(registry.task_types()));
    let queue = Queue {
        client: client.clone(),
        settings: settings.queue.clone(),
        registry: registry.clone(),
        leader_key: settings.election.leader_key.clone(),
        node_id: node_id.clone(),
        wait: settings.consul.wait,
        metrics: metrics.clone(),
    };
    let task_types: Vec<&str> = registry.task_types().collect();
    tracing::info!(node = %node_id, consul = %client.address(), prefix = %settings.queue.prefix, ?task_types, "consumer starting");

    let tracker = TaskTracker::new();
    let stop_renewer = CancellationToken::new();
    let observed = Arc::new(Observed {
        metrics: metrics.clone(),
        lease: election.lease(),
        client: client.clone(),
        leader_key: settings.election.leader_key.clone(),
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
        tracing::info!(%address, "observe endpoints on http://{address} (/metrics, /health, /ready, /leader)");
        observe_address = Some(address);
        let app = observe::router(observed.clone());
        let stop = stop_renewer.clone();
        tracker.spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
            if let Err(err) = served {
                tracing::warn!(error = %err, "observe endpoints stopped");
            }
        });
    }
    tracker.spawn(Election::renew_until(
        client.clone(),
        election.lease(),
        settings.election.clone(),
        election.check_id().to_string(),
        metrics.clone(),
        stop_renewer.clone(),
    ));
    // In the service catalog with its role as tag, deregistered after `resign` below.
    let (role, role_changes) = tokio::sync::watch::channel(crate::registration::Role::Standby);
    if settings.election.register_service {
        let check = settings.election.health_check.then(|| election.check_id());
        let registration = crate::registration::registration(
            &settings.election,
            &node_id,
            observe_address,
            check,
            crate::registration::Role::Standby,
        );
        tracker.spawn(crate::registration::keep_registered(
            client.clone(),
            registration,
            role_changes,
            settings.election.session_ttl / 3,
            stop_renewer.clone(),
        ));
    }
    tracker.close();
    election.remove_stale_checks().await;

    let mut backoff = BACKOFF_FIRST;
    let mut refused = None;
    loop {
        if shutdown.is_cancelled() {
            break;
        }
        match election.campaign(settings.consul.wait, &shutdown).await {
            Ok(None) => break,
            Ok(Some(leadership)) => {
                backoff = BACKOFF_FIRST;
                tracing::info!(node = %node_id, session = %leadership.session, fencing_token = leadership.fencing_token, "became leader");
                let lease = election.lease();
                metrics.leading(Some(leadership.fencing_token));
                role.send_replace(crate::registration::Role::Leader);
                let end = queue.lead(&leadership, &lease, &shutdown).await;
                metrics.leading(None);
                role.send_replace(crate::registration::Role::Standby);
                match end {
                    LeadEnd::Shutdown => break,
                    LeadEnd::StepDown(reason) => {
                        tracing::warn!(node = %node_id, fencing_token = leadership.fencing_token, %reason, "stepping down");
                        // Release first (no lock-delay), then end the session so that every
                        // task it still locks goes back to the queue.
                        let _ = election.release(&leadership.session).await;
                        election.drop_session().await;
                    }
                }
            }
            Err(ElectionError::Refused(reason)) => {
                refused = Some(reason);
                break;
            }
            Err(ElectionError::SessionLost(session)) => {
                tracing::warn!(%session, "session lost; creating a new one");
                election.drop_session().await;
            }
            Err(ElectionError::Consul(err)) => {
                metrics.consul_error(&err);
                tracing::warn!(error = %err, retry_in = ?backoff, "Consul request failed; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(BACKOFF_LAST);
            }
        }
    }
    tracing::info!(node = %node_id, "shutting down: releasing leadership and session");
    election.resign().await;
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
