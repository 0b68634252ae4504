//! Where leaderq's state lives in ZooKeeper's tree, and what it means when read back. Pure:
//! names and paths in, names and paths out, no client.
//!
//! - a key `oracleTask/task_1` is the znode `/oracleTask/task_1` (below the connect string's
//!   chroot, if it has one); a queue is the children of its prefix's znode;
//! - a task's claim is its ephemeral child [`CLAIM`], owned by the claiming lease's session,
//!   so it goes when that session ends and the task is then held by no one;
//! - the election is the znode of `election.leader_key`: each campaigning lease's ephemeral
//!   sequential child `latch-<session>-<sequence>` (Curator's LeaderLatch: the lowest
//!   sequence leads) and the persistent child [`MARKER`], rewritten by every winner with its
//!   record, whose `mzxid` after that write, or the record's floor if higher, is the fencing
//!   token.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use crate::coord::{LeaseId, TaskVersion};

/// The ephemeral child of a task znode that marks it claimed by its owner's session.
pub const CLAIM: &str = "leaderq-claim";

/// The persistent child of the election znode that every winner rewrites with its record.
pub const MARKER: &str = "leader";

/// What starts the name of every latch znode (ZooKeeper appends ten digits of sequence).
const LATCH: &str = "latch-";

/// The znode of `key`.
pub fn path_of(key: &str) -> String {
    format!("/{}", key.trim_start_matches('/'))
}

/// The key of the znode at `path`.
pub fn key_of(path: &str) -> String {
    path.trim_start_matches('/').to_string()
}

/// The znode a prefix lists and the start every child's name must have: `oracleTask/` is
/// all the children of `/oracleTask`; `oracleTask/a` those of `/oracleTask` whose name
/// starts with `a`.
pub fn prefix_dir(prefix: &str) -> (String, String) {
    let prefix = prefix.trim_start_matches('/');
    match prefix.rsplit_once('/') {
        Some((dir, start)) => (path_of(dir), start.to_string()),
        None => ("/".to_string(), prefix.to_string()),
    }
}

/// The key of child `name` of the znode `dir`.
pub fn child_key(dir: &str, name: &str) -> String {
    if dir == "/" {
        name.to_string()
    } else {
        format!("{}/{name}", key_of(dir))
    }
}

/// The claim marker's path of the task at `key`.
pub fn claim_path(key: &str) -> String {
    format!("{}/{CLAIM}", path_of(key))
}

/// The parent znode of `path` (`None` for the root and direct children of it).
pub fn parent(path: &str) -> Option<&str> {
    match path.rsplit_once('/') {
        Some(("", _)) | None => None,
        Some((parent, _)) => Some(parent),
    }
}

/// A lease's id: its session id as ZooKeeper prints it (`0x…`).
pub fn lease_of(session: i64) -> LeaseId {
    LeaseId(format!("{session:#x}"))
}

/// The session id of a lease id, if it is one.
pub fn session_of(lease: &LeaseId) -> Option<i64> {
    let hex = lease.0.strip_prefix("0x")?;
    u64::from_str_radix(hex, 16).ok().map(|id| id as i64)
}

/// The name a lease's latch znode is created with (ZooKeeper appends the sequence).
pub fn latch_prefix(session: i64) -> String {
    format!("{LATCH}{session:x}-")
}

/// A latch znode as read back from its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Latch {
    pub name: String,
    pub session: i64,
    pub sequence: u64,
}

/// The latch znodes among the election znode's children, lowest sequence (the leader)
/// first; other children (the marker, anything else) are left out.
pub fn latches(children: &[String]) -> Vec<Latch> {
    let mut found: Vec<Latch> = children
        .iter()
        .filter_map(|name| {
            let rest = name.strip_prefix(LATCH)?;
            let (session, sequence) = rest.rsplit_once('-')?;
            Some(Latch {
                name: name.clone(),
                session: u64::from_str_radix(session, 16).ok()? as i64,
                sequence: sequence.parse().ok()?,
            })
        })
        .collect();
    found.sort_by_key(|latch| latch.sequence);
    found
}

/// Which latch znode a replica whose own sessions are `own` waits on, Curator's way: the
/// one just before its own first one (no herd: each waits on its predecessor alone); the
/// leader's own when it leads; the leader's when it is not in line. `None` when no one is.
pub fn watched<'a>(line: &'a [Latch], own: &[i64]) -> Option<&'a Latch> {
    match line.iter().position(|latch| own.contains(&latch.session)) {
        Some(0) | None => line.first(),
        Some(mine) => line.get(mine - 1),
    }
}

/// A task's version: the latest of its last data write (`mzxid`) and its last claim or
/// unclaim (`pzxid`: a claim marker's creation or deletion, also by session expiry). Every
/// write of the task moves it, and it is never below the creation (`czxid`).
pub fn task_version(mzxid: i64, pzxid: i64) -> TaskVersion {
    TaskVersion(mzxid.max(pzxid).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys and znode paths map one to one; a prefix lists one znode's children.
    #[test]
    fn keys_are_paths_below_the_root() {
        assert_eq!(path_of("oracleTask/task_1"), "/oracleTask/task_1");
        assert_eq!(key_of("/oracleTask/task_1"), "oracleTask/task_1");
        assert_eq!(
            prefix_dir("oracleTask/"),
            ("/oracleTask".to_string(), String::new())
        );
        assert_eq!(prefix_dir("a/b/c"), ("/a/b".to_string(), "c".to_string()));
        assert_eq!(prefix_dir("x"), ("/".to_string(), "x".to_string()));
        assert_eq!(child_key("/a/b", "t"), "a/b/t");
        assert_eq!(child_key("/", "t"), "t");
        assert_eq!(claim_path("q/t"), "/q/t/leaderq-claim");
        assert_eq!(parent("/a/b/c"), Some("/a/b"));
        assert_eq!(parent("/a"), None);
    }

    /// A lease id is the session id in ZooKeeper's hex, and reads back to it.
    #[test]
    fn lease_ids_are_session_ids() {
        let lease = lease_of(0x1000_00ab_cdef_0001);
        assert_eq!(lease.0, "0x100000abcdef0001");
        assert_eq!(session_of(&lease), Some(0x1000_00ab_cdef_0001));
        assert_eq!(session_of(&LeaseId("nope".into())), None);
    }

    /// The line is ordered by sequence, whatever the sessions; strangers are left out.
    #[test]
    fn the_line_is_in_sequence_order() {
        let names: Vec<String> = vec![
            format!("{}0000000012", latch_prefix(0xb)),
            MARKER.to_string(),
            format!("{}0000000003", latch_prefix(0xff)),
            "latch-zz-0000000001".to_string(),
            format!("{}0000000007", latch_prefix(0xa)),
        ];
        let line = latches(&names);
        let order: Vec<(i64, u64)> = line.iter().map(|l| (l.session, l.sequence)).collect();
        assert_eq!(order, [(0xff, 3), (0xa, 7), (0xb, 12)]);
    }

    /// Each replica waits on its predecessor alone; the leader on itself; one not in line
    /// on the leader.
    #[test]
    fn each_waits_on_its_predecessor() {
        let line = latches(&[
            format!("{}0000000001", latch_prefix(1)),
            format!("{}0000000002", latch_prefix(2)),
            format!("{}0000000003", latch_prefix(3)),
        ]);
        let watched_by = |own: &[i64]| watched(&line, own).map(|l| l.session);
        assert_eq!(watched_by(&[3]), Some(2));
        assert_eq!(watched_by(&[2]), Some(1));
        assert_eq!(watched_by(&[1]), Some(1));
        assert_eq!(watched_by(&[9]), Some(1));
        assert_eq!(watched(&[], &[1]), None);
    }

    /// A claim or its end (pzxid) moves the version as a data write (mzxid) does.
    #[test]
    fn versions_move_with_data_and_claims() {
        assert_eq!(task_version(10, 10), TaskVersion(10));
        assert_eq!(task_version(10, 14), TaskVersion(14));
        assert_eq!(task_version(20, 14), TaskVersion(20));
    }
}
