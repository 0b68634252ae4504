//! leaderq: run N replicas of a worker and have exactly one, the elected leader, take work
//! from a task queue in Consul's KV store.
//!
//! - [`server`]: the embedded, durable, single-node Consul-compatible server.
//! - [`consul`]: a typed client for Consul's HTTP API (KV, sessions, txn, agent checks).
//! - [`config`]: settings, layered from defaults, a file and the environment.
//! - [`bench`]: `leaderq bench`, measurements over real processes and HTTP.

pub mod bench;
pub mod config;
pub mod consul;
pub mod handler;
pub mod server;
pub mod task;
