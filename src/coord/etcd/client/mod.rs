//! A small client for etcd v3's JSON gRPC gateway (`/v3/...` on the client port, served
//! by etcd 3.4 and later), over the reqwest client the project already has: ranges,
//! transactions, leases and watches. Keys and values travel as base64, 64-bit numbers as
//! strings; a streaming call (`/v3/watch`) answers one JSON object per line.
//!
//! Transport concerns live here: several endpoints with failover on a connection error or
//! a 503 (gRPC `Unavailable`: no leader, leader changed); user and password
//! (`/v3/auth/authenticate`, the token sent as `Authorization` and fetched again when etcd
//! no longer takes it: expired, or the user's password changed; a password file is read
//! again after each rewrite); https with a CA file, a client certificate and a server name
//! (`util/tls.rs`), the files read again when rewritten, for the next connections. A TLS
//! handshake that fails before etcd ever answered is [`Error::Tls`] with `at_start`, which
//! the backend refuses (the replica stops, naming the setting). Knows nothing of tasks or
//! leaders.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::util::reload::{http_client, secret_file, Reloading};
use crate::util::tls::{self, TlsFiles};

mod wire;

pub use wire::*;
use wire::{watch_line, GatewayError, KeepAliveResult};

/// gRPC's codes as the gateway passes them on in `code`.
pub const CODE_INVALID_ARGUMENT: i64 = 3;
pub const CODE_NOT_FOUND: i64 = 5;
pub const CODE_UNAUTHENTICATED: i64 = 16;
/// etcd's answer (`InvalidArgument`) to a token issued before its users or roles changed:
/// authenticate again.
const AUTH_REVISION_OLD: &str = "revision of auth store is old";
/// An answer's buffer is sized from its Content-Length up to this (a larger one grows as it
/// arrives): a header does not get to reserve memory the body never sends.
const MAX_PRESIZE: u64 = 256 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach etcd at {endpoint}: {source}")]
    Transport {
        endpoint: String,
        #[source]
        source: reqwest::Error,
    },
    /// etcd (through the gateway) refused the request: `code` is gRPC's.
    #[error("etcd answered {status} (code {code}): {message}")]
    Status {
        status: u16,
        code: i64,
        message: String,
    },
    #[error("cannot decode etcd's answer: {0}")]
    Decode(String),
    #[error("invalid etcd endpoint: {0}")]
    Endpoint(String),
    /// The TLS settings or the password file cannot be used; the message names the setting.
    #[error("{0}")]
    Settings(String),
    /// A TLS handshake with `endpoint` failed; `at_start`: before etcd ever answered this
    /// client, so the settings are wrong rather than the network.
    #[error("cannot connect to etcd at {endpoint}: {reason}")]
    Tls {
        endpoint: String,
        reason: String,
        at_start: bool,
    },
}

impl Error {
    /// Whether etcd said the lease (or another thing asked for) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Status { code, .. } if *code == CODE_NOT_FOUND)
    }
}

/// Normalizes an endpoint: `host:port` means http.
pub fn parse_endpoint(endpoint: &str) -> Result<String, String> {
    let endpoint = endpoint.trim().trim_end_matches('/');
    if endpoint.is_empty() {
        return Err("empty endpoint".into());
    }
    let url = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    };
    let parsed = reqwest::Url::parse(&url).map_err(|e| format!("{endpoint}: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("{endpoint}: scheme must be http or https"));
    }
    Ok(url)
}

/// Settings of the client; from `[etcd]`.
#[derive(Clone, Debug, Default)]
pub struct ClientConfig {
    pub endpoints: Vec<String>,
    pub user: String,
    pub password: String,
    /// A file holding the password, read again after a rewrite; used instead of `password`.
    pub password_file: String,
    /// CA, client certificate and key, server name.
    pub tls: TlsFiles,
    pub request_timeout: Duration,
}

/// A user's password: given, or kept in a file.
enum Password {
    Given(String),
    File(Reloading<String>),
}

impl Password {
    fn current(&self) -> String {
        match self {
            Password::Given(password) => password.clone(),
            Password::File(file) => file.get(),
        }
    }
}

pub struct Client {
    /// Built again when the TLS files change.
    http: Reloading<reqwest::Client>,
    endpoints: Vec<String>,
    /// The endpoint that answered last; requests start there.
    current: AtomicUsize,
    /// Whether etcd answered this client once (a TLS failure before is the settings').
    answered: AtomicBool,
    credentials: Option<(String, Password)>,
    /// The auth token from `/v3/auth/authenticate`, while it is good.
    token: Mutex<Option<String>>,
    request_timeout: Duration,
}

impl Client {
    pub fn new(config: &ClientConfig) -> Result<Client, Error> {
        let endpoints = config
            .endpoints
            .iter()
            .map(|e| parse_endpoint(e).map_err(Error::Endpoint))
            .collect::<Result<Vec<_>, _>>()?;
        if endpoints.is_empty() {
            return Err(Error::Endpoint("no etcd endpoint given".into()));
        }
        let http = http_client(&config.tls, "etcd").map_err(Error::Settings)?;
        let password = if config.password_file.is_empty() {
            Password::Given(config.password.clone())
        } else {
            Password::File(
                secret_file("etcd.password_file", &config.password_file)
                    .map_err(Error::Settings)?,
            )
        };
        Ok(Client {
            http,
            endpoints,
            current: AtomicUsize::new(0),
            answered: AtomicBool::new(false),
            credentials: (!config.user.is_empty()).then(|| (config.user.clone(), password)),
            token: Mutex::new(None),
            request_timeout: config.request_timeout,
        })
    }

    /// The endpoint requests go to first.
    pub fn endpoint(&self) -> &str {
        &self.endpoints[self.current.load(Ordering::Relaxed) % self.endpoints.len()]
    }

    /// Sends `body` to `path`, failing over to the next endpoint on a connection error or
    /// a 503, and fetching a new auth token once if etcd says the old one is no good.
    async fn post(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<reqwest::Response, Error> {
        let mut authenticated_again = false;
        loop {
            let token = self.auth_token().await?;
            match self.post_once(path, body, timeout, token.as_deref()).await {
                Err(Error::Status { code, message, .. })
                    if (code == CODE_UNAUTHENTICATED || message.contains(AUTH_REVISION_OLD))
                        && self.credentials.is_some()
                        && !authenticated_again =>
                {
                    authenticated_again = true;
                    *self.token.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
                other => return other,
            }
        }
    }

    async fn post_once(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
        token: Option<&str>,
    ) -> Result<reqwest::Response, Error> {
        let start = self.current.load(Ordering::Relaxed);
        let mut last_error = None;
        let http = self.http.get();
        for attempt in 0..self.endpoints.len() {
            let slot = (start + attempt) % self.endpoints.len();
            let endpoint = &self.endpoints[slot];
            let mut request = http
                .post(format!("{endpoint}{path}"))
                .timeout(timeout)
                .json(body);
            if let Some(token) = token {
                request = request.header("Authorization", token);
            }
            match request.send().await {
                Ok(response) if response.status().is_success() => {
                    self.current.store(slot, Ordering::Relaxed);
                    self.answered.store(true, Ordering::Relaxed);
                    return Ok(response);
                }
                Ok(response) => {
                    self.answered.store(true, Ordering::Relaxed);
                    let status = response.status().as_u16();
                    let error = status_error(response).await;
                    if status != 503 {
                        return Err(error);
                    }
                    last_error = Some(error);
                }
                // Only a connection that never opened is safe to send elsewhere: a write
                // that timed out may have been applied.
                Err(err) if err.is_connect() => {
                    last_error = Some(self.transport_error(endpoint, err));
                }
                // Not resent, but the next request starts at the next endpoint: a member
                // that accepts connections and never answers (frozen, cut off from its
                // peers) must not keep every later request waiting too.
                Err(err) => {
                    self.current
                        .store((slot + 1) % self.endpoints.len(), Ordering::Relaxed);
                    return Err(self.transport_error(endpoint, err));
                }
            }
        }
        Err(last_error.expect("at least one endpoint was tried"))
    }

    /// A failed request's error: a TLS handshake's failure apart, naming the setting.
    fn transport_error(&self, endpoint: &str, err: reqwest::Error) -> Error {
        match tls::explain("etcd", &err) {
            Some(reason) => Error::Tls {
                endpoint: endpoint.to_string(),
                reason,
                at_start: !self.answered.load(Ordering::Relaxed),
            },
            None => Error::Transport {
                endpoint: endpoint.to_string(),
                source: err,
            },
        }
    }

    async fn auth_token(&self) -> Result<Option<String>, Error> {
        let Some((user, password)) = &self.credentials else {
            return Ok(None);
        };
        if let Some(token) = self.token.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(Some(token));
        }
        #[derive(Deserialize)]
        struct Authenticated {
            #[serde(default)]
            token: String,
        }
        let body = json!({ "name": user, "password": password.current() });
        let response = self
            .post_once("/v3/auth/authenticate", &body, self.request_timeout, None)
            .await?;
        let answer: Authenticated = decode(response).await?;
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = Some(answer.token.clone());
        Ok(Some(answer.token))
    }

    async fn call<T: DeserializeOwned>(&self, path: &str, body: &Value) -> Result<T, Error> {
        let response = self.post(path, body, self.request_timeout).await?;
        decode(response).await
    }

    pub async fn range(&self, range: &Range) -> Result<RangeResponse, Error> {
        self.call("/v3/kv/range", &range.json()).await
    }

    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let body = json!({ "key": b64(key), "value": b64(value) });
        self.call::<Value>("/v3/kv/put", &body).await.map(drop)
    }

    pub async fn txn(&self, txn: &Txn) -> Result<TxnResponse, Error> {
        self.call("/v3/kv/txn", &txn.json()).await
    }

    pub async fn lease_grant(&self, ttl_seconds: i64) -> Result<LeaseGrant, Error> {
        self.call(
            "/v3/lease/grant",
            &json!({ "TTL": ttl_seconds.to_string() }),
        )
        .await
    }

    /// One keep-alive: the lease's new TTL in seconds, 0 if it is gone. The gateway's
    /// streaming endpoint answers one message per message sent, and ends with the body.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<i64, Error> {
        let response = self
            .post(
                "/v3/lease/keepalive",
                &json!({ "ID": id.to_string() }),
                self.request_timeout,
            )
            .await?;
        let text = response
            .text()
            .await
            .map_err(|e| Error::Decode(e.to_string()))?;
        let first = text
            .lines()
            .find(|line| !line.trim().is_empty())
            .unwrap_or("{}");
        let answer: KeepAliveResult =
            serde_json::from_str(first).map_err(|e| Error::Decode(format!("{e}: {first}")))?;
        Ok(answer.result.ttl)
    }

    pub async fn lease_time_to_live(&self, id: i64) -> Result<LeaseTimeToLive, Error> {
        self.call(
            "/v3/lease/timetolive",
            &json!({ "ID": id.to_string(), "keys": true }),
        )
        .await
    }

    /// Revokes the lease; one that is gone already is no error.
    pub async fn lease_revoke(&self, id: i64) -> Result<(), Error> {
        match self
            .call::<Value>("/v3/lease/revoke", &json!({ "ID": id.to_string() }))
            .await
        {
            Ok(_) => Ok(()),
            Err(err) if err.is_not_found() => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// Watches `range` from `start_revision` for up to `wait`: answers at the first change
    /// (history from `start_revision` on included), when etcd says that revision was
    /// compacted, or quietly after `wait`. The stream is dropped on return, which ends the
    /// watch on the server.
    pub async fn watch(
        &self,
        range: &Range,
        start_revision: i64,
        wait: Duration,
    ) -> Result<Watched, Error> {
        self.watch_for(range, start_revision, wait, None).await
    }

    /// [`Client::watch`], answering only at a change `matters` says is one (or at a
    /// compaction, or after `wait`); each event comes with the key's previous value.
    pub async fn watch_for(
        &self,
        range: &Range,
        start_revision: i64,
        wait: Duration,
        matters: Option<&(dyn Fn(&Event) -> bool + Sync)>,
    ) -> Result<Watched, Error> {
        let mut request =
            json!({ "key": b64(&range.key), "start_revision": start_revision.to_string() });
        if let Some(end) = &range.range_end {
            request["range_end"] = json!(b64(end));
        }
        if matters.is_some() {
            request["prev_kv"] = json!(true);
        }
        let matters = matters.unwrap_or(&|_| true);
        let body = json!({ "create_request": request });
        // The request's own time-out must outlast the wait; the wait is kept below.
        let deadline = tokio::time::Instant::now() + wait;
        let mut response = self
            .post("/v3/watch", &body, wait + self.request_timeout)
            .await?;
        let mut pending: Vec<u8> = Vec::new();
        loop {
            let chunk = match tokio::time::timeout_at(deadline, response.chunk()).await {
                Err(_) => return Ok(Watched::Quiet),
                Ok(Ok(Some(chunk))) => chunk,
                Ok(Ok(None)) => {
                    return Err(Error::Decode("the watch stream ended early".into()));
                }
                Ok(Err(err)) => {
                    return Err(Error::Transport {
                        endpoint: self.endpoint().to_string(),
                        source: err,
                    })
                }
            };
            pending.extend_from_slice(&chunk);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                if let Some(watched) = watch_line(&line, matters)? {
                    return Ok(watched);
                }
            }
        }
    }
}

async fn decode<T: DeserializeOwned>(mut response: reqwest::Response) -> Result<T, Error> {
    // Gathered into one buffer sized from the header: collecting the pieces and then
    // copying them whole would hold a large listing's body (tens of MB) twice.
    let size = response.content_length().unwrap_or(0).min(MAX_PRESIZE) as usize;
    let mut bytes = Vec::with_capacity(size);
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| Error::Decode(e.to_string()))?
    {
        bytes.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        Error::Decode(format!(
            "{e}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        ))
    })
}

async fn status_error(response: reqwest::Response) -> Error {
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    match serde_json::from_str::<GatewayError>(&text) {
        Ok(error) => Error::Status {
            status,
            code: error.code,
            message: if error.message.is_empty() {
                error.error
            } else {
                error.message
            },
        },
        Err(_) => Error::Status {
            status,
            code: 0,
            message: text,
        },
    }
}
