//! The `[zookeeper]` section of the settings, beside the backend that reads it, and its
//! checks at start.

use std::time::Duration;

use serde::Deserialize;

use crate::util::duration;
use crate::util::tls::TlsFiles;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZookeeperSettings {
    /// `host:port,host:port[/chroot]`, as ZooKeeper's own clients take it.
    pub connect: String,
    /// The session timeout of the replica's own connection (reads, watches, edits); each
    /// lease's session asks for `election.lease_ttl`.
    #[serde(deserialize_with = "duration::deserialize")]
    pub session_timeout: Duration,
    /// How long one watch may wait before it returns unchanged.
    #[serde(deserialize_with = "duration::deserialize")]
    pub wait: Duration,
    /// `user:password` of ZooKeeper's digest scheme; empty: none.
    pub auth: String,
    /// TLS on the ensemble's secure client port: the CA that signed the servers'
    /// certificates, and the client's own certificate and key (`ssl.clientAuth=need`).
    /// Any of them set turns TLS on.
    pub ca_file: String,
    pub cert_file: String,
    pub key_file: String,
    /// Not supported by ZooKeeper's client here: refused at start, with what to do.
    pub server_name: String,
}

impl ZookeeperSettings {
    /// Checks `[zookeeper]` at start; the message names the key.
    pub fn check(&self) -> Result<(), String> {
        let settings = self;
        if settings.connect.trim().is_empty() {
            return Err(
                "zookeeper.connect is empty: give host:port[,host:port...][/chroot]".into(),
            );
        }
        if let Some((_, root)) = settings.connect.split_once('/') {
            if root.is_empty() || root.ends_with('/') || root.contains("//") {
                return Err(format!(
                    "zookeeper.connect {:?}: the chroot after the first '/' must be a path such as /leaderq, without a trailing '/'",
                    settings.connect
                ));
            }
        }
        if !settings.auth.is_empty() && !settings.auth.contains(':') {
            return Err(
                "zookeeper.auth must be user:password (the digest scheme), or empty".into(),
            );
        }
        if settings.session_timeout.is_zero() || settings.wait.is_zero() {
            return Err("zookeeper.session_timeout and zookeeper.wait must be above 0s".into());
        }
        if !settings.server_name.is_empty() {
            return Err(format!(
                "zookeeper.server_name {:?}: ZooKeeper's client checks each server's certificate against the host named in zookeeper.connect; connect by the name the certificates carry (or add that address to them) and leave server_name empty",
                settings.server_name
            ));
        }
        let tls = settings.tls();
        if tls.is_set() && tls.ca_file.is_empty() {
            return Err("zookeeper.ca_file is empty: TLS to ZooKeeper needs the CA that signed the ensemble's certificates (ssl.trustStore of the servers' own quorum), with zookeeper.cert_file and key_file if the servers ask for a client certificate".into());
        }
        tls.check("zookeeper")
    }

    /// The section's TLS files; any set means TLS on the secure client port.
    pub fn tls(&self) -> TlsFiles {
        TlsFiles::new(&self.ca_file, &self.cert_file, &self.key_file, "")
    }
}
