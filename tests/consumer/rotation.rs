//! Leadership and queue controls on every backend's real servers (from the shared
//! harness; a backend whose server is missing is skipped, or fails the test under
//! LEADERQ_REQUIRE_SERVERS): rotate mode (`election.mode = "rotate"`) passes leadership
//! among real replicas every few tasks, every task runs once in `taskTime` order, and each
//! new term runs under a higher fencing token; the pause flag is set, read and cleared.

use leaderq::coord::{FencingToken, Version};

use super::*;

on_every_backend! {
    /// Rotate mode passes leadership around, each term under a higher token.
    #[tokio::test]
    fn rotate_mode_passes_leadership_around => rotate_mode_passes_leadership_around();
    /// The pause flag is set, read and cleared.
    #[tokio::test]
    fn pause_flag_is_set_read_and_cleared => pause_flag_is_set_read_and_cleared();
}

/// `leaderq pause` and `resume` through the seam: the flag is set once, shows in
/// `status`, and is cleared; on every backend.
async fn pause_flag_is_set_read_and_cleared(backend: &str) {
    use leaderq::operate::status;
    let Some(bed) = TestBed::on(backend) else {
        return;
    };
    // The operator's settings, for the flag's key.
    let settings = leaderq::config::Settings::load(None, bed.cluster.env()).expect("settings");
    let coord = bed.coord.as_ref();
    assert!(
        !status::status(coord, &settings.queue, &settings.election)
            .await
            .unwrap()
            .paused
    );
    assert!(
        !status::pause(coord, &settings.queue).await.unwrap(),
        "not paused before"
    );
    assert!(
        status::pause(coord, &settings.queue).await.unwrap(),
        "paused already"
    );
    assert!(
        status::status(coord, &settings.queue, &settings.election)
            .await
            .unwrap()
            .paused
    );
    assert!(status::resume(coord, &settings.queue).await.unwrap());
    assert!(
        !status::status(coord, &settings.queue, &settings.election)
            .await
            .unwrap()
            .paused
    );
    assert!(!status::resume(coord, &settings.queue).await.unwrap());
}

async fn rotate_mode_passes_leadership_around(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let journal = bed.journal.clone();
    let coord = bed.coord.clone();
    // Enqueued as `leaderq enqueue` does (one JVM per `zkCli.sh` would take longer than
    // the test).
    let tasks: Vec<leaderq::coord::Edit> = (0..15u64)
        .map(|n| leaderq::coord::Edit::Create {
            key: format!("oracleTask/task_{n:02}"),
            value: json!({"taskId": format!("r{n:02}"), "taskTime": 1000 + n, "taskType": "Work"})
                .to_string()
                .into_bytes(),
        })
        .collect();
    assert_eq!(
        coord.edit(&tasks).await.expect("enqueue"),
        leaderq::coord::Edited::Done
    );
    bed.settings = bed.settings.set("election", "mode", "\"rotate\"").set(
        "election",
        "rotate_after_tasks",
        "3",
    );
    for node in ["rot-a", "rot-b", "rot-c"] {
        bed.start_replica(node);
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;
    let runs: Vec<Vec<String>> = std::fs::read_to_string(&journal)
        .unwrap()
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|line| line[0] == "run")
        .collect();
    let ids: Vec<&str> = runs.iter().map(|line| line[1].as_str()).collect();
    let expected: Vec<String> = (0..15).map(|n| format!("r{n:02}")).collect();
    assert_eq!(ids, expected, "each task once, in taskTime order");
    let tokens: Vec<u64> = runs.iter().map(|line| line[2].parse().unwrap()).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "fencing tokens never fall: {tokens:?}"
    );
    let mut terms = tokens.clone();
    terms.dedup();
    assert!(
        terms.len() >= 5,
        "a term of at most 3 runs each: {terms:?} for {runs:?}"
    );
    for token in &terms {
        let in_term = tokens.iter().filter(|t| *t == token).count();
        assert!(in_term <= 3, "term {token} ran {in_term} tasks: {runs:?}");
    }
    let nodes: std::collections::HashSet<&str> = runs.iter().map(|line| line[3].as_str()).collect();
    assert!(
        nodes.len() >= 2,
        "leadership passed to another replica: {runs:?}"
    );
    // Leadership passes around, so it may be free between two terms: read the holder once
    // there is one.
    let holder = wait_until(
        Duration::from_secs(10),
        "a leader after the drain",
        async || {
            let (holder, _) = coord
                .observe(Version(0), Duration::ZERO)
                .await
                .map_err(|err| format!("{err}"))?;
            match holder.lease {
                Some(_) => Ok(holder),
                None => Err("no leader".to_string()),
            }
        },
    )
    .await;
    assert!(holder.token >= FencingToken(*terms.last().unwrap()));
}
