//! Priority with real processes on every backend's real servers: behind a backlog of
//! 1,000 tasks, a task with `taskPriority = 10` enqueued last is the first to start, and
//! a type's own `priority` puts its tasks before earlier ones of other types.

use super::*;

on_every_backend! {
    /// A task of higher priority, enqueued last, starts first.
    #[tokio::test]
    fn a_higher_priority_enqueued_last_starts_first => a_higher_priority_enqueued_last_starts_first();
}

async fn a_higher_priority_enqueued_last_starts_first(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let j = bed.journal.display().to_string();
    let config = TestSettings::new(&bed.journal)
        .handler(
            "Report",
            &format!("echo \"run $TASK_ID x $NODE $LEADERQ_ATTEMPT\" >> {j}"),
        )
        .set("handlers.Report", "priority", "3")
        .toml("n1");
    let task = |id: String, time: u64, kind: &str| leaderq::coord::Edit::Create {
        key: format!("oracleTask/{id}"),
        value: json!({"taskId": id, "taskTime": time, "taskType": kind})
            .to_string()
            .into_bytes(),
    };
    // In writes of 50, within every coordinator's transaction limits.
    let backlog: Vec<_> = (0..1000u64)
        .map(|n| task(format!("t{n:04}"), n, "Work"))
        .collect();
    for chunk in backlog.chunks(50) {
        let written = bed.coord.edit(chunk).await.expect("enqueue the backlog");
        assert_eq!(written, leaderq::coord::Edited::Done);
    }
    let report = task("report".into(), 5000, "Report");
    let urgent = leaderq::coord::Edit::Create {
        key: "oracleTask/urgent".into(),
        value:
            json!({"taskId": "urgent", "taskTime": 9999, "taskType": "Work", "taskPriority": 10})
                .to_string()
                .into_bytes(),
    };
    for edit in [report, urgent] {
        let written = bed.coord.edit(&[edit]).await.expect("enqueue");
        assert_eq!(written, leaderq::coord::Edited::Done);
    }
    bed.start_replica_with("n1", &config);
    bed.wait_journal(Duration::from_secs(60), "three runs", |journal| {
        journal.len() >= 3
    })
    .await;
    let first: Vec<String> = bed
        .journal()
        .iter()
        .take(3)
        .map(|line| line[1].clone())
        .collect();
    assert_eq!(first, ["urgent", "report", "t0000"], "{}", bed.logs());
}
