//! leaderq: run N replicas of a worker and have exactly one, the elected leader, take work
//! from a task queue in Consul's KV store.
//!
//! - [`server`]: the embedded, durable, single-node Consul-compatible server.
//! - [`consul`]: a typed client for Consul's HTTP API (KV, sessions, txn, agent checks).
//! - [`config`]: settings, layered from defaults, a file and the environment.
//! - [`task`]: the producers' task format, parsed leniently.
//! - [`handler`]: the `Handler` trait, the registry, the exec and log handlers.
//! - [`supervise`]: exec handlers' processes, killed before their lease could end.
//! - [`election`]: sessions, lease and the leader key.
//! - [`queue`]: the leader's claims, completions, retries and dead letters.
//! - [`observe`]: metrics and the /metrics, /health, /ready, /leader endpoints.
//! - [`consumer`]: the service loop that joins them (`leaderq consume`).
//! - [`admin`]: `leaderq enqueue` and `leaderq status`.
//! - [`dev`]: `leaderq dev`, server plus replicas for the quick start.
//! - [`chaos`]: `leaderq chaos`, a failure-injection run of real processes with an audit.
//! - [`bench`]: `leaderq bench`, measurements over real processes and HTTP.

pub mod admin;
pub mod bench;
pub mod chaos;
pub mod config;
pub mod consul;
pub mod consumer;
pub mod dev;
pub mod election;
pub mod handler;
pub mod observe;
pub mod queue;
pub mod server;
pub mod supervise;
pub mod task;
