//! `/v1/txn`: several KV operations applied atomically, or none.

use base64::Engine as _;
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::kv::WireEntry;
use super::{status_error, Client, Error, KvPair};

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
}

impl TxnOp {
    fn to_json(&self) -> Value {
        let b64 = |value: &[u8]| base64::engine::general_purpose::STANDARD.encode(value);
        let kv = match self {
            TxnOp::Set { key, value } => json!({"Verb": "set", "Key": key, "Value": b64(value)}),
            TxnOp::Cas { key, value, index } => {
                json!({"Verb": "cas", "Key": key, "Value": b64(value), "Index": index})
            }
            TxnOp::Lock {
                key,
                value,
                session,
            } => {
                json!({"Verb": "lock", "Key": key, "Value": b64(value), "Session": session})
            }
            TxnOp::Unlock {
                key,
                value,
                session,
            } => {
                json!({"Verb": "unlock", "Key": key, "Value": b64(value), "Session": session})
            }
            TxnOp::DeleteCas { key, index } => {
                json!({"Verb": "delete-cas", "Key": key, "Index": index})
            }
            TxnOp::CheckIndex { key, index } => {
                json!({"Verb": "check-index", "Key": key, "Index": index})
            }
            TxnOp::CheckSession { key, session } => {
                json!({"Verb": "check-session", "Key": key, "Session": session})
            }
        };
        json!({ "KV": kv })
    }
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
struct WireResponse {
    #[serde(default)]
    results: Option<Vec<WireResult>>,
    #[serde(default)]
    errors: Option<Vec<TxnError>>,
}

#[derive(Deserialize)]
struct WireResult {
    #[serde(rename = "KV")]
    kv: Option<WireEntry>,
}

impl Client {
    pub async fn txn(&self, ops: &[TxnOp]) -> Result<TxnOutcome, Error> {
        let body = Value::Array(ops.iter().map(TxnOp::to_json).collect());
        let response = self
            .send(
                Method::PUT,
                "/v1/txn",
                Some(body.to_string().into_bytes()),
                self.request_timeout,
            )
            .await?;
        let status = response.status();
        if status != StatusCode::OK && status != StatusCode::CONFLICT {
            return Err(status_error(response).await);
        }
        let wire: WireResponse = response
            .json()
            .await
            .map_err(|e| Error::Decode(e.to_string()))?;
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
