//! The `[consul]` section of the settings, beside the backend that reads it, and its checks
//! at start.

use std::time::Duration;

use serde::Deserialize;

use crate::coord::consul::client::parse_address;
use crate::util::duration;
use crate::util::tls::TlsFiles;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsulSettings {
    pub addresses: Vec<String>,
    pub token: String,
    /// A file holding the ACL token, read again when it is rewritten; wins over `token`.
    pub token_file: String,
    pub ca_file: String,
    pub cert_file: String,
    pub key_file: String,
    pub server_name: String,
    #[serde(deserialize_with = "duration::deserialize")]
    pub wait: Duration,
    #[serde(deserialize_with = "duration::deserialize")]
    pub request_timeout: Duration,
    /// Operations in one transaction: 128 (Consul 1.6 and later), 64 for older servers.
    pub txn_max_ops: usize,
}

impl ConsulSettings {
    /// The section's four TLS keys as one value.
    pub fn tls_files(&self) -> TlsFiles {
        TlsFiles::new(
            &self.ca_file,
            &self.cert_file,
            &self.key_file,
            &self.server_name,
        )
    }

    /// The section's own checks; the message names the key.
    pub fn check(&self) -> Result<(), String> {
        self.tls_files().check("consul")?;
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
