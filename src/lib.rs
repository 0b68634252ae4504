//! leaderq: run N replicas of a worker and have exactly one, the elected leader, take work
//! from a task queue in Consul's KV store.
//!
//! - [`server`]: the embedded, durable, single-node Consul-compatible server.
//! - [`consul`]: a typed client for Consul's HTTP API (KV, sessions, txn, agent checks and
//!   services).
//! - [`coord`]: the coordinator seam: lease, leadership and queue in the domain's words.
//! - [`config`]: settings, layered from defaults, a file and the environment.
//! - [`task`]: the producers' task format, parsed leniently.
//! - [`key`]: the key rule, and keys proven to lie under a configured prefix.
//! - [`handler`]: the `Handler` trait, the registry, the exec and log handlers.
//! - [`identity`]: the replica's hold on its data dir and its stable node id.
//! - [`supervise`]: exec handlers' processes, killed before their lease could end.
//! - [`leader`]: the lease and the campaign, on any coordinator; the pure gate.
//! - [`election`]: sessions, lease and the leader key.
//! - [`queue`]: the leader's claims, completions, retries and dead letters.
//! - [`observe`]: metrics and the /metrics, /health, /ready, /leader endpoints.
//! - [`registration`]: the replica in the agent's service catalog, tagged with its role.
//! - [`consumer`]: the service loop that joins them (`leaderq consume`).
//! - [`admin`]: `leaderq enqueue`, `leaderq status` and `leaderq tasks`.
//! - [`dev`]: `leaderq dev`, server plus replicas for the quick start.
//! - [`chaos`]: `leaderq chaos`, a failure-injection run of real processes with an audit.
//! - [`bench`]: `leaderq bench`, measurements over real processes and HTTP.
//! - [`util`]: Go's duration syntax, used everywhere.
//! - [`logging`]: the log subscriber, and the escaping that keeps one event on one line.

pub mod admin;
pub mod bench;
pub mod chaos;
pub mod config;
pub mod consul;
pub mod consumer;
pub mod coord;
pub mod dev;
pub mod handler;
pub mod identity;
pub mod key;
pub mod leader;
pub mod logging;
pub mod observe;
pub mod queue;
pub mod registration;
pub mod server;
pub mod supervise;
pub mod task;
pub mod util;
