//! The gateway's JSON, both ways: requests (ranges, compares, transaction operations)
//! built from typed values, and answers (`mvccpb.KeyValue`, transaction and lease
//! answers, watch stream lines) read with etcd's conventions: keys and values in base64,
//! 64-bit numbers as strings, zero values left out. Pure: no I/O.

use base64::Engine as _;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

use super::Error;

/// A 64-bit number as the gateway writes it: a string, or a number.
fn int<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        Text(String),
        Number(i64),
    }
    match Int::deserialize(deserializer)? {
        Int::Number(n) => Ok(n),
        Int::Text(text) => text.parse().map_err(serde::de::Error::custom),
    }
}

fn bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(deserializer)?;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(serde::de::Error::custom)
}

fn byte_list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Vec<u8>>, D::Error> {
    let texts = Vec::<String>::deserialize(deserializer)?;
    texts
        .into_iter()
        .map(|text| {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(serde::de::Error::custom)
        })
        .collect()
}

/// Base64, as the gateway takes keys and values.
pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Header {
    #[serde(default, deserialize_with = "int")]
    pub revision: i64,
}

/// A key as etcd stores it (`mvccpb.KeyValue`); absent fields are zero.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Kv {
    #[serde(default, deserialize_with = "bytes")]
    pub key: Vec<u8>,
    #[serde(default, deserialize_with = "int")]
    pub create_revision: i64,
    #[serde(default, deserialize_with = "int")]
    pub mod_revision: i64,
    #[serde(default, deserialize_with = "int")]
    pub version: i64,
    #[serde(default, deserialize_with = "bytes")]
    pub value: Vec<u8>,
    #[serde(default, deserialize_with = "int")]
    pub lease: i64,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct RangeResponse {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub kvs: Vec<Kv>,
    /// More keys are in the range than the limit let through.
    #[serde(default)]
    pub more: bool,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ResponseOp {
    #[serde(default)]
    pub response_range: Option<RangeResponse>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct TxnResponse {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub succeeded: bool,
    #[serde(default)]
    pub responses: Vec<ResponseOp>,
}

impl TxnResponse {
    /// The keys each range of the branch that ran found, in order (an op that was not a
    /// range gives an empty list).
    pub fn ranges(&self) -> Vec<Vec<Kv>> {
        self.responses
            .iter()
            .map(|op| {
                op.response_range
                    .as_ref()
                    .map(|range| range.kvs.clone())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// `ranges`, taking the keys over instead of copying them (a listing of a large queue
    /// holds every task once).
    pub fn into_ranges(self) -> Vec<Vec<Kv>> {
        self.responses
            .into_iter()
            .map(|op| op.response_range.map(|range| range.kvs).unwrap_or_default())
            .collect()
    }
}

/// A range request: one key, or a prefix's keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub key: Vec<u8>,
    /// `None`: the key alone.
    pub range_end: Option<Vec<u8>>,
    pub keys_only: bool,
    /// Only the first key by creation (a `limit 1` range sorted on `create_revision`).
    pub first_created: bool,
    /// At most this many keys (0: all of them).
    pub limit: usize,
    /// Read at this revision (0: the latest).
    pub revision: i64,
}

impl Range {
    pub fn key(key: &[u8]) -> Range {
        Range {
            key: key.to_vec(),
            range_end: None,
            keys_only: false,
            first_created: false,
            limit: 0,
            revision: 0,
        }
    }

    pub fn prefix(prefix: &[u8]) -> Range {
        Range {
            key: prefix.to_vec(),
            range_end: Some(prefix_end(prefix)),
            keys_only: false,
            first_created: false,
            limit: 0,
            revision: 0,
        }
    }

    pub(super) fn json(&self) -> Value {
        let mut range = json!({ "key": b64(&self.key) });
        if let Some(end) = &self.range_end {
            range["range_end"] = json!(b64(end));
        }
        if self.keys_only {
            range["keys_only"] = json!(true);
        }
        if self.limit > 0 {
            range["limit"] = json!(self.limit.to_string());
        }
        if self.revision > 0 {
            range["revision"] = json!(self.revision.to_string());
        }
        if self.first_created {
            range["sort_order"] = json!("ASCEND");
            range["sort_target"] = json!("CREATE");
            range["limit"] = json!("1");
        }
        range
    }
}

/// The first key after every key that starts with `prefix` (etcd's `GetPrefixRangeEnd`).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff (or empty): to the end of the keyspace.
    vec![0]
}

/// One compare of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The key's `create_revision` equals this (0: the key does not exist).
    Created(Vec<u8>, i64),
    /// The key's `mod_revision` equals this (0: the key does not exist).
    Modified(Vec<u8>, i64),
    /// The key exists (its version is above 0).
    Exists(Vec<u8>),
    /// The key is attached to this lease.
    Lease(Vec<u8>, i64),
    /// No key under this prefix was created or written after this revision.
    PrefixUnchangedSince(Vec<u8>, i64),
}

impl Compare {
    pub(super) fn json(&self) -> Value {
        match self {
            Compare::Created(key, rev) => json!({
                "target": "CREATE", "result": "EQUAL", "key": b64(key), "create_revision": rev.to_string()
            }),
            Compare::Modified(key, rev) => json!({
                "target": "MOD", "result": "EQUAL", "key": b64(key), "mod_revision": rev.to_string()
            }),
            Compare::Exists(key) => json!({
                "target": "VERSION", "result": "GREATER", "key": b64(key), "version": "0"
            }),
            Compare::Lease(key, lease) => json!({
                "target": "LEASE", "result": "EQUAL", "key": b64(key), "lease": lease.to_string()
            }),
            // Over a range etcd requires every key in it to pass (and an empty range compares
            // as one key of zeros, which passes too).
            Compare::PrefixUnchangedSince(prefix, revision) => json!({
                "target": "MOD", "result": "LESS", "key": b64(prefix),
                "range_end": b64(&prefix_end(prefix)),
                "mod_revision": (revision.saturating_add(1)).to_string()
            }),
        }
    }

    /// Whether it holds for `kv` (`None`: the key does not exist), as etcd judges it: a
    /// missing key compares as all zeros.
    pub fn holds(&self, kv: Option<&Kv>) -> bool {
        let zero = Kv::default();
        let kv = kv.unwrap_or(&zero);
        match self {
            Compare::Created(_, rev) => kv.create_revision == *rev,
            Compare::Modified(_, rev) => kv.mod_revision == *rev,
            Compare::Exists(_) => kv.version > 0,
            Compare::Lease(_, lease) => kv.lease == *lease,
            Compare::PrefixUnchangedSince(_, revision) => kv.mod_revision <= *revision,
        }
    }

    pub fn key(&self) -> &[u8] {
        match self {
            Compare::Created(key, _)
            | Compare::Modified(key, _)
            | Compare::Exists(key)
            | Compare::Lease(key, _)
            | Compare::PrefixUnchangedSince(key, _) => key,
        }
    }
}

/// One operation of a transaction's branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Writes `value`; attached to `lease` unless it is 0.
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        lease: i64,
    },
    Delete(Vec<u8>),
    Get(Range),
}

impl Op {
    pub(super) fn json(&self) -> Value {
        match self {
            Op::Put { key, value, lease } => {
                let mut put = json!({ "key": b64(key), "value": b64(value) });
                if *lease != 0 {
                    put["lease"] = json!(lease.to_string());
                }
                json!({ "request_put": put })
            }
            Op::Delete(key) => json!({ "request_delete_range": { "key": b64(key) } }),
            Op::Get(range) => json!({ "request_range": range.json() }),
        }
    }
}

/// A transaction: if every compare holds, `success` runs, else `failure`; atomically.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub compare: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

impl Txn {
    pub(super) fn json(&self) -> Value {
        json!({
            "compare": self.compare.iter().map(Compare::json).collect::<Vec<_>>(),
            "success": self.success.iter().map(Op::json).collect::<Vec<_>>(),
            "failure": self.failure.iter().map(Op::json).collect::<Vec<_>>(),
        })
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct LeaseGrant {
    #[serde(rename = "ID", default, deserialize_with = "int")]
    pub id: i64,
    #[serde(rename = "TTL", default, deserialize_with = "int")]
    pub ttl: i64,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct LeaseTimeToLive {
    /// Seconds left; -1 (or 0) for a lease that is gone.
    #[serde(rename = "TTL", default, deserialize_with = "int")]
    pub ttl: i64,
    #[serde(default, deserialize_with = "byte_list")]
    pub keys: Vec<Vec<u8>>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct KeepAliveResult {
    #[serde(default)]
    pub(super) result: LeaseGrant,
}

#[derive(Debug, Default, Deserialize)]
struct WatchMessage {
    #[serde(default)]
    result: Option<WatchResult>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct WatchResult {
    #[serde(default)]
    canceled: bool,
    #[serde(default, deserialize_with = "int")]
    compact_revision: i64,
    #[serde(default)]
    events: Vec<Event>,
}

/// One change a watch saw (`mvccpb.Event`): the key as it now is (a deletion's carries its
/// key alone) and, when asked for, as it was before.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Event {
    /// `DELETE` for a deletion; the gateway leaves a put's type out.
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub kv: Kv,
    #[serde(default)]
    pub prev_kv: Option<Kv>,
}

impl Event {
    pub fn deleted(&self) -> bool {
        self.kind == "DELETE"
    }
}

/// How a watch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watched {
    /// Something under the range changed at or after the start revision.
    Changed,
    /// The start revision was compacted away (or etcd cancelled the watch): read afresh.
    Compacted,
    /// Nothing changed within the wait.
    Quiet,
}

#[derive(Deserialize)]
pub(super) struct GatewayError {
    #[serde(default)]
    pub(super) code: i64,
    #[serde(default)]
    pub(super) message: String,
    #[serde(default)]
    pub(super) error: String,
}
/// What one line of a watch stream says: `None` to read on (created, progress, or only
/// changes `matters` says nothing of).
pub(super) fn watch_line(
    line: &[u8],
    matters: &(dyn Fn(&Event) -> bool + Sync),
) -> Result<Option<Watched>, Error> {
    let text = String::from_utf8_lossy(line);
    if text.trim().is_empty() {
        return Ok(None);
    }
    let message: WatchMessage =
        serde_json::from_str(&text).map_err(|e| Error::Decode(format!("{e}: {text}")))?;
    if let Some(error) = message.error {
        return Err(Error::Decode(format!("the watch failed: {error}")));
    }
    let Some(result) = message.result else {
        return Ok(None);
    };
    if result.compact_revision > 0 || result.canceled {
        return Ok(Some(Watched::Compacted));
    }
    if result.events.iter().any(matters) {
        return Ok(Some(Watched::Changed));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prefix's range ends at the prefix with its last byte raised, past 0xff bytes.
    #[test]
    fn a_prefix_range_ends_after_every_key_under_it() {
        assert_eq!(prefix_end(b"q/"), b"q0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }

    /// The gateway's numbers come as strings, missing fields are zero, bytes are base64.
    #[test]
    fn gateway_answers_decode_with_zero_defaults() {
        let text = r#"{"header":{"revision":"7"},"kvs":[{"key":"cS9h","create_revision":"5","mod_revision":"6","version":"2","value":"e30=","lease":"12"},{"key":"cS9i"}],"count":"2"}"#;
        let range: RangeResponse = serde_json::from_str(text).unwrap();
        assert_eq!(range.header.revision, 7);
        assert_eq!(range.kvs[0].key, b"q/a");
        assert_eq!(range.kvs[0].value, b"{}");
        assert_eq!(
            (range.kvs[0].create_revision, range.kvs[0].mod_revision),
            (5, 6)
        );
        assert_eq!(range.kvs[0].lease, 12);
        assert_eq!(range.kvs[1].version, 0);
        let txn: TxnResponse = serde_json::from_str(r#"{"header":{"revision":"3"},"responses":[{"response_range":{"header":{"revision":"3"}}},{"response_put":{}}]}"#).unwrap();
        assert!(!txn.succeeded);
        assert_eq!(txn.ranges(), vec![Vec::new(), Vec::new()]);
    }

    /// Compares judge a missing key as etcd does: all zeros.
    #[test]
    fn compares_judge_missing_keys_as_zeros() {
        let kv = Kv {
            create_revision: 4,
            mod_revision: 9,
            version: 2,
            lease: 7,
            ..Kv::default()
        };
        assert!(Compare::Created(vec![], 4).holds(Some(&kv)));
        assert!(Compare::Created(vec![], 0).holds(None));
        assert!(!Compare::Modified(vec![], 9).holds(None));
        assert!(Compare::Exists(vec![]).holds(Some(&kv)));
        assert!(!Compare::Exists(vec![]).holds(None));
        assert!(Compare::Lease(vec![], 7).holds(Some(&kv)));
        assert!(!Compare::Lease(vec![], 7).holds(None));
    }

    /// A watch stream's lines: `created` reads on, events or a compaction end the wait;
    /// with a filter, only events it passes end it.
    #[test]
    fn watch_lines_say_changed_compacted_or_read_on() {
        let any = |_: &Event| true;
        let created = br#"{"result":{"header":{"revision":"4"},"created":true}}"#;
        assert_eq!(watch_line(created, &any).unwrap(), None);
        let event = br#"{"result":{"header":{"revision":"5"},"events":[{"kv":{"key":"cS9h"}},{"type":"DELETE","kv":{"key":"cS9i"},"prev_kv":{"key":"cS9i","value":"e30="}}]}}"#;
        assert_eq!(watch_line(event, &any).unwrap(), Some(Watched::Changed));
        let none = |_: &Event| false;
        assert_eq!(watch_line(event, &none).unwrap(), None);
        let deleted = |event: &Event| {
            event.deleted() && event.prev_kv.as_ref().is_some_and(|kv| kv.value == b"{}")
        };
        assert_eq!(watch_line(event, &deleted).unwrap(), Some(Watched::Changed));
        let compacted = br#"{"result":{"header":{},"canceled":true,"compact_revision":"5"}}"#;
        assert_eq!(
            watch_line(compacted, &none).unwrap(),
            Some(Watched::Compacted)
        );
        assert!(watch_line(br#"{"error":{"message":"x"}}"#, &any).is_err());
    }
}
