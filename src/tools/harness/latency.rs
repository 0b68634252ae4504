//! A TCP proxy in front of each member of a cluster that delays every byte a member sends
//! back by one latency, in order, and forwards what the client sends at once: a slow path
//! back from the coordinator, as a replica behind it sees it. Its requests still reach the
//! coordinator on time, so the coordinator counts a renewal from when it was sent, as the
//! replica does; only the answers are late. It knows no protocol: HTTP (Consul, etcd's
//! gateway), Redis's and ZooKeeper's framing all pass through unchanged.
//!
//! The latency is read as each chunk arrives from the member, so a test changes it while
//! the replica runs ([`LatencyProxy::set_latency`]); a chunk never overtakes the one before
//! it, so a lower latency takes effect once what was already on its way is out. Every
//! connection is relayed on a tracked task; all of them end when the proxy is stopped or
//! dropped. Where a cluster is pointed at the proxy is the caller's business
//! ([`super::Cluster::env_at`]).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The most bytes read from a member at once: one chunk, delayed as a whole.
const CHUNK: usize = 64 * 1024;

/// One listener per member, all under one latency.
pub struct LatencyProxy {
    /// Where each member's proxy listens (`127.0.0.1:port`), in the members' order.
    addrs: Vec<String>,
    latency: watch::Sender<Duration>,
    stop: CancellationToken,
    tracker: TaskTracker,
}

impl LatencyProxy {
    /// Listens on a free loopback port for each of `upstreams` (`host:port`) and relays
    /// every connection to it, answers delayed by the latency (none at first).
    pub async fn start(upstreams: &[String]) -> std::io::Result<LatencyProxy> {
        let (latency, _) = watch::channel(Duration::ZERO);
        let stop = CancellationToken::new();
        let tracker = TaskTracker::new();
        let mut addrs = Vec::with_capacity(upstreams.len());
        for upstream in upstreams {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            addrs.push(listener.local_addr()?.to_string());
            tracker.spawn(accept(
                listener,
                upstream.clone(),
                latency.subscribe(),
                stop.clone(),
                tracker.clone(),
            ));
        }
        Ok(LatencyProxy {
            addrs,
            latency,
            stop,
            tracker,
        })
    }

    /// Where each member's proxy listens, in the members' order.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// Delays every byte the members send from now on by `latency`.
    pub fn set_latency(&self, latency: Duration) {
        self.latency.send_replace(latency);
    }

    /// Closes every connection and waits until each relay has ended.
    pub async fn stop(self) {
        self.stop.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        // Every task watches this token and ends at once; `stop` is the way to wait.
        self.stop.cancel();
        self.tracker.close();
    }
}

/// Accepts connections until `stop`, relaying each on a task of its own.
async fn accept(
    listener: TcpListener,
    upstream: String,
    latency: watch::Receiver<Duration>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let inbound = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((inbound, _)) => inbound,
                Err(_) => return,
            },
        };
        let (upstream, latency, stop) = (upstream.clone(), latency.clone(), stop.clone());
        tracker.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                // A connection that breaks is closed, as the member would close it.
                _ = relay(inbound, &upstream, latency) => {}
            }
        });
    }
}

/// Relays one connection: the client's bytes at once, the member's each `latency` (as it
/// was when they arrived) later, in order; each side's end is passed on after what came
/// before it.
async fn relay(
    inbound: TcpStream,
    upstream: &str,
    latency: watch::Receiver<Duration>,
) -> std::io::Result<()> {
    let outbound = TcpStream::connect(upstream).await?;
    inbound.set_nodelay(true)?;
    outbound.set_nodelay(true)?;
    let (mut from_client, mut to_client) = inbound.into_split();
    let (mut from_server, mut to_server) = outbound.into_split();
    let (late, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let up = async {
        tokio::io::copy(&mut from_client, &mut to_server).await?;
        to_server.shutdown().await
    };
    let read_down = async move {
        loop {
            let mut chunk = vec![0; CHUNK];
            let read = from_server.read(&mut chunk).await?;
            if read == 0 {
                // Dropping the sender tells the writer the member closed.
                return Ok::<_, std::io::Error>(());
            }
            chunk.truncate(read);
            let at = Instant::now() + *latency.borrow();
            if late.send((at, chunk)).is_err() {
                return Ok(());
            }
        }
    };
    let write_down = async {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            to_client.write_all(&chunk).await?;
        }
        to_client.shutdown().await
    };
    let (up, read_down, write_down) = tokio::join!(up, read_down, write_down);
    up.and(read_down).and(write_down)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers come back the latency late and in order, while requests go through at once;
    /// a change of latency applies to what the member sends after it.
    #[tokio::test]
    async fn answers_are_late_by_the_latency_and_in_order() {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = server.local_addr().unwrap().to_string();
        let echo = tokio::spawn(async move {
            let (mut conn, _) = server.accept().await.unwrap();
            let mut byte = [0u8; 1];
            while conn.read_exact(&mut byte).await.is_ok() {
                conn.write_all(&byte).await.unwrap();
            }
        });
        let proxy = LatencyProxy::start(&[upstream]).await.unwrap();
        let mut client = TcpStream::connect(&proxy.addrs()[0]).await.unwrap();
        let latency = Duration::from_millis(300);
        proxy.set_latency(latency);
        let sent = Instant::now();
        client.write_all(b"ab").await.unwrap();
        let mut answer = [0u8; 2];
        client.read_exact(&mut answer).await.unwrap();
        let took = sent.elapsed();
        assert_eq!(&answer, b"ab");
        assert!(took >= latency, "answered after {took:?}");
        assert!(took < latency * 3, "answered after {took:?}");
        proxy.set_latency(Duration::ZERO);
        let sent = Instant::now();
        client.write_all(b"c").await.unwrap();
        client.read_exact(&mut answer[..1]).await.unwrap();
        assert_eq!(answer[0], b'c');
        assert!(
            sent.elapsed() < latency,
            "answered after {:?}",
            sent.elapsed()
        );
        drop(client);
        proxy.stop().await;
        echo.await.unwrap();
    }
}
