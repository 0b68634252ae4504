//! The Redis coordinator: the [`Coordinator`] seam on one Redis (7.0 or later), through
//! redis-rs's connection manager (RESP3: pub/sub messages arrive on the same connection,
//! which reconnects and resubscribes by itself). Redis's names stay in this folder: key
//! layout and version encoding in `layout.rs`, the scripts in `scripts.rs`, the reads of
//! tasks in `read.rs`, the rebuild of their index in `index.rs`, waits in `wait.rs`, the
//! `[redis]` section's checks in `settings.rs`, the verdict on Redis's own settings in
//! `durability.rs`.
//! Every operation that writes is one script, and reads of tasks are plain commands,
//! pipelined, so [`Leases`], [`Elections`] and [`Tasks`] are all implemented at the end of
//! this file, each a few lines around its script or read.
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
//!   refused. Asynchronous replication is not seen: a failover can lose writes whatever the
//!   primary's settings (docs/redis.md, "Replication and failover").
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
//! replica, a busy script); `Refused` are a bad URL at start, a lease TTL under 1 s, and a
//! Redis that can lose acknowledged writes (unless `redis.accept_data_loss`).

mod durability;
mod index;
mod layout;
mod read;
mod scripts;
mod settings;
mod wait;

pub use layout::Layout;
pub use scripts::PRODUCE;
pub use settings::RedisSettings;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, ProtocolVersion};
use tokio::sync::{broadcast, OnceCell};

use self::layout::{
    change_of, holder_row, number, scope, text, text_in, Change, HolderRow, INDEXED, TOKEN_MAX,
};
use self::scripts::{edit_args, invoke, op_args, Scripts};
use self::wait::{ReadHolder, ReadTasks};
use crate::coord::{
    Campaign, CoordError, Coordinator, Edit, Edited, Elections, FencingToken, Grant, Holder,
    HolderRecord, Leadership, LeaseId, LeaseSpec, Leases, Names, Renewal, StoredTask, TaskOp,
    TaskVersion, Tasks, Version, WriteCost, WriteLimits, Written,
};

/// The longest pause between attempts to connect again: redis-rs doubles it without a
/// ceiling, and a link back from a burst of resets stayed unused until the lease ended.
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(250);

/// Leases shorter than this are refused: a keep-alive every third of it must get through.
pub const TTL_MIN: Duration = Duration::from_secs(1);

/// Messages of the changes channel a waiter may be behind by; further behind, it looks
/// again (as for a message that concerns it).
const CHANGES_HELD: usize = 256;

/// Keys per page of a look, and of a listing: the reply of a page is held in full while it
/// is packed (tens of bytes a key; a listing reads the page's tasks a part at a time).
const KEYS_PAGE: usize = 4096;

/// One write: the ops Redis runs in one script, and the bytes of keys and values it
/// carries (a script blocks Redis while it runs: keep each short).
const LIMITS: WriteLimits = WriteLimits {
    max_ops: 128,
    max_bytes: 1024 * 1024,
};

/// What the Redis coordinator needs, from `[redis]` and `[election]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisCoordSettings {
    /// `redis://[user:password@]host:port/db` or `rediss://` for TLS.
    pub url: String,
    /// Overrides the URL's password when not empty.
    pub password: String,
    pub layout: Layout,
    /// Each Redis call's limit (and a connection attempt's).
    pub request_timeout: Duration,
    /// Open leases on a Redis that can lose acknowledged writes (`durability.rs`) rather
    /// than refuse.
    pub accept_data_loss: bool,
}

/// The Redis backend of the coordinator seam: one per replica.
pub struct RedisCoordinator {
    client: redis::Client,
    settings: RedisCoordSettings,
    scripts: Scripts,
    /// Connected (and subscribed to the changes channel) on first use.
    manager: OnceCell<ConnectionManager>,
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
    /// Held while the task index is rebuilt (`index.rs`): one rebuild at a time.
    rebuilding: Arc<tokio::sync::Mutex<()>>,
}

/// The Redis backend from its `[redis]` section and the leader key.
pub fn connect(
    redis: &RedisSettings,
    leader_key: &str,
) -> Result<Arc<dyn Coordinator>, CoordError> {
    let coord = RedisCoordinator::new(RedisCoordSettings {
        url: redis.url.clone(),
        password: redis.password.clone(),
        layout: Layout {
            prefix: redis.key_prefix.clone(),
            leader: leader_key.to_string(),
        },
        request_timeout: redis.request_timeout,
        accept_data_loss: redis.accept_data_loss,
    })?;
    Ok(Arc::new(coord))
}

impl RedisCoordinator {
    /// A coordinator on the Redis at `settings.url`; nothing is asked of Redis before the
    /// first call.
    pub fn new(settings: RedisCoordSettings) -> Result<RedisCoordinator, CoordError> {
        let info = settings
            .url
            .as_str()
            .into_connection_info()
            .map_err(|err| {
                CoordError::Refused(format!(
                    "redis.url {:?}: {err}: fix the [redis] settings",
                    settings.url
                ))
            })?;
        // RESP3, so that the channel's messages arrive on the same connection as the
        // answers, and the connection manager subscribes again after a reconnect.
        let mut redis_settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        if !settings.password.is_empty() {
            redis_settings = redis_settings.set_password(&settings.password);
        }
        let info = info.set_redis_settings(redis_settings);
        let client = redis::Client::open(info).map_err(|err| {
            CoordError::Refused(format!("redis.url: {err}: fix the [redis] settings"))
        })?;
        let (changes, _) = broadcast::channel(CHANGES_HELD);
        Ok(RedisCoordinator {
            client,
            settings,
            scripts: Scripts::new(),
            manager: OnceCell::new(),
            changes,
            heard: Arc::new(AtomicU64::new(0)),
            highest_token: AtomicU64::new(0),
            warned: AtomicBool::new(false),
            rebuilding: Arc::new(tokio::sync::Mutex::new(())),
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

    async fn connection(&self) -> Result<ConnectionManager, CoordError> {
        let manager = self
            .manager
            .get_or_try_init(|| async {
                let changes = self.changes.clone();
                let heard = self.heard.clone();
                let config = ConnectionManagerConfig::new()
                    .set_max_delay(RECONNECT_MAX_DELAY)
                    .set_connection_timeout(Some(self.settings.request_timeout))
                    .set_response_timeout(Some(self.settings.request_timeout))
                    .set_automatic_resubscription()
                    .set_push_sender(move |info: redis::PushInfo| {
                        if info.kind == redis::PushKind::Message {
                            heard.fetch_add(1, Ordering::Relaxed);
                            // [channel, message]
                            let change = match info.data.last() {
                                Some(redis::Value::BulkString(message)) => change_of(message),
                                _ => Change::Any,
                            };
                            // No waiter listening is no error.
                            let _ = changes.send(change);
                        }
                        Ok::<(), std::convert::Infallible>(())
                    });
                let mut manager =
                    ConnectionManager::new_with_config(self.client.clone(), config).await?;
                manager.subscribe(self.settings.layout.channel()).await?;
                Ok::<_, redis::RedisError>(manager)
            })
            .await
            .map_err(|err| unavailable(&err))?;
        Ok(manager.clone())
    }

    /// Runs `script` with the prefix, the leader name and `args`, answering its fields.
    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        args: &[&[u8]],
    ) -> Result<T, CoordError> {
        let mut connection = self.connection().await?;
        invoke(&mut connection, &self.settings.layout, script, args).await
    }

    async fn fields(
        &self,
        script: &redis::Script,
        args: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>, CoordError> {
        self.run(script, args).await
    }

    /// Raises the floor of the next token to `token`. A number past [`TOKEN_MAX`] was
    /// never handed out by leaderq (another program's write): it raises nothing.
    fn saw_token(&self, token: u64) {
        if token <= TOKEN_MAX {
            self.highest_token.fetch_max(token, Ordering::Relaxed);
        }
    }

    async fn read_holder(&self) -> Result<HolderRow, CoordError> {
        let row = holder_row(self.fields(&self.scripts.observe, &[]).await?).map_err(bad_answer)?;
        self.saw_token(row.holder.token.0);
        Ok(row)
    }

    async fn write_ops(
        &self,
        mode: &str,
        lease: &LeaseId,
        token: FencingToken,
        ops: &[TaskOp],
    ) -> Result<Written, CoordError> {
        crate::coord::admit(self, ops, mode == "guarded")?;
        let token = token.to_string();
        let encoded = op_args(ops);
        let scope = scope(
            ops.iter()
                .flat_map(|op| std::iter::once(op.key()).chain(op.record_key())),
        );
        let mut args: Vec<&[u8]> = vec![
            mode.as_bytes(),
            lease.0.as_bytes(),
            token.as_bytes(),
            scope.as_bytes(),
        ];
        args.extend(encoded.iter().map(Vec::as_slice));
        let reply = self.fields(&self.scripts.write, &args).await?;
        let Some((kind, rest)) = reply.split_first() else {
            return Err(bad_answer("a write answered nothing"));
        };
        match kind.as_slice() {
            b"notleader" => Ok(Written::NotLeader),
            b"conflict" => Ok(Written::Conflict(
                rest.iter()
                    .map(|key| text(key))
                    .collect::<Result<_, _>>()
                    .map_err(bad_answer)?,
            )),
            b"done" => {
                let [token, counter, keys @ ..] = rest else {
                    return Err(bad_answer("a write answered done without its token"));
                };
                let version =
                    TaskVersion(layout::encode(number(counter).map_err(bad_answer)?, false));
                let token = number(token).map_err(bad_answer)?;
                self.saw_token(token);
                Ok(Written::Done {
                    versions: keys
                        .iter()
                        .map(|key| text(key).map(|key| (key, version)))
                        .collect::<Result<_, _>>()
                        .map_err(bad_answer)?,
                    fencing_token: FencingToken(token),
                })
            }
            _ => Err(bad_answer("a write answered out of turn")),
        }
    }

    /// Test support: writes a task with the producers' script ([`PRODUCE`]).
    pub async fn produce(&self, key: &str, value: &[u8]) -> Result<(), CoordError> {
        let mut connection = self.connection().await?;
        redis::cmd("EVAL")
            .arg(PRODUCE)
            .arg(0)
            .arg(&self.settings.layout.prefix)
            .arg(key)
            .arg(value)
            .query_async::<u64>(&mut connection)
            .await
            .map(drop)
            .map_err(|err| unavailable(&err))
    }
}

/// Every Redis error may pass (a restart, a network fault, a replica being promoted, a
/// busy script, an operator fixing a password): retrying is the answer, so it is
/// `Unavailable`, with what Redis said.
fn unavailable(err: &redis::RedisError) -> CoordError {
    CoordError::Unavailable(format!(
        "redis: {err}: check that Redis is up and reachable at redis.url"
    ))
}

/// A script answered something it never sends: a bug in this module, or another
/// program's keys under our prefix.
fn bad_answer(why: impl std::fmt::Display) -> CoordError {
    CoordError::Unavailable(format!(
        "redis answered what leaderq's scripts never send ({why}): check that nothing else writes under [redis] key_prefix"
    ))
}

impl Leases for RedisCoordinator {
    fn describe(&self) -> String {
        match self.client.get_connection_info().addr() {
            addr @ redis::ConnectionAddr::Tcp(..) => format!("Redis at {addr}"),
            addr => format!("Redis at {addr} (TLS)"),
        }
    }

    async fn open_lease(&self, spec: &LeaseSpec) -> Result<Grant, CoordError> {
        if spec.ttl < TTL_MIN {
            return Err(CoordError::Refused(format!(
                "a lease TTL of {:?} is below the Redis coordinator's minimum of {TTL_MIN:?}: raise election.lease_ttl",
                spec.ttl
            )));
        }
        self.check_durability().await?;
        let previous = spec.previous.as_ref().map_or("", |lease| lease.0.as_str());
        let ttl = spec.ttl.as_millis().to_string();
        let new = uuid::Uuid::new_v4().to_string();
        let reply = self
            .fields(
                &self.scripts.open,
                &[
                    previous.as_bytes(),
                    spec.node_id.as_bytes(),
                    ttl.as_bytes(),
                    new.as_bytes(),
                ],
            )
            .await?;
        match reply.as_slice() {
            [kind, id] => Ok(Grant {
                lease: LeaseId(text(id).map_err(bad_answer)?),
                reused: kind.as_slice() == b"reused",
            }),
            _ => Err(bad_answer(format!("open answered {} fields", reply.len()))),
        }
    }

    /// One script, sent whole: one round trip, also on a Redis that lost its script cache.
    async fn keep_alive(&self, lease: &LeaseId) -> Result<Renewal, CoordError> {
        let mut connection = self.connection().await?;
        let answer: String = scripts::eval(
            &mut connection,
            &self.settings.layout,
            &self.scripts.keep_alive,
            &[lease.0.as_bytes()],
        )
        .await?;
        Ok(if answer == "alive" {
            Renewal::Alive
        } else {
            Renewal::Gone
        })
    }

    /// Ends the lease by the script that checks it is still there. Closing is this too (the
    /// default `close`): nothing but the lease is tied to a node here.
    async fn revoke(&self, lease: &LeaseId) -> Result<(), CoordError> {
        self.run::<String>(&self.scripts.revoke, &[lease.0.as_bytes()])
            .await
            .map(drop)
    }
}

impl Elections for RedisCoordinator {
    async fn observe(
        &self,
        after: Version,
        wait: Duration,
    ) -> Result<(Holder, Version), CoordError> {
        self.wait_for(after, wait, ReadHolder).await
    }

    async fn campaign(
        &self,
        lease: &LeaseId,
        record: &HolderRecord,
    ) -> Result<Campaign, CoordError> {
        let floor = scripts::campaign_floor(self.highest_token.load(Ordering::Relaxed), record);
        let floor = floor.to_string();
        let record = record.encode();
        let max = TOKEN_MAX.to_string();
        let reply = self
            .fields(
                &self.scripts.campaign,
                &[
                    lease.0.as_bytes(),
                    &record,
                    floor.as_bytes(),
                    max.as_bytes(),
                ],
            )
            .await?;
        match reply.as_slice() {
            [won, token] if won.as_slice() == b"won" => {
                let token = number(token).map_err(bad_answer)?;
                self.saw_token(token);
                Ok(Campaign::Won(Leadership {
                    lease: lease.clone(),
                    fencing_token: FencingToken(token),
                }))
            }
            [held] if held.as_slice() == b"held" => Ok(Campaign::Held),
            [gone] if gone.as_slice() == b"gone" => Ok(Campaign::LeaseGone),
            [exhausted, token] if exhausted.as_slice() == b"exhausted" => {
                Err(CoordError::Refused(format!(
                    "the next fencing token would be {}, past {TOKEN_MAX} (2^53 - 1, the largest leaderq hands out): {}fencing/{} holds a number leaderq never wrote; delete that key and restart the replicas",
                    String::from_utf8_lossy(token),
                    self.settings.layout.prefix,
                    self.settings.layout.leader
                )))
            }
            _ => Err(bad_answer("campaign answered out of turn")),
        }
    }

    async fn resign(&self, lease: &LeaseId) -> Result<(), CoordError> {
        self.run::<String>(&self.scripts.resign, &[lease.0.as_bytes()])
            .await
            .map(drop)
    }
}

impl Tasks for RedisCoordinator {
    async fn list(
        &self,
        prefix: &str,
        after: Version,
        wait: Duration,
    ) -> Result<(Vec<StoredTask>, Version), CoordError> {
        // A watch leaves an index rebuild running behind it; a single read waits for it.
        let behind = !wait.is_zero();
        self.wait_for(after, wait, ReadTasks(prefix, behind)).await
    }

    /// The keys under `prefix`, `KEYS_PAGE` at a time, packed as they come; the version
    /// is the lowest a page saw, as a listing's.
    async fn keys(&self, prefix: &str) -> Result<(Names, Version), CoordError> {
        let page_size = KEYS_PAGE.to_string();
        let mut keys = Names::new();
        let mut lowest = u64::MAX;
        let mut after = String::new();
        let mut rebuilt = false;
        loop {
            let reply = self
                .fields(
                    &self.scripts.keys,
                    &[prefix.as_bytes(), after.as_bytes(), page_size.as_bytes()],
                )
                .await?;
            let [counter, marked, page @ ..] = reply.as_slice() else {
                return Err(bad_answer("keys answered nothing"));
            };
            if after.is_empty() && marked.as_slice() != b"1" && !rebuilt {
                // The index lacks its mark: rebuilt, then read again (once).
                self.rebuild_index().await;
                rebuilt = true;
                continue;
            }
            lowest = lowest.min(number(counter).map_err(bad_answer)?);
            for key in page
                .iter()
                .filter(|key| key.as_slice() != INDEXED.as_bytes())
            {
                keys.push(text_in(key).map_err(bad_answer)?);
            }
            match page.last() {
                Some(last) if page.len() >= KEYS_PAGE => after = text(last).map_err(bad_answer)?,
                _ => return Ok((keys, Version(layout::encode(lowest, false)))),
            }
        }
    }

    async fn get(&self, keys: &[String]) -> Result<Vec<StoredTask>, CoordError> {
        self.read_keys(keys).await
    }

    async fn write(&self, leadership: &Leadership, ops: &[TaskOp]) -> Result<Written, CoordError> {
        self.write_ops("guarded", &leadership.lease, leadership.fencing_token, ops)
            .await
    }

    async fn write_own(&self, lease: &LeaseId, ops: &[TaskOp]) -> Result<Written, CoordError> {
        self.write_ops("own", lease, FencingToken(0), ops).await
    }

    async fn edit(&self, ops: &[Edit]) -> Result<Edited, CoordError> {
        let encoded = edit_args(ops);
        let args: Vec<&[u8]> = encoded.iter().map(Vec::as_slice).collect();
        let reply = self.fields(&self.scripts.edit, &args).await?;
        match reply.split_first() {
            Some((kind, _)) if kind.as_slice() == b"done" => Ok(Edited::Done),
            Some((kind, keys)) if kind.as_slice() == b"conflict" => Ok(Edited::Conflict(
                keys.iter()
                    .map(|key| text(key))
                    .collect::<Result<_, _>>()
                    .map_err(bad_answer)?,
            )),
            _ => Err(bad_answer("an edit answered out of turn")),
        }
    }

    fn limits(&self) -> WriteLimits {
        LIMITS
    }

    fn cost(&self, op: &TaskOp) -> WriteCost {
        let bytes = op.key().len() + op.record_key().map_or(0, str::len) + op.value_len();
        WriteCost { ops: 1, bytes }
    }

    fn guard_cost(&self) -> WriteCost {
        WriteCost { ops: 1, bytes: 0 }
    }
}
