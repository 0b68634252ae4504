//! The Redis coordinator's link to Redis: redis-rs's connection manager (RESP3, so that
//! the changes channel's messages arrive on the same connection as the answers, and it
//! reconnects and subscribes again by itself), made on first use; running a script with
//! the prefix and the leader name in front of its arguments; and the one mapping of Redis's
//! errors to the seam's.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::layout::{change_of, Change};
use super::scripts::invoke;
use super::RedisCoordinator;
use crate::coord::CoordError;

/// The longest pause between attempts to connect again: redis-rs doubles it without a
/// ceiling, and a link back from a burst of resets stayed unused until the lease ended.
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(250);

impl RedisCoordinator {
    pub(super) async fn connection(&self) -> Result<ConnectionManager, CoordError> {
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
    pub(super) async fn run<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        args: &[&[u8]],
    ) -> Result<T, CoordError> {
        let mut connection = self.connection().await?;
        invoke(&mut connection, &self.settings.layout, script, args).await
    }

    pub(super) async fn fields(
        &self,
        script: &redis::Script,
        args: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>, CoordError> {
        self.run(script, args).await
    }
}

/// Every Redis error may pass (a restart, a network fault, a replica being promoted, a
/// busy script, an operator fixing a password): retrying is the answer, so it is
/// `Unavailable`, with what Redis said.
pub(super) fn unavailable(err: &redis::RedisError) -> CoordError {
    CoordError::Unavailable(format!(
        "redis: {err}: check that Redis is up and reachable at redis.url"
    ))
}

/// A script answered something it never sends: a bug in this module, or another
/// program's keys under our prefix.
pub(super) fn bad_answer(why: impl std::fmt::Display) -> CoordError {
    CoordError::Unavailable(format!(
        "redis answered what leaderq's scripts never send ({why}): check that nothing else writes under [redis] key_prefix"
    ))
}
