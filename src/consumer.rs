//! The consumer service (`leaderq consume`): joins the election, leads the queue when it
//! wins, stands by when it does not, and shuts down in order.
//!
//! At start it waits until no handler of a previous process on its data dir is alive
//! (`supervise/lock.rs`). Loop: make sure there is a session, campaign for the leader key,
//! and while leading let `queue.rs` drain the queue. Stepping down destroys the session so
//! nothing it locked stays locked. On shutdown: stop claiming, let the running handler finish within
//! `shutdown_grace`, release the leader key, destroy the session, deregister the check.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Settings;
use crate::consul::{self, Client, ClientConfig};
use crate::election::{Election, ElectionError};
use crate::handler::Registry;
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
    #[error("{0}")]
    PreviousHandlers(String),
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
    let client = Arc::new(client(&settings)?);
    // A process that ran on this data dir before may have left handlers that its
    // supervisors are still killing: do nothing before they are gone.
    crate::supervise::lock::wait_for_previous_handlers(
        &crate::supervise::lock::lock_file(&settings.data.dir),
        settings.queue.kill_grace + PREVIOUS_HANDLERS_SLACK,
    )
    .await
    .map_err(ConsumerError::PreviousHandlers)?;
    let node_id = settings.node_id();
    let mut election = Election::new(
        client.clone(),
        settings.election.clone(),
        node_id.clone(),
        settings.data.dir.clone(),
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
    if settings.observe.enabled {
        let listener = observe::bind(settings.observe.listen)
            .await
            .map_err(ConsumerError::Observe)?;
        let address = listener
            .local_addr()
            .map_err(|e| ConsumerError::Observe(e.to_string()))?;
        tracing::info!(%address, "observe endpoints on http://{address} (/metrics, /health, /ready, /leader)");
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
    tracker.close();

    let mut backoff = BACKOFF_FIRST;
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
                let end = queue.lead(&leadership, &lease, &shutdown).await;
                metrics.leading(None);
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
    tracing::info!(node = %node_id, "consumer stopped");
    Ok(())
}
