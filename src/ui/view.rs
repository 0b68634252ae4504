//! What the dashboard shows, computed from what was read (the queue, the dead letters, the
//! holder, the pause flag) and `now`: pure, so its rules are unit-tested with scripted time.
//! Also the throughput ring buffer, fed by the difference between two readings, and the
//! schedules pane's rows from `operate::schedules::list`'s views.
//!
//! Size: every live pane (overview with its counts by type and queue latency, queue, dead
//! letters, schedules, the throughput seen) from one reading, with scripted-time tests.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::coord::{FencingToken, Holder, StoredTask};
use crate::operate::schedules::ScheduleView;
use crate::operate::status::{self, StatusReport};
use crate::operate::tasks::{self, TaskRow};
use crate::operate::waits::{explain, Limits};
use crate::task::history::HistoryRecord;
use crate::task::{Status, Task};

/// The chart covers the last hour, a bar a minute.
pub const CHART_MINUTES: usize = 60;

/// The leader as the overview shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Leader {
    pub node: String,
    pub host: String,
    pub pid: u32,
    pub since: String,
    pub fencing_token: FencingToken,
}

/// A task a leader holds now.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Running {
    pub key: String,
    pub task_type: String,
    pub node: String,
    /// RFC 3339, from takenAt; the page counts the elapsed time from it.
    pub taken_at: String,
    pub elapsed_seconds: Option<i64>,
    pub attempt: u32,
    /// How far the run got (0 to 1), as it last reported.
    pub progress: Option<f64>,
}

/// One dead letter, with what the pane shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Dead {
    pub key: String,
    pub task_type: String,
    pub reason: String,
    pub attempts: u64,
    pub last_error: String,
    pub dead_at: String,
    /// A record retry can move back (a JSON object with a taskType).
    pub retryable: bool,
}

/// One minute of the chart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Minute {
    /// Minutes since the epoch.
    pub minute: i64,
    pub completed: u64,
    pub failed: u64,
}

/// Everything the overview pane shows, pushed to the page on every change.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Overview {
    /// Rises with every reading, so the page knows it is newer.
    pub seq: u64,
    pub now: String,
    /// The coordinator could not be read: the rest is the last good reading.
    pub error: Option<String>,
    pub leader: Option<Leader>,
    pub status: StatusReport,
    pub running: Vec<Running>,
    pub chart: Vec<Minute>,
    pub completed_last_hour: u64,
    pub failed_last_hour: u64,
    /// Where the chart's counts come from: "history" (the finished tasks' records) or
    /// "seen" (changes this dashboard saw between its readings, when history is off).
    pub chart_source: &'static str,
    /// How long the oldest due task has waited to be claimed, in seconds (since its
    /// taskTime, or since its retry or schedule came due); `None` with nothing due.
    pub queue_latency_seconds: Option<i64>,
    /// That task's key.
    pub oldest_due: Option<String>,
    /// Counts by taskType, by name.
    pub types: Vec<TypeCounts>,
    /// The newest dead letters (at most [`RECENT_DEAD`]), for a link to each.
    pub recent_dead: Vec<Dead>,
}

/// Dead letters the overview links to.
pub const RECENT_DEAD: usize = 5;

/// One taskType's tasks by state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TypeCounts {
    pub task_type: String,
    /// Due now.
    pub pending: usize,
    /// Waiting for a retry's backoff or their producer's time.
    pub waiting: usize,
    /// Held by a leader now.
    pub claimed: usize,
    pub dead: usize,
    /// Paused on its own (`leaderq pause --type T`): none of its tasks starts.
    pub paused: bool,
}

/// A row of the queue pane: `leaderq tasks list`'s, with the producer's id to search by.
#[derive(Clone, Debug, Serialize)]
pub struct QueueRow {
    #[serde(flatten)]
    pub row: TaskRow,
    /// taskId (or the key's last segment), "" for a value that is not a task.
    pub id: String,
}

impl QueueRow {
    /// Whether `part` is in its id or its key.
    pub fn matches(&self, part: &str) -> bool {
        self.id.contains(part) || self.row.key.contains(part)
    }
}

/// A reading turned into the panes' data.
#[derive(Clone, Debug, Default)]
pub struct Panes {
    pub overview: Overview,
    /// The queue in claim order (as `leaderq tasks list`), dead letters left out.
    pub queue: Vec<QueueRow>,
    pub dead: Vec<Dead>,
    /// The completed tasks' history records, as the watcher last read them (shared
    /// between readings: read again every few seconds, not at each).
    pub done: Arc<Vec<HistoryRecord>>,
    /// The dead letters as history records.
    pub dead_records: Vec<HistoryRecord>,
}

/// Builds every pane from one reading.
pub fn panes(
    holder: &Holder,
    queued: Vec<StoredTask>,
    dead: Vec<StoredTask>,
    paused: bool,
    paused_types: &[String],
    limits: &Limits,
    now: DateTime<Utc>,
) -> Panes {
    let status = status::status_of(holder, &queued, dead.len(), paused, now);
    let leader = holder.lease.as_ref().map(|_| {
        let record = holder.record.clone().unwrap_or_default();
        Leader {
            node: record.node,
            host: record.host,
            pid: record.pid,
            since: record.since,
            fencing_token: holder.token,
        }
    });
    let mut running: Vec<Running> = queued
        .iter()
        .filter_map(|stored| Task::parse(stored).ok())
        .filter(|task| task.status(now) == Status::InFlight)
        .map(|task| {
            let taken_at = task
                .fields()
                .get("takenAt")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let elapsed_seconds = DateTime::parse_from_rfc3339(&taken_at)
                .ok()
                .map(|t| (now - t.with_timezone(&Utc)).num_seconds().max(0));
            Running {
                node: task
                    .taken_by
                    .as_ref()
                    .and_then(|by| by.get("node"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                attempt: task.run_number(),
                progress: task.progress().map(|(p, _)| p),
                key: task.key,
                task_type: task.task_type,
                taken_at,
                elapsed_seconds,
            }
        })
        .collect();
    running.sort_by(|a, b| a.taken_at.cmp(&b.taken_at));
    let dead_rows: Vec<Dead> = dead.iter().map(dead_row).collect();
    let parsed: Vec<Task> = queued
        .iter()
        .filter_map(|stored| Task::parse(stored).ok())
        .collect();
    let oldest = parsed
        .iter()
        .filter(|task| task.status(now) == Status::Pending)
        .map(|task| (due_since(task), &task.key))
        .min();
    let mut recent_dead = dead_rows.clone();
    recent_dead.sort_by(|a, b| b.dead_at.cmp(&a.dead_at));
    recent_dead.truncate(RECENT_DEAD);
    let ids: BTreeMap<String, String> = queued
        .iter()
        .filter_map(|stored| Task::parse(stored).ok())
        .map(|task| (task.key, task.id))
        .collect();
    let mut rows = tasks::task_rows(queued, Vec::new(), now);
    explain(&mut rows, limits, paused, paused_types);
    let queue = rows
        .into_iter()
        .map(|row| QueueRow {
            id: ids.get(&row.key).cloned().unwrap_or_default(),
            row,
        })
        .collect();
    Panes {
        overview: Overview {
            now: crate::task::rfc3339(now),
            leader,
            status,
            running,
            queue_latency_seconds: oldest.map(|(since, _)| (now - since).num_seconds().max(0)),
            oldest_due: oldest.map(|(_, key)| key.clone()),
            types: type_counts(&parsed, &dead_rows, paused_types, now),
            recent_dead,
            ..Overview::default()
        },
        queue,
        dead: dead_rows,
        done: Arc::default(),
        dead_records: Vec::new(),
    }
}

/// Since when a pending task has been due: its taskTime, or the later retry or schedule
/// time it waited for.
fn due_since(task: &Task) -> DateTime<Utc> {
    [Some(task.time), task.not_before, task.run_at]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(task.time)
}

/// Tasks by taskType and state, by name.
fn type_counts(
    tasks: &[Task],
    dead: &[Dead],
    paused_types: &[String],
    now: DateTime<Utc>,
) -> Vec<TypeCounts> {
    fn row<'a, 'b>(
        counts: &'b mut BTreeMap<&'a str, TypeCounts>,
        name: &'a str,
    ) -> &'b mut TypeCounts {
        counts.entry(name).or_insert_with(|| TypeCounts {
            task_type: name.to_string(),
            ..TypeCounts::default()
        })
    }
    let mut counts: BTreeMap<&str, TypeCounts> = BTreeMap::new();
    for task in tasks {
        let row = row(&mut counts, &task.task_type);
        match task.status(now) {
            Status::Pending | Status::Orphan => row.pending += 1,
            Status::Delayed(_) | Status::Scheduled(_) => row.waiting += 1,
            Status::InFlight | Status::Foreign => row.claimed += 1,
        }
    }
    for letter in dead {
        row(&mut counts, &letter.task_type).dead += 1;
    }
    // A paused type is listed, tasks or not, so that it can be resumed here.
    for kind in paused_types {
        row(&mut counts, kind).paused = true;
    }
    counts.into_values().collect()
}

fn dead_row(stored: &StoredTask) -> Dead {
    let value: Value = serde_json::from_slice(&stored.value).unwrap_or_default();
    let text = |name: &str| {
        value
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    Dead {
        key: stored.key.clone(),
        task_type: text("taskType"),
        reason: text("deadReason"),
        attempts: value.get("attempts").and_then(Value::as_u64).unwrap_or(0),
        last_error: text("lastError"),
        dead_at: text("deadAt"),
        retryable: value.is_object()
            && value.get("taskType").is_some()
            && value.get("rawValue").is_none(),
    }
}

/// What one reading remembers for the next: each queued key's attempts, the dead keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    queued: BTreeMap<String, u64>,
    dead: BTreeSet<String>,
}

impl Seen {
    pub fn of(queued: &[StoredTask], dead: &[StoredTask]) -> Seen {
        let attempts = |stored: &StoredTask| {
            serde_json::from_slice::<Value>(&stored.value)
                .ok()
                .and_then(|v| v.get("attempts").and_then(Value::as_u64))
                .unwrap_or(0)
        };
        Seen {
            queued: queued
                .iter()
                .map(|s| (s.key.clone(), attempts(s)))
                .collect(),
            dead: dead.iter().map(|s| s.key.clone()).collect(),
        }
    }

    /// Completions and failures between `self` and `next`: a task gone from the queue
    /// without becoming a dead letter completed; a new dead letter, or a queued task whose
    /// attempts rose, failed. Sampled: a task enqueued and finished between two readings
    /// is not seen (the history records, when kept, are exact).
    pub fn changes(&self, next: &Seen) -> (u64, u64) {
        let new_dead: BTreeSet<&String> = next.dead.difference(&self.dead).collect();
        let completed = self
            .queued
            .keys()
            .filter(|key| !next.queued.contains_key(*key))
            .filter(|key| {
                // A dead letter's key is its own (under the dead prefix), named like the
                // task: a task that left the queue as a new dead letter has failed.
                let name = key.rsplit('/').next().unwrap_or(key);
                !new_dead
                    .iter()
                    .any(|dead| dead.rsplit('/').next() == Some(name))
            })
            .count() as u64;
        let retried = next
            .queued
            .iter()
            .filter(|(key, attempts)| {
                self.queued
                    .get(*key)
                    .is_some_and(|before| *attempts > before)
            })
            .count() as u64;
        (completed, new_dead.len() as u64 + retried)
    }
}

/// Completions and dead letters by minute over the last hour, from the history records
/// (`finishedAt`), oldest first: exact whenever the dashboard was opened, as far as the
/// history keeps records.
pub fn chart_of_history<'a>(
    records: impl IntoIterator<Item = &'a HistoryRecord>,
    now: DateTime<Utc>,
) -> Vec<Minute> {
    let mut throughput = Throughput::default();
    let current = now.timestamp().div_euclid(60);
    let mut counted: Vec<(i64, bool)> = records
        .into_iter()
        .filter_map(|record| {
            let at = DateTime::parse_from_rfc3339(&record.finished_at).ok()?;
            let minute = at.timestamp().div_euclid(60);
            let recent = minute > current - CHART_MINUTES as i64 && minute <= current;
            recent.then_some((minute, record.outcome == crate::task::history::COMPLETED))
        })
        .collect();
    counted.sort();
    for (minute, completed) in counted {
        let at = DateTime::from_timestamp(minute * 60, 0).unwrap_or(now);
        throughput.record(at, u64::from(completed), u64::from(!completed));
    }
    throughput.chart(now)
}

/// Completions and failures by minute over the last hour, kept in the serving process.
#[derive(Clone, Debug, Default)]
pub struct Throughput {
    minutes: VecDeque<Minute>,
}

impl Throughput {
    /// Counts `completed` and `failed` in the minute of `now`, dropping minutes older than
    /// an hour.
    pub fn record(&mut self, now: DateTime<Utc>, completed: u64, failed: u64) {
        let minute = now.timestamp().div_euclid(60);
        match self.minutes.back_mut() {
            Some(last) if last.minute == minute => {
                last.completed += completed;
                last.failed += failed;
            }
            _ => self.minutes.push_back(Minute {
                minute,
                completed,
                failed,
            }),
        }
        while self
            .minutes
            .front()
            .is_some_and(|first| first.minute <= minute - CHART_MINUTES as i64)
        {
            self.minutes.pop_front();
        }
    }

    /// The last hour, one entry a minute (zero where nothing was seen), oldest first.
    pub fn chart(&self, now: DateTime<Utc>) -> Vec<Minute> {
        let current = now.timestamp().div_euclid(60);
        (current - CHART_MINUTES as i64 + 1..=current)
            .map(|minute| {
                self.minutes
                    .iter()
                    .find(|m| m.minute == minute)
                    .copied()
                    .unwrap_or(Minute {
                        minute,
                        ..Minute::default()
                    })
            })
            .collect()
    }
}

/// One row of the schedules pane, in the words the page shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScheduleRow {
    pub name: String,
    /// "every 5m (UTC)", "cron 0 3 * * * (Europe/Paris)".
    pub when: String,
    pub task_type: String,
    /// "active" or "paused"; "unreadable" for a record that cannot be decoded.
    pub state: &'static str,
    /// RFC 3339, or "" before the first tick; the page shows how long ago.
    pub last_tick: String,
    /// RFC 3339, or "" when paused (or no tick is left); the page shows how soon.
    pub next_tick: String,
    /// The last tick's task key, or "".
    pub last_task: String,
    /// Where that task is now ("queued", "dead", "done"), or "".
    pub outcome: String,
    pub skipped: u64,
    /// Why the stored schedule cannot be read, or "".
    pub error: String,
}

/// The schedules pane's rows, in `list`'s order.
pub fn schedule_rows(views: Vec<ScheduleView>) -> Vec<ScheduleRow> {
    views
        .into_iter()
        .map(|view| {
            let state = match (&view.error, view.paused) {
                (Some(_), _) => "unreadable",
                (None, true) => "paused",
                (None, false) => "active",
            };
            let when = if view.error.is_some() {
                String::new()
            } else {
                format!("{} ({})", view.when, view.timezone)
            };
            ScheduleRow {
                name: view.name,
                when,
                task_type: view.task_type,
                state,
                last_tick: view.last_tick.unwrap_or_default(),
                next_tick: view.next_tick.unwrap_or_default(),
                last_task: view.last_task.unwrap_or_default(),
                outcome: view.last_outcome.unwrap_or_default(),
                skipped: view.skipped,
                error: view.error.unwrap_or_default(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::{HolderRecord, LeaseId, TaskVersion};
    use serde_json::json;

    fn stored(key: &str, value: Value) -> StoredTask {
        StoredTask {
            key: key.into(),
            value: value.to_string().into_bytes(),
            version: TaskVersion(1),
            created: 1,
            holder: None,
        }
    }

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(seconds, 0).unwrap()
    }

    /// The overview names the leader and its token, counts the queue (a scheduled task
    /// apart, with when the next one is due) and by type, says how long the oldest due task
    /// has waited, and shows a held task as running with its node, elapsed time and
    /// progress; the queue pane says when a scheduled task is due; dead letters carry their
    /// reason.
    #[test]
    fn panes_show_leader_running_task_and_dead_letters() {
        let holder = Holder {
            lease: Some(LeaseId("s1".into())),
            record: Some(HolderRecord {
                node: "r1".into(),
                since: "2026-01-01T00:00:00Z".into(),
                ..HolderRecord::default()
            }),
            token: FencingToken(7),
        };
        let mut running = stored(
            "oracleTask/task_a",
            json!({"taskId": "a", "taskTime": 1, "taskType": "T", "taskTaken": true,
                   "takenBy": {"session": "s1", "node": "r1"}, "takenAt": "1970-01-01T00:01:40Z",
                   "progress": 0.25}),
        );
        running.holder = Some(LeaseId("s1".into()));
        let queued = vec![
            running,
            stored(
                "oracleTask/task_b",
                json!({"taskId": "b", "taskTime": 2, "taskType": "T"}),
            ),
            stored(
                "oracleTask/task_s",
                json!({"taskId": "s", "taskTime": 3, "taskType": "T", "runAt": 190}),
            ),
        ];
        let dead = vec![stored(
            "oracleTaskDead/task_c",
            json!({"taskType": "T", "deadReason": "failed 3 times", "attempts": 3, "lastError": "boom"}),
        )];
        let paused_types = ["Idle".to_string()];
        let panes = panes(
            &holder,
            queued,
            dead,
            true,
            &paused_types,
            &Limits::default(),
            at(130),
        );
        let idle = panes.overview.types.iter().find(|t| t.task_type == "Idle");
        assert!(
            idle.is_some_and(|t| t.paused && t.pending == 0),
            "a paused type with no task is listed"
        );
        let overview = &panes.overview;
        assert_eq!(overview.leader.as_ref().unwrap().node, "r1");
        assert_eq!(overview.leader.as_ref().unwrap().fencing_token.0, 7);
        assert_eq!(overview.status.pending, 1);
        assert_eq!(overview.status.scheduled, 1);
        assert_eq!(
            overview.status.next_due.as_deref(),
            Some("1970-01-01T00:03:10.000Z")
        );
        assert_eq!(overview.status.in_flight, 1);
        assert_eq!(overview.status.dead, 1);
        assert!(overview.status.paused);
        assert_eq!(overview.running.len(), 1);
        assert_eq!(overview.running[0].node, "r1");
        assert_eq!(overview.running[0].elapsed_seconds, Some(30));
        assert_eq!(overview.running[0].progress, Some(0.25));
        assert_eq!(panes.queue.len(), 3);
        assert_eq!(panes.queue[0].id, "a");
        let scheduled = &panes.queue[2].row;
        assert_eq!(scheduled.state, "scheduled");
        assert_eq!(
            scheduled.due_at.as_deref(),
            Some("1970-01-01T00:03:10.000Z")
        );
        assert_eq!(panes.queue[1].row.due_at, None);
        assert!(panes.queue[1].matches("b") && !panes.queue[1].matches("zz"));
        assert_eq!(
            overview.queue_latency_seconds,
            Some(128),
            "the pending task, due since its taskTime"
        );
        assert_eq!(overview.oldest_due.as_deref(), Some("oracleTask/task_b"));
        assert_eq!(
            overview.types,
            [
                TypeCounts {
                    task_type: "Idle".into(),
                    paused: true,
                    ..TypeCounts::default()
                },
                TypeCounts {
                    task_type: "T".into(),
                    pending: 1,
                    waiting: 1,
                    claimed: 1,
                    dead: 1,
                    paused: false,
                }
            ]
        );
        assert_eq!(overview.recent_dead.len(), 1);
        assert_eq!(panes.dead[0].reason, "failed 3 times");
        assert_eq!(panes.dead[0].last_error, "boom");
        assert!(panes.dead[0].retryable);
    }

    /// Between two readings: a task that left the queue completed, one that became a dead
    /// letter failed, one whose attempts rose failed once.
    #[test]
    fn changes_count_completions_and_failures() {
        let before = Seen::of(
            &[
                stored("q/task_a", json!({})),
                stored("q/task_b", json!({})),
                stored("q/task_c", json!({"attempts": 1})),
            ],
            &[],
        );
        let after = Seen::of(
            &[stored("q/task_c", json!({"attempts": 2}))],
            &[stored("d/task_b", json!({}))],
        );
        assert_eq!(before.changes(&after), (1, 2));
        assert_eq!(after.changes(&after), (0, 0));
    }

    /// From history: completions and dead letters of the last hour, by the minute they
    /// finished; older records and unreadable times are left out.
    #[test]
    fn the_chart_counts_the_history_of_the_last_hour() {
        let record = |outcome: &str, seconds: i64| HistoryRecord {
            outcome: outcome.into(),
            finished_at: crate::task::rfc3339(at(seconds)),
            ..HistoryRecord::default()
        };
        let records = [
            record("completed", 3600 + 10),
            record("completed", 3600 + 20),
            record("dead", 3600 + 70),
            record("completed", 0),
            HistoryRecord {
                finished_at: "yesterday".into(),
                ..record("completed", 0)
            },
        ];
        let chart = chart_of_history(&records, at(3600 + 90));
        assert_eq!(chart.len(), CHART_MINUTES);
        let last = &chart[chart.len() - 2..];
        assert_eq!((last[0].completed, last[0].failed), (2, 0));
        assert_eq!((last[1].completed, last[1].failed), (0, 1));
        let total: u64 = chart.iter().map(|m| m.completed + m.failed).sum();
        assert_eq!(total, 3, "the record of an hour ago is out");
    }

    /// The chart keeps an hour, a minute a bar, zero where nothing was seen.
    #[test]
    fn throughput_keeps_the_last_hour_by_minute() {
        let mut throughput = Throughput::default();
        throughput.record(at(0), 2, 1);
        throughput.record(at(30), 1, 0);
        throughput.record(at(120), 5, 0);
        let chart = throughput.chart(at(150));
        assert_eq!(chart.len(), CHART_MINUTES);
        assert_eq!(chart[CHART_MINUTES - 1].completed, 5);
        assert_eq!(chart[CHART_MINUTES - 3].completed, 3);
        assert_eq!(chart[CHART_MINUTES - 3].failed, 1);
        throughput.record(at(3600 + 60), 1, 0);
        let chart = throughput.chart(at(3600 + 60));
        assert_eq!(chart.iter().map(|m| m.completed).sum::<u64>(), 6);
    }

    fn schedule_view(name: &str) -> ScheduleView {
        ScheduleView {
            name: name.into(),
            when: "every 5m".into(),
            timezone: "UTC".into(),
            task_type: "Report".into(),
            catch_up: "one".into(),
            paused: false,
            since: "2026-01-01T00:00:00.000Z".into(),
            last_tick: Some("2026-01-01T00:05:00.000Z".into()),
            last_task: Some("oracleTask/task_report-1".into()),
            last_outcome: Some("dead".into()),
            skipped: 2,
            next_tick: Some("2026-01-01T00:10:00.000Z".into()),
            error: None,
        }
    }

    /// A schedule's row says how often and in which zone it fires, whether it is paused,
    /// its ticks and where its last task went; a paused one has no next tick; an unreadable
    /// record keeps its name and says why, with nothing else.
    #[test]
    fn schedule_rows_show_state_ticks_and_the_last_outcome() {
        let active = schedule_view("report");
        let mut paused = schedule_view("nightly");
        paused.paused = true;
        paused.next_tick = None;
        let broken = ScheduleView {
            when: String::new(),
            timezone: String::new(),
            last_tick: None,
            last_task: None,
            last_outcome: None,
            next_tick: None,
            skipped: 0,
            error: Some("not a schedule: expected value".into()),
            ..schedule_view("broken")
        };
        let rows = schedule_rows(vec![active, paused, broken]);
        assert_eq!(rows[0].when, "every 5m (UTC)");
        assert_eq!(rows[0].state, "active");
        assert_eq!(rows[0].last_tick, "2026-01-01T00:05:00.000Z");
        assert_eq!(rows[0].next_tick, "2026-01-01T00:10:00.000Z");
        assert_eq!(rows[0].last_task, "oracleTask/task_report-1");
        assert_eq!(rows[0].outcome, "dead");
        assert_eq!(rows[0].skipped, 2);
        assert_eq!(rows[0].error, "");
        assert_eq!(rows[1].state, "paused");
        assert_eq!(rows[1].next_tick, "");
        assert_eq!(rows[2].name, "broken");
        assert_eq!(rows[2].state, "unreadable");
        assert_eq!(rows[2].when, "");
        assert_eq!(rows[2].error, "not a schedule: expected value");
    }
}
