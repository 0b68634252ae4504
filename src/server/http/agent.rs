//! The agent's endpoints: `/v1/agent/self`, TTL checks (register, deregister, pass, warn,
//! fail, update) and the check list.

use super::*;

pub(super) fn leader_addr(shared: &Shared) -> String {
    format!("{}:8300", shared.agent.address)
}

pub(super) fn agent_self(req: &Req<'_>) -> Response {
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
        "Member": member_json(req.shared, false),
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
        // A Consul agent with its gRPC port on reports what Envoy versions it serves.
        "xDS": {
            "SupportedProxies": {"envoy": ["1.34.1", "1.33.2", "1.32.5", "1.31.8"]},
            "Port": 8502,
            "Ports": {"Plaintext": 8502, "TLS": -1},
        },
    });
    json_reply(&body, req.query.has("pretty"))
}

/// A check as Consul's `structs.HealthCheck` writes it; a service's check carries the
/// service's name and tags.
pub(super) fn check_json(agent_node: &str, check: &Check, service: Option<&Service>) -> Value {
    let kind = if is_maintenance_check(&check.id) {
        "maintenance"
    } else if check.ttl.is_some() {
        "ttl"
    } else {
        ""
    };
    json!({
        "Node": agent_node,
        "CheckID": check.id,
        "Name": check.name,
        "Status": check.status.as_str(),
        "Notes": check.notes,
        "Output": check.output,
        "ServiceID": check.service_id,
        "ServiceName": service.map_or("", |s| s.name.as_str()),
        "ServiceTags": service.map_or(&[][..], |s| s.tags.as_slice()),
        "Type": kind,
        "Interval": "",
        "Timeout": "",
        "ExposedPort": 0,
        "Definition": {},
        "CreateIndex": check.create_index,
        "ModifyIndex": check.modify_index,
    })
}

pub(super) async fn agent_checks(req: Req<'_>) -> Reply {
    let state = req.shared.core.state.read().await;
    let checks: Map<String, Value> = state
        .checks()
        .filter(|check| check.id != SERF_CHECK_ID)
        .map(|check| {
            (
                check.id.clone(),
                check_json(
                    &req.shared.agent.node_name,
                    check,
                    state.service(&check.service_id),
                ),
            )
        })
        .collect();
    drop(state);
    Ok(json_reply(&Value::Object(checks), req.query.has("pretty")))
}

pub(super) async fn check_register(req: Req<'_>) -> Reply {
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
    if !service_id.is_empty()
        && shared
            .core
            .state
            .read()
            .await
            .service(&service_id)
            .is_none()
    {
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

pub(super) async fn check_deregister(req: Req<'_>) -> Reply {
    req.shared
        .write(Command::CheckDeregister {
            id: req.rest.clone(),
        })
        .await?;
    Ok(StatusCode::OK.into_response())
}

pub(super) async fn check_set(req: Req<'_>, status: CheckStatus) -> Reply {
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

pub(super) async fn check_update(req: Req<'_>) -> Reply {
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
