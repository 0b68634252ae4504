//! Leadership as an operator reads it: `leaderq status --timeline` (who led when, with
//! which fencing token, and why each term ended) and `leaderq status --name NAME` (who
//! leads a `leaderq run`, since when), with their text. The timeline's records are written
//! by `leader::timeline`; the queue's current leader is in `status.rs`'s report.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::OperateError;
use crate::config::ElectionSettings;
use crate::coord::{Coordinator, FencingToken, HolderRecord, Version};
use crate::leader::timeline::TimelineEntry;
use crate::util::escape::escape;

/// The newest `limit` terms of leadership, newest first: who led, from when, with which
/// fencing token, and why the term before ended.
pub async fn timeline(
    coord: &dyn Coordinator,
    election: &ElectionSettings,
    limit: usize,
) -> Result<Vec<TimelineEntry>, OperateError> {
    Ok(crate::leader::timeline::read(coord, &election.leader_key, limit).await?)
}

/// The table `leaderq status --timeline` prints, newest term first.
pub fn render_timeline(entries: &[TimelineEntry]) -> String {
    let mut out = format!(
        "{:>7} {:<16} {:<24} {:<40}  ENDED",
        "TOKEN", "NODE", "SINCE", "PREVIOUS TERM ENDED"
    );
    for (n, entry) in entries.iter().enumerate() {
        // A term that said nothing of its end: the next one says why it began, and the
        // newest is the current one.
        let ended = match (&entry.ended, n.checked_sub(1).map(|next| &entries[next])) {
            (Some(ended), _) => ended.as_str(),
            (None, Some(next)) => next.previous_end.as_str(),
            (None, None) => "(leading)",
        };
        // Entries are stored text: shown escaped.
        out.push_str(&format!(
            "\n{:>7} {:<16} {:<24} {:<40}  {}",
            entry.fencing_token,
            escape(&entry.node),
            escape(&entry.since),
            escape(&entry.previous_end),
            escape(ended)
        ));
    }
    out
}

/// Who leads a `leaderq run` (`leaderq status --name NAME`); its JSON is `--json`'s.
#[derive(Clone, Debug, Serialize)]
pub struct RunLeadership {
    pub name: String,
    /// The leader's record; `None` while leadership is free.
    pub leader: Option<HolderRecord>,
    pub fencing_token: Option<FencingToken>,
    pub led_for_seconds: Option<i64>,
}

/// Reads who leads the run `name`, as of `now`; `coord` is connected with the run's
/// settings (its own leader key).
pub async fn of_run(
    coord: &dyn Coordinator,
    name: &str,
    now: DateTime<Utc>,
) -> Result<RunLeadership, OperateError> {
    let (holder, _) = coord.observe(Version(0), Duration::ZERO).await?;
    let leader = holder.lease.as_ref().and(holder.record.clone());
    let led_for_seconds = leader
        .as_ref()
        .and_then(|r| DateTime::parse_from_rfc3339(&r.since).ok())
        .map(|since| (now - since.with_timezone(&Utc)).num_seconds().max(0));
    Ok(RunLeadership {
        name: name.to_string(),
        leader,
        fencing_token: holder.lease.as_ref().map(|_| holder.token),
        led_for_seconds,
    })
}

/// What `leaderq status --name NAME` prints.
pub fn render_run(run: &RunLeadership) -> String {
    let Some(record) = &run.leader else {
        return "leader:        none".to_string();
    };
    let mut out = format!(
        "leader:        {} (pid {} on {}, session {})\nfencing token: {}\nsince:         {}",
        escape(&record.node),
        record.pid,
        escape(&record.host),
        escape(&record.session),
        run.fencing_token.unwrap_or_default(),
        escape(&record.since)
    );
    if let Some(seconds) = run.led_for_seconds {
        out.push_str(&format!(
            "\nled for:       {}",
            crate::util::duration::format(Duration::from_secs(seconds as u64))
        ));
    }
    out
}
