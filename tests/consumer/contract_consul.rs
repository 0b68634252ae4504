//! The coordinator contract suite (`testkit::contract`), every check, against the Consul
//! backend over a real `leaderq server`: the same checks the in-memory coordinator passes
//! in the unit tests.

use std::sync::Arc;

use leaderq::coord::consul::client::{Client, ClientConfig, PutMode};
use leaderq::coord::consul::{ConsulCoordSettings, ConsulCoordinator};
use leaderq::coord::{CoordError, CoordFuture};
use testkit::contract::{self, Producer, Subject, Timing};

use super::*;

/// A producer's plain KV PUT; an operator's `curl -X DELETE` of the leader key.
struct KvProducer {
    client: Arc<Client>,
    /// The server's address, for the operator's plain HTTP request.
    addr: String,
    leader_key: String,
}

impl Producer for KvProducer {
    fn put<'a>(&'a self, key: &'a str, value: &'a [u8]) -> CoordFuture<'a, ()> {
        Box::pin(async move {
            self.client
                .kv_put(key, value, PutMode::Set)
                .await
                .map(drop)
                .map_err(|err| CoordError::Unavailable(err.to_string()))
        })
    }

    fn delete_leader_record(&self) -> CoordFuture<'_, ()> {
        Box::pin(async move {
            let url = format!("http://{}/v1/kv/{}", self.addr, self.leader_key);
            let unavailable = |err: reqwest::Error| CoordError::Unavailable(err.to_string());
            let response = client().delete(url).send().await.map_err(unavailable)?;
            match response.text().await.map_err(unavailable)?.as_str() {
                "true" => Ok(()),
                other => Err(CoordError::Unavailable(format!(
                    "DELETE answered {other:?}"
                ))),
            }
        })
    }
}

/// Every contract check holds on Consul's semantics as `leaderq server` serves them. Each
/// check gets its own leader key and prefixes, so they run at once on one server.
#[tokio::test]
async fn the_consul_backend_keeps_the_coordinator_contract() {
    let server = ServerProcess::start();
    let addr = server.addr.clone();
    let outcome = contract::run_all(|name| {
        let addr = addr.clone();
        async move {
            let client = Arc::new(
                Client::new(&ClientConfig {
                    addresses: vec![addr.clone()],
                    token: String::new(),
                    token_file: String::new(),
                    tls: Default::default(),
                    request_timeout: Duration::from_secs(10),
                })
                .expect("client"),
            );
            let leader_key = format!("contract/{name}/leader");
            let coord = ConsulCoordinator::new(
                client.clone(),
                ConsulCoordSettings {
                    leader_key: leader_key.clone(),
                    health_check: false,
                    txn_max_ops: 128,
                    check_suffix: String::new(),
                },
            );
            Subject {
                coord: Arc::new(coord),
                producer: Arc::new(KvProducer {
                    client,
                    addr,
                    leader_key,
                }),
                queue_prefix: format!("contract/{name}/queue/"),
                dead_prefix: format!("contract/{name}/dead/"),
                timing: Timing::new(Duration::from_secs(1)),
            }
        }
    })
    .await;
    if let Err(failures) = outcome {
        panic!("the Consul backend breaks the contract:\n{failures}");
    }
}
