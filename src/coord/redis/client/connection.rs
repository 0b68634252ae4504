//! The connection the Redis coordinator sends on, made subscribed to the changes channel,
//! and `redis.server_name`.
//!
//! redis-rs checks a data node's certificate against the host it connects to, and its
//! connection manager (which reconnects by itself) takes no other name. With
//! `redis.server_name`, the link connects to a client whose address names the server name
//! instead of the host, and resolves that name itself to the host's addresses (a resolver
//! of its own, which only a multiplexed connection takes): the TLS name (SNI and the
//! certificate's check) is the server name, the TCP connection goes where `redis.url` or
//! the sentinels say. Such a connection does not reconnect by itself: the link marks it
//! suspect when it drops (or a call on it fails) and makes it again on the next call, as
//! it does behind Sentinel.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{AsyncConnectionConfig, ConnectionAddr, RedisFuture};

use super::super::layout::{change_of, Change};
use super::RECONNECT_MAX_DELAY;
use crate::coord::redis::RedisCoordinator;

/// A connection to the data node.
#[derive(Clone)]
pub(crate) enum Connection {
    /// redis-rs's connection manager: it reconnects and subscribes again by itself.
    Managed(ConnectionManager),
    /// A multiplexed connection checking `redis.server_name`, made again by the link.
    Named(MultiplexedConnection),
}

impl Connection {
    /// Whether it reconnects by itself (else a suspect one is made again).
    pub(super) fn reconnects(&self) -> bool {
        matches!(self, Connection::Managed(_))
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, redis::Value> {
        match self {
            Connection::Managed(manager) => manager.req_packed_command(cmd),
            Connection::Named(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Connection::Managed(manager) => manager.req_packed_commands(pipeline, offset, count),
            Connection::Named(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Managed(manager) => manager.get_db(),
            Connection::Named(connection) => connection.get_db(),
        }
    }
}

impl RedisCoordinator {
    /// A connection on `client`, subscribed to the changes channel: a connection manager,
    /// or with `redis.server_name` a connection checking that name (`named.rs`).
    pub(super) async fn connect(
        &self,
        client: redis::Client,
    ) -> Result<Connection, redis::RedisError> {
        let channel = self.settings.layout.channel();
        let server_name = &self.settings.tls.server_name;
        if let Some(renamed) = renamed(&client, server_name).filter(|_| !server_name.is_empty()) {
            let (client, resolver) = renamed?;
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.settings.request_timeout))
                .set_response_timeout(Some(self.settings.request_timeout))
                .set_push_sender(self.push_sender())
                .set_dns_resolver(resolver);
            let mut connection = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            connection.subscribe(channel).await?;
            return Ok(Connection::Named(connection));
        }
        let config = ConnectionManagerConfig::new()
            .set_max_delay(RECONNECT_MAX_DELAY)
            .set_connection_timeout(Some(self.settings.request_timeout))
            .set_response_timeout(Some(self.settings.request_timeout))
            .set_automatic_resubscription()
            .set_push_sender(self.push_sender());
        let mut manager = ConnectionManager::new_with_config(client, config).await?;
        manager.subscribe(channel).await?;
        Ok(Connection::Managed(manager))
    }

    /// What the connection does with Redis's pushes: the changes channel's messages wake
    /// the waiters; a disconnection makes the link suspect.
    fn push_sender(
        &self,
    ) -> impl Fn(redis::PushInfo) -> Result<(), std::convert::Infallible> + Send + Sync + 'static
    {
        let changes = self.changes.clone();
        let heard = self.heard.clone();
        let suspect = self.link.suspect.clone();
        move |info: redis::PushInfo| {
            match info.kind {
                redis::PushKind::Message => {
                    heard.fetch_add(1, Ordering::Relaxed);
                    // [channel, message]
                    let change = match info.data.last() {
                        Some(redis::Value::BulkString(message)) => change_of(message),
                        _ => Change::Any,
                    };
                    // No waiter listening is no error.
                    let _ = changes.send(change);
                }
                // The primary died, or was demoted (Sentinel closes its clients).
                redis::PushKind::Disconnection => suspect.store(true, Ordering::Relaxed),
                _ => {}
            }
            Ok::<(), std::convert::Infallible>(())
        }
    }
}

/// Resolves `name` (the server name) to `host`'s addresses; any other host as itself.
#[derive(Clone, Debug)]
pub(super) struct Pinned {
    name: String,
    host: String,
}

impl redis::io::AsyncDNSResolver for Pinned {
    fn resolve<'a, 'b: 'a>(
        &'a self,
        host: &'b str,
        port: u16,
    ) -> RedisFuture<'a, Box<dyn Iterator<Item = SocketAddr> + Send + 'a>> {
        let host = if host == self.name {
            self.host.clone()
        } else {
            host.to_string()
        };
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect();
            Ok(Box::new(found.into_iter()) as Box<dyn Iterator<Item = SocketAddr> + Send>)
        })
    }
}

/// `client` (a TLS one) made to check `server_name` instead of its host, and the resolver
/// that sends its connections to that host. `None` for an address that is not TLS.
pub(super) fn renamed(
    client: &redis::Client,
    server_name: &str,
) -> Option<Result<(redis::Client, Pinned), redis::RedisError>> {
    let info = client.get_connection_info().clone();
    let ConnectionAddr::TcpTls {
        host,
        port,
        insecure,
        tls_params,
    } = info.addr().clone()
    else {
        return None;
    };
    let pinned = Pinned {
        name: server_name.to_string(),
        host,
    };
    let info = info.set_addr(ConnectionAddr::TcpTls {
        host: server_name.to_string(),
        port,
        insecure,
        tls_params,
    });
    Some(redis::Client::open(info).map(|client| (client, pinned)))
}

#[cfg(test)]
mod tests {
    use redis::io::AsyncDNSResolver as _;

    use super::{renamed, Pinned};

    /// The server name resolves to the host the client was made for; other hosts as
    /// themselves.
    #[tokio::test]
    async fn the_server_name_resolves_to_the_real_host() {
        let pinned = Pinned {
            name: "redis.internal.example".into(),
            host: "127.0.0.1".into(),
        };
        let found: Vec<_> = pinned
            .resolve("redis.internal.example", 6380)
            .await
            .unwrap()
            .collect();
        assert_eq!(found, vec!["127.0.0.1:6380".parse().unwrap()]);
        let other: Vec<_> = pinned.resolve("127.0.0.2", 7).await.unwrap().collect();
        assert_eq!(other, vec!["127.0.0.2:7".parse().unwrap()]);
    }

    /// A TLS client is renamed (its address names the server name, its port and TLS
    /// parameters kept); a plain one is not.
    #[test]
    fn only_a_tls_client_is_renamed() {
        let tls = redis::Client::open("rediss://10.0.0.7:6380/0").unwrap();
        let (client, _) = renamed(&tls, "redis.internal.example").unwrap().unwrap();
        assert_eq!(
            client.get_connection_info().addr().to_string(),
            "redis.internal.example:6380"
        );
        let plain = redis::Client::open("redis://10.0.0.7:6379/0").unwrap();
        assert!(renamed(&plain, "redis.internal.example").is_none());
    }
}
