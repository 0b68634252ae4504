//! `leaderq schedules`: the operator's side of schedules, on every backend, and what the
//! CLI prints for it. `apply` makes the coordinator hold exactly the schedules of a TOML
//! file (read and checked by [`read_file`] before anything is sent; creating, updating and
//! deleting, each write at the version read), `pause`/`resume` flip one, `delete` removes
//! one with its tick record, `list` and `show` read them with their last and next ticks
//! (the dashboard's schedules pane shows the same [`ScheduleView`]s). The leader's side
//! (enqueueing the ticks) is `schedule::ticker`'s.

use std::path::Path;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::{QueueSettings, Settings};
use crate::coord::{CoordError, Coordinator, Edit, Edited, StoredTask, Version};
use crate::schedule::store::{self, Definition, TickRecord};
use crate::schedule::{plan, Schedule, ScheduleError};

#[derive(Debug, thiserror::Error)]
pub enum SchedulesError {
    #[error(transparent)]
    Coordinator(#[from] CoordError),
    #[error("{0}")]
    Invalid(#[from] ScheduleError),
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid schedule file")]
    NotAScheduleFile {
        path: String,
        #[source]
        source: ScheduleError,
    },
    #[error("no schedule {0:?} (see `leaderq schedules list`)")]
    NoSuchSchedule(String),
    #[error("schedule {0:?} changed while it was being written; run the command again")]
    Changed(String),
}

/// One schedule as an operator sees it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleView {
    pub name: String,
    pub when: String,
    pub timezone: String,
    pub task_type: String,
    pub catch_up: String,
    pub paused: bool,
    pub since: String,
    /// The last tick enqueued or skipped, if any.
    pub last_tick: Option<String>,
    pub last_task: Option<String>,
    /// Where the last task is now: "queued", "dead", or "done" (gone from the queue).
    pub last_outcome: Option<String>,
    pub skipped: u64,
    pub next_tick: Option<String>,
    /// Why a stored schedule cannot be read (edited by hand), instead of the above.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Reads and checks a schedule file (`leaderq schedules apply FILE`): nothing is sent
/// for a file that cannot be read or holds an invalid schedule.
pub fn read_file(path: &Path) -> Result<Vec<Schedule>, SchedulesError> {
    let shown = || path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| SchedulesError::Read {
        path: shown(),
        source,
    })?;
    crate::schedule::parse_file(&text).map_err(|source| SchedulesError::NotAScheduleFile {
        path: shown(),
        source,
    })
}

async fn stored_definitions(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
) -> Result<Vec<StoredTask>, CoordError> {
    let prefix = store::definitions_prefix(&queue.prefix);
    Ok(coord
        .list(&prefix, Version::default(), std::time::Duration::ZERO)
        .await?
        .0)
}

fn definition_key(queue: &QueueSettings, name: &str) -> String {
    format!("{}{name}", store::definitions_prefix(&queue.prefix))
}

fn tick_key(queue: &QueueSettings, name: &str) -> String {
    format!("{}{name}", store::ticks_prefix(&queue.prefix))
}

/// `leaderq schedules list` (and `show`, one of them): every schedule of the queue with
/// its last tick, where that tick's task is now, and its next tick after `now`.
pub async fn list(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    now: DateTime<Utc>,
) -> Result<Vec<ScheduleView>, SchedulesError> {
    let definitions = stored_definitions(coord, queue).await?;
    let ticks_prefix = store::ticks_prefix(&queue.prefix);
    let (ticks, _) = coord
        .list(&ticks_prefix, Version::default(), std::time::Duration::ZERO)
        .await?;
    let definitions_prefix = store::definitions_prefix(&queue.prefix);
    let mut views = Vec::with_capacity(definitions.len());
    for stored in &definitions {
        let name = store::name_of(&definitions_prefix, stored).unwrap_or_default();
        let tick = ticks
            .iter()
            .find(|t| store::name_of(&ticks_prefix, t) == Some(name))
            .and_then(|t| TickRecord::decode(&t.value));
        let definition = match Definition::decode(&stored.value) {
            Ok(definition) => definition,
            Err(err) => {
                views.push(ScheduleView {
                    name: name.to_string(),
                    when: String::new(),
                    timezone: String::new(),
                    task_type: String::new(),
                    catch_up: String::new(),
                    paused: false,
                    since: String::new(),
                    last_tick: None,
                    last_task: None,
                    last_outcome: None,
                    skipped: 0,
                    next_tick: None,
                    error: Some(err.to_string()),
                });
                continue;
            }
        };
        let schedule = &definition.schedule;
        let last = tick.as_ref().and_then(TickRecord::last);
        let next = if schedule.paused {
            None
        } else {
            plan::next_tick(
                &schedule.when,
                schedule.timezone,
                last.unwrap_or(definition.since).max(now),
            )
        };
        let last_task = tick.as_ref().and_then(|t| t.last_task.clone());
        let last_outcome = match &last_task {
            Some(key) => Some(outcome(coord, queue, key).await?),
            None => None,
        };
        views.push(ScheduleView {
            name: schedule.name.clone(),
            when: schedule.when.to_string(),
            timezone: schedule.timezone.name().to_string(),
            task_type: schedule.task.task_type.clone(),
            catch_up: format!("{:?}", schedule.catch_up).to_lowercase(),
            paused: schedule.paused,
            since: store::rfc3339_ms(definition.since),
            last_tick: last.map(store::rfc3339_ms),
            last_task,
            last_outcome,
            skipped: tick.as_ref().map_or(0, |t| t.skipped),
            next_tick: next.map(store::rfc3339_ms),
            error: None,
        });
    }
    Ok(views)
}

/// Where a tick's task is now: still in the queue, dead-lettered, or gone (completed).
async fn outcome(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    key: &str,
) -> Result<String, CoordError> {
    let dead = key
        .strip_prefix(queue.prefix.as_str())
        .map(|name| format!("{}{name}", queue.dead_prefix));
    let mut keys = vec![key.to_string()];
    keys.extend(dead.clone());
    let found = coord.get(&keys).await?;
    Ok(if found.iter().any(|t| t.key == key) {
        "queued"
    } else if found.iter().any(|t| Some(&t.key) == dead.as_ref()) {
        "dead"
    } else {
        "done"
    }
    .to_string())
}

/// What `apply` did to one schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    Created,
    Updated,
    Unchanged,
    Deleted,
}

/// `leaderq schedules apply FILE`: the coordinator holds exactly the file's schedules
/// afterwards. New ones are created with `since` = now (no tick at or before it fires);
/// changed ones keep their `since` and tick record, so a change neither repeats nor
/// replays a tick; ones not in the file are deleted with their tick record. Each write is
/// at the version read; a schedule changed meanwhile by someone else is an error to retry.
pub async fn apply(
    coord: &dyn Coordinator,
    settings: &Settings,
    schedules: Vec<Schedule>,
    now: DateTime<Utc>,
) -> Result<Vec<(String, Change)>, SchedulesError> {
    let queue = &settings.queue;
    let stored = stored_definitions(coord, queue).await?;
    let prefix = store::definitions_prefix(&queue.prefix);
    let mut changes = Vec::new();
    for schedule in schedules {
        let key = definition_key(queue, &schedule.name);
        let current = stored.iter().find(|s| s.key == key);
        let (edit, change) = match current {
            None => {
                let value = Definition {
                    schedule: schedule.clone(),
                    since: now,
                }
                .encode();
                (Edit::Create { key, value }, Change::Created)
            }
            Some(current) => {
                let since = Definition::decode(&current.value).map_or(now, |d| d.since);
                let value = Definition {
                    schedule: schedule.clone(),
                    since,
                }
                .encode();
                if value == current.value {
                    changes.push((schedule.name, Change::Unchanged));
                    continue;
                }
                let edit = Edit::Replace {
                    key,
                    version: current.version,
                    value,
                };
                (edit, Change::Updated)
            }
        };
        match coord.edit(&[edit]).await? {
            Edited::Done => changes.push((schedule.name, change)),
            Edited::Conflict(_) => return Err(SchedulesError::Changed(schedule.name)),
        }
    }
    for current in &stored {
        let Some(name) = store::name_of(&prefix, current) else {
            continue;
        };
        if changes.iter().any(|(n, _)| n == name) {
            continue;
        }
        delete_stored(coord, queue, name, current).await?;
        changes.push((name.to_string(), Change::Deleted));
    }
    Ok(changes)
}

async fn delete_stored(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    name: &str,
    current: &StoredTask,
) -> Result<(), SchedulesError> {
    let mut edits = vec![Edit::Delete {
        key: current.key.clone(),
        version: current.version,
    }];
    if let Some(tick) = coord.get(&[tick_key(queue, name)]).await?.pop() {
        edits.push(Edit::Delete {
            key: tick.key,
            version: tick.version,
        });
    }
    match coord.edit(&edits).await? {
        Edited::Done => Ok(()),
        Edited::Conflict(_) => Err(SchedulesError::Changed(name.to_string())),
    }
}

async fn find(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    name: &str,
) -> Result<StoredTask, SchedulesError> {
    crate::task::key::check_id(name)
        .map_err(|_| SchedulesError::NoSuchSchedule(name.to_string()))?;
    coord
        .get(&[definition_key(queue, name)])
        .await?
        .pop()
        .ok_or_else(|| SchedulesError::NoSuchSchedule(name.to_string()))
}

/// `leaderq schedules delete NAME`: removes the schedule and its tick record; its tasks
/// already enqueued stay in the queue.
pub async fn delete(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    name: &str,
) -> Result<(), SchedulesError> {
    let current = find(coord, queue, name).await?;
    delete_stored(coord, queue, name, &current).await
}

/// `leaderq schedules pause|resume NAME`: answers whether it changed anything. A paused
/// schedule enqueues nothing; resumed, its missed ticks follow its catch-up policy.
pub async fn set_paused(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    name: &str,
    paused: bool,
) -> Result<bool, SchedulesError> {
    let current = find(coord, queue, name).await?;
    let mut definition = Definition::decode(&current.value)?;
    if definition.schedule.paused == paused {
        return Ok(false);
    }
    definition.schedule.paused = paused;
    let edit = Edit::Replace {
        key: current.key,
        version: current.version,
        value: definition.encode(),
    };
    match coord.edit(&[edit]).await? {
        Edited::Done => Ok(true),
        Edited::Conflict(_) => Err(SchedulesError::Changed(name.to_string())),
    }
}

/// The schedule `leaderq schedules show NAME` prints (as JSON), from `list`'s views.
pub fn find_view(views: Vec<ScheduleView>, name: &str) -> Result<ScheduleView, SchedulesError> {
    views
        .into_iter()
        .find(|v| v.name == name)
        .ok_or_else(|| SchedulesError::NoSuchSchedule(name.to_string()))
}

/// What `leaderq schedules apply` prints: a line per schedule, with what changed.
pub fn render_changes(changes: &[(String, Change)]) -> String {
    if changes.is_empty() {
        return "no schedules in the file, none in the coordinator".to_string();
    }
    let lines: Vec<String> = changes
        .iter()
        .map(|(name, change)| {
            let sign = match change {
                Change::Created => "+ created",
                Change::Updated => "~ updated",
                Change::Unchanged => "= unchanged",
                Change::Deleted => "- deleted",
            };
            format!("{sign} {name}")
        })
        .collect();
    lines.join("\n")
}

/// What `leaderq schedules pause|resume NAME` prints, from whether it changed anything.
pub fn render_paused(name: &str, paused: bool, changed: bool) -> String {
    let state = if paused { "paused" } else { "resumed" };
    format!(
        "{name} {}{state}",
        if changed { "" } else { "was already " }
    )
}

/// The table `leaderq schedules list` prints.
pub fn render(views: &[ScheduleView]) -> String {
    if views.is_empty() {
        return "no schedules (add some with `leaderq schedules apply FILE`)\n".to_string();
    }
    let mut out = format!(
        "{:<24} {:<28} {:<16} {:<8} {:<25} {:<25} {}\n",
        "NAME", "WHEN", "TIME ZONE", "STATE", "LAST TICK", "NEXT TICK", "LAST TASK"
    );
    for view in views {
        if let Some(error) = &view.error {
            out.push_str(&format!("{:<24} unreadable: {error}\n", view.name));
            continue;
        }
        let state = if view.paused { "paused" } else { "active" };
        let last_task = match (&view.last_task, &view.last_outcome) {
            (Some(task), Some(outcome)) => format!("{task} ({outcome})"),
            _ => "-".to_string(),
        };
        out.push_str(&format!(
            "{:<24} {:<28} {:<16} {:<8} {:<25} {:<25} {}\n",
            view.name,
            view.when,
            view.timezone,
            state,
            view.last_tick.as_deref().unwrap_or("-"),
            view.next_tick.as_deref().unwrap_or("-"),
            last_task
        ));
    }
    out
}
