//! `/v1/txn`: the body's operations decoded and checked against Consul's limits, then
//! applied all or nothing by the state machine.

use super::*;

pub(super) async fn txn(req: Req<'_>) -> Reply {
    let limit = TXN_MAX_REQ_LEN.max(KV_MAX_VALUE_SIZE);
    let too_large = move |n: usize| {
        format!(
            "Request body({n} bytes) too large, max size: {limit} bytes. See https://developer.hashicorp.com/docs/agent/config/config-files#txn_max_req_len."
        )
    };
    let shared = req.shared;
    let pretty = req.query.has("pretty");
    let body = req.body(limit, too_large).await?;
    let ops = parse_txn(&body)?;
    let read_only = !ops.iter().any(TxnOp::is_write);
    let outcome = shared.write(Command::Txn(ops)).await?;
    let (status, body) = match outcome {
        // A write's answer is sent as it is serialized, without a JSON tree per result: a
        // queue's transactions carry a hundred of them.
        Outcome::TxnCommitted(results) if !read_only => {
            let results: Vec<KvResult> = results
                .iter()
                .map(|r| KvResult {
                    kv: DirEntry::new(&r.key, &r.entry),
                })
                .collect();
            let body = Committed {
                results,
                errors: None,
            };
            return Ok(json_body(to_json(&body, pretty)));
        }
        Outcome::TxnCommitted(results) => {
            let results: Vec<Value> = results
                .iter()
                .map(|r| {
                    json!({"KV": serde_json::to_value(DirEntry::new(&r.key, &r.entry)).expect("entries serialize")})
                })
                .collect();
            (StatusCode::OK, json!({"Results": results, "Errors": null}))
        }
        Outcome::TxnFailed(errors) => {
            let errors: Vec<Value> = errors
                .iter()
                .map(|e| json!({"OpIndex": e.op_index, "What": e.what}))
                .collect();
            (
                StatusCode::CONFLICT,
                json!({"Results": null, "Errors": errors}),
            )
        }
        other => return Err(HttpError::internal(format!("unexpected outcome {other:?}"))),
    };
    let mut body = body;
    if read_only {
        // Consul answers reads through `Txn.Read`, whose `TxnReadResponse` embeds the
        // QueryMeta: its fields follow Results and Errors, as a leader fills them in (no
        // index, since the read does not block).
        if let Value::Object(fields) = &mut body {
            fields.insert("Index".into(), json!(0));
            fields.insert("LastContact".into(), json!(0));
            fields.insert("KnownLeader".into(), json!(true));
            fields.insert("ConsistencyLevel".into(), json!(""));
            fields.insert("NotModified".into(), json!(false));
            fields.insert("Backend".into(), json!(0));
            fields.insert("ResultsFilteredByACLs".into(), json!(false));
        }
    }
    let mut response = json_body(to_json(&body, pretty));
    *response.status_mut() = status;
    if read_only {
        response = with_meta(response, None);
    }
    Ok(response)
}

/// A committed write's answer, in Consul's field order.
#[derive(serde::Serialize)]
#[serde(rename_all = "PascalCase")]
struct Committed<'a> {
    results: Vec<KvResult<'a>>,
    errors: Option<()>,
}

#[derive(serde::Serialize)]
struct KvResult<'a> {
    #[serde(rename = "KV")]
    kv: DirEntry<'a>,
}

pub(super) fn parse_txn(body: &[u8]) -> Result<Vec<TxnOp>, HttpError> {
    let fail = |reason: String| HttpError::bad_request(format!("Failed to parse body: {reason}"));
    let value: Value = serde_json::from_slice(body).map_err(|e| fail(e.to_string()))?;
    let ops = match value {
        Value::Array(ops) => ops,
        Value::Null => Vec::new(),
        other => {
            return Err(fail(format!(
                "json: cannot unmarshal {} into Go value of type api.TxnOps",
                json_kind(&other)
            )))
        }
    };
    if ops.len() > TXN_MAX_OPS {
        return Err(HttpError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "Transaction contains too many operations ({} > {TXN_MAX_OPS})",
                ops.len()
            ),
        ));
    }
    let mut parsed = Vec::with_capacity(ops.len());
    for op in &ops {
        let Value::Object(op) = op else {
            return Err(fail(format!(
                "json: cannot unmarshal {} into Go value of type api.TxnOp",
                json_kind(op)
            )));
        };
        if let Some(other) = ["Node", "Service", "Check"]
            .iter()
            .find(|name| field(op, name).is_some_and(|v| !v.is_null()))
        {
            return Err(fail(format!(
                "{other} operations are not supported by leaderq server; only KV operations are"
            )));
        }
        let Some(Value::Object(kv)) = field(op, "KV") else {
            return Err(fail("operation has no KV member".into()));
        };
        // Borrowed: a value's base64 is decoded from the body's own string, not a copy.
        let text = |name: &str| text_field(kv, name).map_err(fail);
        let number = |name: &str| -> Result<u64, HttpError> {
            match field(kv, name) {
                None | Some(Value::Null) => Ok(0),
                Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64().unwrap_or(0)),
                Some(other) => Err(fail(format!(
                    "json: cannot unmarshal {} into Go struct field KVTxnOp.KV.{name} of type uint64",
                    json_kind(other)
                ))),
            }
        };
        let key = text("Key")?.to_string();
        let value = base64::engine::general_purpose::STANDARD
            .decode(text("Value")?)
            .map_err(|e| fail(format!("illegal base64 data: {e}")))?;
        if value.len() > KV_MAX_VALUE_SIZE {
            return Err(HttpError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "Value for key {} is too large ({} > {KV_MAX_VALUE_SIZE} bytes)",
                    duration::quote(&key),
                    value.len()
                ),
            ));
        }
        parsed.push(TxnOp {
            verb: text("Verb")?.to_string(),
            key,
            value,
            flags: number("Flags")?,
            index: number("Index")?,
            session: text("Session")?.to_string(),
        });
    }
    Ok(parsed)
}

/// Field `name` of a transaction's KV operation, a string (absent or null: empty).
fn text_field<'a>(kv: &'a Map<String, Value>, name: &str) -> Result<&'a str, String> {
    match field(kv, name) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!(
            "json: cannot unmarshal {} into Go struct field KVTxnOp.KV.{name} of type string",
            json_kind(other)
        )),
    }
}
