//! Integration tests of `leaderq server` over real HTTP: each test starts the binary on a
//! free port with a temporary data dir and talks to it as a Consul client would.

#[path = "server/catalog.rs"]
mod catalog;
mod common;
#[path = "server/edges.rs"]
mod edges;
#[path = "server/watch.rs"]
mod watch;
#[path = "server/wire.rs"]
mod wire;

use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{client, index_of, wait_until, wait_until_blocked, ServerProcess};
use serde_json::{json, Value};

/// Long enough for a blocking query that a write wrongly woke to have answered.
const SETTLE: Duration = Duration::from_millis(300);

/// How many writes the load of `acknowledged_writes_survive_sigkill` has had acknowledged
/// when the server is killed: well past the test's minimum of 50.
const LOAD_BEFORE_KILL: usize = 200;

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

async fn put(server: &ServerProcess, path: &str, body: &str) -> reqwest::Response {
    client()
        .put(server.url(path))
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

async fn get(server: &ServerProcess, path: &str) -> reqwest::Response {
    client().get(server.url(path)).send().await.unwrap()
}

/// Follows a key with blocking queries until no session holds it (guarded against hangs).
async fn wait_until_unlocked(server: &ServerProcess, key: &str) {
    let mut index = index_of(&get(server, &format!("/v1/kv/{key}")).await);
    wait_until(
        Duration::from_secs(20),
        &format!("{key} unlocked"),
        async || {
            let response = get(server, &format!("/v1/kv/{key}?index={index}&wait=10s")).await;
            index = index_of(&response);
            let entries: Value = response.json().await.unwrap();
            match entries[0].get("Session") {
                None => Ok(()),
                Some(session) => Err(session.clone()),
            }
        },
    )
    .await
}

async fn create_session(server: &ServerProcess, body: Value) -> String {
    let response = put(server, "/v1/session/create", &body.to_string()).await;
    assert_eq!(response.status(), 200);
    let created: Value = response.json().await.unwrap();
    created["ID"].as_str().unwrap().to_string()
}

/// A PUT value reads back base64-encoded with Consul's fields and headers; flags cover the
/// whole u64 range; `?raw` returns the bytes; a missing key is 404 with an index; an empty
/// body reads back as null.
#[tokio::test]
async fn kv_put_and_get_follow_consul_shapes() {
    let server = ServerProcess::start();
    let response = put(
        &server,
        "/v1/kv/app/config?flags=16210313421097356768",
        "hello",
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "true");

    let response = get(&server, "/v1/kv/app/config").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["X-Consul-KnownLeader"], "true");
    assert_eq!(response.headers()["X-Consul-LastContact"], "0");
    let index = index_of(&response);
    let entries: Value = response.json().await.unwrap();
    assert_eq!(
        entries,
        json!([{"LockIndex": 0, "Key": "app/config", "Flags": 16210313421097356768u64,
                "Value": b64("hello"), "CreateIndex": index, "ModifyIndex": index}])
    );

    let raw = get(&server, "/v1/kv/app/config?raw").await;
    assert_eq!(raw.headers()["Content-Type"], "text/plain");
    assert_eq!(raw.text().await.unwrap(), "hello");

    let missing = get(&server, "/v1/kv/nope").await;
    assert_eq!(missing.status(), 404);
    assert!(index_of(&missing) >= index);
    assert_eq!(missing.text().await.unwrap(), "");

    put(&server, "/v1/kv/empty", "").await;
    let entries: Value = get(&server, "/v1/kv/empty").await.json().await.unwrap();
    assert_eq!(entries[0]["Value"], Value::Null);

    assert_eq!(get(&server, "/v1/kv/").await.status(), 400);
    let bad_flags = put(&server, "/v1/kv/x?flags=abc", "v").await;
    assert_eq!(bad_flags.status(), 500);
    assert_eq!(
        bad_flags.text().await.unwrap(),
        "strconv.ParseUint: parsing \"abc\": invalid syntax"
    );
}

/// Recurse lists by byte prefix, keys+separator rolls up sub-folders, and empty listings
/// are 404 except an empty key list at the root.
#[tokio::test]
async fn kv_listing_recurse_keys_and_separator() {
    let server = ServerProcess::start();
    assert_eq!(get(&server, "/v1/kv/?recurse").await.status(), 404);
    let root = get(&server, "/v1/kv/?keys").await;
    assert_eq!(root.status(), 200);
    assert_eq!(root.text().await.unwrap(), "[]");
    for key in [
        "test/key1",
        "test/key2",
        "test/sub/a",
        "test/sub/b",
        "testing",
    ] {
        put(&server, &format!("/v1/kv/{key}"), "v").await;
    }
    let entries: Value = get(&server, "/v1/kv/test?recurse")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(entries.as_array().unwrap().len(), 5);
    let keys: Value = get(&server, "/v1/kv/test/?keys&separator=/")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(keys, json!(["test/key1", "test/key2", "test/sub/"]));
    let keys: Value = get(&server, "/v1/kv/test/?keys&seperator=/")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(keys, json!(["test/key1", "test/key2", "test/sub/"]));
    assert_eq!(get(&server, "/v1/kv/nothing/?keys").await.status(), 404);
}

/// CAS writes and deletes, recursive delete and the conflicting-flags error.
#[tokio::test]
async fn kv_cas_and_delete_variants() {
    let server = ServerProcess::start();
    assert_eq!(
        put(&server, "/v1/kv/k?cas=0", "a")
            .await
            .text()
            .await
            .unwrap(),
        "true"
    );
    assert_eq!(
        put(&server, "/v1/kv/k?cas=0", "b")
            .await
            .text()
            .await
            .unwrap(),
        "false"
    );
    let index = index_of(&get(&server, "/v1/kv/k").await);
    assert_eq!(
        put(&server, &format!("/v1/kv/k?cas={}", index + 7), "c")
            .await
            .text()
            .await
            .unwrap(),
        "false"
    );
    assert_eq!(
        put(&server, &format!("/v1/kv/k?cas={index}"), "d")
            .await
            .text()
            .await
            .unwrap(),
        "true"
    );
    let delete = |path: &str| client().delete(server.url(path)).send();
    assert_eq!(
        delete("/v1/kv/k?cas=1")
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "false"
    );
    let index = index_of(&get(&server, "/v1/kv/k").await);
    assert_eq!(
        delete(&format!("/v1/kv/k?cas={index}"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "true"
    );
    assert_eq!(get(&server, "/v1/kv/k").await.status(), 404);

    put(&server, "/v1/kv/dir/a", "1").await;
    put(&server, "/v1/kv/dir/b", "2").await;
    let conflict = delete("/v1/kv/dir/?recurse&cas=3").await.unwrap();
    assert_eq!(conflict.status(), 400);
    assert_eq!(
        conflict.text().await.unwrap(),
        "Conflicting flags: cas=3&recurse=\n"
    );
    assert_eq!(
        delete("/v1/kv/dir/?recurse")
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "true"
    );
    assert_eq!(get(&server, "/v1/kv/dir/?recurse").await.status(), 404);
    assert_eq!(delete("/v1/kv/").await.unwrap().status(), 400);
}

/// Locks over HTTP: acquire, contention, release, LockIndex, unknown session errors, and
/// lock-delay after destroy (acquire answers false while it lasts).
#[tokio::test]
async fn locks_and_sessions_over_http() {
    let server = ServerProcess::start();
    let a = create_session(&server, json!({"Name": "a", "LockDelay": "1s"})).await;
    let b = create_session(&server, json!({"Name": "b"})).await;
    let acquire = |key: &str, session: &str| format!("/v1/kv/{key}?acquire={session}");
    assert_eq!(
        put(&server, &acquire("leader", &a), "a")
            .await
            .text()
            .await
            .unwrap(),
        "true"
    );
    assert_eq!(
        put(&server, &acquire("leader", &b), "b")
            .await
            .text()
            .await
            .unwrap(),
        "false"
    );
    let entries: Value = get(&server, "/v1/kv/leader").await.json().await.unwrap();
    assert_eq!(entries[0]["Session"], json!(a));
    assert_eq!(entries[0]["LockIndex"], 1);

    let unknown = put(
        &server,
        &acquire("leader", "8a1a3c4b-0000-0000-0000-000000000000"),
        "x",
    )
    .await;
    assert_eq!(unknown.status(), 500);
    assert_eq!(
        unknown.text().await.unwrap(),
        "invalid session \"8a1a3c4b-0000-0000-0000-000000000000\""
    );

    let destroyed = put(&server, &format!("/v1/session/destroy/{a}"), "").await;
    assert_eq!(destroyed.text().await.unwrap(), "true");
    let entries: Value = get(&server, "/v1/kv/leader").await.json().await.unwrap();
    assert_eq!(entries[0].get("Session"), None);
    assert_eq!(
        put(&server, &acquire("leader", &b), "b")
            .await
            .text()
            .await
            .unwrap(),
        "false"
    );

    put(&server, &acquire("other", &b), "b").await;
    assert_eq!(
        put(&server, &format!("/v1/kv/other?release={b}"), "")
            .await
            .text()
            .await
            .unwrap(),
        "true"
    );

    let info: Value = get(&server, &format!("/v1/session/info/{b}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(info[0]["Name"], "b");
    assert_eq!(info[0]["LockDelay"], 15_000_000_000u64);
    assert_eq!(info[0]["NodeChecks"], json!(["serfHealth"]));
    assert_eq!(info[0]["Behavior"], "release");
    let none: Value = get(&server, "/v1/session/info/nope")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(none, json!([]));
    let list: Value = get(&server, "/v1/session/list").await.json().await.unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
    let on_node: Value = get(&server, "/v1/session/node/test-node")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(on_node.as_array().unwrap().len(), 1);

    let renewed = put(&server, &format!("/v1/session/renew/{a}"), "").await;
    assert_eq!(renewed.status(), 404);
    assert_eq!(
        renewed.text().await.unwrap(),
        format!("Session id '{a}' not found")
    );

    let bad_ttl = put(&server, "/v1/session/create", r#"{"TTL":"500ms"}"#).await;
    assert_eq!(bad_ttl.status(), 500);
    assert_eq!(
        bad_ttl.text().await.unwrap(),
        "Invalid Session TTL '500000000', must be between [1s=24h0m0s]"
    );
    let bad_body = put(&server, "/v1/session/create", r#"{"LockDelay":"5"}"#).await;
    assert_eq!(bad_body.status(), 400);
    assert!(bad_body
        .text()
        .await
        .unwrap()
        .starts_with("Request decode failed: "));
    let no_checks = create_session(&server, json!({"Checks": []})).await;
    let info: Value = get(&server, &format!("/v1/session/info/{no_checks}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(info[0]["NodeChecks"], json!([]));
}

/// A blocking read returns as soon as a write changes its result, and on time-out returns
/// the current index unchanged.
#[tokio::test]
async fn blocking_query_wakes_on_write_and_times_out() {
    let server = ServerProcess::start();
    put(&server, "/v1/kv/queue/a", "1").await;
    let index = index_of(&get(&server, "/v1/kv/queue/?recurse").await);

    let timed_out = get(
        &server,
        &format!("/v1/kv/queue/?recurse&index={index}&wait=200ms"),
    )
    .await;
    assert_eq!(timed_out.status(), 200);
    assert_eq!(index_of(&timed_out), index);

    let url = server.url(&format!("/v1/kv/queue/?recurse&index={index}&wait=30s"));
    let waiter = tokio::spawn(async move { client().get(url).send().await.unwrap() });
    wait_until_blocked(&server.addr, 1).await;
    // An unrelated write does not end the wait for this prefix.
    put(&server, "/v1/kv/elsewhere", "x").await;
    // Asserts that nothing happens: a query the write wrongly woke would have answered.
    tokio::time::sleep(SETTLE).await;
    assert!(!waiter.is_finished());
    put(&server, "/v1/kv/queue/b", "2").await;
    let woke = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("blocking query must wake")
        .unwrap();
    assert!(index_of(&woke) > index);
    let entries: Value = woke.json().await.unwrap();
    assert_eq!(entries.as_array().unwrap().len(), 2);

    assert_eq!(
        get(&server, "/v1/kv/queue/?recurse&index=1&wait=xyz")
            .await
            .status(),
        400
    );
    assert_eq!(
        get(&server, "/v1/kv/queue/?recurse&index=-1")
            .await
            .text()
            .await
            .unwrap(),
        "Invalid index"
    );
}

/// With `--session-ttl-min 1s`, a 1s-TTL session is destroyed after 2×TTL, not before, and
/// its lock is released; a renewed session survives.
#[tokio::test]
async fn session_expires_after_twice_its_ttl() {
    let server = ServerProcess::start();
    let started = Instant::now();
    let session = create_session(&server, json!({"TTL": "1s", "LockDelay": "0s"})).await;
    put(&server, &format!("/v1/kv/held?acquire={session}"), "x").await;
    wait_until_unlocked(&server, "held").await;
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "expired before 2×TTL"
    );
    let info: Value = get(&server, &format!("/v1/session/info/{session}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(info, json!([]));
}

/// Txn: atomic commit with one index, 409 with every failing op and nothing applied,
/// the 128-op limit and body errors.
#[tokio::test]
async fn txn_over_http() {
    let server = ServerProcess::start();
    let txn = |body: Value| {
        client()
            .put(server.url("/v1/txn"))
            .body(body.to_string())
            .send()
    };
    let ok = txn(json!([
        {"KV": {"Verb": "set", "Key": "t/a", "Value": b64("1")}},
        {"KV": {"Verb": "set", "Key": "t/b", "Value": b64("2"), "Flags": 3}},
        {"KV": {"Verb": "get", "Key": "t/a"}},
    ]))
    .await
    .unwrap();
    assert_eq!(ok.status(), 200);
    let body: Value = ok.json().await.unwrap();
    assert_eq!(body["Errors"], Value::Null);
    let results = body["Results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0]["KV"]["Value"], Value::Null);
    assert_eq!(results[2]["KV"]["Value"], json!(b64("1")));
    assert_eq!(
        results[0]["KV"]["ModifyIndex"],
        results[1]["KV"]["ModifyIndex"]
    );

    let failed = txn(json!([
        {"KV": {"Verb": "set", "Key": "t/c", "Value": b64("3")}},
        {"KV": {"Verb": "check-index", "Key": "t/a", "Index": 1}},
        {"KV": {"Verb": "get", "Key": "t/zzz"}},
    ]))
    .await
    .unwrap();
    assert_eq!(failed.status(), 409);
    let body: Value = failed.json().await.unwrap();
    assert_eq!(body["Results"], Value::Null);
    let errors = body["Errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2);
    assert_eq!(errors[0]["OpIndex"], 1);
    assert_eq!(errors[1]["What"], "key \"t/zzz\" doesn't exist");
    assert_eq!(get(&server, "/v1/kv/t/c").await.status(), 404);

    let too_many: Vec<Value> = (0..129)
        .map(|i| json!({"KV": {"Verb": "get", "Key": format!("k{i}")}}))
        .collect();
    let response = txn(Value::Array(too_many)).await.unwrap();
    assert_eq!(response.status(), 413);
    assert_eq!(
        response.text().await.unwrap(),
        "Transaction contains too many operations (129 > 128)"
    );
    let bad = client()
        .put(server.url("/v1/txn"))
        .body("{nope")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad
        .text()
        .await
        .unwrap()
        .starts_with("Failed to parse body: "));
}

/// Values over 512 KiB are refused with 413 before anything is written.
#[tokio::test]
async fn oversized_value_is_refused() {
    let server = ServerProcess::start();
    let big = "x".repeat(512 * 1024 + 1);
    let response = put(&server, "/v1/kv/big", &big).await;
    assert_eq!(response.status(), 413);
    assert!(response
        .text()
        .await
        .unwrap()
        .starts_with("Request body(524289 bytes) too large, max size: 524288 bytes."));
    assert_eq!(get(&server, "/v1/kv/big").await.status(), 404);
}

/// A TTL check bound to a session: failing it, or letting its TTL run out, destroys the
/// session and releases its lock; unknown checks are 404 with Consul's message.
#[tokio::test]
async fn ttl_checks_invalidate_bound_sessions() {
    let server = ServerProcess::start();
    let register = |body: Value| {
        client()
            .put(server.url("/v1/agent/check/register"))
            .body(body.to_string())
            .send()
    };
    let response = register(json!({"Name": "worker", "TTL": "1s", "Status": "passing"}))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "");
    let checks: Value = get(&server, "/v1/agent/checks").await.json().await.unwrap();
    assert_eq!(checks["worker"]["Status"], "passing");
    assert_eq!(checks.get("serfHealth"), None);

    let session = create_session(
        &server,
        json!({"NodeChecks": ["serfHealth", "worker"], "LockDelay": "0s"}),
    )
    .await;
    put(&server, &format!("/v1/kv/job?acquire={session}"), "x").await;
    assert_eq!(
        put(&server, "/v1/agent/check/pass/worker?note=ok", "")
            .await
            .status(),
        200
    );
    // Stop passing: within the check's TTL it goes critical and the session dies.
    wait_until_unlocked(&server, "job").await;
    let checks: Value = get(&server, "/v1/agent/checks").await.json().await.unwrap();
    assert_eq!(checks["worker"]["Status"], "critical");
    assert!(checks["worker"]["Output"]
        .as_str()
        .unwrap()
        .starts_with("TTL expired"));
    let critical = put(
        &server,
        "/v1/session/create",
        r#"{"NodeChecks":["worker"]}"#,
    )
    .await;
    assert_eq!(critical.status(), 500);
    assert_eq!(
        critical.text().await.unwrap(),
        "Check 'worker' is in critical state"
    );

    // Explicit fail invalidates too.
    register(json!({"ID": "w2", "Name": "w2", "TTL": "30s", "Status": "passing"}))
        .await
        .unwrap();
    let s2 = create_session(&server, json!({"NodeChecks": ["w2"]})).await;
    put(&server, "/v1/agent/check/fail/w2", "").await;
    let info: Value = get(&server, &format!("/v1/session/info/{s2}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(info, json!([]));

    let unknown = put(&server, "/v1/agent/check/pass/nope", "").await;
    assert_eq!(unknown.status(), 404);
    assert_eq!(
        unknown.text().await.unwrap(),
        "Unknown check ID \"nope\". Ensure that the check ID is passed, not the check name."
    );
    let bad_status = put(&server, "/v1/agent/check/update/w2", r#"{"Status":"meh"}"#).await;
    assert_eq!(bad_status.status(), 400);
    assert_eq!(register(json!({"TTL": "1s"})).await.unwrap().status(), 400);
    assert_eq!(
        put(&server, "/v1/agent/check/deregister/w2", "")
            .await
            .status(),
        200
    );
}

/// The endpoints clients probe at start, and Consul's 404/405/301 rules.
#[tokio::test]
async fn agent_catalog_status_and_routing() {
    let server = ServerProcess::start();
    let me: Value = get(&server, "/v1/agent/self").await.json().await.unwrap();
    assert_eq!(me["Config"]["NodeName"], "test-node");
    assert_eq!(me["Config"]["Datacenter"], "dc1");
    assert!(me["Config"]["Version"].is_string());
    assert!(me["Stats"]["consul"]["leader_addr"].is_string());
    let nodes: Value = get(&server, "/v1/catalog/nodes")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(nodes[0]["Node"], "test-node");
    let leader: Value = get(&server, "/v1/status/leader")
        .await
        .json()
        .await
        .unwrap();
    assert!(leader.as_str().unwrap().ends_with(":8300"));
    let peers: Value = get(&server, "/v1/status/peers").await.json().await.unwrap();
    assert_eq!(peers, json!([leader]));

    let unknown = get(&server, "/v1/unknown").await;
    assert_eq!(unknown.status(), 404);
    let wrong = get(&server, "/v1/session/create").await;
    assert_eq!(wrong.status(), 405);
    assert_eq!(wrong.headers()["Allow"], "OPTIONS,PUT");
    assert_eq!(wrong.text().await.unwrap(), "method GET not allowed");
    let options = client()
        .request(reqwest::Method::OPTIONS, server.url("/v1/kv/x"))
        .send()
        .await
        .unwrap();
    assert_eq!(options.status(), 200);
    assert_eq!(options.headers()["Allow"], "OPTIONS,GET,PUT,DELETE");
    let unclean = get(&server, "/v1/kv/a//b").await;
    assert_eq!(unclean.status(), 301);
    assert_eq!(unclean.headers()["Location"], "/v1/kv/a/b");
    assert_eq!(get(&server, "/v1/kv/x?dc=dc2").await.status(), 500);
    assert_eq!(
        get(&server, "/v1/kv/x?stale&consistent").await.status(),
        400
    );
}

/// SIGKILL during a write load, then restart on the same data dir: every acknowledged
/// write is there, and the index keeps going up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_sigkill() {
    let mut server = ServerProcess::start();
    let temp = server.take_temp();
    let http = client();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut writers = Vec::new();
    for writer in 0..16 {
        let http = http.clone();
        let base = server.url("/v1/kv/load/");
        let count = count.clone();
        writers.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for n in 0.. {
                let key = format!("w{writer}-{n}");
                let sent = http
                    .put(format!("{base}{key}"))
                    .body(key.clone())
                    .send()
                    .await;
                match sent {
                    Ok(response) if response.status() == 200 => {
                        acknowledged.push(key);
                        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    _ => break,
                }
            }
            acknowledged
        }));
    }
    wait_until(
        Duration::from_secs(30),
        "a write load",
        async || match count.load(std::sync::atomic::Ordering::Relaxed) {
            done if done >= LOAD_BEFORE_KILL => Ok(()),
            short => Err(short),
        },
    )
    .await;
    server.kill();
    let mut acknowledged = Vec::new();
    for writer in writers {
        acknowledged.extend(writer.await.unwrap());
    }
    assert!(
        acknowledged.len() > 50,
        "load too small: {}",
        acknowledged.len()
    );
    eprintln!("{} writes acknowledged before SIGKILL", acknowledged.len());
    {
        let restarted = ServerProcess::start_in(&server.data_dir, &[]).expect("restart");
        let response = get(&restarted, "/v1/kv/load/?recurse").await;
        let index = index_of(&response);
        let entries: Value = response.json().await.unwrap();
        let stored: std::collections::HashMap<String, String> = common::values_by_key(&entries)
            .into_iter()
            .map(|(key, value)| (key, String::from_utf8(value).unwrap()))
            .collect();
        for key in &acknowledged {
            assert_eq!(
                stored.get(&format!("load/{key}")),
                Some(key),
                "lost acknowledged {key}"
            );
        }
        put(&restarted, "/v1/kv/after", "x").await;
        let after = index_of(&get(&restarted, "/v1/kv/after").await);
        assert!(after > index, "index went backwards: {after} <= {index}");
    }
    drop(temp);
}

/// Sessions come back after a restart (with fresh timers), and so do their locks.
#[tokio::test]
async fn sessions_and_locks_survive_restart() {
    let mut server = ServerProcess::start();
    let temp = server.take_temp();
    let session = create_session(&server, json!({"TTL": "30s"})).await;
    put(&server, &format!("/v1/kv/leader?acquire={session}"), "me").await;
    server.kill();
    let restarted = ServerProcess::start_in(&server.data_dir, &[]).expect("restart");
    let entries: Value = get(&restarted, "/v1/kv/leader").await.json().await.unwrap();
    assert_eq!(entries[0]["Session"], json!(session));
    let renewed = put(&restarted, &format!("/v1/session/renew/{session}"), "").await;
    assert_eq!(renewed.status(), 200);
    drop(temp);
}

/// A data file that is not a database stops the start with a message naming it.
#[tokio::test]
async fn corrupt_data_file_stops_the_start() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("data");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("leaderq.redb"), vec![0xAB; 4096]).unwrap();
    let err = ServerProcess::start_in(&dir, &[])
        .err()
        .expect("must not start");
    assert!(
        err.contains("leaderq.redb"),
        "message does not name the file: {err}"
    );
    assert_eq!(
        std::fs::read(dir.join("leaderq.redb")).unwrap(),
        vec![0xAB; 4096]
    );
}

/// SIGTERM stops the server promptly with exit code 0, even with a blocked query open.
#[tokio::test]
async fn sigterm_stops_cleanly_with_blocked_queries() {
    let mut server = ServerProcess::start();
    put(&server, "/v1/kv/k", "v").await;
    let index = index_of(&get(&server, "/v1/kv/k").await);
    let url = server.url(&format!("/v1/kv/k?index={index}&wait=5m"));
    let waiter = tokio::spawn(async move { client().get(url).send().await });
    wait_until_blocked(&server.addr, 1).await;
    let started = Instant::now();
    let status = server.terminate();
    assert!(status.success(), "exit status {status}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let answered = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answered.map(|r| r.status().as_u16()).unwrap_or(200), 200);
}
