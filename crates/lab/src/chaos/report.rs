//! The chaos run's audit printed as a report: one line per invariant with its count and
//! verdict, and the first few findings of each kind.

use super::Audit;

/// Prints the audit as a report.
pub fn print(audit: &Audit) {
    println!(
        "chaos run: {} tasks in {:.0}s; events: {}",
        audit.tasks,
        audit.seconds,
        audit.events.join(", ")
    );
    let verdict = |ok: bool| if ok { "ok" } else { "FAILED" };
    println!(
        "  tasks lost:                               {:>6}  {}",
        audit.lost.len(),
        verdict(audit.lost.is_empty())
    );
    println!(
        "  tasks dead-lettered:                      {:>6}  {}",
        audit.dead_letters,
        verdict(audit.dead_letters == 0)
    );
    println!(
        "  tasks completed more than once:           {:>6}  ({} unexplained) {}",
        audit.repeats.len(),
        audit.unexplained_repeats.len(),
        verdict(audit.unexplained_repeats.is_empty())
    );
    for (id, why) in audit.repeats.iter().take(10) {
        println!("    {id}: {why}");
    }
    println!(
        "  attempts used with no failure or death:   {:>6}  {}",
        audit.unexplained_attempts.len(),
        verdict(audit.unexplained_attempts.is_empty())
    );
    for attempt in audit.unexplained_attempts.iter().take(10) {
        println!("    {attempt}");
    }
    println!(
        "  handler runs (recorded by the workers):   {:>6}",
        audit.runs
    );
    println!(
        "  runs of one task alive at once:           {:>6}  {}",
        audit.overlaps,
        verdict(audit.overlaps == 0)
    );
    for overlap in audit.overlap_details.iter().take(10) {
        println!("    {overlap}");
    }
    println!(
        "  work under two tokens at once:            {:>6}  {}",
        audit.leader_overlaps.len(),
        verdict(audit.leader_overlaps.is_empty())
    );
    for overlap in audit.leader_overlaps.iter().take(10) {
        println!("    {overlap}");
    }
    println!(
        "  tokens used by two replica processes:     {:>6}  {}",
        audit.shared_tokens.len(),
        verdict(audit.shared_tokens.is_empty())
    );
    for shared in audit.shared_tokens.iter().take(10) {
        println!("    {shared}");
    }
    println!(
        "  tokens falling across leaders:            {:>6}  {}",
        audit.falling_tokens.len(),
        verdict(audit.falling_tokens.is_empty())
    );
    for falling in audit.falling_tokens.iter().take(10) {
        println!("    {falling}");
    }
    println!(
        "  completions audited:                      {:>6}",
        audit.completions
    );
    println!(
        "  completions under a stale fencing token:  {:>6}  {}",
        audit.stale_completions.len(),
        verdict(audit.stale_completions.is_empty())
    );
    println!(
        "  longest time without a working leader:    {:>6} ms",
        audit.max_without_leader_ms
    );
    println!(
        "  verdict: {}",
        if audit.passed() {
            "all invariants hold"
        } else {
            "INVARIANT BROKEN"
        }
    );
}
