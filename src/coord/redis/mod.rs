//! The Redis coordinator: the [`Coordinator`] seam on one Redis (7.0 or later), or the
//! primary Sentinel names, through redis-rs's connection manager (RESP3: pub/sub messages
//! arrive on the same connection, which reconnects and resubscribes by itself;
//! `client/mod.rs`, with the one mapping of Redis's errors). Redis's names stay in this
//! folder. Each part of the seam in its own file: [`Leases`](crate::coord::Leases) in
//! `lease.rs`, [`Elections`](crate::coord::Elections) in `election.rs`,
//! [`Tasks`](crate::coord::Tasks) in `queue.rs`; key layout and version encoding in `layout.rs`, the scripts in
//! `scripts.rs`, the queue's writes as their arguments and their answers read back in
//! `plan.rs` (pure), the reads of tasks in `read.rs`, the rebuild of their index in
//! `index.rs`, waits in `wait.rs`, the `[redis]` section's checks in `settings.rs`, the
//! verdict on Redis's own settings in `durability.rs`. This file holds the type and its
//! constructor. Every operation that writes is one script, and reads of tasks are plain
//! commands, pipelined.
//!
//! In the seam's words:
//! - a lease is a random id's key, a hash `{node, ttl}` with a PX TTL, renewed (with the
//!   leader key if it holds it) and ended only by scripts that check it is still there;
//! - leadership is `SET leader <lease> NX PX <the lease's time left>` in a script that first
//!   checks the lease exists; the holder record keeps `{lease, token, record, version}`;
//!   `observe` waits on the changes channel, the leader key's PTTL and a poll (`wait.rs`);
//! - the queue is a hash per task and one sorted set of their keys; every write of it is
//!   one script (guard, versions, then all writes, one counter bump, one `PUBLISH` of the
//!   prefix its keys share, so that waits on other prefixes sleep on); a set found without
//!   its mark (deleted by hand) is rebuilt from the hashes by the read that finds it
//!   (`index.rs`);
//! - before it opens a lease it reads Redis's persistence and eviction settings, and
//!   refuses one that can lose acknowledged writes unless `redis.accept_data_loss` says so
//!   (`durability.rs`), again at every lease; producers and operators (no lease) are never
//!   refused. Behind Sentinel (`redis.sentinels`) the link follows the primary the
//!   sentinels name (`client/mod.rs`), and with `redis.wait_replicas = N` every write
//!   counts only once `WAIT` says N replicas have it (fewer is `Unavailable`, an answer
//!   lost); without the wait a failover can lose writes whatever the primary's settings, so
//!   a replica then refuses to lead unless the loss is accepted (docs/redis.md, "Redis
//!   behind Sentinel").
//!
//! How it keeps each guarantee of [`crate::coord`]:
//! - **One leader.** `SET … NX` lets one lease hold the key, with the lease's remaining PTTL,
//!   and the keep-alive renews both in one script, so the leader key never outlives its
//!   lease. Redis ends a lease a TTL after the keep-alive *arrived*, never before the holder's
//!   own view (a TTL after it *sent* it). No lock-delay (`Timing::without_takeover_delay`): a
//!   frozen leader is stopped by its own gate and handler supervisor, its writes by the guard.
//! - **Fencing.** The campaign script takes the highest of the stored token + 1, Redis's
//!   `TIME` in milliseconds and the highest token seen + 1, so it rises even when Redis lost
//!   the last one (why each, and its limits: `scripts.rs`, CAMPAIGN). The highest seen is
//!   this coordinator's, or the one the record's floor follows (`HolderRecord::floor`: the
//!   replica's, kept in its data dir), whichever is higher, so it counts after a restart of
//!   the replica too; only a replica that lost its data dir has the clock alone.
//!   Tokens stay at or below `TOKEN_MAX` = 2^53 − 1; a campaign that would pass it is
//!   `Refused`.
//! - **Guarded writes.** A script runs whole with nothing in between: the write script
//!   answers `notleader` unless the leader key names the lease and the holder record the
//!   same lease and token, `conflict` with every failing key, or applies everything.
//! - **Versions.** Every write sets the task's version from one global counter. A lease's
//!   death writes nothing, so it is folded into the version (`2 × counter + 2 + gone`,
//!   `layout.rs`), and a `list`'s version adds one while it shows such a task. A Redis that
//!   lost its data (accepted with `redis.accept_data_loss`) starts the counter again, so
//!   versions repeat; a leader stays safe (the loss ended its lease, and the next leader
//!   writes only versions it read after it), and an operator's edit reads and writes within
//!   one command. A wait from a version the counter no longer reaches (lost, or deleted by
//!   hand) returns at once with the lower one (`wait.rs`), as Consul's clients reset an
//!   index that went backwards.
//! - **No loss.** A claim writes the lease id into the task; when the lease key expires the
//!   task stays and reads as unheld, and the next leader requeues it (`Rewrite` requires no
//!   live holder): orphans are found without any timer.
//!
//! Write limits: 128 operations and 1 MiB of keys and values per script (a script blocks
//! Redis while it runs). Errors: every Redis error is `Unavailable` (a restart, a promoted
//! replica, a busy script, a write fewer replicas confirmed than `redis.wait_replicas`);
//! `Refused` are a bad URL or sentinel address at start, a lease TTL under 1 s, and a Redis
//! that can lose acknowledged writes (unless `redis.accept_data_loss`).

mod client;
mod durability;
mod election;
mod index;
mod layout;
mod lease;
mod plan;
mod queue;
mod read;
mod scripts;
mod settings;
mod wait;

pub use layout::Layout;
pub use lease::TTL_MIN;
pub use scripts::PRODUCE;
pub use settings::{read_password_file, RedisSettings};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use self::client::{bad_answer, unavailable};
use self::layout::Change;
use self::queue::KEYS_PAGE;
use self::scripts::Scripts;
use crate::coord::{CoordError, Coordinator};

/// Messages of the changes channel a waiter may be behind by; further behind, it looks
/// again (as for a message that concerns it).
const CHANGES_HELD: usize = 256;

/// What the Redis coordinator needs, from `[redis]` and `[election]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisCoordSettings {
    /// `redis://[user:password@]host:port/db` or `rediss://` for TLS (unused behind
    /// Sentinel).
    pub url: String,
    /// Overrides the URL's password when not empty; the data nodes' behind Sentinel.
    pub password: String,
    /// Where the password is instead, read again for every connection made again.
    pub password_file: Option<std::path::PathBuf>,
    /// Sentinels' `(host, port)`: when any, the primary is found through them.
    pub sentinels: Vec<(String, u16)>,
    /// The name the sentinels know the primary by.
    pub master_name: String,
    /// The sentinels' own password, when not empty.
    pub sentinel_password: String,
    /// The sentinels are reached over TLS (their `tls-port`), with the TLS files.
    pub sentinel_tls: bool,
    /// Replicas each write waits for (`WAIT`); 0 for none.
    pub wait_replicas: u32,
    /// How long one `WAIT` may take.
    pub wait_replicas_timeout: Duration,
    pub layout: Layout,
    /// Each Redis call's limit (and a connection attempt's).
    pub request_timeout: Duration,
    /// Open leases on a Redis that can lose acknowledged writes (`durability.rs`) rather
    /// than refuse.
    pub accept_data_loss: bool,
    /// TLS files for the data nodes (none set: none, or `rediss://` on the system's roots);
    /// read when a client is made.
    pub tls: crate::util::tls::TlsFiles,
}

/// The Redis backend of the coordinator seam: one per replica.
pub struct RedisCoordinator {
    /// Where connections go: one server, or the primary the sentinels name.
    source: client::Source,
    settings: RedisCoordSettings,
    scripts: Scripts,
    /// Connected (and subscribed to the changes channel) on first use; replaced when the
    /// sentinels name another primary.
    link: client::Link,
    /// Every message on the changes channel, read: waiters it concerns look again.
    changes: broadcast::Sender<Change>,
    /// Messages heard, for tests and logs.
    heard: Arc<AtomicU64>,
    /// The highest fencing token this coordinator has seen (won, observed, or carried by a
    /// guarded write), passed to every campaign as the floor of the next token: it rises
    /// above them even if Redis lost its counter while its clock went back.
    highest_token: AtomicU64,
    /// Whether the risk `accept_data_loss` accepts has been logged.
    warned: AtomicBool,
    /// The task index's rebuilds (`index.rs`): one at a time, each owned.
    rebuilding: index::Rebuilding,
}

/// The Redis backend from its `[redis]` section and the leader key.
pub fn connect(
    redis: &RedisSettings,
    leader_key: &str,
) -> Result<Arc<dyn Coordinator>, CoordError> {
    let coord = RedisCoordinator::new(RedisCoordSettings {
        url: redis.url.clone(),
        password: redis.password.clone(),
        password_file: (!redis.password_file.is_empty())
            .then(|| std::path::PathBuf::from(&redis.password_file)),
        sentinels: redis.sentinel_addrs().map_err(CoordError::Refused)?,
        master_name: redis.master_name.clone(),
        sentinel_password: redis.sentinel_password.clone(),
        sentinel_tls: redis.sentinel_tls,
        wait_replicas: redis.wait_replicas,
        wait_replicas_timeout: redis.wait_replicas_timeout,
        layout: Layout {
            prefix: redis.key_prefix.clone(),
            leader: leader_key.to_string(),
        },
        request_timeout: redis.request_timeout,
        accept_data_loss: redis.accept_data_loss,
        tls: redis.tls(),
    })?;
    Ok(Arc::new(coord))
}

impl RedisCoordinator {
    /// A coordinator on the Redis at `settings.url`, or on the primary the sentinels name;
    /// nothing is asked of Redis before the first call.
    pub fn new(settings: RedisCoordSettings) -> Result<RedisCoordinator, CoordError> {
        let source = client::Source::new(&settings)?;
        let (changes, _) = broadcast::channel(CHANGES_HELD);
        Ok(RedisCoordinator {
            source,
            settings,
            scripts: Scripts::new(),
            link: client::Link::default(),
            changes,
            heard: Arc::new(AtomicU64::new(0)),
            highest_token: AtomicU64::new(0),
            warned: AtomicBool::new(false),
            rebuilding: index::Rebuilding::default(),
        })
    }

    /// `name` under the key prefix.
    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.settings.layout.prefix)
    }

    /// How many messages the changes channel brought so far.
    pub fn messages_heard(&self) -> u64 {
        self.heard.load(Ordering::Relaxed)
    }
}
