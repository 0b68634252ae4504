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
use crate::coord::{Announcement, CoordError, Leadership, LeaseId, Role};
use crate::handler::Registry;
use crate::leader::identity::{DataDir, IdentityError};
use crate::leader::lifecycle::{Replica, TermEnd, Work};
use crate::observe::{self, Metrics, Observed};
use crate::queue::Queue;

/// Beyond the kill grace, how long a starting replica waits for the handlers of a previous
/// process on its data dir: their supervisors kill them at once when that process dies,
/// so only a stuck kill takes longer.
const PREVIOUS_HANDLERS_SLACK: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
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

/// `consume`'s part of the replica's life: a term drains the queue (`lead_watched`), and a
/// lease taken up from a previous process first puts back the claims that process left.
struct Consume<'a> {
    queue: &'a Queue,
    lease: Arc<crate::leader::Lease>,
    /// The role the service catalog shows (`Coordinator::announce`).
    role: tokio::sync::watch::Sender<Role>,
    /// This replica's record of itself, for `status`.
    standing: tokio::sync::watch::Sender<crate::leader::replicas::Standing>,
    shutdown: &'a CancellationToken,
    /// The shard count the deployment records (one shard: this replica's count).
    moves: super::shards::Moves,
}

impl Work for Consume<'_> {
    async fn taken_up(&mut self, lease: &LeaseId) {
        // Its runs are gone (the previous process's supervisors killed them); a leader
        // would wait on their claims for as long as this replica keeps the lease alive.
        self.queue.release_previous(lease).await;
    }

    async fn may_contend(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Result<Option<CancellationToken>, String> {
        let may = self.moves.wait_for_count(shutdown).await?;
        Ok(may.then(|| shutdown.clone()))
    }

    async fn before_term(&mut self, _leadership: &Leadership) -> Option<TermEnd> {
        (!self.moves.still_recorded().await).then_some(TermEnd::Done { stand_back: true })
    }

    async fn lead(&mut self, leadership: &Leadership) -> (TermEnd, String) {
        let metrics = &self.queue.metrics;
        metrics.leading(Some(leadership.fencing_token));
        self.role.send_replace(Role::Leader);
        self.standing
            .send_replace(crate::leader::replicas::Standing {
                leading: Some(leadership.fencing_token),
                shards: Vec::new(),
            });
        let end = super::term::lead_watched(
            self.queue,
            self.queue.coord.as_ref(),
            leadership,
            &self.lease,
            self.queue.wait,
            self.shutdown,
        )
        .await;
        metrics.leading(None);
        self.role.send_replace(Role::Standby);
        self.standing
            .send_replace(crate::leader::replicas::Standing::default());
        super::term::term_end(end)
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
        let coord = crate::service::connect::connect(&settings)?;
        // A process that ran on this data dir before may have left handlers that its
        // supervisors are still killing: do nothing before they are gone.
        crate::supervise::lock::wait_for_previous_handlers(
            &crate::supervise::lock::lock_file(&settings.data.dir),
            settings.queue.kill_grace + PREVIOUS_HANDLERS_SLACK,
        )
        .await
        .map_err(ConsumerError::PreviousHandlers)?;
        let metrics = Arc::new(Metrics::new(registry.task_types()));
        // One life per shard (one: the queue whole, under the leader key itself), each with
        // its election, lease, data dir and queue.
        let shard_count = settings.election.shards;
        let mut lives = Vec::new();
        for index in 0..shard_count {
            let (own, dir, shard_coord) = if shard_count == 1 {
                (settings.clone(), data_dir.path().to_path_buf(), coord.clone())
            } else {
                let own = super::shards::shard_settings(&settings, index);
                let dir = super::shards::shard_dir(data_dir.path(), index, shard_count).map_err(
                    |err| ConsumerError::Settings(format!("data.dir: cannot make the shard's directory: {err}")),
                )?;
                let shard_coord = crate::service::connect::connect(&own)?;
                (own, dir, shard_coord)
            };
            let replica = Replica::new(
                shard_coord.clone(),
                &own.election,
                &node_id,
                &dir,
                metrics.clone(),
                settings.watch_wait(),
            );
            let queue = Queue {
                coord: shard_coord,
                settings: settings.queue.clone(),
                registry: registry.clone(),
                node_id: node_id.clone(),
                wait: settings.watch_wait(),
                metrics: metrics.clone(),
                rotation: crate::leader::rotation::Rotation::from_settings(&settings.election),
                term: Default::default(),
                lease_rules: crate::queue::LeaseRules::from_settings(&settings),
                sharding: crate::queue::Sharding {
                    shard: (shard_count > 1).then_some(crate::task::shard::Shard {
                        index,
                        count: shard_count,
                    }),
                    handover: None,
                    slots: None,
                },
            };
            lives.push((replica, queue));
        }
        // What the replica shows of itself (health, catalog, record) is its first shard's lease.
        let lease = lives[0].0.election.lease();
        let observed_coord = lives[0].1.coord.clone();
        let task_types: Vec<&str> = registry.task_types().collect();
        tracing::info!(node = %node_id, coordinator = %coord.describe(), prefix = %settings.queue.prefix, ?task_types, "consumer starting");

        let tracker = TaskTracker::new();
        let stop_renewer = CancellationToken::new();
        let observed = Arc::new(Observed {
            metrics: metrics.clone(),
            lease: lease.clone(),
            coord: observed_coord,
            alive: std::sync::atomic::AtomicBool::new(true),
            shards: if shard_count > 1 {
                lives
                    .iter()
                    .map(|(replica, queue)| {
                        let lease: Arc<dyn crate::observe::LeaseView> = replica.election.lease();
                        (queue.coord.clone(), lease)
                    })
                    .collect()
            } else {
                Vec::new()
            },
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
                    crate::ui::UiSettings::from(&settings),
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
        for (replica, _) in &lives {
            replica.renew(settings.election.lease_ttl, &tracker, stop_renewer.clone());
        }
        // In the coordinator's service catalog (Consul's; the others have none) with its
        // role as tag, taken out after `leave` below.
        let (role, role_changes) = tokio::sync::watch::channel(Role::Standby);
        if settings.election.register_service {
            let announced = Announcement {
                node_id: node_id.clone(),
                service_name: settings.election.service_name.clone(),
                address: observe_address,
                lease_ttl: settings.election.lease_ttl,
            };
            if let Some(kept) = coord.announce(announced, role_changes, stop_renewer.clone()) {
                tracker.spawn(kept.in_current_span());
            }
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
                every: settings.election.lease_ttl / 3,
                started_at: crate::task::rfc3339(chrono::Utc::now()),
                shards: shard_count,
            };
            tracker.spawn(
                crate::leader::replicas::keep_present(
                    coord.clone(),
                    me,
                    lease.clone(),
                    standing_changes,
                    stop_renewer.clone(),
                )
                .in_current_span(),
            );
        }
        tracker.close();

        let ended = if shard_count == 1 {
            let (mut replica, queue) = lives.pop().expect("one life per shard");
            let mut work = Consume {
                queue: &queue,
                lease,
                role,
                standing,
                shutdown: &shutdown,
                moves: super::shards::Moves::new(&settings, coord.clone(), &node_id),
            };
            replica.live(&mut work, &shutdown).await
        } else {
            let board = super::shards::Board::new(
                &settings,
                &node_id,
                coord.clone(),
                standing,
                role,
                metrics.clone(),
            );
            super::shards::live_all(lives, &board, &settings, &shutdown).await
        };
        observed
            .alive
            .store(false, std::sync::atomic::Ordering::Relaxed);
        stop_renewer.cancel();
        tracker.wait().await;
        ended.map_err(ConsumerError::Settings)?;
        tracing::info!(node = %node_id, "consumer stopped");
        Ok(())
    }
    .instrument(span)
    .await
}
