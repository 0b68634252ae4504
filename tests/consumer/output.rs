//! Kept output with real processes on every backend's real servers: a handler that prints
//! to stdout and stderr, fails its first run and succeeds its second, leaves both runs'
//! output readable through `leaderq tasks show KEY --output` once its task is gone; a
//! handler that prints more than `queue.output_limit` leaves only the end of it; a dead
//! letter shows its runs' output, and `tasks purge-dead` deletes it.

use super::*;

on_every_backend! {
    /// Each run's stdout and stderr are kept with its attempt, and only the last
    /// `output_limit` bytes of a stream that printed more; purged with its dead letter.
    #[tokio::test]
    fn each_attempts_output_is_kept_and_capped => each_attempts_output_is_kept_and_capped();
}

async fn each_attempts_output_is_kept_and_capped(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let chatty = "echo \"out of run $LEADERQ_ATTEMPT\"; echo \"err of run $LEADERQ_ATTEMPT\" >&2; \
                  test \"$LEADERQ_ATTEMPT\" -ge 2";
    // 5000 'x' then END on stdout; the cap keeps the last 1000 bytes.
    let loud = "head -c 5000 /dev/zero | tr '\\0' x; echo END; echo quiet >&2";
    let config = TestSettings::new(&bed.journal)
        .set("queue", "output_limit", "1000")
        .handler("Chatty", chatty)
        .handler("Loud", loud)
        .handler("Doomed", "echo \"doomed $LEADERQ_ATTEMPT\" >&2; exit 1")
        .toml("n1");
    let tasks: Vec<_> = [("chatty", "Chatty"), ("loud", "Loud"), ("doomed", "Doomed")]
        .iter()
        .map(|(name, kind)| leaderq::coord::Edit::Create {
            key: format!("oracleTask/{name}"),
            value: json!({"taskId": name, "taskTime": 1, "taskType": kind})
                .to_string()
                .into_bytes(),
        })
        .collect();
    assert_eq!(
        bed.coord.edit(&tasks).await.expect("enqueue"),
        leaderq::coord::Edited::Done
    );
    bed.start_replica_with("n1", &config);
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;

    let shown = show_output(&bed, "chatty");
    for line in [
        "attempt 1",
        "out of run 1",
        "err of run 1",
        "attempt 2",
        "out of run 2",
        "err of run 2",
    ] {
        assert!(
            shown.contains(line),
            "no {line:?} in:\n{shown}\n{}",
            bed.logs()
        );
    }
    assert!(
        shown.find("out of run 1") < shown.find("out of run 2"),
        "attempts out of order:\n{shown}"
    );

    let shown = show_output(&bed, "oracleTask/loud");
    let xs = shown.matches('x').count();
    assert!(
        shown.contains("xEND") && (900..=1000).contains(&xs),
        "{xs} x shown, not the last 1000 bytes:\n{shown}"
    );
    assert!(shown.contains("quiet"), "{shown}");
    assert!(
        shown.contains("4004 bytes before"),
        "no word of the cut:\n{shown}"
    );

    // A dead letter shows its runs' output (found through its originalKey); purged, it
    // takes them with it, and leaves nothing behind (on ZooKeeper, the task's znode).
    let shown = show_output(&bed, "oracleTaskDead/doomed");
    for attempt in 1..=3 {
        assert!(shown.contains(&format!("doomed {attempt}")), "{shown}");
    }
    let purged = bed
        .leaderq(&["tasks", "purge-dead", "--yes"])
        .output()
        .unwrap();
    assert!(purged.status.success(), "{purged:?}");
    let gone = bed
        .leaderq(&["tasks", "show", "doomed", "--output"])
        .output()
        .unwrap();
    assert!(
        !gone.status.success() && String::from_utf8_lossy(&gone.stderr).contains("no task"),
        "{gone:?}"
    );
    let left = bed
        .coord
        .keys("leaderq/output/oracleTask/")
        .await
        .unwrap()
        .0;
    let left: Vec<String> = left.iter().collect();
    assert!(left.iter().all(|key| !key.contains("doomed")), "{left:?}");
}

/// `leaderq tasks show KEY --output`, which must succeed; its stdout.
fn show_output(bed: &TestBed, key: &str) -> String {
    let output = bed
        .leaderq(&["tasks", "show", key, "--output"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "tasks show {key} --output: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}
