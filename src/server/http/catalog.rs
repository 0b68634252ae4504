//! Catalog and health reads: `/v1/catalog/nodes`, `/v1/catalog/services`,
//! `/v1/catalog/service/<name>`, `/v1/health/service/<name>` (`?passing`, `?tag`) and
//! `/v1/health/state/<state>`, all blocking, with Consul's shapes (`Node`, `ServiceNode`,
//! `CheckServiceNode`, `HealthCheck`) and the effective consistency header.
//!
//! A Consul server lists its own `consul` service (port 8300) in the catalog; so does this
//! one, built from the node at read time. Indexes are table indexes (services, checks,
//! nodes), so a blocked read may also return on a change to another service.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::server::state::{Node, Service, Weights};

/// The node as Consul's `structs.Node` writes it.
pub(super) fn node_json(node: &Node) -> Value {
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
}

/// The `consul` service a server registers for itself.
fn consul_service(node: &Node) -> Service {
    let meta = [
        ("non_voter", "false"),
        ("raft_version", "3"),
        ("read_replica", "false"),
        ("serf_protocol_current", "2"),
        ("serf_protocol_max", "5"),
        ("serf_protocol_min", "1"),
        ("version", CONSUL_VERSION),
    ];
    Service {
        id: "consul".into(),
        name: "consul".into(),
        tags: Vec::new(),
        address: String::new(),
        port: 8300,
        meta: meta
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        tagged_addresses: Default::default(),
        weights: Weights::default(),
        enable_tag_override: false,
        create_index: node.create_index,
        modify_index: node.create_index,
    }
}

/// Every instance in the catalog, the server's own `consul` service first as Consul's
/// memdb orders it by service id (the agent's services follow in id order).
fn instances(state: &State) -> Vec<Service> {
    let mut all: Vec<Service> = state.node().map(consul_service).into_iter().collect();
    all.extend(state.services().cloned());
    all.sort_by(|a, b| a.id.cmp(&b.id));
    all
}

fn tagged_addresses_json(service: &Service) -> Map<String, Value> {
    service
        .tagged_addresses
        .iter()
        .map(|(name, (address, port))| (name.clone(), json!({"Address": address, "Port": port})))
        .collect()
}

fn weights_json(weights: Weights) -> Value {
    json!({"Passing": weights.passing, "Warning": weights.warning})
}

/// A service as the agent reports it (`api.AgentService`).
pub(super) fn agent_service_json(service: &Service) -> Value {
    let mut out = Map::new();
    out.insert("ID".into(), json!(service.id));
    out.insert("Service".into(), json!(service.name));
    out.insert("Tags".into(), json!(service.tags));
    out.insert("Meta".into(), json!(service.meta));
    out.insert("Port".into(), json!(service.port));
    out.insert("Address".into(), json!(service.address));
    if !service.tagged_addresses.is_empty() {
        out.insert(
            "TaggedAddresses".into(),
            Value::Object(tagged_addresses_json(service)),
        );
    }
    out.insert("Weights".into(), weights_json(service.weights));
    out.insert(
        "EnableTagOverride".into(),
        json!(service.enable_tag_override),
    );
    out.insert("Datacenter".into(), json!(DATACENTER));
    Value::Object(out)
}

/// An instance in `/v1/catalog/service/<name>` (`structs.ServiceNode`).
fn service_node_json(node: &Node, service: &Service) -> Value {
    let node = node_json(node);
    let mut out = Map::new();
    for (from, to) in [
        ("ID", "ID"),
        ("Node", "Node"),
        ("Address", "Address"),
        ("Datacenter", "Datacenter"),
        ("TaggedAddresses", "TaggedAddresses"),
        ("Meta", "NodeMeta"),
    ] {
        out.insert(to.into(), node[from].clone());
    }
    out.insert("ServiceKind".into(), json!(""));
    out.insert("ServiceID".into(), json!(service.id));
    out.insert("ServiceName".into(), json!(service.name));
    out.insert("ServiceTags".into(), json!(service.tags));
    out.insert("ServiceAddress".into(), json!(service.address));
    if !service.tagged_addresses.is_empty() {
        out.insert(
            "ServiceTaggedAddresses".into(),
            Value::Object(tagged_addresses_json(service)),
        );
    }
    out.insert("ServiceWeights".into(), weights_json(service.weights));
    out.insert("ServiceMeta".into(), json!(service.meta));
    out.insert("ServicePort".into(), json!(service.port));
    out.insert("ServiceSocketPath".into(), json!(""));
    out.insert(
        "ServiceEnableTagOverride".into(),
        json!(service.enable_tag_override),
    );
    out.insert(
        "ServiceProxy".into(),
        json!({"Mode": "", "MeshGateway": {}, "Expose": {}}),
    );
    out.insert("ServiceConnect".into(), json!({}));
    out.insert("ServiceLocality".into(), Value::Null);
    out.insert("CreateIndex".into(), json!(service.create_index));
    out.insert("ModifyIndex".into(), json!(service.modify_index));
    Value::Object(out)
}

/// A service inside a `CheckServiceNode` (`structs.NodeService`).
fn node_service_json(service: &Service) -> Value {
    let mut out = Map::new();
    out.insert("ID".into(), json!(service.id));
    out.insert("Service".into(), json!(service.name));
    out.insert("Tags".into(), json!(service.tags));
    out.insert("Address".into(), json!(service.address));
    if !service.tagged_addresses.is_empty() {
        out.insert(
            "TaggedAddresses".into(),
            Value::Object(tagged_addresses_json(service)),
        );
    }
    out.insert("Meta".into(), json!(service.meta));
    if service.port != 0 {
        out.insert("Port".into(), json!(service.port));
    }
    out.insert("Weights".into(), weights_json(service.weights));
    out.insert(
        "EnableTagOverride".into(),
        json!(service.enable_tag_override),
    );
    out.insert(
        "Proxy".into(),
        json!({"Mode": "", "MeshGateway": {}, "Expose": {}}),
    );
    out.insert("Connect".into(), json!({}));
    out.insert("CreateIndex".into(), json!(service.create_index));
    out.insert("ModifyIndex".into(), json!(service.modify_index));
    Value::Object(out)
}

/// Whether an instance has every tag the query asks for (`?tag` may repeat).
fn has_tags(service: &Service, wanted: &[&str]) -> bool {
    wanted
        .iter()
        .all(|tag| service.tags.iter().any(|t| t == tag))
}

/// Go's `strconv.ParseBool`.
pub(super) fn parse_go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Consul's `filterNonPassing`: drops instances with a check that is not passing; a
/// dropped one's place is taken by the last one still kept, so the order can change.
fn filter_non_passing(mut nodes: Vec<(bool, Value)>) -> Vec<Value> {
    let mut n = nodes.len();
    let mut i = 0;
    while i < n {
        if nodes[i].0 {
            i += 1;
        } else {
            nodes.swap(i, n - 1);
            n -= 1;
        }
    }
    nodes.truncate(n);
    nodes.into_iter().map(|(_, node)| node).collect()
}

pub(super) async fn catalog_nodes(req: Req<'_>) -> Reply {
    let blocking = req.blocking()?;
    let pretty = req.query.has("pretty");
    let (index, body) = watch::query(&req.shared.core, blocking, |state: &watch::View| {
        let nodes: Vec<Value> = state.node().map(node_json).into_iter().collect();
        (state.tables().nodes.max(1), to_json(&nodes, pretty))
    })
    .await;
    Ok(with_catalog_meta(json_body(body), index, &req.query))
}

/// The catalog's index: its services and nodes tables.
fn catalog_index(state: &State) -> u64 {
    let tables = state.tables();
    tables.services.max(tables.nodes).max(1)
}

pub(super) async fn catalog_services(req: Req<'_>) -> Reply {
    let blocking = req.blocking()?;
    let pretty = req.query.has("pretty");
    let (index, body) = watch::query(&req.shared.core, blocking, |state: &watch::View| {
        let mut services: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for service in instances(state) {
            services
                .entry(service.name.clone())
                .or_default()
                .extend(service.tags.iter().cloned());
        }
        (catalog_index(state), to_json(&services, pretty))
    })
    .await;
    Ok(with_catalog_meta(json_body(body), index, &req.query))
}

pub(super) async fn catalog_service(req: Req<'_>) -> Reply {
    if req.rest.is_empty() {
        return Err(HttpError::bad_request("Missing service name"));
    }
    let blocking = req.blocking()?;
    let pretty = req.query.has("pretty");
    let tags: Vec<&str> = req.query.all("tag").collect();
    let (index, body) = watch::query(&req.shared.core, blocking, |state: &watch::View| {
        let nodes: Vec<Value> = match state.node() {
            Some(node) => instances(state)
                .iter()
                .filter(|s| s.name == req.rest && has_tags(s, &tags))
                .map(|s| service_node_json(node, s))
                .collect(),
            None => Vec::new(),
        };
        (catalog_index(state), to_json(&nodes, pretty))
    })
    .await;
    Ok(with_catalog_meta(json_body(body), index, &req.query))
}

/// A check as the health endpoints write it, with its service's name and tags.
pub(super) fn health_check_json(state: &State, node: &str, check: &Check) -> Value {
    check_json(node, check, state.service(&check.service_id))
}

pub(super) async fn health_service(req: Req<'_>) -> Reply {
    if req.rest.is_empty() {
        return Err(HttpError::bad_request("Missing service name"));
    }
    let blocking = req.blocking()?;
    let passing = match req.query.get("passing") {
        None => false,
        Some("") => true,
        Some(text) => parse_go_bool(text)
            .ok_or_else(|| HttpError::bad_request("Invalid value for ?passing"))?,
    };
    let pretty = req.query.has("pretty");
    let tags: Vec<&str> = req.query.all("tag").collect();
    let node_name = &req.shared.agent.node_name;
    let (index, body) = watch::query(&req.shared.core, blocking, |state: &watch::View| {
        let mut nodes = Vec::new();
        if let Some(node) = state.node() {
            for service in instances(state)
                .iter()
                .filter(|s| s.name == req.rest && has_tags(s, &tags))
            {
                let checks: Vec<&Check> = state.checks_of_service(&service.id).collect();
                let all_pass = checks.iter().all(|c| c.status == CheckStatus::Passing);
                let checks: Vec<Value> = checks
                    .iter()
                    .map(|c| health_check_json(state, node_name, c))
                    .collect();
                nodes.push((
                    all_pass,
                    json!({"Node": node_json(node), "Service": node_service_json(service), "Checks": checks}),
                ));
            }
        }
        let nodes: Vec<Value> = if passing {
            filter_non_passing(nodes)
        } else {
            nodes.into_iter().map(|(_, node)| node).collect()
        };
        let tables = state.tables();
        let index = tables.services.max(tables.checks).max(tables.nodes).max(1);
        (index, to_json(&nodes, pretty))
    })
    .await;
    Ok(with_catalog_meta(json_body(body), index, &req.query))
}

pub(super) async fn health_state(req: Req<'_>) -> Reply {
    if req.rest.is_empty() {
        return Err(HttpError::bad_request("Missing check state"));
    }
    let blocking = req.blocking()?;
    let pretty = req.query.has("pretty");
    let node_name = &req.shared.agent.node_name;
    let (index, body) = watch::query(&req.shared.core, blocking, |state: &watch::View| {
        let checks: Vec<Value> = state
            .checks()
            .filter(|c| req.rest == "any" || c.status.as_str() == req.rest)
            .map(|c| health_check_json(state, node_name, c))
            .collect();
        (state.tables().checks.max(1), to_json(&checks, pretty))
    })
    .await;
    Ok(with_catalog_meta(json_body(body), index, &req.query))
}

/// `/v1/health/node/<node>` (every check of the node, services' included) and
/// `/v1/health/checks/<service>` (the checks of that service's instances).
pub(super) async fn health_checks(req: Req<'_>, of_node: bool) -> Reply {
    if req.rest.is_empty() {
        return Err(HttpError::bad_request(if of_node {
            "Missing node name"
        } else {
            "Missing service name"
        }));
    }
    let blocking = req.blocking()?;
    let pretty = req.query.has("pretty");
    let node_name = &req.shared.agent.node_name;
    let (index, body) = watch::query(&req.shared.core, blocking, |state: &watch::View| {
        let checks: Vec<Value> = state
            .checks()
            .filter(|c| {
                if of_node {
                    state.node().is_some_and(|n| n.name == req.rest)
                } else {
                    state
                        .service(&c.service_id)
                        .is_some_and(|s| s.name == req.rest)
                }
            })
            .map(|c| health_check_json(state, node_name, c))
            .collect();
        (state.tables().checks.max(1), to_json(&checks, pretty))
    })
    .await;
    Ok(with_catalog_meta(json_body(body), index, &req.query))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Consul's filter swaps the last kept instance into a dropped one's place.
    #[test]
    fn non_passing_filter_keeps_consuls_order() {
        let nodes = vec![
            (false, json!("a")),
            (true, json!("b")),
            (true, json!("c")),
            (false, json!("d")),
        ];
        assert_eq!(filter_non_passing(nodes), vec![json!("c"), json!("b")]);
        assert!(filter_non_passing(vec![(false, json!("x"))]).is_empty());
    }

    /// Go's ParseBool spellings, nothing else.
    #[test]
    fn go_bool_spellings() {
        assert_eq!(parse_go_bool("T"), Some(true));
        assert_eq!(parse_go_bool("False"), Some(false));
        assert_eq!(parse_go_bool("yes"), None);
    }
}
