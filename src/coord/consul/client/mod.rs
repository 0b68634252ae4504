//! A typed, async client for the part of Consul's HTTP API the consumer uses: KV, sessions,
//! transactions, agent TTL checks and service registrations, with blocking queries.
//!
//! Transport concerns live here: several addresses with failover on connection errors, 429
//! and 503; the ACL token as `X-Consul-Token`, or read from a token file, again after each
//! rewrite; https with a CA file, a client certificate and a server name (`util/tls.rs`),
//! the files read again when rewritten, for the next connections; request time-outs that
//! outlast a blocking query's wait plus Consul's jitter. A TLS handshake that fails before
//! Consul ever answered is [`Error::Tls`] with `at_start`, which the backend refuses (the
//! replica stops, naming the setting) rather than retrying. Knows nothing of tasks or
//! leaders.

mod agent;
mod kv;
mod service;
mod session;
mod txn;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::{Method, StatusCode};

use crate::util::reload::{http_client, secret_file, Reloading};
use crate::util::tls::{self, TlsFiles};

pub use agent::AgentCheck;
pub use kv::{KvPair, PutMode};
pub use service::{ServiceCheck, ServiceRegistration};
pub use session::{SessionInfo, SessionRequest};
pub use txn::{body_len, fits, value_room, TxnError, TxnOp, TxnOutcome, TXN_MAX_BODY, TXN_MAX_OPS};

/// Consul adds up to wait/16 to a blocking query's wait (structs.JitterFraction).
const JITTER_FRACTION: u32 = 16;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach Consul at {address}: {source}")]
    Transport {
        address: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("Consul answered {code}: {body}")]
    Status { code: u16, body: String },
    #[error("cannot decode Consul's answer: {0}")]
    Decode(String),
    /// The TLS settings or a secret file cannot be used; the message names the setting.
    #[error("{0}")]
    Settings(String),
    /// A TLS handshake with `address` failed; `at_start`: before Consul ever answered this
    /// client, so the settings are wrong rather than the network.
    #[error("cannot connect to Consul at {address}: {reason}")]
    Tls {
        address: String,
        reason: String,
        at_start: bool,
    },
    #[error("invalid Consul address: {0}")]
    Address(String),
    #[error("key {0:?} cannot be sent in a URL: a '.' or '..' segment would address another key")]
    Key(String),
}

impl Error {
    /// Whether trying again later may succeed (network trouble, overload, a 5xx).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Transport { .. } => true,
            Error::Tls { at_start, .. } => !at_start,
            Error::Status { code, .. } => *code == 429 || *code >= 500,
            _ => false,
        }
    }

    /// Whether Consul refused the request as too large (413: too many operations, a body
    /// or a value over its limit). Sending it again cannot help.
    pub fn is_too_large(&self) -> bool {
        matches!(self, Error::Status { code: 413, .. })
    }
}

/// Normalizes a Consul address as Consul's own clients do: `host:port` means http.
pub fn parse_address(address: &str) -> Result<String, String> {
    let address = address.trim().trim_end_matches('/');
    if address.is_empty() {
        return Err("empty address".into());
    }
    if address.starts_with("unix://") {
        return Err(format!(
            "{address}: unix sockets are not supported; use host:port"
        ));
    }
    let url = if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    let parsed = reqwest::Url::parse(&url).map_err(|e| format!("{address}: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("{address}: scheme must be http or https"));
    }
    Ok(url)
}

/// Settings of the client; from `[consul]`.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub addresses: Vec<String>,
    pub token: String,
    /// A file holding the token, read again after a rewrite; used instead of `token`.
    pub token_file: String,
    /// CA, client certificate and key, server name.
    pub tls: TlsFiles,
    pub request_timeout: Duration,
}

/// Query parameters of a read: `index` > 0 makes it a blocking query.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueryOptions {
    pub index: u64,
    pub wait: Option<Duration>,
}

pub struct Client {
    /// Built again when the TLS files change.
    http: Reloading<reqwest::Client>,
    addresses: Vec<String>,
    /// The address that answered last; requests start there.
    current: AtomicUsize,
    token: Token,
    request_timeout: Duration,
    /// Whether Consul answered this client once (a TLS failure before is the settings').
    answered: AtomicBool,
}

/// The ACL token: none, given, or kept in a file.
enum Token {
    None,
    Given(String),
    File(Reloading<String>),
}

impl Token {
    fn current(&self) -> Option<String> {
        match self {
            Token::None => None,
            Token::Given(token) => Some(token.clone()),
            Token::File(file) => Some(file.get()),
        }
    }
}

impl Client {
    pub fn new(config: &ClientConfig) -> Result<Client, Error> {
        let addresses = config
            .addresses
            .iter()
            .map(|a| parse_address(a).map_err(Error::Address))
            .collect::<Result<Vec<_>, _>>()?;
        if addresses.is_empty() {
            return Err(Error::Address("no Consul address given".into()));
        }
        let http = http_client(&config.tls, "consul").map_err(Error::Settings)?;
        let token = if !config.token_file.is_empty() {
            Token::File(
                secret_file("consul.token_file", &config.token_file).map_err(Error::Settings)?,
            )
        } else if !config.token.is_empty() {
            Token::Given(config.token.clone())
        } else {
            Token::None
        };
        Ok(Client {
            http,
            addresses,
            current: AtomicUsize::new(0),
            token,
            request_timeout: config.request_timeout,
            answered: AtomicBool::new(false),
        })
    }

    /// Sends a request, failing over to the next address on a connection error, a 429 or a
    /// 503. Any other answer, success or not, is returned as it is.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<reqwest::Response, Error> {
        let start = self.current.load(Ordering::Relaxed);
        let mut last_error = None;
        let http = self.http.get();
        let token = self.token.current();
        for attempt in 0..self.addresses.len() {
            let slot = (start + attempt) % self.addresses.len();
            let address = &self.addresses[slot];
            let mut request = http
                .request(method.clone(), format!("{address}{path}"))
                .timeout(timeout);
            if let Some(token) = &token {
                request = request.header("X-Consul-Token", token);
            }
            if let Some(body) = &body {
                request = request.body(body.clone());
            }
            match request.send().await {
                Ok(response)
                    if response.status() == StatusCode::TOO_MANY_REQUESTS
                        || response.status() == StatusCode::SERVICE_UNAVAILABLE =>
                {
                    last_error = Some(status_error(response).await);
                }
                Ok(response) => {
                    self.current.store(slot, Ordering::Relaxed);
                    self.answered.store(true, Ordering::Relaxed);
                    return Ok(response);
                }
                // Only a connection that never opened is safe to resend elsewhere; a write
                // that timed out may have been applied.
                Err(err) if err.is_connect() => {
                    last_error = Some(self.transport_error(address, err));
                }
                Err(err) => return Err(self.transport_error(address, err)),
            }
        }
        Err(last_error.expect("at least one address was tried"))
    }

    /// A failed request's error: a TLS handshake's failure apart, naming the setting.
    fn transport_error(&self, address: &str, err: reqwest::Error) -> Error {
        match tls::explain("consul", &err) {
            Some(reason) => Error::Tls {
                address: address.to_string(),
                reason,
                at_start: !self.answered.load(Ordering::Relaxed),
            },
            None => Error::Transport {
                address: address.to_string(),
                source: err,
            },
        }
    }

    /// Sends a request whose only answer of interest is a 200.
    async fn send_expecting_ok(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(), Error> {
        let response = self.send(method, path, body, self.request_timeout).await?;
        if response.status() != StatusCode::OK {
            return Err(status_error(response).await);
        }
        Ok(())
    }

    /// Time-out for a request: a blocking query gets its wait plus Consul's jitter on top.
    fn timeout_for(&self, options: &QueryOptions) -> Duration {
        match (options.index, options.wait) {
            (0, _) => self.request_timeout,
            (_, Some(wait)) => wait + wait / JITTER_FRACTION + self.request_timeout,
            (_, None) => Duration::from_secs(300) * 17 / 16 + self.request_timeout,
        }
    }

    /// The address requests go to first now.
    pub fn address(&self) -> &str {
        &self.addresses[self.current.load(Ordering::Relaxed) % self.addresses.len()]
    }
}

async fn status_error(response: reqwest::Response) -> Error {
    let code = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    Error::Status {
        code,
        body: body.trim().to_string(),
    }
}

fn index_header(response: &reqwest::Response) -> u64 {
    response
        .headers()
        .get("X-Consul-Index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Appends `index` and `wait` to a query string as Consul's api client does.
fn query_suffix(options: &QueryOptions, mut query: Vec<String>) -> String {
    if options.index > 0 {
        query.push(format!("index={}", options.index));
        if let Some(wait) = options.wait {
            query.push(format!("wait={}ms", wait.as_millis().max(1)));
        }
    }
    if query.is_empty() {
        String::new()
    } else {
        format!("?{}", query.join("&"))
    }
}

/// The URL path of a KV key. A `.` or `..` segment is refused: URL parsing resolves it, so
/// `a/../b` would read or write `b`. (`%2E%2E` is resolved too, so escaping cannot help.)
fn kv_path(key: &str) -> Result<String, Error> {
    if key
        .split('/')
        .any(|segment| segment == "." || segment == "..")
    {
        return Err(Error::Key(key.to_string()));
    }
    Ok(format!("/v1/kv/{}", escape_key(key)))
}

/// Percent-encodes a key for a URL path, keeping `/` as the separator.
fn escape_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for byte in key.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(byte as char)
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

fn escape_query(value: &str) -> String {
    escape_key(value).replace('/', "%2F")
}

/// A blocking read that returns unchanged sooner than this after it was sent waits out the
/// rest before the next read, so a server that answers early cannot cause a hot loop.
pub const MIN_REQUERY: std::time::Duration = std::time::Duration::from_millis(100);

/// The index to send on the next blocking query, following Consul's advice: never below 1
/// for a blocking read, and back to 0 when the server's index goes backwards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchIndex(u64);

/// Paces blocking reads: call `sent` before a read and `settle` after it.
#[derive(Debug, Default)]
pub struct Pacer {
    sent: Option<tokio::time::Instant>,
}

impl Pacer {
    pub fn sent(&mut self) {
        self.sent = Some(tokio::time::Instant::now());
    }

    /// Waits out MIN_REQUERY when the read came back unchanged sooner than that.
    pub async fn settle(&self, moved: bool) {
        if let (false, Some(sent)) = (moved, self.sent) {
            tokio::time::sleep_until(sent + MIN_REQUERY).await;
        }
    }
}

impl WatchIndex {
    pub fn get(self) -> u64 {
        self.0
    }

    /// Takes the index a read returned; returns whether it moved forward.
    pub fn update(&mut self, returned: u64) -> bool {
        if returned < self.0 {
            // A reset (snapshot restore, tombstone reaping): start over with a plain read.
            self.0 = 0;
            return true;
        }
        let moved = returned > self.0;
        self.0 = returned;
        moved
    }

    pub fn reset(&mut self) {
        self.0 = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Addresses are normalized like Consul's clients: bare host:port is http.
    #[test]
    fn addresses_normalize() {
        assert_eq!(
            parse_address("127.0.0.1:8500").unwrap(),
            "http://127.0.0.1:8500"
        );
        assert_eq!(
            parse_address("https://consul:8501/").unwrap(),
            "https://consul:8501"
        );
        assert!(parse_address("unix:///tmp/consul.sock").is_err());
        assert!(parse_address("ftp://x").is_err());
    }

    /// The token file is read again after a rewrite: the next request sends the new token.
    /// (leaderq server has no ACLs, so the requests' heads are read by a bare listener.)
    #[tokio::test]
    async fn a_rewritten_token_file_is_sent_by_the_next_request() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (heads, mut seen) = tokio::sync::mpsc::unbounded_channel();
        let server = tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                let heads = heads.clone();
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 4096];
                    let mut head = Vec::new();
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        let n = stream.read(&mut buffer).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        head.extend_from_slice(&buffer[..n]);
                        if head.windows(4).any(|w| w == b"\r\n\r\n") {
                            let _ = heads.send(String::from_utf8_lossy(&head).to_lowercase());
                            head.clear();
                            let _ = stream
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                                .await;
                        }
                    }
                });
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "first-token\n").unwrap();
        let client = Client::new(&ClientConfig {
            addresses: vec![address],
            token: "ignored: the file wins".into(),
            token_file: file.to_string_lossy().into_owned(),
            tls: TlsFiles::default(),
            request_timeout: Duration::from_secs(5),
        })
        .unwrap();
        client.check_pass("c").await.unwrap();
        let head = seen.recv().await.unwrap();
        assert!(head.contains("x-consul-token: first-token\r\n"), "{head}");
        std::fs::write(&file, "second-token\n").unwrap();
        client.check_pass("c").await.unwrap();
        let head = seen.recv().await.unwrap();
        assert!(head.contains("x-consul-token: second-token\r\n"), "{head}");
        server.abort();
    }

    /// The watch index goes back to 0 when the server's index goes backwards.
    #[test]
    fn watch_index_resets_on_backwards_index() {
        let mut index = WatchIndex::default();
        assert!(index.update(10));
        assert!(!index.update(10));
        assert!(index.update(12));
        assert!(index.update(3));
        assert_eq!(index.get(), 0);
    }

    /// An unchanged read that came back early waits out MIN_REQUERY; a changed one does not.
    #[tokio::test(start_paused = true)]
    async fn pacer_slows_only_early_unchanged_reads() {
        let mut pacer = Pacer::default();
        pacer.sent();
        let started = tokio::time::Instant::now();
        pacer.settle(true).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        pacer.settle(false).await;
        assert_eq!(started.elapsed(), MIN_REQUERY);
        pacer.sent();
        tokio::time::advance(Duration::from_secs(5)).await;
        let later = tokio::time::Instant::now();
        pacer.settle(false).await;
        assert_eq!(later.elapsed(), Duration::ZERO);
    }

    /// Keys keep their slashes; other reserved bytes are escaped.
    #[test]
    fn keys_are_escaped_for_paths() {
        assert_eq!(escape_key("oracleTask/task 1"), "oracleTask/task%201");
        assert_eq!(escape_query("a/b"), "a%2Fb");
    }

    /// A key whose URL would address another key is refused before anything is sent.
    #[test]
    fn kv_paths_refuse_dot_segments() {
        assert_eq!(kv_path("a/..b/c.").unwrap(), "/v1/kv/a/..b/c.");
        for key in ["a/../b", "..", "./a", "a/."] {
            assert!(matches!(kv_path(key), Err(Error::Key(_))), "{key}");
        }
    }
}
