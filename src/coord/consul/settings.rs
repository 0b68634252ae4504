//! The `[consul]` section of the settings, beside the backend that reads it, and its checks
//! at start.

use std::time::Duration;

use serde::Deserialize;

use crate::coord::consul::client::parse_address;
use crate::util::duration;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsulSettings {
    pub addresses: Vec<String>,
    pub token: String,
    pub ca_file: String,
    #[serde(deserialize_with = "duration::deserialize")]
    pub wait: Duration,
    #[serde(deserialize_with = "duration::deserialize")]
    pub request_timeout: Duration,
    /// Operations in one transaction: 128 (Consul 1.6 and later), 64 for older servers.
    pub txn_max_ops: usize,
}

impl ConsulSettings {
    /// The section's own checks; the message names the key.
    pub fn check(&self) -> Result<(), String> {
        if self.addresses.is_empty() {
            return Err("consul.addresses is empty: give at least one Consul address".into());
        }
        for address in &self.addresses {
            parse_address(address).map_err(|reason| format!("consul.addresses: {reason}"))?;
        }
        if !(64..=128).contains(&self.txn_max_ops) {
            return Err(format!(
                "consul.txn_max_ops must be between 64 and 128 (Consul accepts 128 operations in a transaction since 1.6, 64 before), not {}",
                self.txn_max_ops
            ));
        }
        Ok(())
    }
}
