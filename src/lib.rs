//! leaderq: run N replicas of a worker and have exactly one, the elected leader, take work
//! from a task queue in Consul's KV store.
//!
//! - [`bench`]: `leaderq bench`, measurements over real processes and HTTP.
//! - [`server`]: the embedded, durable, single-node Consul-compatible server.

pub mod bench;
pub mod server;
