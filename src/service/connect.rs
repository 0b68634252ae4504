//! The composition root of the coordinators: the settings name a backend, and this builds
//! it from that backend's own section (`coord/<backend>/settings.rs`) and the election's
//! leader key. The one place that knows both the settings file and every backend, so that
//! nothing under `coord/` reads `crate::config`.

use std::sync::Arc;

use crate::config::{Backend, Settings};
use crate::coord::{consul, etcd, redis, zookeeper, CoordError, Coordinator};

/// The coordinator `coordinator.backend` names, from its section of `settings`; nothing is
/// asked of its server before the first call.
pub fn connect(settings: &Settings) -> Result<Arc<dyn Coordinator>, CoordError> {
    crate::util::tls::install_provider();
    let leader_key = &settings.election.leader_key;
    match settings.coordinator.backend {
        Backend::Consul => {
            // A split queue's shards after the first bind their sessions to checks of their
            // own (`ConsulCoordSettings::check_suffix`).
            let suffix = match settings.election.shard {
                Some(index) if index > 0 => format!("-shard-{index}"),
                _ => String::new(),
            };
            let health_check = settings.election.health_check;
            consul::connect(&settings.consul, leader_key, health_check, &suffix)
        }
        Backend::Etcd => etcd::connect(&settings.etcd, leader_key),
        Backend::Zookeeper => zookeeper::connect(&settings.zookeeper, leader_key),
        Backend::Redis => redis::connect(&settings.redis, leader_key),
    }
}
