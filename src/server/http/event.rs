//! User events: `/v1/event/fire/<name>` (`?node`, `?service`, `?tag` filters, the body as
//! payload) and `/v1/event/list` (`?name`, blocking on the last event's id), over the
//! agent's in-memory ring in `server/events.rs`.

use super::*;
use crate::server::events::{uuid_to_u64, UserEvent};

/// Serf's default `UserEventSizeLimit`, which Consul keeps.
const USER_EVENT_SIZE_LIMIT: usize = 512;
/// Consul gossips an event under this name prefix (`userEventName`).
const USER_EVENT_NAME_PREFIX: &str = "consul:event:";

/// The event as Consul's `UserEvent` writes it to JSON.
fn event_json(event: &UserEvent) -> Value {
    json!({
        "ID": event.id,
        "Name": event.name,
        "Payload": event.payload.as_ref().map(|p| base64::engine::general_purpose::STANDARD.encode(p)),
        "NodeFilter": event.node_filter,
        "ServiceFilter": event.service_filter,
        "TagFilter": event.tag_filter,
        "Version": 1,
        "LTime": event.ltime,
    })
}

/// The size serf checks: the gossip name plus the msgpack-encoded event (Consul's short
/// codec field names; an estimate within a few bytes of the real encoding).
fn encoded_size(event: &UserEvent) -> usize {
    let string = |s: &str| s.len() + if s.len() < 32 { 1 } else { 2 };
    let optional = |key: usize, s: &str| if s.is_empty() { 0 } else { key + string(s) };
    let payload = event.payload.as_ref().map_or(0, |p| 2 + p.len() + 2);
    USER_EVENT_NAME_PREFIX.len()
        + event.name.len()
        + 1 // message type
        + 1 // map header
        + 3 + string(&event.id)
        + 2 + string(&event.name)
        + payload
        + optional(3, &event.node_filter)
        + optional(3, &event.service_filter)
        + optional(3, &event.tag_filter)
        + 2 + 1
}

/// Consul's `validateUserEventParams`; its errors are answered with 500.
fn validate(event: &UserEvent) -> Result<(), String> {
    if !event.tag_filter.is_empty() && event.service_filter.is_empty() {
        return Err("Cannot provide tag filter without service filter".into());
    }
    for (what, filter) in [
        ("node", &event.node_filter),
        ("service", &event.service_filter),
        ("tag", &event.tag_filter),
    ] {
        if !filter.is_empty() {
            regex_lite::Regex::new(filter).map_err(|e| format!("Invalid {what} filter: {e}"))?;
        }
    }
    if encoded_size(event) > USER_EVENT_SIZE_LIMIT {
        return Err(format!(
            "user event exceeds configured limit of {USER_EVENT_SIZE_LIMIT} bytes before encoding"
        ));
    }
    Ok(())
}

/// Consul's `shouldProcessUserEvent`: the node filter must match this node's name, the
/// service filter one of its services (and the tag filter one of that service's tags).
fn selects_this_agent(
    event: &UserEvent,
    node_name: &str,
    services: &[(String, Vec<String>)],
) -> bool {
    let matches =
        |filter: &str, text: &str| regex_lite::Regex::new(filter).is_ok_and(|re| re.is_match(text));
    if !event.node_filter.is_empty() && !matches(&event.node_filter, node_name) {
        return false;
    }
    if event.service_filter.is_empty() {
        return true;
    }
    services.iter().any(|(name, tags)| {
        matches(&event.service_filter, name)
            && (event.tag_filter.is_empty() || tags.iter().any(|t| matches(&event.tag_filter, t)))
    })
}

pub(super) async fn event_fire(req: Req<'_>) -> Reply {
    let shared = req.shared;
    if req.rest.is_empty() {
        return Err(HttpError::bad_request("Missing name"));
    }
    let filter = |name: &str| req.query.get(name).unwrap_or("").to_string();
    let mut event = UserEvent {
        id: uuid::Uuid::new_v4().to_string(),
        name: req.rest.clone(),
        payload: None,
        node_filter: filter("node"),
        service_filter: filter("service"),
        tag_filter: filter("tag"),
        ltime: 0,
    };
    let pretty = req.query.has("pretty");
    // Consul reads a payload only when the request says how long it is.
    if req.content_length().is_some_and(|n| n > 0) {
        let body = req
            .body(SMALL_BODY_LIMIT, |_| "Request body too large".into())
            .await?;
        event.payload = Some(body.to_vec());
    }
    validate(&event).map_err(HttpError::internal)?;
    let services: Vec<(String, Vec<String>)> = shared
        .core
        .state
        .read()
        .await
        .services()
        .map(|s| (s.name.clone(), s.tags.clone()))
        .collect();
    if selects_this_agent(&event, &shared.agent.node_name, &services) {
        shared.events.add(event.clone());
    }
    Ok(json_reply(&event_json(&event), pretty))
}

pub(super) async fn event_list(req: Req<'_>) -> Reply {
    let wait = match req.query.get("wait").filter(|w| !w.is_empty()) {
        Some(wait) => {
            duration::parse(wait).map_err(|_| HttpError::bad_request("Invalid wait time"))?
        }
        None => Duration::ZERO,
    };
    let min_index = match req.query.get("index").filter(|i| !i.is_empty()) {
        Some(index) => index
            .parse::<u64>()
            .map_err(|_| HttpError::bad_request("Invalid index"))?,
        None => 0,
    };
    let name = req.query.get("name").unwrap_or("");
    // Consul waits its maximum query time when no wait is given, with no jitter here.
    let wait = if wait.is_zero() {
        watch::MAX_WAIT
    } else {
        wait.min(watch::MAX_WAIT)
    };
    let deadline = tokio::time::Instant::now() + wait;
    let core = &req.shared.core;
    let mut added = req.shared.events.subscribe();
    loop {
        added.borrow_and_update();
        let events: Vec<UserEvent> = req
            .shared
            .events
            .list()
            .into_iter()
            .filter(|e| name.is_empty() || e.name == name)
            .collect();
        let index = events.last().map_or(1, |e| uuid_to_u64(&e.id));
        // The index does not grow, so only an exact match with the client's blocks.
        let blocks = min_index > 0 && index == min_index && !core.is_closing();
        let woke = blocks
            && tokio::select! {
                changed = added.changed() => changed.is_ok(),
                _ = closing(core) => false,
                _ = tokio::time::sleep_until(deadline) => false,
            };
        if !woke {
            let list: Vec<Value> = events.iter().map(event_json).collect();
            let mut response = json_reply(&Value::Array(list), req.query.has("pretty"));
            response
                .headers_mut()
                .insert("X-Consul-Index", HeaderValue::from(index));
            return Ok(response);
        }
    }
}

/// How often a blocked event list looks whether the server is shutting down: events have
/// their own wake-up, not the commits' watch sets, so shutdown is polled here.
const CLOSING_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Resolves once the server is shutting down.
async fn closing(core: &super::super::Core) {
    while !core.is_closing() {
        tokio::time::sleep(CLOSING_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(node: &str, service: &str, tag: &str) -> UserEvent {
        UserEvent {
            id: "00000000-0000-0000-0000-000000000000".into(),
            name: "deploy".into(),
            payload: None,
            node_filter: node.into(),
            service_filter: service.into(),
            tag_filter: tag.into(),
            ltime: 0,
        }
    }

    /// Filters are regular expressions searched in the node name, the service names and
    /// that service's tags.
    #[test]
    fn filters_select_the_agent_as_consul() {
        let services = vec![("web".to_string(), vec!["blue".to_string()])];
        assert!(selects_this_agent(&event("", "", ""), "n1", &services));
        assert!(selects_this_agent(&event("^n", "", ""), "n1", &services));
        assert!(!selects_this_agent(&event("^x", "", ""), "n1", &services));
        assert!(selects_this_agent(&event("", "we", "blu"), "n1", &services));
        assert!(!selects_this_agent(
            &event("", "web", "green"),
            "n1",
            &services
        ));
        assert!(!selects_this_agent(&event("", "db", ""), "n1", &services));
    }

    /// A tag filter needs a service filter; bad expressions and oversized events are refused.
    #[test]
    fn validation_is_consuls() {
        assert_eq!(
            validate(&event("", "", "x")).unwrap_err(),
            "Cannot provide tag filter without service filter"
        );
        assert!(validate(&event("(", "", ""))
            .unwrap_err()
            .starts_with("Invalid node filter: "));
        let mut big = event("", "", "");
        big.payload = Some(vec![b'x'; 450]);
        assert!(validate(&big)
            .unwrap_err()
            .starts_with("user event exceeds"));
        big.payload = Some(vec![b'x'; 300]);
        assert!(validate(&big).is_ok());
    }
}
