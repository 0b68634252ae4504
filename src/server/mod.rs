//! The embedded, single-node, durable Consul-compatible server (`leaderq server`): the API
//! that clients of leaderq's kind use (KV, sessions, blocking queries, `/v1/txn`, agent TTL
//! checks and services, the catalog, health and event reads), with the behaviour
//! `shared/consul-semantics.md` describes. It knows nothing of tasks or leaders.
//!
//! Wiring only: `run` opens the store, restores the state machine, registers the agent's
//! node, starts the writer thread and serves HTTP until shutdown. The rules are in `state`
//! (pure: no I/O, no clock, no HTTP; `now` and ids come in with the command), durability in
//! `store`, the HTTP API in `http` (wire names such as `ModifyIndex` live only there),
//! blocking reads in `watch`, connections (per-client cap, timeouts, shutdown deadline) in
//! `serve`, user events in `events`, the server's own /metrics in `metrics`.
//!
//! The write path: every write goes through one writer thread, which owns the working state.
//! It takes all writes that are waiting (group commit, up to `MAX_BATCH`), applies them with
//! one `now`, persists the changes in one fsync'd commit, and only then publishes the new
//! state as an immutable snapshot (`watch::Committed`), wakes the blocked queries whose reads
//! the commit touched, and answers the clients, in that order. The same thread fires timers
//! (session TTLs, check TTLs, tombstone reaping) at the state's next deadline.
//!
//! What it keeps:
//! - **Acknowledged means durable.** A write is answered only after its commit and after its
//!   snapshot is published, so a client that has its answer reads its write, and after a kill
//!   -9 and restart it is there (session TTLs start afresh, as after a Consul election). If a
//!   commit fails, the working state (ahead of the disk) is never published: the batch is
//!   answered 500 and the server stops.
//! - **Readers never wait and never see ahead of the disk.** A read loads the latest published
//!   snapshot without a lock. A snapshot is immutable: the state is cloned per commit, and
//!   every collection that grows with the data is a persistent `imbl` one, so the clone is
//!   O(1) and later writes copy only the paths they change.
//! - **A blocked query misses no commit that changes its result** (`watch`), and wakes for
//!   nothing else it can tell apart.
//! - **One global index**, raised once per write that changes something (a txn's ops share
//!   it) and persisted with every commit, so it keeps rising across restarts: the Consul
//!   backend's fencing tokens rest on it.
//!
//! Shutdown: blocked queries are released, connections whose request is still arriving are
//! dropped at once, the others get `shutdown_timeout` to finish their requests and are then
//! dropped, and only then is the writer told to stop; it commits what it holds and closes the
//! data file, so a new server can open it at once.

pub mod events;
pub mod http;
pub mod metrics;
pub mod serve;
pub mod state;
pub mod store;
pub mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch as tokio_watch};

pub use serve::Limits;
use state::{ApplyError, Command, Outcome, State};
use store::{Store, StoreError};

/// The datacenter name the server reports, Consul's default.
pub const DATACENTER: &str = "dc1";
/// The Consul API version the server presents itself as in `/v1/agent/self`.
pub const CONSUL_VERSION: &str = "1.21.0";
/// Upper bound on writes committed together, so one batch cannot delay its writers for long.
const MAX_BATCH: usize = 1024;
/// How long the writer sleeps when no timer is pending; any write wakes it earlier.
const IDLE_TICK: Duration = Duration::from_secs(3600);

/// Settings of `leaderq server`.
#[derive(Clone, Debug)]
pub struct Config {
    pub data_dir: PathBuf,
    pub node_name: String,
    pub session_ttl_min: Duration,
    /// Test-only: every commit that writes something takes at least this long, as if the
    /// disk were slow, so tests can show what waits for a commit and what does not. Zero
    /// (the default) in production.
    pub test_commit_delay: Duration,
    /// Connection limits and timeouts; `Limits::default()` is Consul's cap and our timeouts.
    pub limits: Limits,
    /// HTTPS instead of HTTP on the listener, when set (`--cert-file`, `--key-file`,
    /// `--ca-file`, `--verify-incoming`).
    pub tls: Option<Tls>,
}

/// The listener's HTTPS configuration, built again from its files when they are rewritten
/// (a rotated certificate or CA is what the next connection's handshake uses).
pub type Tls = Arc<crate::util::reload::Reloading<Arc<rustls::ServerConfig>>>;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot serve HTTP: {0}")]
    Serve(std::io::Error),
    #[error("storage failed, server stopped so no unacknowledged write is served: {0}")]
    Storage(StoreError),
}

/// Why a write was not applied.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("storage failure: {0}")]
    Storage(String),
    #[error("server is shutting down")]
    Closed,
}

/// What the writer and the readers share.
pub struct Core {
    /// The latest committed state, and the blocked queries waiting for a commit.
    pub state: watch::Committed,
    closing: AtomicBool,
    /// Set by the writer when storage fails; the server then stops serving.
    failed: tokio_watch::Sender<bool>,
    pub metrics: metrics::ServerMetrics,
}

impl Core {
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// Releases every blocked query so that shutdown does not wait minutes for them.
    fn close(&self) {
        self.closing.store(true, Ordering::Relaxed);
        self.state.close();
    }
}

/// Facts about this agent that the HTTP API reports.
#[derive(Clone, Debug)]
pub struct Agent {
    pub node_name: String,
    pub node_id: String,
    pub address: String,
    pub port: u16,
}

/// Handle the HTTP layer uses: reads through `core`, writes through `write`.
pub struct Shared {
    pub core: Arc<Core>,
    pub agent: Agent,
    pub limits: Limits,
    /// The agent's recent user events (in memory, as on one Consul agent).
    pub events: events::Events,
    writes: mpsc::Sender<ToWriter>,
}

impl Shared {
    /// Applies a write and waits until it is durable.
    pub async fn write(&self, command: Command) -> Result<Outcome, WriteError> {
        let (reply, answer) = oneshot::channel();
        self.writes
            .send(ToWriter::Write(Write { command, reply }))
            .map_err(|_| WriteError::Closed)?;
        answer.await.map_err(|_| WriteError::Closed)?
    }
}

struct Write {
    command: Command,
    reply: oneshot::Sender<Result<Outcome, WriteError>>,
}

/// What the writer thread receives: writes, and at the end the order to stop.
// Every message but the last is a Write, so boxing it would only add an allocation per write.
#[allow(clippy::large_enum_variant)]
enum ToWriter {
    Write(Write),
    /// Commit what came before, close the store and end the thread.
    Stop,
}

/// A started server: the state is loaded and the writer runs; HTTP is served by `serve`.
pub struct Server {
    shared: Arc<Shared>,
    writer: std::thread::JoinHandle<Result<(), StoreError>>,
    stop_writer: mpsc::Sender<ToWriter>,
    tls: Option<Tls>,
}

impl Server {
    /// Opens the data dir and starts the writer. Fails, naming the file, if the data dir
    /// cannot be used; it never starts empty over data it could not read.
    pub async fn start(config: &Config, listen: SocketAddr) -> Result<Server, ServerError> {
        if let Some(limit) = serve::raise_open_files_limit() {
            tracing::debug!(limit, "open-files limit");
        }
        let data_dir = config.data_dir.clone();
        let (store, snapshot) = tokio::task::spawn_blocking(move || Store::open(&data_dir))
            .await
            .expect("store open does not panic")?;
        let node_id = snapshot
            .node
            .as_ref()
            .filter(|node| node.name == config.node_name)
            .map(|node| node.id.clone())
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let address = match listen.ip() {
            ip if ip.is_unspecified() => "127.0.0.1".to_string(),
            ip => ip.to_string(),
        };
        let agent = Agent {
            node_name: config.node_name.clone(),
            node_id,
            address,
            port: listen.port(),
        };
        let state = State::restore(
            state::Config {
                session_ttl_min: config.session_ttl_min,
            },
            snapshot,
            Instant::now(),
        );
        let core = Arc::new(Core {
            state: watch::Committed::new(state.clone()),
            closing: AtomicBool::new(false),
            failed: tokio_watch::channel(false).0,
            metrics: metrics::ServerMetrics::default(),
        });
        let (writes, queue) = mpsc::channel();
        let writer_core = core.clone();
        let writer = std::thread::Builder::new()
            .name("leaderq-writer".into())
            .spawn({
                let delay = config.test_commit_delay;
                move || writer_loop(&writer_core, state, &store, &queue, delay)
            })
            .map_err(ServerError::Serve)?;
        let shared = Arc::new(Shared {
            core,
            agent: agent.clone(),
            limits: config.limits.clone(),
            events: events::Events::default(),
            writes: writes.clone(),
        });
        shared
            .write(Command::RegisterNode {
                name: agent.node_name,
                id: agent.node_id,
                address: agent.address,
            })
            .await
            .map_err(|err| {
                ServerError::Storage(StoreError::Write {
                    path: config.data_dir.join(store::DATA_FILE),
                    reason: err.to_string(),
                })
            })?;
        Ok(Server {
            shared,
            writer,
            stop_writer: writes,
            tls: config.tls.clone(),
        })
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Serves the HTTP API on `listener` until `shutdown` resolves or storage fails, then
    /// releases blocked queries, lets in-flight requests finish within the shutdown timeout,
    /// drops the connections left, and stops the writer, which closes the store.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let Server {
            shared,
            writer,
            stop_writer,
            tls,
        } = self;
        let core = shared.core.clone();
        let limits = shared.limits.clone();
        let app = http::router(shared);
        let stop_core = core.clone();
        let mut storage_failed = core.failed.subscribe();
        let stop = async move {
            tokio::select! {
                _ = shutdown => {}
                _ = storage_failed.wait_for(|failed| *failed) => {}
            }
            stop_core.close();
        };
        serve::run(listener, app, limits, tls, stop).await;
        core.close();
        // No connection is left to write; the writer commits what it holds and ends, even if
        // some other holder of `Shared` is still around.
        let _ = stop_writer.send(ToWriter::Stop);
        let stored = tokio::task::spawn_blocking(move || writer.join())
            .await
            .expect("join does not panic")
            .unwrap_or_else(|_| {
                Err(StoreError::Write {
                    path: PathBuf::new(),
                    reason: "writer thread panicked".into(),
                })
            });
        stored.map_err(ServerError::Storage)
    }
}

/// The HTTPS configuration from the server's `--cert-file`, `--key-file`, `--ca-file` and
/// `--verify-incoming` (refusals name the flag); `None` (plain HTTP) without a certificate.
/// The files are read again when rewritten: a configuration that cannot be built from them
/// keeps the last good one, with a warning.
pub fn tls_config(
    files: &crate::util::tls::TlsFiles,
    verify_incoming: bool,
) -> Result<Option<Tls>, String> {
    if files.cert_file.is_empty() && files.key_file.is_empty() {
        if verify_incoming || !files.ca_file.is_empty() {
            return Err("--ca-file and --verify-incoming need --cert-file and --key-file".into());
        }
        return Ok(None);
    }
    let paths = files.paths();
    let files = files.clone();
    let build = move || {
        let flag = |key: &str| format!("--{}", key.replace('_', "-"));
        let material = files.load_as(&flag)?;
        let config = crate::util::tls::server_config(&material, verify_incoming, &flag)?;
        Ok(Arc::new(config))
    };
    Ok(Some(Arc::new(crate::util::reload::Reloading::new(
        paths, build,
    )?)))
}

/// Binds, starts and serves until `shutdown`: what `leaderq server` runs.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let listen = listener.local_addr().map_err(ServerError::Serve)?;
    let server = Server::start(&config, listen).await?;
    server.serve(listener, shutdown).await
}

fn writer_loop(
    core: &Core,
    mut state: State,
    store: &Store,
    queue: &mpsc::Receiver<ToWriter>,
    commit_delay: Duration,
) -> Result<(), StoreError> {
    let mut deadline: Option<Instant> = None;
    let mut stopping = false;
    loop {
        if stopping {
            return Ok(());
        }
        let timeout = deadline
            .map(|at| at.saturating_duration_since(Instant::now()))
            .unwrap_or(IDLE_TICK);
        let mut batch = Vec::new();
        match queue.recv_timeout(timeout) {
            Ok(first) => {
                let mut next = Some(first);
                while let Some(message) = next.take() {
                    match message {
                        ToWriter::Write(write) => batch.push(write),
                        ToWriter::Stop => {
                            stopping = true;
                            break;
                        }
                    }
                    if batch.len() < MAX_BATCH {
                        next = queue.try_recv().ok();
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
        }

        let now = Instant::now();
        state.expire(now);
        let mut answers = Vec::with_capacity(batch.len());
        for write in batch {
            let outcome = state.apply(write.command, now).map_err(WriteError::from);
            answers.push((write.reply, outcome));
        }
        let changes = state.take_changes();
        let commit_started = Instant::now();
        let persisted = store.persist(&state, &changes);
        if !changes.is_empty() && !commit_delay.is_zero() {
            std::thread::sleep(commit_delay);
        }
        if !changes.is_empty() {
            core.metrics
                .commit_seconds
                .observe(commit_started.elapsed().as_secs_f64());
            core.metrics.batch_size.observe(answers.len() as f64);
        }
        deadline = state.next_deadline();

        if let Err(err) = persisted {
            // The working state is now ahead of the disk; it was never published, and
            // nothing is accepted from here on.
            tracing::error!(error = %err, "cannot persist writes; stopping the server");
            for (reply, _) in answers {
                let _ = reply.send(Err(WriteError::Storage(err.to_string())));
            }
            core.failed.send_replace(true);
            return Err(err);
        }
        if !changes.is_empty() {
            // Published before the answers, so a client that reads after its write's answer
            // sees it. The clone shares the state's persistent maps: O(1), not a copy.
            core.state.publish(state.clone(), changes);
        }
        for (reply, outcome) in answers {
            // A client that went away does not need its answer; the write still happened.
            let _ = reply.send(outcome);
        }
    }
}
