//! The Redis coordinator's link to Redis: redis-rs's connection manager (RESP3, so that
//! the changes channel's messages arrive on the same connection as the answers, and it
//! reconnects and subscribes again by itself), made on first use; running a script with
//! the prefix and the leader name in front of its arguments; every write followed by
//! `WAIT` when `redis.wait_replicas` asks for it; and the one mapping of Redis's errors to
//! the seam's.
//!
//! Behind Sentinel the link goes to the primary the sentinels name (redis-rs's
//! `SentinelClient` asks them, `SENTINEL MASTERS`, and checks with `ROLE` that the node it
//! found says it is the primary). The connection manager reconnects to one address only,
//! so the link is made again when the sentinels name another: a link is suspect once its
//! connection dropped (a dead primary, or one Sentinel demoted, which closes its clients),
//! a write failed (`READONLY` from a demoted node among them) or fell short of replicas;
//! the next call on a suspect link asks the sentinels where the primary is, and keeps the
//! link only if it is still the one they name.
//!
//! With `redis.password_file`, a suspect link (its connection dropped, a write failed) also
//! reads the file again, and is made again if the password changed: the connection manager
//! would log in again with the password it was made with.
//!
//! With TLS files (`redis.ca_file`, `cert_file`, `key_file`), the client presents the
//! certificate to the data nodes and trusts the CA given; a suspect link reads the files
//! again, and is made again if they changed (the manager reconnects with the certificates it
//! was made with). A handshake that fails before Redis ever answered stops the start,
//! naming the setting (`Refused`); afterwards it is retried as any network error.
//!
//! A write's `WAIT` is pipelined with it, so both go on one connection: a `WAIT` sent on a
//! connection made again after the write would count none of its writes and answer at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ClientTlsConfig, IntoConnectionInfo, ProtocolVersion, TlsCertificates, TlsMode};

use super::scripts::invoke;
use super::{RedisCoordSettings, RedisCoordinator};
use crate::coord::{CoordError, Leases as _};
use crate::util::tls::explain;

mod connection;

pub(crate) use connection::Connection;

/// The longest pause between attempts to connect again: redis-rs doubles it without a
/// ceiling, and a link back from a burst of resets stayed unused until the lease ended.
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(250);

/// Where the coordinator's connections go.
pub(super) enum Source {
    /// The one server `redis.url` names.
    Server(redis::ConnectionAddr),
    /// The primary the sentinels name, asked again when the link is suspect; with the
    /// password and certificates its client gives the data nodes.
    Sentinel(Box<tokio::sync::Mutex<(SentinelClient, Login)>>),
}

/// What a client logs in with: the password, and the TLS files' stamps (a rotated file
/// changes them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Login {
    password: String,
    stamp: Vec<Option<(std::time::SystemTime, u64)>>,
}

impl Login {
    /// The password (`redis.password_file`'s, read now) and the TLS files' stamps now.
    fn now(settings: &RedisCoordSettings) -> Result<Login, String> {
        Ok(Login {
            password: password(settings)?,
            stamp: settings.tls.stamp(),
        })
    }
}

/// The data nodes' certificates from the TLS files, read now; `None` without any.
fn certificates(settings: &RedisCoordSettings) -> Result<Option<TlsCertificates>, String> {
    if !settings.tls.is_set() {
        return Ok(None);
    }
    let material = settings.tls.load("redis")?;
    Ok(Some(TlsCertificates {
        client_tls: material.identity.map(|identity| ClientTlsConfig {
            client_cert: identity.cert_pem,
            client_key: identity.key_pem,
        }),
        root_cert: material.ca_pem,
    }))
}

impl Source {
    pub(super) fn new(settings: &RedisCoordSettings) -> Result<Source, CoordError> {
        let login = Login::now(settings).map_err(CoordError::Refused)?;
        let certs = certificates(settings).map_err(CoordError::Refused)?;
        if settings.sentinels.is_empty() {
            let client = server(settings, &login.password, certs)?;
            return Ok(Source::Server(client.get_connection_info().addr().clone()));
        }
        let client = sentinels_client(settings, &login.password, certs)?;
        let sentinels = tokio::sync::Mutex::new((client, login));
        Ok(Source::Sentinel(Box::new(sentinels)))
    }

    /// Whether the link follows the sentinels (else a suspect link is kept: its manager
    /// reconnects to the one server by itself).
    pub(super) fn follows(&self) -> bool {
        matches!(self, Source::Sentinel(_))
    }
}

/// The data nodes' password: `redis.password_file`'s, read now, or `redis.password`.
fn password(settings: &RedisCoordSettings) -> Result<String, String> {
    match &settings.password_file {
        Some(path) => super::read_password_file(path),
        None => Ok(settings.password.clone()),
    }
}

/// The client of the sentinels, which gives the data nodes `password`, and `certs` over TLS.
fn sentinels_client(
    settings: &RedisCoordSettings,
    password: &str,
    certs: Option<TlsCertificates>,
) -> Result<SentinelClient, CoordError> {
    let refused = |err: redis::RedisError| {
        CoordError::Refused(format!("redis.sentinels: {err}: fix the [redis] settings"))
    };
    let addrs = settings.sentinels.iter().map(|(host, port)| {
        let (host, port) = (host.clone(), *port);
        if settings.sentinel_tls {
            redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            redis::ConnectionAddr::Tcp(host, port)
        }
    });
    let mut builder =
        SentinelClientBuilder::new(addrs, &settings.master_name, SentinelServerType::Master)
            .map_err(refused)?
            // RESP3 to the data nodes, as for one server (the changes channel).
            .set_client_to_redis_protocol(ProtocolVersion::RESP3);
    if !password.is_empty() {
        builder = builder.set_client_to_redis_password(password);
    }
    if !settings.sentinel_password.is_empty() {
        builder = builder.set_client_to_sentinel_password(&settings.sentinel_password);
    }
    if settings.sentinel_tls {
        // The sentinels' certificates are checked against their addresses as given.
        builder = builder.set_client_to_sentinel_tls_mode(TlsMode::Secure);
        if let Some(certs) = &certs {
            builder = builder.set_client_to_sentinel_certificates(certs.clone());
        }
    }
    if let Some(certs) = certs {
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_redis_certificates(certs);
    }
    builder.build().map_err(refused)
}

/// The client of the one server `settings.url` names, with `password` (if not empty, over
/// the URL's), RESP3, and `certs` (a `rediss://` URL).
fn server(
    settings: &RedisCoordSettings,
    password: &str,
    certs: Option<TlsCertificates>,
) -> Result<redis::Client, CoordError> {
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
    if !password.is_empty() {
        redis_settings = redis_settings.set_password(password);
    }
    let info = info.set_redis_settings(redis_settings);
    match certs {
        None => redis::Client::open(info),
        Some(certs) => redis::Client::build_with_tls(info, certs),
    }
    .map_err(|err| CoordError::Refused(format!("redis.url: {err}: fix the [redis] settings")))
}

/// The connection in use: its manager, where it goes, what it logged in with.
#[derive(Clone)]
struct Current {
    manager: Connection,
    addr: String,
    login: Login,
}

/// The connection in use, and whether it is suspect.
#[derive(Default)]
pub(super) struct Link {
    current: std::sync::Mutex<Option<Current>>,
    /// One connect, or one question to the sentinels, at a time.
    connecting: tokio::sync::Mutex<()>,
    suspect: Arc<AtomicBool>,
    /// Whether Redis ever answered a connection: before, a failed TLS handshake stops the
    /// start; after, it is retried.
    answered: AtomicBool,
}

impl Link {
    fn now(&self) -> Option<Current> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The manager in use, unless it is suspect and `checked` (behind Sentinel, or with a
    /// password file): then where it goes, or with what, is asked again first.
    fn usable(&self, checked: bool) -> Option<Connection> {
        if checked && self.suspect.load(Ordering::Relaxed) {
            return None;
        }
        self.now().map(|current| current.manager)
    }

    /// The manager in use if it goes to `addr` (any, for `None`) with `login`, no longer
    /// suspect; never a connection that does not reconnect by itself (it may be closed).
    fn still(&self, addr: Option<&str>, login: &Login) -> Option<Connection> {
        let current = self.now()?;
        if addr.is_some_and(|addr| addr != current.addr)
            || current.login != *login
            || !current.manager.reconnects()
        {
            return None;
        }
        self.suspect.store(false, Ordering::Relaxed);
        Some(current.manager)
    }

    fn set(&self, current: Current) {
        self.suspect.store(false, Ordering::Relaxed);
        self.answered.store(true, Ordering::Relaxed);
        *self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(current);
    }

    fn suspect(&self) {
        self.suspect.store(true, Ordering::Relaxed);
    }
}

impl RedisCoordinator {
    /// Where the link goes now (the primary last found behind Sentinel), once made.
    pub(super) fn current_address(&self) -> Option<String> {
        self.link.now().map(|current| current.addr)
    }

    /// The connection made so far, if any, without making one.
    pub(super) fn current_connection(&self) -> Option<Connection> {
        self.link.now().map(|current| current.manager)
    }

    /// The connection to Redis (behind Sentinel, to the primary), made on first use, and
    /// made again when it is suspect and the sentinels name another primary or the password
    /// file holds another password or the TLS files changed.
    pub(super) async fn connection(&self) -> Result<Connection, CoordError> {
        let checked = self.source.follows()
            || self.settings.password_file.is_some()
            || self.settings.tls.is_set()
            || !self.settings.tls.server_name.is_empty();
        if let Some(manager) = self.link.usable(checked) {
            return Ok(manager);
        }
        let _one = self.link.connecting.lock().await;
        if let Some(manager) = self.link.usable(checked) {
            return Ok(manager);
        }
        let login = Login::now(&self.settings).map_err(|why| {
            CoordError::Unavailable(format!("{why}; until then Redis cannot be logged in to"))
        })?;
        let client = match &self.source {
            Source::Server(_) => {
                if let Some(manager) = self.link.still(None, &login) {
                    // The manager reconnects to the one server by itself.
                    return Ok(manager);
                }
                let certs = certificates(&self.settings).map_err(|why| self.unreadable(why))?;
                server(&self.settings, &login.password, certs)?
            }
            Source::Sentinel(sentinels) => {
                let found = self.primary(sentinels, &login).await?;
                let addr = found.get_connection_info().addr().to_string();
                if let Some(manager) = self.link.still(Some(&addr), &login) {
                    return Ok(manager);
                }
                if let Some(was) = self.current_address().filter(|was| *was != addr) {
                    tracing::warn!(
                        "the sentinels name {addr} the Redis primary (was {was}): following it"
                    );
                }
                found
            }
        };
        let addr = client.get_connection_info().addr().to_string();
        let manager = self
            .connect(client)
            .await
            .map_err(|err| self.failed(&addr, &err))?;
        self.link.set(Current {
            manager: manager.clone(),
            addr,
            login,
        });
        Ok(manager)
    }

    /// A connection's failure: a TLS handshake's before Redis ever answered is `Refused`,
    /// naming the setting (later `Unavailable`, still naming it); any other `Unavailable`.
    fn failed(&self, addr: &str, err: &redis::RedisError) -> CoordError {
        let Some(why) = explain("redis", err) else {
            return unavailable(err);
        };
        let why = format!("TLS to Redis at {addr} failed: {why}");
        if self.link.answered.load(Ordering::Relaxed) {
            CoordError::Unavailable(why)
        } else {
            CoordError::Refused(why)
        }
    }

    /// TLS files that cannot be read (or hold no certificate): refused before Redis ever
    /// answered; later, a rotation half done, retried.
    fn unreadable(&self, why: String) -> CoordError {
        if self.link.answered.load(Ordering::Relaxed) {
            CoordError::Unavailable(format!("{why}; until then Redis cannot be reached"))
        } else {
            CoordError::Refused(why)
        }
    }

    /// A client of the primary the sentinels name, which says it is one, logging in with
    /// `login` (the sentinels' client is made again if it held another).
    async fn primary(
        &self,
        sentinels: &tokio::sync::Mutex<(SentinelClient, Login)>,
        login: &Login,
    ) -> Result<redis::Client, CoordError> {
        let mut sentinels = sentinels.lock().await;
        if sentinels.1 != *login {
            let certs = certificates(&self.settings).map_err(|why| self.unreadable(why))?;
            *sentinels = (
                sentinels_client(&self.settings, &login.password, certs)?,
                login.clone(),
            );
        }
        tokio::time::timeout(self.settings.request_timeout, sentinels.0.async_get_client())
            .await
            .map_err(|_| {
                CoordError::Unavailable(format!(
                    "redis: no sentinel named a primary {:?} that answers within {:?}: check the sentinels at redis.sentinels and the primary they name",
                    self.settings.master_name, self.settings.request_timeout
                ))
            })?
            .map_err(|err| {
                if let CoordError::Refused(why) = self.failed("the primary", &err) {
                    return CoordError::Refused(why);
                }
                CoordError::Unavailable(format!(
                    "redis: sentinels: {err}: check that the sentinels at redis.sentinels are up, monitor redis.master_name {:?}, and that the primary they name answers",
                    self.settings.master_name
                ))
            })
    }

    /// Runs `script` with the prefix, the leader name and `args`, answering its fields. For
    /// scripts that only read.
    pub(super) async fn run<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        args: &[&[u8]],
    ) -> Result<T, CoordError> {
        let mut connection = self.connection().await?;
        let answer = invoke(&mut connection, &self.settings.layout, script, args).await;
        if answer.is_err() && !connection.reconnects() {
            // Closed, perhaps without a word: made again on the next call.
            self.link.suspect();
        }
        answer
    }

    pub(super) async fn fields(
        &self,
        script: &redis::Script,
        args: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>, CoordError> {
        self.run(script, args).await
    }

    /// Runs `script`, which writes, as [`RedisCoordinator::run`] does; then, with
    /// `redis.wait_replicas`, waits for that many replicas to have it. Fewer by the timeout
    /// is `Unavailable`, as an answer lost: the write may or may not survive a failover.
    pub(super) async fn write<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        args: &[&[u8]],
    ) -> Result<T, CoordError> {
        let answer = self.replicated(Sent::Hash(script), args).await;
        if answer.is_err() {
            self.link.suspect();
        }
        answer
    }

    pub(super) async fn write_fields(
        &self,
        script: &redis::Script,
        args: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>, CoordError> {
        self.write(script, args).await
    }

    /// Runs `script`'s text with EVAL (one round trip whatever Redis's script cache holds),
    /// then waits for replicas as [`RedisCoordinator::write`] does.
    pub(super) async fn write_text<T: redis::FromRedisValue>(
        &self,
        script: &str,
        args: &[&[u8]],
    ) -> Result<T, CoordError> {
        let answer = self.replicated(Sent::Text(script), args).await;
        if answer.is_err() {
            self.link.suspect();
        }
        answer
    }

    async fn replicated<T: redis::FromRedisValue>(
        &self,
        sent: Sent<'_>,
        args: &[&[u8]],
    ) -> Result<T, CoordError> {
        let mut connection = self.connection().await?;
        let wanted = self.settings.wait_replicas;
        let command = sent.command(&self.settings.layout, args);
        if wanted == 0 {
            return match command.query_async(&mut connection).await {
                Err(err) if is_no_script(&err) => {
                    sent.load(&mut connection).await?;
                    command.query_async(&mut connection).await
                }
                answer => answer,
            }
            .map_err(|err| unavailable(&err));
        }
        let timeout = self.settings.wait_replicas_timeout.as_millis().max(1) as u64;
        let mut pipe = redis::pipe();
        pipe.add_command(command)
            .cmd("WAIT")
            .arg(wanted)
            .arg(timeout);
        let (answer, confirmed): (T, u64) = match pipe.query_async(&mut connection).await {
            Err(err) if is_no_script(&err) => {
                sent.load(&mut connection).await?;
                pipe.query_async(&mut connection).await
            }
            answer => answer,
        }
        .map_err(|err| unavailable(&err))?;
        if confirmed < u64::from(wanted) {
            return Err(CoordError::Unavailable(format!(
                "redis: a write reached {confirmed} of the {wanted} replica(s) redis.wait_replicas asks for within redis.wait_replicas_timeout ({:?}), so it may not survive a failover and counts as unanswered: check the replicas (INFO replication on {})",
                self.settings.wait_replicas_timeout,
                self.describe()
            )));
        }
        Ok(answer)
    }
}

/// A script as sent: by its hash (`EVALSHA`, loaded if Redis lacks it) or as its text.
#[derive(Clone, Copy)]
enum Sent<'a> {
    Hash(&'a redis::Script),
    Text(&'a str),
}

impl Sent<'_> {
    fn command(self, layout: &super::Layout, args: &[&[u8]]) -> redis::Cmd {
        let mut command = match self {
            Sent::Hash(script) => {
                let mut command = redis::cmd("EVALSHA");
                command.arg(script.get_hash());
                command
            }
            Sent::Text(text) => {
                let mut command = redis::cmd("EVAL");
                command.arg(text);
                command
            }
        };
        command
            .arg(0)
            .arg(layout.prefix.as_bytes())
            .arg(layout.leader.as_bytes());
        for arg in args {
            command.arg(*arg);
        }
        command
    }

    async fn load(self, connection: &mut Connection) -> Result<(), CoordError> {
        if let Sent::Hash(script) = self {
            script
                .load_async(connection)
                .await
                .map_err(|err| unavailable(&err))?;
        }
        Ok(())
    }
}

/// Whether Redis lacks the script (also as the error of a pipeline's first command).
fn is_no_script(err: &redis::RedisError) -> bool {
    err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        || err.to_string().contains("NOSCRIPT")
}

/// Every Redis error may pass (a restart, a network fault, a replica being promoted, a
/// busy script, an operator fixing a password): retrying is the answer, so it is
/// `Unavailable`, with what Redis said.
pub(super) fn unavailable(err: &redis::RedisError) -> CoordError {
    CoordError::Unavailable(format!(
        "redis: {err}: check that Redis is up and reachable at redis.url, or through redis.sentinels"
    ))
}

/// A script answered something it never sends: a bug in this module, or another
/// program's keys under our prefix.
pub(super) fn bad_answer(why: impl std::fmt::Display) -> CoordError {
    CoordError::Unavailable(format!(
        "redis answered what leaderq's scripts never send ({why}): check that nothing else writes under [redis] key_prefix"
    ))
}
