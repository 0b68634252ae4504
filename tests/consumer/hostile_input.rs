//! Hostile input at the edges of the CLI and the consumer: ids and keys that try to leave
//! the queue's prefixes, crafted dead letters, keys and error texts that try to forge log
//! lines, and output into a pipe whose reader went away.

use std::process::{Command, Stdio};

use super::*;

/// Every key on the server.
async fn all_keys(bed: &Bed) -> Vec<String> {
    let response = client()
        .get(bed.cluster.url("/v1/kv/?keys"))
        .send()
        .await
        .unwrap();
    response.json().await.unwrap()
}

async fn put_raw(bed: &Bed, key: &str, value: &str) {
    let response = client()
        .put(bed.cluster.url(&format!("/v1/kv/{key}")))
        .body(value.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.text().await.unwrap(), "true", "PUT {key}");
}

fn stderr_of(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `enqueue --id` with a traversal, a slash, an empty id or a control character is refused
/// with one line and exit code 2, and so is a task file with such a taskId; nothing is
/// written anywhere.
#[tokio::test]
async fn enqueue_refuses_ids_that_would_leave_the_queue_prefix() {
    let bed = Bed::new();
    for id in [
        "x/../../evil",
        "../evil",
        "..",
        "a/b",
        "",
        "a\nb",
        " x",
        "a%2F..%2Fevil",
    ] {
        let output = leaderq(&bed, &["enqueue", "--type", "Work", "--id", id]);
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(2), "--id {id:?}: {stderr}");
        assert!(stderr.contains("--id"), "--id {id:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
    let file = bed.dir.path().join("evil.json");
    std::fs::write(
        &file,
        r#"{"taskId":"../../evil","taskType":"Work","taskTime":1}"#,
    )
    .unwrap();
    let output = leaderq(&bed, &["enqueue", file.to_str().unwrap()]);
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("taskId"), "{stderr}");

    assert_eq!(all_keys(&bed).await, Vec::<String>::new());

    let good = leaderq(&bed, &["enqueue", "--type", "Work", "--id", "ok-1.2_x"]);
    assert!(good.status.success(), "{}", stderr_of(&good));
    assert_eq!(all_keys(&bed).await, ["oracleTask/task_ok-1.2_x"]);
}

/// `tasks show` never reads outside the queue and dead-letter prefixes, however the key is
/// spelled.
#[tokio::test]
async fn tasks_show_refuses_keys_outside_the_prefixes() {
    let bed = Bed::new();
    put_raw(&bed, "consumerLeader", "leader-secret").await;
    put_raw(
        &bed,
        "oracleTask/task_a",
        r#"{"taskType":"Work","taskTime":1}"#,
    )
    .await;
    for key in [
        "../consumerLeader",
        "oracleTask/../consumerLeader",
        "oracleTaskDead/../consumerLeader",
        "consumerLeader",
        "/consumerLeader",
        "./../consumerLeader",
    ] {
        let output = leaderq(&bed, &["tasks", "show", key]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(!output.status.success(), "show {key:?}: {stdout}");
        assert!(!stdout.contains("leader-secret"), "show {key:?}: {stdout}");
    }
    let refused = leaderq(&bed, &["tasks", "show", "../consumerLeader"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr_of(&refused));
    let shown = leaderq(&bed, &["tasks", "show", "task_a"]);
    assert!(shown.status.success(), "{}", stderr_of(&shown));
    assert!(String::from_utf8_lossy(&shown.stdout).contains("oracleTask/task_a"));
}

/// A crafted dead letter whose originalKey lies outside the queue prefix (or is not a valid
/// key in it) is never retried: `tasks retry` refuses, nothing is written, the dead letter
/// stays.
#[tokio::test]
async fn tasks_retry_refuses_a_dead_letter_whose_original_key_leaves_the_queue_prefix() {
    let bed = Bed::new();
    let crafted = [
        ("task_e1", "evil"),
        ("task_e2", "oracleTask/../evil2"),
        ("task_e3", "oracleTaskDead/evil3"),
        ("task_e4", "oracleTask/"),
        ("task_e5", "oracleTask/a\nb"),
    ];
    for (name, original) in crafted {
        let record = json!({"taskType": "Work", "taskTime": 1, "deadReason": "crafted",
                            "originalKey": original});
        put_raw(&bed, &format!("oracleTaskDead/{name}"), &record.to_string()).await;
    }
    for (name, original) in crafted {
        let output = leaderq(&bed, &["tasks", "retry", name]);
        let stderr = stderr_of(&output);
        assert!(!output.status.success(), "retry {name} ({original:?})");
        assert!(stderr.contains("originalKey"), "{stderr}");
    }
    let mut keys = all_keys(&bed).await;
    keys.sort();
    let expected: Vec<String> = crafted
        .iter()
        .map(|(name, _)| format!("oracleTaskDead/{name}"))
        .collect();
    assert_eq!(keys, expected, "something was written or removed");
}

/// Output into a pipe whose reader is gone (`leaderq tasks list | head -1`) ends the
/// command quietly with the status of a SIGPIPE death (141), not a panic.
#[tokio::test]
async fn cli_output_into_a_closed_pipe_exits_quietly() {
    let bed = Bed::new();
    for n in 0..20 {
        bed.put_task(
            &format!("task_{n}"),
            json!({"taskId": n, "taskTime": n, "taskType": "Work"}),
        )
        .await;
    }
    for args in [
        &["tasks", "list"][..],
        &["tasks", "list", "--json"],
        &["tasks", "show", "task_1"],
        &["status"],
        &["enqueue", "--type", "Work"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leaderq"))
            .args(args)
            .env("CONSUL_HTTP_ADDR", &bed.cluster.addr)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before the command writes anything.
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        let stderr = stderr_of(&output);
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
        assert_eq!(output.status.code(), Some(141), "{args:?}: {stderr}");
    }
    let piped = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' tasks list | head -1",
            env!("CARGO_BIN_EXE_leaderq")
        ))
        .env("CONSUL_HTTP_ADDR", &bed.cluster.addr)
        .output()
        .unwrap();
    assert!(stderr_of(&piped).is_empty(), "{}", stderr_of(&piped));
    assert!(String::from_utf8_lossy(&piped.stdout).starts_with("STATE"));
}

/// A task key with a newline or an escape sequence, and a handler error text with both,
/// reach the consumer's log escaped, on the event's own line: nothing forges a line.
#[tokio::test]
async fn control_characters_in_keys_and_errors_do_not_forge_log_lines() {
    let mut bed = Bed::new();
    let config = bed.settings.toml("r1")
        + r#"
[handlers.Forge]
kind = "exec"
command = ["sh", "-c", "printf 'boom\\nFORGED-ERROR line\\n\\033[31mred' >&2; exit 1"]
"#;
    bed.replicas.push(ConsumerProcess::start(
        &bed.cluster.addr,
        "r1",
        bed.dir.path(),
        &config,
    ));
    let task = json!({"taskType": "Work", "taskTime": 1}).to_string();
    put_raw(
        &bed,
        "oracleTask/x%0AFORGED-KEY%20INFO%20leaderq:%20all%20good",
        &task,
    )
    .await;
    put_raw(&bed, "oracleTask/y%1B%5B31mred", &task).await;
    bed.put_task("task_f", json!({"taskType": "Forge", "taskTime": 2}))
        .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(30))
        .await;

    let log = bed.replicas[0].log_text();
    assert!(log.contains("FORGED-KEY"), "{log}");
    assert!(log.contains("FORGED-ERROR"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "raw escape sequence in the log:\n{log}"
    );
    for line in log.lines() {
        assert!(
            line.starts_with(|c: char| c.is_ascii_digit()),
            "a line that is not an event of its own:\n{line}\n\nlog:\n{log}"
        );
    }
}

/// A task under a key that leaderq could not address safely (a newline, a `..` segment) is
/// not run: it moves to the dead-letter prefix under a valid key, with the reason.
#[tokio::test]
async fn a_task_under_an_invalid_key_is_dead_lettered_under_a_valid_key() {
    let mut bed = Bed::new();
    bed.start_replica("r1");
    let task = json!({"taskId": "bad", "taskType": "Work", "taskTime": 1}).to_string();
    put_raw(&bed, "oracleTask/x%0Ay", &task).await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(20))
        .await;
    assert!(bed.journal().is_empty(), "ran: {:?}", bed.journal());
    let dead = bed.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let (key, letter) = dead.into_iter().next().unwrap();
    let name = key.strip_prefix("oracleTaskDead/").unwrap();
    assert!(
        name.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)),
        "{key:?}"
    );
    assert_eq!(letter["originalKey"], "oracleTask/x\ny");
    assert!(
        letter["deadReason"].as_str().unwrap().contains("key"),
        "{letter}"
    );
}
