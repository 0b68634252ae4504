//! Leadership lost at the coordinator, by an operator's hand, on every backend's real
//! servers: the leader record deleted while the leader's lease lives on (`curl -X DELETE`,
//! `etcdctl del`, `redis-cli DEL`, `zkCli.sh delete` of the latch), and the lease itself
//! ended (Consul: session destroyed; etcd: lease revoked; Redis: lease key deleted). Each
//! time the old leader's run is stopped at once, the other replica starts nothing before
//! that run is gone (one run at a time, across the two leaders), its fencing token is
//! higher, and every task still runs to its end. And the renewals alone stalled (the
//! coordinator answers claims but not keep-alives): the leader stops claiming while its
//! lease can still outlast a whole kill sequence, the run its kill window cuts goes back
//! without using an attempt, and the next leader runs it; nothing is dead-lettered.

use super::*;
use toolbox::{assert_tokens_above, first_run, runs_in, Reaper};

on_every_backend! {
    /// A deleted leader record stops the run before the next leader starts one.
    #[tokio::test]
    fn a_deleted_leader_record_stops_the_run_before_the_next_leader_starts_one => lose_leadership(Loss::DeleteRecord);
    /// A revoked lease stops the run before the next leader starts one.
    #[tokio::test]
    fn a_revoked_lease_stops_the_run_before_the_next_leader_starts_one => lose_leadership(Loss::RevokeLease);
    /// Stalled renewals cost no attempt and dead-letter nothing.
    #[tokio::test]
    fn stalled_renewals_cost_no_attempt_and_dead_letter_nothing => lose_leadership(Loss::StallRenewals);
    /// A run ending cleanly as its record is deleted is not run again.
    #[tokio::test]
    fn a_run_ending_cleanly_as_its_record_is_deleted_is_not_run_again => lose_leadership(Loss::DeleteRecordCleanEnd);
    /// A run ending cleanly as its lease is revoked is not run again.
    #[tokio::test]
    fn a_run_ending_cleanly_as_its_lease_is_revoked_is_not_run_again => lose_leadership(Loss::RevokeLeaseCleanEnd);
}

#[derive(Clone, Copy, Debug)]
enum Loss {
    DeleteRecord,
    RevokeLease,
    /// The leader's keep-alives time out while its claims still go through, until
    /// another replica leads.
    StallRenewals,
    /// As `DeleteRecord` and `RevokeLease`, with a handler that exits 0 on SIGTERM: a
    /// clean end is an end, recorded by the replica whose run it was, never run again.
    DeleteRecordCleanEnd,
    RevokeLeaseCleanEnd,
}

impl Loss {
    fn clean_end(self) -> bool {
        matches!(self, Loss::DeleteRecordCleanEnd | Loss::RevokeLeaseCleanEnd)
    }
}

/// The file whose existence stalls `node`'s renewals.
fn stall_file(dir: &Path, node: &str) -> PathBuf {
    dir.join(format!("{node}.stall-renewals"))
}

/// Two replicas, one run at a time, one attempt per task (a stop counted as a failure
/// dead-letters the task); `l00` runs 8 s, `s01`..`s03` 0.2 s each. Once the leader runs
/// `l00`, its leadership is lost by `loss`. The stall runs with the settings (TTL
/// 6 s, `kill_grace` 3 s), where a leader that kept claiming saw each run cut at once.
async fn lose_leadership(backend: &str, loss: Loss) {
    let Some(mut bed) = TestBed::on(backend) else {
        return;
    };
    let journal = bed.journal.clone();
    let dir = bed.dir.path().to_path_buf();
    let coord = bed.coord.clone();
    for node in ["la", "lb"] {
        let j = journal.display();
        let end = format!("echo \\\"end $TASK_ID $(date +%s%N) {node} $$\\\" >> {j}");
        let run = |secs: &str| {
            let body = if loss.clean_end() {
                // On SIGTERM: journal the end and exit 0, a clean end.
                format!("trap '{end}; exit 0' TERM; sleep {secs} & wait $!")
            } else {
                format!("sleep {secs}")
            };
            format!(
                "echo \\\"start $TASK_ID $(date +%s%N) {node} $$ $LEADERQ_FENCING_TOKEN\\\" >> {j}; {body}; {end}"
            )
        };
        let base = match loss {
            Loss::StallRenewals => {
                TestSettings::new(&journal)
                    .ttl("6s")
                    .set("queue", "kill_grace", "\"3s\"")
            }
            _ => TestSettings::new(&journal),
        };
        let config = base.set("queue", "max_attempts", "1").toml(node)
            + &format!(
                "\n[handlers.Long]\nkind = \"exec\"\ncommand = [\"sh\", \"-c\", \"{}\"]\n[handlers.Short]\nkind = \"exec\"\ncommand = [\"sh\", \"-c\", \"{}\"]\n",
                run("8"),
                run("0.2")
            );
        bed.env = vec![(
            leaderq::leader::faults::STALL_RENEWALS_ENV.into(),
            stall_file(&dir, node).display().to_string(),
        )];
        bed.start_replica_with(node, &config);
    }
    let (cluster, replicas) = (&bed.cluster, &bed.replicas);
    let tasks: Vec<leaderq::coord::Edit> = (0..4u64)
        .map(|n| {
            let (id, kind) = if n == 0 {
                ("l00".to_string(), "Long")
            } else {
                (format!("s{n:02}"), "Short")
            };
            leaderq::coord::Edit::Create {
                key: format!("oracleTask/task_{n:02}"),
                value: json!({"taskId": id, "taskTime": 1000 + n, "taskType": kind})
                    .to_string()
                    .into_bytes(),
            }
        })
        .collect();
    assert_eq!(
        coord.edit(&tasks).await.expect("enqueue"),
        leaderq::coord::Edited::Done
    );
    let first = first_run(&journal, replicas).await;
    assert_eq!(first.id, "l00");
    // A cut run's end is when its shell is seen gone: watched from before the loss, as the
    // operator's tool may take a while to return (zkCli.sh starts a JVM).
    let reaper = Reaper::start(&journal);
    let lost_at = now_ns();
    let done = match loss {
        Loss::DeleteRecord | Loss::DeleteRecordCleanEnd => {
            cluster.delete_leader_record("consumerLeader").map(|_| true)
        }
        Loss::RevokeLease | Loss::RevokeLeaseCleanEnd => {
            cluster.revoke_leader_lease("consumerLeader")
        }
        Loss::StallRenewals => std::fs::write(stall_file(&dir, &first.node), "")
            .map(|_| true)
            .map_err(|e| e.to_string()),
    };
    if !done.unwrap_or_else(|e| panic!("{loss:?}: {e}")) {
        eprintln!("{backend}: {loss:?} has no operator's tool; nothing to test");
        return;
    }
    // The operator's tool may take a while (zkCli.sh starts a JVM): the loss happened
    // between `lost_at` and now.
    let returned_at = now_ns();
    // The old leader's run is gone (its shell seen dead) long before its 8 s are up; the
    // reaper's thread, not this poll, says when.
    let left =
        Duration::from_secs(6).saturating_sub(Duration::from_nanos((now_ns() - lost_at) as u64));
    let gone_at = wait_until(
        left,
        &format!("{loss:?}: the old leader's run gone"),
        async || reaper.gone(first.pid).ok_or_else(|| replicas[0].log_text()),
    )
    .await;
    eprintln!(
        "{backend} {loss:?}: the old leader's run was gone {} ms after the loss began ({} ms after the operator's tool returned)",
        (gone_at - lost_at) / 1_000_000,
        gone_at.saturating_sub(returned_at) / 1_000_000
    );
    if let Loss::StallRenewals = loss {
        // The stall lasts until the other replica leads; then the first may renew again.
        // Until then the first may lead again on a new lease, whose renewals stall too.
        bed.leader_other_than(&first.node, Duration::from_secs(60))
            .await;
        std::fs::remove_file(stall_file(&dir, &first.node)).unwrap();
    }
    bed.wait_until_empty("oracleTask/", Duration::from_secs(60))
        .await;
    let replicas = &bed.replicas;
    let journal_text = std::fs::read_to_string(&journal).unwrap();
    let logs: Vec<String> = replicas.iter().map(|r| r.log_text()).collect();
    // What a failure shows: the journal, then both replicas' logs.
    let text = format!("{journal_text}\n----\n{}", logs.join("\n----\n"));
    let (dead, _) = coord.keys("oracleTaskDead/").await.expect("keys");
    assert!(
        dead.is_empty(),
        "{loss:?}: a stop for the leadership or the lease was counted as a failure, {dead:?} dead-lettered: {text}"
    );
    let mut runs = runs_in(&journal_text);
    let gone = reaper.stop();
    for run in runs.iter_mut().filter(|r| r.ended == 0) {
        // Cut runs: the first, and under stalled renewals any the same replica ran after
        // it led again on a new lease (a campaign is not a renewal) and cut in turn.
        let cut =
            run.pid == first.pid || (matches!(loss, Loss::StallRenewals) && run.node == first.node);
        assert!(cut, "only the cut runs have no end: {text}");
        run.ended = *gone
            .get(&run.pid)
            .unwrap_or_else(|| panic!("{}'s cut run never ended: {text}", run.id));
    }
    for id in ["l00", "s01", "s02", "s03"] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("end {id} "))),
            "{id} never ran to its end: {text}"
        );
    }
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            assert!(
                !(a.started < b.ended && b.started < a.ended),
                "{loss:?}: {} on {} and {} on {} overlapped: {text}",
                a.id,
                a.node,
                b.id,
                b.node
            );
        }
    }
    if loss.clean_end() {
        let l00 = runs.iter().filter(|r| r.id == "l00").count();
        assert_eq!(
            l00, 1,
            "{loss:?}: a run that ended cleanly ran again: {text}"
        );
    }
    assert_tokens_above(&runs, &first, lost_at, &format!("{loss:?}"), &text);
}

mod restart {
    use super::*;

    // A leader SIGKILLed mid-run and started again at once on its data dir takes its lease
    // up again; if another replica leads meanwhile, the claim that lease still holds must
    // not keep the queue waiting for as long as the restarted replica keeps it alive.
    on_every_backend! {
        /// A leader restarted at once does not keep the queue waiting on its old claim.
        #[tokio::test]
        fn a_leader_restarted_at_once_keeps_no_claim_waiting => restart_at_once();
    }

    async fn restart_at_once(backend: &str) {
        let Some(mut bed) = TestBed::on(backend) else {
            return;
        };
        let journal = bed.journal.clone();
        let config = |node: &str| {
            let j = journal.display();
            TestSettings::new(&journal).toml(node)
                + &format!(
                    "\n[handlers.Long]\nkind = \"exec\"\ncommand = [\"sh\", \"-c\", \"echo \\\"start $TASK_ID $(date +%s%N) {node} $$ $LEADERQ_FENCING_TOKEN\\\" >> {j}; sleep 8; echo \\\"end $TASK_ID $(date +%s%N) {node}\\\" >> {j}\"]\n[handlers.Short]\nkind = \"exec\"\ncommand = [\"sh\", \"-c\", \"echo \\\"start $TASK_ID $(date +%s%N) {node} $$ $LEADERQ_FENCING_TOKEN\\\" >> {j}; echo \\\"end $TASK_ID $(date +%s%N) {node}\\\" >> {j}\"]\n"
                )
        };
        for node in ["ra", "rb"] {
            bed.start_replica_with(node, &config(node));
        }
        let tasks: Vec<leaderq::coord::Edit> = (0..3u64)
            .map(|n| leaderq::coord::Edit::Create {
                key: format!("oracleTask/task_{n:02}"),
                value: json!({"taskId": format!("t{n}"), "taskTime": 1000 + n, "taskType": if n == 0 { "Long" } else { "Short" }})
                    .to_string()
                    .into_bytes(),
            })
            .collect();
        bed.coord.edit(&tasks).await.expect("enqueue");
        let first = first_run(&journal, &bed.replicas).await;
        let index = bed
            .replicas
            .iter()
            .position(|r| r.node == first.node)
            .unwrap();
        common::signal(bed.replicas[index].pid(), "KILL");
        bed.replicas[index].kill();
        // Its log is kept: the restarted one logs beside it.
        let node = first.node.clone();
        let dir = bed.dir.path();
        let log = dir.join(format!("{node}.log"));
        std::fs::rename(&log, dir.join(format!("{node}.0.log"))).unwrap();
        bed.replicas.remove(index);
        bed.start_replica_with(&node, &config(&node));
        bed.wait_until_empty("oracleTask/", Duration::from_secs(45))
            .await;
    }

    // A replica that takes its lease up again after a restart and stands by (another
    // replica leads) puts back the claims that lease still holds: the leader starts
    // nothing while a task is held by a live lease, and the standby keeps it alive. The
    // previous process is played by the test itself through the seam, so the standby's
    // position is not left to a race. ZooKeeper never hands a session to a new process.
    mod standby {
        use super::*;

        on_every_backend! {
            [consul, etcd, redis] {
                /// A standby that reuses a lease holding a claim puts the claim back.
                #[tokio::test]
                fn a_standby_reusing_a_lease_puts_its_claim_back => standby_reuses_a_lease_holding_a_claim();
            }
        }
    }

    async fn standby_reuses_a_lease_holding_a_claim(backend: &str) {
        let Some(mut bed) = TestBed::on(backend) else {
            return;
        };
        let journal = bed.journal.clone();
        let coord = bed.coord.clone();
        let key = "oracleTask/task_held".to_string();
        let created = coord
            .edit(&[leaderq::coord::Edit::Create {
                key: key.clone(),
                value: json!({"taskId": "held", "taskTime": 1, "taskType": "Work"})
                    .to_string()
                    .into_bytes(),
            }])
            .await
            .expect("enqueue");
        assert_eq!(created, leaderq::coord::Edited::Done);
        // The previous process of "ra": a lease of its own, a claim under its leadership,
        // then leadership given up while the lease lives on.
        let spec = leaderq::coord::LeaseSpec {
            node_id: "ra".into(),
            ttl: Duration::from_secs(3),
            takeover_delay: Duration::from_millis(200),
            previous: None,
        };
        let lease = coord.open_lease(&spec).await.expect("open lease").lease;
        let renewer = {
            let (coord, lease) = (coord.clone(), lease.clone());
            tokio::spawn(async move {
                loop {
                    let _ = coord.keep_alive(&lease).await;
                    // Renews the 3 s lease well within its TTL, as its process would.
                    tokio::time::sleep(RENEW_EVERY).await;
                }
            })
        };
        let record = leaderq::coord::HolderRecord {
            node: "ra".into(),
            session: lease.0.clone(),
            ..Default::default()
        };
        let leaderq::coord::Campaign::Won(leadership) =
            coord.campaign(&lease, &record).await.expect("campaign")
        else {
            panic!("the previous process did not lead");
        };
        let task = coord
            .get(std::slice::from_ref(&key))
            .await
            .expect("get")
            .remove(0);
        let claimed = json!({"taskId": "held", "taskTime": 1, "taskType": "Work", "taskTaken": true,
            "takenBy": {"session": lease.0, "node": "ra"}, "takenAt": "2026-01-01T00:00:00Z"});
        let written = coord
            .write(
                &leadership,
                &[leaderq::coord::TaskOp::Claim {
                    key: key.clone(),
                    version: task.version,
                    value: claimed.to_string().into_bytes(),
                }],
            )
            .await
            .expect("claim");
        assert!(
            matches!(written, leaderq::coord::Written::Done { .. }),
            "{written:?}"
        );
        coord.resign(&lease).await.expect("resign");

        let config = |node: &str| settings_for(&journal, node);
        bed.start_replica_with("rb", &config("rb"));
        let limit = Duration::from_secs(20);
        wait_until(limit, "rb leads", async || match bed.leader(limit).await {
            node if node == "rb" => Ok(()),
            node => Err(node),
        })
        .await;
        // "ra" starts again on its data dir, takes its lease up and stands by.
        let dir = bed.dir.path().to_path_buf();
        std::fs::create_dir_all(dir.join("ra")).unwrap();
        std::fs::write(dir.join("ra").join("session"), &lease.0).unwrap();
        bed.start_replica_with("ra", &config("ra"));
        wait_until(
            Duration::from_secs(10),
            "ra took its lease up",
            async || {
                let log = bed.replicas[1].log_text();
                // The leader's own line, on every backend ("session" is Consul's word alone).
                if log.contains("reusing the lease from before the restart") {
                    Ok(())
                } else {
                    Err(log)
                }
            },
        )
        .await;
        renewer.abort();
        bed.wait_until_empty("oracleTask/", Duration::from_secs(30))
            .await;
        assert!(std::fs::read_to_string(&journal)
            .unwrap()
            .contains("run held"));
    }

    /// How often the test renews the lease it plays the previous process with (TTL 3 s).
    const RENEW_EVERY: Duration = Duration::from_millis(500);

    fn settings_for(journal: &Path, node: &str) -> String {
        TestSettings::new(journal).toml(node)
    }
}
