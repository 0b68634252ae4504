//! Wire helpers shared by the endpoints: JSON as Go's encoder writes it, Consul's read
//! metadata headers, what Consul's handler wrapper adds to every endpoint answer (the
//! default ACL policy, `Vary`, gzip), Go's mux redirects and texts, path cleaning and query
//! decoding.
//!
//! Header names are written in Go's canonical MIME form by the connection (`serve.rs`
//! turns on hyper's title-case writer), so they are inserted here in any case.

use std::io::Write as _;

use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};

use super::*;

/// NYTimes gziphandler's `DefaultMinSize`, which Consul's wrapper uses for every endpoint but
/// the streaming ones: smaller bodies are sent as they are.
pub(super) const GZIP_MIN_SIZE: usize = 1400;
/// Consul's `acl.default_policy`, sent on every endpoint answer; ACLs are off here.
const DEFAULT_ACL_POLICY: &str = "allow";

/// Marks an answer of the mux itself (a redirect, the index page, an unknown path), which
/// Consul does not pass through its handler wrapper: no ACL policy header, no `Vary`.
#[derive(Clone, Copy, Debug)]
pub(super) struct MuxAnswer;

/// Go's `encoding/json` escaping on top of serde_json's: `<`, `>`, `&`, U+2028 and U+2029
/// become `\u003c`, `\u003e`, `\u0026`, `\u2028`, `\u2029` (Go's default HTML-safe
/// encoding); control characters are escaped by serde_json exactly as Go does.
struct GoFormatter<F>(F);

impl<F: Formatter> Formatter for GoFormatter<F> {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (at, ch) in fragment.char_indices() {
            let escaped = match ch {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..at])?;
            writer.write_all(escaped.as_bytes())?;
            start = at + ch.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }

    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_array(w)
    }

    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array(w)
    }

    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_array_value(w, first)
    }

    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array_value(w)
    }

    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object(w)
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object(w)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_object_key(w, first)
    }

    fn end_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object_key(w)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object_value(w)
    }

    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object_value(w)
    }
}

/// Appends `text` as a JSON string, escaped as Go escapes it.
pub(super) fn write_json_string(out: &mut Vec<u8>, text: &str) {
    let mut serializer = serde_json::Serializer::with_formatter(out, GoFormatter(CompactFormatter));
    text.serialize(&mut serializer).expect("strings serialize");
}

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
/// Strings are escaped as Go's encoder escapes them (see `GoFormatter`).
pub(super) fn to_json<T: Serialize + ?Sized>(value: &T, pretty: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if pretty {
        let formatter = GoFormatter(PrettyFormatter::with_indent(b"    "));
        let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
        value
            .serialize(&mut serializer)
            .expect("responses serialize");
        out.push(b'\n');
    } else {
        let mut serializer =
            serde_json::Serializer::with_formatter(&mut out, GoFormatter(CompactFormatter));
        value
            .serialize(&mut serializer)
            .expect("responses serialize");
    }
    out
}

pub(super) fn json_body(body: impl IntoResponse) -> Response {
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

/// Consul's `QueryOptions.ConsistencyLevel()`, which catalog and health reads report in
/// `X-Consul-Effective-Consistency`: `consistent`, `stale` (also for a positive
/// `max_stale`), or `leader`, the default.
pub(super) fn consistency_level(query: &Query) -> &'static str {
    if query.has("consistent") {
        "consistent"
    } else if query.has("stale")
        || query
            .get("max_stale")
            .and_then(|d| duration::parse(d).ok())
            .is_some_and(|d| !d.is_zero())
    {
        "stale"
    } else {
        "leader"
    }
}

/// `setMeta` of a catalog or health read: the index and leader headers plus the
/// consistency that served it.
pub(super) fn with_catalog_meta(response: Response, index: u64, query: &Query) -> Response {
    let mut response = with_meta(response, Some(index));
    response.headers_mut().insert(
        "X-Consul-Effective-Consistency",
        HeaderValue::from_static(consistency_level(query)),
    );
    response
}

/// Go's `http.Redirect` with 301, as its ServeMux sends it: `Location`, and for a GET a
/// short HTML body naming the target (HEAD gets the content type only).
pub(super) fn redirect(location: &str, method: &Method) -> Response {
    let body = if *method == Method::GET {
        format!(
            "<a href=\"{}\">Moved Permanently</a>.\n\n",
            html_escape(location)
        )
    } else {
        String::new()
    };
    let mut response = (StatusCode::MOVED_PERMANENTLY, body).into_response();
    let headers = response.headers_mut();
    headers.remove(header::CONTENT_TYPE);
    if let Ok(value) = HeaderValue::from_str(location) {
        headers.insert(header::LOCATION, value);
    }
    if *method == Method::GET || *method == Method::HEAD {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
    }
    response.extensions_mut().insert(MuxAnswer);
    response
}

/// Go's `htmlEscape` as `http.Redirect` uses it.
fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            ch => out.push(ch),
        }
    }
    out
}

/// A text the mux writes itself (Consul's `Index` handler, which is not wrapped): Go's
/// `Fprintln` adds the newline, and Go sniffs the type as plain text.
pub(super) fn mux_text(status: StatusCode, text: &str) -> Response {
    let mut response = (status, text.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response.extensions_mut().insert(MuxAnswer);
    response
}

/// gziphandler's `acceptsGzip`: the client lists `gzip` with a q-value above 0.
pub(super) fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or("").trim();
            if !name.eq_ignore_ascii_case("gzip") {
                return false;
            }
            let q = parts
                .filter_map(|param| param.trim().strip_prefix("q="))
                .filter_map(|q| q.trim().parse::<f64>().ok())
                .next()
                .unwrap_or(1.0);
            q > 0.0
        })
}

/// What Consul's wrapper adds to every endpoint answer: the default ACL policy header and,
/// from its gzip handler, `Vary: Accept-Encoding` and a gzipped body when the client
/// accepts gzip and the body is at least `GZIP_MIN_SIZE` bytes.
pub(super) async fn wrap_endpoint_answer(response: Response, gzip: bool) -> Response {
    let (mut parts, body) = response.into_parts();
    parts.headers.insert(
        "X-Consul-Default-ACL-Policy",
        HeaderValue::from_static(DEFAULT_ACL_POLICY),
    );
    parts
        .headers
        .append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    if !gzip || parts.headers.contains_key(header::CONTENT_ENCODING) {
        return Response::from_parts(parts, body);
    }
    // Answers are built in memory, so this only collects what is already there.
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(_) => return Response::from_parts(parts, Body::empty()),
    };
    if bytes.len() < GZIP_MIN_SIZE {
        return Response::from_parts(parts, Body::from(bytes));
    }
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 4),
        flate2::Compression::default(),
    );
    let compressed = encoder.write_all(&bytes).and_then(|_| encoder.finish());
    match compressed {
        Ok(compressed) => {
            parts
                .headers
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(compressed))
        }
        Err(_) => Response::from_parts(parts, Body::from(bytes)),
    }
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

    /// Every value of a repeated parameter (`?tag=a&tag=b`), in order.
    pub(super) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(key, _)| key == name)
            .map(|(_, value)| value.as_str())
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
