//! The lab's binary end to end: the short chaos run over real processes, with the leaderq
//! binary built beside it (`cargo test --workspace` builds both; alone, `cargo build
//! --workspace` first). The run's own checks are the audit's (`src/chaos/audit.rs`).

use serde_json::{json, Value};

/// The short chaos run: leaders SIGKILLed (group, PID only, PID only and restarted at once),
/// paused and partitioned past their lease, the server killed and restarted, the leader
/// key deleted and the leader's session destroyed by hand, its renewals stalled, handlers
/// that fork, fail and hang; the audit's invariants, read from the workers' own records,
/// must all hold.
#[test]
fn short_chaos_run_keeps_every_invariant() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leaderq-lab"))
        .args(["chaos", "--short", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let audit: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("no audit ({e}); stderr:\n{stderr}"));
    assert!(output.status.success(), "{audit:#}\n{stderr}");
    assert_eq!(audit["lost"], json!([]), "{audit:#}");
    assert_eq!(audit["overlaps"], 0, "{audit:#}");
    assert_eq!(audit["leader_overlaps"], json!([]), "{audit:#}");
    assert_eq!(audit["shared_tokens"], json!([]), "{audit:#}");
    assert_eq!(audit["falling_tokens"], json!([]), "{audit:#}");
    assert_eq!(audit["stale_completions"], json!([]), "{audit:#}");
    // Each task is deleted once. A completion goes unlogged when its replica is killed
    // between the commit and the log line, or the server is killed between committing it
    // and answering: at most one per chaos event.
    let (completions, tasks) = (
        audit["completions"].as_u64().unwrap(),
        audit["tasks"].as_u64().unwrap(),
    );
    let events = audit["events"].as_array().unwrap().len() as u64;
    assert!(
        completions <= tasks && completions + events >= tasks,
        "{audit:#}"
    );
    assert!(
        audit["events"].as_array().unwrap().len() >= 5,
        "too few chaos events happened: {audit:#}"
    );
}
