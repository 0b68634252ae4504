//! `leaderq run -- COMMAND` with real processes on every backend's real servers (from the
//! shared harness; a backend whose server is not installed is skipped, or fails the test
//! under LEADERQ_REQUIRE_SERVERS): one command alive at a time across three replicas, a
//! SIGKILLed leader's command dies with it and another replica's starts under a higher
//! fencing token, `--restart`, the exit status, a graceful stop on SIGTERM, and `--every`
//! ticks run once each and caught up under each `--catch-up` through a frozen and a killed
//! leader.

use std::process::{Child, Command, Stdio};

use testkit::harness;

use super::*;

on_every_backend! {
    /// One command at a time across three replicas; a SIGKILLed leader's command dies.
    #[tokio::test]
    fn one_command_at_a_time_and_a_killed_leaders_command_dies_with_it => one_command_at_a_time("KILL");
    /// A SIGSTOPped leader's command is killed before another replica's starts.
    #[tokio::test]
    fn a_frozen_leaders_command_is_killed_before_another_starts => one_command_at_a_time("STOP");
    /// `--restart on-failure` reruns until success; the command's status is not passed on.
    #[tokio::test]
    fn restart_on_failure_reruns_until_success_and_never_passes_the_status_on => restart_and_status();
    /// SIGTERM stops the command and hands leadership over.
    #[tokio::test]
    fn sigterm_stops_the_command_and_hands_over => sigterm_hands_over();
    /// `--every` runs each tick once through a killed leader.
    #[tokio::test]
    fn every_runs_each_tick_once_through_a_killed_leader => every_tick_once();
    /// `--catch-up all` runs every tick missed through a freeze and a kill, once each.
    #[tokio::test]
    fn every_catches_up_all_missed_ticks_through_a_freeze_and_a_kill => every_catches_up("all");
    /// `--catch-up latest` runs the latest missed tick late and names each one it skipped.
    #[tokio::test]
    fn every_catches_up_the_latest_missed_tick_and_names_the_skipped_ones => every_catches_up("latest");
    /// `--catch-up none` names each missed tick it skipped.
    #[tokio::test]
    fn every_with_no_catch_up_names_each_skipped_tick => every_catches_up("none");
}

/// A child that journals `start <token> <pid> <ns>`, then `beat <token> <ns>` every 20 ms
/// while it lives.
const BEATING: &str = r#"j="$JOURNAL"; echo "start $LEADERQ_FENCING_TOKEN $$ $(date +%s%N) $LEADERQ_NAME $LEADERQ_LEADER_ID" >> "$j"; while true; do echo "beat $LEADERQ_FENCING_TOKEN $(date +%s%N)" >> "$j"; sleep 0.02; done"#;

/// `leaderq run` replicas on one backend's servers, with a journal their commands write.
struct Runs {
    bed: TestBed,
}

impl Runs {
    /// A cluster of `backend`; `None` (the test skips) if its server is not installed.
    fn new(backend: &str) -> Option<Runs> {
        Some(Runs {
            bed: TestBed::on(backend)?,
        })
    }

    /// `leaderq run --name NAME <flags> -- sh -c SCRIPT`, replica `n`.
    fn start(&self, n: usize, flags: &[&str], script: &str) -> Child {
        Command::new(env!("CARGO_BIN_EXE_leaderq"))
            .args(["run", "--name", "job", "--data-dir"])
            .arg(self.bed.dir.path().join(format!("r{n}")))
            .args(flags)
            .args(["--pass-env", "JOURNAL", "--", "sh", "-c", script])
            .envs(self.bed.cluster.env())
            .env("LEADERQ__ELECTION__LEASE_TTL", "2s")
            .env("LEADERQ__ELECTION__LOCK_DELAY", "200ms")
            .env("LEADERQ__ELECTION__RETRY_INTERVAL", "100ms")
            .env("LEADERQ__QUEUE__KILL_GRACE", "200ms")
            .env("JOURNAL", &self.bed.journal)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.bed.dir.path().join(format!("r{n}.log"))).unwrap())
            .spawn()
            .expect("spawn leaderq run")
    }

    fn lines(&self) -> Vec<Vec<String>> {
        self.bed.journal()
    }

    fn starts(&self) -> Vec<Vec<String>> {
        self.lines()
            .into_iter()
            .filter(|l| l[0] == "start")
            .collect()
    }

    async fn wait_for_starts(&self, count: usize, limit: Duration) -> Vec<Vec<String>> {
        wait_until(limit, &format!("{count} starts"), async || {
            let starts = self.starts();
            if starts.len() >= count {
                Ok(starts)
            } else {
                Err(self.lines())
            }
        })
        .await
    }
}

fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z "))
}

/// How long the standbys must start nothing while a leader runs its command: each
/// contends every retry interval (100 ms), so one that wrongly started would by then.
const STANDBYS_QUIET: Duration = Duration::from_millis(500);
/// How long after a new command's start a beat of the old one written late would show.
const LATE_BEAT: Duration = Duration::from_millis(300);
/// Time for a just started standby to be waiting on the leadership: it exposes no signal.
const STANDBY_SETTLES: Duration = Duration::from_millis(500);

async fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    wait_until(limit, "leaderq run exits", async || {
        child.try_wait().unwrap().ok_or("running")
    })
    .await
}

/// Three replicas: one command runs; SIGKILL of its `leaderq run` kills it, another
/// replica's starts with a higher token, and at no moment did two commands beat at once.
async fn one_command_at_a_time(backend: &str, hit: &str) {
    let Some(runs) = Runs::new(backend) else {
        return;
    };
    let mut replicas: Vec<Child> = (0..3).map(|n| runs.start(n, &[], BEATING)).collect();
    let first = runs.wait_for_starts(1, Duration::from_secs(30)).await;
    // Asserts that nothing happens: no standby starts a command of its own meanwhile.
    tokio::time::sleep(STANDBYS_QUIET).await;
    assert_eq!(
        runs.starts().len(),
        1,
        "only the leader runs it: {:?}",
        runs.lines()
    );
    assert_eq!(first[0][4], "job");
    // Whose command is it? The replica whose process is the command's grandparent.
    let command_pid = first[0][2].clone();
    let supervisor = harness::parent_of(command_pid.parse().unwrap()).unwrap();
    let leader_pid = harness::parent_of(supervisor).unwrap();
    let leader = replicas
        .iter()
        .position(|r| r.id() == leader_pid)
        .expect("the command runs under one of the replicas");
    if hit == "KILL" {
        replicas[leader].kill().unwrap();
        let _ = replicas[leader].wait();
    } else {
        // Frozen, `leaderq run` renews nothing: its supervisor must kill the command
        // before the lease could end, before any other replica may start its own.
        common::signal(leader_pid, hit);
    }
    let starts = runs.wait_for_starts(2, Duration::from_secs(30)).await;
    assert!(
        !alive(&command_pid),
        "the {hit} leader's command outlived its lease"
    );
    let (old, new) = (&starts[0], &starts[1]);
    let old_token: u64 = old[1].parse().unwrap();
    let new_token: u64 = new[1].parse().unwrap();
    assert!(new_token > old_token, "tokens {old_token} then {new_token}");
    // Asserts that nothing happens: a beat of the old command written late would show here.
    tokio::time::sleep(LATE_BEAT).await;
    let new_start_ns: u128 = new[3].parse().unwrap();
    let last_old_beat: u128 = runs
        .lines()
        .iter()
        .filter(|l| l[0] == "beat" && l[1] == old[1])
        .map(|l| l[2].parse().unwrap())
        .max()
        .unwrap();
    assert!(
        last_old_beat < new_start_ns,
        "the old command beat {} ns after the new one started",
        last_old_beat - new_start_ns
    );
    assert_eq!(runs.starts().len(), 2, "{:?}", runs.lines());
    if hit == "STOP" {
        // Woken, it finds its leadership gone and exits 75 (`--on-loss exit`).
        common::signal(leader_pid, "CONT");
        let status = wait_exit(&mut replicas[leader], Duration::from_secs(20)).await;
        assert_eq!(status.code(), Some(75));
        assert_eq!(runs.starts().len(), 2, "{:?}", runs.lines());
    }
    for (n, replica) in replicas.iter_mut().enumerate() {
        if n != leader {
            replica.kill().unwrap();
            let _ = replica.wait();
        }
    }
}

/// `--restart on-failure`: a command that fails runs again (under a new leadership, a
/// higher token) until it succeeds; then `leaderq run` exits 0. `--restart never` exits
/// with the command's own status.
async fn restart_and_status(backend: &str) {
    let Some(runs) = Runs::new(backend) else {
        return;
    };
    let flaky = r#"echo "start $LEADERQ_FENCING_TOKEN $$ $(date +%s%N)" >> "$JOURNAL"; if [ -f "$JOURNAL.once" ]; then exit 0; fi; touch "$JOURNAL.once"; exit 3"#;
    let mut replica = runs.start(0, &["--restart", "on-failure"], flaky);
    let status = wait_exit(&mut replica, Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0));
    let starts = runs.starts();
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert!(starts[1][1].parse::<u64>().unwrap() > starts[0][1].parse::<u64>().unwrap());

    let mut replica = runs.start(1, &[], "exit 7");
    assert_eq!(
        wait_exit(&mut replica, Duration::from_secs(30))
            .await
            .code(),
        Some(7)
    );
}

/// SIGTERM to the leading `leaderq run`: its command gets SIGTERM, and `leaderq run`
/// exits with the command's status (143 for a shell killed by SIGTERM) after giving
/// leadership up, so a standby starts its command at once.
async fn sigterm_hands_over(backend: &str) {
    let Some(runs) = Runs::new(backend) else {
        return;
    };
    let mut a = runs.start(0, &[], BEATING);
    runs.wait_for_starts(1, Duration::from_secs(30)).await;
    let mut b = runs.start(1, &[], BEATING);
    // The standby has no signal of its own for "standing by" that the test can read; the
    // handover is checked either way (its start is awaited below), this only gives it the
    // time to be waiting when the leader goes.
    tokio::time::sleep(STANDBY_SETTLES).await;
    let command_pid = runs.starts()[0][2].clone();
    common::signal(a.id(), "TERM");
    let status = wait_exit(&mut a, Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(143));
    assert!(!alive(&command_pid), "the command outlived leaderq run");
    let starts = runs.wait_for_starts(2, Duration::from_secs(10)).await;
    assert!(starts[1][1].parse::<u64>().unwrap() > starts[0][1].parse::<u64>().unwrap());
    b.kill().unwrap();
    let _ = b.wait();
}

/// `--every 1s` on two replicas: only the leader runs the command, once per tick (the tick
/// in LEADERQ_TICK); the leader SIGKILLed, the other one goes on from the latest tick. No
/// tick runs twice, ticks only rise, and both replicas ran some.
async fn every_tick_once(backend: &str) {
    let Some(runs) = Runs::new(backend) else {
        return;
    };
    let script = r#"echo "tick $LEADERQ_TICK $LEADERQ_LEADER_ID $$" >> "$JOURNAL""#;
    let mut children: Vec<Child> = (1..=2)
        .map(|n| runs.start(n, &["--every", "1s", "--on-loss", "rerun"], script))
        .collect();
    let ticks = |runs: &Runs| -> Vec<(String, String)> {
        runs.lines()
            .into_iter()
            .filter(|l| l.len() == 4 && l[0] == "tick")
            .map(|l| (l[1].clone(), l[2].clone()))
            .collect()
    };
    wait_until(Duration::from_secs(30), "3 ticks", async || {
        if ticks(&runs).len() >= 3 {
            Ok(())
        } else {
            Err(runs.lines())
        }
    })
    .await;
    let first = ticks(&runs)[0].1.clone();
    let index = (1..=2)
        .position(|n| runs.node(n) == first)
        .expect("the leader's replica");
    let _ = children[index].kill();
    let _ = children[index].wait();
    wait_until(
        Duration::from_secs(30),
        "3 ticks on the other replica",
        async || {
            let after = ticks(&runs).into_iter().filter(|(_, node)| *node != first);
            if after.count() >= 3 {
                Ok(())
            } else {
                Err(runs.lines())
            }
        },
    )
    .await;
    let survivor = &mut children[1 - index];
    common::signal(survivor.id(), "TERM");
    let _ = survivor.wait();
    let all = ticks(&runs);
    let mut seen: Vec<&String> = all.iter().map(|(tick, _)| tick).collect();
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "ticks ran twice or out of order: {all:?}"
    );
    seen.dedup();
    assert_eq!(seen.len(), all.len(), "a tick ran twice: {all:?}");
}

/// A command for `--every`: journals `start <tick> <node> <ns>`, then a `beat <tick> <ns>`
/// every 100 ms for 300 ms, then `end <tick> <ns>`; a run cut short has no `end`.
const TICK_RUN: &str = r#"j="$JOURNAL"; echo "start $LEADERQ_TICK $LEADERQ_LEADER_ID $(date +%s%N)" >> "$j"; for i in 1 2 3; do sleep 0.1; echo "beat $LEADERQ_TICK $(date +%s%N)" >> "$j"; done; echo "end $LEADERQ_TICK $(date +%s%N)" >> "$j""#;

/// How long no replica leads in [`every_catches_up`]: the leader SIGKILLed while the
/// other is frozen; three ticks fall meanwhile, so `latest` and `none` skip at least two.
const OUTAGE: Duration = Duration::from_secs(3);

/// What a replica logs for each tick it skips (the test reads its `tick=` field).
const SKIPPED_LINE: &str = "a tick was skipped";

/// One run of [`TICK_RUN`]: its tick (epoch seconds), its node, when it started and when
/// it was last seen alive (its last line), in ns.
#[derive(Debug)]
struct TickRun {
    tick: i64,
    node: String,
    started: u128,
    last_seen: u128,
}

/// Epoch seconds of a tick as `LEADERQ_TICK` or a log's `tick=` field writes it; ticks of
/// `--every 1s` are whole seconds.
fn tick_seconds(text: &str) -> i64 {
    let at =
        chrono::DateTime::parse_from_rfc3339(text).unwrap_or_else(|e| panic!("tick {text:?}: {e}"));
    assert_eq!(
        at.timestamp_subsec_millis(),
        0,
        "tick {text} is not a whole second"
    );
    at.timestamp()
}

impl Runs {
    /// The runs of [`TICK_RUN`] journaled so far, in the order they started.
    fn tick_runs(&self) -> Vec<TickRun> {
        let lines = self.lines();
        let mut runs: Vec<TickRun> = lines
            .iter()
            .filter(|l| l.len() == 4 && l[0] == "start")
            .map(|l| TickRun {
                tick: tick_seconds(&l[1]),
                node: l[2].clone(),
                started: l[3].parse().unwrap(),
                last_seen: l[3].parse().unwrap(),
            })
            .collect();
        for line in lines
            .iter()
            .filter(|l| l.len() == 3 && (l[0] == "beat" || l[0] == "end"))
        {
            let (tick, at): (i64, u128) = (tick_seconds(&line[1]), line[2].parse().unwrap());
            for run in runs.iter_mut().filter(|r| r.tick == tick) {
                run.last_seen = run.last_seen.max(at);
            }
        }
        runs.sort_by_key(|r| r.started);
        runs
    }

    /// The node id replica `n` keeps in its data dir.
    fn node(&self, n: usize) -> String {
        std::fs::read_to_string(self.bed.dir.path().join(format!("r{n}")).join("node-id"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// Replica `n`'s log.
    fn log(&self, n: usize) -> String {
        std::fs::read_to_string(self.bed.dir.path().join(format!("r{n}.log"))).unwrap_or_default()
    }

    /// The ticks replica `n`'s log names as skipped.
    fn skipped(&self, n: usize) -> Vec<i64> {
        self.log(n)
            .lines()
            .filter(|line| line.contains(SKIPPED_LINE))
            .filter_map(|line| {
                line.split_whitespace()
                    .find_map(|f| f.strip_prefix("tick="))
            })
            .map(tick_seconds)
            .collect()
    }

    /// Waits until `node` has started a run of a tick after `after` (any tick: `None`), and
    /// `count` such runs in all; the latest of them.
    async fn wait_for_runs_of(&self, node: &str, after: Option<i64>, count: usize) -> TickRun {
        wait_until(
            Duration::from_secs(30),
            &format!("{count} runs of {node} after tick {after:?}"),
            async || {
                let mut mine: Vec<TickRun> = self
                    .tick_runs()
                    .into_iter()
                    .filter(|r| r.node == node && after.is_none_or(|a| r.tick > a))
                    .collect();
                if mine.len() >= count {
                    Ok(mine.pop().unwrap())
                } else {
                    Err((self.lines(), self.log(0), self.log(1)))
                }
            },
        )
        .await
    }
}

/// `--every 1s --catch-up <catch_up>` on two replicas through two failovers: the leader
/// frozen (SIGSTOP) mid-run past its lease, so the other takes over; that one SIGKILLed
/// mid-run while the first is still frozen, so no replica leads for [`OUTAGE`]; then the
/// first woken (SIGCONT) into the outage leads again. Every tick from the first run to the
/// last either ran once or (not with `all`) was skipped and named in the log of the
/// replica that skipped it, never both; no tick ran twice, ticks ran in order, and no run
/// started before the one before it was last seen alive.
async fn every_catches_up(backend: &str, catch_up: &str) {
    let Some(runs) = Runs::new(backend) else {
        return;
    };
    let flags = [
        "--every",
        "1s",
        "--catch-up",
        catch_up,
        "--on-loss",
        "rerun",
    ];
    let mut children: Vec<Child> = (0..2).map(|n| runs.start(n, &flags, TICK_RUN)).collect();
    let leading = wait_until(Duration::from_secs(30), "a first run", async || {
        runs.tick_runs()
            .first()
            .map(|r| r.node.clone())
            .ok_or(runs.lines())
    })
    .await;
    let a = (0..2)
        .find(|n| runs.node(*n) == leading)
        .expect("the leader's replica");
    let b = 1 - a;
    let (node_a, node_b) = (runs.node(a), runs.node(b));
    // Frozen while its command runs: the tick is recorded and its run started, and it is
    // not run again.
    let frozen = runs.wait_for_runs_of(&node_a, None, 2).await;
    common::signal(children[a].id(), "STOP");
    let taken_over = runs.wait_for_runs_of(&node_b, Some(frozen.tick), 3).await;
    // Killed while its command runs, with the first replica still frozen: no leader.
    let killed = runs
        .wait_for_runs_of(&node_b, Some(taken_over.tick), 1)
        .await;
    children[b].kill().unwrap();
    let _ = children[b].wait();
    // The outage itself, which the ticks that fall in it measure: nothing to wait for.
    tokio::time::sleep(OUTAGE).await;
    common::signal(children[a].id(), "CONT");
    runs.wait_for_runs_of(&node_a, Some(killed.tick), 3).await;
    common::signal(children[a].id(), "TERM");
    wait_exit(&mut children[a], Duration::from_secs(10)).await;

    let all = runs.tick_runs();
    let ran: Vec<i64> = all.iter().map(|r| r.tick).collect();
    let context = format!(
        "runs {all:?}\n---- r0\n{}\n---- r1\n{}",
        runs.log(0),
        runs.log(1)
    );
    assert!(
        ran.windows(2).all(|w| w[0] < w[1]),
        "a tick ran twice or out of order: {context}"
    );
    for pair in all.windows(2) {
        assert!(
            pair[0].last_seen < pair[1].started,
            "tick {} started while tick {} ran: {context}",
            pair[1].tick,
            pair[0].tick
        );
    }
    let skipped: Vec<i64> = [runs.skipped(0), runs.skipped(1)].concat();
    let (first, last) = (ran[0], ran[ran.len() - 1]);
    for tick in first..=last {
        let (did_run, was_skipped) = (ran.contains(&tick), skipped.contains(&tick));
        match catch_up {
            "all" => assert!(did_run, "tick {tick} never ran: {context}"),
            _ => assert!(
                did_run != was_skipped,
                "tick {tick} ran: {did_run}, named skipped: {was_skipped}: {context}"
            ),
        }
    }
    if catch_up == "all" {
        assert_eq!(skipped, Vec::<i64>::new(), "{context}");
    } else {
        // The outage alone missed three ticks; only the latest of them runs.
        assert!(skipped.len() >= 2, "skipped only {skipped:?}: {context}");
    }
}
