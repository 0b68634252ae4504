//! The `[etcd]` section of the settings, beside the backend that reads it, and its checks at
//! start.

use std::time::Duration;

use serde::Deserialize;

use crate::coord::etcd::client;
use crate::util::duration;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdSettings {
    pub endpoints: Vec<String>,
    pub user: String,
    pub password: String,
    pub ca_file: String,
    #[serde(deserialize_with = "duration::deserialize")]
    pub wait: Duration,
    #[serde(deserialize_with = "duration::deserialize")]
    pub request_timeout: Duration,
}

impl EtcdSettings {
    /// What `[etcd]` must hold, checked at start with the other settings.
    pub fn check(&self) -> Result<(), String> {
        let etcd = self;
        if etcd.endpoints.is_empty() {
            return Err("etcd.endpoints is empty: give at least one etcd endpoint".into());
        }
        for endpoint in &etcd.endpoints {
            client::parse_endpoint(endpoint)
                .map_err(|reason| format!("etcd.endpoints: {reason}"))?;
        }
        if etcd.wait.is_zero() || etcd.request_timeout.is_zero() {
            return Err("etcd.wait and etcd.request_timeout must be more than 0s".into());
        }
        Ok(())
    }
}
