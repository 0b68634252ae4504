//! The coordinator contract suite (`coord::contract`), every check, against the etcd
//! backend on a real 3-member etcd cluster on loopback: the same checks the in-memory
//! and Consul coordinators pass.

use std::sync::Arc;

use leaderq::coord::contract::{self, Producer, Subject, Timing};
use leaderq::coord::etcd::client::{Client, ClientConfig};
use leaderq::coord::etcd::{EtcdCoordSettings, EtcdCoordinator};
use leaderq::coord::{CoordError, CoordFuture};
use leaderq::tools::harness::etcd::EtcdCluster;

use super::*;

/// A producer's plain put, through the gateway (`etcdctl put` is the same request).
struct PutProducer(Arc<Client>);

impl Producer for PutProducer {
    fn put<'a>(&'a self, key: &'a str, value: &'a [u8]) -> CoordFuture<'a, ()> {
        Box::pin(async move {
            self.0
                .put(key.as_bytes(), value)
                .await
                .map_err(|err| CoordError::Unavailable(err.to_string()))
        })
    }
}

pub(crate) fn etcd_client(endpoints: Vec<String>) -> Arc<Client> {
    Arc::new(
        Client::new(&ClientConfig {
            endpoints,
            request_timeout: Duration::from_secs(10),
            ..ClientConfig::default()
        })
        .expect("client"),
    )
}

/// Every contract check holds on a 3-member etcd cluster. Each check gets its own leader
/// key and prefixes, so they run at once on one cluster. etcd has no lock-delay; leases
/// have a 1 s TTL (the cluster's short election timeout allows it).
#[tokio::test]
async fn the_etcd_backend_keeps_the_coordinator_contract() {
    let Some(cluster) = EtcdCluster::start(3).expect("an etcd cluster") else {
        return;
    };
    let endpoints = cluster.endpoints();
    let outcome = contract::run_all(|name| {
        let client = etcd_client(endpoints.clone());
        async move {
            let coord = EtcdCoordinator::new(
                client.clone(),
                EtcdCoordSettings {
                    leader_key: format!("contract/{name}/leader"),
                },
            );
            Subject {
                coord: Arc::new(coord),
                producer: Arc::new(PutProducer(client)),
                queue_prefix: format!("contract/{name}/queue/"),
                dead_prefix: format!("contract/{name}/dead/"),
                timing: Timing::new(Duration::from_secs(1)).without_lock_delay(),
            }
        }
    })
    .await;
    drop(cluster);
    if let Err(failures) = outcome {
        panic!("the etcd backend breaks the contract:\n{failures}");
    }
}
