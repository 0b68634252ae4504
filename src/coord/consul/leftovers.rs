//! What earlier runs of a replica left behind, judged without I/O: the session a restart
//! finds (take it up, replace it, or leave it alone) and the TTL checks that older versions,
//! whose node id was `<host>-<pid>`, left on this host's agent.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use crate::coord::consul::client::{AgentCheck, SessionInfo, SessionRequest};
use crate::util::duration;

/// What a restarted replica does with the session it held before.
#[derive(Debug, PartialEq, Eq)]
pub enum PreviousSession {
    /// Alive, named after this node, bound to its checks, with the TTL it would ask for now.
    Reuse,
    /// This node's, but not what it would create now (health check or TTL changed): give up
    /// the leader key it may hold and destroy it, then create a new one.
    Replace(&'static str),
    /// Gone, or another node's: leave it alone and create a new one.
    Ignore(&'static str),
}

/// Judges the session a restart found (`info`, `None` when the server no longer knows it)
/// against the one this replica would create now (`wanted`).
pub fn judge_previous_session(
    info: Option<&SessionInfo>,
    wanted: &SessionRequest,
) -> PreviousSession {
    let Some(info) = info else {
        return PreviousSession::Ignore("it is gone");
    };
    if info.name != wanted.name {
        return PreviousSession::Ignore("it belongs to another node id");
    }
    let mut bound: Vec<&str> = info
        .node_checks
        .iter()
        .chain(&info.checks)
        .map(String::as_str)
        .collect();
    bound.sort_unstable();
    bound.dedup();
    let mut checks: Vec<&str> = wanted.node_checks.iter().map(String::as_str).collect();
    checks.sort_unstable();
    if bound != checks {
        return PreviousSession::Replace("it is not bound to this replica's checks");
    }
    let ttl = |text: &str| duration::parse(text).ok();
    if ttl(&info.ttl).is_none() || ttl(&info.ttl) != ttl(&wanted.ttl) {
        return PreviousSession::Replace("its TTL is not election.lease_ttl");
    }
    PreviousSession::Reuse
}

/// The pid in a check id `leaderq:<host>-<pid>`, the default node id of versions before
/// node ids were kept in the data dir, when `<host>` is `hostname`.
pub fn old_style_check_pid(check_id: &str, hostname: &str) -> Option<u32> {
    let pid = check_id
        .strip_prefix("leaderq:")?
        .strip_prefix(hostname)?
        .strip_prefix('-')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// What to do about a check that looks like an older version's replica on this host, given
/// whether its pid runs here (`None`: cannot tell).
#[derive(Debug, PartialEq, Eq)]
pub enum StaleCheck {
    /// Critical and its process gone: nothing will pass it again.
    Deregister,
    /// Critical, yet a process with its pid runs here (maybe another one that got the pid):
    /// leave it and say so.
    Report,
    /// Passing: a live replica passes it, an older one or one whose configured node id
    /// only looks like `<host>-<pid>`. A dead one's check goes critical within its TTL and
    /// is removed by a later start.
    Leave,
}

/// Judges a check that [`old_style_check_pid`] named, given whether its pid runs here.
pub fn judge_stale_check(check: &AgentCheck, alive: Option<bool>) -> StaleCheck {
    match (check.status.as_str(), alive) {
        ("critical", Some(false)) => StaleCheck::Deregister,
        ("critical", _) => StaleCheck::Report,
        _ => StaleCheck::Leave,
    }
}

/// Whether process `pid` runs on this host, read from /proc; `None` without a /proc.
pub fn process_alive(pid: u32) -> Option<bool> {
    let proc = std::path::Path::new("/proc");
    if !proc.join("self").exists() {
        return None;
    }
    Some(proc.join(pid.to_string()).exists())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::lease::session_request;
    use super::*;
    use crate::coord::LeaseSpec;

    fn wanted() -> SessionRequest {
        let spec = LeaseSpec {
            node_id: "web-1".into(),
            ttl: Duration::from_secs(15),
            takeover_delay: Duration::from_secs(15),
            previous: None,
        };
        session_request(&spec, Some(&crate::coord::consul::check_id(&spec.node_id)))
    }

    fn info(name: &str, ttl: &str, node_checks: &[&str]) -> SessionInfo {
        SessionInfo {
            id: "s".into(),
            name: name.into(),
            ttl: ttl.into(),
            node_checks: node_checks.iter().map(|c| c.to_string()).collect(),
            checks: Vec::new(),
        }
    }

    /// A previous session is reused only while alive, named after this node and bound to
    /// exactly its checks with its TTL; one of this node's that does not fit is replaced;
    /// another node's (or one gone) is ignored.
    #[test]
    fn previous_session_is_reused_only_when_it_is_this_replicas_own() {
        let wanted = wanted();
        let own = ["serfHealth", "leaderq:web-1"];
        let judge = |info: Option<SessionInfo>| judge_previous_session(info.as_ref(), &wanted);
        assert_eq!(
            judge(Some(info("leaderq:web-1", "15s", &own))),
            PreviousSession::Reuse
        );
        // Go's formatting of the same TTL, and checks in another order, still fit.
        assert_eq!(
            judge(Some(info(
                "leaderq:web-1",
                "15.000s",
                &["leaderq:web-1", "serfHealth"]
            ))),
            PreviousSession::Reuse
        );
        assert!(matches!(judge(None), PreviousSession::Ignore(_)));
        // The session of another process that shared the data dir, or of an old default
        // node id: not this node's.
        assert!(matches!(
            judge(Some(info(
                "leaderq:web-1-4242",
                "15s",
                &["serfHealth", "leaderq:web-1-4242"]
            ))),
            PreviousSession::Ignore(_)
        ));
        // Bound to a dead process's check, or to none while the health check is on.
        assert!(matches!(
            judge(Some(info(
                "leaderq:web-1",
                "15s",
                &["serfHealth", "leaderq:web-1-4242"]
            ))),
            PreviousSession::Replace(_)
        ));
        assert!(matches!(
            judge(Some(info("leaderq:web-1", "15s", &["serfHealth"]))),
            PreviousSession::Replace(_)
        ));
        // Legacy `Checks` count as bindings too.
        let mut legacy = info("leaderq:web-1", "15s", &[]);
        legacy.checks = own.iter().map(|c| c.to_string()).collect();
        assert_eq!(judge(Some(legacy)), PreviousSession::Reuse);
        // The TTL changed since: the lease would be judged against the wrong TTL.
        assert!(matches!(
            judge(Some(info("leaderq:web-1", "30s", &own))),
            PreviousSession::Replace(_)
        ));
        assert!(matches!(
            judge(Some(info("leaderq:web-1", "", &own))),
            PreviousSession::Replace(_)
        ));
    }

    /// Only `leaderq:<this host>-<digits>` names an older replica's check on this host.
    #[test]
    fn old_style_check_ids_name_a_pid_on_this_host() {
        assert_eq!(
            old_style_check_pid("leaderq:web-1-4242", "web-1"),
            Some(4242)
        );
        assert_eq!(old_style_check_pid("leaderq:web-1-4242", "web-2"), None);
        assert_eq!(old_style_check_pid("leaderq:web-1-0000beef", "web-1"), None);
        assert_eq!(old_style_check_pid("leaderq:web-1-", "web-1"), None);
        assert_eq!(old_style_check_pid("leaderq:web-1", "web-1"), None);
        assert_eq!(old_style_check_pid("other:web-1-12", "web-1"), None);
        assert_eq!(
            old_style_check_pid("leaderq:web-1-99999999999", "web-1"),
            None
        );
    }

    /// A stale check goes once it is critical and its process gone; a critical one whose
    /// pid runs is reported; a passing one (a live replica passes it) is left alone.
    #[test]
    fn stale_checks_go_only_when_critical_and_their_process_is_gone() {
        let check = |status: &str| AgentCheck {
            name: "leaderq web-1-4242".into(),
            status: status.into(),
        };
        let cases = [
            ("critical", Some(false), StaleCheck::Deregister),
            ("passing", Some(false), StaleCheck::Leave),
            ("warning", Some(false), StaleCheck::Leave),
            ("critical", Some(true), StaleCheck::Report),
            ("critical", None, StaleCheck::Report),
            ("passing", Some(true), StaleCheck::Leave),
            ("passing", None, StaleCheck::Leave),
        ];
        for (status, alive, expected) in cases {
            assert_eq!(
                judge_stale_check(&check(status), alive),
                expected,
                "{status} {alive:?}"
            );
        }
    }
}
