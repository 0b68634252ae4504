//! The producers' front door, `leaderq gateway`, as a real process on every backend's real
//! servers: 1,000 tasks in one request all land and a replica drains them; a replay of one
//! task answers the stored task and writes nothing; each bad input answers its 4xx and
//! writes nothing; a missing or wrong token is refused; hostile keys are refused; a task's
//! state is read back. Also `leaderq enqueue --stdin` with a bad line, the gateway refusing
//! an address off loopback without a token, and the Python snippet of docs/producers.md run
//! against a live gateway.

use std::process::{Command, Stdio};

use testkit::harness::{Cluster as _, Proc};

use super::*;

const TOKEN: &str = "gateway-token-0123456789abcdef";
const PREFIX: &str = "oracleTask/";

/// `leaderq gateway --listen 127.0.0.1:0` over `env` with [`TOKEN`]; the process and its
/// base URL.
fn start_gateway(env: &[(String, String)]) -> (Proc, String) {
    let mut command = Command::new(common::exe());
    command
        .args(["gateway", "--listen", "127.0.0.1:0"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("LEADERQ__GATEWAY__TOKEN", TOKEN)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut gateway = Proc::spawn("leaderq gateway", command).unwrap();
    let stdout = gateway.child().stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    let base = line
        .trim()
        .strip_prefix("gateway: ")
        .and_then(|url| url.strip_suffix("/v1/tasks"))
        .unwrap_or_else(|| panic!("no gateway line: {line:?}"))
        .to_string();
    (gateway, base)
}

/// A POST of `body` to the front door with the token and `key` as Idempotency-Key; the
/// status and the JSON answer.
async fn post(base: &str, key: Option<&str>, body: &str) -> (u16, Value) {
    let mut request = client()
        .post(format!("{base}/v1/tasks"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .header("Content-Type", "application/json")
        .body(body.to_string());
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status().as_u16();
    let text = answer.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, json)
}

/// The start of `answer`, for a failure's message (a bulk answer lists 1,000 tasks).
fn short(answer: &Value) -> String {
    answer.to_string().chars().take(600).collect()
}

/// Every key under the queue prefix, sorted.
async fn queued(coord: &dyn leaderq::coord::Coordinator) -> Vec<String> {
    let (names, _) = coord.keys(PREFIX).await.unwrap();
    let mut keys: Vec<String> = names.iter().collect();
    keys.sort();
    keys
}

on_every_backend! {
    /// The front door on this backend: tokens, validation, replays, hostile keys, a task's
    /// state, and 1,000 tasks in one request drained by a replica.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    fn the_front_door_enqueues_checks_and_refuses => front_door();
    /// `leaderq enqueue --stdin`: a bad line is reported and not written, the others are.
    #[tokio::test]
    fn enqueue_stdin_writes_the_good_lines_and_names_the_bad_one => enqueue_stdin();
}

async fn front_door(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let (_gateway, base) = start_gateway(&bed.cluster.env());
    let coord = bed.coord.clone();
    let task = r#"{"taskType": "Log", "taskTime": 1, "taskPara": {"n": 1}}"#;

    // No token: 401; another token (the dashboard's, say): 403; nothing written.
    let anonymous = client()
        .post(format!("{base}/v1/tasks"))
        .body(task)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    let wrong = client()
        .post(format!("{base}/v1/tasks"))
        .header("Authorization", "Bearer dashboard-token-0123456789abcdef")
        .body(task)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 403);
    let reading = client()
        .get(format!("{base}/v1/tasks/anything"))
        .send()
        .await
        .unwrap();
    assert_eq!(reading.status(), 401);

    // Each bad input: its 4xx, naming the field, and nothing written.
    let good = json!({"taskType": "Log", "taskTime": 1, "taskId": "fine"});
    let bad_inputs: Vec<(Option<&str>, String, u16, Option<&str>)> = vec![
        (None, "not json".into(), 400, None),
        (None, "[]".into(), 400, None),
        (None, "[3]".into(), 400, None),
        (
            None,
            json!({"taskTime": 1}).to_string(),
            422,
            Some("taskType"),
        ),
        (
            None,
            json!([good, {"taskType": "Log"}]).to_string(),
            422,
            Some("taskTime"),
        ),
        (
            None,
            json!([good, {"taskType": "Log", "taskTime": 1, "runAt": "when"}]).to_string(),
            422,
            Some("runAt"),
        ),
        (
            None,
            json!([good, {"taskType": "Log", "taskTime": 1, "maxAttempts": 0}]).to_string(),
            422,
            Some("maxAttempts"),
        ),
        (
            None,
            json!([good, {"taskType": "Log", "taskTime": 1, "taskPriority": "high"}]).to_string(),
            422,
            Some("taskPriority"),
        ),
        (
            None,
            json!([good, {"taskType": "Log", "taskTime": 1, "taskId": "fine"}]).to_string(),
            422,
            Some("taskId"),
        ),
        (
            None,
            json!({"taskType": "Log", "taskTime": 1, "taskPara": "x".repeat(2 << 20)}).to_string(),
            413,
            None,
        ),
        (
            Some("k"),
            json!([good]).to_string(),
            400,
            Some("Idempotency-Key"),
        ),
    ];
    for (key, body, status, field) in &bad_inputs {
        let (got, answer) = post(&base, *key, body).await;
        let shown: String = body.chars().take(80).collect();
        assert_eq!(got, *status, "{shown}: {answer}");
        if let Some(field) = field {
            assert_eq!(answer["field"], json!(field), "{shown}: {answer}");
        }
    }
    assert!(
        queued(coord.as_ref()).await.is_empty(),
        "a refused request wrote"
    );

    // Hostile keys: a dot segment, control characters, a key in another prefix.
    for hostile in [
        "..",
        "a/../../leaderq/pause",
        "x\ty",
        "leaderq/pause",
        "oracleTaskDead/x",
        "/oracleTask/x",
    ] {
        let (got, answer) = post(&base, Some(hostile), task).await;
        assert!(got == 400 || got == 422, "{hostile:?}: {got} {answer}");
        assert_eq!(answer["field"], json!("Idempotency-Key"), "{hostile:?}");
    }
    for hostile in ["a%2F%2E%2E%2Fb", "a%1Bb", "oracleTask%2F%2E%2E%2Fx"] {
        let answer = client()
            .get(format!("{base}/v1/tasks/{hostile}"))
            .header("Authorization", format!("Bearer {TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 400, "{hostile}");
    }
    assert!(
        queued(coord.as_ref()).await.is_empty(),
        "a hostile key wrote"
    );

    // One task under its Idempotency-Key; a replay (another body, even) answers the stored
    // task and writes nothing.
    let (status, answer) = post(&base, Some("order-17"), task).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["key"], json!("oracleTask/order-17"));
    let before = coord
        .get(&["oracleTask/order-17".to_string()])
        .await
        .unwrap();
    let replay = r#"{"taskType": "Log", "taskTime": 2, "taskPara": {"n": 2}}"#;
    let (status, answer) = post(&base, Some("order-17"), replay).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["created"], json!(false));
    assert_eq!(answer["value"]["taskPara"], json!({"n": 1}), "{answer}");
    assert_eq!(answer["state"], json!("pending"), "{answer}");
    let after = coord
        .get(&["oracleTask/order-17".to_string()])
        .await
        .unwrap();
    assert_eq!(before[0].version, after[0].version, "a replay wrote");
    assert_eq!(before[0].value, after[0].value);
    let shown: Value = client()
        .get(format!("{base}/v1/tasks/order-17"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown["key"], json!("oracleTask/order-17"), "{shown}");
    assert_eq!(shown["state"], json!("pending"), "{shown}");
    assert_eq!(shown["attempts"], json!(0), "{shown}");
    let missing = client()
        .get(format!("{base}/v1/tasks/oracleTask/none-such"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);

    // 1,000 tasks in one request, one of whose keys exists: 999 written, 1 refused.
    let mut tasks: Vec<Value> = (0..999)
        .map(|n| json!({"taskType": "Log", "taskTime": n, "taskId": format!("bulk{n:04}")}))
        .collect();
    tasks.push(json!({"taskType": "Log", "taskTime": 1, "taskId": "order-17"}));
    let body = Value::Array(tasks).to_string();
    let key_17 = "oracleTask/task_order-17";
    bed.produce("task_order-17", &json!({"taskType": "Log", "taskTime": 0}))
        .unwrap();
    let (status, answer) = post(&base, None, &body).await;
    assert_eq!(status, 200, "{}", short(&answer));
    assert_eq!(
        answer["written"].as_array().unwrap().len(),
        999,
        "{}",
        short(&answer)
    );
    assert_eq!(
        answer["refused"].as_array().unwrap().len(),
        1,
        "{}",
        short(&answer)
    );
    assert_eq!(
        answer["refused"][0]["key"],
        json!(key_17),
        "{}",
        short(&answer)
    );
    assert_eq!(queued(coord.as_ref()).await.len(), 1001);
    // The whole request again: a replay, nothing written.
    let (status, answer) = post(&base, None, &body).await;
    assert_eq!(status, 200, "{}", short(&answer));
    assert_eq!(answer["written"], json!([]), "{}", short(&answer));
    assert_eq!(answer["refused"].as_array().unwrap().len(), 1000);

    let settings = TestSettings::new(&bed.journal)
        .set("handlers.Log", "kind", "\"log\"")
        .set("queue", "claim_batch", "32");
    bed.start_replica_with("g1", &settings.toml("g1"));
    bed.wait_until_empty(PREFIX, Duration::from_secs(120)).await;
    let (dead, _) = coord.keys("oracleTaskDead/").await.unwrap();
    let dead: Vec<String> = dead.iter().collect();
    assert!(dead.is_empty(), "dead letters: {dead:?}");
}

async fn enqueue_stdin(backend: &str) {
    let Some(bed) = TestBed::on(backend) else {
        return;
    };
    let lines = [
        json!({"taskType": "Log", "taskTime": 1, "taskId": "one"}).to_string(),
        json!({"taskType": "Log", "taskTime": "soon", "taskId": "two"}).to_string(),
        String::new(),
        json!({"taskType": "Log", "taskTime": 3, "taskId": "three"}).to_string(),
    ];
    let mut child = bed
        .leaderq(&["enqueue", "--stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, lines.join("\n").as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("[line 2] refused (taskTime)"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("[line 1] enqueued oracleTask/task_one"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[line 4] enqueued oracleTask/task_three"),
        "{stdout}"
    );
    assert!(stdout.contains("enqueued 2 of 3 line(s)"), "{stdout}");
    assert_eq!(
        queued(bed.coord.as_ref()).await,
        ["oracleTask/task_one", "oracleTask/task_three"]
    );
}

/// `leaderq gateway` on an address that is not loopback refuses to start without a token,
/// naming the setting.
#[test]
fn gateway_off_loopback_refuses_to_start_without_a_token() {
    let output = Command::new(common::exe())
        .args(["gateway", "--listen", "0.0.0.0:0"])
        .env("CONSUL_HTTP_ADDR", "127.0.0.1:1")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("gateway.token") && stderr.contains("LEADERQ__GATEWAY__TOKEN"),
        "{stderr}"
    );
}

/// The Python snippet of docs/producers.md (stdlib only) enqueues against a live gateway:
/// one task, a replay, a bulk request, then reads a task's state.
#[tokio::test]
async fn the_python_snippet_enqueues_through_the_gateway() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: python3 is not installed; the Python snippet was not run");
        return;
    }
    let bed = TestBed::consul();
    let (_gateway, base) = start_gateway(&bed.cluster.env());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/producers/enqueue.py");
    let out = Command::new("python3")
        .arg(script)
        .env("LEADERQ_GATEWAY", &base)
        .env("LEADERQ_GATEWAY_TOKEN", TOKEN)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let keys = queued(bed.coord.as_ref()).await;
    assert!(
        keys.contains(&"oracleTask/order-1001".to_string()),
        "{keys:?}"
    );
    assert_eq!(keys.len(), 4, "{keys:?}\n{stdout}");
}
