//! The agent's service endpoints: `/v1/agent/service/register` (with `Check`/`Checks` TTL
//! checks and `?replace-existing-checks`), `/deregister/<id>`, `/v1/agent/services`,
//! `/v1/agent/members`, and maintenance (`/v1/agent/maintenance`,
//! `/v1/agent/service/maintenance/<id>`). The decoding follows Go's: field names in any
//! case, Consul's validation and error texts.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::*;
use crate::server::state::{Service, ServiceCheckSpec, ServiceSpec, Weights};

/// Consul's service meta limits (structs.metaMaxKeyPairs and friends).
const META_MAX_PAIRS: usize = 64;
const META_KEY_MAX_LEN: usize = 128;
const META_VALUE_MAX_LEN: usize = 512;
/// Meta keys with this prefix are Consul's own.
const META_RESERVED_PREFIX: &str = "consul-";
/// Largest service weight Consul accepts.
const WEIGHT_MAX: i64 = 65535;

fn decode_error(field_path: &str, kind: &str, value: &Value) -> HttpError {
    HttpError::bad_request(format!(
        "Request decode failed: json: cannot unmarshal {} into Go struct field {field_path} of type {kind}",
        json_kind(value)
    ))
}

fn string_field(object: &Map<String, Value>, name: &str, path: &str) -> Result<String, HttpError> {
    match field(object, name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(other) => Err(decode_error(&format!("{path}.{name}"), "string", other)),
    }
}

fn int_field(object: &Map<String, Value>, name: &str, path: &str) -> Result<i64, HttpError> {
    match field(object, name) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) if n.as_i64().is_some() => Ok(n.as_i64().unwrap_or(0)),
        Some(other) => Err(decode_error(&format!("{path}.{name}"), "int", other)),
    }
}

fn string_list(
    object: &Map<String, Value>,
    name: &str,
    path: &str,
) -> Result<Vec<String>, HttpError> {
    match field(object, name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(text) => Ok(text.clone()),
                other => Err(decode_error(&format!("{path}.{name}"), "string", other)),
            })
            .collect(),
        Some(other) => Err(decode_error(&format!("{path}.{name}"), "[]string", other)),
    }
}

/// A Go duration field: a string in Go's syntax or a number of nanoseconds.
fn duration_field(object: &Map<String, Value>, name: &str) -> Result<Duration, HttpError> {
    match field(object, name) {
        None | Some(Value::Null) => Ok(Duration::ZERO),
        Some(Value::String(text)) if text.is_empty() => Ok(Duration::ZERO),
        Some(Value::String(text)) => duration::parse(text)
            .map_err(|e| HttpError::bad_request(format!("Request decode failed: {e}"))),
        Some(Value::Number(n)) => Ok(Duration::from_nanos(n.as_u64().unwrap_or(0))),
        Some(other) => Err(HttpError::bad_request(format!(
            "Request decode failed: json: cannot unmarshal {} into Go value of type time.Duration",
            json_kind(other)
        ))),
    }
}

/// Consul's `validateMetaPair` over a whole map.
fn validate_meta(meta: &BTreeMap<String, String>) -> Result<(), String> {
    if meta.len() > META_MAX_PAIRS {
        return Err(format!(
            "Node metadata cannot contain more than {META_MAX_PAIRS} key/value pairs"
        ));
    }
    for (key, value) in meta {
        let problem = if key.is_empty() {
            Some("Key cannot be blank".to_string())
        } else if !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            Some("Key contains invalid characters".to_string())
        } else if key.len() > META_KEY_MAX_LEN {
            Some(format!(
                "Key is too long (limit: {META_KEY_MAX_LEN} characters)"
            ))
        } else if key.starts_with(META_RESERVED_PREFIX) {
            Some(format!(
                "Key prefix '{META_RESERVED_PREFIX}' is reserved for internal use"
            ))
        } else if value.len() > META_VALUE_MAX_LEN {
            Some(format!(
                "Value is too long (limit: {META_VALUE_MAX_LEN} characters)"
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(format!(
                "Couldn't load metadata pair ('{key}', '{value}'): {problem}"
            ));
        }
    }
    Ok(())
}

/// One `CheckType` of a registration; `None` for an empty object, which Consul skips.
fn parse_check(value: &Value, path: &str) -> Result<Option<(ServiceCheckSpec, String)>, HttpError> {
    let object = match value {
        Value::Null => return Ok(None),
        Value::Object(object) if object.is_empty() => return Ok(None),
        Value::Object(object) => object,
        other => return Err(decode_error(path, "structs.CheckType", other)),
    };
    let ttl = duration_field(object, "TTL")?;
    let interval = duration_field(object, "Interval")?;
    let active = [
        "Args",
        "ScriptArgs",
        "HTTP",
        "TCP",
        "UDP",
        "GRPC",
        "H2PING",
        "DockerContainerID",
        "OSService",
    ]
    .iter()
    .any(|kind| field(object, kind).is_some_and(|v| !v.is_null() && v != "" && v != &json!([])));
    let alias = ["AliasNode", "AliasService"]
        .iter()
        .any(|kind| field(object, kind).is_some_and(|v| v.as_str().is_some_and(|s| !s.is_empty())));
    // CheckType.Validate, in Consul's order.
    let invalid = if !interval.is_zero() && !ttl.is_zero() {
        Some("Interval and TTL cannot both be specified")
    } else if active && interval.is_zero() {
        Some("Interval must be > 0 for Script, HTTP, H2PING, TCP or UDP checks")
    } else if !active && !alias && ttl.is_zero() {
        Some("TTL must be > 0 for TTL checks")
    } else {
        None
    };
    if let Some(reason) = invalid {
        return Err(HttpError::bad_request(format!("Invalid check: {reason}")));
    }
    let status = string_field(object, "Status", path)?;
    let spec = ServiceCheckSpec {
        id: string_field(object, "CheckID", path)?,
        name: string_field(object, "Name", path)?,
        status: CheckStatus::parse(&status),
        notes: string_field(object, "Notes", path)?,
        ttl,
    };
    if active || alias {
        return Err(HttpError::bad_request(
            "Invalid check: leaderq server runs TTL checks only; register it with a TTL and update it through /v1/agent/check/pass",
        ));
    }
    Ok(Some((spec, status)))
}

/// Whether an address names every interface (Consul's `ipaddr.IsAny`).
fn is_any_address(address: &str) -> bool {
    let bare = address.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_unspecified())
}

/// Decodes and validates a registration body as Consul's `AgentRegisterService` does.
pub(super) fn parse_registration(
    body: &[u8],
    replace_existing_checks: bool,
) -> Result<ServiceSpec, HttpError> {
    const PATH: &str = "ServiceDefinition";
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| HttpError::bad_request(format!("Request decode failed: {e}")))?;
    let object = match value {
        Value::Object(object) => object,
        other => {
            return Err(HttpError::bad_request(format!(
                "Request decode failed: json: cannot unmarshal {} into Go value of type structs.ServiceDefinition",
                json_kind(&other)
            )))
        }
    };
    let name = string_field(&object, "Name", PATH)?;
    if name.is_empty() {
        return Err(HttpError::bad_request("Missing service name"));
    }
    let address = string_field(&object, "Address", PATH)?;
    if is_any_address(&address) {
        return Err(HttpError::bad_request("Invalid service address"));
    }
    let kind = string_field(&object, "Kind", PATH)?;
    if !kind.is_empty() {
        return Err(HttpError::bad_request(format!(
            "Validation failed: leaderq server registers typical services only, not kind {}",
            duration::quote(&kind)
        )));
    }
    let port = int_field(&object, "Port", PATH)?;
    let port = u16::try_from(port)
        .map_err(|_| HttpError::bad_request(format!("Validation failed: invalid port {port}")))?;
    let weights = match field(&object, "Weights") {
        None | Some(Value::Null) => Weights::default(),
        Some(Value::Object(w)) => {
            let passing = int_field(w, "Passing", "ServiceDefinition.Weights")?;
            let warning = int_field(w, "Warning", "ServiceDefinition.Weights")?;
            let invalid = if passing < 1 {
                Some("Passing must be greater than 0")
            } else if warning < 0 {
                Some("Warning must be greater or equal than 0")
            } else if passing > WEIGHT_MAX || warning > WEIGHT_MAX {
                Some("Passing or Warning must be less than 65536")
            } else {
                None
            };
            if let Some(reason) = invalid {
                return Err(HttpError::bad_request(format!("Invalid Weights: {reason}")));
            }
            Weights {
                passing: passing as u32,
                warning: warning as u32,
            }
        }
        Some(other) => {
            return Err(decode_error(
                "ServiceDefinition.Weights",
                "structs.Weights",
                other,
            ))
        }
    };
    let meta: BTreeMap<String, String> = match field(&object, "Meta") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(meta)) => meta
            .iter()
            .map(|(k, v)| match v {
                Value::String(v) => Ok((k.clone(), v.clone())),
                other => Err(decode_error("ServiceDefinition.Meta", "string", other)),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(decode_error(
                "ServiceDefinition.Meta",
                "map[string]string",
                other,
            ))
        }
    };
    validate_meta(&meta)
        .map_err(|e| HttpError::bad_request(format!("Invalid Service Meta: {e}")))?;
    let mut tagged_addresses = BTreeMap::new();
    match field(&object, "TaggedAddresses").or_else(|| field(&object, "tagged_addresses")) {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (name, entry) in map {
                let Value::Object(entry) = entry else {
                    return Err(decode_error(
                        "ServiceDefinition.TaggedAddresses",
                        "structs.ServiceAddress",
                        entry,
                    ));
                };
                let address = string_field(entry, "Address", "ServiceAddress")?;
                let port = int_field(entry, "Port", "ServiceAddress")?;
                tagged_addresses.insert(name.clone(), (address, u16::try_from(port).unwrap_or(0)));
            }
        }
        Some(other) => {
            return Err(decode_error(
                "ServiceDefinition.TaggedAddresses",
                "map[string]structs.ServiceAddress",
                other,
            ))
        }
    }
    // Consul's agent fills in the LAN and WAN addresses of the service's own IP.
    if let Ok(ip) = address.parse::<IpAddr>() {
        let (lan, wan) = if ip.is_ipv4() {
            ("lan_ipv4", "wan_ipv4")
        } else {
            ("lan_ipv6", "wan_ipv6")
        };
        for name in [lan, wan] {
            tagged_addresses
                .entry(name.to_string())
                .or_insert_with(|| (address.clone(), port));
        }
    }
    let mut checks = Vec::new();
    let mut statuses = Vec::new();
    if let Some(check) = field(&object, "Check") {
        if let Some((spec, status)) = parse_check(check, "ServiceDefinition.Check")? {
            checks.push(spec);
            statuses.push(status);
        }
    }
    match field(&object, "Checks") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for check in list {
                if let Some((spec, status)) = parse_check(check, "ServiceDefinition.Checks")? {
                    checks.push(spec);
                    statuses.push(status);
                }
            }
        }
        Some(other) => {
            return Err(decode_error(
                "ServiceDefinition.Checks",
                "structs.CheckTypes",
                other,
            ))
        }
    }
    if statuses
        .iter()
        .any(|s| !s.is_empty() && CheckStatus::parse(s).is_none())
    {
        return Err(HttpError::bad_request(
            "Status for checks must 'passing', 'warning', 'critical'",
        ));
    }
    let id = match string_field(&object, "ID", PATH)? {
        id if id.is_empty() => name.clone(),
        id => id,
    };
    let enable_tag_override = match field(&object, "EnableTagOverride")
        .or_else(|| field(&object, "enable_tag_override"))
    {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(decode_error(
                "ServiceDefinition.EnableTagOverride",
                "bool",
                other,
            ))
        }
    };
    Ok(ServiceSpec {
        service: Service {
            id,
            name,
            tags: string_list(&object, "Tags", PATH)?,
            address,
            port,
            meta,
            tagged_addresses,
            weights,
            enable_tag_override,
            create_index: 0,
            modify_index: 0,
        },
        checks,
        replace_existing_checks,
    })
}

pub(super) async fn service_register(req: Req<'_>) -> Reply {
    let shared = req.shared;
    let replace = req
        .query
        .get("replace-existing-checks")
        .is_some_and(|v| v.is_empty() || v == "true");
    let body = req
        .body(SMALL_BODY_LIMIT, |_| "Request body too large".into())
        .await?;
    let spec = parse_registration(&body, replace)?;
    shared.write(Command::ServiceRegister(spec)).await?;
    Ok(StatusCode::OK.into_response())
}

pub(super) async fn service_deregister(req: Req<'_>) -> Reply {
    req.shared
        .write(Command::ServiceDeregister {
            id: req.rest.clone(),
        })
        .await?;
    Ok(StatusCode::OK.into_response())
}

pub(super) async fn agent_services(req: Req<'_>) -> Reply {
    let state = req.shared.core.state.read().await;
    let services: Map<String, Value> = state
        .services()
        .map(|s| (s.id.clone(), agent_service_json(s)))
        .collect();
    drop(state);
    Ok(json_reply(
        &Value::Object(services),
        req.query.has("pretty"),
    ))
}

/// This agent as a member of its LAN pool (`serf.Member`), or of the WAN pool, where a
/// server is named `<node>.<datacenter>` and gossips on port 8302.
pub(super) fn member_json(shared: &Shared, wan: bool) -> Value {
    let agent = &shared.agent;
    let (name, port) = if wan {
        (format!("{}.{DATACENTER}", agent.node_name), 8302)
    } else {
        (agent.node_name.clone(), 8301)
    };
    json!({
        "Name": name,
        "Addr": agent.address,
        "Port": port,
        "Tags": {"build": CONSUL_VERSION, "dc": DATACENTER, "id": agent.node_id, "role": "consul"},
        "Status": 1,
        "ProtocolMin": 1, "ProtocolMax": 5, "ProtocolCur": 2,
        "DelegateMin": 2, "DelegateMax": 5, "DelegateCur": 4,
    })
}

pub(super) fn agent_members(req: &Req<'_>) -> Reply {
    let wan = req.query.get("wan").is_some_and(|w| !w.is_empty());
    let segment = req.query.get("segment").unwrap_or("");
    if wan && !segment.is_empty() && segment != "_all" {
        return Err(HttpError::bad_request(
            "Cannot provide a segment with wan=true",
        ));
    }
    Ok(json_reply(
        &json!([member_json(req.shared, wan)]),
        req.query.has("pretty"),
    ))
}

/// `?enable` as Consul reads it: required, and one of Go's boolean spellings.
fn enable_param(query: &Query) -> Result<bool, HttpError> {
    let Some(raw) = query.get("enable") else {
        return Err(HttpError::bad_request("Missing value for enable"));
    };
    parse_go_bool(raw).ok_or_else(|| {
        HttpError::bad_request(format!(
            "Invalid value for enable: {}",
            duration::quote(raw)
        ))
    })
}

pub(super) async fn node_maintenance(req: Req<'_>) -> Reply {
    let enable = enable_param(&req.query)?;
    req.shared
        .write(Command::Maintenance {
            service: None,
            enable,
            reason: req.query.get("reason").unwrap_or("").to_string(),
        })
        .await?;
    Ok(StatusCode::OK.into_response())
}

pub(super) async fn service_maintenance(req: Req<'_>) -> Reply {
    if req.rest.is_empty() {
        return Err(HttpError::bad_request("Missing service ID"));
    }
    let enable = enable_param(&req.query)?;
    req.shared
        .write(Command::Maintenance {
            service: Some(req.rest.clone()),
            enable,
            reason: req.query.get("reason").unwrap_or("").to_string(),
        })
        .await?;
    Ok(StatusCode::OK.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Defaults as Consul's agent applies them: ID from the name, weights 1/1, LAN and WAN
    /// addresses from an IP address; checks keep their order.
    #[test]
    fn registration_defaults() {
        let spec = parse_registration(
            br#"{"name": "web", "address": "10.0.0.1", "port": 80, "checks": [{"ttl": "10s"}, {"CheckID": "x", "TTL": 5000000000}]}"#,
            false,
        )
        .unwrap();
        assert_eq!(spec.service.id, "web");
        assert_eq!(spec.service.weights, Weights::default());
        assert_eq!(
            spec.service.tagged_addresses.get("wan_ipv4"),
            Some(&("10.0.0.1".to_string(), 80))
        );
        assert_eq!(spec.checks.len(), 2);
        assert_eq!(spec.checks[1].id, "x");
        assert_eq!(spec.checks[1].ttl, Duration::from_secs(5));
        let bare = parse_registration(br#"{"Name": "web", "Check": {}}"#, false).unwrap();
        assert!(bare.checks.is_empty());
        assert!(bare.service.tagged_addresses.is_empty());
    }

    /// Consul's validation texts.
    #[test]
    fn registration_validation() {
        let error = |body: &str| parse_registration(body.as_bytes(), false).unwrap_err().body;
        assert_eq!(
            error(r#"{"Name": "a", "Address": "::"}"#),
            "Invalid service address"
        );
        assert_eq!(
            error(r#"{"Name": "a", "Weights": {"Passing": 0}}"#),
            "Invalid Weights: Passing must be greater than 0"
        );
        assert_eq!(
            error(r#"{"Name": "a", "Meta": {"consul-x": "1"}}"#),
            "Invalid Service Meta: Couldn't load metadata pair ('consul-x', '1'): Key prefix 'consul-' is reserved for internal use"
        );
        assert_eq!(
            error(r#"{"Name": "a", "Check": {"TTL": "1s", "Interval": "1s"}}"#),
            "Invalid check: Interval and TTL cannot both be specified"
        );
        assert_eq!(
            error(r#"{"Name": "a", "Port": "80"}"#),
            "Request decode failed: json: cannot unmarshal string into Go struct field ServiceDefinition.Port of type int"
        );
        assert_eq!(
            error("[]"),
            "Request decode failed: json: cannot unmarshal array into Go value of type structs.ServiceDefinition"
        );
    }
}
