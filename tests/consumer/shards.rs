//! A split queue (`election.shards`) with real processes on every backend's real servers:
//! three replicas share six shards two by two; tasks of 60 groups run on all of them, never
//! two of one task or one group at once, each once; a replica SIGKILLed and another frozen
//! past its lease lose their shards to the third; a fourth replica that joins while the
//! queue drains takes shards by handover; a deployment moved from 2 shards to 4 by a
//! rolling restart while tasks flow runs nothing twice at once and loses nothing; an
//! operator who deletes one shard's leader record, or revokes its lease, stops that shard's
//! runs before its next leader starts any, under a higher token, and loses nothing.

use std::collections::{BTreeMap, BTreeSet};

use leaderq::coord::{Edit, Edited, Version};

use super::*;
use toolbox::{assert_tokens_above, runs_in, Reaper, Run};

on_every_backend! {
    /// Three replicas, six shards: two each; every task once, no group twice at once.
    #[tokio::test]
    fn three_replicas_lead_two_shards_each => three_replicas_lead_two_shards_each();
    /// A killed replica's and a frozen one's shards move; no overlap in any shard.
    #[tokio::test]
    fn a_killed_and_a_frozen_replica_lose_their_shards => a_killed_and_a_frozen_replica_lose_their_shards();
    /// A fourth replica joining while the queue drains takes shards by handover.
    #[tokio::test]
    fn a_joining_replica_takes_shards_by_handover => a_joining_replica_takes_shards_by_handover();
    /// From 2 shards to 4 by a rolling restart, tasks flowing: no overlap, no loss.
    #[tokio::test]
    fn a_rolling_restart_moves_two_shards_to_four => a_rolling_restart_moves_two_shards_to_four();
    /// An operator deletes one shard's leader record: its run ends before the next starts.
    #[tokio::test]
    fn a_shards_leader_record_deleted_by_hand_stops_its_runs_first => lose_a_shard(Loss::DeleteRecord);
    /// An operator revokes one shard's lease: its run ends before the next starts.
    #[tokio::test]
    fn a_shards_lease_revoked_by_hand_stops_its_runs_first => lose_a_shard(Loss::RevokeLease);
}

const SHARDS: u32 = 6;
const GROUPS: u64 = 60;

/// The bed's settings with `shards` shards, two slots per replica, and a `Sharded` handler
/// journaling `start <taskId> <ns> <node> <pid> <token>`, sleeping `run_for`, then
/// `end <taskId> <ns> <node> <pid>`.
fn sharded(bed: &TestBed, shards: u32, run_for: &str) -> TestSettings {
    let j = bed.journal.display();
    bed.settings
        .clone()
        .set("election", "shards", &shards.to_string())
        .set("queue", "concurrency", "2")
        .handler(
            "Sharded",
            &format!("echo \"start $TASK_ID $(date +%s%N) $NODE $$ $LEADERQ_FENCING_TOKEN\" >> {j}; sleep {run_for}; echo \"end $TASK_ID $(date +%s%N) $NODE $$\" >> {j}"),
        )
}

/// `count` tasks from `from` on, over the 60 groups in turn: task `t<n>` in group `g<n % 60>`.
async fn enqueue(bed: &TestBed, from: u64, count: u64) {
    let tasks: Vec<Edit> = (from..from + count)
        .map(|n| Edit::Create {
            key: format!("oracleTask/task_{n:04}"),
            value: json!({"taskId": format!("t{n}"), "taskTime": 1000 + n, "taskType": "Sharded", "taskGroup": format!("g{}", n % GROUPS)})
                .to_string()
                .into_bytes(),
        })
        .collect();
    for chunk in tasks.chunks(30) {
        assert_eq!(bed.coord.edit(chunk).await.expect("enqueue"), Edited::Done);
    }
}

/// The group of task `t<n>`.
fn group_of(id: &str) -> String {
    let n: u64 = id.trim_start_matches('t').parse().unwrap();
    format!("g{}", n % GROUPS)
}

/// The shards each live replica says it leads, by node.
async fn led_shards(bed: &TestBed) -> BTreeMap<String, Vec<u32>> {
    let prefix = leaderq::leader::replicas::prefix("consumerLeader");
    let (stored, _) = bed
        .coord
        .list(&prefix, Version(0), Duration::ZERO)
        .await
        .unwrap_or_default();
    leaderq::leader::replicas::view(&stored, chrono::Utc::now())
        .into_iter()
        .filter(|view| view.status != "gone")
        .map(|view| {
            let shards = view.record.led_shards.iter().map(|led| led.shard).collect();
            (view.record.node, shards)
        })
        .collect()
}

/// Waits until the live replicas lead `want` shards each (sorted), every shard once.
async fn wait_for_shares(bed: &TestBed, want: &[usize], limit: Duration) {
    wait_until(limit, &format!("shares {want:?}"), async || {
        let led = led_shards(bed).await;
        let mut counts: Vec<usize> = led.values().map(Vec::len).collect();
        counts.sort();
        let mut all: Vec<u32> = led.values().flatten().copied().collect();
        all.sort();
        let every: Vec<u32> = (0..all.len() as u32).collect();
        if counts == want && all == every {
            Ok(())
        } else {
            Err(format!("{led:?}\n{}", bed.logs()))
        }
    })
    .await
}

/// What the journal shows, checked: every task in `0..count` ran to its end at least
/// once; no two runs of one task or one group overlapped; tokens never fell within a
/// shard (of `shards`) in start order. Answers the runs, for more checks.
fn check_runs(text: &str, count: u64, shards: &[u32], gone: &HashMap<u32, u128>) -> Vec<Run> {
    let mut runs = runs_in(text);
    // A run cut short (its replica killed, or frozen past its lease) ended when its shell
    // was seen gone.
    for run in runs.iter_mut().filter(|run| run.ended == 0) {
        run.ended = gone.get(&run.pid).copied().unwrap_or(0);
    }
    for n in 0..count {
        let id = format!("t{n}");
        assert!(
            runs.iter().any(|run| run.id == id && run.ended > 0),
            "t{n} ran to its end: {text}"
        );
    }
    let mut by_group: BTreeMap<String, Vec<&Run>> = BTreeMap::new();
    for run in &runs {
        by_group.entry(group_of(&run.id)).or_default().push(run);
    }
    for (group, mut own) in by_group {
        own.sort_by_key(|run| run.started);
        for pair in own.windows(2) {
            let end = if pair[0].ended == 0 {
                u128::MAX
            } else {
                pair[0].ended
            };
            assert!(
                end <= pair[1].started,
                "{} ({}) and {} ({}) of group {group} overlapped: {text}",
                pair[0].id,
                pair[0].node,
                pair[1].id,
                pair[1].node
            );
        }
    }
    for &count in shards {
        let mut tokens: BTreeMap<u32, Vec<(u128, u64)>> = BTreeMap::new();
        for run in &runs {
            let n: u64 = run.id.trim_start_matches('t').parse().unwrap();
            let key = format!("oracleTask/task_{n:04}");
            let shard = leaderq::task::shard::shard_of(&key, &group_of(&run.id), count);
            tokens
                .entry(shard)
                .or_default()
                .push((run.started, run.token));
        }
        if shards.len() == 1 {
            for (shard, mut seen) in tokens {
                seen.sort();
                for pair in seen.windows(2) {
                    assert!(
                        pair[0].1 <= pair[1].1,
                        "shard {shard}: token {} after {}: {text}",
                        pair[1].1,
                        pair[0].1
                    );
                }
            }
        }
    }
    runs
}

/// Starts the replicas `sa`, `sb` and `sc` with `settings`; once each leads two shards.
async fn three_sharing(bed: &mut TestBed, settings: &TestSettings) {
    for node in ["sa", "sb", "sc"] {
        bed.start_replica_with(node, &settings.toml(node));
    }
    wait_for_shares(bed, &[2, 2, 2], Duration::from_secs(60)).await;
}

async fn three_replicas_lead_two_shards_each(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let settings = sharded(&bed, SHARDS, "0.2");
    three_sharing(&mut bed, &settings).await;
    enqueue(&bed, 0, 120).await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(120))
        .await;
    let text = std::fs::read_to_string(&bed.journal).unwrap();
    let runs = check_runs(&text, 120, &[SHARDS], &HashMap::new());
    assert_eq!(runs.len(), 120, "every task once: {text}");
    for node in ["sa", "sb", "sc"] {
        assert!(
            runs.iter().any(|run| run.node == node),
            "{node} ran tasks of its shards: {text}"
        );
    }
}

async fn a_killed_and_a_frozen_replica_lose_their_shards(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    bed.own_group = true;
    let settings = sharded(&bed, SHARDS, "0.3");
    three_sharing(&mut bed, &settings).await;
    enqueue(&bed, 0, 120).await;
    wait_until(Duration::from_secs(30), "runs on every node", async || {
        let text = std::fs::read_to_string(&bed.journal).unwrap();
        let runs = runs_in(&text);
        let nodes: BTreeSet<&str> = runs.iter().map(|run| run.node.as_str()).collect();
        if nodes.len() == 3 {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;
    let reaper = Reaper::start(&bed.journal);
    bed.replica("sa").kill();
    let frozen = bed.replica("sb").pid();
    common::signal(frozen, "STOP");
    // The frozen replica's lease ends; its shards move to the one left, then it resumes:
    // whatever it was doing is refused, and its runs were killed by their supervisors.
    wait_until(
        Duration::from_secs(60),
        "sc leads every shard",
        async || {
            let led = led_shards(&bed).await;
            match led.get("sc") {
                Some(shards) if shards.len() == SHARDS as usize => Ok(()),
                _ => Err(format!("{led:?}\n{}", bed.logs())),
            }
        },
    )
    .await;
    common::signal(frozen, "CONT");
    bed.wait_until_empty("oracleTask/", Duration::from_secs(120))
        .await;
    let gone = reaper.stop();
    let text = std::fs::read_to_string(&bed.journal).unwrap();
    let runs = check_runs(&text, 120, &[SHARDS], &gone);
    // A task runs again only if the replica running it was killed or frozen.
    let mut seen = BTreeMap::<&str, Vec<&Run>>::new();
    for run in &runs {
        seen.entry(run.id.as_str()).or_default().push(run);
    }
    for (id, again) in seen.iter().filter(|(_, runs)| runs.len() > 1) {
        assert!(
            again[..again.len() - 1]
                .iter()
                .all(|run| run.node == "sa" || run.node == "sb"),
            "{id} ran again though its first run's replica was neither killed nor frozen: {text}"
        );
    }
}

async fn a_joining_replica_takes_shards_by_handover(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let settings = sharded(&bed, SHARDS, "0.2");
    three_sharing(&mut bed, &settings).await;
    enqueue(&bed, 0, 240).await;
    bed.start_replica_with("sd", &settings.toml("sd"));
    wait_for_shares(&bed, &[1, 1, 2, 2], Duration::from_secs(60)).await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(120))
        .await;
    let text = std::fs::read_to_string(&bed.journal).unwrap();
    let runs = check_runs(&text, 240, &[SHARDS], &HashMap::new());
    assert_eq!(runs.len(), 240, "a handover runs nothing twice: {text}");
    assert!(
        runs.iter().any(|run| run.node == "sd"),
        "the joining replica ran tasks of the shards handed to it: {text}"
    );
}

async fn a_rolling_restart_moves_two_shards_to_four(backend: &str) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let before = sharded(&bed, 2, "0.2");
    let after = sharded(&bed, 4, "0.2");
    for node in ["sa", "sb", "sc"] {
        bed.start_replica_with(node, &before.toml(node));
    }
    wait_for_shares(&bed, &[0, 1, 1], Duration::from_secs(60)).await;
    enqueue(&bed, 0, 90).await;
    // Each replica in turn: stopped (SIGTERM: it finishes its runs), started on 4 shards,
    // while the tasks flow.
    let mut next = 90;
    let mut stopped = Vec::new();
    for node in ["sa", "sb", "sc"] {
        let status = bed.replica(node).terminate();
        assert!(status.success(), "{node} stopped cleanly: {}", bed.logs());
        let at = bed
            .replicas
            .iter()
            .position(|replica| replica.node == node)
            .unwrap();
        // Its log, before the next process of that name writes its own.
        stopped.push(format!(
            "---- {node} (stopped)\n{}",
            bed.replicas.remove(at).log_text()
        ));
        bed.start_replica_with(node, &after.toml(node));
        enqueue(&bed, next, 30).await;
        next += 30;
    }
    wait_for_shares(&bed, &[1, 1, 2], Duration::from_secs(60)).await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(120))
        .await;
    let text = std::fs::read_to_string(&bed.journal).unwrap();
    // A stopped replica finished its runs first: each run journaled its end.
    let logs = format!("{}\n{}", stopped.join("\n"), bed.logs());
    let runs = std::panic::catch_unwind(|| check_runs(&text, next, &[2, 4], &HashMap::new()))
        .unwrap_or_else(|_| panic!("the runs above broke a rule; the replicas' logs:\n{logs}"));
    assert_eq!(runs.len() as u64, next, "nothing ran twice: {text}\n{logs}");
}

/// How an operator takes one shard's leadership away.
#[derive(Clone, Copy, Debug)]
enum Loss {
    DeleteRecord,
    RevokeLease,
}

/// Two replicas, two shards, one each; 5-second tasks. Once shard 0's leader runs one, an
/// operator takes that shard's leadership away by `loss`: the run is gone before that
/// shard's next run starts (it was cut, not let run to its end), which runs under a higher
/// token; every task runs to its end, none is dead-lettered, no group overlaps.
async fn lose_a_shard(backend: &str, loss: Loss) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    bed.own_group = true;
    let settings = sharded(&bed, 2, "5");
    for node in ["sa", "sb"] {
        bed.start_replica_with(node, &settings.toml(node));
    }
    wait_for_shares(&bed, &[1, 1], Duration::from_secs(60)).await;
    let reaper = Reaper::start(&bed.journal);
    enqueue(&bed, 0, 12).await;
    let shard_of = |run: &Run| {
        let n: u64 = run.id.trim_start_matches('t').parse().unwrap();
        let key = format!("oracleTask/task_{n:04}");
        leaderq::task::shard::shard_of(&key, &group_of(&run.id), 2)
    };
    let first = wait_until(Duration::from_secs(30), "a run in shard 0", async || {
        let text = std::fs::read_to_string(&bed.journal).unwrap();
        runs_in(&text)
            .into_iter()
            .find(|run| shard_of(run) == 0)
            .ok_or(text)
    })
    .await;
    let lost_at = common::now_ns();
    let key = "consumerLeader-shard-0-of-2";
    let done = match loss {
        Loss::DeleteRecord => bed.cluster.delete_leader_record(key).map(|_| true),
        Loss::RevokeLease => bed.cluster.revoke_leader_lease(key),
    };
    if !done.unwrap_or_else(|e| panic!("{loss:?}: {e}")) {
        eprintln!("{backend}: {loss:?} has no operator's tool; nothing to test");
        return;
    }
    wait_until(
        Duration::from_secs(20),
        &format!("{loss:?}: the run in shard 0 gone"),
        async || reaper.gone(first.pid).ok_or_else(|| bed.logs()),
    )
    .await;
    bed.wait_until_empty("oracleTask/", Duration::from_secs(120))
        .await;
    let gone = reaper.stop();
    let journal = std::fs::read_to_string(&bed.journal).unwrap();
    let text = format!("{journal}\n----\n{}", bed.logs());
    let (dead, _) = bed.coord.keys("oracleTaskDead/").await.expect("keys");
    assert!(
        dead.is_empty(),
        "{loss:?}: a lost leadership counted as a failure, {dead:?} dead-lettered: {text}"
    );
    assert!(
        !journal
            .lines()
            .any(|line| line.starts_with("end ") && line.ends_with(&format!(" {}", first.pid))),
        "{loss:?}: the run in shard 0 was not cut, it ran to its end: {text}"
    );
    let runs = check_runs(&journal, 12, &[2], &gone);
    let shard_0: Vec<&Run> = runs.iter().filter(|run| shard_of(run) == 0).collect();
    let cut_at = gone[&first.pid];
    for run in shard_0.iter().filter(|run| run.started > lost_at) {
        assert!(
            run.started >= cut_at,
            "{loss:?}: {} started in shard 0 before the cut run was gone: {text}",
            run.id
        );
    }
    assert_tokens_above(shard_0, &first, lost_at, &format!("{loss:?}"), &text);
}
