//! Rotate mode (`election.mode = "rotate"`) with real replicas on a real `leaderq server`:
//! leadership passes among the replicas every few tasks, every task runs once in
//! `taskTime` order, and each new term runs under a higher fencing token.

use super::*;

#[tokio::test]
async fn rotate_mode_passes_leadership_around_and_runs_each_task_once_in_order() {
    let mut bed = Bed::new();
    for n in 0..15u64 {
        bed.put_task(
            &format!("task_{n:02}"),
            json!({"taskId": format!("r{n:02}"), "taskTime": 1000 + n, "taskType": "Work"}),
        )
        .await;
    }
    for node in ["rot-a", "rot-b", "rot-c"] {
        let config = settings(&bed.journal, bed.ttl)
            .replace("$NODE", node)
            .replace(
                "[election]\n",
                "[election]\nmode = \"rotate\"\nrotate_after_tasks = 3\n",
            );
        let replica = ConsumerProcess::start(&bed.server.addr, node, bed.dir.path(), &config);
        bed.replicas.push(replica);
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;
    let runs: Vec<Vec<String>> = bed
        .journal()
        .into_iter()
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
    let nodes: std::collections::HashSet<&str> = runs.iter().map(|line| line[3].as_str()).collect();
    assert!(
        nodes.len() >= 2,
        "leadership passed to another replica: {runs:?}"
    );
    for token in &terms {
        let in_term = tokens.iter().filter(|t| *t == token).count();
        assert!(in_term <= 3, "term {token} ran {in_term} tasks: {runs:?}");
    }
}
