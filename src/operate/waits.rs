//! Why a queued task waits, as `leaderq tasks list` and the dashboard say it (pure, but for
//! the read of the rates' records): the queue or its type is paused, a retry's backoff or
//! its producer's `runAt` has not passed, its type's rate allows no start now (`[handlers.T]
//! rate`), its type is at its cap (`[handlers.T] concurrency`), or a task of its `taskGroup` runs
//! (with `queue.concurrency` above 1; with one run at a time every task waits its turn,
//! which needs no saying). Decided from one listing: the runs it shows in flight are the
//! runs going on.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::tasks::TaskRow;
use crate::config::Settings;
use crate::coord::Coordinator;
use crate::queue::rates::Starts;
use crate::queue::{rate_key, Rate};

/// What the leader holds tasks back by: how many run at once, each type's cap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub concurrency: usize,
    pub caps: BTreeMap<String, usize>,
    /// Each type's rate (`[handlers.T] rate`), as written.
    pub rates: BTreeMap<String, String>,
    /// The rated types whose rate allows no start now (read from their records).
    pub rate_full: BTreeSet<String>,
}

impl Limits {
    /// The limits the settings give the leader.
    pub fn of(settings: &Settings) -> Limits {
        Limits {
            concurrency: settings.queue.concurrency,
            caps: settings
                .handlers
                .iter()
                .filter_map(|(kind, handler)| Some((kind.clone(), handler.concurrency?)))
                .collect(),
            rates: settings
                .handlers
                .iter()
                .filter_map(|(kind, handler)| Some((kind.clone(), handler.rate.clone()?)))
                .collect(),
            rate_full: BTreeSet::new(),
        }
    }

    /// Reads the rated types' start records, and notes those whose rate allows no start
    /// at `now` (`queue/rates.rs`). A record that cannot be read says nothing.
    pub async fn read_rates(
        &mut self,
        coord: &dyn Coordinator,
        queue_prefix: &str,
        now: DateTime<Utc>,
    ) {
        let rated: Vec<(String, Rate)> = self
            .rates
            .iter()
            .filter_map(|(kind, rate)| Some((kind.clone(), Rate::parse(rate).ok()?)))
            .collect();
        let keys: Vec<String> = rated
            .iter()
            .map(|(kind, _)| rate_key(queue_prefix, kind))
            .collect();
        if keys.is_empty() {
            return;
        }
        let Ok(found) = coord.get(&keys).await else {
            return;
        };
        for ((kind, rate), key) in rated.iter().zip(&keys) {
            let stored = found.iter().find(|stored| stored.key == *key);
            if Starts::read(stored).room(rate, now.timestamp_millis()) == 0 {
                self.rate_full.insert(kind.clone());
            }
        }
    }
}

/// Fills each queued row's `waits` with why it waits, if something holds it back:
/// `queue_paused`, the types in `paused_types` (their rows become `paused` too), then
/// as each row's state and the runs in flight say.
pub fn explain(rows: &mut [TaskRow], limits: &Limits, queue_paused: bool, paused_types: &[String]) {
    let in_flight = rows.iter().filter(|row| row.state == "in_flight");
    let mut running: HashMap<&str, usize> = HashMap::new();
    let mut busy: HashSet<&str> = HashSet::new();
    for row in in_flight {
        *running.entry(row.task_type.as_str()).or_default() += 1;
        busy.insert(row.group.as_str());
    }
    let reasons: Vec<Option<String>> = rows
        .iter()
        .map(|row| {
            let queued = matches!(row.state.as_str(), "pending" | "delayed" | "scheduled");
            if !queued {
                return None;
            }
            if paused_types.contains(&row.task_type) {
                return Some(format!(
                    "type paused (leaderq resume --type {})",
                    row.task_type
                ));
            }
            if queue_paused {
                return Some("queue paused (leaderq resume)".into());
            }
            match row.state.as_str() {
                "delayed" => return Some("retry backoff".into()),
                "scheduled" => return Some("runAt".into()),
                _ => {}
            }
            if limits.rate_full.contains(&row.task_type) {
                let rate = limits
                    .rates
                    .get(&row.task_type)
                    .cloned()
                    .unwrap_or_default();
                return Some(format!("rate-limited ({rate})"));
            }
            if limits.concurrency <= 1 {
                return None;
            }
            let taken = running.get(row.task_type.as_str()).copied().unwrap_or(0);
            match limits.caps.get(&row.task_type) {
                Some(&cap) if taken >= cap => {
                    return Some(format!("capped ({taken} of {cap} running)"));
                }
                _ => {}
            }
            busy.contains(row.group.as_str())
                .then(|| match row.group.as_str() {
                    "" => "group busy (a task without a taskGroup runs)".to_string(),
                    group => format!("group busy ({group})"),
                })
        })
        .collect();
    for (row, why) in rows.iter_mut().zip(reasons) {
        if let Some(why) = why {
            if why.starts_with("type paused") {
                row.state = "paused".into();
            }
            row.waits = why;
        }
    }
}

/// How many queued tasks wait for each reason (its first word), for `leaderq status`.
pub fn counts(rows: &[TaskRow]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for row in rows.iter().filter(|row| !row.waits.is_empty()) {
        let reason = row.waits.split(" (").next().unwrap_or_default();
        *counts.entry(reason.to_string()).or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::{counts, explain, Limits};
    use crate::operate::tasks::TaskRow;

    fn row(state: &str, kind: &str, group: &str) -> TaskRow {
        TaskRow {
            state: state.into(),
            key: format!("q/{kind}-{group}-{state}"),
            task_type: kind.into(),
            group: group.into(),
            waits: String::new(),
            age_seconds: None,
            due_at: None,
            attempts: 0,
            last_error: String::new(),
            progress: None,
            shard: None,
        }
    }

    fn waits(rows: &[TaskRow]) -> Vec<&str> {
        rows.iter().map(|row| row.waits.as_str()).collect()
    }

    fn limits(concurrency: usize, caps: &[(&str, usize)]) -> Limits {
        Limits {
            concurrency,
            caps: caps.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
            ..Limits::default()
        }
    }

    #[test]
    fn a_capped_type_and_a_busy_group_say_so_and_the_rest_says_nothing() {
        let mut rows = vec![
            row("in_flight", "Index", "a"),
            row("in_flight", "Index", "b"),
            row("pending", "Index", "c"),
            row("pending", "Work", "a"),
            row("pending", "Work", "d"),
            row("delayed", "Work", "e"),
            row("scheduled", "Work", "f"),
        ];
        explain(&mut rows, &limits(8, &[("Index", 2)]), false, &[]);
        assert_eq!(
            waits(&rows),
            [
                "",
                "",
                "capped (2 of 2 running)",
                "group busy (a)",
                "",
                "retry backoff",
                "runAt"
            ]
        );
        let counted = counts(&rows);
        assert_eq!(counted.get("capped"), Some(&1));
        assert_eq!(counted.get("group busy"), Some(&1));
    }

    #[test]
    fn a_rated_type_with_no_room_says_so_even_one_run_at_a_time() {
        let mut rows = vec![row("pending", "Drop", ""), row("pending", "Work", "")];
        let mut limits = limits(1, &[]);
        limits.rates.insert("Drop".into(), "5/2s".into());
        limits.rate_full.insert("Drop".into());
        explain(&mut rows, &limits, false, &[]);
        assert_eq!(waits(&rows), ["rate-limited (5/2s)", ""]);
    }

    #[test]
    fn one_run_at_a_time_says_only_what_the_operator_set() {
        let mut rows = vec![row("in_flight", "Index", ""), row("pending", "Index", "")];
        explain(&mut rows, &limits(1, &[("Index", 1)]), false, &[]);
        assert_eq!(waits(&rows), ["", ""]);
        explain(&mut rows, &limits(1, &[]), true, &[]);
        assert_eq!(waits(&rows), ["", "queue paused (leaderq resume)"]);
    }

    #[test]
    fn a_paused_type_comes_first_and_its_rows_show_as_paused() {
        let mut rows = vec![row("delayed", "Index", ""), row("pending", "Work", "")];
        explain(&mut rows, &limits(4, &[]), true, &["Index".to_string()]);
        assert_eq!(rows[0].state, "paused");
        assert_eq!(rows[0].waits, "type paused (leaderq resume --type Index)");
        assert_eq!(rows[1].waits, "queue paused (leaderq resume)");
    }
}
