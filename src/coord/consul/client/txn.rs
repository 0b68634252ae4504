//! `/v1/txn`: several KV operations applied atomically, or none, and the limits Consul puts
//! on one transaction (operations, encoded body size), so that callers can plan within them.

use base64::Engine as _;
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use super::kv::WireEntry;
use super::{status_error, Client, Error, KvPair};

/// Operations in one transaction. Consul refuses more than 128 with a 413, and versions
/// before 1.6 (still deployed) more than 64; staying within 64 works with every version.
pub const TXN_MAX_OPS: usize = 64;

/// Encoded body bytes leaderq puts in one transaction. Consul refuses a body over
/// `txn_max_req_len` (512 KiB by default) with a 413; values travel base64-encoded (4/3 of
/// their size). The 32 KiB margin keeps a body that an exact count puts just under the
/// limit clear of a proxy's or a version's slightly different accounting.
pub const TXN_MAX_BODY: usize = 480 * 1024;

/// One KV operation of a transaction.
#[derive(Clone, Debug)]
pub enum TxnOp {
    Set {
        key: String,
        value: Vec<u8>,
    },
    Cas {
        key: String,
        value: Vec<u8>,
        index: u64,
    },
    Lock {
        key: String,
        value: Vec<u8>,
        session: String,
    },
    Unlock {
        key: String,
        value: Vec<u8>,
        session: String,
    },
    DeleteCas {
        key: String,
        index: u64,
    },
    CheckIndex {
        key: String,
        index: u64,
    },
    CheckSession {
        key: String,
        session: String,
    },
    /// Fails the transaction when the key exists.
    CheckNotExists {
        key: String,
    },
    /// Reads a key (with its value); fails the transaction when the key does not exist.
    Get {
        key: String,
    },
}

impl TxnOp {
    /// The value this op writes, if any.
    fn value(&self) -> Option<&[u8]> {
        match self {
            TxnOp::Set { value, .. }
            | TxnOp::Cas { value, .. }
            | TxnOp::Lock { value, .. }
            | TxnOp::Unlock { value, .. } => Some(value),
            _ => None,
        }
    }

    /// Exactly how many bytes this op takes in the transaction's JSON body, counted as it
    /// would be written, without writing it: a cost is asked for every candidate of every
    /// claim. The value is counted by its base64 length (base64 needs no JSON escaping).
    pub fn encoded_len(&self) -> usize {
        let mut count = Count(0);
        self.write_json(&mut count);
        count.0
    }

    /// Writes the op's JSON, Consul's `{"KV":{"Verb":…}}`, straight into `out`: values of
    /// hundreds of KB are base64-encoded into place, with no intermediate JSON tree.
    fn write_json(&self, out: &mut impl JsonOut) {
        let (verb, key) = match self {
            TxnOp::Set { key, .. } => ("set", key),
            TxnOp::Cas { key, .. } => ("cas", key),
            TxnOp::Lock { key, .. } => ("lock", key),
            TxnOp::Unlock { key, .. } => ("unlock", key),
            TxnOp::DeleteCas { key, .. } => ("delete-cas", key),
            TxnOp::CheckIndex { key, .. } => ("check-index", key),
            TxnOp::CheckSession { key, .. } => ("check-session", key),
            TxnOp::CheckNotExists { key } => ("check-not-exists", key),
            TxnOp::Get { key } => ("get", key),
        };
        out.put(b"{\"KV\":{\"Verb\":\"");
        out.put(verb.as_bytes());
        out.put(b"\",\"Key\":");
        out.string(key);
        if let Some(value) = self.value() {
            out.put(b",\"Value\":\"");
            out.base64(value);
            out.put(b"\"");
        }
        match self {
            TxnOp::Cas { index, .. }
            | TxnOp::DeleteCas { index, .. }
            | TxnOp::CheckIndex { index, .. } => {
                out.put(b",\"Index\":");
                out.number(*index);
            }
            TxnOp::Lock { session, .. }
            | TxnOp::Unlock { session, .. }
            | TxnOp::CheckSession { session, .. } => {
                out.put(b",\"Session\":");
                out.string(session);
            }
            TxnOp::Set { .. } | TxnOp::Get { .. } | TxnOp::CheckNotExists { .. } => {}
        }
        out.put(b"}}");
    }
}

/// Where an op's JSON goes: the body itself, or a count of its bytes.
trait JsonOut {
    fn put(&mut self, bytes: &[u8]);
    /// A JSON string, escaped as serde_json escapes it.
    fn string(&mut self, text: &str);
    fn number(&mut self, n: u64);
    /// `value` in base64 (which needs no JSON escaping).
    fn base64(&mut self, value: &[u8]);
}

impl JsonOut for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn string(&mut self, text: &str) {
        serde_json::to_writer(self, text).expect("a string serializes");
    }

    fn number(&mut self, n: u64) {
        std::io::Write::write_fmt(self, format_args!("{n}")).expect("a Vec takes every byte");
    }

    fn base64(&mut self, value: &[u8]) {
        let start = self.len();
        self.resize(start + value.len().div_ceil(3) * 4, 0);
        let written = base64::engine::general_purpose::STANDARD
            .encode_slice(value, &mut self[start..])
            .expect("buffer sized for base64");
        self.truncate(start + written);
    }
}

/// Counts the bytes an op's JSON takes.
struct Count(usize);

impl std::io::Write for Count {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl JsonOut for Count {
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }

    fn string(&mut self, text: &str) {
        serde_json::to_writer(self, text).expect("a string serializes");
    }

    fn number(&mut self, n: u64) {
        self.0 += n.checked_ilog10().map_or(1, |digits| digits as usize + 1);
    }

    fn base64(&mut self, value: &[u8]) {
        self.0 += value.len().div_ceil(3) * 4;
    }
}

/// The transaction's JSON body: the ops as an array.
fn body(ops: &[TxnOp]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body_len(ops.iter().map(TxnOp::encoded_len)));
    out.push(b'[');
    for (n, op) in ops.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        op.write_json(&mut out);
    }
    out.push(b']');
    out
}

/// The JSON body's length for ops whose encoded lengths are `lens`: `[`, the ops joined
/// by commas, `]`.
pub fn body_len(lens: impl IntoIterator<Item = usize>) -> usize {
    let (count, sum) = lens
        .into_iter()
        .fold((0usize, 0usize), |(count, sum), len| (count + 1, sum + len));
    2 + sum + count.saturating_sub(1)
}

/// Whether `ops` fit one transaction (operations and encoded bytes).
pub fn fits(ops: &[TxnOp]) -> bool {
    ops.len() <= TXN_MAX_OPS && body_len(ops.iter().map(TxnOp::encoded_len)) <= TXN_MAX_BODY
}

/// The largest value (raw bytes) that still fits when added, base64-encoded, to `ops`,
/// whose own values are already counted.
pub fn value_room(ops: &[TxnOp]) -> usize {
    let used = body_len(ops.iter().map(TxnOp::encoded_len));
    TXN_MAX_BODY.saturating_sub(used) / 4 * 3
}

/// A failed op of a rolled-back transaction.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TxnError {
    pub op_index: usize,
    pub what: String,
}

/// A transaction either applied every op (with the entries they returned) or none.
#[derive(Clone, Debug)]
pub enum TxnOutcome {
    Committed(Vec<KvPair>),
    RolledBack(Vec<TxnError>),
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WireResponse<'a> {
    #[serde(default, borrow)]
    results: Option<Vec<WireResult<'a>>>,
    #[serde(default)]
    errors: Option<Vec<TxnError>>,
}

#[derive(Deserialize)]
struct WireResult<'a> {
    #[serde(rename = "KV", borrow)]
    kv: Option<WireEntry<'a>>,
}

impl Client {
    pub async fn txn(&self, ops: &[TxnOp]) -> Result<TxnOutcome, Error> {
        let response = self
            .send(
                Method::PUT,
                "/v1/txn",
                Some(body(ops)),
                self.request_timeout,
            )
            .await?;
        let status = response.status();
        if status != StatusCode::OK && status != StatusCode::CONFLICT {
            return Err(status_error(response).await);
        }
        let body = response
            .bytes()
            .await
            .map_err(|e| Error::Decode(e.to_string()))?;
        let wire: WireResponse =
            serde_json::from_slice(&body).map_err(|e| Error::Decode(e.to_string()))?;
        if status == StatusCode::CONFLICT {
            return Ok(TxnOutcome::RolledBack(wire.errors.unwrap_or_default()));
        }
        let entries = wire
            .results
            .unwrap_or_default()
            .into_iter()
            .filter_map(|r| r.kv)
            .map(KvPair::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TxnOutcome::Committed(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// Consul's op shape, built the plain way, as the reference for the direct writer.
    fn reference(op: &TxnOp) -> Value {
        let b64 = |value: &[u8]| base64::engine::general_purpose::STANDARD.encode(value);
        let kv = match op {
            TxnOp::Set { key, value } => json!({"Verb": "set", "Key": key, "Value": b64(value)}),
            TxnOp::Cas { key, value, index } => {
                json!({"Verb": "cas", "Key": key, "Value": b64(value), "Index": index})
            }
            TxnOp::Lock {
                key,
                value,
                session,
            } => json!({"Verb": "lock", "Key": key, "Value": b64(value), "Session": session}),
            TxnOp::Unlock {
                key,
                value,
                session,
            } => json!({"Verb": "unlock", "Key": key, "Value": b64(value), "Session": session}),
            TxnOp::DeleteCas { key, index } => {
                json!({"Verb": "delete-cas", "Key": key, "Index": index})
            }
            TxnOp::CheckIndex { key, index } => {
                json!({"Verb": "check-index", "Key": key, "Index": index})
            }
            TxnOp::CheckSession { key, session } => {
                json!({"Verb": "check-session", "Key": key, "Session": session})
            }
            TxnOp::CheckNotExists { key } => json!({"Verb": "check-not-exists", "Key": key}),
            TxnOp::Get { key } => json!({"Verb": "get", "Key": key}),
        };
        json!({ "KV": kv })
    }

    fn encoded(ops: &[TxnOp]) -> usize {
        Value::Array(ops.iter().map(reference).collect())
            .to_string()
            .len()
    }

    /// The counted length is exactly the encoded body's, whatever the value's length
    /// modulo 3 and whatever the key needs escaped.
    #[test]
    fn encoded_len_is_exact() {
        for n in [0, 1, 2, 3, 4, 5, 1000, 20_001] {
            let ops = vec![
                TxnOp::CheckSession {
                    key: "leader".into(),
                    session: "0b5c7a1e-3d2f-4c1b-9a8e-7f6d5c4b3a21".into(),
                },
                TxnOp::CheckIndex {
                    key: "q/\"quoted\"\n\u{7f}é".into(),
                    index: 123_456_789,
                },
                TxnOp::Lock {
                    key: "q/a".into(),
                    value: vec![b'x'; n],
                    session: "s".into(),
                },
                TxnOp::DeleteCas {
                    key: "q/b".into(),
                    index: 7,
                },
                TxnOp::DeleteCas {
                    key: "q/z".into(),
                    index: 0,
                },
                TxnOp::CheckIndex {
                    key: "q/m".into(),
                    index: u64::MAX,
                },
                TxnOp::Get { key: "q/c".into() },
                TxnOp::Set {
                    key: "d/a".into(),
                    value: vec![1; n],
                },
                TxnOp::Cas {
                    key: "q/d".into(),
                    value: vec![2; n],
                    index: 9,
                },
                TxnOp::Unlock {
                    key: "q/e".into(),
                    value: vec![3; n],
                    session: "s".into(),
                },
            ];
            assert_eq!(
                body_len(ops.iter().map(TxnOp::encoded_len)),
                encoded(&ops),
                "{n}"
            );
        }
        assert_eq!(body_len([]), 2);
    }

    /// A value gets the room left in the body, in raw bytes.
    #[test]
    fn value_room_is_what_base64_leaves() {
        let ops = vec![TxnOp::Set {
            key: "d/a".into(),
            value: Vec::new(),
        }];
        let room = value_room(&ops);
        let mut with = ops.clone();
        with[0] = TxnOp::Set {
            key: "d/a".into(),
            value: vec![0; room],
        };
        assert!(fits(&with));
        with[0] = TxnOp::Set {
            key: "d/a".into(),
            value: vec![0; room + 3],
        };
        assert!(!fits(&with));
    }
}
