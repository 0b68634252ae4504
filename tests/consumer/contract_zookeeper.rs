//! The coordinator contract suite (`testkit::contract`), every check, against the ZooKeeper
//! backend over a real 3-member ensemble, under a chroot: the same checks the in-memory and
//! Consul coordinators pass, with ZooKeeper's two declared differences (no lock-delay, no
//! lease taken up by a new process).

use std::sync::Arc;

use leaderq::coord::zookeeper::{ZkCoordSettings, ZkCoordinator};
use leaderq::coord::{CoordError, CoordFuture};
use testkit::contract::{self, Producer, Subject, Timing};
use testkit::harness::zookeeper::Ensemble;
use zookeeper_client as zk;

use super::*;

/// The contract suites' session timeout on ZooKeeper (the ensemble's 500 ms tick allows
/// 1 s). The checks run at once against three members on two cores; with 1 s, a CI run saw
/// a session end mid-check while the freshly started members competed for the CPU, as the
/// etcd suites once did (`contract_etcd.rs`).
const CONTRACT_TTL: Duration = Duration::from_secs(2);

/// A producer's plain znode write: create (with parents), or set when it exists; an
/// operator's `zkCli.sh delete` of the latch znodes under the election znode.
pub(crate) struct ZnodeProducer {
    pub(crate) client: zk::Client,
    /// The election's key (`election.leader_key`), whose znode holds the latches.
    pub(crate) leader_key: String,
}

impl Producer for ZnodeProducer {
    fn put<'a>(&'a self, key: &'a str, value: &'a [u8]) -> CoordFuture<'a, ()> {
        Box::pin(async move {
            // As ZooKeeper clients do: a connection lost to a member that died is retried
            // once the client has moved to another member.
            let mut attempts = 0;
            loop {
                match self.put_once(key, value).await {
                    Err(zk::Error::ConnectionLoss | zk::Error::Timeout) if attempts < 50 => {
                        attempts += 1;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    outcome => {
                        return outcome.map_err(|err| CoordError::Unavailable(err.to_string()))
                    }
                }
            }
        })
    }

    fn delete_leader_record(&self) -> CoordFuture<'_, ()> {
        Box::pin(async move {
            let unavailable = |err: zk::Error| CoordError::Unavailable(err.to_string());
            let dir = leaderq::coord::zookeeper::path_of(&self.leader_key);
            let children = match self.client.list_children(&dir).await {
                Ok(children) => children,
                Err(zk::Error::NoNode) => return Ok(()),
                Err(err) => return Err(unavailable(err)),
            };
            for latch in children.iter().filter(|name| name.starts_with("latch-")) {
                match self.client.delete(&format!("{dir}/{latch}"), None).await {
                    Ok(()) | Err(zk::Error::NoNode) => {}
                    Err(err) => return Err(unavailable(err)),
                }
            }
            Ok(())
        })
    }
}

impl ZnodeProducer {
    async fn put_once(&self, key: &str, value: &[u8]) -> Result<(), zk::Error> {
        let path = format!("/{key}");
        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        if let Some((parent, _)) = path.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
            match self.client.mkdir(parent, &options).await {
                Ok(()) | Err(zk::Error::NodeExists) => {}
                Err(err) => return Err(err),
            }
        }
        match self.client.create(&path, value, &options).await {
            Ok(_) => Ok(()),
            Err(zk::Error::NodeExists) => self.client.set_data(&path, value, None).await.map(drop),
            Err(err) => Err(err),
        }
    }
}

/// A client of `connect` (with its chroot) for producers.
pub(crate) async fn producer_client(connect: &str) -> zk::Client {
    producer_client_as(connect, "").await
}

/// The same, authenticated as `auth` (digest `user:password`) unless it is empty; what it
/// creates is then that user's alone.
pub(crate) async fn producer_client_as(connect: &str, auth: &str) -> zk::Client {
    let (servers, root) = match connect.find('/') {
        Some(at) => (&connect[..at], Some(&connect[at..])),
        None => (connect, None),
    };
    let mut connector = zk::Client::connector();
    let acls = if auth.is_empty() {
        zk::Acls::anyone_all()
    } else {
        connector = connector.with_auth("digest", auth.as_bytes());
        zk::Acls::creator_all()
    };
    let client = connector
        .connect(servers)
        .await
        .expect("connect to ZooKeeper");
    match root {
        Some(root) => {
            let options = zk::CreateMode::Persistent.with_acls(acls);
            match client.mkdir(root, &options).await {
                Ok(()) | Err(zk::Error::NodeExists) => {}
                Err(err) => panic!("cannot create the chroot {root}: {err}"),
            }
            client.chroot(root.to_string()).expect("a chroot")
        }
        None => client,
    }
}

/// Every contract check holds on a real 3-member ensemble, through a chroot, and again
/// with digest authentication (every znode then its user's alone: another client cannot
/// read the queue). Each check gets its own election znode and prefixes, so they run at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zookeeper_backend_keeps_the_coordinator_contract() {
    let Some(ensemble) = Ensemble::start(3) else {
        return;
    };
    let ensemble = ensemble.expect("the ensemble starts");
    run_contract(ensemble.connect_under("/contract"), "").await;

    run_contract(ensemble.connect_under("/contract-auth"), "leaderq:secret").await;
    let stranger = producer_client(&ensemble.connect()).await;
    let read = stranger
        .list_children("/contract-auth/one_leader_among_concurrent_campaigners/leader")
        .await;
    assert_eq!(
        read,
        Err(zk::Error::NoAuth),
        "a client without auth read it"
    );
}

async fn run_contract(connect: String, auth: &str) {
    let client = producer_client_as(&connect, auth).await;
    let outcome = contract::run_all(|name| {
        let connect = connect.clone();
        let client = client.clone();
        let auth = auth.to_string();
        async move {
            let leader_key = format!("{name}/leader");
            let coord = ZkCoordinator::new(ZkCoordSettings {
                connect,
                session_timeout: Duration::from_secs(5),
                leader_key: leader_key.clone(),
                auth,
                tls: Default::default(),
            });
            Subject {
                coord: Arc::new(coord),
                producer: Arc::new(ZnodeProducer { client, leader_key }),
                queue_prefix: format!("{name}/queue/"),
                dead_prefix: format!("{name}/dead/"),
                timing: Timing::new(CONTRACT_TTL)
                    .without_takeover_delay()
                    .without_lease_reuse(),
            }
        }
    })
    .await;
    if let Err(failures) = outcome {
        panic!("the ZooKeeper backend (auth {auth:?}) breaks the contract:\n{failures}");
    }
}
