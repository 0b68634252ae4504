//! KV reads and writes: get, recursive list, keys, put (plain, cas, acquire, release), delete.

use std::borrow::Cow;

use base64::Engine as _;
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use super::{
    escape_key, escape_query, index_header, kv_path, query_suffix, status_error, Client, Error,
    QueryOptions,
};
use crate::coord::Names;

/// One KV entry as Consul returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvPair {
    pub key: String,
    pub value: Vec<u8>,
    pub flags: u64,
    pub session: Option<String>,
    pub lock_index: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

/// One entry as Consul sends it, borrowing its strings from the response body where it can:
/// a listing of large values is tens of MB, and this skips a copy of every value.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct WireEntry<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(default, borrow)]
    value: Option<Text<'a>>,
    #[serde(default)]
    flags: u64,
    #[serde(default, borrow)]
    session: Option<Text<'a>>,
    #[serde(default)]
    lock_index: u64,
    #[serde(default)]
    create_index: u64,
    #[serde(default)]
    modify_index: u64,
}

/// A string borrowed from the body unless it holds escapes (serde borrows a `Cow` only as
/// a field of its own, not inside an `Option`).
#[derive(Deserialize)]
pub(super) struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

impl TryFrom<WireEntry<'_>> for KvPair {
    type Error = Error;
    fn try_from(wire: WireEntry<'_>) -> Result<KvPair, Error> {
        let value = match wire.value {
            Some(Text(text)) => base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(|e| Error::Decode(format!("value of {}: {e}", wire.key)))?,
            None => Vec::new(),
        };
        Ok(KvPair {
            key: wire.key.into_owned(),
            value,
            flags: wire.flags,
            session: wire
                .session
                .map(|Text(session)| session.into_owned())
                .filter(|s| !s.is_empty()),
            lock_index: wire.lock_index,
            create_index: wire.create_index,
            modify_index: wire.modify_index,
        })
    }
}

/// How a PUT writes: plainly, with check-and-set, or as a lock operation.
#[derive(Clone, Debug, Default)]
pub enum PutMode {
    #[default]
    Set,
    Cas(u64),
    Acquire(String),
    Release(String),
}

/// Reads a listing's entries as the body arrives, each decoded as soon as it is whole and
/// turned into what the caller keeps (`each`): the body of a large listing (tens of MB, its
/// values in base64) is never held whole, nor beside the entries it decodes to.
async fn decode_entries<T>(
    response: reqwest::Response,
    mut each: impl FnMut(KvPair) -> T,
) -> Result<Vec<T>, Error> {
    decode_array(response, Vec::new(), |element| {
        let wire: WireEntry = parse(element)?;
        Ok(each(KvPair::try_from(wire)?))
    })
    .await
}

/// Reads a JSON array as the body arrives, each element handed to `each` (which parses it
/// and answers what the caller keeps, added to `kept`) as soon as it is whole; the body is
/// never held whole.
async fn decode_array<T, C: Extend<T>>(
    mut response: reqwest::Response,
    mut kept: C,
    mut each: impl FnMut(&[u8]) -> Result<T, Error>,
) -> Result<C, Error> {
    let mut elements = Elements::default();
    let mut decode = |element: &[u8]| -> Result<(), Error> {
        kept.extend([each(element)?]);
        Ok(())
    };
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| Error::Decode(e.to_string()))?
    {
        elements.feed(&chunk, &mut decode)?;
    }
    elements.finish()?;
    Ok(kept)
}

/// One element of a JSON array, parsed.
fn parse<'a, E: serde::Deserialize<'a>>(element: &'a [u8]) -> Result<E, Error> {
    serde_json::from_slice(element).map_err(|e| Error::Decode(e.to_string()))
}

/// Splits a JSON array that arrives in pieces into its elements, each handed on whole as
/// soon as its last byte is in; only the element in progress is kept. It tracks nesting and
/// strings, and checks no more than that: each element is then parsed on its own.
#[derive(Debug, Default)]
struct Elements {
    /// The bytes of the element in progress (from its first byte on).
    partial: Vec<u8>,
    /// Nesting depth: 1 inside the array, more inside an element.
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// The element in progress is a string (an array of names, `?keys`).
    text: bool,
    /// The array's closing bracket was read.
    closed: bool,
}

impl Elements {
    /// Reads `chunk`, handing each element it completes to `element`.
    fn feed(
        &mut self,
        chunk: &[u8],
        element: &mut impl FnMut(&[u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let mut start = (self.depth > 1 || self.text).then_some(0);
        let mut n = 0;
        while n < chunk.len() {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                    n += 1;
                    continue;
                }
                // A string's body (a value's base64, most of a listing's bytes) is passed
                // over to its next quote or backslash at once.
                let Some(skip) = memchr::memchr2(b'"', b'\\', &chunk[n..]) else {
                    break;
                };
                n += skip;
                if chunk[n] == b'\\' {
                    self.escaped = true;
                } else {
                    self.in_string = false;
                    if self.text {
                        self.text = false;
                        self.hand(&chunk[start.take().unwrap_or(0)..=n], element)?;
                    }
                }
                n += 1;
                continue;
            }
            let byte = chunk[n];
            match (self.depth, byte) {
                (_, b' ' | b'\n' | b'\r' | b'\t') => {}
                (0, b'[') if !self.closed => self.depth = 1,
                (1, b',') => {}
                (1, b']') => {
                    self.depth = 0;
                    self.closed = true;
                }
                (1, b'{' | b'[') => {
                    self.depth = 2;
                    start = Some(n);
                }
                (1, b'"') => {
                    self.in_string = true;
                    self.text = true;
                    start = Some(n);
                }
                (d, b'{' | b'[') if d > 1 => self.depth += 1,
                (d, b'}' | b']') if d > 1 => {
                    self.depth -= 1;
                    if self.depth == 1 {
                        self.hand(&chunk[start.take().unwrap_or(0)..=n], element)?;
                    }
                }
                (d, b'"') if d > 1 => self.in_string = true,
                (d, _) if d > 1 => {}
                _ => return Err(not_entries()),
            }
            n += 1;
        }
        if let Some(from) = start {
            self.partial.extend_from_slice(&chunk[from..]);
        }
        Ok(())
    }

    /// Hands on the element whose last bytes are `tail` (its first ones, if it began in an
    /// earlier chunk, are kept in `partial`).
    fn hand(
        &mut self,
        tail: &[u8],
        element: &mut impl FnMut(&[u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if self.partial.is_empty() {
            return element(tail);
        }
        self.partial.extend_from_slice(tail);
        let handed = element(&self.partial);
        self.partial.clear();
        handed
    }

    /// Checks the array was closed.
    fn finish(&self) -> Result<(), Error> {
        if self.closed {
            Ok(())
        } else {
            Err(not_entries())
        }
    }
}

fn not_entries() -> Error {
    Error::Decode("the listing is not a JSON array of entries or of names".into())
}

impl Client {
    /// One key; `None` when it does not exist. Returns the X-Consul-Index too.
    pub async fn kv_get(
        &self,
        key: &str,
        options: QueryOptions,
    ) -> Result<(Option<KvPair>, u64), Error> {
        let path = format!("{}{}", kv_path(key)?, query_suffix(&options, Vec::new()));
        let response = self
            .send(Method::GET, &path, None, self.timeout_for(&options))
            .await?;
        let index = index_header(&response);
        match response.status() {
            StatusCode::NOT_FOUND => Ok((None, index)),
            StatusCode::OK => Ok((
                decode_entries(response, |pair| pair)
                    .await?
                    .into_iter()
                    .next(),
                index,
            )),
            _ => Err(status_error(response).await),
        }
    }

    /// Every entry under `prefix`, in key order; empty when there is none.
    pub async fn kv_list(
        &self,
        prefix: &str,
        options: QueryOptions,
    ) -> Result<(Vec<KvPair>, u64), Error> {
        self.kv_list_as(prefix, options, |pair| pair).await
    }

    /// `kv_list`, each entry turned into what the caller keeps as it is read (a large
    /// listing is not held twice, as entries and as what they become).
    pub async fn kv_list_as<T>(
        &self,
        prefix: &str,
        options: QueryOptions,
        each: impl FnMut(KvPair) -> T,
    ) -> Result<(Vec<T>, u64), Error> {
        let path = format!(
            "{}{}",
            kv_path(prefix)?,
            query_suffix(&options, vec!["recurse".into()])
        );
        let response = self
            .send(Method::GET, &path, None, self.timeout_for(&options))
            .await?;
        let index = index_header(&response);
        match response.status() {
            StatusCode::NOT_FOUND => Ok((Vec::new(), index)),
            StatusCode::OK => Ok((decode_entries(response, each).await?, index)),
            _ => Err(status_error(response).await),
        }
    }

    /// The keys under `prefix` (no values), in key order; empty when there is none.
    pub async fn kv_keys(
        &self,
        prefix: &str,
        options: QueryOptions,
    ) -> Result<(Names, u64), Error> {
        let path = format!(
            "/v1/kv/{}{}",
            escape_key(prefix),
            query_suffix(&options, vec!["keys".into()])
        );
        let response = self
            .send(Method::GET, &path, None, self.timeout_for(&options))
            .await?;
        let index = index_header(&response);
        match response.status() {
            StatusCode::NOT_FOUND => Ok((Names::new(), index)),
            // The names of a large queue (100k of them) are decoded as they arrive, not
            // after the whole body, and packed.
            StatusCode::OK => Ok((
                decode_array(response, Names::under(prefix), |name| parse::<String>(name)).await?,
                index,
            )),
            _ => Err(status_error(response).await),
        }
    }

    /// Writes a value; the answer is Consul's `true`/`false`.
    pub async fn kv_put(&self, key: &str, value: &[u8], mode: PutMode) -> Result<bool, Error> {
        let query = match &mode {
            PutMode::Set => String::new(),
            PutMode::Cas(index) => format!("?cas={index}"),
            PutMode::Acquire(session) => format!("?acquire={}", escape_query(session)),
            PutMode::Release(session) => format!("?release={}", escape_query(session)),
        };
        let path = format!("{}{query}", kv_path(key)?);
        let response = self
            .send(
                Method::PUT,
                &path,
                Some(value.to_vec()),
                self.request_timeout,
            )
            .await?;
        if response.status() != StatusCode::OK {
            return Err(status_error(response).await);
        }
        let body = response
            .text()
            .await
            .map_err(|e| Error::Decode(e.to_string()))?;
        Ok(body.contains("true"))
    }
}

#[cfg(test)]
mod tests {
    use super::{Elements, Error};

    /// Splits `body` cut into pieces of `size` bytes.
    fn split(body: &str, size: usize) -> Result<Vec<String>, Error> {
        let mut elements = Elements::default();
        let mut out = Vec::new();
        for chunk in body.as_bytes().chunks(size) {
            elements.feed(chunk, &mut |element: &[u8]| {
                out.push(String::from_utf8_lossy(element).into_owned());
                Ok(())
            })?;
        }
        elements.finish()?;
        Ok(out)
    }

    /// A listing's elements come out whole and unchanged however the body is cut, strings
    /// holding brackets, braces and escaped quotes included.
    #[test]
    fn a_listing_cut_anywhere_yields_its_elements_whole() {
        let body =
            r#" [ {"Key":"q/a","Value":"e30="}, {"Key":"q/}{\"]","Nested":{"a":[1,{}]}} ,{}] "#;
        let expected = vec![
            r#"{"Key":"q/a","Value":"e30="}"#.to_string(),
            r#"{"Key":"q/}{\"]","Nested":{"a":[1,{}]}}"#.to_string(),
            "{}".to_string(),
        ];
        for size in 1..=body.len() {
            assert_eq!(
                split(body, size).ok(),
                Some(expected.clone()),
                "cut every {size} bytes"
            );
        }
        assert_eq!(split("[]", 1).ok(), Some(Vec::new()));
    }

    /// The names `?keys` answers come out whole however the body is cut, escapes included.
    #[test]
    fn names_cut_anywhere_come_out_whole() {
        let body = r#"["q/a", "q/\"]{,","x", "y\\", "\\\"z" ]"#;
        let expected = vec![
            r#""q/a""#.to_string(),
            r#""q/\"]{,""#.to_string(),
            r#""x""#.to_string(),
            r#""y\\""#.to_string(),
            r#""\\\"z""#.to_string(),
        ];
        for size in 1..=body.len() {
            assert_eq!(
                split(body, size).ok(),
                Some(expected.clone()),
                "cut every {size} bytes"
            );
        }
    }

    /// What is not an array of objects, or is cut short, is an error, not an empty listing.
    #[test]
    fn a_body_that_is_not_a_whole_array_is_refused() {
        for body in [
            "",
            "null",
            "{}",
            r#"[{"Key":"q/a"}"#,
            r#"[{"Key":"q/a"}] []"#,
            "[1]",
        ] {
            assert!(split(body, 3).is_err(), "{body:?} was accepted");
        }
    }
}
