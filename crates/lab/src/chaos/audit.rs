//! The chaos run's audit: reads the workers' own journal and the replicas' JSON logs and
//! checks the promise. No task lost; no two runs of a task at once; every run under a
//! fencing token over before any run under a later one starts (one leader at a time, as
//! the work itself saw it); no token used by two replica processes, nor one lower than a
//! token whose work began earlier; repeats only where the first run's replica was hit; no
//! completion committed under a stale token.
//!
//! The journal is written by the worker processes (the handler's grandchildren), not by
//! leaderq: `KIND task token replica time_ns attempt pid incarnation`, KIND one of `S`
//! (start), `H` (heartbeat, every 50 ms of a slow run), `E` (end, success), `F` (planned
//! failure), `T` (SIGTERM received). A worker SIGKILLed writes nothing more, so its run is
//! taken to last until its last record: a run is seen to within one heartbeat.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

/// One chaos event, for the audit: who was hit, how, when.
#[derive(Clone, Debug)]
pub(crate) struct Event {
    pub(crate) at_ns: u128,
    pub(crate) replica: String,
    /// Which start of the replica was hit (0 for the server).
    pub(crate) incarnation: u32,
    pub(crate) kind: &'static str,
}

/// The audit's findings.
#[derive(Debug, Default, Serialize)]
pub struct Audit {
    pub tasks: usize,
    pub completed: usize,
    /// Handler runs the workers recorded.
    pub runs: usize,
    pub lost: Vec<String>,
    pub dead_letters: usize,
    /// Tasks whose handler completed more than once, with the reason.
    pub repeats: BTreeMap<String, String>,
    pub unexplained_repeats: Vec<String>,
    /// A run under a higher attempt than the run before it, that neither a planned
    /// failure nor a death of that run's replica explains (must be empty).
    pub unexplained_attempts: Vec<String>,
    /// Pairs of runs of one task that were alive at the same time (must be 0).
    pub overlaps: usize,
    pub overlap_details: Vec<String>,
    /// A run under a later fencing token started while one under an earlier token was
    /// still alive: two leaders' work at once (must be empty).
    pub leader_overlaps: Vec<String>,
    /// Fencing tokens seen by more than one replica process (must be empty).
    pub shared_tokens: Vec<String>,
    /// A token whose first run started after a run under a higher token had: tokens must
    /// rise with time across leaders (must be empty).
    pub falling_tokens: Vec<String>,
    pub completions: usize,
    pub stale_completions: Vec<String>,
    pub max_without_leader_ms: u64,
    pub events: Vec<String>,
    pub seconds: f64,
}

impl Audit {
    pub fn passed(&self) -> bool {
        self.lost.is_empty()
            && self.unexplained_repeats.is_empty()
            && self.unexplained_attempts.is_empty()
            && self.overlaps == 0
            && self.leader_overlaps.is_empty()
            && self.shared_tokens.is_empty()
            && self.falling_tokens.is_empty()
            && self.stale_completions.is_empty()
            && self.dead_letters == 0
    }
}

/// How long before a run's first record a hit of its replica may explain a repeat: more
/// than a handler's start (supervisor, shell, worker) takes on a loaded machine.
const CLAIM_TO_START_NS: u128 = 1_000_000_000;

/// The chaos handler's time-out (`procs.rs`): a run stopped this long after its start was
/// stopped for it, a failed attempt.
const TIMEOUT_NS: u128 = 2_000_000_000;

/// One handler run, as its worker recorded it.
#[derive(Clone, Debug)]
struct Run {
    token: u64,
    replica: String,
    incarnation: u32,
    start: u128,
    /// The last record's time: the run was alive until then.
    last_seen: u128,
    completed: bool,
    /// The worker got SIGTERM: leaderq stopped its handler (time-out, lease not confirmed).
    terminated: bool,
    /// `LEADERQ_ATTEMPT`.
    attempt: u32,
    /// A planned failure (`F`).
    failed: bool,
}

impl Run {
    fn overlaps(&self, other: &Run) -> bool {
        self.start <= other.last_seen && other.start <= self.last_seen
    }

    fn process(&self) -> String {
        format!("{}#{}", self.replica, self.incarnation)
    }
}

/// Runs by task, from the journal's lines.
fn runs(journal: &str) -> HashMap<String, Vec<Run>> {
    let mut runs: HashMap<String, Vec<Run>> = HashMap::new();
    // Which run each worker process is, by task and pid.
    let mut open: HashMap<(String, String), usize> = HashMap::new();
    for line in journal.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let (kind, id, pid) = (f[0], f[1].to_string(), f[6].to_string());
        let at: u128 = f[4].parse().unwrap_or(0);
        let list = runs.entry(id.clone()).or_default();
        if kind == "S" {
            open.insert((id, pid), list.len());
            list.push(Run {
                token: f[2].parse().unwrap_or(0),
                replica: f[3].to_string(),
                incarnation: f[7].parse().unwrap_or(0),
                start: at,
                last_seen: at,
                completed: false,
                terminated: false,
                attempt: f[5].parse().unwrap_or(0),
                failed: false,
            });
            continue;
        }
        let Some(run) = open.get(&(id, pid)).and_then(|&i| list.get_mut(i)) else {
            continue;
        };
        run.last_seen = run.last_seen.max(at);
        run.completed |= kind == "E";
        run.terminated |= kind == "T";
        run.failed |= kind == "F";
    }
    runs
}

pub(crate) fn audit(
    dir: &Path,
    journal: &Path,
    ids: &[String],
    events: &[Event],
) -> anyhow::Result<Audit> {
    let runs = runs(&std::fs::read_to_string(journal)?);
    let mut audit = Audit {
        tasks: ids.len(),
        runs: runs.values().map(Vec::len).sum(),
        ..Audit::default()
    };
    for id in ids {
        let list = runs.get(id).map(Vec::as_slice).unwrap_or_default();
        let completed: Vec<&Run> = list.iter().filter(|r| r.completed).collect();
        if completed.is_empty() {
            audit.lost.push(id.clone());
            continue;
        }
        audit.completed += 1;
        if let [first, second, ..] = completed[..] {
            // The first run's completion was never recorded; that is allowed only if its
            // replica process was hit after the run started and before the task ran again
            // (a server outage is retried, never a reason), or if leaderq stopped its
            // handler as it finished (its lease could not be confirmed, as during a server
            // outage, or its time-out ran out): a run it killed is a failed run, and runs
            // again (at-least-once).
            // A hit may also land between the claim and the worker's first record (the
            // handler is being started: a paused replica's handler still runs, and its
            // completion waits for the replica): `CLAIM_TO_START` before the run counts.
            let hit_before_rerun = events.iter().any(|e| {
                e.replica == first.replica
                    && e.incarnation == first.incarnation
                    && e.at_ns + CLAIM_TO_START_NS >= first.start
                    && e.at_ns <= second.start
            });
            if hit_before_rerun {
                let why = format!("replica {} was hit after its run", first.process());
                audit.repeats.insert(id.clone(), why);
            } else if first.terminated {
                let why = format!(
                    "{} stopped the handler as it finished (lease not confirmed or time-out)",
                    first.process()
                );
                audit.repeats.insert(id.clone(), why);
            } else {
                audit.repeats.insert(id.clone(), "unexplained".into());
                audit.unexplained_repeats.push(id.clone());
            }
        }
        attempts(id, list, events, &mut audit);
        for (i, a) in list.iter().enumerate() {
            for b in list[i + 1..].iter().filter(|b| a.overlaps(b)) {
                audit.overlaps += 1;
                audit.overlap_details.push(format!(
                    "{id}: token {} on {} and token {} on {}",
                    a.token,
                    a.process(),
                    b.token,
                    b.process()
                ));
            }
        }
    }
    leaders(&runs, &mut audit);
    completions(dir, &mut audit)?;
    Ok(audit)
}

/// The events that end a replica's lease, so that its run's orphan is requeued as a
/// failed attempt: its death, or a pause or partition past its lease.
const DEATHS: [&str; 5] = ["kill", "kill-pid", "restart", "pause", "partition"];

/// Checks that each run of `id` under a higher attempt than the run before it is
/// explained: that run failed as planned (`…f`), hung as planned until its time-out (`…h`,
/// first attempt) or was stopped at its time-out (a slow run on a loaded machine), or its
/// replica process died or lost its lease between its claim and the next run.
fn attempts(id: &str, list: &[Run], events: &[Event], audit: &mut Audit) {
    let mut by_start: Vec<&Run> = list.iter().collect();
    by_start.sort_by_key(|run| run.start);
    for pair in by_start.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.attempt <= a.attempt {
            continue;
        }
        let timed_out = a.terminated && a.last_seen.saturating_sub(a.start) >= TIMEOUT_NS;
        let planned = a.failed || timed_out || (id.ends_with('h') && a.attempt == 1);
        let died = events.iter().any(|e| {
            DEATHS.contains(&e.kind)
                && e.replica == a.replica
                && e.incarnation == a.incarnation
                && e.at_ns + CLAIM_TO_START_NS >= a.start
                && e.at_ns <= b.start
        });
        if !planned && !died {
            audit.unexplained_attempts.push(format!(
                "{id}: attempt {} after attempt {} on {} (token {})",
                b.attempt,
                a.attempt,
                a.process(),
                a.token
            ));
        }
    }
}

/// Per fencing token: who used it and when its runs began and ended. Every run under a
/// token must be over before the first run under any later token starts.
fn leaders(runs: &HashMap<String, Vec<Run>>, audit: &mut Audit) {
    struct Span {
        first_start: u128,
        last_seen: u128,
        processes: HashSet<String>,
    }
    let mut spans: BTreeMap<u64, Span> = BTreeMap::new();
    for run in runs.values().flatten() {
        let span = spans.entry(run.token).or_insert(Span {
            first_start: run.start,
            last_seen: run.last_seen,
            processes: HashSet::new(),
        });
        span.first_start = span.first_start.min(run.start);
        span.last_seen = span.last_seen.max(run.last_seen);
        span.processes.insert(run.process());
    }
    for (token, span) in &spans {
        if span.processes.len() > 1 {
            let mut who: Vec<&String> = span.processes.iter().collect();
            who.sort();
            audit.shared_tokens.push(format!("token {token}: {who:?}"));
        }
    }
    // In the order their work began, tokens only rise.
    let mut by_start: Vec<(u128, u64)> = spans.iter().map(|(t, s)| (s.first_start, *t)).collect();
    by_start.sort_unstable();
    let mut highest: Option<u64> = None;
    for (_, token) in by_start {
        if let Some(high) = highest.filter(|high| token < *high) {
            audit.falling_tokens.push(format!(
                "token {token} began its work after token {high} had"
            ));
        }
        highest = highest.max(Some(token));
    }
    // The latest end so far among earlier tokens, against each later token's first start.
    let mut latest: Option<(u64, u128)> = None;
    for (token, span) in &spans {
        if let Some((earlier, end)) = latest {
            if span.first_start < end {
                audit.leader_overlaps.push(format!(
                    "token {token} started {} ms before work under token {earlier} ended",
                    (end - span.first_start) / 1_000_000
                ));
            }
        }
        if latest.is_none_or(|(_, end)| span.last_seen > end) {
            latest = Some((*token, span.last_seen));
        }
    }
}

/// Completions: each logs the fencing token it ran under and, as `leader_lock_index`, the
/// token its committing write saw (Consul: the leader key's ModifyIndex); they differ only
/// if a stale leader completed a task.
fn completions(dir: &Path, audit: &mut Audit) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path: PathBuf = entry?.path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        for line in std::fs::read_to_string(&path)?.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if event["message"] != "task completed" {
                continue;
            }
            audit.completions += 1;
            let token = event["fencing_token"].as_u64().unwrap_or(0);
            let seen = event["leader_lock_index"].as_u64().unwrap_or(0);
            if token != seen {
                audit.stale_completions.push(format!(
                    "{}: fencing token {token}, leader key at commit {seen}",
                    event["task_key"].as_str().unwrap_or("?")
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, journal: &str, log: &str) -> PathBuf {
        let path = dir.join("journal");
        std::fs::write(&path, journal).unwrap();
        std::fs::write(dir.join("r1.log"), log).unwrap();
        path
    }

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn kill(replica: &str, incarnation: u32, at_ns: u128) -> Event {
        Event {
            at_ns,
            replica: replica.into(),
            incarnation,
            kind: "kill",
        }
    }

    /// A clean journal passes; a task with no completed run is lost.
    #[test]
    fn audit_finds_lost_tasks() {
        let dir = tempfile::tempdir().unwrap();
        let journal = write(
            dir.path(),
            "S a 1 r1 10 1 100 0\nE a 1 r1 20 1 100 0\nS b 1 r1 30 1 101 0\n",
            "",
        );
        let found = audit(dir.path(), &journal, &ids(&["a", "b"]), &[]).unwrap();
        assert_eq!(found.lost, ["b"]);
        assert!(!found.passed());
        let journal = write(dir.path(), "S a 1 r1 10 1 100 0\nE a 1 r1 20 1 100 0\n", "");
        assert!(audit(dir.path(), &journal, &ids(&["a"]), &[])
            .unwrap()
            .passed());
    }

    /// A repeat is explained only by a hit on the first run's replica process.
    #[test]
    fn audit_explains_repeats_by_events() {
        let dir = tempfile::tempdir().unwrap();
        let journal = write(
            dir.path(),
            "S a 1 r1 10 1 100 0\nE a 1 r1 20 1 100 0\nS a 2 r2 40 2 200 0\nE a 2 r2 50 2 200 0\n",
            "",
        );
        let unexplained = audit(dir.path(), &journal, &ids(&["a"]), &[]).unwrap();
        assert_eq!(unexplained.unexplained_repeats, ["a"]);
        let other_process = audit(dir.path(), &journal, &ids(&["a"]), &[kill("r1", 1, 25)]);
        assert!(!other_process.unwrap().passed());
        let explained = audit(dir.path(), &journal, &ids(&["a"]), &[kill("r1", 0, 25)]).unwrap();
        assert!(explained.passed(), "{explained:?}");
        assert_eq!(explained.repeats.len(), 1);
        // A hit while the handler was being started (just before the worker's first
        // record) explains it too; one long before does not.
        let starting = audit(dir.path(), &journal, &ids(&["a"]), &[kill("r1", 0, 5)]).unwrap();
        assert!(starting.passed(), "{starting:?}");
        let journal = write(
            dir.path(),
            "S a 1 r1 5000000000 1 100 0\nE a 1 r1 5000000010 1 100 0\nS a 2 r2 6000000000 2 200 0\nE a 2 r2 6000000010 2 200 0\n",
            "",
        );
        let long_before = audit(dir.path(), &journal, &ids(&["a"]), &[kill("r1", 0, 5)]).unwrap();
        assert_eq!(long_before.unexplained_repeats, ["a"]);
    }

    /// A run whose worker finished and was then SIGTERMed (leaderq stopped its handler as
    /// it finished) may run again: the repeat is explained, not a failure.
    #[test]
    fn audit_explains_a_repeat_after_a_stopped_handler() {
        let dir = tempfile::tempdir().unwrap();
        let journal = write(
            dir.path(),
            "S a 1 r1 10 1 100 0\nE a 1 r1 20 1 100 0\nT a 1 r1 21 1 100 0\nS a 1 r1 40 1 200 0\nE a 1 r1 50 1 200 0\n",
            "",
        );
        let found = audit(dir.path(), &journal, &ids(&["a"]), &[]).unwrap();
        assert!(found.passed(), "{found:?}");
        assert_eq!(found.repeats.len(), 1);
    }

    /// A run under a higher attempt is explained by a planned failure, a time-out, or a
    /// death of the run before it; a stop that was none of those (the lease not confirmed
    /// in a burst of errors) must have cost no attempt.
    #[test]
    fn audit_fails_on_an_attempt_used_without_a_failure_or_a_death() {
        let dir = tempfile::tempdir().unwrap();
        let second = 2 * TIMEOUT_NS;
        let stopped = format!(
            "S a 1 r1 10 1 100 0\nT a 1 r1 30 1 100 0\nS a 1 r1 {second} 2 200 0\nE a 1 r1 {} 2 200 0\n",
            second + 10
        );
        let journal = write(dir.path(), &stopped, "");
        let found = audit(dir.path(), &journal, &ids(&["a"]), &[]).unwrap();
        assert_eq!(found.unexplained_attempts.len(), 1, "{found:?}");
        assert!(!found.passed());
        let killed = audit(dir.path(), &journal, &ids(&["a"]), &[kill("r1", 0, 20)]).unwrap();
        assert!(killed.passed(), "{killed:?}");
        let timed_out = format!(
            "S a 1 r1 10 1 100 0\nT a 1 r1 {} 1 100 0\nS a 1 r1 {second} 2 200 0\nE a 1 r1 {} 2 200 0\n",
            TIMEOUT_NS + 10,
            second + 10
        );
        let journal = write(dir.path(), &timed_out, "");
        let found = audit(dir.path(), &journal, &ids(&["a"]), &[]).unwrap();
        assert!(found.passed(), "{found:?}");
        let failed =
            "S b 1 r1 10 1 100 0\nF b 1 r1 20 1 100 0\nS b 1 r1 40 2 200 0\nE b 1 r1 50 2 200 0\n";
        let journal = write(dir.path(), failed, "");
        let found = audit(dir.path(), &journal, &ids(&["b"]), &[]).unwrap();
        assert!(found.passed(), "{found:?}");
    }

    /// Two runs of one task alive at once fail the audit even when a kill explains why the
    /// first one was cut short: the old run must be gone before the new one starts.
    #[test]
    fn audit_fails_on_any_overlap() {
        let dir = tempfile::tempdir().unwrap();
        // The worker of token 1 went on heartbeating after token 2's worker started.
        let journal = write(
            dir.path(),
            "S a 1 r1 10 1 100 0\nH a 1 r1 20 1 100 0\nS a 2 r2 25 1 200 0\nH a 1 r1 30 1 100 0\nE a 2 r2 40 1 200 0\n",
            "",
        );
        let found = audit(dir.path(), &journal, &ids(&["a"]), &[kill("r1", 0, 12)]).unwrap();
        assert_eq!(found.overlaps, 1, "{found:?}");
        assert_eq!(found.leader_overlaps.len(), 1, "{found:?}");
        assert!(!found.passed());
    }

    /// Work under a later token that starts while an earlier token's work on another task
    /// still runs is two leaders at once.
    #[test]
    fn audit_fails_when_two_leaders_work_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let journal = write(
            dir.path(),
            "S a 1 r1 10 1 100 0\nS b 2 r2 15 1 200 0\nE b 2 r2 18 1 200 0\nE a 1 r1 20 1 100 0\n",
            "",
        );
        let found = audit(dir.path(), &journal, &ids(&["a", "b"]), &[]).unwrap();
        assert_eq!(found.overlaps, 0);
        assert_eq!(found.leader_overlaps.len(), 1, "{found:?}");
        assert!(!found.passed());
    }

    /// A fencing token seen by two processes (a restart that kept its token) fails.
    #[test]
    fn audit_fails_on_a_token_reused_by_a_restarted_replica() {
        let dir = tempfile::tempdir().unwrap();
        let journal = write(
            dir.path(),
            "S a 1 r1 10 1 100 0\nE a 1 r1 20 1 100 0\nS b 1 r1 30 1 300 1\nE b 1 r1 40 1 300 1\n",
            "",
        );
        let found = audit(dir.path(), &journal, &ids(&["a", "b"]), &[]).unwrap();
        assert_eq!(found.shared_tokens.len(), 1, "{found:?}");
        assert!(!found.passed());
    }

    /// A later leader whose token is lower than an earlier one's fails, even with no
    /// overlap in time (a token that went back: a coordinator that lost its counter).
    #[test]
    fn audit_fails_on_a_token_that_falls() {
        let dir = tempfile::tempdir().unwrap();
        let journal = write(
            dir.path(),
            "S a 5 r1 10 1 100 0\nE a 5 r1 20 1 100 0\nS b 3 r2 30 1 300 0\nE b 3 r2 40 1 300 0\n",
            "",
        );
        let found = audit(dir.path(), &journal, &ids(&["a", "b"]), &[]).unwrap();
        assert_eq!(found.falling_tokens.len(), 1, "{found:?}");
        assert!(!found.passed());
    }

    /// A completion whose transaction saw another fencing token is a stale completion.
    #[test]
    fn audit_flags_stale_completions() {
        let dir = tempfile::tempdir().unwrap();
        let log = concat!(
            r#"{"message":"task completed","task_key":"q/a","fencing_token":3,"leader_lock_index":3}"#,
            "\n",
            r#"{"message":"task completed","task_key":"q/b","fencing_token":3,"leader_lock_index":4}"#,
            "\n"
        );
        let journal = write(
            dir.path(),
            "S a 3 r1 10 1 100 0\nE a 3 r1 20 1 100 0\nS b 3 r1 30 1 101 0\nE b 3 r1 40 1 101 0\n",
            log,
        );
        let found = audit(dir.path(), &journal, &ids(&["a", "b"]), &[]).unwrap();
        assert_eq!(found.completions, 2);
        assert_eq!(found.stale_completions.len(), 1);
        assert!(!found.passed());
    }
}
