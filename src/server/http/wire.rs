//! Wire helpers shared by the endpoints: JSON as Go's encoder writes it, Consul's read
//! metadata headers, redirects, Go's path cleaning and query decoding.

use super::*;

pub(super) fn field<'a>(object: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    object.get(name).or_else(|| {
        object
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value)
    })
}

pub(super) fn json_kind(value: &Value) -> &'static str {
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
pub(super) fn to_json<T: Serialize + ?Sized>(value: &T, pretty: bool) -> Vec<u8> {
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

pub(super) fn json_body(body: Vec<u8>) -> Response {
    let mut response = body.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

pub(super) fn json_reply(value: &Value, pretty: bool) -> Response {
    json_body(to_json(value, pretty))
}

/// Consul's `setMeta`: the index (when the read has one) and the leader headers.
pub(super) fn with_meta(mut response: Response, index: Option<u64>) -> Response {
    let headers = response.headers_mut();
    if let Some(index) = index {
        headers.insert("X-Consul-Index", HeaderValue::from(index.max(1)));
    }
    headers.insert("X-Consul-KnownLeader", HeaderValue::from_static("true"));
    headers.insert("X-Consul-LastContact", HeaderValue::from_static("0"));
    response
}

pub(super) fn redirect(location: &str) -> Response {
    let mut response = StatusCode::MOVED_PERMANENTLY.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// Go's `cleanPath` as ServeMux applies it: resolves `.`, `..` and repeated slashes,
/// keeping a trailing slash.
pub(super) fn clean_path(path: &str) -> String {
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
pub(super) fn unescape(text: &str, plus_as_space: bool) -> Option<String> {
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
pub(super) fn query_escape(text: &str) -> String {
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
pub(super) struct Query(Vec<(String, String)>);

impl Query {
    pub(super) fn parse(raw: &str) -> Query {
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

    pub(super) fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(key, _)| key == name)
    }

    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// Go's `Values.Encode`: sorted by key, escaped.
    pub(super) fn encode(&self) -> String {
        let mut pairs: Vec<&(String, String)> = self.0.iter().collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        pairs
            .iter()
            .map(|(k, v)| format!("{}={}", query_escape(k), query_escape(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}
