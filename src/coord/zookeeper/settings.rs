//! The `[zookeeper]` section of the settings, beside the backend that reads it, and its
//! checks at start.

use std::time::Duration;

use serde::Deserialize;

use crate::util::duration;

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
        Ok(())
    }
}
