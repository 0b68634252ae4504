//! The ZooKeeper coordinator: the [`Coordinator`] seam on a ZooKeeper ensemble, through the
//! `zookeeper-client` crate (async, tokio), with the semantics of Apache Curator's
//! LeaderLatch. The tree (below the connect string's chroot, created if missing) is in
//! `layout.rs`. ZooKeeper's names (session, znode, zxid, `multi`) stay in this folder.
//! Each part of the seam in its own file: [`Leases`](crate::coord::Leases) in `lease.rs`,
//! [`Elections`](crate::coord::Elections) in `election.rs`, [`Tasks`](crate::coord::Tasks)
//! in `queue.rs`; the link to the ensemble (sessions, bounded requests, the mapping of its
//! errors) in `client/mod.rs`, the settings in `settings.rs`. This file holds the type and
//! its constructor.
//!
//! In the seam's words:
//! - a lease is one ZooKeeper session on its own connection, timeout = the lease TTL (refused
//!   if the ensemble grants less), id `0x<session id>` (`lease.rs`). It ends when ZooKeeper
//!   expires it (no contact within the timeout: a dead or frozen replica), when it is revoked
//!   (its ephemerals deleted, then closed), or when no keep-alive (`exists /`) came within
//!   its TTL (a replica whose loop hangs, as a Consul session bound to a TTL check). A
//!   keep-alive while disconnected is an error, Curator's SUSPENDED;
//! - leadership is the lowest ephemeral-sequential latch under the election znode; a
//!   campaign creates the lease's latch once and, if it is lowest, rewrites the marker znode
//!   with its record in a `multi` that checks the latch and the marker's version as read;
//!   the fencing token is that write's `mzxid`, or the record's floor if higher. `observe`
//!   syncs, reads the line and the marker, and waits on one watch: a replica in line on its
//!   predecessor, the leader on its own latch, one not in line on the leader's (`election.rs`);
//! - the queue is a znode's children, each task's claim its ephemeral child marker owned by
//!   the claiming session; a task's version is max(`mzxid`, `pzxid`), so the marker's
//!   creation or deletion (also by expiry) moves it. `list` syncs, then reads the children,
//!   and each task with its marker in `multiRead`s of 64 tasks (one request, not one or two
//!   a task), and waits on a persistent recursive watch (`queue.rs`). A write first reads
//!   (behind a `sync`, the same way) the stat and marker of each task it does not know from
//!   this process's own claim; `plan.rs` (pure) turns that and the ops into one `multi`,
//!   and an op whose version moved, a task gone or one claimed by another lease is a
//!   `Conflict` without sending. Why each read that remains is needed, and why the others
//!   are not, is in `queue.rs`.
//!
//! Every read is sent right behind a `sync` on its session: a member serves reads from its
//! own copy, which may lag behind writes acknowledged through another session (a
//! producer's, another lease's); behind a `sync` they see all of them.
//!
//! How it keeps each guarantee of [`crate::coord`]:
//! - **One leader.** Only the lowest latch wins and no lower one can appear (sequences only
//!   grow), so a latch that was lowest leads until deleted: by `resign`, by its session's
//!   end, or by a restart of the same node (`open_lease` with its previous lease deletes that
//!   latch if its record names this node). ZooKeeper counts a session's timeout from the last
//!   request or ping it received, so never before the holder's own view ends. No lock-delay:
//!   the margin is the holder's own TTL (`Timing::without_takeover_delay`).
//! - **Fencing.** The token is max(the marker's `mzxid` after the win's write, the floor in
//!   the record that write put there). zxids only rise, across sessions, ensemble leaders
//!   (the epoch is in the high bits) and restarts; each win, a re-campaign by the holder too,
//!   is a new marker write, so its `mzxid` is above the one before. leaderq never deletes the
//!   marker; one deleted by an operator is made again by the next win, at a higher zxid. Its
//!   version then starts again, so across such a deletion a holder's earlier leadership
//!   could pass the marker check after its own re-campaign (the token still rises, and a
//!   replica uses one leadership at a time). An ensemble whose data was lost starts zxids
//!   again at epoch 1: the floor, above the marker's last token and the highest token the
//!   winning replica has seen, keeps each token above the one before (`election.rs`); only
//!   an ensemble that lost its data while every replica lost its own can make it go back.
//! - **Guarded writes.** `write` is one `multi` whose first two ops check the leader's latch
//!   (exists, version 0) and the marker (at this win's version), sent on the lease's own
//!   session: a session that ended fails it whole, and nothing is sent while its connection
//!   is lost. The latch's name and the marker's version are kept from the win, so the
//!   guard costs no read. A failed guard or a session gone answers `NotLeader`, any other failed op
//!   `Conflict` with its task's key. `write_own` plans without the guard, only for tasks
//!   whose marker this session owns.
//! - **Versions.** Every data write moves `mzxid`, every claim or its end `pzxid`; each op is
//!   checked on `Stat.version` (and the marker's) as read just before.
//! - **No loss.** The claim marker is ephemeral: when the claiming session ends ZooKeeper
//!   deletes it, the task keeps its value, has no holder and a new version, and the next
//!   leader requeues it.
//!
//! Not offered: taking a lease up from a new process. `zookeeper-client` cannot hand a session
//! id and password to a new connection, so a restarted replica opens a new session (its old
//! latch deleted, its old claims freed when the old session expires); the contract runs with
//! `Timing::without_lease_reuse`. Limits: 256 `multi` ops counting the two guard checks, 960
//! KiB (under `jute.maxbuffer`'s 1 MiB). ZooKeeper's errors become [`CoordError`] in one
//! place, `unavailable` (`client/mod.rs`): a request it will never take (bad arguments, an invalid ACL) and a
//! bad connect string are `Refused`, everything else `Unavailable`.

mod client;
mod election;
mod known;
mod layout;
mod lease;
mod plan;
mod queue;
mod settings;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use zookeeper_client as zk;

use crate::coord::{CoordError, Coordinator, LeaseId, WriteLimits};
use crate::util::tls::TlsFiles;

pub use layout::path_of;
pub use settings::ZookeeperSettings;

/// What the ZooKeeper coordinator needs: `[zookeeper]` and the election's znode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZkCoordSettings {
    /// The connect string: `host:port,host:port[/chroot]`.
    pub connect: String,
    /// The session timeout of the coordinator's own connection (reads, watches, edits);
    /// leases ask for their own TTL.
    pub session_timeout: Duration,
    /// The znode leadership is contended under (`election.leader_key`).
    pub leader_key: String,
    /// `user:password` for ZooKeeper's digest scheme, sent on every session; with it every
    /// znode leaderq creates is readable and writable by that user alone. Empty: none, and
    /// znodes are open to anyone.
    pub auth: String,
    /// TLS to the secure client port, when any file is set.
    pub tls: TlsFiles,
}

/// The ZooKeeper backend of the coordinator seam. One per replica; it may hold several
/// leases (tests open more than one), each its own session.
pub struct ZkCoordinator {
    settings: ZkCoordSettings,
    /// The coordinator's own session, opened at the first call and again after it ends.
    main: tokio::sync::Mutex<Option<zk::Client>>,
    leases: Arc<Mutex<HashMap<LeaseId, lease::Held>>>,
    /// Znodes known to exist (queue and dead-letter parents, the election znode).
    made: Mutex<HashSet<String>>,
    /// Each lease's latest leadership and the guard its win left (`known.rs`).
    guards: Mutex<HashMap<LeaseId, known::Guarded>>,
    /// Tasks as this process's own claims left them (`known.rs`).
    claimed: Mutex<HashMap<String, plan::Seen>>,
}

/// The ZooKeeper backend from its `[zookeeper]` section and the leader key.
pub fn connect(
    zookeeper: &ZookeeperSettings,
    leader_key: &str,
) -> Result<Arc<dyn Coordinator>, CoordError> {
    Ok(Arc::new(ZkCoordinator::new(ZkCoordSettings {
        connect: zookeeper.connect.clone(),
        session_timeout: zookeeper.session_timeout,
        leader_key: leader_key.to_string(),
        auth: zookeeper.auth.clone(),
        tls: zookeeper.tls(),
    })))
}

/// One `multi`, at most: operations (ZooKeeper has no count limit; this keeps one request's
/// work on the leader bounded, yet holds a full batch: 32 claims of 2 ops each, plus the
/// 32 completions riding along, 3 ops each with history on, plus the 2 guard checks, is
/// 162; at 128 a batch took two `multi`s, each a quorum write) and bytes (below
/// `jute.maxbuffer`'s default of 1 MiB, which bounds a request packet, with room for the
/// chroot and framing).
const LIMITS: WriteLimits = WriteLimits {
    max_ops: 256,
    max_bytes: 960 * 1024,
};

/// The longest latch znode name (a 16-digit session, a 10-digit sequence): what a guard's
/// cost is counted with.
const LONGEST_LATCH: &str = "latch-ffffffffffffffff-0000000000";

impl ZkCoordinator {
    /// A coordinator on the ensemble of `settings`; nothing is asked of it before the first
    /// call.
    pub fn new(settings: ZkCoordSettings) -> ZkCoordinator {
        ZkCoordinator {
            settings,
            main: tokio::sync::Mutex::new(None),
            leases: Arc::new(Mutex::new(HashMap::new())),
            made: Mutex::new(HashSet::new()),
            guards: Mutex::new(HashMap::new()),
            claimed: Mutex::new(HashMap::new()),
        }
    }

    /// Never held across an await.
    fn leases(&self) -> MutexGuard<'_, HashMap<LeaseId, lease::Held>> {
        self.leases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::client::split_connect;
    use crate::config::{Backend, Settings};

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The backend and its connect string come from the environment; a connect string's
    /// commas are the servers', not a list's.
    #[test]
    fn zookeeper_settings_come_from_the_environment() {
        let settings = Settings::load(
            None,
            env(&[
                ("LEADERQ__COORDINATOR__BACKEND", "zookeeper"),
                ("LEADERQ__ZOOKEEPER__CONNECT", "zk1:2181,zk2:2181/leaderq"),
                ("LEADERQ__ZOOKEEPER__AUTH", "app:secret"),
            ]),
        )
        .expect("valid settings");
        assert_eq!(settings.coordinator.backend, Backend::Zookeeper);
        assert_eq!(settings.zookeeper.connect, "zk1:2181,zk2:2181/leaderq");
        assert_eq!(settings.zookeeper.auth, "app:secret");
        assert_eq!(settings.watch_wait(), settings.zookeeper.wait);
        assert_eq!(
            split_connect(&settings.zookeeper.connect),
            ("zk1:2181,zk2:2181", Some("/leaderq"))
        );
    }

    /// An empty connect string, a chroot with a trailing '/' and an auth without a password
    /// stop the start, naming the key.
    #[test]
    fn bad_zookeeper_settings_name_the_key() {
        for (key, value) in [
            ("LEADERQ__ZOOKEEPER__CONNECT", ""),
            ("LEADERQ__ZOOKEEPER__CONNECT", "zk1:2181/leaderq/"),
            ("LEADERQ__ZOOKEEPER__CONNECT", "zk1:2181/"),
            ("LEADERQ__ZOOKEEPER__AUTH", "nopassword"),
            ("LEADERQ__ZOOKEEPER__WAIT", "0s"),
        ] {
            let err = Settings::load(None, env(&[(key, value)]))
                .expect_err(&format!("{key}={value:?} accepted"))
                .to_string();
            let named = key
                .trim_start_matches("LEADERQ__")
                .replace("__", ".")
                .to_lowercase();
            assert!(err.contains(&named), "{key}={value:?}: {err}");
        }
    }
}
