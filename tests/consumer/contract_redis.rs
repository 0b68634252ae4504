//! The coordinator contract suite (`coord::contract`), every check, against the Redis
//! backend on a real `redis-server` (AOF on, `appendfsync always`): the same checks the
//! in-memory and Consul coordinators pass.

use std::sync::Arc;

use leaderq::coord::contract::{self, Producer, Subject, Timing};
use leaderq::coord::redis::{Layout, RedisCoordSettings, RedisCoordinator};
use leaderq::coord::CoordFuture;
use leaderq::tools::harness::redis::RedisServer;

use super::*;

/// The producers' documented script, run by the coordinator's own connection.
struct ScriptProducer(Arc<RedisCoordinator>);

impl Producer for ScriptProducer {
    fn put<'a>(&'a self, key: &'a str, value: &'a [u8]) -> CoordFuture<'a, ()> {
        Box::pin(self.0.produce(key, value))
    }
}

/// A coordinator on `url` whose keys all live under `prefix`.
pub(crate) fn redis_coordinator(url: &str, prefix: &str) -> Arc<RedisCoordinator> {
    Arc::new(
        RedisCoordinator::new(RedisCoordSettings {
            url: url.to_string(),
            password: String::new(),
            layout: Layout {
                prefix: prefix.to_string(),
                leader: "consumerLeader".into(),
            },
            request_timeout: Duration::from_secs(10),
        })
        .expect("a redis coordinator"),
    )
}

/// Every contract check holds on one real Redis. Each check gets its own key prefix, so
/// they run at once. Redis has no lock-delay: the fencing token and the holder's own TTL
/// margin stand in for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_backend_keeps_the_coordinator_contract() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let outcome = contract::run_all(|name| {
        let coord = redis_coordinator(&url, &format!("contract/{name}/"));
        async move {
            Subject {
                coord: coord.clone(),
                producer: Arc::new(ScriptProducer(coord)),
                queue_prefix: "queue/".into(),
                dead_prefix: "dead/".into(),
                timing: Timing::new(Duration::from_secs(1)).without_lock_delay(),
            }
        }
    })
    .await;
    if let Err(failures) = outcome {
        panic!("the Redis backend breaks the contract:\n{failures}");
    }
}
