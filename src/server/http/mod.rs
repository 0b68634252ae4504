//! Consul's HTTP API over the state machine: routing with Consul's 301/404/405 rules, query
//! parameters, request bodies, status codes, headers and JSON shapes.
//!
//! Wire types (`ModifyIndex`, `LockIndex`, …) live only here. Reads use the latest committed
//! snapshot (through `watch::query` so that every read can block); writes go to
//! `Shared::write` and are answered after they are durable. Rules belong in `state/`.
//!
//! This file routes and holds what every endpoint shares (`HttpError`, `Req`, the route
//! table); one file per endpoint family does the rest, as mini-redis has one file per
//! command: `kv.rs`, `txn.rs`, `session.rs`, `agent.rs` (self, checks), `service.rs` (agent
//! services, members, maintenance), `catalog.rs` (catalog and health reads), `event.rs`,
//! and `wire.rs` (JSON, metadata headers, paths, query strings as Go writes and reads them).
//!
//! What is copied was read in hashicorp/consul (agent/http.go `wrap`, `handler`, `Index`,
//! `setMeta`; agent/txn_endpoint.go; agent/agent_endpoint.go; agent/agent.go;
//! agent/health_endpoint.go; agent/event_endpoint.go) and Go's net/http; each fact is
//! stated at the code that copies it, and tests/server/wire.rs holds them to it.
//!
//! Size: the route table, the error type and the request every endpoint family shares, with
//! their tests; the endpoints are in files of their own.

mod agent;
mod catalog;
mod event;
mod kv;
mod service;
mod session;
mod txn;
mod wire;

use agent::*;
use catalog::*;
use event::*;
use kv::*;
use service::*;
use session::*;
use txn::*;
use wire::*;

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

use super::state::catalog::is_maintenance_check;
use super::state::{
    ApplyError, Check, CheckSpec, CheckStatus, Command, Entry, KvPrefix, Outcome, Service,
    ServiceCheck, Session, SessionSpec, State, TxnOp, DEFAULT_LOCK_DELAY, SERF_CHECK_ID,
};
use super::watch::{self, Blocking};
use super::{Shared, WriteError, CONSUL_VERSION, DATACENTER};
use crate::util::duration;

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
/// What Consul's index page says when its UI is off (agent/http.go `Index`).
const CONSUL_INDEX_TEXT: &str = "Consul Agent: UI disabled. To enable, set ui_config.enabled=true in the agent configuration and restart.";

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
            WriteError::Apply(
                err @ (ApplyError::UnknownCheck(_) | ApplyError::UnknownService(_)),
            ) => HttpError::new(StatusCode::NOT_FOUND, err.to_string()),
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
    CatalogServices,
    CatalogService,
    HealthService,
    HealthState,
    HealthNode,
    HealthChecks,
    AgentMembers,
    AgentServices,
    ServiceRegister,
    ServiceDeregister,
    ServiceMaintenance,
    NodeMaintenance,
    EventFire,
    EventList,
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
        "/v1/catalog/services",
        false,
        Endpoint::CatalogServices,
        "OPTIONS,GET",
    ),
    (
        "/v1/catalog/service/",
        true,
        Endpoint::CatalogService,
        "OPTIONS,GET",
    ),
    (
        "/v1/health/service/",
        true,
        Endpoint::HealthService,
        "OPTIONS,GET",
    ),
    (
        "/v1/health/state/",
        true,
        Endpoint::HealthState,
        "OPTIONS,GET",
    ),
    (
        "/v1/health/node/",
        true,
        Endpoint::HealthNode,
        "OPTIONS,GET",
    ),
    (
        "/v1/health/checks/",
        true,
        Endpoint::HealthChecks,
        "OPTIONS,GET",
    ),
    (
        "/v1/agent/members",
        false,
        Endpoint::AgentMembers,
        "OPTIONS,GET",
    ),
    (
        "/v1/agent/services",
        false,
        Endpoint::AgentServices,
        "OPTIONS,GET",
    ),
    (
        "/v1/agent/service/register",
        false,
        Endpoint::ServiceRegister,
        "OPTIONS,PUT",
    ),
    (
        "/v1/agent/service/deregister/",
        true,
        Endpoint::ServiceDeregister,
        "OPTIONS,PUT",
    ),
    (
        "/v1/agent/service/maintenance/",
        true,
        Endpoint::ServiceMaintenance,
        "OPTIONS,PUT",
    ),
    (
        "/v1/agent/maintenance",
        false,
        Endpoint::NodeMaintenance,
        "OPTIONS,PUT",
    ),
    ("/v1/event/fire/", true, Endpoint::EventFire, "OPTIONS,PUT"),
    ("/v1/event/list", false, Endpoint::EventList, "OPTIONS,GET"),
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
    let gzip = accepts_gzip(request.headers());
    let response = match dispatch(&shared, request).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    };
    let response = if response.extensions().get::<MuxAnswer>().is_some() {
        response
    } else {
        wrap_endpoint_answer(response, gzip).await
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

    // Go's ServeMux redirects unclean paths (`//`, `/./`, `/../`) to their clean form, and a
    // path registered with a trailing slash but reached without it to the slashed path,
    // keeping the query in both cases.
    let with_query = |location: String| match parts.uri.query() {
        Some(q) => format!("{location}?{q}"),
        None => location,
    };
    let cleaned = clean_path(&path);
    if cleaned != path {
        return Ok(redirect(&with_query(cleaned), &parts.method));
    }
    let slashed = format!("{path}/");
    if ROUTES
        .iter()
        .any(|(route, prefix, _, _)| *prefix && *route == slashed)
    {
        return Ok(redirect(&with_query(slashed), &parts.method));
    }
    let Some((endpoint, allow, rest)) = find_route(&path) else {
        // Consul's `Index` handler, which the mux falls back to.
        return Ok(if path == "/" {
            mux_text(StatusCode::OK, CONSUL_INDEX_TEXT)
        } else if path.contains("/v1/") {
            mux_text(
                StatusCode::NOT_FOUND,
                "Invalid URL path: not a recognized HTTP API endpoint\n",
            )
        } else {
            mux_text(
                StatusCode::NOT_FOUND,
                "Invalid URL path: if attempting to use the HTTP API, ensure the path starts with '/v1/'\n",
            )
        });
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
        Endpoint::CatalogServices => catalog_services(request).await,
        Endpoint::CatalogService => catalog_service(request).await,
        Endpoint::HealthService => health_service(request).await,
        Endpoint::HealthState => health_state(request).await,
        Endpoint::HealthNode => health_checks(request, true).await,
        Endpoint::HealthChecks => health_checks(request, false).await,
        Endpoint::AgentMembers => agent_members(&request),
        Endpoint::AgentServices => agent_services(request).await,
        Endpoint::ServiceRegister => service_register(request).await,
        Endpoint::ServiceDeregister => service_deregister(request).await,
        Endpoint::ServiceMaintenance => service_maintenance(request).await,
        Endpoint::NodeMaintenance => node_maintenance(request).await,
        Endpoint::EventFire => event_fire(request).await,
        Endpoint::EventList => event_list(request).await,
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

    /// Go's encoder escapes `<`, `>`, `&`, U+2028 and U+2029 in strings, compact and pretty.
    #[test]
    fn json_escapes_like_gos_encoder() {
        let value = json!({"k<": "a>&b\u{2028}\u{2029}\n\u{1}é"});
        assert_eq!(
            String::from_utf8(to_json(&value, false)).unwrap(),
            r#"{"k\u003c":"a\u003e\u0026b\u2028\u2029\n\u0001é"}"#
        );
        assert_eq!(
            String::from_utf8(to_json(&json!(["<"]), true)).unwrap(),
            "[\n    \"\\u003c\"\n]\n"
        );
        let mut out = Vec::new();
        write_json_string(&mut out, "x&y");
        assert_eq!(out, br#""x\u0026y""#);
    }

    /// gziphandler accepts gzip when it is listed with a q-value above 0, in any case.
    #[test]
    fn accepts_gzip_reads_q_values() {
        let accepts = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_str(value).unwrap(),
            );
            accepts_gzip(&headers)
        };
        assert!(accepts("gzip"));
        assert!(accepts("deflate, GZIP;q=0.5"));
        assert!(!accepts("gzip;q=0"));
        assert!(!accepts("deflate, br"));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    /// The effective consistency follows `?consistent`, `?stale` and `?max_stale`.
    #[test]
    fn consistency_level_follows_the_query() {
        assert_eq!(consistency_level(&Query::parse("")), "leader");
        assert_eq!(consistency_level(&Query::parse("stale")), "stale");
        assert_eq!(consistency_level(&Query::parse("consistent")), "consistent");
        assert_eq!(consistency_level(&Query::parse("max_stale=5s")), "stale");
        assert_eq!(consistency_level(&Query::parse("max_stale=0s")), "leader");
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
        let Written::Whole(fast) =
            write_entries_up_to(entries.iter().map(|(k, e)| (k, e)), usize::MAX)
        else {
            panic!("the whole listing is written");
        };
        let slow: Vec<DirEntry> = entries.iter().map(|(k, e)| DirEntry::new(k, e)).collect();
        assert_eq!(
            String::from_utf8(fast).unwrap(),
            String::from_utf8(to_json(&slow, false)).unwrap()
        );
        assert_eq!(
            write_entries_up_to(std::iter::empty(), usize::MAX),
            Written::None
        );
    }

    /// A listing cut after any entry and streamed from there is byte for byte the whole
    /// one; only entries under the prefix are listed.
    #[tokio::test]
    async fn a_streamed_listing_is_the_whole_listing() {
        let entry = |n: u64| Entry {
            value: vec![b'v'; n as usize * 7],
            flags: n,
            session: n.is_multiple_of(2).then(|| format!("s{n}")),
            lock_index: n,
            create_index: n,
            modify_index: n + 1,
        };
        let mut entries: Vec<(String, Entry)> =
            (0..20).map(|n| (format!("q/{n:02}"), entry(n))).collect();
        entries.push(("qq".to_string(), entry(99)));
        entries.push(("p".to_string(), entry(98)));
        let listed: Vec<(String, Entry)> = entries
            .iter()
            .filter(|(key, _)| key.starts_with("q/"))
            .cloned()
            .collect();
        let mut listed = listed;
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        let whole = match write_entries_up_to(listed.iter().map(|(k, e)| (k, e)), usize::MAX) {
            Written::Whole(body) => body,
            other => panic!("{other:?}"),
        };
        for limit in 1..whole.len() + 2 {
            let body = match write_entries_up_to(listed.iter().map(|(k, e)| (k, e)), limit) {
                Written::Whole(body) => body,
                Written::Head { head, last } => {
                    let rest = KvPrefix::of(entries.clone(), "q/");
                    let body = stream_rest(head, rest, last);
                    axum::body::to_bytes(body, usize::MAX)
                        .await
                        .unwrap()
                        .to_vec()
                }
                Written::None => panic!("entries were listed"),
            };
            assert_eq!(body, whole, "cut at {limit} bytes");
        }
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
