//! A replica's link to its coordinator, with faults the tests and chaos switch on and off:
//! a TCP proxy on loopback for each coordinator address the replica is given, forwarding
//! bytes both ways unchanged until told otherwise. [`Fault::Cut`] is a burst of errors as
//! the replica sees it: every open connection is reset (an RST, not a clean close) and new
//! ones are accepted and reset at once, so each request fails fast, as it does when a
//! Consul answers 500 during an election or a load balancer drops connections. Healed,
//! the replica reconnects as it would after the real thing.
//!
//! Every backend's addresses are rewritten the same way ([`Links::start`]): each
//! `127.0.0.1:<port>` in the environment that points `leaderq` at the coordinator becomes a
//! proxy's, so a replica of an ensemble or cluster reaches every member through its link.

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// What the link does to the bytes it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forwards everything unchanged.
    Clear,
    /// Resets every connection, open or new, until cleared.
    Cut,
}

/// The environment variables that carry coordinator addresses (`Cluster::env`).
const ADDRESS_VARS: [&str; 4] = [
    "CONSUL_HTTP_ADDR",
    "LEADERQ__ETCD__ENDPOINTS",
    "LEADERQ__REDIS__URL",
    "LEADERQ__ZOOKEEPER__CONNECT",
];

/// One replica's links: a proxy for each coordinator address, all under one fault switch.
pub struct Links {
    fault: watch::Sender<Fault>,
    accepts: Vec<JoinHandle<()>>,
}

impl Links {
    /// Starts a proxy for each loopback address in `env` (a cluster's environment) and
    /// answers the same environment with those addresses replaced by the proxies'.
    pub async fn start(
        env: &[(String, String)],
    ) -> std::io::Result<(Links, Vec<(String, String)>)> {
        let (fault, _) = watch::channel(Fault::Clear);
        let mut links = Links {
            fault,
            accepts: Vec::new(),
        };
        let mut rewritten = Vec::with_capacity(env.len());
        for (name, value) in env {
            if !ADDRESS_VARS.contains(&name.as_str()) {
                rewritten.push((name.clone(), value.clone()));
                continue;
            }
            let mut out = String::new();
            let mut rest = value.as_str();
            while let Some(at) = rest.find(LOOPBACK) {
                let port_len = rest[at + LOOPBACK.len()..]
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(rest.len() - at - LOOPBACK.len());
                let end = at + LOOPBACK.len() + port_len;
                out.push_str(&rest[..at]);
                out.push_str(&links.proxy(&rest[at..end]).await?);
                rest = &rest[end..];
            }
            out.push_str(rest);
            rewritten.push((name.clone(), out));
        }
        Ok((links, rewritten))
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

const LOOPBACK: &str = "127.0.0.1:";

/// Carries one connection until it ends or the link is cut, which resets both sides.
async fn forward(mut inbound: TcpStream, upstream: String, mut fault: watch::Receiver<Fault>) {
    if *fault.borrow_and_update() == Fault::Cut {
        reset(inbound);
        return;
    }
    let Ok(mut outbound) = TcpStream::connect(&upstream).await else {
        reset(inbound);
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = fault.wait_for(|f| *f == Fault::Cut) => {}
    }
    reset(inbound);
    reset(outbound);
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
    /// new ones; cleared, new connections go through again. Addresses outside the
    /// coordinator's variables are left alone.
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
        let env = vec![
            (
                "LEADERQ__REDIS__URL".to_string(),
                format!("redis://{upstream}/0"),
            ),
            ("OTHER".to_string(), upstream.clone()),
        ];
        let (links, env) = Links::start(&env).await.unwrap();
        assert_eq!(env[1].1, upstream);
        let proxied = env[0]
            .1
            .trim_start_matches("redis://")
            .trim_end_matches("/0");
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
        server.abort();
    }
}
