//! Settings: compiled defaults (`config/default.toml`) < the coordinators' own tools'
//! variables (`CONSUL_CACERT`, `ETCDCTL_ENDPOINTS`…: [`TOOL_VARIABLES`]) < `--config FILE` <
//! environment (`LEADERQ__SECTION__KEY`) < Consul's `CONSUL_HTTP_ADDR` and
//! `CONSUL_HTTP_TOKEN`. A tool's variable thus fills a setting in only where the settings
//! leave it unset; the last two override, as they always have.
//!
//! Parsed and validated once at start; each component then receives only its own section.
//! Unknown keys and bad values are errors that name the key.
//!
//! Size: every section's types and every cross-setting check in one place, so one file
//! says what is accepted; the tests of the loader follow them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::util::duration;

// Each backend's section lives beside the backend that reads it, with its own checks.
pub use crate::coord::consul::ConsulSettings;
pub use crate::coord::etcd::EtcdSettings;
pub use crate::coord::redis::RedisSettings;
pub use crate::coord::zookeeper::ZookeeperSettings;

/// The largest `queue.concurrency`: runs in flight, each a supervised process group.
pub const MAX_CONCURRENCY: usize = 256;
/// The largest `queue.claim_batch`. A batch's transaction (leader check, deletions of the
/// previous batch, a check and a lock per task) is further cut to what fits the limits in
/// `consul::TXN_MAX_OPS` and `consul::TXN_MAX_BODY`.
pub const MAX_CLAIM_BATCH: usize = 32;

/// The shortest `observe.admin_token`: a token that guards actions on the queue must not
/// be guessable.
pub const MIN_ADMIN_TOKEN: usize = 16;

/// A bearer token named `setting`: long enough not to be guessed, and cookie-safe (the
/// dashboard keeps its token in a cookie once typed into the page).
pub fn check_token(setting: &str, token: &str) -> Result<(), String> {
    let cookie_safe = token
        .bytes()
        .all(|b| b.is_ascii_graphic() && !b"\";,\\".contains(&b));
    if token.len() < MIN_ADMIN_TOKEN || !cookie_safe {
        return Err(format!(
            "{setting} must be at least {MIN_ADMIN_TOKEN} printable ASCII characters without spaces, quotes, ';', ',' or '\\' (for example the output of `openssl rand -hex 24`)"
        ));
    }
    Ok(())
}

/// The defaults, compiled in so that the binary runs with no file at all.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub coordinator: CoordinatorSettings,
    pub consul: ConsulSettings,
    pub etcd: EtcdSettings,
    pub zookeeper: ZookeeperSettings,
    pub redis: RedisSettings,
    pub election: ElectionSettings,
    pub queue: QueueSettings,
    pub data: DataSettings,
    pub observe: ObserveSettings,
    pub gateway: GatewaySettings,
    #[serde(default)]
    pub handlers: BTreeMap<String, HandlerSettings>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorSettings {
    pub backend: Backend,
}

/// The coordinator the replicas elect their leader and keep their queue on; each has its
/// own section of settings and its folder under `coord/`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Consul's KV store, sessions and transactions (or `leaderq server`): `[consul]`.
    Consul,
    /// etcd v3's leases, revisions and watches, through its JSON gateway: `[etcd]`.
    Etcd,
    /// A ZooKeeper ensemble, Curator's LeaderLatch semantics: `[zookeeper]`.
    Zookeeper,
    /// One Redis (7.0 or later): leases and leadership as keys with TTLs, Lua scripts
    /// for every guarded write: `[redis]`.
    Redis,
}

/// Every [`Backend`] by the name settings and `--backend` flags give it.
pub const BACKENDS: &[&str] = &["consul", "etcd", "redis", "zookeeper"];

/// How a leader holds leadership (`leader/rotation.rs`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ElectionMode {
    /// Until it leaves or loses its lease (Curator's LeaderLatch).
    Latch,
    /// Gives it up after `rotate_after` / `rotate_after_tasks` and stands back, so that it
    /// passes among the replicas (Curator's LeaderSelector with auto-requeue).
    Rotate,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElectionSettings {
    pub leader_key: String,
    pub node_id: String,
    /// How long a lease lives without a renewal (renewed every TTL/3).
    #[serde(deserialize_with = "duration::deserialize")]
    pub lease_ttl: Duration,
    /// `lease_ttl`'s old name, still read: `Settings::load` moves it into `lease_ttl`.
    #[serde(
        default,
        rename = "session_ttl",
        deserialize_with = "duration::deserialize_optional",
        skip_serializing
    )]
    pub session_ttl_alias: Option<Duration>,
    #[serde(deserialize_with = "duration::deserialize")]
    pub lock_delay: Duration,
    pub health_check: bool,
    #[serde(deserialize_with = "duration::deserialize")]
    pub prefer_previous_leader: Duration,
    #[serde(deserialize_with = "duration::deserialize")]
    pub retry_interval: Duration,
    pub mode: ElectionMode,
    #[serde(deserialize_with = "duration::deserialize")]
    pub rotate_after: Duration,
    pub rotate_after_tasks: u64,
    /// Register the replica in the agent's service catalog (`registration.rs`).
    pub register_service: bool,
    pub service_name: String,
    /// How many shards the queue is split into, each with its own leadership
    /// (`task/shard.rs`, `service/shards.rs`); 1: one leader for the whole queue.
    pub shards: u32,
    /// Which shard these settings elect for (`for_shard`); `None`: the queue's own
    /// election. Never read from a file.
    #[serde(skip)]
    pub shard: Option<u32>,
}

/// The most shards a queue may be split into: each is a lease and a leadership on every
/// replica, and a listing of the queue on the replica leading it.
pub const MAX_SHARDS: u32 = 64;

impl ElectionSettings {
    /// The leader key of shard `index` of `count`: the leader key itself when there is one
    /// shard (so that one shard is today's election, key for key), else a sibling key
    /// naming the shard and the count, so that the shards of two counts never share a key.
    pub fn shard_key_of(&self, index: u32, count: u32) -> String {
        if count <= 1 {
            self.leader_key.clone()
        } else {
            format!("{}-shard-{index}-of-{count}", self.leader_key)
        }
    }

    /// The leader keys of every shard of `count`, in order.
    pub fn shard_keys(&self, count: u32) -> Vec<String> {
        (0..count.max(1))
            .map(|index| self.shard_key_of(index, count))
            .collect()
    }

    /// These settings for shard `index` of `election.shards`: its leader key.
    pub fn for_shard(&self, index: u32) -> ElectionSettings {
        ElectionSettings {
            leader_key: self.shard_key_of(index, self.shards),
            shard: Some(index),
            ..self.clone()
        }
    }
}

/// Where leaderq keeps its own records in the coordinator (the pause flag, the replicas'
/// records, the leadership timeline): no queue prefix may overlap it.
pub const OWN_NAMESPACE: &str = "leaderq/";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSettings {
    pub prefix: String,
    pub dead_prefix: String,
    /// Where finished tasks leave their history records.
    pub done_prefix: String,
    /// How many history records to keep (0: none, history off).
    pub history_keep: usize,
    /// History records older than this are pruned (0s: no age limit).
    #[serde(deserialize_with = "duration::deserialize")]
    pub history_max_age: Duration,
    /// Bytes kept of the end of each exec handler run's stdout and stderr (0: none).
    pub output_limit: usize,
    pub max_attempts: u32,
    pub claim_batch: usize,
    /// Runs at once, at most one per `taskGroup` (1: one task at a time).
    pub concurrency: usize,
    #[serde(deserialize_with = "duration::deserialize")]
    pub backoff_base: Duration,
    #[serde(deserialize_with = "duration::deserialize")]
    pub backoff_max: Duration,
    /// A producer's `runAt` further ahead than this dead-letters its task.
    #[serde(deserialize_with = "duration::deserialize")]
    pub run_at_max_ahead: Duration,
    #[serde(deserialize_with = "duration::deserialize")]
    pub shutdown_grace: Duration,
    /// Start even with no handler at all, which dead-letters every task.
    pub allow_no_handlers: bool,
    /// Between SIGTERM and SIGKILL of a handler's process group.
    #[serde(deserialize_with = "duration::deserialize")]
    pub kill_grace: Duration,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObserveSettings {
    pub enabled: bool,
    pub listen: std::net::SocketAddr,
    /// Serve the web dashboard at `/ui/` on `listen`.
    pub dashboard: bool,
    /// The bearer token the dashboard asks for (its reads and its actions); "" for none,
    /// which only a loopback `listen` allows.
    pub admin_token: String,
}

impl ObserveSettings {
    /// The dashboard's token, if one is set.
    pub fn admin_token(&self) -> Option<&str> {
        Some(self.admin_token.as_str()).filter(|token| !token.is_empty())
    }
}

/// `leaderq gateway`, the producers' front door.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySettings {
    pub listen: std::net::SocketAddr,
    /// The token producers send; "" for none, which only a loopback `listen` allows.
    pub token: String,
    /// A file holding the token instead, read again whenever it changes; "" for none.
    pub token_file: PathBuf,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSettings {
    pub dir: PathBuf,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HandlerKind {
    Exec,
    Log,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerSettings {
    pub kind: HandlerKind,
    #[serde(default)]
    pub command: Vec<String>,
    /// Exec handlers are killed after this long; none by default.
    #[serde(default, deserialize_with = "duration::deserialize_optional")]
    pub timeout: Option<Duration>,
    /// Variables set for an exec handler, on top of the allow-listed ones.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of this replica's own environment variables passed on to an exec handler.
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Working directory of an exec handler; the replica's own by default.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Exit codes of an exec handler that mean "retrying cannot help": the task goes to the
    /// dead letters at once. Default: 65 (EX_DATAERR, "the input data was incorrect").
    #[serde(default = "default_permanent_exit_codes")]
    pub permanent_exit_codes: Vec<i32>,
    /// Runs a task of this type gets before it is dead-lettered; `queue.max_attempts` by
    /// default. A task's own `maxAttempts` overrides it.
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// The first retry's backoff for this type; `queue.backoff_base` by default.
    #[serde(default, deserialize_with = "duration::deserialize_optional")]
    pub backoff_base: Option<Duration>,
    /// The longest backoff for this type; `queue.backoff_max` by default.
    #[serde(default, deserialize_with = "duration::deserialize_optional")]
    pub backoff_max: Option<Duration>,
    /// The `taskPriority` of this type's tasks that give none (higher runs first); 0 by
    /// default.
    #[serde(default)]
    pub priority: Option<i32>,
    /// At most this many runs of this type at once, within `queue.concurrency`.
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// At most N starts of this type in any window of PERIOD, whoever leads: `"N/PERIOD"`,
    /// such as `"10/1m"`.
    #[serde(default)]
    pub rate: Option<String>,
}

/// The exit code that marks a permanent failure unless a handler says otherwise.
pub const DEFAULT_PERMANENT_EXIT_CODE: i32 = 65;

fn default_permanent_exit_codes() -> Vec<i32> {
    vec![DEFAULT_PERMANENT_EXIT_CODE]
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path} not found")]
    NotFound { path: PathBuf },
    #[error("invalid settings: {0}")]
    Invalid(String),
}

/// Environment as the loader sees it, so tests can pass their own.
pub type Env = Vec<(String, String)>;

/// The coordinators' tools' variables leaderq reads, each with the setting it fills in where
/// the settings leave it unset (`ETCDCTL_USER` is `user:password`, or `user` with
/// `ETCDCTL_PASSWORD`; `CONSUL_HTTP_TOKEN_FILE` is not read when `CONSUL_HTTP_TOKEN` is set,
/// as Consul's CLI does).
pub const TOOL_VARIABLES: &[(&str, &str)] = &[
    ("CONSUL_HTTP_TOKEN_FILE", "consul.token_file"),
    ("CONSUL_CACERT", "consul.ca_file"),
    ("CONSUL_CLIENT_CERT", "consul.cert_file"),
    ("CONSUL_CLIENT_KEY", "consul.key_file"),
    ("CONSUL_TLS_SERVER_NAME", "consul.server_name"),
    ("ETCDCTL_ENDPOINTS", "etcd.endpoints"),
    ("ETCDCTL_USER", "etcd.user"),
    ("ETCDCTL_PASSWORD", "etcd.password"),
    ("ETCDCTL_CACERT", "etcd.ca_file"),
    ("ETCDCTL_CERT", "etcd.cert_file"),
    ("ETCDCTL_KEY", "etcd.key_file"),
];

/// The tools' variables found in `env`, as a settings layer (keys are setting paths).
#[derive(Clone, Debug)]
struct ToolVariables(Vec<(String, config::Value)>);

impl config::Source for ToolVariables {
    fn clone_into_box(&self) -> Box<dyn config::Source + Send + Sync> {
        Box::new(self.clone())
    }

    fn collect(&self) -> Result<config::Map<String, config::Value>, config::ConfigError> {
        Ok(self.0.iter().cloned().collect())
    }
}

fn tool_variables(env: &Env) -> ToolVariables {
    let lookup = |name: &str| {
        env.iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
            .filter(|value| !value.is_empty())
    };
    let origin = |name: &str| Some(format!("environment variable {name}"));
    let text = |name: &str, value: String| config::Value::new(origin(name).as_ref(), value);
    let mut layer = Vec::new();
    for (name, setting) in TOOL_VARIABLES {
        let Some(value) = lookup(name) else { continue };
        match *name {
            "CONSUL_HTTP_TOKEN_FILE" if lookup("CONSUL_HTTP_TOKEN").is_some() => {}
            "ETCDCTL_ENDPOINTS" => {
                let endpoints: Vec<config::Value> = value
                    .split(',')
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .map(|e| text(name, e.to_string()))
                    .collect();
                layer.push((
                    setting.to_string(),
                    config::Value::new(origin(name).as_ref(), endpoints),
                ));
            }
            "ETCDCTL_USER" => match value.split_once(':') {
                Some((user, password)) => {
                    layer.push(("etcd.user".into(), text(name, user.to_string())));
                    layer.push(("etcd.password".into(), text(name, password.to_string())));
                }
                None => layer.push(("etcd.user".into(), text(name, value))),
            },
            "ETCDCTL_PASSWORD" if lookup("ETCDCTL_USER").is_some_and(|u| u.contains(':')) => {}
            _ => layer.push((setting.to_string(), text(name, value))),
        }
    }
    ToolVariables(layer)
}

/// The settings file and the environment over `builder`: the tools' variables under the
/// file, then `LEADERQ__SECTION__KEY`, then `CONSUL_HTTP_ADDR` and `CONSUL_HTTP_TOKEN` as
/// Consul's own tools read them.
fn user_layers(
    mut builder: config::ConfigBuilder<config::builder::DefaultState>,
    file: Option<&Path>,
    env: &Env,
) -> Result<config::ConfigBuilder<config::builder::DefaultState>, ConfigError> {
    builder = builder.add_source(tool_variables(env));
    if let Some(path) = file {
        builder = builder.add_source(config::File::from(path).format(config::FileFormat::Toml));
    }
    let leaderq_env: std::collections::HashMap<String, String> = env
        .iter()
        .filter(|(key, _)| key.starts_with("LEADERQ__"))
        .cloned()
        .collect();
    builder = builder.add_source(
        config::Environment::with_prefix("LEADERQ")
            .prefix_separator("__")
            .separator("__")
            .try_parsing(true)
            .list_separator(",")
            .with_list_parse_key("consul.addresses")
            .with_list_parse_key("etcd.endpoints")
            .with_list_parse_key("redis.sentinels")
            .source(Some(leaderq_env)),
    );
    let lookup = |name: &str| {
        env.iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
            .filter(|value| !value.is_empty())
    };
    if let Some(addr) = lookup("CONSUL_HTTP_ADDR") {
        builder = builder
            .set_override("consul.addresses", vec![addr])
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
    }
    if let Some(token) = lookup("CONSUL_HTTP_TOKEN") {
        builder = builder
            .set_override("consul.token", token)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
    }
    Ok(builder)
}

impl Settings {
    /// How long one watch of the coordinator (a blocking query, a watch) may wait before it
    /// returns unchanged, from the backend's own section.
    pub fn watch_wait(&self) -> Duration {
        match self.coordinator.backend {
            Backend::Consul => self.consul.wait,
            Backend::Etcd => self.etcd.wait,
            Backend::Zookeeper => self.zookeeper.wait,
            Backend::Redis => self.redis.wait,
        }
    }

    /// Loads the layers in order (defaults, the file, the environment) and validates the
    /// result.
    pub fn load(file: Option<&Path>, env: Env) -> Result<Settings, ConfigError> {
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::NotFound {
                    path: path.to_path_buf(),
                });
            }
        }
        let defaults = config::Config::builder().add_source(config::File::from_str(
            DEFAULT_TOML,
            config::FileFormat::Toml,
        ));
        let invalid = |e: config::ConfigError| ConfigError::Invalid(e.to_string());
        let mut settings: Settings = user_layers(defaults, file, &env)?
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(invalid)?;
        if let Some(ttl) = settings.election.session_ttl_alias.take() {
            // The old name wins over the default, not over the new name given as well.
            let user = user_layers(config::Config::builder(), file, &env)?
                .build()
                .map_err(invalid)?;
            if user.get::<String>("election.lease_ttl").is_ok() {
                return Err(ConfigError::Invalid(
                    "election.lease_ttl and election.session_ttl (its old name) are both set: keep lease_ttl only".into(),
                ));
            }
            settings.election.lease_ttl = ttl;
        }
        // An empty LEADERQ__REDIS__SENTINELS reads as one empty entry: it means none.
        settings
            .redis
            .sentinels
            .retain(|entry| !entry.trim().is_empty());
        if !settings.redis.sentinels.is_empty() {
            // The URL has a compiled default: only one the user gave conflicts.
            let user = user_layers(config::Config::builder(), file, &env)?
                .build()
                .map_err(invalid)?;
            if user.get::<String>("redis.url").is_ok() {
                return Err(ConfigError::Invalid(
                    "redis.url and redis.sentinels are both set: keep one (sentinels, with redis.master_name, find the primary after a failover; url names one server)".into(),
                ));
            }
        }
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        if self.election.mode == ElectionMode::Rotate
            && self.election.rotate_after.is_zero()
            && self.election.rotate_after_tasks == 0
        {
            return invalid(
                "election.mode = \"rotate\" needs election.rotate_after (a duration) or election.rotate_after_tasks (a count) above 0".into(),
            );
        }
        if let Some(token) = self.observe.admin_token() {
            check_token("observe.admin_token", token).map_err(ConfigError::Invalid)?;
        }
        self.check_gateway()?;
        // Every backend's section is checked, not only the chosen one's, so that a switch
        // of `coordinator.backend` never meets a section that was wrong all along.
        self.consul.check().map_err(ConfigError::Invalid)?;
        self.etcd.check().map_err(ConfigError::Invalid)?;
        self.zookeeper.check().map_err(ConfigError::Invalid)?;
        self.redis.check().map_err(ConfigError::Invalid)?;
        if self.election.leader_key.is_empty() || self.election.leader_key.starts_with('/') {
            return invalid(
                "election.leader_key must be a non-empty key without a leading '/'".into(),
            );
        }
        if crate::task::key::validate_node_id(&self.election.service_name).is_err() {
            return invalid(format!(
                "election.service_name {:?} is not a valid service name: use 1 to 128 ASCII letters, digits, '.', '_' or '-'",
                self.election.service_name
            ));
        }
        if !self.election.node_id.is_empty() {
            if let Err(reason) = crate::task::key::validate_node_id(&self.election.node_id) {
                return invalid(format!(
                    "election.node_id {:?} {reason}",
                    self.election.node_id
                ));
            }
        }
        for (name, prefix) in [
            ("queue.prefix", &self.queue.prefix),
            ("queue.dead_prefix", &self.queue.dead_prefix),
            ("queue.done_prefix", &self.queue.done_prefix),
        ] {
            if let Err(reason) = crate::task::key::check_prefix(prefix) {
                return invalid(format!(
                    "{name} {prefix:?} is not a valid key prefix: {reason}"
                ));
            }
        }
        if !(1..=MAX_SHARDS).contains(&self.election.shards) {
            return invalid(format!(
                "election.shards = {} is out of range: use 1 (one leader for the whole queue) to {MAX_SHARDS}",
                self.election.shards
            ));
        }
        // The leader key, and with shards each key it makes: valid keys, none of them where
        // it would be taken for a task.
        let leader_key = &self.election.leader_key;
        let mut keys = vec![leader_key.clone()];
        keys.extend(self.election.shard_keys(self.election.shards));
        for key in keys {
            let what = if key == *leader_key {
                format!("election.leader_key {key:?}")
            } else {
                format!("election.leader_key {leader_key:?} makes the shard key {key:?}, which")
            };
            if let Err(reason) = crate::task::key::check(&key) {
                return invalid(format!("{what} is not a valid key: {reason}"));
            }
            if [
                &self.queue.prefix,
                &self.queue.dead_prefix,
                &self.queue.done_prefix,
            ]
            .iter()
            .any(|prefix| key.starts_with(prefix.as_str()))
            {
                return invalid(format!(
                    "{what} lies under queue.prefix, queue.dead_prefix or queue.done_prefix, where it would be taken for a task"
                ));
            }
        }
        if self.election.lease_ttl.is_zero() {
            return invalid("election.lease_ttl must be more than 0s".into());
        }
        if self.queue.prefix.is_empty() || self.queue.dead_prefix.is_empty() {
            return invalid("queue.prefix and queue.dead_prefix must not be empty".into());
        }
        if self.queue.dead_prefix.starts_with(&self.queue.prefix)
            || self.queue.prefix.starts_with(&self.queue.dead_prefix)
        {
            return invalid(format!(
                "queue.prefix ({:?}) and queue.dead_prefix ({:?}) must not contain each other",
                self.queue.prefix, self.queue.dead_prefix
            ));
        }
        for (name, other) in [
            ("queue.prefix", &self.queue.prefix),
            ("queue.dead_prefix", &self.queue.dead_prefix),
        ] {
            let done = &self.queue.done_prefix;
            if done.is_empty()
                || done.starts_with(other.as_str())
                || other.starts_with(done.as_str())
            {
                return invalid(format!(
                    "queue.done_prefix ({done:?}) must not be empty nor contain or lie under {name} ({other:?})"
                ));
            }
        }
        for (name, prefix) in [
            ("queue.prefix", &self.queue.prefix),
            ("queue.dead_prefix", &self.queue.dead_prefix),
            ("queue.done_prefix", &self.queue.done_prefix),
        ] {
            if prefix.starts_with(OWN_NAMESPACE) || OWN_NAMESPACE.starts_with(prefix.as_str()) {
                return invalid(format!(
                    "{name} {prefix:?} overlaps {OWN_NAMESPACE:?}, where leaderq keeps its own records (pause flag, replicas, leadership timeline): pick another prefix"
                ));
            }
        }
        if !(1..=MAX_CLAIM_BATCH).contains(&self.queue.claim_batch) {
            return invalid(format!(
                "queue.claim_batch must be between 1 and {MAX_CLAIM_BATCH} (one transaction holds at most 128 operations)"
            ));
        }
        if self.queue.output_limit > crate::task::output::MAX_OUTPUT_LIMIT {
            return invalid(format!(
                "queue.output_limit must be at most {} (bytes kept of each of a run's stdout and stderr, which must fit one value on every coordinator); 0 keeps no output",
                crate::task::output::MAX_OUTPUT_LIMIT
            ));
        }
        if !(1..=MAX_CONCURRENCY).contains(&self.queue.concurrency) {
            return invalid(format!(
                "queue.concurrency must be between 1 and {MAX_CONCURRENCY}"
            ));
        }
        if self.queue.max_attempts == 0 {
            return invalid("queue.max_attempts must be at least 1".into());
        }
        if self.queue.run_at_max_ahead.is_zero() {
            return invalid(
                "queue.run_at_max_ahead must be more than 0s, or every scheduled task is dead-lettered (the default is \"8784h\", 366 days)".into(),
            );
        }
        for (task_type, handler) in &self.handlers {
            if handler.kind == HandlerKind::Exec && handler.command.is_empty() {
                return invalid(format!(
                    "handlers.{task_type}.command is empty: an exec handler needs an argv array such as [\"/usr/bin/my-task\"]"
                ));
            }
            match handler.concurrency {
                Some(0) => {
                    return invalid(format!(
                        "handlers.{task_type}.concurrency must be at least 1 (it caps the type's runs at once)"
                    ))
                }
                Some(cap) if cap > self.queue.concurrency => {
                    return invalid(format!(
                        "handlers.{task_type}.concurrency ({cap}) is above queue.concurrency ({}), which caps every run at once: raise queue.concurrency, or lower the type's cap",
                        self.queue.concurrency
                    ))
                }
                _ => {}
            }
            if let Some(rate) = &handler.rate {
                if let Err(why) = crate::util::rate::Rate::parse(rate) {
                    return invalid(format!(
                        "handlers.{task_type}.rate: {why} (at most N starts of the type in any window of PERIOD)"
                    ));
                }
            }
            if handler.max_attempts == Some(0) {
                return invalid(format!(
                    "handlers.{task_type}.max_attempts must be at least 1 (1: never retried)"
                ));
            }
            let base = handler.backoff_base.unwrap_or(self.queue.backoff_base);
            let max = handler.backoff_max.unwrap_or(self.queue.backoff_max);
            let own = handler.backoff_base.is_some() || handler.backoff_max.is_some();
            if own && base > max {
                return invalid(format!(
                    "handlers.{task_type}: backoff_base ({}) is longer than backoff_max ({}); set handlers.{task_type}.backoff_max at least as long",
                    crate::util::duration::format(base),
                    crate::util::duration::format(max)
                ));
            }
        }
        self.validate_supervision()
    }

    /// Handler supervision: the kill sequence fits in the lease, and each handler's
    /// environment and working directory can be used as given.
    /// The front door's token: a good one, not the dashboard's (a producer's credential
    /// must not open the dashboard), and not given twice.
    fn check_gateway(&self) -> Result<(), ConfigError> {
        let gateway = &self.gateway;
        if !gateway.token.is_empty() && !gateway.token_file.as_os_str().is_empty() {
            return Err(ConfigError::Invalid(
                "gateway.token and gateway.token_file are both set: keep one".into(),
            ));
        }
        if gateway.token.is_empty() {
            return Ok(());
        }
        check_token("gateway.token", &gateway.token).map_err(ConfigError::Invalid)?;
        if self.observe.admin_token() == Some(gateway.token.as_str()) {
            return Err(ConfigError::Invalid(
                "gateway.token is the dashboard's observe.admin_token: give producers a token of their own".into(),
            ));
        }
        Ok(())
    }

    fn validate_supervision(&self) -> Result<(), ConfigError> {
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        let ttl = self.election.lease_ttl;
        let margin = crate::supervise::lease_margin(ttl);
        // Right before a renewal is due (every TTL/3) the lease has 2/3 of a TTL left; a
        // kill sequence longer than that would stop healthy handlers every time.
        let room = ttl - ttl / 3;
        if self.queue.kill_grace + margin >= room {
            return invalid(format!(
                "queue.kill_grace ({}) plus the lease margin ({}, a tenth of election.lease_ttl) must be less than 2/3 of election.lease_ttl ({}), so that a handler is killed before its lease could end; lower queue.kill_grace below {} or raise election.lease_ttl",
                duration::format(self.queue.kill_grace),
                duration::format(margin),
                duration::format(room),
                duration::format(room - margin),
            ));
        }
        for (task_type, handler) in &self.handlers {
            let names = handler.env.keys().chain(handler.pass_env.iter());
            for name in names {
                if name.is_empty() || name.contains(['=', '\0']) {
                    return invalid(format!(
                        "handlers.{task_type}: {name:?} is not a valid environment variable name"
                    ));
                }
            }
            if let Some(value) = handler.env.values().find(|v| v.contains('\0')) {
                return invalid(format!(
                    "handlers.{task_type}.env: the value {value:?} contains a NUL byte"
                ));
            }
            if let Some(cwd) = &handler.cwd {
                if !cwd.is_dir() {
                    return invalid(format!(
                        "handlers.{task_type}.cwd: {} is not a directory; create it or fix the path",
                        cwd.display()
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn env(pairs: &[(&str, &str)]) -> Env {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The compiled-in defaults load and validate on their own.
    #[test]
    fn defaults_load() {
        let settings = Settings::load(None, Env::new()).unwrap();
        assert_eq!(settings.queue.prefix, "oracleTask/");
        assert_eq!(settings.election.lease_ttl, Duration::from_secs(10));
        assert_eq!(settings.consul.addresses, vec!["http://127.0.0.1:8500"]);
        assert_eq!(
            settings.queue.run_at_max_ahead,
            Duration::from_secs(366 * 24 * 3600)
        );
    }

    /// A file overrides defaults, the environment overrides the file, Consul's variables
    /// override both; handler names keep their case.
    #[test]
    fn layers_apply_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("leaderq.toml");
        std::fs::write(
            &file,
            "[queue]\nmax_attempts = 7\nprefix = \"jobs/\"\n[handlers.CreateTableSpace]\nkind = \"log\"\n",
        )
        .unwrap();
        let settings = Settings::load(
            Some(&file),
            env(&[
                ("LEADERQ__QUEUE__MAX_ATTEMPTS", "3"),
                ("CONSUL_HTTP_ADDR", "127.0.0.1:9999"),
                ("CONSUL_HTTP_TOKEN", "secret"),
            ]),
        )
        .unwrap();
        assert_eq!(settings.queue.max_attempts, 3);
        assert_eq!(settings.queue.prefix, "jobs/");
        assert_eq!(settings.consul.addresses, vec!["127.0.0.1:9999"]);
        assert_eq!(settings.consul.token, "secret");
        assert!(
            settings.handlers.contains_key("CreateTableSpace"),
            "{:?}",
            settings.handlers.keys()
        );
    }

    /// The coordinators' tools' variables fill a setting in only where the settings leave
    /// it unset; `ETCDCTL_USER` is `user:password` (or `user` with `ETCDCTL_PASSWORD`); a
    /// token file is not read from the environment when `CONSUL_HTTP_TOKEN` is set.
    #[test]
    fn tool_variables_fill_in_what_the_settings_leave_unset() {
        let tools = [
            ("CONSUL_HTTP_TOKEN_FILE", "/env/token"),
            ("CONSUL_CACERT", "/env/ca.pem"),
            ("CONSUL_CLIENT_CERT", "/env/cert.pem"),
            ("CONSUL_CLIENT_KEY", "/env/key.pem"),
            ("CONSUL_TLS_SERVER_NAME", "server.dc1.consul"),
            ("ETCDCTL_ENDPOINTS", "https://e1:2379, https://e2:2379"),
            ("ETCDCTL_USER", "leaderq:pa:ss"),
            ("ETCDCTL_PASSWORD", "ignored"),
            ("ETCDCTL_CACERT", "/env/etcd-ca.pem"),
            ("ETCDCTL_CERT", "/env/etcd-cert.pem"),
            ("ETCDCTL_KEY", "/env/etcd-key.pem"),
        ];
        let settings = Settings::load(None, env(&tools)).unwrap();
        let consul = &settings.consul;
        assert_eq!(consul.token_file, "/env/token");
        assert_eq!(
            [
                &consul.ca_file,
                &consul.cert_file,
                &consul.key_file,
                &consul.server_name
            ],
            [
                "/env/ca.pem",
                "/env/cert.pem",
                "/env/key.pem",
                "server.dc1.consul"
            ]
        );
        let etcd = &settings.etcd;
        assert_eq!(etcd.endpoints, ["https://e1:2379", "https://e2:2379"]);
        assert_eq!(
            (etcd.user.as_str(), etcd.password.as_str()),
            ("leaderq", "pa:ss")
        );
        assert_eq!(
            [&etcd.ca_file, &etcd.cert_file, &etcd.key_file],
            [
                "/env/etcd-ca.pem",
                "/env/etcd-cert.pem",
                "/env/etcd-key.pem"
            ]
        );
        // The settings win: a file, then LEADERQ__.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("leaderq.toml");
        std::fs::write(
            &file,
            "[consul]\nca_file = \"/file/ca.pem\"\n[etcd]\nendpoints = [\"http://f:2379\"]\n",
        )
        .unwrap();
        let mut with = env(&tools);
        with.push((
            "LEADERQ__ETCD__CERT_FILE".into(),
            "/leaderq/cert.pem".into(),
        ));
        with.push(("LEADERQ__ETCD__KEY_FILE".into(), "/leaderq/key.pem".into()));
        let settings = Settings::load(Some(&file), with).unwrap();
        assert_eq!(settings.consul.ca_file, "/file/ca.pem");
        assert_eq!(settings.consul.cert_file, "/env/cert.pem");
        assert_eq!(settings.etcd.endpoints, ["http://f:2379"]);
        assert_eq!(settings.etcd.cert_file, "/leaderq/cert.pem");
        // A user alone takes ETCDCTL_PASSWORD; CONSUL_HTTP_TOKEN beats the token file.
        let settings = Settings::load(
            None,
            env(&[
                ("ETCDCTL_USER", "leaderq"),
                ("ETCDCTL_PASSWORD", "secret"),
                ("CONSUL_HTTP_TOKEN", "token"),
                ("CONSUL_HTTP_TOKEN_FILE", "/env/token"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (settings.etcd.user.as_str(), settings.etcd.password.as_str()),
            ("leaderq", "secret")
        );
        assert_eq!(
            (
                settings.consul.token.as_str(),
                settings.consul.token_file.as_str()
            ),
            ("token", "")
        );
    }

    /// Half a client identity, from any layer, is refused at start naming both settings.
    #[test]
    fn half_a_client_identity_is_refused() {
        let error = Settings::load(None, env(&[("CONSUL_CLIENT_CERT", "/env/cert.pem")]))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("consul.cert_file") && error.contains("consul.key_file"),
            "{error}"
        );
    }

    /// Unknown keys and bad values are refused with the key named.
    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, "[queue]\nmax_atempts = 3\n").unwrap();
        let err = Settings::load(Some(&file), Env::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_atempts"), "{err}");
        let err = Settings::load(None, env(&[("LEADERQ__ELECTION__SESSION_TTL", "15")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("session_ttl") && err.contains("missing unit"),
            "{err}"
        );
        let err = Settings::load(None, env(&[("LEADERQ__ELECTION__NODE_ID", "a/b")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("election.node_id"), "{err}");
        let err = Settings::load(None, env(&[("LEADERQ__ELECTION__SERVICE_NAME", "")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("election.service_name"), "{err}");
        let err = Settings::load(None, env(&[("LEADERQ__QUEUE__MAX_ATTEMPTS", "0")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_attempts"), "{err}");
        for (key, bad, named) in [
            ("LEADERQ__CONSUL__TXN_MAX_OPS", "63", "consul.txn_max_ops"),
            ("LEADERQ__CONSUL__TXN_MAX_OPS", "129", "consul.txn_max_ops"),
            ("LEADERQ__QUEUE__CONCURRENCY", "0", "queue.concurrency"),
            ("LEADERQ__QUEUE__CONCURRENCY", "257", "queue.concurrency"),
            (
                "LEADERQ__QUEUE__OUTPUT_LIMIT",
                "131073",
                "queue.output_limit",
            ),
            ("LEADERQ__QUEUE__OUTPUT_LIMIT", "-1", "output_limit"),
        ] {
            let err = Settings::load(None, env(&[(key, bad)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{err}");
        }
        for bad in ["0s", "0", "366d"] {
            let err = Settings::load(None, env(&[("LEADERQ__QUEUE__RUN_AT_MAX_AHEAD", bad)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("run_at_max_ahead"), "{bad}: {err}");
        }
        for bad in ["0", "33"] {
            let err = Settings::load(None, env(&[("LEADERQ__QUEUE__CLAIM_BATCH", bad)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("queue.claim_batch"), "{err}");
        }
        let missing = Settings::load(Some(Path::new("/nonexistent/leaderq.toml")), Env::new());
        assert!(missing
            .unwrap_err()
            .to_string()
            .contains("/nonexistent/leaderq.toml"));
    }
}

#[cfg(test)]
mod supervision_tests {
    use super::*;

    fn load(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Settings::load(
            None,
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// The kill grace defaults to 2s, which leaves the default 10s TTL room for a slow
    /// renewal (2s + 1s margin < 6.67s); one that could outlast the lease is refused with
    /// what to do.
    #[test]
    fn kill_grace_must_end_before_the_lease_could() {
        assert_eq!(load(&[]).unwrap().queue.kill_grace, Duration::from_secs(2));
        load(&[("LEADERQ__ELECTION__SESSION_TTL", "10s")]).unwrap();
        let err = load(&[("LEADERQ__ELECTION__SESSION_TTL", "3s")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("queue.kill_grace") && err.contains("lower queue.kill_grace below 1.7s"),
            "{err}"
        );
        load(&[
            ("LEADERQ__ELECTION__SESSION_TTL", "3s"),
            ("LEADERQ__QUEUE__KILL_GRACE", "1.6s"),
        ])
        .unwrap();
    }

    /// The gateway's token is checked like the dashboard's, may not be the dashboard's,
    /// and may not be given both inline and as a file.
    #[test]
    fn the_gateway_token_is_its_own() {
        let token = "0123456789abcdef0123";
        let settings = load(&[("LEADERQ__GATEWAY__TOKEN", token)]).unwrap();
        assert_eq!(settings.gateway.token, token);
        let cases: [&[(&str, &str)]; 3] = [
            &[("LEADERQ__GATEWAY__TOKEN", "short")],
            &[
                ("LEADERQ__GATEWAY__TOKEN", token),
                ("LEADERQ__OBSERVE__ADMIN_TOKEN", token),
            ],
            &[
                ("LEADERQ__GATEWAY__TOKEN", token),
                ("LEADERQ__GATEWAY__TOKEN_FILE", "/etc/leaderq/token"),
            ],
        ];
        for pairs in cases {
            let err = load(pairs).unwrap_err().to_string();
            assert!(err.contains("gateway.token"), "{pairs:?}: {err}");
        }
    }

    /// The dashboard's token comes from the environment too, and a short or cookie-unsafe
    /// one is refused with what to use instead.
    #[test]
    fn admin_token_is_read_and_checked() {
        assert_eq!(load(&[]).unwrap().observe.admin_token(), None);
        let token = "0123456789abcdef0123";
        let settings = load(&[("LEADERQ__OBSERVE__ADMIN_TOKEN", token)]).unwrap();
        assert_eq!(settings.observe.admin_token(), Some(token));
        for bad in ["short", "0123456789abcdef;0123", "0123456789 abcdef0123"] {
            let err = load(&[("LEADERQ__OBSERVE__ADMIN_TOKEN", bad)])
                .unwrap_err()
                .to_string();
            assert!(err.contains("observe.admin_token"), "{err}");
        }
    }

    /// A handler's env names must be usable, and its cwd must exist.
    #[test]
    fn a_types_retry_policy_is_read_and_checked_naming_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("h.toml");
        let write = |handler: &str| {
            std::fs::write(&file, format!("[handlers.T]\nkind = \"log\"\n{handler}")).unwrap();
            Settings::load(Some(&file), Env::new()).map_err(|e| e.to_string())
        };
        let ok = write("max_attempts = 1\nbackoff_base = \"30s\"\nbackoff_max = \"1h\"\n").unwrap();
        let t = &ok.handlers["T"];
        assert_eq!(t.max_attempts, Some(1));
        assert_eq!(t.backoff_base, Some(Duration::from_secs(30)));
        assert_eq!(t.backoff_max, Some(Duration::from_secs(3600)));
        let err = write("max_attempts = 0\n").unwrap_err();
        assert!(err.contains("handlers.T.max_attempts"), "{err}");
        // Over the queue's backoff_max (5m by default).
        let err = write("backoff_base = \"10m\"\n").unwrap_err();
        assert!(
            err.contains("handlers.T") && err.contains("backoff_max"),
            "{err}"
        );
        let err = write("concurrency = 0\n").unwrap_err();
        assert!(err.contains("handlers.T.concurrency"), "{err}");
        // Over queue.concurrency (1 by default).
        let err = write("concurrency = 2\n").unwrap_err();
        assert!(
            err.contains("handlers.T.concurrency") && err.contains("queue.concurrency"),
            "{err}"
        );
        let err = write("rate = \"5 a minute\"\n").unwrap_err();
        assert!(
            err.contains("handlers.T.rate") && err.contains("N/PERIOD"),
            "{err}"
        );
        let err = write("rate = \"0/1m\"\n").unwrap_err();
        assert!(err.contains("handlers.T.rate"), "{err}");
        let err = write("max_atempts = 2\n").unwrap_err();
        assert!(err.contains("max_atempts"), "{err}");
    }

    #[test]
    fn handler_env_and_cwd_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("h.toml");
        let write = |handler: &str| {
            std::fs::write(
                &file,
                format!("[handlers.T]\nkind = \"exec\"\ncommand = [\"true\"]\n{handler}"),
            )
            .unwrap();
            Settings::load(Some(&file), Env::new()).map_err(|e| e.to_string())
        };
        let ok = write(&format!(
            "env = {{ A = \"1\" }}\npass_env = [\"B\"]\ncwd = {:?}\n",
            dir.path().display().to_string()
        ))
        .unwrap();
        assert_eq!(ok.handlers["T"].env["A"], "1");
        assert_eq!(ok.handlers["T"].pass_env, vec!["B"]);
        let err = write("env = { \"A=B\" = \"1\" }\n").unwrap_err();
        assert!(err.contains("handlers.T") && err.contains("A=B"), "{err}");
        let err = write("pass_env = [\"\"]\n").unwrap_err();
        assert!(err.contains("handlers.T"), "{err}");
        let err = write("cwd = \"/nonexistent/dir\"\n").unwrap_err();
        assert!(
            err.contains("handlers.T.cwd") && err.contains("/nonexistent/dir"),
            "{err}"
        );
        let err = write("envv = { A = \"1\" }\n").unwrap_err();
        assert!(err.contains("envv"), "{err}");
    }
}

#[cfg(test)]
mod example_files {
    use super::*;

    /// The example settings shipped in config/ load and validate.
    #[test]
    fn shipped_examples_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        for name in ["production.toml", "compose.toml"] {
            let settings = Settings::load(Some(&dir.join(name)), Env::new())
                .unwrap_or_else(|e| panic!("config/{name}: {e}"));
            assert!(
                !settings.handlers.is_empty(),
                "config/{name} has no handlers"
            );
        }
    }
}

#[cfg(test)]
mod key_settings {
    use super::*;

    /// Prefixes and the leader key are checked by the key rule at start; the leader key may
    /// not lie under a queue prefix.
    #[test]
    fn bad_prefixes_and_leader_keys_stop_the_start() {
        for (name, value, named) in [
            ("LEADERQ__QUEUE__PREFIX", "../jobs/", "queue.prefix"),
            ("LEADERQ__QUEUE__PREFIX", "/jobs/", "queue.prefix"),
            ("LEADERQ__QUEUE__DEAD_PREFIX", "dead//", "queue.dead_prefix"),
            (
                "LEADERQ__QUEUE__DEAD_PREFIX",
                "dead letters/",
                "queue.dead_prefix",
            ),
            (
                "LEADERQ__ELECTION__LEADER_KEY",
                "a/../leader",
                "election.leader_key",
            ),
            (
                "LEADERQ__ELECTION__LEADER_KEY",
                "leader/",
                "election.leader_key",
            ),
            (
                "LEADERQ__ELECTION__LEADER_KEY",
                "oracleTask/leader",
                "election.leader_key",
            ),
            ("LEADERQ__QUEUE__DONE_PREFIX", "done//", "queue.done_prefix"),
            (
                "LEADERQ__QUEUE__DONE_PREFIX",
                "oracleTask/done/",
                "queue.done_prefix",
            ),
            ("LEADERQ__QUEUE__DONE_PREFIX", "oracle", "queue.done_prefix"),
            ("LEADERQ__QUEUE__PREFIX", "leaderq/jobs/", "queue.prefix"),
            ("LEADERQ__QUEUE__DEAD_PREFIX", "lead", "queue.dead_prefix"),
        ] {
            let err = Settings::load(None, vec![(name.to_string(), value.to_string())])
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{value:?}: {err}");
        }
    }

    /// A shard count out of range, or shard keys that would be tasks, stop the start; the
    /// shard keys are siblings of the leader key, one set per count.
    #[test]
    fn shard_settings_are_checked_and_keys_made_per_count() {
        let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        for shards in ["0", "65"] {
            let err = Settings::load(None, env(&[("LEADERQ__ELECTION__SHARDS", shards)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("election.shards"), "{shards}: {err}");
        }
        let err = Settings::load(
            None,
            env(&[
                ("LEADERQ__ELECTION__SHARDS", "4"),
                ("LEADERQ__QUEUE__PREFIX", "consumerLeader-shard/"),
                ("LEADERQ__QUEUE__DEAD_PREFIX", "consumerLeader-shard-"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("makes the shard key"), "{err}");
        let settings = Settings::load(None, env(&[("LEADERQ__ELECTION__SHARDS", "4")])).unwrap();
        let election = &settings.election;
        assert_eq!(election.shard_keys(1), ["consumerLeader"]);
        assert_eq!(
            election.for_shard(2).leader_key,
            "consumerLeader-shard-2-of-4"
        );
        assert_eq!(election.for_shard(2).shard, Some(2));
        assert_eq!(election.shard_key_of(2, 8), "consumerLeader-shard-2-of-8");
    }

    /// `election.lease_ttl`, the old name, still sets the lease TTL from a file or the
    /// environment; given together with `lease_ttl` it is refused, naming both.
    #[test]
    fn session_ttl_is_read_as_the_old_name_of_lease_ttl() {
        let from_env = Settings::load(
            None,
            tests::env(&[("LEADERQ__ELECTION__SESSION_TTL", "20s")]),
        )
        .unwrap();
        assert_eq!(from_env.election.lease_ttl, Duration::from_secs(20));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("old.toml");
        std::fs::write(&file, "[election]\nsession_ttl = \"30s\"\n").unwrap();
        let from_file = Settings::load(Some(&file), Env::new()).unwrap();
        assert_eq!(from_file.election.lease_ttl, Duration::from_secs(30));
        let new_name =
            Settings::load(None, tests::env(&[("LEADERQ__ELECTION__LEASE_TTL", "25s")])).unwrap();
        assert_eq!(new_name.election.lease_ttl, Duration::from_secs(25));
        let both = Settings::load(
            Some(&file),
            tests::env(&[("LEADERQ__ELECTION__LEASE_TTL", "25s")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            both.contains("lease_ttl") && both.contains("session_ttl"),
            "{both}"
        );
    }
}
