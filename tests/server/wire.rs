//! The wire as Go's net/http and Consul's wrappers write it: header names in canonical MIME
//! form (read from the raw bytes), the default ACL policy header, gzip, redirects that keep
//! the query, read-only txn metadata, the effective consistency of catalog reads, Go's JSON
//! escaping and the newline of the mux's 404 texts.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::*;

/// One raw HTTP/1.1 exchange: the response head exactly as sent, and the body bytes.
fn raw(server: &ServerProcess, method: &str, path: &str, headers: &[&str]) -> (String, Vec<u8>) {
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", server.addr);
    for header in headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str("Connection: close\r\nContent-Length: 0\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).unwrap();
    let split = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8(bytes[..split].to_vec()).unwrap();
    let mut body = bytes[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (head, body)
}

fn dechunk(mut bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = bytes.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&bytes[..line_end]).unwrap(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&bytes[line_end + 2..line_end + 2 + size]);
        bytes = &bytes[line_end + 4 + size..];
    }
}

/// The header lines of a raw head, as written (name and value).
fn header_lines(head: &str) -> Vec<(String, String)> {
    head.lines()
        .skip(1)
        .filter_map(|line| line.split_once(": "))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("a gzip body");
    out
}

/// Every header name reaches the socket as Go's `CanonicalMIMEHeaderKey` writes it: the
/// first letter and each letter after a hyphen upper case, the rest lower case
/// (`X-Consul-Knownleader`, not `X-Consul-KnownLeader` and not `x-consul-knownleader`).
#[tokio::test]
async fn header_names_are_in_go_canonical_form() {
    let server = ServerProcess::start();
    put(&server, "/v1/kv/k", "v").await;
    let (head, _) = raw(&server, "GET", "/v1/kv/k", &[]);
    let names: Vec<String> = header_lines(&head).into_iter().map(|(n, _)| n).collect();
    for expected in [
        "X-Consul-Index",
        "X-Consul-Knownleader",
        "X-Consul-Lastcontact",
        "X-Consul-Default-Acl-Policy",
        "Content-Type",
        "Content-Length",
        "Vary",
        "Date",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "no {expected} in:\n{head}"
        );
    }
    for name in &names {
        let canonical: String = name
            .split('-')
            .map(|part| {
                let mut chars = part.chars();
                match chars.next() {
                    Some(first) => {
                        first.to_ascii_uppercase().to_string() + &chars.as_str().to_lowercase()
                    }
                    None => String::new(),
                }
            })
            .collect::<Vec<_>>()
            .join("-");
        assert_eq!(name, &canonical, "header not in canonical form:\n{head}");
    }
}

/// Every answer of a Consul endpoint says `X-Consul-Default-Acl-Policy: allow`: reads,
/// writes, errors, 405 and OPTIONS. The mux's own answers (a redirect, the 404 of an
/// unknown path) are not wrapped by Consul's handler and carry no such header.
#[tokio::test]
async fn endpoint_answers_carry_the_default_acl_policy() {
    let server = ServerProcess::start();
    let answers = [
        put(&server, "/v1/kv/a", "1").await,
        get(&server, "/v1/kv/a").await,
        get(&server, "/v1/kv/missing").await,
        get(&server, "/v1/session/create").await,
        get(&server, "/v1/kv/a?stale&consistent").await,
        put(&server, "/v1/agent/check/pass/nope", "").await,
        client()
            .request(reqwest::Method::OPTIONS, server.url("/v1/kv/a"))
            .send()
            .await
            .unwrap(),
    ];
    for answer in &answers {
        assert_eq!(
            answer
                .headers()
                .get("X-Consul-Default-ACL-Policy")
                .map(|v| v.to_str().unwrap()),
            Some("allow"),
            "{} {}",
            answer.url(),
            answer.status()
        );
    }
    for answer in [
        get(&server, "/v1/kv").await,
        get(&server, "/v1/no-such-endpoint").await,
    ] {
        assert!(
            answer
                .headers()
                .get("X-Consul-Default-ACL-Policy")
                .is_none(),
            "{}",
            answer.url()
        );
    }
}

/// As Consul's gzip wrapper (NYTimes gziphandler, 1400-byte minimum): every endpoint answer
/// says `Vary: Accept-Encoding`; a body of at least 1400 bytes is gzipped when the client
/// accepts gzip, a smaller one is not, and nothing is gzipped for a client that does not ask.
#[tokio::test]
async fn bodies_are_gzipped_as_consuls_wrapper_does() {
    let server = ServerProcess::start();
    for i in 0..40 {
        put(&server, &format!("/v1/kv/big/{i:02}"), &"x".repeat(40)).await;
    }
    let (plain_head, plain) = raw(&server, "GET", "/v1/kv/big/?recurse", &[]);
    assert!(plain.len() >= 1400, "the listing is {} bytes", plain.len());
    assert!(
        plain_head.contains("\r\nVary: Accept-Encoding"),
        "{plain_head}"
    );
    assert!(!plain_head.contains("Content-Encoding"), "{plain_head}");

    let (head, body) = raw(
        &server,
        "GET",
        "/v1/kv/big/?recurse",
        &["Accept-Encoding: gzip, deflate"],
    );
    assert!(head.contains("\r\nContent-Encoding: gzip"), "{head}");
    assert!(head.contains("\r\nVary: Accept-Encoding"), "{head}");
    assert!(head.contains("\r\nX-Consul-Index: "), "{head}");
    assert_eq!(gunzip(&body), plain);

    let (small_head, small) = raw(&server, "GET", "/v1/kv/big/00", &["Accept-Encoding: gzip"]);
    assert!(!small_head.contains("Content-Encoding"), "{small_head}");
    assert!(
        small_head.contains("\r\nVary: Accept-Encoding"),
        "{small_head}"
    );
    assert!(small.starts_with(b"[{"));

    let (refused_head, _) = raw(
        &server,
        "GET",
        "/v1/kv/big/?recurse",
        &["Accept-Encoding: gzip;q=0"],
    );
    assert!(!refused_head.contains("Content-Encoding"), "{refused_head}");
}

/// A listing past 16 MiB is sent as it is written, chunked (as Consul's large answers are),
/// and is byte for byte the listing built whole for a client that takes it gzipped.
#[tokio::test]
async fn a_large_listing_is_streamed_and_whole() {
    let server = ServerProcess::start();
    for i in 0..36 {
        let value = format!("{i:02}").repeat(250_000);
        put(&server, &format!("/v1/kv/large/{i:02}"), &value).await;
    }
    put(&server, "/v1/kv/larger", "not listed").await;
    let (head, streamed) = raw(&server, "GET", "/v1/kv/large/?recurse", &[]);
    assert!(head.contains("\r\nTransfer-Encoding: chunked"), "{head}");
    assert!(streamed.len() > 16 << 20, "{} bytes", streamed.len());
    let (whole_head, whole) = raw(
        &server,
        "GET",
        "/v1/kv/large/?recurse",
        &["Accept-Encoding: gzip"],
    );
    assert!(gunzip(&whole) == streamed, "the streamed listing differs");
    // The index is the prefix's newest entry's, as for the whole listing: not that of the
    // key written after them, outside the prefix.
    let index = |head: &str| -> u64 {
        let line = head
            .lines()
            .find(|l| l.starts_with("X-Consul-Index: "))
            .unwrap();
        line["X-Consul-Index: ".len()..].parse().unwrap()
    };
    let (larger_head, _) = raw(&server, "GET", "/v1/kv/larger", &[]);
    assert_eq!(index(&head), index(&whole_head));
    assert_eq!(index(&head) + 1, index(&larger_head));
    let entries: Vec<serde_json::Value> = serde_json::from_slice(&streamed).unwrap();
    let keys: Vec<&str> = entries.iter().map(|e| e["Key"].as_str().unwrap()).collect();
    let expected: Vec<String> = (0..36).map(|i| format!("large/{i:02}")).collect();
    assert_eq!(keys, expected);
}

/// Go's mux redirects a path Consul registers with a trailing slash, reached without it,
/// to the slashed path with the query kept (`/v1/kv?recurse` → `/v1/kv/?recurse`), with
/// Go's short HTML body for a GET.
#[tokio::test]
async fn redirects_keep_the_query_and_add_the_registered_slash() {
    let server = ServerProcess::start();
    for (path, location) in [
        ("/v1/kv?recurse", "/v1/kv/?recurse"),
        ("/v1/session/info", "/v1/session/info/"),
        ("/v1/session/destroy", "/v1/session/destroy/"),
        ("/v1/session/renew", "/v1/session/renew/"),
        ("/v1/session/node", "/v1/session/node/"),
        (
            "/v1/agent/check/pass?note=ok",
            "/v1/agent/check/pass/?note=ok",
        ),
        ("/v1/agent/check/warn", "/v1/agent/check/warn/"),
        ("/v1/agent/check/fail", "/v1/agent/check/fail/"),
        ("/v1/agent/check/update", "/v1/agent/check/update/"),
        ("/v1/agent/check/deregister", "/v1/agent/check/deregister/"),
        ("/v1/kv//a?keys&separator=/", "/v1/kv/a?keys&separator=/"),
    ] {
        let answer = get(&server, path).await;
        assert_eq!(answer.status(), 301, "{path}");
        assert_eq!(answer.headers()["Location"], location, "{path}");
    }
    let answer = get(&server, "/v1/kv?recurse&keys").await;
    assert_eq!(answer.headers()["Content-Type"], "text/html; charset=utf-8");
    assert_eq!(
        answer.text().await.unwrap(),
        "<a href=\"/v1/kv/?recurse&amp;keys\">Moved Permanently</a>.\n\n"
    );
    let put_answer = put(&server, "/v1/session/renew", "").await;
    assert_eq!(put_answer.status(), 301);
    assert_eq!(put_answer.text().await.unwrap(), "");
}

/// A committed write answers each write op's entry without its value, in Consul's field
/// order, byte for byte (`Txn.Apply` blanks the values it returns), and no QueryMeta.
#[tokio::test]
async fn committed_write_txn_answers_entries_without_values() {
    let server = ServerProcess::start();
    let ops = json!([{"KV": {"Verb": "set", "Key": "w", "Value": "MQ==", "Flags": 7}}]).to_string();
    let answer = put(&server, "/v1/txn", &ops).await;
    assert_eq!(answer.status(), 200);
    assert!(answer.headers().get("X-Consul-KnownLeader").is_none());
    let text = answer.text().await.unwrap();
    let index: Value = serde_json::from_str(&text).unwrap();
    let index = index["Results"][0]["KV"]["ModifyIndex"].as_u64().unwrap();
    assert_eq!(
        text,
        format!(
            "{{\"Results\":[{{\"KV\":{{\"LockIndex\":0,\"Key\":\"w\",\"Flags\":7,\"Value\":null,\"CreateIndex\":{index},\"ModifyIndex\":{index}}}}}],\"Errors\":null}}"
        )
    );
}

/// A txn of reads only answers, like Consul's `Txn.Read`, with the embedded QueryMeta
/// fields in its body and the KnownLeader and LastContact headers, but no index.
#[tokio::test]
async fn read_only_txn_answers_with_query_meta() {
    let server = ServerProcess::start();
    put(&server, "/v1/kv/r", "1").await;
    let ops = json!([{"KV": {"Verb": "get", "Key": "r"}}]).to_string();
    let answer = put(&server, "/v1/txn", &ops).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["X-Consul-KnownLeader"], "true");
    assert_eq!(answer.headers()["X-Consul-LastContact"], "0");
    assert!(answer.headers().get("X-Consul-Index").is_none());
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["Results"][0]["KV"]["Key"], "r");
    assert_eq!(body["Errors"], Value::Null);
    for (field, value) in [
        ("Index", json!(0)),
        ("LastContact", json!(0)),
        ("KnownLeader", json!(true)),
        ("ConsistencyLevel", json!("")),
        ("NotModified", json!(false)),
        ("Backend", json!(0)),
        ("ResultsFilteredByACLs", json!(false)),
    ] {
        assert_eq!(body[field], value, "{field} in {body}");
    }
    let failed = put(
        &server,
        "/v1/txn",
        &json!([{"KV": {"Verb": "get", "Key": "absent"}}]).to_string(),
    )
    .await;
    assert_eq!(failed.status(), 409);
    let body: Value = failed.json().await.unwrap();
    assert_eq!(body["KnownLeader"], true);
    assert_eq!(body["Results"], Value::Null);

    let write = put(
        &server,
        "/v1/txn",
        &json!([{"KV": {"Verb": "set", "Key": "w", "Value": b64("1")}}]).to_string(),
    )
    .await;
    assert!(write.headers().get("X-Consul-KnownLeader").is_none());
    let body: Value = write.json().await.unwrap();
    assert!(body.get("KnownLeader").is_none(), "{body}");
}

/// Catalog reads say which consistency served them: `leader` by default, `stale` or
/// `consistent` when asked.
#[tokio::test]
async fn catalog_reads_carry_their_effective_consistency() {
    let server = ServerProcess::start();
    for (query, level) in [
        ("", "leader"),
        ("?stale", "stale"),
        ("?consistent", "consistent"),
    ] {
        let answer = get(&server, &format!("/v1/catalog/nodes{query}")).await;
        assert_eq!(
            answer.headers()["X-Consul-Effective-Consistency"],
            level,
            "{query}"
        );
    }
    let kv = get(&server, "/v1/kv/none").await;
    assert!(kv.headers().get("X-Consul-Effective-Consistency").is_none());
}

/// JSON escapes `<`, `>` and `&` as Go's encoder does (`\u003c`, `\u003e`, `\u0026`), in
/// key listings, entries and session names alike.
#[tokio::test]
async fn json_escapes_html_characters_as_go_does() {
    let server = ServerProcess::start();
    put(&server, "/v1/kv/a%3Cb%3E%26c", "1").await;
    let keys = get(&server, "/v1/kv/?keys").await.text().await.unwrap();
    assert_eq!(keys, r#"["a\u003cb\u003e\u0026c"]"#);
    let entries = get(&server, "/v1/kv/?recurse").await.text().await.unwrap();
    assert!(
        entries.contains(r#""Key":"a\u003cb\u003e\u0026c""#),
        "{entries}"
    );
    let pretty = get(&server, "/v1/kv/?keys&pretty")
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(pretty, "[\n    \"a\\u003cb\\u003e\\u0026c\"\n]\n");
    let id = create_session(&server, json!({"Name": "<x & y>", "TTL": "30s"})).await;
    let info = get(&server, &format!("/v1/session/info/{id}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        info.contains(r#""Name":"\u003cx \u0026 y\u003e""#),
        "{info}"
    );
}

/// The texts the mux writes for a path no endpoint serves end with the newline Consul's
/// `Fprintln` writes; the index page says what it is.
#[tokio::test]
async fn mux_texts_end_with_consuls_newline() {
    let server = ServerProcess::start();
    let unknown = get(&server, "/v1/no-such-endpoint").await;
    assert_eq!(unknown.status(), 404);
    assert_eq!(
        unknown.text().await.unwrap(),
        "Invalid URL path: not a recognized HTTP API endpoint\n"
    );
    let outside = get(&server, "/nope").await;
    assert_eq!(outside.status(), 404);
    assert_eq!(
        outside.text().await.unwrap(),
        "Invalid URL path: if attempting to use the HTTP API, ensure the path starts with '/v1/'\n"
    );
    let index = get(&server, "/").await;
    assert_eq!(index.status(), 200);
    assert_eq!(
        index.text().await.unwrap(),
        "Consul Agent: UI disabled. To enable, set ui_config.enabled=true in the agent configuration and restart."
    );
}
