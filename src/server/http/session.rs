//! Session endpoints: create (Go's lenient JSON decoding of the spec), destroy, renew, and
//! the info, node and list reads.

use super::*;

pub(super) fn session_json(session: &Session) -> Value {
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

pub(super) async fn session_create(req: Req<'_>) -> Reply {
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
pub(super) fn decode_session(body: &[u8], spec: &mut SessionSpec) -> Result<(), String> {
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
pub(super) fn seconds_if_small(nanos: u64) -> Duration {
    if nanos < LOCK_DELAY_MIN_THRESHOLD {
        Duration::from_secs(nanos)
    } else {
        Duration::from_nanos(nanos)
    }
}

pub(super) async fn session_destroy(req: Req<'_>) -> Reply {
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

pub(super) async fn session_renew(req: Req<'_>) -> Reply {
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

pub(super) async fn session_read(req: Req<'_>, endpoint: Endpoint) -> Reply {
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
