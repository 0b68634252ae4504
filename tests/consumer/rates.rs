//! A rate on one task type with real processes on every backend's real servers: type
//! `Rated` at `5/2s`, 20 tasks, two replicas, the leader SIGKILLed after its first starts:
//! no 2 s window of the handlers' journal holds more than 5 starts, across both leaders
//! (the new leader reads the starts its predecessor recorded), and every task runs.

use super::*;

on_every_backend! {
    /// A type's rate holds through a failover.
    #[tokio::test]
    fn a_types_rate_holds_through_a_failover => a_types_rate_holds_through_a_failover();
}

async fn a_types_rate_holds_through_a_failover(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let j = bed.journal.display().to_string();
    let journaled = format!("echo \"start $TASK_ID $(date +%s%N) $NODE\" >> {j}; sleep 0.1");
    let settings = TestSettings::new(&bed.journal)
        .handler("Rated", &journaled)
        .set("handlers.Rated", "rate", "\"5/2s\"");
    let tasks: Vec<_> = (0..20u64)
        .map(|n| {
            let id = format!("r{n:02}");
            leaderq::coord::Edit::Create {
                key: format!("oracleTask/{id}"),
                value: json!({"taskId": id, "taskTime": n, "taskType": "Rated"})
                    .to_string()
                    .into_bytes(),
            }
        })
        .collect();
    let written = bed.coord.edit(&tasks).await.expect("enqueue");
    assert_eq!(written, leaderq::coord::Edited::Done);
    bed.start_replica_with("n1", &settings.toml("n1"));
    assert_eq!(bed.leader(Duration::from_secs(30)).await, "n1");
    bed.start_replica_with("n2", &settings.toml("n2"));
    bed.wait_journal(Duration::from_secs(30), "six starts", |journal| {
        journal.len() >= 6
    })
    .await;
    bed.replica("n1").kill();
    bed.leader_other_than("n1", Duration::from_secs(30)).await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(90))
        .await;

    let journal = bed.journal();
    let mut ids: Vec<&str> = journal.iter().map(|line| line[1].as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20, "every task ran: {journal:?}");
    assert!(
        journal.iter().any(|line| line[3] == "n2"),
        "the second leader ran some: {journal:?}"
    );
    let starts: Vec<u128> = journal
        .iter()
        .map(|line| line[2].parse().unwrap())
        .collect();
    let window = 2_000_000_000u128;
    for at in &starts {
        let within = starts
            .iter()
            .filter(|other| **other >= *at && **other < *at + window)
            .count();
        assert!(
            within <= 5,
            "{within} starts within 2 s of {at}: {journal:?}"
        );
    }
}
