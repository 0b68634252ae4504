//! A cap on one task type with real processes on every backend's real servers: with
//! `queue.concurrency = 8`, 30 tasks of type `Capped` (at most 2 at once) and 30 of type
//! `Free`, each task in a group of its own: the handlers' journal never shows more than 2
//! `Capped` runs at once, and the `Free` ones are not held behind them (they run beside
//! them, more than 2 at once, and are all done before the capped ones are); meanwhile
//! `leaderq tasks list` says the waiting `Capped` tasks are capped.

use super::*;

on_every_backend! {
    /// A type's cap holds, and holds back no other type.
    #[tokio::test]
    fn a_types_cap_holds_and_holds_back_no_other_type => a_types_cap_holds_and_holds_back_no_other_type();
}

async fn a_types_cap_holds_and_holds_back_no_other_type(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let j = bed.journal.display().to_string();
    let journaled = format!(
        "echo \"start $TASK_ID $(date +%s%N) $TASK_TYPE\" >> {j}; sleep 0.2; echo \"end $TASK_ID $(date +%s%N) $TASK_TYPE\" >> {j}"
    );
    let config = TestSettings::new(&bed.journal)
        .set("queue", "concurrency", "8")
        .handler("Capped", &journaled)
        .set("handlers.Capped", "concurrency", "2")
        .handler("Free", &journaled)
        .toml("n1");
    // Capped tasks first in taskTime, so that only the cap lets the free ones by.
    let tasks: Vec<_> = (0..60u64)
        .map(|n| {
            let (kind, id) = if n < 30 {
                ("Capped", format!("c{n:02}"))
            } else {
                ("Free", format!("f{n:02}"))
            };
            leaderq::coord::Edit::Create {
                key: format!("oracleTask/{id}"),
                value: json!({"taskId": id, "taskTime": n, "taskType": kind, "taskGroup": id})
                    .to_string()
                    .into_bytes(),
            }
        })
        .collect();
    for chunk in tasks.chunks(30) {
        let written = bed.coord.edit(chunk).await.expect("enqueue");
        assert_eq!(written, leaderq::coord::Edited::Done);
    }
    bed.start_replica_with("n1", &config);
    // While two Capped run, `tasks list` says why the other Capped tasks wait, and
    // `status` counts them (both read the caps from the same settings file).
    let settings_file = bed.dir.path().join("caps.toml");
    std::fs::write(&settings_file, &config).unwrap();
    let settings_file = settings_file.display().to_string();
    let said = wait_until(
        Duration::from_secs(30),
        "tasks list saying capped",
        async || {
            let out = bed
                .leaderq(&["--config", &settings_file, "tasks", "list", "--json"])
                .output()
                .unwrap();
            let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let said = rows
                .as_array()
                .into_iter()
                .flatten()
                .filter(|row| row["task_type"] == "Capped")
                .find_map(|row| row["waits"].as_str().map(str::to_string));
            match said {
                Some(why) if why.starts_with("capped") => Ok(why),
                other => Err(other),
            }
        },
    )
    .await;
    assert_eq!(said, "capped (2 of 2 running)");
    bed.wait_until_empty("oracleTask/", Duration::from_secs(90))
        .await;
    // (kind, start, end) of every run.
    let mut runs: HashMap<String, (String, u128, u128)> = HashMap::new();
    for line in bed.journal() {
        let at: u128 = line[2].parse().unwrap();
        let run = runs
            .entry(line[1].clone())
            .or_insert((line[3].clone(), 0, 0));
        match line[0].as_str() {
            "start" => run.1 = at,
            _ => run.2 = at,
        }
    }
    assert_eq!(runs.len(), 60, "every task ran once: {:?}", bed.journal());
    let most_at_once = |kind: &str| {
        let own: Vec<&(String, u128, u128)> = runs.values().filter(|run| run.0 == kind).collect();
        own.iter()
            .map(|run| {
                own.iter()
                    .filter(|other| other.1 <= run.1 && run.1 < other.2)
                    .count()
            })
            .max()
            .unwrap_or(0)
    };
    let capped = most_at_once("Capped");
    assert!(capped <= 2, "at most 2 Capped runs at once, saw {capped}");
    let free = most_at_once("Free");
    assert!(
        free > 2,
        "Free runs were held behind the cap: at most {free} at once"
    );
    let last_end = |kind: &str| {
        runs.values()
            .filter(|run| run.0 == kind)
            .map(|run| run.2)
            .max()
            .unwrap_or(0)
    };
    assert!(
        last_end("Free") < last_end("Capped"),
        "the free type drained beside the capped one, not after it"
    );
}
