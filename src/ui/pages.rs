//! The dashboard's pages that answer a question rather than show the live reading: the
//! history and the dead letters filtered (taskType, outcome, time range, a part of the key)
//! and paged on the server, the chart of a window (1 h, 24 h, 7 d) with the leadership
//! changes in it, and one task's page (its value, state, attempts, history record and the
//! actions it offers). Computed from what `mod.rs` read and `now`.
//!
//! Size: three small pure pages (filter and page, chart, task) with their tests, which
//! build thousands of records and scripted leaderships; apart they would share the filter.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use super::view::Dead;
use crate::coord::{FencingToken, StoredTask};
use crate::leader::timeline::TimelineEntry;
use crate::task::attempts::{self, Attempt};
use crate::task::history::{HistoryRecord, COMPLETED, DEAD};
use crate::task::{rfc3339, Status, Task};

/// Rows of a history or dead-letter page, by default and at most.
pub const LIMIT_DEFAULT: usize = 50;
pub const LIMIT_MAX: usize = 500;

/// Which records a history or dead-letter page shows, and which of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    pub task_type: Option<String>,
    /// [`COMPLETED`] or [`DEAD`] (history only).
    pub outcome: Option<String>,
    /// Finished (or dead-lettered) at or after.
    pub from: Option<DateTime<Utc>>,
    /// Finished before.
    pub to: Option<DateTime<Utc>>,
    /// A part of the key or the id.
    pub search: Option<String>,
    pub offset: usize,
    pub limit: usize,
}

impl Default for Filter {
    fn default() -> Filter {
        Filter {
            task_type: None,
            outcome: None,
            from: None,
            to: None,
            search: None,
            offset: 0,
            limit: LIMIT_DEFAULT,
        }
    }
}

impl Filter {
    /// The filter a query's parameters ask for (`type`, `outcome`, `from`, `to`, `q`,
    /// `offset`, `limit`; empty ones ignored); what cannot be read is refused, named.
    pub fn parse(parameters: &[(String, String)]) -> Result<Filter, String> {
        let mut filter = Filter::default();
        for (name, value) in parameters {
            let value = value.trim();
            if value.is_empty() {
                continue;
            }
            let number = || {
                value
                    .parse::<usize>()
                    .map_err(|_| format!("{name}={value:?} is not a number"))
            };
            let time = || {
                parse_time(value).ok_or_else(|| {
                    format!(
                        "{name}={value:?} is not a time: give RFC 3339, YYYY-MM-DDTHH:MM (UTC) \
                         or YYYY-MM-DD"
                    )
                })
            };
            match name.as_str() {
                "type" => filter.task_type = Some(value.to_string()),
                "outcome" if value == COMPLETED || value == DEAD => {
                    filter.outcome = Some(value.to_string())
                }
                "outcome" => {
                    return Err(format!(
                        "outcome={value:?} is not an outcome: give completed or dead"
                    ))
                }
                "from" => filter.from = Some(time()?),
                "to" => filter.to = Some(time()?),
                "q" => filter.search = Some(value.to_string()),
                "offset" => filter.offset = number()?,
                "limit" => filter.limit = number()?.clamp(1, LIMIT_MAX),
                _ => {}
            }
        }
        Ok(filter)
    }

    fn keeps(
        &self,
        task_type: &str,
        outcome: &str,
        at: Option<DateTime<Utc>>,
        keys: &[&str],
    ) -> bool {
        let in_range = match (self.from, self.to) {
            (None, None) => true,
            _ => at.is_some_and(|at| {
                self.from.is_none_or(|from| at >= from) && self.to.is_none_or(|to| at < to)
            }),
        };
        self.task_type.as_deref().is_none_or(|t| t == task_type)
            && self.outcome.as_deref().is_none_or(|o| o == outcome)
            && in_range
            && self
                .search
                .as_deref()
                .is_none_or(|part| keys.iter().any(|key| key.contains(part)))
    }
}

/// A time as the page's filters give it: RFC 3339, `YYYY-MM-DDTHH:MM[:SS]` (a browser's
/// datetime-local field, read as UTC) or a day.
pub fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Some(at.with_timezone(&Utc));
    }
    for form in ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M"] {
        if let Ok(at) = NaiveDateTime::parse_from_str(text, form) {
            return Some(at.and_utc());
        }
    }
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .ok()
        .and_then(|day| day.and_hms_opt(0, 0, 0))
        .map(|at| at.and_utc())
}

/// One page of rows, with how many matched and the taskTypes there are to filter by.
#[derive(Clone, Debug, Serialize)]
pub struct Page<T> {
    pub total: usize,
    pub offset: usize,
    pub limit: usize,
    pub types: Vec<String>,
    pub rows: Vec<T>,
}

fn page<T>(matched: Vec<T>, types: Vec<String>, filter: &Filter) -> Page<T> {
    let total = matched.len();
    let rows = matched
        .into_iter()
        .skip(filter.offset)
        .take(filter.limit)
        .collect();
    Page {
        total,
        offset: filter.offset,
        limit: filter.limit,
        types,
        rows,
    }
}

fn types_of<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut types: Vec<String> = names
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .collect();
    types.sort_unstable();
    types.dedup();
    types
}

/// A row of the history page.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HistoryRow {
    /// The task's key in the queue.
    pub key: String,
    /// Where its record is (the task page's address).
    pub record_key: String,
    pub task_type: String,
    pub outcome: String,
    pub duration_ms: Option<u64>,
    pub attempts: u32,
    pub fencing_token: Option<FencingToken>,
    pub node: String,
    pub finished_at: String,
    /// A dead letter's reason, or the last error of an earlier run.
    pub detail: String,
}

/// The history page: the records that `filter` keeps, newest first, one page of them.
pub fn history_page<'a>(
    records: impl IntoIterator<Item = &'a HistoryRecord>,
    filter: &Filter,
) -> Page<HistoryRow> {
    let records: Vec<&HistoryRecord> = records.into_iter().collect();
    let types = types_of(records.iter().map(|r| r.task_type.as_str()));
    let mut matched: Vec<(Option<DateTime<Utc>>, &HistoryRecord)> = records
        .into_iter()
        .map(|r| (r.finished(), r))
        .filter(|(finished, r)| {
            let keys = [r.key.as_str(), r.record_key.as_str(), r.task_id.as_str()];
            filter.keeps(&r.task_type, &r.outcome, *finished, &keys)
        })
        .collect();
    matched.sort_by(|a, b| (b.0, &b.1.record_key).cmp(&(a.0, &a.1.record_key)));
    let Page {
        total,
        offset,
        limit,
        types,
        rows,
    } = page(matched, types, filter);
    let rows = rows.into_iter().map(|(_, r)| HistoryRow {
        detail: r
            .reason
            .clone()
            .or(r.last_error.clone())
            .unwrap_or_default(),
        key: r.key.clone(),
        record_key: r.record_key.clone(),
        task_type: r.task_type.clone(),
        outcome: r.outcome.clone(),
        duration_ms: r.duration_ms,
        attempts: r.attempts,
        fencing_token: r.fencing_token,
        node: r.node.clone().unwrap_or_default(),
        finished_at: r.finished_at.clone(),
    });
    Page {
        total,
        offset,
        limit,
        types,
        rows: rows.collect(),
    }
}

/// The dead-letter page: the dead letters that `filter` keeps, newest first.
pub fn dead_page(dead: &[Dead], filter: &Filter) -> Page<Dead> {
    let types = types_of(dead.iter().map(|d| d.task_type.as_str()));
    let mut matched: Vec<Dead> = dead
        .iter()
        .filter(|d| {
            let at = DateTime::parse_from_rfc3339(&d.dead_at)
                .ok()
                .map(|t| t.with_timezone(&Utc));
            filter.keeps(&d.task_type, DEAD, at, &[d.key.as_str()])
        })
        .cloned()
        .collect();
    matched.sort_by(|a, b| (&b.dead_at, &b.key).cmp(&(&a.dead_at, &a.key)));
    page(matched, types, filter)
}

/// The chart's windows: how far back, and the width of a bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    Hour,
    Day,
    Week,
}

impl Window {
    pub fn parse(text: &str) -> Option<Window> {
        match text {
            "1h" => Some(Window::Hour),
            "24h" => Some(Window::Day),
            "7d" => Some(Window::Week),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Window::Hour => "1h",
            Window::Day => "24h",
            Window::Week => "7d",
        }
    }

    /// Seconds a bar covers: 60 bars an hour, 96 a day, 84 a week.
    pub fn bucket_seconds(self) -> i64 {
        match self {
            Window::Hour => 60,
            Window::Day => 15 * 60,
            Window::Week => 2 * 3600,
        }
    }

    pub fn buckets(self) -> i64 {
        match self {
            Window::Hour => 60,
            Window::Day => 96,
            Window::Week => 84,
        }
    }
}

/// One bar: tasks completed and dead-lettered in `[start, start + bucket_seconds)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Bar {
    /// Epoch seconds.
    pub start: i64,
    pub completed: u64,
    pub failed: u64,
}

/// A leadership that began in the window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mark {
    /// Epoch seconds.
    pub at: i64,
    pub node: String,
    pub fencing_token: FencingToken,
    /// Why the term before it ended.
    pub why: String,
}

/// The chart of one window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Chart {
    pub window: &'static str,
    pub bucket_seconds: i64,
    /// Epoch seconds: the first bar's start, the last bar's end.
    pub from: i64,
    pub to: i64,
    pub bars: Vec<Bar>,
    pub leadership: Vec<Mark>,
    pub completed: u64,
    pub failed: u64,
}

/// Completions and dead letters by bar over `window` up to `now`, from the history
/// records, and the leaderships that began in it, from the timeline.
pub fn chart<'a>(
    records: impl IntoIterator<Item = &'a HistoryRecord>,
    terms: &[TimelineEntry],
    window: Window,
    now: DateTime<Utc>,
) -> Chart {
    let width = window.bucket_seconds();
    let to = (now.timestamp().div_euclid(width) + 1) * width;
    let from = to - window.buckets() * width;
    let mut bars: Vec<Bar> = (0..window.buckets())
        .map(|i| Bar {
            start: from + i * width,
            ..Bar::default()
        })
        .collect();
    for record in records {
        let Some(at) = record.finished().map(|t| t.timestamp()) else {
            continue;
        };
        if at < from || at >= to {
            continue;
        }
        let bar = &mut bars[((at - from) / width) as usize];
        match record.outcome.as_str() {
            COMPLETED => bar.completed += 1,
            _ => bar.failed += 1,
        }
    }
    let mut leadership: Vec<Mark> = terms
        .iter()
        .filter_map(|term| {
            let at = DateTime::parse_from_rfc3339(&term.since).ok()?.timestamp();
            (from..to).contains(&at).then(|| Mark {
                at,
                node: term.node.clone(),
                fencing_token: term.fencing_token,
                why: term.previous_end.clone(),
            })
        })
        .collect();
    leadership.sort_by_key(|mark| mark.at);
    Chart {
        window: window.name(),
        bucket_seconds: width,
        from,
        to,
        completed: bars.iter().map(|b| b.completed).sum(),
        failed: bars.iter().map(|b| b.failed).sum(),
        bars,
        leadership,
    }
}

/// Where a task page's key was found.
pub const IN_QUEUE: &str = "queue";
pub const IN_DEAD: &str = "dead";
pub const IN_HISTORY: &str = "history";

/// One task, everything the dashboard knows of it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TaskPage {
    /// The key asked for, or the one it was found under.
    pub key: String,
    /// [`IN_QUEUE`], [`IN_DEAD`] or [`IN_HISTORY`].
    pub place: &'static str,
    /// pending, delayed, scheduled, in_flight, orphaned, foreign, malformed, dead,
    /// completed.
    pub state: String,
    /// The state in a sentence.
    pub summary: String,
    pub task_type: String,
    pub task_id: String,
    /// The value as stored (a string when it is not JSON); `null` for a completed task,
    /// whose value is not kept.
    pub value: Value,
    pub attempts: u32,
    pub last_error: String,
    pub due_at: Option<String>,
    pub claimed_by: Option<String>,
    pub claimed_at: Option<String>,
    /// The leadership that holds it now (a running task) or that recorded its end.
    pub fencing_token: Option<FencingToken>,
    /// Every run logged, oldest first.
    pub attempt_log: Vec<Attempt>,
    /// Its history record, once finished.
    pub record: Option<HistoryRecord>,
    /// What its runs printed, as kept (`[queue] output_limit`), oldest attempt first.
    pub output: Vec<crate::task::output::OutputRecord>,
    /// What the page offers: "cancel" (queued), "retry" and "delete" (dead letters).
    pub actions: Vec<&'static str>,
}

fn value_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// A running task's last reported progress for its summary (", 40% done: copying"), or
/// nothing when it reported none.
fn progress_text(task: &Task) -> String {
    match task.progress() {
        Some((p, Some(message))) => format!(", {:.0}% done: {message}", p * 100.0),
        Some((p, None)) => format!(", {:.0}% done", p * 100.0),
        None => String::new(),
    }
}

fn text(value: &Value, name: &str) -> Option<String> {
    value.get(name).and_then(Value::as_str).map(str::to_string)
}

/// The page of a task under the queue prefix; `leader_token` is the current leadership's,
/// shown for a task it holds.
pub fn queued_page(
    stored: &StoredTask,
    leader_token: Option<FencingToken>,
    now: DateTime<Utc>,
) -> TaskPage {
    let value = value_of(&stored.value);
    let Ok(task) = Task::parse(stored) else {
        return TaskPage {
            key: stored.key.clone(),
            place: IN_QUEUE,
            state: "malformed".into(),
            summary: "not a valid task: the leader moves it to the dead letters".into(),
            value,
            ..TaskPage::default()
        };
    };
    let status = task.status(now);
    let claimed_by = task
        .taken_by
        .as_ref()
        .and_then(|by| by.get("node"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let claimed_at = text(&value, "takenAt");
    let due = status.due().map(rfc3339);
    let summary = match &status {
        Status::Pending => {
            let since = [Some(task.time), task.not_before, task.run_at]
                .into_iter()
                .flatten()
                .max()
                .unwrap_or(task.time);
            format!(
                "pending: due since {} ({}s ago), waiting for the leader to claim it",
                rfc3339(since),
                (now - since).num_seconds().max(0)
            )
        }
        Status::Delayed(at) => format!("waiting for a retry: due at {}", rfc3339(*at)),
        Status::Scheduled(at) => format!("scheduled: due at {}", rfc3339(*at)),
        Status::InFlight => format!(
            "running: claimed by {} at {} (attempt {}){}",
            claimed_by.as_deref().unwrap_or("?"),
            claimed_at.as_deref().unwrap_or("?"),
            task.run_number(),
            progress_text(&task)
        ),
        Status::Orphan => format!(
            "orphaned: claimed by {}, whose lease is gone; the next leader requeues it",
            claimed_by.as_deref().unwrap_or("?")
        ),
        Status::Foreign => "claimed by another program (no takenBy): left alone".into(),
    };
    TaskPage {
        key: task.key.clone(),
        place: IN_QUEUE,
        state: status.name().into(),
        summary,
        task_type: task.task_type.clone(),
        task_id: task.id.clone(),
        attempts: task.attempts,
        last_error: task.last_error.clone().unwrap_or_default(),
        due_at: due,
        fencing_token: (status == Status::InFlight)
            .then_some(leader_token)
            .flatten(),
        claimed_by,
        claimed_at,
        attempt_log: attempts::read(&task.fields()),
        record: None,
        actions: vec!["cancel"],
        value,
        output: Vec::new(),
    }
}

/// The page of a dead letter.
pub fn dead_page_of(stored: &StoredTask) -> TaskPage {
    let value = value_of(&stored.value);
    let record = HistoryRecord::from_dead_letter(&stored.key, &stored.value);
    let retryable =
        value.is_object() && value.get("taskType").is_some() && value.get("rawValue").is_none();
    let reason = text(&value, "deadReason").unwrap_or_default();
    let at = text(&value, "deadAt").unwrap_or_default();
    TaskPage {
        key: stored.key.clone(),
        place: IN_DEAD,
        state: DEAD.into(),
        summary: format!("dead since {at}: {reason}"),
        task_type: text(&value, "taskType").unwrap_or_default(),
        task_id: record
            .as_ref()
            .map(|r| r.task_id.clone())
            .unwrap_or_default(),
        attempts: record.as_ref().map_or(0, |r| r.attempts),
        last_error: text(&value, "lastError").unwrap_or_default(),
        due_at: None,
        claimed_by: None,
        claimed_at: None,
        fencing_token: record.as_ref().and_then(|r| r.fencing_token),
        attempt_log: record
            .as_ref()
            .map(|r| r.attempt_log.clone())
            .unwrap_or_default(),
        actions: if retryable {
            vec!["retry", "delete"]
        } else {
            vec!["delete"]
        },
        record,
        value,
        output: Vec::new(),
    }
}

/// The page of a completed task, from its history record: the earlier runs its attempt
/// log kept, then the run that completed it.
pub fn completed_page(record: HistoryRecord) -> TaskPage {
    let mut log = record.attempt_log.clone();
    log.push(Attempt {
        attempt: record.attempts,
        started_at: record.started_at.clone().unwrap_or_default(),
        finished_at: record.finished_at.clone(),
        outcome: attempts::COMPLETED.into(),
        error: String::new(),
        node: record.node.clone().unwrap_or_default(),
        fencing_token: record.fencing_token,
        note: String::new(),
    });
    TaskPage {
        key: record.key.clone(),
        place: IN_HISTORY,
        state: COMPLETED.into(),
        summary: format!(
            "completed at {} on {}{}",
            record.finished_at,
            record.node.as_deref().unwrap_or("?"),
            record
                .duration_ms
                .map(|ms| format!(" in {ms} ms"))
                .unwrap_or_default()
        ),
        task_type: record.task_type.clone(),
        task_id: record.task_id.clone(),
        value: Value::Null,
        attempts: record.attempts,
        last_error: record.last_error.clone().unwrap_or_default(),
        due_at: None,
        claimed_by: record.node.clone(),
        claimed_at: record.started_at.clone(),
        fencing_token: record.fencing_token,
        attempt_log: log,
        actions: Vec::new(),
        record: Some(record),
        output: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::{LeaseId, TaskVersion};
    use serde_json::json;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(seconds, 0).unwrap()
    }

    fn record(outcome: &str, task_type: &str, seconds: i64, n: usize) -> HistoryRecord {
        HistoryRecord {
            outcome: outcome.into(),
            key: format!("q/task_{n}"),
            task_type: task_type.into(),
            finished_at: rfc3339(at(seconds)),
            record_key: format!("done/{n}"),
            ..HistoryRecord::default()
        }
    }

    fn query(text: &str) -> Vec<(String, String)> {
        text.split('&')
            .filter_map(|pair| pair.split_once('='))
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    /// The query's parameters become a filter; times in three forms; junk is refused with
    /// its name; the limit is bounded.
    #[test]
    fn a_filter_reads_the_query_and_refuses_junk() {
        let filter = Filter::parse(&query(
            "type=T&outcome=dead&from=2026-01-02T03:04&to=2026-01-03&q=x&offset=20&limit=9999",
        ))
        .unwrap();
        assert_eq!(filter.task_type.as_deref(), Some("T"));
        assert_eq!(filter.outcome.as_deref(), Some("dead"));
        assert_eq!(filter.from, parse_time("2026-01-02T03:04:00Z"));
        assert_eq!(filter.to, parse_time("2026-01-03T00:00:00+00:00"));
        assert_eq!((filter.offset, filter.limit), (20, LIMIT_MAX));
        assert_eq!(
            Filter::parse(&query("type=&page=")).unwrap(),
            Filter::default()
        );
        assert!(Filter::parse(&query("from=soon"))
            .unwrap_err()
            .contains("from"));
        assert!(Filter::parse(&query("outcome=ok"))
            .unwrap_err()
            .contains("outcome"));
        assert!(Filter::parse(&query("offset=-1"))
            .unwrap_err()
            .contains("offset"));
    }

    /// Thousands of records: the page keeps those of the type, outcome and time range,
    /// newest first, counts them all and answers one page.
    #[test]
    fn history_is_filtered_and_paged_newest_first() {
        let records: Vec<HistoryRecord> = (0..3000)
            .map(|n| {
                let outcome = if n % 3 == 0 { DEAD } else { COMPLETED };
                let task_type = if n % 2 == 0 { "A" } else { "B" };
                record(outcome, task_type, 1000 + n as i64, n)
            })
            .collect();
        let filter = Filter {
            task_type: Some("A".into()),
            outcome: Some(DEAD.into()),
            from: Some(at(1000 + 600)),
            to: Some(at(1000 + 1200)),
            offset: 10,
            limit: 20,
            ..Filter::default()
        };
        let page = history_page(&records, &filter);
        // n in [600, 1200), even, a multiple of 3: multiples of 6, 100 of them.
        assert_eq!(page.total, 100);
        assert_eq!(page.rows.len(), 20);
        assert_eq!(page.types, ["A", "B"]);
        assert_eq!(
            page.rows[0].key, "q/task_1134",
            "newest first, from the 11th"
        );
        assert!(page
            .rows
            .iter()
            .all(|r| r.outcome == DEAD && r.task_type == "A"));
    }

    /// The chart of a window counts completions and dead letters in its bars, leaves out
    /// what is older, and marks each leadership that began in it.
    #[test]
    fn the_chart_counts_a_window_and_marks_leaderships() {
        let now = at(10 * 86400 + 30);
        let records = [
            record(COMPLETED, "A", 10 * 86400 - 10, 1),
            record(DEAD, "A", 10 * 86400 - 5, 2),
            record(COMPLETED, "A", 10 * 86400 - 7200, 3),
        ];
        let term = |node: &str, seconds: i64| TimelineEntry {
            node: node.into(),
            host: String::new(),
            pid: 0,
            fencing_token: FencingToken(seconds as u64),
            since: rfc3339(at(seconds)),
            previous_end: "expired".into(),
            ended: None,
            ended_at: None,
        };
        let terms = [term("r1", 10 * 86400 - 3000), term("r2", 10 * 86400 - 100)];
        let hour = chart(&records, &terms, Window::Hour, now);
        assert_eq!(hour.bars.len(), 60);
        assert_eq!(hour.to, 10 * 86400 + 60);
        assert_eq!((hour.completed, hour.failed), (1, 1));
        let last = hour.bars[hour.bars.len() - 2];
        assert_eq!((last.completed, last.failed), (1, 1));
        assert_eq!(hour.leadership.len(), 2);
        assert_eq!(hour.leadership[1].node, "r2");
        let day = chart(&records, &terms, Window::Day, now);
        assert_eq!(day.bars.len(), 96);
        assert_eq!((day.completed, day.failed), (2, 1));
        assert_eq!(Window::parse("7d"), Some(Window::Week));
        assert_eq!(Window::parse("2d"), None);
    }

    /// A running task's page names who claimed it, when, the attempt and the leadership's
    /// token; a dead letter's its reason, its attempts and offers retry; a completed
    /// task's ends its attempts with the run that completed it.
    #[test]
    fn a_task_page_shows_state_attempts_and_actions() {
        let failed = Attempt::new(
            1,
            at(1),
            at(2),
            attempts::FAILED,
            "boom",
            "r1",
            FencingToken(4),
        );
        let mut stored = StoredTask {
            key: "q/task_a".into(),
            value: json!({"taskId": "a", "taskTime": 1, "taskType": "T", "taskTaken": true,
                "attempts": 1, "lastError": "boom", "attemptLog": [failed],
                "takenBy": {"session": "s1", "node": "r2"}, "takenAt": "1970-01-01T00:01:00.000Z"})
            .to_string()
            .into_bytes(),
            version: TaskVersion(1),
            created: 1,
            holder: Some(LeaseId("s1".into())),
        };
        let page = queued_page(&stored, Some(FencingToken(9)), at(90));
        assert_eq!(page.state, "in_flight");
        assert_eq!(page.claimed_by.as_deref(), Some("r2"));
        assert!(page.summary.contains("claimed by r2") && page.summary.contains("attempt 2"));
        assert_eq!(page.fencing_token, Some(FencingToken(9)));
        assert_eq!(page.attempt_log, vec![failed.clone()]);
        assert_eq!(page.value["taskId"], "a");
        assert_eq!(page.actions, ["cancel"]);

        stored.holder = None;
        let dead = crate::task::dead_letter(&stored, "failed 3 times", at(100));
        let dead = StoredTask {
            key: "dead/task_a".into(),
            value: dead,
            ..stored
        };
        let page = dead_page_of(&dead);
        assert_eq!(page.state, "dead");
        assert!(page.summary.contains("failed 3 times"));
        assert_eq!(page.actions, ["retry", "delete"]);
        assert_eq!(page.attempt_log.len(), 1);

        let done = HistoryRecord {
            attempts: 2,
            node: Some("r2".into()),
            attempt_log: vec![failed],
            ..record(COMPLETED, "T", 200, 1)
        };
        let page = completed_page(done);
        assert_eq!(page.state, "completed");
        assert_eq!(page.attempt_log.len(), 2);
        assert_eq!(page.attempt_log[1].outcome, "completed");
        assert!(page.actions.is_empty());
        assert!(page.record.is_some());
    }
}
