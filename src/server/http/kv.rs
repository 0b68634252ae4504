//! KV endpoints: `/v1/kv/<key>` GET (one key, `?recurse`, `?keys`, `?raw`), PUT (`?cas`,
//! `?flags`, `?acquire`, `?release`) and DELETE (`?recurse`, `?cas`).

use super::*;

pub(super) async fn kv(req: Req<'_>) -> Reply {
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
pub(super) struct DirEntry<'a> {
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
    pub(super) fn new(key: &'a str, entry: &'a Entry) -> DirEntry<'a> {
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

pub(super) async fn kv_get(req: Req<'_>, key: String) -> Reply {
    let recurse = req.query.has("recurse");
    if !recurse && key.is_empty() {
        return Err(HttpError::bad_request("Missing key name"));
    }
    let blocking = req.blocking()?;
    let raw = req.query.has("raw") && !recurse;
    let pretty = req.query.has("pretty");
    // A large listing goes out as it is written, unless it is to be gzipped whole.
    let stream = !pretty && !accepts_gzip(&req.headers);
    let (index, body) = watch::query(&req.shared.core, blocking, |state| {
        if recurse {
            // The reply's index comes from the same pass over the entries as its body.
            let mut newest = 0;
            let listed = state.kv_list(&key).inspect(|(_, entry)| {
                newest = newest.max(entry.modify_index);
            });
            let body = if pretty {
                let entries: Vec<DirEntry> = listed.map(|(k, e)| DirEntry::new(k, e)).collect();
                (!entries.is_empty()).then(|| Listing::Whole(to_json(&entries, pretty)))
            } else {
                let limit = if stream { STREAM_MIN_BYTES } else { usize::MAX };
                match write_entries_up_to(listed, limit) {
                    Written::None => None,
                    Written::Whole(body) => Some(Listing::Whole(body)),
                    Written::Head { head, last } => {
                        // The rest's index is read now, as it stands in this snapshot.
                        let rest = state.kv_prefix_owned(&key);
                        for (_, entry) in rest.entries_after(&last) {
                            newest = newest.max(entry.modify_index);
                        }
                        Some(Listing::Streamed { head, rest, last })
                    }
                }
            };
            (state.kv_prefix_index_over(&key, newest), body)
        } else {
            let body = state.kv_get(&key).map(|entry| {
                Listing::Whole(if raw {
                    entry.value.clone()
                } else {
                    to_json(&[DirEntry::new(&key, entry)], pretty)
                })
            });
            (state.kv_key_index(&key), body)
        }
    })
    .await;
    let body = match body {
        None => {
            return Ok(with_meta(
                StatusCode::NOT_FOUND.into_response(),
                Some(index),
            ))
        }
        Some(Listing::Whole(body)) => body,
        Some(Listing::Streamed { head, rest, last }) => {
            let response = json_body(stream_rest(head, rest, last));
            return Ok(with_meta(response, Some(index)));
        }
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

/// A `?recurse` answer whose body passes this many bytes is sent as it is written, in
/// chunks of about `STREAM_CHUNK_BYTES`, rather than built whole first: the client reads
/// the first entries while the server writes the rest, and the server holds a chunk, not
/// the listing (a backlog of 2,000 tasks of 20 KB is a 53 MB answer, of 100,000 of 300 B
/// 50 MB). Consul's larger answers go out chunked too: Go's net/http sends no
/// Content-Length past its buffer. Smaller answers (10,000 tasks of 300 B: 5 MB) are built
/// whole, which kept their slowest reads lower in the bench's `?recurse` row.
const STREAM_MIN_BYTES: usize = 16 << 20;
const STREAM_CHUNK_BYTES: usize = 256 << 10;

/// A read's body: whole, or a `?recurse` listing's first bytes and the entries after them.
enum Listing {
    Whole(Vec<u8>),
    Streamed {
        head: Vec<u8>,
        rest: KvPrefix,
        /// The last key written in `head`.
        last: String,
    },
}

/// What [`write_entries_up_to`] wrote.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Written {
    /// There were no entries.
    None,
    /// The whole listing.
    Whole(Vec<u8>),
    /// Its first entries, up to and including key `last`, without the closing bracket.
    Head { head: Vec<u8>, last: String },
}

/// The compact JSON of a `?recurse` listing, written straight into one buffer: listing
/// 10,000 keys is the hot read of a task queue, and this skips a String per value.
/// Produces the same bytes as serializing `DirEntry`s. Stops after the entry that takes
/// the body to `limit` bytes, if more follow.
pub(super) fn write_entries_up_to<'a>(
    entries: impl Iterator<Item = (&'a String, &'a Entry)>,
    limit: usize,
) -> Written {
    let mut out = Vec::new();
    let mut entries = entries.peekable();
    while let Some((key, entry)) = entries.next() {
        let separator = if out.is_empty() { b'[' } else { b',' };
        write_entry(&mut out, separator, key, entry);
        if out.len() >= limit && entries.peek().is_some() {
            return Written::Head {
                head: out,
                last: key.clone(),
            };
        }
    }
    if out.is_empty() {
        return Written::None;
    }
    out.push(b']');
    Written::Whole(out)
}

/// Writes one entry of a listing after `separator` (`[` before the first, `,` after).
fn write_entry(out: &mut Vec<u8>, separator: u8, key: &str, entry: &Entry) {
    use std::io::Write as _;
    out.push(separator);
    let _ = write!(out, "{{\"LockIndex\":{},\"Key\":", entry.lock_index);
    write_json_string(out, key);
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
        write_json_string(out, session);
    }
    let _ = write!(
        out,
        ",\"CreateIndex\":{},\"ModifyIndex\":{}}}",
        entry.create_index, entry.modify_index
    );
}

/// The body of a streamed listing: `head`, then the entries of `rest` after key `last`, a
/// chunk written each time the connection asks for the next one (so no faster than the
/// client reads, and on the connection's own task: nothing is spawned), then the closing
/// bracket. Each chunk starts from the key the one before ended with.
pub(super) fn stream_rest(head: Vec<u8>, rest: KvPrefix, last: String) -> Body {
    enum Next {
        Head(Vec<u8>, KvPrefix, String),
        After(KvPrefix, String),
        Done,
    }
    let chunks = futures_util::stream::unfold(Next::Head(head, rest, last), |next| async move {
        let (chunk, next) = match next {
            Next::Head(head, rest, last) => (head, Next::After(rest, last)),
            Next::After(rest, last) => {
                let mut out = Vec::with_capacity(STREAM_CHUNK_BYTES);
                let mut ended_at = None;
                for (key, entry) in rest.entries_after(&last) {
                    write_entry(&mut out, b',', key, entry);
                    if out.len() >= STREAM_CHUNK_BYTES {
                        ended_at = Some(key.clone());
                        break;
                    }
                }
                match ended_at {
                    Some(key) => (out, Next::After(rest, key)),
                    None => {
                        out.push(b']');
                        (out, Next::Done)
                    }
                }
            }
            Next::Done => return None,
        };
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(chunk)), next))
    });
    Body::from_stream(chunks)
}

pub(super) async fn kv_keys(req: Req<'_>, prefix: String) -> Reply {
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
        let mut newest = 0;
        for (key, entry) in state.kv_list(&prefix) {
            newest = newest.max(entry.modify_index);
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
        (state.kv_prefix_index_over(&prefix, newest), body)
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
pub(super) fn conflicting_flags(query: &Query, flags: &[&str]) -> Result<(), HttpError> {
    if flags.iter().filter(|flag| query.has(flag)).count() > 1 {
        return Err(HttpError::bad_request(format!(
            "Conflicting flags: {}\n",
            query.encode()
        )));
    }
    Ok(())
}

/// Go's `strconv.ParseUint` with its error text, which Consul passes through as a 500.
pub(super) fn parse_uint(value: &str) -> Result<u64, HttpError> {
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

pub(super) async fn kv_put(req: Req<'_>, key: String) -> Reply {
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

pub(super) async fn kv_delete(req: Req<'_>, key: String) -> Reply {
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

pub(super) fn bool_reply(outcome: Outcome) -> Reply {
    match outcome {
        Outcome::Bool(ok) => Ok(json_body(if ok {
            b"true".to_vec()
        } else {
            b"false".to_vec()
        })),
        other => Err(HttpError::internal(format!("unexpected outcome {other:?}"))),
    }
}
