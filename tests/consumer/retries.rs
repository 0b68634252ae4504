//! Retry policy per task type with real processes on every backend's real servers: a
//! type whose `max_attempts` is 1 is dead-lettered at its first failure while another
//! type's task is retried up to the queue's three runs, and a task's own `maxAttempts`
//! beats its type's.

use super::*;

on_every_backend! {
    /// Each type, and each task that asks, gets its own number of runs.
    #[tokio::test]
    fn each_type_and_task_gets_its_own_number_of_attempts => each_type_and_task_gets_its_own_number_of_attempts();
}

async fn each_type_and_task_gets_its_own_number_of_attempts(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let j = bed.journal.display().to_string();
    let fail = format!("echo \"fail $TASK_ID x $NODE $LEADERQ_ATTEMPT\" >> {j}; exit 1");
    // The queue's max_attempts is 3 (TestSettings).
    let config = TestSettings::new(&bed.journal)
        .handler("DropTableSpace", &fail)
        .set("handlers.DropTableSpace", "max_attempts", "1")
        .handler("CreateIndex", &fail)
        .toml("n1");
    let mut tasks = Vec::new();
    for (name, id, kind, asked) in [
        ("drop", "drop", "DropTableSpace", None),
        ("index", "index", "CreateIndex", None),
        ("drop_twice", "drop-twice", "DropTableSpace", Some("2")),
    ] {
        let mut task = json!({"taskId": id, "taskTime": 1, "taskType": kind});
        if let Some(asked) = asked {
            task["maxAttempts"] = json!(asked);
        }
        tasks.push(leaderq::coord::Edit::Create {
            key: format!("oracleTask/{name}"),
            value: task.to_string().into_bytes(),
        });
    }
    assert_eq!(
        bed.coord.edit(&tasks).await.expect("enqueue"),
        leaderq::coord::Edited::Done
    );
    bed.start_replica_with("n1", &config);
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;
    let mut runs: Vec<String> = bed
        .journal()
        .iter()
        .map(|line| format!("{}#{}", line[1], line[4]))
        .collect();
    runs.sort();
    assert_eq!(
        runs,
        [
            "drop#1",
            "drop-twice#1",
            "drop-twice#2",
            "index#1",
            "index#2",
            "index#3"
        ],
        "{}",
        bed.logs()
    );
    let (dead, _) = bed
        .coord
        .list(
            "oracleTaskDead/",
            leaderq::coord::Version(0),
            Duration::ZERO,
        )
        .await
        .expect("list the dead letters");
    let attempts = |key: &str| -> Value {
        let letter = dead
            .iter()
            .find(|letter| letter.key == format!("oracleTaskDead/{key}"))
            .unwrap_or_else(|| panic!("no dead letter {key}: {dead:?}"));
        serde_json::from_slice::<Value>(&letter.value).unwrap()["attempts"].clone()
    };
    assert_eq!(attempts("drop"), 1);
    assert_eq!(attempts("drop_twice"), 2);
    assert_eq!(attempts("index"), 3);
}
