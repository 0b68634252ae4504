//! A replica's link to its coordinator, with faults the tests and chaos switch on and off:
//! a TCP proxy on loopback for each coordinator address the replica is given, forwarding
//! bytes both ways unchanged until told otherwise:
//!
//! - [`Fault::Cut`] is a burst of errors as the replica sees it: every open connection is
//!   reset (an RST, not a clean close) and new ones are accepted and reset at once, so each
//!   request fails fast, as it does when a Consul answers 500 during an election or a load
//!   balancer drops connections. Healed, the replica reconnects as after the real thing.
//! - [`Fault::Blackhole`] is a partition: open connections stop carrying bytes (requests
//!   hang until the replica's own time-outs), new ones are accepted and never forwarded;
//!   healing drops the held connections, so the replica reconnects.
//! - [`Fault::Delay`] holds every byte from the coordinator to the replica for a while,
//!   in order, as a slow coordinator or a long link does; requests reach the coordinator at
//!   once, so it acts on them on time and only the answers are late. Connections carry on
//!   through a change of delay.
//!
//! [`Links::start`] puts a proxy in front of every member of a cluster and answers the
//! environment that points a replica at them (`Cluster::env_at`), so a replica of an
//! ensemble or cluster reaches every member through its link.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::Cluster;

/// What the link does to the bytes it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forwards everything unchanged.
    Clear,
    /// Resets every connection, open or new, until cleared.
    Cut,
    /// Carries nothing, resets nothing: a partition, until cleared.
    Blackhole,
    /// Holds every byte from the coordinator this long before the replica gets it.
    Delay(Duration),
}

impl Fault {
    /// How long answers are held under this fault.
    fn delay(self) -> Duration {
        match self {
            Fault::Delay(delay) => delay,
            _ => Duration::ZERO,
        }
    }
}

/// One replica's links: a proxy for each coordinator address, all under one fault switch.
pub struct Links {
    fault: watch::Sender<Fault>,
    accepts: Vec<JoinHandle<()>>,
}

impl Links {
    /// Starts a proxy in front of each member of `cluster`; answers the links and the
    /// environment that points a replica at the proxies.
    pub async fn start(cluster: &dyn Cluster) -> std::io::Result<(Links, Vec<(String, String)>)> {
        let (links, proxied) = Links::in_front_of(&cluster.client_addrs()).await?;
        Ok((links, cluster.env_at(&proxied)))
    }

    /// A proxy in front of `upstreams`, one each, for a test that does not start a whole
    /// cluster; their addresses in the same order.
    pub async fn in_front_of(upstreams: &[String]) -> std::io::Result<(Links, Vec<String>)> {
        let (fault, _) = watch::channel(Fault::Clear);
        let mut links = Links {
            fault,
            accepts: Vec::new(),
        };
        let mut proxied = Vec::new();
        for upstream in upstreams {
            proxied.push(links.proxy(upstream).await?);
        }
        Ok((links, proxied))
    }

    /// Switches every proxy of these links to `fault`.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// A proxy to `upstream`; its address.
    async fn proxy(&mut self, upstream: &str) -> std::io::Result<String> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let (upstream, fault) = (upstream.to_string(), self.fault.subscribe());
        self.accepts.push(tokio::spawn(async move {
            // Dropped with the accept loop, which `Links` aborts when dropped.
            let mut connections = JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                connections.spawn(forward(inbound, upstream.clone(), fault.clone()));
                while connections.try_join_next().is_some() {}
            }
        }));
        Ok(addr)
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        for accept in &self.accepts {
            accept.abort();
        }
    }
}

/// Carries one connection until it ends or the link is cut (which resets both sides) or
/// blackholed (which holds it, carrying nothing, until healed, then drops it).
async fn forward(inbound: TcpStream, upstream: String, mut fault: watch::Receiver<Fault>) {
    let now = *fault.borrow_and_update();
    match now {
        Fault::Cut => return reset(inbound),
        Fault::Blackhole => {
            let _ = fault.wait_for(|f| *f != Fault::Blackhole).await;
            return;
        }
        Fault::Clear | Fault::Delay(_) => {}
    }
    let Ok(outbound) = TcpStream::connect(&upstream).await else {
        return reset(inbound);
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (mut from_replica, mut to_replica) = inbound.into_split();
    let (mut from_coordinator, mut to_coordinator) = outbound.into_split();
    // Answers go through a queue, each chunk due at its arrival plus the delay then in
    // force, and are written in order when due.
    let (answers, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let requests = tokio::io::copy(&mut from_replica, &mut to_coordinator);
    let read_answers = async {
        // Moved in, so that the end of the coordinator's bytes ends the queue too.
        let answers = answers;
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from_coordinator.read(&mut buf).await {
            let at = Instant::now() + fault.borrow().delay();
            if answers.send((at, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    let write_answers = async {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to_replica.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    let mut watch_fault = fault.clone();
    let faulted = async {
        watch_fault
            .wait_for(|f| matches!(f, Fault::Cut | Fault::Blackhole))
            .await
            .map_or(Fault::Cut, |f| *f)
    };
    // A side that ends closes the connection as it would have; a fault resets it, or holds
    // it until healed.
    let faulted = tokio::select! {
        _ = requests => None,
        _ = async { tokio::join!(read_answers, write_answers) } => None,
        faulted = faulted => Some(faulted),
    };
    match faulted {
        None => {}
        Some(Fault::Blackhole) => {
            let _ = fault.wait_for(|f| *f != Fault::Blackhole).await;
        }
        Some(_) => {
            if let Ok(stream) = to_replica.reunite(from_replica) {
                reset(stream);
            }
            if let Ok(stream) = to_coordinator.reunite(from_coordinator) {
                reset(stream);
            }
        }
    }
}

/// Closes `stream` with an RST: the peer's next read or write fails at once.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Bytes go through a clear link both ways; a cut resets open connections and refuses
    /// new ones; cleared, new connections go through again; a delay holds answers; a
    /// blackhole carries nothing until healed.
    #[tokio::test]
    async fn a_cut_link_resets_connections_until_cleared() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            loop {
                let (mut socket, _) = echo.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let (links, proxied) = Links::in_front_of(std::slice::from_ref(&upstream))
            .await
            .unwrap();
        let proxied = proxied[0].as_str();
        assert_ne!(proxied, upstream);
        let mut client = TcpStream::connect(proxied).await.unwrap();
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        links.set(Fault::Cut);
        let mut rest = Vec::new();
        assert!(
            client.read_to_end(&mut rest).await.is_err() || rest.is_empty(),
            "an open connection went on through a cut"
        );
        let mut refused = TcpStream::connect(proxied).await.unwrap();
        let _ = refused.write_all(b"ping").await;
        let mut rest = Vec::new();
        assert!(refused.read_to_end(&mut rest).await.is_err() || rest.is_empty());
        links.set(Fault::Clear);
        let mut again = TcpStream::connect(proxied).await.unwrap();
        again.write_all(b"pong").await.unwrap();
        again.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        // Delayed: the answer comes, whole and in order, no sooner than the delay.
        links.set(Fault::Delay(Duration::from_millis(300)));
        let sent = Instant::now();
        again.write_all(b"slow").await.unwrap();
        again.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"slow");
        assert!(sent.elapsed() >= Duration::from_millis(300));
        // Blackholed: nothing comes back; healed, the held connection is dropped and a
        // new one goes through.
        links.set(Fault::Blackhole);
        again.write_all(b"lost").await.unwrap();
        let held = tokio::time::timeout(Duration::from_millis(300), again.read(&mut buf)).await;
        assert!(held.is_err(), "a blackholed link carried an answer");
        links.set(Fault::Clear);
        let mut healed = TcpStream::connect(proxied).await.unwrap();
        healed.write_all(b"back").await.unwrap();
        healed.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"back");
        server.abort();
    }
}
