//! The `[etcd]` section of the settings, beside the backend that reads it, and its checks at
//! start.

use std::time::Duration;

use serde::Deserialize;

use crate::coord::etcd::client;
use crate::util::duration;
use crate::util::tls::TlsFiles;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdSettings {
    pub endpoints: Vec<String>,
    pub user: String,
    pub password: String,
    /// A file holding the password, read again when it is rewritten; wins over `password`.
    pub password_file: String,
    pub ca_file: String,
    pub cert_file: String,
    pub key_file: String,
    pub server_name: String,
    #[serde(deserialize_with = "duration::deserialize")]
    pub wait: Duration,
    #[serde(deserialize_with = "duration::deserialize")]
    pub request_timeout: Duration,
}

impl EtcdSettings {
    /// The section's four TLS keys as one value.
    pub fn tls_files(&self) -> TlsFiles {
        TlsFiles::new(
            &self.ca_file,
            &self.cert_file,
            &self.key_file,
            &self.server_name,
        )
    }

    /// What `[etcd]` must hold, checked at start with the other settings.
    pub fn check(&self) -> Result<(), String> {
        let etcd = self;
        etcd.tls_files().check("etcd")?;
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
