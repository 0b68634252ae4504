//! The server's connection layer: the accept loop, Consul's per-client connection cap, the
//! header, idle and shutdown deadlines, and the raised open-files limit. What a request means
//! is `http/`'s business (including the body read timeout and its 408); this file decides
//! which connections are taken and how long each may live.
//!
//! An accept loop of our own rather than `axum::serve`: axum's loop has no per-address cap,
//! no read or idle timeout, and its graceful shutdown waits forever for a client that holds
//! a request half-sent, which also keeps the data file locked. hyper's HTTP/1 connection
//! does the protocol; hyper's own header timeout is not used because it also runs while a
//! keep-alive connection waits for its next request, so it could not be set apart from the
//! idle timeout.
//!
//! Each connection is in one phase at a time:
//! - `Open`: a new connection waiting for its first request's head; cut after the header
//!   timeout, counted from the connection's start.
//! - `Head`: a later request's head, since its first byte after an idle wait; cut after the
//!   header timeout. Bytes of it that came in the same read as the end of the request
//!   before wait in hyper's buffer unseen, so such a head is cut after the idle timeout:
//!   no later than an idle client's connection.
//! - `Body`: the handler is reading a request body that has not all arrived. No deadline
//!   here: the handler answers 408 after the body timeout, and that answer ends the phase.
//! - `Busy`: a request is being answered. No deadline here: a blocking query may wait its
//!   full `wait`.
//! - `Idle`: the answer was handed over; waiting for the next request. Cut after the idle
//!   timeout, which thus also bounds writing an answer to a client that does not read it.
//!
//! A connection is cut by dropping it, as Go's server does on a read timeout: no answer.
//!
//! With a TLS configuration (`--cert-file`…) every connection is HTTPS: its handshake comes
//! first, within the header timeout and dropped on shutdown, and a client the configuration
//! refuses (`--verify-incoming` without a certificate its CA signed) is cut there, before
//! any request; the phases then apply to the decrypted stream.
//!
//! On shutdown a connection in `Open` or `Body`, then or later, is dropped at once: it waits
//! for its client, not for an answer, and no handler has acted on a body it has not read to
//! its end. hyper cannot tell these apart from a request in flight (a new connection counts
//! as busy until its first answer), so its graceful shutdown would wait for them until the
//! shutdown deadline. Every other connection gets hyper's graceful shutdown: an idle one,
//! or one with only a later head half-sent, is closed as soon as its last answer is
//! written; one in `Busy` finishes its answer within the shutdown deadline.
//!
//! Size: the phases, the two watchers that move them (the stream, the request body) and the
//! shutdown rule are one mechanism with the accept loop, and their tests are beside them.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::Router;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Consul's `http_max_conns_per_client` default.
pub const DEFAULT_MAX_CONNS_PER_CLIENT: usize = 200;
/// Time to receive a request's head. hyper's default; long enough for any real client.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Time to receive a request's body (at most 512 KiB): 60 s is under 9 KB/s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Time a keep-alive connection may wait for its next request. Longer than the idle pool
/// timeout of Consul's Go clients and of reqwest (90 s), so that the client, not the server,
/// closes an idle connection and never sends a request into one being closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Time in-flight requests get to finish after a shutdown signal before their connections
/// are dropped. Blocking queries are released and requests still arriving dropped at once,
/// so only a slow handler or a client slow to read its answer needs it.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after an accept error other than a connection's own (such as EMFILE), so that the
/// loop does not spin while no descriptor is free.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
/// Time given to write the 429 to a client over the cap; Consul's connlimit uses 10 ms.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_millis(10);
/// What Consul (hashicorp/go-connlimit) sends to a connection over the cap, then closes it.
const TOO_MANY_CONNECTIONS: &[u8] = b"HTTP/1.1 429 Too Many Requests\r\n\
Content-Type: text/plain\r\n\
Content-Length: 81\r\n\
Connection: close\r\n\
\r\n\
Your IP is issuing too many concurrent connections, please rate limit your calls\n";

/// How long connections may live; `leaderq server` flags.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections open at once from one client address; 0 means no cap (as in Consul).
    pub max_conns_per_client: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    pub shutdown_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_conns_per_client: DEFAULT_MAX_CONNS_PER_CLIENT,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
        }
    }
}

/// Serves `app` on `listener` until `stop` resolves; then stops accepting, drops at once the
/// connections whose request is still arriving, lets in-flight requests finish within the
/// shutdown timeout and drops the connections still open. When it returns, no connection
/// task is left, so nothing holds the app any more.
pub async fn run(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    tls: Option<super::Tls>,
    stop: impl Future<Output = ()>,
) {
    let acceptor = tls;
    let clients = Arc::new(Clients {
        open: Mutex::new(HashMap::new()),
        max: limits.max_conns_per_client,
    });
    let shutdown = CancellationToken::new();
    let mut connections = JoinSet::new();
    tokio::pin!(stop);
    loop {
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => match Clients::admit(&clients, peer.ip()) {
                Some(slot) => {
                    // As Go sets on every TCP connection (Consul's too): an answer's last
                    // segment goes out at once, not after the client's delayed ACK of the
                    // one before (up to 40 ms on Linux), which a body sent in chunks meets.
                    if let Err(err) = stream.set_nodelay(true) {
                        tracing::debug!(error = %err, "cannot set TCP_NODELAY");
                    }
                    let connection = serve_connection(
                        stream,
                        app.clone(),
                        limits.clone(),
                        shutdown.clone(),
                        acceptor.clone(),
                    );
                    connections.spawn(async move {
                        connection.await;
                        drop(slot);
                    });
                }
                None => {
                    tracing::debug!(client = %peer.ip(), "connection over the per-client cap refused with 429");
                    connections.spawn(refuse(stream));
                }
            },
            // The client's own trouble (it reset before we took it): nothing to do.
            Err(err) if is_connection_error(&err) => {}
            Err(err) => {
                tracing::warn!(error = %err, "cannot accept a connection; pausing");
                tokio::select! {
                    _ = &mut stop => break,
                    _ = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                }
            }
        }
    }
    drop(listener);
    shutdown.cancel();
    let drained = tokio::time::timeout(limits.shutdown_timeout, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            deadline = ?limits.shutdown_timeout,
            "connections still open at the shutdown deadline; dropping them"
        );
        connections.shutdown().await;
    }
}

fn is_connection_error(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Consul's answer to a connection over the cap: a 429 written with a short deadline, then
/// the connection is closed without reading from it.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(
        REFUSAL_WRITE_TIMEOUT,
        stream.write_all(TOO_MANY_CONNECTIONS),
    )
    .await;
}

/// Serves one connection: its TLS handshake first if the server serves TLS, then HTTP.
async fn serve_connection(
    stream: TcpStream,
    app: Router,
    limits: Limits,
    shutdown: CancellationToken,
    tls: Option<super::Tls>,
) {
    let Some(tls) = tls else {
        return serve_http(stream, app, limits, shutdown).await;
    };
    // The configuration as its files are now: a rotated certificate is used from the next
    // connection on.
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.get());
    let handshake = tokio::time::timeout(limits.header_timeout, acceptor.accept(stream));
    let stream = tokio::select! {
        _ = shutdown.cancelled() => return,
        done = handshake => match done {
            Ok(Ok(stream)) => stream,
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!("TLS handshake not done within the header timeout");
                return;
            }
        },
    };
    serve_http(stream, app, limits, shutdown).await
}

/// Serves HTTP on one connection until it ends, its deadline passes, or shutdown asks it to
/// finish its request and close (dropping it at once when it waits on its client
/// mid-request).
async fn serve_http<S>(stream: S, app: Router, limits: Limits, shutdown: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (phase, watched) = watch::channel(Phase::Open(Instant::now()));
    let stalled = stalled_mid_request(phase.subscribe());
    let phase = Arc::new(phase);
    let io = TokioIo::new(Watched {
        stream,
        phase: phase.clone(),
    });
    let app = TowerToHyperService::new(app);
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let busy = Busy::start(phase.clone());
        let request = request.map(|body| WatchedBody {
            body,
            phase: phase.clone(),
        });
        let answer = hyper::service::Service::call(&app, request);
        async move {
            let response = answer.await;
            drop(busy);
            response
        }
    });
    // Header names go out as Go's net/http writes them (`X-Consul-Knownleader`): hyper's
    // title case is Go's canonical MIME form for the lower-case names a HeaderMap holds.
    let connection = http1::Builder::new()
        .header_read_timeout(None)
        .title_case_headers(true)
        .serve_connection(io, service);
    tokio::pin!(connection);
    let expired = expiry(watched, limits);
    tokio::pin!(expired);
    tokio::pin!(stalled);
    let mut finishing = false;
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(err) = served {
                    tracing::debug!(error = %err, "connection ended with an error");
                }
                return;
            }
            _ = &mut expired => {
                tracing::debug!("connection cut: no request or no progress within its timeout");
                return;
            }
            _ = shutdown.cancelled(), if !finishing => {
                finishing = true;
                connection.as_mut().graceful_shutdown();
            }
            _ = &mut stalled, if finishing => {
                tracing::debug!("connection dropped on shutdown: its request was still arriving");
                return;
            }
        }
    }
}

/// Where a connection stands; see the module header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Open(Instant),
    Head(Instant),
    Body,
    Busy,
    Idle(Instant),
}

impl Phase {
    /// When a connection in this phase is cut; `None` while a request is being answered or
    /// its body read (the handler's timeout bounds that).
    fn deadline(self, limits: &Limits) -> Option<Instant> {
        match self {
            Phase::Open(since) | Phase::Head(since) => Some(since + limits.header_timeout),
            Phase::Body | Phase::Busy => None,
            Phase::Idle(since) => Some(since + limits.idle_timeout),
        }
    }

    /// Whether shutdown drops a connection in this phase at once: it waits on its client for
    /// a first head or for a body, and no handler has acted on that request yet.
    fn stalled_mid_request(self) -> bool {
        matches!(self, Phase::Open(_) | Phase::Body)
    }
}

/// Resolves when the connection's current phase outlives its deadline.
async fn expiry(mut phase: watch::Receiver<Phase>, limits: Limits) {
    loop {
        let deadline = phase.borrow_and_update().deadline(&limits);
        let changed = match deadline {
            Some(at) => tokio::select! {
                _ = tokio::time::sleep_until(at) => return,
                changed = phase.changed() => changed,
            },
            None => phase.changed().await,
        };
        if changed.is_err() {
            // Nobody can change the phase any more: the connection is ending by itself.
            return std::future::pending().await;
        }
    }
}

/// Resolves as soon as the connection waits on its client mid-request (now or later).
async fn stalled_mid_request(mut phase: watch::Receiver<Phase>) {
    loop {
        if phase.borrow_and_update().stalled_mid_request() {
            return;
        }
        if phase.changed().await.is_err() {
            // Nobody can change the phase any more: the connection is ending by itself.
            return std::future::pending().await;
        }
    }
}

/// Marks a connection busy while its request is answered, idle from when it is dropped.
struct Busy(Arc<watch::Sender<Phase>>);

impl Busy {
    fn start(phase: Arc<watch::Sender<Phase>>) -> Busy {
        phase.send_replace(Phase::Busy);
        Busy(phase)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.send_replace(Phase::Idle(Instant::now()));
    }
}

/// The connection's stream, noting the first bytes of a request after an idle wait, which
/// start the header timeout.
struct Watched<S> {
    stream: S,
    phase: Arc<watch::Sender<Phase>>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.phase.send_if_modified(|phase| match phase {
                Phase::Idle(_) => {
                    *phase = Phase::Head(Instant::now());
                    true
                }
                _ => false,
            });
        }
        read
    }
}

/// A request's body as the handler reads it, noting whether it has all arrived: from the
/// first read until its end the connection is in `Body`, then `Busy` again. A body the
/// handler never reads leaves the connection `Busy`, since the handler is answering.
struct WatchedBody {
    body: Incoming,
    phase: Arc<watch::Sender<Phase>>,
}

impl WatchedBody {
    /// Moves the connection between `Busy` and `Body`; other phases are not this body's.
    fn note(&self, arriving: bool) {
        let next = if arriving { Phase::Body } else { Phase::Busy };
        self.phase.send_if_modified(|phase| match phase {
            Phase::Busy | Phase::Body if *phase != next => {
                *phase = next;
                true
            }
            _ => false,
        });
    }
}

impl Body for WatchedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        let ended = match &polled {
            Poll::Pending => false,
            Poll::Ready(Some(Ok(_))) => this.body.is_end_stream(),
            Poll::Ready(None | Some(Err(_))) => true,
        };
        this.note(!ended);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for WatchedBody {
    /// A handler that stops reading (the body timeout, or a body too large) is answering.
    fn drop(&mut self) {
        self.note(false);
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Open connections by client address, for the per-client cap.
struct Clients {
    open: Mutex<HashMap<IpAddr, usize>>,
    max: usize,
}

impl Clients {
    /// A slot for one more connection from `ip`, or `None` when it is at the cap.
    fn admit(clients: &Arc<Clients>, ip: IpAddr) -> Option<Slot> {
        // An IPv4 client on a dual-stack socket is one client, however it is written.
        let ip = ip.to_canonical();
        let mut open = clients.open.lock().expect("client table lock");
        let count = open.entry(ip).or_insert(0);
        if clients.max > 0 && *count >= clients.max {
            return None;
        }
        *count += 1;
        Some(Slot {
            clients: clients.clone(),
            ip,
        })
    }
}

/// One admitted connection; frees its place when dropped.
struct Slot {
    clients: Arc<Clients>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().expect("client table lock");
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Raises the soft limit on open files to the hard limit, as Go programs (Consul among
/// them) do at start, so that the per-client cap, not EMFILE, is what limits connections.
/// Returns the limit now in force, when there is one.
pub fn raise_open_files_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(err) = setrlimit(Resource::Nofile, raised) {
            tracing::debug!(error = %err, "cannot raise the open-files limit");
            return limit.current;
        }
        return limit.maximum;
    }
    limit.current
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            header_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(100),
            ..Limits::default()
        }
    }

    /// Waiting for a head is cut after the header timeout, an idle wait after the idle
    /// timeout, and a request being answered (a blocking query) or reading its body (the
    /// handler's 408) never.
    #[test]
    fn each_phase_has_its_own_deadline() {
        let now = Instant::now();
        let limits = limits();
        assert_eq!(
            Phase::Open(now).deadline(&limits),
            Some(now + Duration::from_secs(3))
        );
        assert_eq!(
            Phase::Head(now).deadline(&limits),
            Some(now + Duration::from_secs(3))
        );
        assert_eq!(Phase::Body.deadline(&limits), None);
        assert_eq!(
            Phase::Idle(now).deadline(&limits),
            Some(now + Duration::from_secs(100))
        );
        assert_eq!(Phase::Busy.deadline(&limits), None);
    }

    /// The cap counts open connections per address and frees a place when one closes; other
    /// addresses are not affected; 0 means no cap; an IPv4-mapped IPv6 address is the same
    /// client as its IPv4 form.
    #[test]
    fn the_cap_counts_connections_per_address() {
        let clients = Arc::new(Clients {
            open: Mutex::new(HashMap::new()),
            max: 2,
        });
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let first = Clients::admit(&clients, a).unwrap();
        let _second = Clients::admit(&clients, mapped).unwrap();
        assert!(Clients::admit(&clients, a).is_none());
        assert!(Clients::admit(&clients, b).is_some());
        drop(first);
        assert!(Clients::admit(&clients, a).is_some());
        let unlimited = Arc::new(Clients {
            open: Mutex::new(HashMap::new()),
            max: 0,
        });
        let held: Vec<Slot> = (0..1000)
            .map(|_| Clients::admit(&unlimited, a).unwrap())
            .collect();
        assert_eq!(held.len(), 1000);
    }

    /// The 429 is exactly Consul's, with a Content-Length that matches its body.
    #[test]
    fn the_refusal_is_consuls_429() {
        let text = std::str::from_utf8(TOO_MANY_CONNECTIONS).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 429 Too Many Requests\r\n"));
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
    }

    /// Shutdown drops at once a connection that waits for its first head or for a body, and
    /// leaves the others to hyper's graceful shutdown: a request being answered, an answer
    /// being written, a later head that hyper closes once its last answer is out.
    #[test]
    fn shutdown_drops_connections_stalled_mid_request() {
        let now = Instant::now();
        assert!(Phase::Open(now).stalled_mid_request());
        assert!(Phase::Body.stalled_mid_request());
        assert!(!Phase::Busy.stalled_mid_request());
        assert!(!Phase::Idle(now).stalled_mid_request());
        assert!(!Phase::Head(now).stalled_mid_request());
    }

    /// Waiting for a stalled request resolves when the connection reaches `Body`, even if it
    /// was busy when shutdown began, and never for a connection that stays busy.
    #[tokio::test(start_paused = true)]
    async fn a_busy_connection_that_starts_waiting_for_its_body_is_stalled() {
        let (phase, watched) = watch::channel(Phase::Busy);
        let stalled = tokio::spawn(stalled_mid_request(watched));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            !stalled.is_finished(),
            "a busy connection counted as stalled"
        );
        phase.send_replace(Phase::Body);
        tokio::time::timeout(Duration::from_secs(1), stalled)
            .await
            .expect("a connection waiting for its body counts as stalled")
            .unwrap();
    }

    /// A phase change re-arms the deadline: a connection that became busy before its head
    /// deadline is not cut, and is cut the idle timeout after it went idle again.
    #[tokio::test(start_paused = true)]
    async fn expiry_follows_the_phase() {
        let limits = limits();
        let (phase, watched) = watch::channel(Phase::Open(Instant::now()));
        let expired = tokio::spawn(expiry(watched, limits));
        tokio::time::sleep(Duration::from_secs(2)).await;
        phase.send_replace(Phase::Busy);
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!expired.is_finished(), "a busy connection was cut");
        let idle_since = Instant::now();
        phase.send_replace(Phase::Idle(idle_since));
        tokio::time::sleep(Duration::from_secs(99)).await;
        assert!(!expired.is_finished());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(expired.is_finished());
    }
}
