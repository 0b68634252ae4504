//! Whether a Redis server can lose acknowledged writes, judged from its own settings: the
//! verdict a replica acts on before it opens a lease (refuse, or run with the loss
//! accepted through `redis.accept_data_loss`). The verdict ([`risks`], [`refusal`]) is pure;
//! [`RedisCoordinator::check_durability`] reads the settings (`CONFIG GET`, or `INFO` where
//! CONFIG is renamed or forbidden) and acts on it.
//!
//! Where the line is drawn, and why (docs/redis.md, "What Redis must be configured with"):
//! - `appendonly no` loses everything since the last snapshot on any restart of Redis, a
//!   routine event: refused;
//! - `appendfsync no` leaves the flush to the kernel (about 30 s on Linux, unbounded by
//!   Redis) and loses it on a crash of the host: refused;
//! - `appendfsync everysec` loses at most about a second (two at worst) of writes, and only
//!   on a crash of the host: Redis writes the AOF before it answers, so a crash or SIGKILL of
//!   Redis itself loses nothing (measured in the tests). A single Redis does not survive
//!   the loss of its host anyway, and fencing tokens do not depend on it: accepted;
//! - any `maxmemory-policy` but `noeviction` may evict a lease, the leader key or a task
//!   under memory pressure (the `volatile-*` policies pick exactly the keys with a TTL:
//!   leases and the leader key): refused;
//! - a setting that cannot be read is refused like a bad one: nothing says it is safe;
//! - behind Sentinel, `redis.wait_replicas = 0` lets a failover lose every write the old
//!   primary acknowledged before it replicated it, whatever the settings above: refused
//!   (the primary's own settings are read on the primary the sentinels name).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::client::Connection;

use super::{unavailable, RedisCoordinator};
use crate::coord::{CoordError, Leases};

/// Said of a setting that neither CONFIG nor INFO answered.
const UNREAD: &str = "cannot be read";

/// Opens the risk of a failover without the replica wait.
const UNREPLICATED: &str = "behind Sentinel, redis.wait_replicas is 0";

/// What could be read of a Redis server's persistence and eviction settings; `None`
/// where nothing answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerSettings {
    /// `appendonly`: whether the AOF is on.
    pub appendonly: Option<bool>,
    /// `appendfsync`: "always", "everysec" or "no" (`INFO` does not show it).
    pub appendfsync: Option<String>,
    /// `maxmemory-policy`: "noeviction", "allkeys-lru", …
    pub eviction: Option<String>,
}

impl ServerSettings {
    /// From the answers of `CONFIG GET appendonly`, `appendfsync` and `maxmemory-policy`
    /// (`None` for one Redis refused).
    pub fn from_config(
        appendonly: Option<&str>,
        appendfsync: Option<&str>,
        eviction: Option<&str>,
    ) -> ServerSettings {
        ServerSettings {
            appendonly: appendonly.and_then(yes_no),
            appendfsync: appendfsync.map(str::to_string),
            eviction: eviction.map(str::to_string),
        }
    }

    /// Fills what CONFIG did not give from the texts of `INFO persistence` (its
    /// `aof_enabled`) and `INFO memory` (its `maxmemory_policy`), when they were read.
    pub fn or_info(self, persistence: Option<&str>, memory: Option<&str>) -> ServerSettings {
        let aof = persistence.and_then(|text| info_field(text, "aof_enabled"));
        let policy = memory.and_then(|text| info_field(text, "maxmemory_policy"));
        ServerSettings {
            appendonly: self.appendonly.or(match aof {
                Some("1") => Some(true),
                Some("0") => Some(false),
                _ => None,
            }),
            appendfsync: self.appendfsync,
            eviction: self.eviction.or(policy.map(str::to_string)),
        }
    }

    /// Whether every setting needed for a verdict was read (else `INFO` is worth asking).
    pub fn complete(&self) -> bool {
        self.appendonly.is_some() && self.appendfsync.is_some() && self.eviction.is_some()
    }
}

fn yes_no(value: &str) -> Option<bool> {
    match value {
        "yes" => Some(true),
        "no" => Some(false),
        _ => None,
    }
}

/// The value of `name` in an `INFO` section's `name:value` lines.
fn info_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let (key, value) = line.trim_end_matches('\r').split_once(':')?;
        (key == name).then_some(value.trim())
    })
}

/// What in `server` can lose acknowledged writes (or cannot be read), one clause each,
/// naming the Redis setting; empty when it loses none short of losing its host.
pub fn risks(server: &ServerSettings) -> Vec<String> {
    let mut risks = Vec::new();
    match server.appendonly {
        None => risks.push(
            format!("appendonly {UNREAD} (this Redis user may run neither CONFIG GET nor INFO persistence)"),
        ),
        Some(false) => risks.push(
            "appendonly is no (a restart of Redis loses every task, claim and completion written since its last RDB snapshot, if any)".to_string(),
        ),
        Some(true) => match server.appendfsync.as_deref() {
            Some("always" | "everysec") => {}
            None => risks.push(format!(
                "appendfsync {UNREAD} (CONFIG GET is refused, and INFO does not show it)"
            )),
            Some(other) => risks.push(format!(
                "appendfsync is {other} (a crash of the Redis host loses what the kernel had not yet flushed, about 30 s of writes on Linux)"
            )),
        },
    }
    match server.eviction.as_deref() {
        Some("noeviction") => {}
        None => risks.push(
            format!("maxmemory-policy {UNREAD} (this Redis user may run neither CONFIG GET nor INFO memory)"),
        ),
        Some(policy) => risks.push(format!(
            "maxmemory-policy is {policy} (under memory pressure Redis may evict a lease, the leader key or a task)"
        )),
    }
    risks
}

/// What a failover can lose: behind Sentinel (`follows`), a write counted before any
/// replica has it is lost when the primary dies before sending it on.
pub fn replication_risk(follows: bool, wait_replicas: u32) -> Option<String> {
    (follows && wait_replicas == 0).then(|| {
        format!("{UNREPLICATED} (a failover loses every write the old primary acknowledged but had not yet sent to the promoted replica: tasks enqueued, claims, completions)")
    })
}

/// The message a replica stops with on `redis` (where it is) with these `risks`: what is
/// wrong, how to fix Redis (or the replica wait), and the leaderq setting that accepts the
/// risk instead.
pub fn refusal(redis: &str, risks: &[String]) -> String {
    let unread = risks.iter().any(|risk| risk.contains(UNREAD));
    let mut fixes = Vec::new();
    if risks.iter().any(|risk| !risk.starts_with(UNREPLICATED)) {
        fixes.push(format!(
            "fix it on the Redis server (appendonly yes, appendfsync always or everysec, maxmemory-policy noeviction{})",
            if unread {
                ", and let leaderq's Redis user run CONFIG GET"
            } else {
                ""
            }
        ));
    }
    if risks.iter().any(|risk| risk.starts_with(UNREPLICATED)) {
        fixes.push(
            "set redis.wait_replicas = 1 or more (LEADERQ__REDIS__WAIT_REPLICAS=1) so that each write waits for that many replicas"
                .to_string(),
        );
    }
    format!(
        "{redis} can lose acknowledged writes, so this replica will not lead on it: {}; {}, or, to run anyway, set redis.accept_data_loss = true (LEADERQ__REDIS__ACCEPT_DATA_LOSS=true): docs/redis.md, \"Accepting the risk\", says what can then be lost",
        risks.join("; "),
        fixes.join(", and ")
    )
}

/// The warning a replica logs once when it runs on such a Redis as
/// `redis.accept_data_loss` allows.
pub fn accepted(redis: &str, risks: &[String]) -> String {
    format!(
        "{redis} can lose acknowledged writes, which redis.accept_data_loss = true accepts: {}; fencing tokens still only rise",
        risks.join("; ")
    )
}

impl RedisCoordinator {
    /// Refuses (or, as `accept_data_loss` allows, logs once) a Redis whose settings can
    /// lose acknowledged writes. Asked before every lease is opened, so a Redis restarted
    /// with other settings is judged again; whoever opens no lease (a producer, `status`,
    /// `tasks`) is never refused.
    pub(super) async fn check_durability(&self) -> Result<(), CoordError> {
        let connection = self.connection().await?;
        let server = read_server_settings(&connection)
            .await
            .map_err(|err| unavailable(&err))?;
        let mut found = risks(&server);
        found.extend(replication_risk(
            self.source.follows(),
            self.settings.wait_replicas,
        ));
        if found.is_empty() {
            return Ok(());
        }
        if !self.settings.accept_data_loss {
            return Err(CoordError::Refused(refusal(&self.describe(), &found)));
        }
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!("{}", accepted(&self.describe(), &found));
        }
        Ok(())
    }
}

/// Redis's persistence and eviction settings, by `CONFIG GET`, and by `INFO persistence`
/// and `INFO memory` for what CONFIG did not answer (renamed, or forbidden to this user).
/// A command Redis refuses leaves its settings unread; a transport error is an error.
async fn read_server_settings(
    connection: &Connection,
) -> Result<ServerSettings, redis::RedisError> {
    let config = |name: &'static str| {
        let mut connection = connection.clone();
        async move {
            // A map in RESP3, pairs in RESP2: both read as one; empty for an unknown name.
            let answer: Result<HashMap<String, String>, _> = redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async(&mut connection)
                .await;
            unless_refused(answer).map(|found| found.and_then(|mut map| map.remove(name)))
        }
    };
    let server = ServerSettings::from_config(
        config("appendonly").await?.as_deref(),
        config("appendfsync").await?.as_deref(),
        config("maxmemory-policy").await?.as_deref(),
    );
    if server.complete() {
        return Ok(server);
    }
    let info = |section: &'static str| {
        let mut connection = connection.clone();
        async move {
            let answer: Result<String, _> = redis::cmd("INFO")
                .arg(section)
                .query_async(&mut connection)
                .await;
            unless_refused(answer)
        }
    };
    let persistence = info("persistence").await?;
    let memory = info("memory").await?;
    Ok(server.or_info(persistence.as_deref(), memory.as_deref()))
}

/// `None` for a command Redis refused to run (unknown or renamed: `ERR`; not allowed to
/// this user: `NOPERM`); other errors (the connection, Redis loading its data) pass on.
fn unless_refused<T>(answer: Result<T, redis::RedisError>) -> Result<Option<T>, redis::RedisError> {
    use redis::{ErrorKind, ServerErrorKind};
    match answer {
        Ok(value) => Ok(Some(value)),
        Err(err)
            if matches!(
                err.kind(),
                ErrorKind::Server(ServerErrorKind::ResponseError | ServerErrorKind::NoPerm)
                    | ErrorKind::Extension
            ) =>
        {
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(appendonly: &str, appendfsync: &str, eviction: &str) -> ServerSettings {
        ServerSettings::from_config(Some(appendonly), Some(appendfsync), Some(eviction))
    }

    /// The AOF with `appendfsync always` or `everysec` and `noeviction` is safe; no AOF,
    /// `appendfsync no` and every eviction policy are each named with its Redis setting.
    #[test]
    fn only_settings_that_lose_acknowledged_writes_are_risks() {
        assert!(risks(&config("yes", "always", "noeviction")).is_empty());
        assert!(risks(&config("yes", "everysec", "noeviction")).is_empty());
        let off = risks(&config("no", "everysec", "noeviction"));
        assert!(
            off.len() == 1 && off[0].starts_with("appendonly is no"),
            "{off:?}"
        );
        let unflushed = risks(&config("yes", "no", "noeviction"));
        assert!(
            unflushed.len() == 1 && unflushed[0].starts_with("appendfsync is no"),
            "{unflushed:?}"
        );
        for policy in ["allkeys-lru", "volatile-ttl", "allkeys-random"] {
            let evicting = risks(&config("yes", "always", policy));
            assert!(
                evicting.len() == 1
                    && evicting[0].starts_with(&format!("maxmemory-policy is {policy}")),
                "{evicting:?}"
            );
        }
        assert_eq!(risks(&config("no", "no", "allkeys-lru")).len(), 2);
    }

    /// Where CONFIG is refused, `INFO` supplies the AOF and the eviction policy but not the
    /// fsync policy, which is then a risk that cannot be read; with neither, every
    /// setting is.
    #[test]
    fn what_info_cannot_show_is_a_risk_that_cannot_be_read() {
        let persistence =
            "# Persistence\r\nloading:0\r\naof_enabled:1\r\naof_rewrite_in_progress:0\r\n";
        let memory = "# Memory\r\nused_memory:1000\r\nmaxmemory_policy:noeviction\r\n";
        let none = ServerSettings::from_config(None, None, None);
        assert!(!none.complete());
        let from_info = none.clone().or_info(Some(persistence), Some(memory));
        assert_eq!(from_info.appendonly, Some(true));
        assert_eq!(from_info.eviction.as_deref(), Some("noeviction"));
        let read = risks(&from_info);
        assert!(
            read.len() == 1 && read[0].starts_with("appendfsync cannot be read"),
            "{read:?}"
        );
        let no_aof = none
            .clone()
            .or_info(Some("aof_enabled:0\r\n"), Some(memory));
        assert!(risks(&no_aof)[0].starts_with("appendonly is no"));
        let unread = risks(&none.or_info(None, None));
        assert!(
            unread.len() == 2 && unread.iter().all(|r| r.contains("cannot be read")),
            "{unread:?}"
        );
        let read_by_config = config("yes", "always", "noeviction");
        assert!(read_by_config.complete());
        assert_eq!(
            read_by_config
                .clone()
                .or_info(Some("aof_enabled:0"), Some("maxmemory_policy:allkeys-lru")),
            read_by_config,
            "INFO overrode what CONFIG answered"
        );
    }

    /// The refusal names the Redis setting at fault and the leaderq setting (and its
    /// environment variable) that accepts the risk.
    #[test]
    fn the_refusal_says_how_to_fix_redis_or_accept_the_risk() {
        let message = refusal(
            "Redis at 127.0.0.1:6379",
            &risks(&config("no", "always", "noeviction")),
        );
        for named in [
            "Redis at 127.0.0.1:6379",
            "appendonly is no",
            "redis.accept_data_loss = true",
            "LEADERQ__REDIS__ACCEPT_DATA_LOSS=true",
        ] {
            assert!(message.contains(named), "{named:?} missing from {message}");
        }
        assert!(!message.ends_with('.') && !message.contains("CONFIG GET"));
        let unread = refusal("Redis", &risks(&ServerSettings::default()));
        assert!(unread.contains("run CONFIG GET"), "{unread}");
    }

    /// Behind Sentinel, no replica wait is a risk, and its refusal names both ways out:
    /// the wait, or accepting the loss; with one server, or with the wait, it is none.
    #[test]
    fn behind_sentinel_without_the_replica_wait_a_failover_is_a_risk() {
        assert_eq!(replication_risk(false, 0), None);
        assert_eq!(replication_risk(true, 1), None);
        let risk = replication_risk(true, 0).unwrap();
        let message = refusal("Redis primary", &[risk]);
        for named in [
            "redis.wait_replicas is 0",
            "set redis.wait_replicas = 1 or more",
            "redis.accept_data_loss = true",
        ] {
            assert!(message.contains(named), "{named:?} missing from {message}");
        }
        assert!(!message.contains("appendonly yes"), "{message}");
    }
}
