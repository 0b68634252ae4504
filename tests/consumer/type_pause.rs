//! Pausing one task type with real processes on every backend's real servers: with
//! `leaderq pause --type Held`, the leader starts no `Held` task while the other type
//! drains; the pause survives a failover (the leader SIGKILLed, a standby taking over);
//! `leaderq status` names the paused type; and `leaderq resume --type Held` releases its
//! tasks, noticed well within a listing's wait (a minute here).

use super::*;

on_every_backend! {
    /// A paused type starts nothing, through a failover, until resumed.
    #[tokio::test]
    fn a_paused_type_starts_nothing_through_a_failover_until_resumed => a_paused_type_starts_nothing_through_a_failover_until_resumed();
}

async fn a_paused_type_starts_nothing_through_a_failover_until_resumed(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let j = bed.journal.display().to_string();
    let settings = TestSettings::new(&bed.journal)
        .set(backend, "wait", "\"60s\"")
        .handler(
            "Held",
            &format!("echo \"run $TASK_ID x $NODE $LEADERQ_ATTEMPT\" >> {j}"),
        );
    let said = leaderq(&bed, &["pause", "--type", "Held"]);
    assert!(said.contains("Held paused"), "{said}");
    let tasks: Vec<_> = (0..6u64)
        .map(|n| {
            let kind = if n % 2 == 0 { "Held" } else { "Work" };
            let id = format!("{}{n}", kind.to_lowercase());
            leaderq::coord::Edit::Create {
                key: format!("oracleTask/{id}"),
                value: json!({"taskId": id, "taskTime": n, "taskType": kind})
                    .to_string()
                    .into_bytes(),
            }
        })
        .collect();
    let written = bed.coord.edit(&tasks).await.expect("enqueue");
    assert_eq!(written, leaderq::coord::Edited::Done);
    let ran = |journal: &[Vec<String>], prefix: &str| {
        journal
            .iter()
            .filter(|line| line[1].starts_with(prefix))
            .count()
    };
    bed.start_replica_with("p1", &settings.toml("p1"));
    bed.wait_journal(
        Duration::from_secs(30),
        "the other type drained",
        |journal| ran(journal, "work") == 3,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(ran(&bed.journal(), "held"), 0, "a paused type ran");
    let status = leaderq(&bed, &["status"]);
    assert!(status.contains("paused types:  Held"), "{status}");
    let list = leaderq(&bed, &["tasks", "list"]);
    let paused = list
        .lines()
        .filter(|line| line.starts_with("paused"))
        .count();
    assert_eq!(paused, 3, "{list}");

    // The pause is the coordinator's: the next leader keeps it.
    bed.start_replica_with("p2", &settings.toml("p2"));
    assert_eq!(bed.leader(Duration::from_secs(30)).await, "p1");
    bed.replica("p1").kill();
    bed.leader_other_than("p1", Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        ran(&bed.journal(), "held"),
        0,
        "a paused type ran after a failover"
    );

    let said = leaderq(&bed, &["resume", "--type", "Held"]);
    assert!(said.contains("Held resumed"), "{said}");
    bed.wait_journal(Duration::from_secs(15), "the resumed type ran", |journal| {
        ran(journal, "held") == 3
    })
    .await;
}

/// `leaderq ARGS` against the bed's coordinator, which must succeed; its stdout.
fn leaderq(bed: &TestBed, args: &[&str]) -> String {
    let out = bed.leaderq(args).output().expect("run leaderq");
    assert!(out.status.success(), "leaderq {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).to_string()
}
