//! leaderq: run N replicas of a worker and have exactly one, the elected leader, take work
//! from a task queue kept by a coordinator: Consul (or `leaderq server`), ZooKeeper, Redis
//! or etcd. ARCHITECTURE.md is the map; this list is the short one.
//!
//! - [`task`]: the producers' task format, parsed leniently, the key rule ([`task::key`])
//!   and the history record a completion leaves ([`task::history`]).
//! - [`coord`]: the coordinator seam (lease, leadership with a fencing token, guarded queue
//!   writes, in the domain's words), one folder per backend (`consul`, with its typed HTTP
//!   client [`coord::consul::client`]; `zookeeper`; `redis`; `etcd`; `memory` for tests).
//! - [`leader`]: the lease and the campaign, written once against the seam; the pure gate;
//!   the leader's watch on its own record; the replica's data dir and node id
//!   ([`leader::identity`]); the replicas' records and the leadership timeline.
//! - [`queue`]: the leader's loop over the seam, and its pure plan (what to claim, when to
//!   look or list again).
//! - [`handler`]: the `Handler` trait, the registry, the exec and log handlers.
//! - [`schedule`]: schedules (`every` an interval, or `cron` in a time zone), their
//!   validation and schedule files, the pure tick planner ([`schedule::plan`]) and the
//!   leader's ticker.
//! - [`supervise`]: exec handlers' processes, killed before their lease could end.
//! - [`operate`]: the operator's verbs (`enqueue`, `status`, `tasks`, `pause`, `resume`,
//!   `schedules`) cut by noun, with the text the CLI prints; the dashboard calls them too.
//! - [`service`]: the commands as wiring: `consume`, `run`, `dev`, and `connect`, which
//!   builds the configured coordinator from the settings.
//! - [`observe`]: metrics, /metrics, /health, /ready, /leader and logging.
//! - [`ui`]: the web dashboard at `/ui/` (replicas' observe listener, `leaderq dev`,
//!   `leaderq ui`): panes, live feed, actions behind CSRF and token checks.
//! - [`gateway`]: the producers' front door (`leaderq gateway`): tasks checked as the
//!   leader would, then enqueued on any backend, behind a token of its own.
//! - [`server`]: the embedded, durable, single-node Consul-compatible server.
//! - [`config`]: settings, layered from defaults, a file and the environment.
//! - [`util`]: Go's duration syntax, used everywhere.

pub mod config;

pub mod coord;
pub mod gateway;
pub mod handler;
pub mod leader;
pub mod observe;
pub mod operate;
pub mod progress;
pub mod queue;
pub mod schedule;
pub mod server;
pub mod service;
pub mod supervise;
pub mod task;
pub mod ui;
pub mod util;

#[cfg(test)]
mod tidy;
