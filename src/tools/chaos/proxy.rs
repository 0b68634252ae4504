//! A TCP proxy between one replica and the server, so that chaos can cut that replica off
//! the network while everything else keeps talking: a partition as the replica sees it.
//!
//! While partitioned, the proxy blackholes: connections already open stop carrying bytes
//! (their requests hang until the replica's own time-outs fire), and new connections are
//! accepted but never forwarded. Healing drops the held connections, so the replica
//! reconnects as it would after a real network fault.

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub(crate) struct Proxy {
    /// The address the replica is given as its Consul address.
    pub(crate) addr: String,
    partitioned: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub(crate) async fn start(upstream: String) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let (partitioned, watcher) = watch::channel(false);
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                tokio::spawn(forward(inbound, upstream.clone(), watcher.clone()));
            }
        });
        Ok(Proxy {
            addr,
            partitioned,
            accept,
        })
    }

    pub(crate) fn partition(&self, cut: bool) {
        self.partitioned.send_replace(cut);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Connections end too: their watchers see the sender gone.
        self.accept.abort();
    }
}

async fn forward(mut inbound: TcpStream, upstream: String, mut partitioned: watch::Receiver<bool>) {
    if *partitioned.borrow() {
        // Held open, never answered, dropped when the partition heals.
        let _ = partitioned.wait_for(|cut| !*cut).await;
        return;
    }
    let Ok(mut outbound) = TcpStream::connect(&upstream).await else {
        return;
    };
    let cut = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => false,
        cut = async { partitioned.wait_for(|cut| *cut).await.is_ok() } => cut,
    };
    if cut {
        let _ = partitioned.wait_for(|cut| !*cut).await;
    }
}
