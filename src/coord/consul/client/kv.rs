//! KV reads and writes: get, recursive list, keys, put (plain, cas, acquire, release), delete.

use std::borrow::Cow;

use base64::Engine as _;
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use super::{
    escape_key, escape_query, index_header, kv_path, query_suffix, status_error, Client, Error,
    QueryOptions,
};

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

async fn decode_entries(response: reqwest::Response) -> Result<Vec<KvPair>, Error> {
    let body = response
        .bytes()
        .await
        .map_err(|e| Error::Decode(e.to_string()))?;
    let wire: Vec<WireEntry> =
        serde_json::from_slice(&body).map_err(|e| Error::Decode(e.to_string()))?;
    wire.into_iter().map(KvPair::try_from).collect()
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
            StatusCode::OK => Ok((decode_entries(response).await?.into_iter().next(), index)),
            _ => Err(status_error(response).await),
        }
    }

    /// Every entry under `prefix`, in key order; empty when there is none.
    pub async fn kv_list(
        &self,
        prefix: &str,
        options: QueryOptions,
    ) -> Result<(Vec<KvPair>, u64), Error> {
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
            StatusCode::OK => Ok((decode_entries(response).await?, index)),
            _ => Err(status_error(response).await),
        }
    }

    /// The keys under `prefix` (no values), in key order; empty when there is none.
    pub async fn kv_keys(
        &self,
        prefix: &str,
        options: QueryOptions,
    ) -> Result<(Vec<String>, u64), Error> {
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
            StatusCode::NOT_FOUND => Ok((Vec::new(), index)),
            StatusCode::OK => {
                let keys = response
                    .json()
                    .await
                    .map_err(|e| Error::Decode(e.to_string()))?;
                Ok((keys, index))
            }
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
