//! Consul's HTTP API over the state machine: routing with Consul's 301/404/405 rules, query
//! parameters, request bodies, status codes, headers and JSON shapes.
//!
//! Wire types (`ModifyIndex`, `LockIndex`, …) live only here. Reads take the state's read
//! lock (through `watch::query` so that every read can block); writes go to
//! `Shared::write` and are answered after they are durable. Rules belong in `state.rs`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State as AxumState};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::Engine as _;
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::duration;
use super::state::{
    ApplyError, Check, CheckSpec, CheckStatus, Command, Entry, Outcome, ServiceCheck, Session,
    SessionSpec, State, TxnOp, DEFAULT_LOCK_DELAY, SERF_CHECK_ID,
};
use super::watch::{self, Blocking};
use super::{Shared, WriteError, CONSUL_VERSION, DATACENTER};

/// Consul's `kv_max_value_size` default (raft.SuggestedMaxDataSize).
pub const KV_MAX_VALUE_SIZE: usize = 512 * 1024;
/// Consul's limit on operations in one transaction.
pub const TXN_MAX_OPS: usize = 128;
/// Consul's `txn_max_req_len` default; the body limit is the larger of it and the value limit.
const TXN_MAX_REQ_LEN: usize = 512 * 1024;
/// Largest body read for the small JSON endpoints (sessions, checks).
const SMALL_BODY_LIMIT: usize = 64 * 1024;
/// Below this, a numeric LockDelay is seconds, not nanoseconds (Consul's lockDelayMinThreshold).
const LOCK_DELAY_MIN_THRESHOLD: u64 = 1000;

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

/// An answer other than success: a status and a plain-text body, as Consul's `HTTPError`.
#[derive(Debug)]
pub struct HttpError {
    status: StatusCode,
    body: String,
    allow: Option<&'static str>,
    /// Close the connection after this answer (the request was not read to its end).
    close: bool,
}

impl HttpError {
    fn new(status: StatusCode, body: impl Into<String>) -> HttpError {
        HttpError {
            status,
            body: body.into(),
            allow: None,
            close: false,
        }
    }

    fn bad_request(body: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::BAD_REQUEST, body)
    }

    fn internal(body: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, body)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.body).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Some(allow) = self.allow {
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        if self.close {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl From<WriteError> for HttpError {
    fn from(err: WriteError) -> HttpError {
        match err {
            WriteError::Apply(ApplyError::UnknownCheck(id)) => HttpError::new(
                StatusCode::NOT_FOUND,
                ApplyError::UnknownCheck(id).to_string(),
            ),
            WriteError::Apply(err) => HttpError::internal(err.to_string()),
            WriteError::Storage(err) => HttpError::internal(err),
            WriteError::Closed => {
                HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "server is shutting down")
            }
        }
    }
}

type Reply = Result<Response, HttpError>;

/// The endpoints, each with the methods Consul registers for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Kv,
    Txn,
    SessionCreate,
    SessionDestroy,
    SessionRenew,
    SessionInfo,
    SessionNode,
    SessionList,
    AgentSelf,
    AgentChecks,
    CheckRegister,
    CheckDeregister,
    CheckPass,
    CheckWarn,
    CheckFail,
    CheckUpdate,
    CatalogNodes,
    CatalogDatacenters,
    StatusLeader,
    StatusPeers,
}

/// `(path, is_prefix, endpoint, allowed methods as Consul lists them)`.
const ROUTES: &[(&str, bool, Endpoint, &str)] = &[
    ("/v1/kv/", true, Endpoint::Kv, "OPTIONS,GET,PUT,DELETE"),
    ("/v1/txn", false, Endpoint::Txn, "OPTIONS,PUT"),
    (
        "/v1/session/create",
        false,
        Endpoint::SessionCreate,
        "OPTIONS,PUT",
    ),
    (
        "/v1/session/destroy/",
        true,
        Endpoint::SessionDestroy,
        "OPTIONS,PUT",
    ),
    (
        "/v1/session/renew/",
        true,
        Endpoint::SessionRenew,
        "OPTIONS,PUT",
    ),
    (
        "/v1/session/info/",
        true,
        Endpoint::SessionInfo,
        "OPTIONS,GET",
    ),
    (
        "/v1/session/node/",
        true,
        Endpoint::SessionNode,
        "OPTIONS,GET",
    ),
    (
        "/v1/session/list",
        false,
        Endpoint::SessionList,
        "OPTIONS,GET",
    ),
    ("/v1/agent/self", false, Endpoint::AgentSelf, "OPTIONS,GET"),
    (
        "/v1/agent/checks",
        false,
        Endpoint::AgentChecks,
        "OPTIONS,GET",
    ),
    (
        "/v1/agent/check/register",
        false,
        Endpoint::CheckRegister,
        "OPTIONS,PUT",
    ),
    (
        "/v1/agent/check/deregister/",
        true,
        Endpoint::CheckDeregister,
        "OPTIONS,PUT",
    ),
    (
        "/v1/agent/check/pass/",
        true,
        Endpoint::CheckPass,
        "OPTIONS,PUT",
    ),
    (
        "/v1/agent/check/warn/",
        true,
        Endpoint::CheckWarn,
        "OPTIONS,PUT",
    ),
    (
        "/v1/agent/check/fail/",
        true,
        Endpoint::CheckFail,
        "OPTIONS,PUT",
    ),
    (
        "/v1/agent/check/update/",
        true,
        Endpoint::CheckUpdate,
        "OPTIONS,PUT",
    ),
    (
        "/v1/catalog/nodes",
        false,
        Endpoint::CatalogNodes,
        "OPTIONS,GET",
    ),
    (
        "/v1/catalog/datacenters",
        false,
        Endpoint::CatalogDatacenters,
        "OPTIONS,GET",
    ),
    (
        "/v1/status/leader",
        false,
        Endpoint::StatusLeader,
        "OPTIONS,GET",
    ),
    (
        "/v1/status/peers",
        false,
        Endpoint::StatusPeers,
        "OPTIONS,GET",
    ),
];

/// Finds the endpoint, Go ServeMux style: exact paths, or the longest matching prefix.
/// Returns the rest of the path after a prefix route.
fn find_route(path: &str) -> Option<(Endpoint, &'static str, &str)> {
    ROUTES
        .iter()
        .filter(|(route, prefix, _, _)| {
            if *prefix {
                path.starts_with(route)
            } else {
                path == *route
            }
        })
        .max_by_key(|(route, _, _, _)| route.len())
        .map(|(route, _, endpoint, allow)| (*endpoint, *allow, &path[route.len()..]))
}

async fn handle(AxumState(shared): AxumState<Arc<Shared>>, request: Request) -> Response {
    if request.uri().path() == "/metrics" {
        return server_metrics(&shared).await;
    }
    let endpoint = find_route(request.uri().path())
        .map(|(endpoint, _, _)| format!("{endpoint:?}"))
        .unwrap_or_else(|| "unknown".to_string());
    let response = match dispatch(&shared, request).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    };
    shared
        .core
        .metrics
        .requests
        .get_or_create(&super::metrics::RequestLabels {
            endpoint,
            status: response.status().as_u16(),
        })
        .inc();
    response
}

/// Prometheus metrics of the server itself; not a Consul endpoint, so it lives outside /v1.
async fn server_metrics(shared: &Shared) -> Response {
    let metrics = &shared.core.metrics;
    {
        let state = shared.core.state.read().await;
        metrics.sessions.set(state.sessions().count() as i64);
        metrics.keys.set(state.kv_len() as i64);
    }
    let mut response = metrics.encode().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

async fn dispatch(shared: &Shared, request: Request) -> Reply {
    let (parts, body) = request.into_parts();
    let raw_path = parts.uri.path();
    let path = unescape(raw_path, false)
        .ok_or_else(|| HttpError::bad_request("Invalid URL path encoding"))?;
    let query = Query::parse(parts.uri.query().unwrap_or(""));

    // Go's ServeMux redirects unclean paths (`//`, `/./`, `/../`) to their clean form.
    let cleaned = clean_path(&path);
    if cleaned != path {
        let mut location = cleaned;
        if let Some(q) = parts.uri.query() {
            location = format!("{location}?{q}");
        }
        return Ok(redirect(&location));
    }
    if path == "/v1/kv" {
        return Ok(redirect("/v1/kv/"));
    }
    let Some((endpoint, allow, rest)) = find_route(&path) else {
        return Err(HttpError::new(
            StatusCode::NOT_FOUND,
            "Invalid URL path: not a recognized HTTP API endpoint",
        ));
    };
    let method = parts.method.clone();
    if method == Method::OPTIONS {
        let mut response = StatusCode::OK.into_response();
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(allow));
        return Ok(response);
    }
    if !allow.split(',').any(|m| m == method.as_str()) {
        return Err(HttpError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            body: format!("method {method} not allowed"),
            allow: Some(allow),
            close: false,
        });
    }
    if let Some(dc) = query.get("dc") {
        if !dc.is_empty() && dc != DATACENTER {
            return Err(HttpError::internal("No path to datacenter"));
        }
    }
    let request = Req {
        shared,
        method,
        headers: parts.headers,
        query,
        rest: rest.to_string(),
        body,
    };
    match endpoint {
        Endpoint::Kv => kv(request).await,
        Endpoint::Txn => txn(request).await,
        Endpoint::SessionCreate => session_create(request).await,
        Endpoint::SessionDestroy => session_destroy(request).await,
        Endpoint::SessionRenew => session_renew(request).await,
        Endpoint::SessionInfo | Endpoint::SessionNode | Endpoint::SessionList => {
            session_read(request, endpoint).await
        }
        Endpoint::AgentSelf => Ok(agent_self(&request)),
        Endpoint::AgentChecks => agent_checks(request).await,
        Endpoint::CheckRegister => check_register(request).await,
        Endpoint::CheckDeregister => check_deregister(request).await,
        Endpoint::CheckPass => check_set(request, CheckStatus::Passing).await,
        Endpoint::CheckWarn => check_set(request, CheckStatus::Warning).await,
        Endpoint::CheckFail => check_set(request, CheckStatus::Critical).await,
        Endpoint::CheckUpdate => check_update(request).await,
        Endpoint::CatalogNodes => catalog_nodes(request).await,
        Endpoint::CatalogDatacenters => Ok(json_reply(
            &json!([DATACENTER]),
            request.query.has("pretty"),
        )),
        Endpoint::StatusLeader => Ok(json_reply(
            &json!(leader_addr(shared)),
            request.query.has("pretty"),
        )),
        Endpoint::StatusPeers => Ok(json_reply(
            &json!([leader_addr(shared)]),
            request.query.has("pretty"),
        )),
    }
}

struct Req<'a> {
    shared: &'a Shared,
    method: Method,
    headers: HeaderMap,
    query: Query,
    /// The path after the endpoint's prefix (the key, session id, check id or node).
    rest: String,
    body: Body,
}

impl Req<'_> {
    /// Consul's `parse`: consistency flags, then `wait` and `index` for blocking.
    fn blocking(&self) -> Result<Option<Blocking>, HttpError> {
        if self.query.has("stale") && self.query.has("consistent") {
            return Err(HttpError::bad_request(
                "Cannot specify ?stale with ?consistent, conflicting semantics.",
            ));
        }
        let wait = match self.query.get("wait").filter(|w| !w.is_empty()) {
            Some(wait) => Some(
                duration::parse(wait).map_err(|_| HttpError::bad_request("Invalid wait time"))?,
            ),
            None => None,
        };
        let index = match self.query.get("index").filter(|i| !i.is_empty()) {
            Some(index) => index
                .parse::<u64>()
                .map_err(|_| HttpError::bad_request("Invalid index"))?,
            None => 0,
        };
        Ok(Blocking::new(index, wait))
    }

    fn content_length(&self) -> Option<usize> {
        self.headers
            .get(header::CONTENT_LENGTH)?
            .to_str()
            .ok()?
            .parse()
            .ok()
    }

    /// Reads the body, refusing with 413 one whose Content-Length says it is over `limit`
    /// before reading anything (as Consul does), or that turns out longer while read, and
    /// with 408 (closing the connection) one that does not arrive within the body timeout.
    async fn body(
        self,
        limit: usize,
        too_large: impl FnOnce(usize) -> String,
    ) -> Result<Bytes, HttpError> {
        if let Some(length) = self.content_length().filter(|length| *length > limit) {
            return Err(HttpError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                too_large(length),
            ));
        }
        let timeout = self.shared.limits.body_timeout;
        match tokio::time::timeout(timeout, axum::body::to_bytes(self.body, limit)).await {
            Ok(read) => read
                .map_err(|_| HttpError::new(StatusCode::PAYLOAD_TOO_LARGE, too_large(limit + 1))),
            Err(_) => Err(HttpError {
                close: true,
                ..HttpError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "request body not received within {}",
                        duration::format(timeout)
                    ),
                )
            }),
        }
    }
}

// ----- KV -----

async fn kv(req: Req<'_>) -> Reply {
    let key = req.rest.clone();
    if key.contains("../") || key.contains("..\\") {
        return Err(HttpError::bad_request(
            "URL path contains invalid traversal sequence",
        ));
    }
    if key != key.trim_matches(' ') {
        return Err(HttpError::bad_request(
            "key must not begin or end with a space",
        ));
    }
    match req.method {
        Method::GET if req.query.has("keys") => kv_keys(req, key).await,
        Method::GET => kv_get(req, key).await,
        Method::PUT => kv_put(req, key).await,
        _ => kv_delete(req, key).await,
    }
}

/// One KV entry on the wire, in Consul's field order.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct DirEntry<'a> {
    lock_index: u64,
    key: &'a str,
    flags: u64,
    value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<&'a str>,
    create_index: u64,
    modify_index: u64,
}

impl<'a> DirEntry<'a> {
    fn new(key: &'a str, entry: &'a Entry) -> DirEntry<'a> {
        DirEntry {
            lock_index: entry.lock_index,
            key,
            flags: entry.flags,
            value: (!entry.value.is_empty())
                .then(|| base64::engine::general_purpose::STANDARD.encode(&entry.value)),
            session: entry.session.as_deref(),
            create_index: entry.create_index,
            modify_index: entry.modify_index,
        }
    }
}

async fn kv_get(req: Req<'_>, key: String) -> Reply {
    let recurse = req.query.has("recurse");
    if !recurse && key.is_empty() {
        return Err(HttpError::bad_request("Missing key name"));
    }
    let blocking = req.blocking()?;
    let raw = req.query.has("raw") && !recurse;
    let pretty = req.query.has("pretty");
    let (index, body) = watch::query(&req.shared.core, blocking, |state| {
        if recurse {
            let body = if pretty {
                let entries: Vec<DirEntry> = state
                    .kv_list(&key)
                    .map(|(k, e)| DirEntry::new(k, e))
                    .collect();
                (!entries.is_empty()).then(|| to_json(&entries, pretty))
            } else {
                write_entries(state.kv_list(&key))
            };
            (state.kv_prefix_index(&key), body)
        } else {
            let body = state.kv_get(&key).map(|entry| {
                if raw {
                    entry.value.clone()
                } else {
                    to_json(&[DirEntry::new(&key, entry)], pretty)
                }
            });
            (state.kv_key_index(&key), body)
        }
    })
    .await;
    let Some(body) = body else {
        return Ok(with_meta(
            StatusCode::NOT_FOUND.into_response(),
            Some(index),
        ));
    };
    let mut response = if raw {
        let mut response = body.into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        headers.insert(
            "X-Content-Type-Options",
            HeaderValue::from_static("nosniff"),
        );
        headers.insert(
            "Content-Security-Policy",
            HeaderValue::from_static("sandbox"),
        );
        response
    } else {
        json_body(body)
    };
    response = with_meta(response, Some(index));
    Ok(response)
}

/// The compact JSON of a `?recurse` listing, written straight into one buffer: listing
/// 10,000 keys is the hot read of a task queue, and this skips a String per value.
/// Produces the same bytes as serializing `DirEntry`s; `None` when there are none.
fn write_entries<'a>(entries: impl Iterator<Item = (&'a String, &'a Entry)>) -> Option<Vec<u8>> {
    use std::io::Write as _;
    let mut out = Vec::new();
    for (key, entry) in entries {
        out.push(if out.is_empty() { b'[' } else { b',' });
        let _ = write!(out, "{{\"LockIndex\":{},\"Key\":", entry.lock_index);
        serde_json::to_writer(&mut out, key).expect("strings serialize");
        let _ = write!(out, ",\"Flags\":{},\"Value\":", entry.flags);
        if entry.value.is_empty() {
            out.extend_from_slice(b"null");
        } else {
            out.push(b'"');
            let start = out.len();
            out.resize(
                start + base64::encoded_len(entry.value.len(), true).unwrap_or(0),
                0,
            );
            let written = base64::engine::general_purpose::STANDARD
                .encode_slice(&entry.value, &mut out[start..])
                .expect("buffer sized for base64");
            out.truncate(start + written);
            out.push(b'"');
        }
        if let Some(session) = &entry.session {
            out.extend_from_slice(b",\"Session\":");
            serde_json::to_writer(&mut out, session).expect("strings serialize");
        }
        let _ = write!(
            out,
            ",\"CreateIndex\":{},\"ModifyIndex\":{}}}",
            entry.create_index, entry.modify_index
        );
    }
    if out.is_empty() {
        return None;
    }
    out.push(b']');
    Some(out)
}

async fn kv_keys(req: Req<'_>, prefix: String) -> Reply {
    let separator = req
        .query
        .get("separator")
        .or_else(|| req.query.get("seperator"))
        .unwrap_or("")
        .to_string();
    let blocking = req.blocking()?;
    let pretty = req.query.has("pretty");
    let (index, keys) = watch::query(&req.shared.core, blocking, |state| {
        let mut keys: Vec<&str> = Vec::new();
        for (key, _) in state.kv_list(&prefix) {
            let rolled = if separator.is_empty() {
                key.as_str()
            } else {
                match key[prefix.len()..].find(&separator) {
                    Some(at) => &key[..prefix.len() + at + separator.len()],
                    None => key.as_str(),
                }
            };
            // Keys come sorted, so a rolled-up prefix repeats only right after itself.
            if keys.last() != Some(&rolled) {
                keys.push(rolled);
            }
        }
        let body = (!keys.is_empty() || prefix.is_empty()).then(|| to_json(&keys, pretty));
        (state.kv_prefix_index(&prefix), body)
    })
    .await;
    match keys {
        Some(body) => Ok(with_meta(json_body(body), Some(index))),
        None => Ok(with_meta(
            StatusCode::NOT_FOUND.into_response(),
            Some(index),
        )),
    }
}

/// Fails with Consul's 400 when more than one of `flags` is present.
fn conflicting_flags(query: &Query, flags: &[&str]) -> Result<(), HttpError> {
    if flags.iter().filter(|flag| query.has(flag)).count() > 1 {
        return Err(HttpError::bad_request(format!(
            "Conflicting flags: {}\n",
            query.encode()
        )));
    }
    Ok(())
}

/// Go's `strconv.ParseUint` with its error text, which Consul passes through as a 500.
fn parse_uint(value: &str) -> Result<u64, HttpError> {
    value.parse::<u64>().map_err(|err| {
        let reason = match err.kind() {
            std::num::IntErrorKind::PosOverflow => "value out of range",
            _ => "invalid syntax",
        };
        HttpError::internal(format!(
            "strconv.ParseUint: parsing {}: {reason}",
            duration::quote(value)
        ))
    })
}

async fn kv_put(req: Req<'_>, key: String) -> Reply {
    if key.is_empty() {
        return Err(HttpError::bad_request("Missing key name"));
    }
    conflicting_flags(&req.query, &["cas", "acquire", "release"])?;
    let flags = match req.query.get("flags") {
        Some(flags) => parse_uint(flags)?,
        None => 0,
    };
    let cas = match req.query.get("cas") {
        Some(cas) => Some(parse_uint(cas)?),
        None => None,
    };
    let acquire = req.query.get("acquire").map(str::to_string);
    let release = req.query.get("release").map(str::to_string);
    let too_large = |n: usize| {
        format!(
            "Request body({n} bytes) too large, max size: {KV_MAX_VALUE_SIZE} bytes. See https://developer.hashicorp.com/docs/agent/config/config-files#kv_max_value_size."
        )
    };
    let shared = req.shared;
    let value = req.body(KV_MAX_VALUE_SIZE, too_large).await?.to_vec();
    let command = if let Some(session) = acquire {
        Command::KvLock {
            key,
            value,
            flags,
            session,
        }
    } else if let Some(session) = release {
        Command::KvUnlock {
            key,
            value,
            flags,
            session,
        }
    } else if let Some(index) = cas {
        Command::KvCas {
            key,
            value,
            flags,
            index,
        }
    } else {
        Command::KvSet { key, value, flags }
    };
    bool_reply(shared.write(command).await?)
}

async fn kv_delete(req: Req<'_>, key: String) -> Reply {
    conflicting_flags(&req.query, &["recurse", "cas"])?;
    let command = if req.query.has("recurse") {
        Command::KvDeleteTree { prefix: key }
    } else if key.is_empty() {
        return Err(HttpError::bad_request("Missing key name"));
    } else if let Some(cas) = req.query.get("cas") {
        Command::KvDeleteCas {
            key,
            index: parse_uint(cas)?,
        }
    } else {
        Command::KvDelete { key }
    };
    bool_reply(req.shared.write(command).await?)
}

fn bool_reply(outcome: Outcome) -> Reply {
    match outcome {
        Outcome::Bool(ok) => Ok(json_body(if ok {
            b"true".to_vec()
        } else {
            b"false".to_vec()
        })),
        other => Err(HttpError::internal(format!("unexpected outcome {other:?}"))),
    }
}

// ----- transactions -----

async fn txn(req: Req<'_>) -> Reply {
    let limit = TXN_MAX_REQ_LEN.max(KV_MAX_VALUE_SIZE);
    let too_large = move |n: usize| {
        format!(
            "Request body({n} bytes) too large, max size: {limit} bytes. See https://developer.hashicorp.com/docs/agent/config/config-files#txn_max_req_len."
        )
    };
    let shared = req.shared;
    let pretty = req.query.has("pretty");
    let body = req.body(limit, too_large).await?;
    let ops = parse_txn(&body)?;
    let read_only = !ops.iter().any(TxnOp::is_write);
    let outcome = shared.write(Command::Txn(ops)).await?;
    let (status, body) = match outcome {
        Outcome::TxnCommitted(results) => {
            let results: Vec<Value> = results
                .iter()
                .map(|r| {
                    json!({"KV": serde_json::to_value(DirEntry::new(&r.key, &r.entry)).expect("entries serialize")})
                })
                .collect();
            (StatusCode::OK, json!({"Results": results, "Errors": null}))
        }
        Outcome::TxnFailed(errors) => {
            let errors: Vec<Value> = errors
                .iter()
                .map(|e| json!({"OpIndex": e.op_index, "What": e.what}))
                .collect();
            (
                StatusCode::CONFLICT,
                json!({"Results": null, "Errors": errors}),
            )
        }
        other => return Err(HttpError::internal(format!("unexpected outcome {other:?}"))),
    };
    let mut response = json_body(to_json(&body, pretty));
    *response.status_mut() = status;
    if read_only {
        response = with_meta(response, None);
    }
    Ok(response)
}

fn parse_txn(body: &[u8]) -> Result<Vec<TxnOp>, HttpError> {
    let fail = |reason: String| HttpError::bad_request(format!("Failed to parse body: {reason}"));
    let value: Value = serde_json::from_slice(body).map_err(|e| fail(e.to_string()))?;
    let ops = match value {
        Value::Array(ops) => ops,
        Value::Null => Vec::new(),
        other => {
            return Err(fail(format!(
                "json: cannot unmarshal {} into Go value of type api.TxnOps",
                json_kind(&other)
            )))
        }
    };
    if ops.len() > TXN_MAX_OPS {
        return Err(HttpError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "Transaction contains too many operations ({} > {TXN_MAX_OPS})",
                ops.len()
            ),
        ));
    }
    let mut parsed = Vec::with_capacity(ops.len());
    for op in &ops {
        let Value::Object(op) = op else {
            return Err(fail(format!(
                "json: cannot unmarshal {} into Go value of type api.TxnOp",
                json_kind(op)
            )));
        };
        if let Some(other) = ["Node", "Service", "Check"]
            .iter()
            .find(|name| field(op, name).is_some_and(|v| !v.is_null()))
        {
            return Err(fail(format!(
                "{other} operations are not supported by leaderq server; only KV operations are"
            )));
        }
        let Some(Value::Object(kv)) = field(op, "KV") else {
            return Err(fail("operation has no KV member".into()));
        };
        let text = |name: &str| -> Result<String, HttpError> {
            match field(kv, name) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(fail(format!(
                    "json: cannot unmarshal {} into Go struct field KVTxnOp.KV.{name} of type string",
                    json_kind(other)
                ))),
            }
        };
        let number = |name: &str| -> Result<u64, HttpError> {
            match field(kv, name) {
                None | Some(Value::Null) => Ok(0),
                Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64().unwrap_or(0)),
                Some(other) => Err(fail(format!(
                    "json: cannot unmarshal {} into Go struct field KVTxnOp.KV.{name} of type uint64",
                    json_kind(other)
                ))),
            }
        };
        let key = text("Key")?;
        let value = base64::engine::general_purpose::STANDARD
            .decode(text("Value")?)
            .map_err(|e| fail(format!("illegal base64 data: {e}")))?;
        if value.len() > KV_MAX_VALUE_SIZE {
            return Err(HttpError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "Value for key {} is too large ({} > {KV_MAX_VALUE_SIZE} bytes)",
                    duration::quote(&key),
                    value.len()
                ),
            ));
        }
        parsed.push(TxnOp {
            verb: text("Verb")?,
            key,
            value,
            flags: number("Flags")?,
            index: number("Index")?,
            session: text("Session")?,
        });
    }
    Ok(parsed)
}

// ----- sessions -----

fn session_json(session: &Session) -> Value {
    let mut value = json!({
        "ID": session.id,
        "Name": session.name,
        "Node": session.node,
        "LockDelay": session.lock_delay.as_nanos() as u64,
        "Behavior": session.behavior.as_str(),
        "TTL": session.ttl,
        "NodeChecks": session.node_checks,
        "ServiceChecks": session.service_checks.as_ref().map(|checks| {
            checks.iter().map(|c| json!({"ID": c.id, "Namespace": c.namespace})).collect::<Vec<_>>()
        }),
        "CreateIndex": session.create_index,
        "ModifyIndex": session.modify_index,
    });
    if !session.checks.is_empty() {
        value["Checks"] = json!(session.checks);
    }
    value
}

async fn session_create(req: Req<'_>) -> Reply {
    let shared = req.shared;
    let mut spec = SessionSpec {
        id: uuid::Uuid::new_v4().to_string(),
        name: String::new(),
        node: shared.agent.node_name.clone(),
        lock_delay: DEFAULT_LOCK_DELAY,
        behavior: "release".into(),
        ttl: String::new(),
        node_checks: vec![SERF_CHECK_ID.into()],
        service_checks: None,
        checks: vec![SERF_CHECK_ID.into()],
    };
    let pretty = req.query.has("pretty");
    let body = req
        .body(SMALL_BODY_LIMIT, |_| "Request body too large".into())
        .await?;
    if !body.is_empty() {
        decode_session(&body, &mut spec)
            .map_err(|e| HttpError::bad_request(format!("Request decode failed: {e}")))?;
    }
    // Consul's fixupEmptySessionChecks: an empty legacy `Checks` empties NodeChecks; the
    // default legacy check defers to NodeChecks; an empty NodeChecks empties Checks.
    if spec.checks.is_empty() {
        spec.node_checks.clear();
    } else if spec.checks == [SERF_CHECK_ID] || spec.node_checks.is_empty() {
        spec.checks.clear();
    }
    if spec.node.is_empty() {
        return Err(HttpError::internal("Must provide Node"));
    }
    match shared.write(Command::SessionCreate(spec)).await? {
        Outcome::SessionCreated(id) => Ok(json_reply(&json!({ "ID": id }), pretty)),
        other => Err(HttpError::internal(format!("unexpected outcome {other:?}"))),
    }
}

/// Decodes a session-create body the way Go's encoding/json does: field names match
/// case-insensitively, unknown fields are ignored, `LockDelay` is a duration string or
/// nanoseconds (with Consul's "below 1000 means seconds" rule).
fn decode_session(body: &[u8], spec: &mut SessionSpec) -> Result<(), String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let Value::Object(object) = value else {
        return Err(format!(
            "json: cannot unmarshal {} into Go value of type structs.Session",
            json_kind(&value)
        ));
    };
    let string = |name: &str| -> Result<Option<String>, String> {
        match field(&object, name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!(
                "json: cannot unmarshal {} into Go struct field Session.{name} of type string",
                json_kind(other)
            )),
        }
    };
    let strings = |name: &str| -> Result<Option<Vec<String>>, String> {
        match field(&object, name) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(Vec::new())),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(format!(
                        "json: cannot unmarshal {} into Go struct field Session.{name} of type string",
                        json_kind(other)
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(format!(
                "json: cannot unmarshal {} into Go struct field Session.{name} of type []string",
                json_kind(other)
            )),
        }
    };
    if let Some(name) = string("Name")? {
        spec.name = name;
    }
    if let Some(node) = string("Node")? {
        spec.node = node;
    }
    if let Some(behavior) = string("Behavior")? {
        spec.behavior = behavior;
    }
    if let Some(ttl) = string("TTL")? {
        spec.ttl = ttl;
    }
    if let Some(node_checks) = strings("NodeChecks")? {
        spec.node_checks = node_checks;
    }
    if let Some(checks) = strings("Checks")? {
        spec.checks = checks;
    }
    match field(&object, "ServiceChecks") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            let mut checks = Vec::new();
            for item in items {
                let Value::Object(item) = item else {
                    return Err("json: cannot unmarshal into Go struct field Session.ServiceChecks of type structs.ServiceCheck".into());
                };
                let text = |name: &str| {
                    field(item, name)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                checks.push(ServiceCheck {
                    id: text("ID"),
                    namespace: text("Namespace"),
                });
            }
            spec.service_checks = Some(checks);
        }
        Some(other) => {
            return Err(format!(
                "json: cannot unmarshal {} into Go struct field Session.ServiceChecks of type []structs.ServiceCheck",
                json_kind(other)
            ))
        }
    }
    match field(&object, "LockDelay") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => {
            let delay = duration::parse(text)?;
            spec.lock_delay = seconds_if_small(delay.as_nanos() as u64);
        }
        Some(Value::Number(n)) => {
            let nanos = n.as_f64().unwrap_or(0.0).max(0.0) as u64;
            spec.lock_delay = seconds_if_small(nanos);
        }
        Some(other) => {
            return Err(format!(
                "json: cannot unmarshal {} into Go struct field Session.LockDelay of type time.Duration",
                json_kind(other)
            ))
        }
    }
    Ok(())
}

/// Users often send `"LockDelay": 15` meaning seconds; Consul reads values below 1000 so.
fn seconds_if_small(nanos: u64) -> Duration {
    if nanos < LOCK_DELAY_MIN_THRESHOLD {
        Duration::from_secs(nanos)
    } else {
        Duration::from_nanos(nanos)
    }
}

async fn session_destroy(req: Req<'_>) -> Reply {
    if req.rest.is_empty() {
        return Err(HttpError::bad_request("Missing session"));
    }
    req.shared
        .write(Command::SessionDestroy {
            id: req.rest.clone(),
        })
        .await?;
    Ok(json_body(b"true".to_vec()))
}

async fn session_renew(req: Req<'_>) -> Reply {
    if req.rest.is_empty() {
        return Err(HttpError::bad_request("Missing session"));
    }
    req.blocking()?;
    match req
        .shared
        .write(Command::SessionRenew {
            id: req.rest.clone(),
        })
        .await?
    {
        Outcome::Renewed(Some(session)) => Ok(json_reply(
            &json!([session_json(&session)]),
            req.query.has("pretty"),
        )),
        Outcome::Renewed(None) => Err(HttpError::new(
            StatusCode::NOT_FOUND,
            format!("Session id '{}' not found", req.rest),
        )),
        other => Err(HttpError::internal(format!("unexpected outcome {other:?}"))),
    }
}

async fn session_read(req: Req<'_>, endpoint: Endpoint) -> Reply {
    if endpoint != Endpoint::SessionList && req.rest.is_empty() {
        return Err(HttpError::bad_request(
            if endpoint == Endpoint::SessionNode {
                "Missing node name"
            } else {
                "Missing session"
            },
        ));
    }
    let blocking = req.blocking()?;
    let pretty = req.query.has("pretty");
    let (index, body) = watch::query(&req.shared.core, blocking, |state| {
        let sessions: Vec<Value> = state
            .sessions()
            .filter(|s| match endpoint {
                Endpoint::SessionInfo => s.id == req.rest,
                Endpoint::SessionNode => s.node == req.rest,
                _ => true,
            })
            .map(session_json)
            .collect();
        (state.tables().sessions.max(1), to_json(&sessions, pretty))
    })
    .await;
    Ok(with_meta(json_body(body), Some(index)))
}

// ----- agent, checks, catalog, status -----

fn leader_addr(shared: &Shared) -> String {
    format!("{}:8300", shared.agent.address)
}

fn agent_self(req: &Req<'_>) -> Response {
    let agent = &req.shared.agent;
    let leader = leader_addr(req.shared);
    let body = json!({
        "Config": {
            "Datacenter": DATACENTER,
            "PrimaryDatacenter": DATACENTER,
            "NodeName": agent.node_name,
            "NodeID": agent.node_id,
            "Revision": "leaderq",
            "Server": true,
            "Version": CONSUL_VERSION,
            "BuildDate": "",
        },
        "DebugConfig": {},
        "Coord": {"Vec": [0, 0, 0, 0, 0, 0, 0, 0], "Error": 1.5, "Adjustment": 0, "Height": 1e-5},
        "Member": {
            "Name": agent.node_name,
            "Addr": agent.address,
            "Port": 8301,
            "Tags": {"dc": DATACENTER, "role": "consul", "id": agent.node_id, "build": CONSUL_VERSION},
            "Status": 1,
            "ProtocolMin": 1, "ProtocolMax": 5, "ProtocolCur": 2,
            "DelegateMin": 2, "DelegateMax": 5, "DelegateCur": 4,
        },
        "Stats": {
            "consul": {
                "leader": "true",
                "leader_addr": leader,
                "server": "true",
                "bootstrap": "true",
                "known_datacenters": "1",
            },
            "agent": {"checks": "0", "services": "0"},
        },
        "Meta": {"consul-network-segment": ""},
    });
    json_reply(&body, req.query.has("pretty"))
}

fn check_json(agent_node: &str, check: &Check) -> Value {
    json!({
        "Node": agent_node,
        "CheckID": check.id,
        "Name": check.name,
        "Status": check.status.as_str(),
        "Notes": check.notes,
        "Output": check.output,
        "ServiceID": check.service_id,
        "ServiceName": "",
        "ServiceTags": [],
        "Type": if check.ttl.is_some() { "ttl" } else { "" },
        "Interval": "",
        "Timeout": "",
        "ExposedPort": 0,
        "Definition": {},
        "CreateIndex": check.create_index,
        "ModifyIndex": check.modify_index,
    })
}

async fn agent_checks(req: Req<'_>) -> Reply {
    let state = req.shared.core.state.read().await;
    let checks: Map<String, Value> = state
        .checks()
        .filter(|check| check.id != SERF_CHECK_ID)
        .map(|check| {
            (
                check.id.clone(),
                check_json(&req.shared.agent.node_name, check),
            )
        })
        .collect();
    drop(state);
    Ok(json_reply(&Value::Object(checks), req.query.has("pretty")))
}

async fn check_register(req: Req<'_>) -> Reply {
    let shared = req.shared;
    let body = req
        .body(SMALL_BODY_LIMIT, |_| "Request body too large".into())
        .await?;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| HttpError::bad_request(format!("Request decode failed: {e}")))?;
    let Value::Object(object) = value else {
        return Err(HttpError::bad_request(
            "Request decode failed: body is not a JSON object",
        ));
    };
    let text = |name: &str| {
        field(&object, name)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let name = text("Name");
    if name.is_empty() {
        return Err(HttpError::bad_request("Missing check name"));
    }
    let status = match text("Status").as_str() {
        "" => CheckStatus::Critical,
        other => {
            CheckStatus::parse(other).ok_or_else(|| HttpError::bad_request("Bad check status"))?
        }
    };
    let service_id = text("ServiceID");
    if !service_id.is_empty() {
        return Err(HttpError::new(
            StatusCode::NOT_FOUND,
            format!("ServiceID {} does not exist", duration::quote(&service_id)),
        ));
    }
    let active = [
        "Args",
        "ScriptArgs",
        "HTTP",
        "TCP",
        "GRPC",
        "UDP",
        "H2PING",
        "DockerContainerID",
        "AliasNode",
        "AliasService",
        "OSService",
    ];
    if active.iter().any(|kind| {
        field(&object, kind).is_some_and(|v| !v.is_null() && v != "" && v != &json!([]))
    }) {
        return Err(HttpError::bad_request(
            "Invalid check: leaderq server runs TTL checks only; register it with a TTL and update it through /v1/agent/check/pass",
        ));
    }
    let ttl = match field(&object, "TTL") {
        Some(Value::String(text)) if !text.is_empty() => duration::parse(text)
            .map_err(|e| HttpError::bad_request(format!("Request decode failed: {e}")))?,
        Some(Value::Number(n)) => Duration::from_nanos(n.as_u64().unwrap_or(0)),
        _ => Duration::ZERO,
    };
    if ttl.is_zero() {
        return Err(HttpError::bad_request(
            "Invalid check: TTL must be > 0 for TTL checks",
        ));
    }
    let id = match text("ID").as_str() {
        "" => name.clone(),
        id => id.to_string(),
    };
    let spec = CheckSpec {
        id,
        name,
        status,
        notes: text("Notes"),
        output: String::new(),
        service_id,
        ttl,
    };
    shared.write(Command::CheckRegister(spec)).await?;
    Ok(StatusCode::OK.into_response())
}

async fn check_deregister(req: Req<'_>) -> Reply {
    req.shared
        .write(Command::CheckDeregister {
            id: req.rest.clone(),
        })
        .await?;
    Ok(StatusCode::OK.into_response())
}

async fn check_set(req: Req<'_>, status: CheckStatus) -> Reply {
    let output = req.query.get("note").unwrap_or("").to_string();
    req.shared
        .write(Command::CheckUpdate {
            id: req.rest.clone(),
            status,
            output,
        })
        .await?;
    Ok(StatusCode::OK.into_response())
}

async fn check_update(req: Req<'_>) -> Reply {
    let shared = req.shared;
    let id = req.rest.clone();
    let body = req
        .body(SMALL_BODY_LIMIT, |_| "Request body too large".into())
        .await?;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| HttpError::bad_request(format!("Request decode failed: {e}")))?;
    let text = |name: &str| {
        value
            .as_object()
            .and_then(|o| field(o, name))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let status_text = text("Status");
    let status = CheckStatus::parse(&status_text)
        .ok_or_else(|| HttpError::bad_request(format!("Invalid check status: '{status_text}'")))?;
    shared
        .write(Command::CheckUpdate {
            id,
            status,
            output: text("Output"),
        })
        .await?;
    Ok(StatusCode::OK.into_response())
}

async fn catalog_nodes(req: Req<'_>) -> Reply {
    let blocking = req.blocking()?;
    let pretty = req.query.has("pretty");
    let (index, body) = watch::query(&req.shared.core, blocking, |state: &State| {
        let nodes: Vec<Value> = state
            .node()
            .map(|node| {
                json!({
                    "ID": node.id,
                    "Node": node.name,
                    "Address": node.address,
                    "Datacenter": DATACENTER,
                    "TaggedAddresses": {"lan": node.address, "lan_ipv4": node.address, "wan": node.address, "wan_ipv4": node.address},
                    "Meta": {"consul-network-segment": ""},
                    "CreateIndex": node.create_index,
                    "ModifyIndex": node.modify_index,
                })
            })
            .into_iter()
            .collect();
        (state.tables().nodes.max(1), to_json(&nodes, pretty))
    })
    .await;
    Ok(with_meta(json_body(body), Some(index)))
}

// ----- helpers -----

fn field<'a>(object: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    object.get(name).or_else(|| {
        object
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value)
    })
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Serializes as Consul does: compact, or with `?pretty` indented by 4 spaces plus a newline.
fn to_json<T: Serialize + ?Sized>(value: &T, pretty: bool) -> Vec<u8> {
    if !pretty {
        return serde_json::to_vec(value).expect("responses serialize");
    }
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    value
        .serialize(&mut serializer)
        .expect("responses serialize");
    out.push(b'\n');
    out
}

fn json_body(body: Vec<u8>) -> Response {
    let mut response = body.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn json_reply(value: &Value, pretty: bool) -> Response {
    json_body(to_json(value, pretty))
}

/// Consul's `setMeta`: the index (when the read has one) and the leader headers.
fn with_meta(mut response: Response, index: Option<u64>) -> Response {
    let headers = response.headers_mut();
    if let Some(index) = index {
        headers.insert("X-Consul-Index", HeaderValue::from(index.max(1)));
    }
    headers.insert("X-Consul-KnownLeader", HeaderValue::from_static("true"));
    headers.insert("X-Consul-LastContact", HeaderValue::from_static("0"));
    response
}

fn redirect(location: &str) -> Response {
    let mut response = StatusCode::MOVED_PERMANENTLY.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// Go's `cleanPath` as ServeMux applies it: resolves `.`, `..` and repeated slashes,
/// keeping a trailing slash.
fn clean_path(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    let mut cleaned = format!("/{}", parts.join("/"));
    if path.ends_with('/') && cleaned != "/" {
        cleaned.push('/');
    }
    cleaned
}

/// Percent-decoding; with `plus_as_space`, `+` is a space as in query strings.
fn unescape(text: &str, plus_as_space: bool) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if plus_as_space => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Go's `url.QueryEscape`.
fn query_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            b' ' => out.push('+'),
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

/// Query parameters as Go's `url.Values`: presence matters, the first value wins.
#[derive(Debug, Default)]
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(raw: &str) -> Query {
        let pairs = raw
            .split('&')
            .filter(|pair| !pair.is_empty())
            .filter_map(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                Some((unescape(key, true)?, unescape(value, true)?))
            })
            .collect();
        Query(pairs)
    }

    fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(key, _)| key == name)
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// Go's `Values.Encode`: sorted by key, escaped.
    fn encode(&self) -> String {
        let mut pairs: Vec<&(String, String)> = self.0.iter().collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        pairs
            .iter()
            .map(|(k, v)| format!("{}={}", query_escape(k), query_escape(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paths resolve like Go's ServeMux: exact routes, longest prefix, the rest is the key.
    #[test]
    fn routes_match_like_servemux() {
        assert_eq!(
            find_route("/v1/kv/a/b").map(|r| (r.0, r.2)),
            Some((Endpoint::Kv, "a/b"))
        );
        assert_eq!(find_route("/v1/kv/").map(|r| r.2), Some(""));
        assert_eq!(find_route("/v1/txn").map(|r| r.0), Some(Endpoint::Txn));
        assert!(find_route("/v1/txn/").is_none());
        assert!(find_route("/v1/nope").is_none());
        assert_eq!(
            find_route("/v1/agent/check/pass/c1").map(|r| (r.0, r.2)),
            Some((Endpoint::CheckPass, "c1"))
        );
    }

    /// Unclean paths are detected so they can be redirected, trailing slash kept.
    #[test]
    fn clean_path_matches_go() {
        assert_eq!(clean_path("/v1/kv/a//b"), "/v1/kv/a/b");
        assert_eq!(clean_path("/v1/kv/a/./b/"), "/v1/kv/a/b/");
        assert_eq!(clean_path("/v1/kv/a/../b"), "/v1/kv/b");
        assert_eq!(clean_path("/v1/kv/"), "/v1/kv/");
    }

    /// Query parsing and re-encoding follow Go's url.Values (used in the conflict message).
    #[test]
    fn query_parses_and_encodes_like_go() {
        let q = Query::parse("release=b&acquire=a%20x&flags");
        assert!(q.has("flags"));
        assert_eq!(q.get("acquire"), Some("a x"));
        assert_eq!(q.encode(), "acquire=a+x&flags=&release=b");
    }

    /// The hand-written listing is byte-for-byte what serde produces for the same entries.
    #[test]
    fn fast_listing_matches_serde() {
        let entries = [
            (
                "a/\"quoted\"".to_string(),
                Entry {
                    value: b"hello".to_vec(),
                    flags: u64::MAX,
                    session: Some("s".into()),
                    lock_index: 2,
                    create_index: 3,
                    modify_index: 4,
                },
            ),
            (
                "b".to_string(),
                Entry {
                    value: Vec::new(),
                    flags: 0,
                    session: None,
                    lock_index: 0,
                    create_index: 5,
                    modify_index: 6,
                },
            ),
        ];
        let fast = write_entries(entries.iter().map(|(k, e)| (k, e))).unwrap();
        let slow: Vec<DirEntry> = entries.iter().map(|(k, e)| DirEntry::new(k, e)).collect();
        assert_eq!(
            String::from_utf8(fast).unwrap(),
            String::from_utf8(to_json(&slow, false)).unwrap()
        );
        assert_eq!(write_entries(std::iter::empty()), None);
    }

    /// LockDelay numbers and strings below 1000ns are read as seconds.
    #[test]
    fn lock_delay_below_threshold_means_seconds() {
        let mut spec = SessionSpec {
            id: String::new(),
            name: String::new(),
            node: String::new(),
            lock_delay: DEFAULT_LOCK_DELAY,
            behavior: String::new(),
            ttl: String::new(),
            node_checks: Vec::new(),
            service_checks: None,
            checks: Vec::new(),
        };
        decode_session(br#"{"lockdelay": 15}"#, &mut spec).unwrap();
        assert_eq!(spec.lock_delay, Duration::from_secs(15));
        decode_session(br#"{"LockDelay": 1000}"#, &mut spec).unwrap();
        assert_eq!(spec.lock_delay, Duration::from_nanos(1000));
        decode_session(br#"{"LockDelay": "250ms"}"#, &mut spec).unwrap();
        assert_eq!(spec.lock_delay, Duration::from_millis(250));
        decode_session(br#"{"LockDelay": "0s"}"#, &mut spec).unwrap();
        assert_eq!(spec.lock_delay, Duration::ZERO);
        assert!(decode_session(br#"{"LockDelay": "5"}"#, &mut spec).is_err());
    }
}
