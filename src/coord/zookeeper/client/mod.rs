//! The ZooKeeper coordinator's link to the ensemble, through `zookeeper-client`: its own
//! session (opened on first use, and again once it ended), a session of a given timeout
//! rooted at the connect string's chroot (created if missing), the znodes it makes once,
//! their ACL, every request bounded in time, reads behind a `sync`, and the one mapping of
//! ZooKeeper's errors to the seam's.

use std::collections::HashSet;
use std::sync::MutexGuard;
use std::time::Duration;

use zookeeper_client as zk;

use super::ZkCoordinator;
use crate::coord::CoordError;

mod tls;

/// Marks (among the znodes made) that a TLS handshake with the ensemble was seen to work.
const TLS_CHECKED: &str = "tls handshake";

/// How long one request may take before the ensemble counts as unreachable for it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a session's connection may stay silent (or take to answer a handshake) before
/// `zookeeper-client` takes it for lost and connects again: 3/5 of the session's timeout,
/// the most the client honours (without one it takes 2/5). Answers `L` late leave a
/// connection silent for `L` plus however long it was idle before. A lease's watchdog keeps
/// its connection from being idle for more than an eighth of this (`lease.rs`, `beat`), so
/// it takes a latency of 0.525 × TTL to break it, above the latency a lease's runs are
/// promised to bear. The coordinator's own connection has only the client's pings (sent
/// once it was idle for 3/8 of this): latency rising by more than 0.3 × its session timeout
/// at once breaks it for a moment, and the reads and watches on it fail and are asked
/// again; no run depends on them.
pub(super) fn silence_limit(session_timeout: Duration) -> Duration {
    session_timeout * 3 / 5
}

impl ZkCoordinator {
    /// The coordinator's own session: the one open, or a new one if it ended.
    pub(super) async fn main(&self) -> Result<zk::Client, CoordError> {
        let mut main = self.main.lock().await;
        if let Some(client) = main.as_ref().filter(|c| !c.state().is_terminated()) {
            return Ok(client.clone());
        }
        let client = self.open_session(self.settings.session_timeout).await?;
        *main = Some(client.clone());
        Ok(client)
    }

    /// A new session with `timeout` on the connect string's servers, rooted at its chroot
    /// (created first if missing, as Curator does with a namespace).
    pub(super) async fn open_session(&self, timeout: Duration) -> Result<zk::Client, CoordError> {
        let (servers, root) = split_connect(&self.settings.connect);
        let mut connector = zk::Client::connector()
            .with_session_timeout(timeout)
            .with_connection_timeout(silence_limit(timeout));
        if !self.settings.auth.is_empty() {
            connector = connector.with_auth("digest", self.settings.auth.as_bytes());
        }
        if self.settings.tls.is_set() {
            connector = connector.with_tls(self.tls_options(servers).await?);
        }
        let secure = self.settings.tls.is_set();
        let connecting = async move {
            match secure {
                true => connector.secure_connect(servers).await,
                false => connector.connect(servers).await,
            }
        };
        let client = match tokio::time::timeout(REQUEST_TIMEOUT.max(timeout), connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(zk::Error::BadArguments(why))) => {
                return Err(CoordError::Refused(format!(
                    "zookeeper.connect {:?}: {why}: fix the [zookeeper] settings",
                    self.settings.connect
                )))
            }
            Ok(Err(err)) => return Err(unavailable(err)),
            Err(_) => {
                return Err(CoordError::Unavailable(format!(
                    "no ZooKeeper server of {} answered",
                    self.settings.connect
                )))
            }
        };
        let Some(root) = root else {
            return Ok(client);
        };
        let made = format!("chroot {root}");
        if !self.made().contains(&made) {
            let options = zk::CreateMode::Persistent.with_acls(self.acls());
            match timed(client.mkdir(root, &options)).await {
                Ok(()) | Err(zk::Error::NodeExists) => {
                    self.made().insert(made);
                }
                Err(err) => return Err(unavailable(err)),
            }
        }
        client.chroot(root.to_string()).map_err(|_| {
            CoordError::Refused(format!(
                "zookeeper.connect {:?}: the chroot is not a path: fix the [zookeeper] settings",
                self.settings.connect
            ))
        })
    }

    /// The TLS options of a new session, from the files as they are now (a rotated
    /// certificate is used from the next session on). Before the first, one handshake of
    /// leaderq's own tells a refused certificate from an ensemble that does not answer.
    async fn tls_options(&self, servers: &str) -> Result<zk::TlsOptions, CoordError> {
        let material = self
            .settings
            .tls
            .load("zookeeper")
            .map_err(CoordError::Refused)?;
        if !self.made().contains(TLS_CHECKED) {
            tls::check_handshake(&material, servers).await?;
            self.made().insert(TLS_CHECKED.to_string());
        }
        tls::options(&material)
    }

    /// Makes `path` and its ancestors exist (persistent, open ACL), once per coordinator.
    pub(super) async fn make_dir(&self, client: &zk::Client, path: &str) -> Result<(), CoordError> {
        if path == "/" || self.made().contains(path) {
            return Ok(());
        }
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        match timed(client.mkdir(path, &options)).await {
            Ok(()) | Err(zk::Error::NodeExists) => {
                self.made().insert(path.to_string());
                Ok(())
            }
            Err(err) => Err(unavailable(err)),
        }
    }

    /// The ACL of every znode leaderq creates: its digest user's alone with `auth`, else
    /// anyone's.
    pub(super) fn acls(&self) -> zk::Acls<'static> {
        if self.settings.auth.is_empty() {
            zk::Acls::anyone_all()
        } else {
            zk::Acls::creator_all()
        }
    }

    pub(super) fn made(&self) -> MutexGuard<'_, HashSet<String>> {
        self.made
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The length the chroot adds to every path a request carries.
    pub(super) fn root_len(&self) -> usize {
        split_connect(&self.settings.connect).1.map_or(0, str::len)
    }
}

/// The servers of a connect string and its chroot (`/leaderq` of `a:1,b:2/leaderq`).
pub(super) fn split_connect(connect: &str) -> (&str, Option<&str>) {
    match connect.find('/') {
        Some(at) => (&connect[..at], Some(&connect[at..])),
        None => (connect, None),
    }
}

/// Bounds a request in time: a request to an ensemble that does not answer fails as
/// [`zk::Error::Timeout`] instead of waiting for the reconnection.
pub(super) async fn timed<T>(
    request: impl std::future::Future<Output = Result<T, zk::Error>>,
) -> Result<T, zk::Error> {
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .unwrap_or(Err(zk::Error::Timeout))
}

/// The children of `path`, read after a `sync` on the same session, so that they include
/// every write acknowledged before, whichever session made it.
pub(super) async fn children_synced(
    client: &zk::Client,
    path: &str,
) -> Result<Vec<String>, zk::Error> {
    let synced = timed(client.sync("/"));
    let children = timed(client.list_children(path));
    synced.await?;
    children.await
}

/// Commits a `multi`, bounded in time as [`timed`] bounds a request.
pub(super) async fn commit(
    multi: &mut zk::MultiWriter<'_>,
) -> Result<Vec<zk::MultiWriteResult>, zk::MultiWriteError> {
    tokio::time::timeout(REQUEST_TIMEOUT, multi.commit())
        .await
        .unwrap_or(Err(zk::MultiWriteError::RequestFailed {
            source: zk::Error::Timeout,
        }))
}

/// The one place where ZooKeeper's errors become the seam's, for every error a caller does
/// not branch on itself: all may pass (a lost connection, a member down, an election in
/// the ensemble, an ACL an operator is fixing) except a request ZooKeeper will never take.
pub(crate) fn unavailable(err: zk::Error) -> CoordError {
    match err {
        zk::Error::BadArguments(_) | zk::Error::InvalidAcl | zk::Error::MarshallingError => {
            CoordError::Refused(format!(
                "ZooKeeper refused the request: {err}; check the keys and the [zookeeper] settings"
            ))
        }
        zk::Error::NoAuth | zk::Error::AuthFailed => CoordError::Unavailable(format!(
            "ZooKeeper: {err}: set zookeeper.auth to a user the znodes' ACLs allow"
        )),
        other => CoordError::Unavailable(format!("ZooKeeper: {other}")),
    }
}
