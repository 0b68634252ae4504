//! The producers' front door, `leaderq gateway`: an HTTP endpoint that enqueues on any
//! backend, so that a producer holds a token of its own instead of write rights on the
//! coordinator. `POST /v1/tasks` takes one task object (its key from the `Idempotency-Key`
//! header, created only if new: a replay answers the stored task and writes nothing) or an
//! array of them (written in the coordinator's write-sized chunks; the answer lists what
//! was written and what was refused); `GET /v1/tasks/<key>` answers a task's state and
//! attempts, what `leaderq tasks show` prints, as JSON.
//!
//! It is a process of its own rather than a route on the replicas' observe listener: a
//! replica runs on one thread whose awaits keep its lease alive, and a producer's 10,000
//! tasks parsed there would delay them; a front door is exposed to producers, the observe
//! listener to operators; and the door scales and restarts apart from the replicas.
//!
//! Every request is checked whole (`operate::produce`) before anything is written; the
//! writes are `operate::bulk`'s, through `Coordinator::edit`, never with a leadership. The
//! token is `token.rs`'s.

pub mod token;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::config::{QueueSettings, Settings};
use crate::coord::{Coordinator, WriteCost};
use crate::operate::produce::{self, Fault, Refusal, Rules};
use crate::operate::{bulk, tasks, OperateError};
use crate::ui::auth;
use token::Token;

/// The largest request body: 10,000 tasks of about 1.6 KB. A producer with more sends
/// several requests.
pub const MAX_BODY: usize = 16 * 1024 * 1024;
/// The header whose value is a single task's key.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Why `leaderq gateway` did not serve.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("{0}")]
    Settings(String),
    #[error("cannot listen on {listen} for the gateway: {reason}; pick another address with --listen or gateway.listen")]
    Bind { listen: SocketAddr, reason: String },
    #[error("the gateway stopped: {0}")]
    Serve(std::io::Error),
}

/// What a request handler reads: the coordinator, the queue's settings, the token.
pub struct Door {
    coord: Arc<dyn Coordinator>,
    queue: QueueSettings,
    token: Token,
}

impl Door {
    /// The door over `coord` as `settings` say; a token file is read now.
    pub fn new(coord: Arc<dyn Coordinator>, settings: &Settings) -> Result<Door, GatewayError> {
        let token = Token::from_settings(&settings.gateway).map_err(GatewayError::Settings)?;
        Ok(Door {
            coord,
            queue: settings.queue.clone(),
            token,
        })
    }

    /// Lets a request in, or says why not: 401 without the token, 403 with another one
    /// (or, with no token set, naming a host that is not loopback).
    fn admit(&self, headers: &HeaderMap) -> Result<(), Shut> {
        let shut = |status, message: &str| Shut(status, message.to_string());
        let token = self
            .token
            .current()
            .map_err(|why| Shut(StatusCode::SERVICE_UNAVAILABLE, why))?;
        let Some(token) = token else {
            return auth::check_loopback_host(headers).map_err(|_| {
                shut(StatusCode::FORBIDDEN, "without gateway.token the gateway answers only at a loopback address (127.0.0.1 or localhost); set a token to reach it by another name")
            });
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        match bearer {
            None => Err(shut(
                StatusCode::UNAUTHORIZED,
                "the gateway needs its token (gateway.token): send Authorization: Bearer <token>",
            )),
            Some(given) if auth::same(given.trim(), &token) => Ok(()),
            Some(_) => Err(shut(
                StatusCode::FORBIDDEN,
                "not the gateway's token (gateway.token); the dashboard's token does not open it",
            )),
        }
    }
}

/// A request not let in: its status and why.
struct Shut(StatusCode, String);

impl IntoResponse for Shut {
    fn into_response(self) -> Response {
        let mut refused = refusal(self.0, &self.1);
        if self.0 == StatusCode::UNAUTHORIZED {
            refused.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        refused
    }
}

impl Door {
    /// The request's tasks, each checked as the leader would check it (`produce::request`).
    fn check(&self, body: &[u8], given: Option<&str>) -> Result<produce::Request, Refusal> {
        let coord = self.coord.as_ref();
        let cost = |key: &str, value: &[u8]| -> WriteCost { bulk::create_cost(coord, key, value) };
        let rules = Rules {
            prefix: &self.queue.prefix,
            run_at_max_ahead: self.queue.run_at_max_ahead,
            limits: coord.limits(),
            guard: coord.guard_cost(),
            cost: &cost,
        };
        produce::request(body, given, &rules, chrono::Utc::now(), &mut bulk::fresh_id)
    }
}

/// The routes, over `door`.
pub fn router(door: Arc<Door>) -> Router {
    Router::new()
        .route("/v1/tasks", post(enqueue))
        .route("/v1/tasks/{*key}", get(show))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(door)
}

fn answer(status: StatusCode, body: Value) -> Response {
    let content_type = [(header::CONTENT_TYPE, "application/json")];
    (status, content_type, format!("{body}\n")).into_response()
}

fn refusal(status: StatusCode, message: &str) -> Response {
    answer(status, json!({ "error": message }))
}

/// A request refused whole: 400 malformed, 422 a rule broken, 413 too large; the JSON names
/// the task and the field.
fn refused_request(refusal: &Refusal) -> Response {
    let status = match refusal.fault {
        Fault::Malformed => StatusCode::BAD_REQUEST,
        Fault::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
        Fault::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
    };
    answer(
        status,
        json!({
            "error": refusal.to_string(),
            "field": refusal.field,
            "index": refusal.index,
            "written": [],
        }),
    )
}

async fn enqueue(State(door): State<Arc<Door>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(shut) = door.admit(&headers) {
        return shut.into_response();
    }
    let given = match headers.get(IDEMPOTENCY_KEY).map(|v| v.to_str()) {
        None => None,
        Some(Ok(key)) => Some(key),
        Some(Err(_)) => {
            let refused = Refusal {
                fault: Fault::Invalid,
                index: None,
                field: Some("Idempotency-Key".into()),
                message: "Idempotency-Key is not visible ASCII: a task key is A-Z a-z 0-9 _ . / -"
                    .into(),
            };
            return refused_request(&refused);
        }
    };
    let request = match door.check(&body, given) {
        Ok(request) => request,
        Err(refusal) => return refused_request(&refusal),
    };
    let coord = door.coord.as_ref();
    let created = bulk::create_all(coord, &request.tasks).await;
    if request.one {
        return one_created(&door, &request.tasks[0].key, &created).await;
    }
    let key = |i: &usize| request.tasks[*i].key.clone();
    let mut refused: Vec<Value> = created
        .existing
        .iter()
        .map(|i| json!({"index": i, "key": key(i), "reason": "exists: nothing written (a replay)"}))
        .collect();
    let error = created.error.clone().unwrap_or_default();
    refused.extend(
        created
            .unwritten
            .iter()
            .map(|i| json!({"index": i, "key": key(i), "reason": format!("not written: {error}")})),
    );
    let status = match created.error {
        None => StatusCode::OK,
        Some(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    tracing::info!(
        written = created.written.len(),
        existing = created.existing.len(),
        unwritten = created.unwritten.len(),
        "gateway: a bulk request"
    );
    answer(
        status,
        json!({
            "written": created.written.iter().map(key).collect::<Vec<_>>(),
            "refused": refused,
            "error": created.error,
        }),
    )
}

/// The answer to one task: 201 with its key when written, 200 with the stored task when
/// its key existed (a replay), 503 when the coordinator failed.
async fn one_created(door: &Door, key: &str, created: &bulk::Created) -> Response {
    if let Some(error) = &created.error {
        return answer(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "error": format!("not written: {error}; try again with the same Idempotency-Key") }),
        );
    }
    if !created.written.is_empty() {
        return answer(StatusCode::CREATED, json!({ "key": key, "created": true }));
    }
    let wanted = [key.to_string()];
    match door.coord.get(&wanted).await {
        Ok(mut found) => match found.pop() {
            Some(stored) => {
                let mut view = tasks::show_json(&stored, &door.queue, chrono::Utc::now());
                view["created"] = Value::Bool(false);
                answer(StatusCode::OK, view)
            }
            // Taken and finished since: the replay wrote nothing all the same.
            None => answer(
                StatusCode::OK,
                json!({ "key": key, "created": false, "state": "gone" }),
            ),
        },
        Err(err) => refusal(StatusCode::SERVICE_UNAVAILABLE, &err.to_string()),
    }
}

async fn show(
    State(door): State<Arc<Door>>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Response {
    if let Err(shut) = door.admit(&headers) {
        return shut.into_response();
    }
    match tasks::find(door.coord.as_ref(), &door.queue, &key).await {
        Ok(stored) => answer(
            StatusCode::OK,
            tasks::show_json(&stored, &door.queue, chrono::Utc::now()),
        ),
        Err(err @ OperateError::NoSuchTask { .. }) => {
            refusal(StatusCode::NOT_FOUND, &err.to_string())
        }
        Err(err @ OperateError::InvalidKey { .. }) => {
            refusal(StatusCode::BAD_REQUEST, &err.to_string())
        }
        Err(err) => refusal(StatusCode::SERVICE_UNAVAILABLE, &err.to_string()),
    }
}

/// Binds `listen` for the gateway, after checking that it may serve there: off loopback
/// only with a token.
pub async fn bind(
    listen: SocketAddr,
    door: &Door,
) -> Result<tokio::net::TcpListener, GatewayError> {
    if !listen.ip().is_loopback() && !door.token.is_set() {
        return Err(GatewayError::Settings(format!(
            "the gateway would serve on {listen}, which is not a loopback address, without a token: set gateway.token (LEADERQ__GATEWAY__TOKEN) or gateway.token_file to a long random secret, or listen on 127.0.0.1"
        )));
    }
    tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| GatewayError::Bind {
            listen,
            reason: e.to_string(),
        })
}

/// Serves the gateway on `listener` until `shutdown`.
pub async fn serve(
    door: Door,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> Result<(), GatewayError> {
    axum::serve(listener, router(Arc::new(door)))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .map_err(GatewayError::Serve)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Env;
    use crate::coord::memory::MemoryCoordinator;

    fn door(token: &str) -> Door {
        let mut settings = Settings::load(None, Env::new()).unwrap();
        settings.gateway.token = token.to_string();
        Door::new(Arc::new(MemoryCoordinator::default()), &settings).unwrap()
    }

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(name.clone(), value.parse().unwrap());
        }
        map
    }

    /// With a token: none sent is 401 (with a Bearer challenge), another one 403, the
    /// token itself lets the request in, whatever host it names.
    #[test]
    fn a_token_is_asked_for_and_checked() {
        let door = door("gateway-token-0123456789");
        let Err(shut) = door.admit(&headers(&[])) else {
            panic!("no token passed");
        };
        let answer = shut.into_response();
        assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(answer.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let wrong = headers(&[(header::AUTHORIZATION, "Bearer gateway-token-012345678X")]);
        assert_eq!(door.admit(&wrong).unwrap_err().0, StatusCode::FORBIDDEN);
        let right = headers(&[
            (header::AUTHORIZATION, "Bearer gateway-token-0123456789"),
            (header::HOST, "gateway.example:9465"),
        ]);
        assert!(door.admit(&right).is_ok());
    }

    /// Without a token, only a request naming a loopback host is let in.
    #[test]
    fn without_a_token_only_loopback_names_are_let_in() {
        let door = door("");
        let elsewhere = headers(&[(header::HOST, "gateway.example:9465")]);
        assert_eq!(door.admit(&elsewhere).unwrap_err().0, StatusCode::FORBIDDEN);
        assert!(door
            .admit(&headers(&[(header::HOST, "127.0.0.1:9465")]))
            .is_ok());
    }
}
