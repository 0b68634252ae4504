//! The leadership timeline: on each won election the leader records an entry (node,
//! fencing token, since, and why the previous term ended) under [`prefix`], one key per
//! term named by its zero-padded token so that keys sort by term; at the end of its term
//! it writes why it ended into its own entry, before giving leadership up, so that the
//! next leader can say. A term whose entry says nothing ended without handing over: its
//! lease expired (a crash, a hang, a partition). At most [`KEEP`] entries are kept; the
//! leader that records one deletes the oldest beyond. The decisions are pure and tested;
//! the I/O is plain calls on the seam, whose errors the caller logs.

use std::time::Duration;

use chrono::Utc;
use serde::{Deserialize, Serialize};

use crate::coord::{CoordError, Coordinator, Edit, FencingToken, StoredTask, TaskVersion, Version};
use crate::task::rfc3339;

/// Entries kept: the newest terms.
pub const KEEP: usize = 100;
/// Why the first term recorded began.
pub const FIRST: &str = "first";
/// Why a term began whose predecessor said nothing about its end.
pub const EXPIRED: &str = "expired lease (the leader stopped without handing over)";

/// Where the terms of the election on `leader_key` are recorded: under
/// [`crate::config::OWN_NAMESPACE`], which no queue prefix may overlap.
pub fn prefix(leader_key: &str) -> String {
    format!("{}timeline/{leader_key}/", crate::config::OWN_NAMESPACE)
}

/// The key of the term with `token`: 20 digits, so byte order is token order.
pub fn entry_key(prefix: &str, token: FencingToken) -> String {
    format!("{prefix}{:020}", token.0)
}

/// One term of leadership.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEntry {
    pub node: String,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub pid: u32,
    pub fencing_token: FencingToken,
    /// When the term began (RFC 3339).
    pub since: String,
    /// Why the term before it ended: [`FIRST`], [`EXPIRED`], or what that leader wrote.
    pub previous_end: String,
    /// How this term ended, once its leader said so (resigned, rotated, stepped down: …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
}

/// Why the term after `last` (the newest entry, if any) began.
pub fn previous_end(last: Option<&TimelineEntry>) -> String {
    match last {
        None => FIRST.into(),
        Some(entry) => entry.ended.clone().unwrap_or_else(|| EXPIRED.into()),
    }
}

/// The entries among `stored` (in key order), decoded; values that are not entries are
/// skipped.
pub fn decode(stored: &[StoredTask]) -> Vec<TimelineEntry> {
    stored
        .iter()
        .filter_map(|s| serde_json::from_slice(&s.value).ok())
        .collect()
}

/// The stored entries (in key order) to delete so that, with one more, `keep` remain.
pub fn to_prune(stored: &[StoredTask], keep: usize) -> Vec<(String, TaskVersion)> {
    let over = (stored.len() + 1).saturating_sub(keep);
    stored
        .iter()
        .take(over)
        .map(|s| (s.key.clone(), s.version))
        .collect()
}

async fn list(coord: &dyn Coordinator, prefix: &str) -> Result<Vec<StoredTask>, CoordError> {
    let (mut stored, _) = coord.list(prefix, Version(0), Duration::ZERO).await?;
    stored.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(stored)
}

/// Records the start of the term of `node` with `fencing_token`, and prunes the oldest
/// entries. Answers the entry, to end it with later.
pub async fn record_start(
    coord: &dyn Coordinator,
    leader_key: &str,
    node: &str,
    fencing_token: FencingToken,
) -> Result<TimelineEntry, CoordError> {
    let prefix = prefix(leader_key);
    let stored = list(coord, &prefix).await?;
    let last = decode(&stored)
        .into_iter()
        .filter(|entry| entry.fencing_token < fencing_token)
        .max_by_key(|entry| entry.fencing_token);
    let entry = TimelineEntry {
        node: node.to_string(),
        host: crate::util::hostname(),
        pid: std::process::id(),
        fencing_token,
        since: rfc3339(Utc::now()),
        previous_end: previous_end(last.as_ref()),
        ended: None,
        ended_at: None,
    };
    let mut ops = vec![Edit::Put {
        key: entry_key(&prefix, fencing_token),
        value: serde_json::to_vec(&entry).expect("an entry serializes"),
    }];
    ops.extend(
        to_prune(&stored, KEEP)
            .into_iter()
            .map(|(key, version)| Edit::Delete { key, version }),
    );
    coord.edit(&ops).await?;
    Ok(entry)
}

/// Writes into `entry` (this replica's term) how it ended.
pub async fn record_end(
    coord: &dyn Coordinator,
    leader_key: &str,
    mut entry: TimelineEntry,
    ended: String,
) -> Result<(), CoordError> {
    entry.ended = Some(ended);
    entry.ended_at = Some(rfc3339(Utc::now()));
    let put = [Edit::Put {
        key: entry_key(&prefix(leader_key), entry.fencing_token),
        value: serde_json::to_vec(&entry).expect("an entry serializes"),
    }];
    coord.edit(&put).await?;
    Ok(())
}

/// [`record_start`], its outcome logged, never fatal (the timeline is for operators).
pub async fn start_logged(
    coord: &dyn Coordinator,
    leader_key: &str,
    node: &str,
    fencing_token: FencingToken,
) -> Option<TimelineEntry> {
    match record_start(coord, leader_key, node, fencing_token).await {
        Ok(entry) => {
            tracing::info!(fencing_token = fencing_token.0, previous_end = %entry.previous_end, "term recorded in the leadership timeline");
            Some(entry)
        }
        Err(err) => {
            tracing::warn!(fencing_token = fencing_token.0, error = %err, "cannot record the term in the leadership timeline");
            None
        }
    }
}

/// [`record_end`] of the term [`start_logged`] recorded, if it did; a failure is logged.
pub async fn end_logged(
    coord: &dyn Coordinator,
    leader_key: &str,
    term: Option<TimelineEntry>,
    ended: String,
) {
    let Some(entry) = term else { return };
    let fencing_token = entry.fencing_token;
    if let Err(err) = record_end(coord, leader_key, entry, ended).await {
        tracing::warn!(fencing_token = fencing_token.0, error = %err, "cannot record the end of the term in the leadership timeline");
    }
}

/// The newest `limit` terms, newest first.
pub async fn read(
    coord: &dyn Coordinator,
    leader_key: &str,
    limit: usize,
) -> Result<Vec<TimelineEntry>, CoordError> {
    let stored = list(coord, &prefix(leader_key)).await?;
    let mut entries = decode(&stored);
    entries.reverse();
    entries.truncate(limit);
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(token: u64) -> StoredTask {
        StoredTask {
            key: entry_key("t/", FencingToken(token)),
            version: TaskVersion(token),
            ..StoredTask::default()
        }
    }

    /// The first term says so; a term after one that said how it ended repeats it; after
    /// one that said nothing, the lease expired.
    #[test]
    fn a_term_says_why_the_one_before_ended() {
        assert_eq!(previous_end(None), FIRST);
        let mut last = TimelineEntry::default();
        assert_eq!(previous_end(Some(&last)), EXPIRED);
        last.ended = Some("rotated".into());
        assert_eq!(previous_end(Some(&last)), "rotated");
    }

    /// Keys sort by token; the oldest go so that, with the new entry, `keep` remain.
    #[test]
    fn the_oldest_terms_beyond_the_count_are_pruned() {
        assert!(entry_key("t/", FencingToken(9)) < entry_key("t/", FencingToken(10)));
        let entries: Vec<StoredTask> = (1..=5).map(stored).collect();
        assert_eq!(
            to_prune(&entries, 3),
            [
                (entry_key("t/", FencingToken(1)), TaskVersion(1)),
                (entry_key("t/", FencingToken(2)), TaskVersion(2)),
                (entry_key("t/", FencingToken(3)), TaskVersion(3))
            ]
        );
        assert!(to_prune(&entries, 6).is_empty());
    }
}
