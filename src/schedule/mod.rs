//! Schedules: named rules that enqueue a task at set times, either `every` fixed interval or
//! on a `cron` expression read on a time zone's wall clock. Owns the definition
//! ([`Schedule`], [`When`], [`TickTask`], [`CatchUp`]), its wire form ([`ScheduleSpec`], read
//! from TOML or JSON, with the producers' `taskType`/`taskPara`/`taskGroup` spellings
//! accepted), its validation, and the schedule file of `[[schedule]]` tables.
//!
//! Which ticks are due, which are enqueued and which skipped is [`plan`]'s (pure). Where
//! schedules and their last ticks are kept in the coordinator, and the task a tick
//! enqueues, is [`store`]'s; the leader's loop that writes the ticks is [`ticker`]'s.
//! Nothing in this file reads the clock or does I/O.

pub mod plan;
pub mod store;
pub mod ticker;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::util::duration;

/// A name is part of coordinator keys and of every tick's task key, so it stays short.
pub const NAME_MAX: usize = 128;
/// Each tick is a coordinator write and a task: faster than once a second is a load
/// generator, not a schedule.
pub const EVERY_MIN: Duration = Duration::from_secs(1);
/// A longer interval is a yearly job, which `cron` says more clearly; it also keeps tick
/// arithmetic in milliseconds far from overflow.
pub const EVERY_MAX: Duration = Duration::from_secs(366 * 24 * 3600);
/// Enough to recover a day of quarter-hourly ticks, few enough that an outage does not
/// flood the queue.
pub const DEFAULT_CATCH_UP_LIMIT: u32 = 100;
/// The leader writes a plan's ticks in one go; more than this at once is a flood, not a
/// catch-up, and it bounds the planner's work.
pub const MAX_CATCH_UP_LIMIT: u32 = 10_000;
/// A schedule with no time zone reads its cron on UTC, the same on every replica.
pub const DEFAULT_TIMEZONE: &str = "UTC";
/// A cron expression must match some time after this instant (2000-01-01T00:00:00Z, epoch
/// seconds). Croner searches from here up to the year 5000 and the calendar repeats every
/// 400 years, so a pattern that finds nothing names a date that never comes (February 30).
const CRON_PROBE_FROM: i64 = 946_684_800;

/// A validated schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub name: String,
    pub when: When,
    /// The zone a cron expression is read in; `every` ignores it.
    pub timezone: Tz,
    pub task: TickTask,
    pub catch_up: CatchUp,
    /// The most ticks [`CatchUp::All`] enqueues at once.
    pub catch_up_limit: u32,
    pub paused: bool,
}

/// When a schedule's ticks fall.
#[derive(Clone, Debug, PartialEq)]
pub enum When {
    /// At every multiple of the interval since the Unix epoch: a whole number of
    /// milliseconds, from [`EVERY_MIN`] to [`EVERY_MAX`].
    Every(Duration),
    /// On a cron expression, read in the schedule's time zone. `expr` is the text as
    /// written, kept for display and for [`Schedule::to_spec`]. Boxed: a parsed pattern is
    /// many times the size of an interval.
    Cron { expr: String, cron: Box<Cron> },
}

impl fmt::Display for When {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            When::Every(interval) => write!(f, "every {}", duration::format(*interval)),
            When::Cron { expr, .. } => write!(f, "cron {expr}"),
        }
    }
}

/// The task each tick enqueues, in the domain's words.
#[derive(Clone, Debug, PartialEq)]
pub struct TickTask {
    pub task_type: String,
    /// Handed to the handler as the task's `taskPara`; null when the schedule gives none.
    pub task_para: Value,
    pub task_group: Option<String>,
}

/// What a leader does with ticks that fell due while no leader was there to enqueue them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// Only a tick that is on time runs; missed ones are skipped.
    None,
    /// The latest missed tick runs, once; older ones are skipped.
    #[default]
    Latest,
    /// Every missed tick runs, up to the schedule's `catch_up_limit` (the latest ones).
    All,
}

/// A schedule as files and producers write it: TOML or JSON, checked by
/// [`Schedule::from_spec`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    pub name: String,
    /// A Go duration: `"30s"`, `"5m"`, `"1h30m"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// Five fields (minute hour day-of-month month day-of-week), or six with seconds first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// An IANA name such as `"Europe/Berlin"`; UTC when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(alias = "taskType")]
    pub task_type: String,
    #[serde(default, alias = "taskPara", skip_serializing_if = "Value::is_null")]
    pub task_para: Value,
    #[serde(default, alias = "taskGroup", skip_serializing_if = "Option::is_none")]
    pub task_group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<CatchUp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up_limit: Option<u32>,
    #[serde(default)]
    pub paused: bool,
}

/// Why a schedule, or a schedule file, was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule file is not valid: {0}")]
    File(String),
    #[error("schedule name {0:?} is not valid: use 1 to {NAME_MAX} letters, digits, '.', '_' or '-' (it becomes part of coordinator keys), and not \".\" or \"..\"")]
    BadName(String),
    #[error("schedule {0:?}: say when it runs, with `every` (such as \"5m\") or `cron` (such as \"0 3 * * *\")")]
    NoWhen(String),
    #[error("schedule {0:?}: give either `every` or `cron`, not both")]
    BothWhen(String),
    #[error("schedule {name:?}: every {every:?} is not a duration ({reason}); write it like \"30s\", \"5m\" or \"1h30m\"")]
    BadEvery {
        name: String,
        every: String,
        reason: String,
    },
    #[error("schedule {name:?}: every {every:?} is out of range; use at least 1s and at most 8784h (366 days), in whole milliseconds")]
    EveryOutOfRange { name: String, every: String },
    #[error("schedule {name:?}: cron {cron:?} has {fields} fields; use 5 (minute hour day-of-month month day-of-week) or 6 with seconds first (a year field is not supported)")]
    CronFields {
        name: String,
        cron: String,
        fields: usize,
    },
    #[error("schedule {name:?}: cron {cron:?} is not valid ({reason}); use 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first")]
    BadCron {
        name: String,
        cron: String,
        reason: String,
    },
    #[error("schedule {name:?}: cron {cron:?} never matches a date; check its day of month against its months (February has at most 29 days)")]
    CronNeverMatches { name: String, cron: String },
    #[error("schedule {name:?}: unknown time zone {timezone:?}; use an IANA name such as \"UTC\" or \"Europe/Berlin\"")]
    UnknownTimezone { name: String, timezone: String },
    #[error("schedule {0:?}: task_type is empty; name the handler that runs its ticks")]
    EmptyTaskType(String),
    #[error("schedule {0:?}: task_group must be a non-empty string of at most {max} bytes; leave it out for no group", max = crate::task::MAX_GROUP_LEN)]
    BadTaskGroup(String),
    #[error(
        "schedule {name:?}: catch_up_limit {limit} is out of range; use 1 to {MAX_CATCH_UP_LIMIT}"
    )]
    CatchUpLimit { name: String, limit: u32 },
    #[error("two schedules are named {0:?}; give each a unique name")]
    DuplicateName(String),
}

impl Schedule {
    /// Checks every field of `spec` and fills in the defaults.
    pub fn from_spec(spec: ScheduleSpec) -> Result<Schedule, ScheduleError> {
        let name = spec.name;
        if !valid_name(&name) {
            return Err(ScheduleError::BadName(name));
        }
        let when = match (spec.every, spec.cron) {
            (None, None) => return Err(ScheduleError::NoWhen(name)),
            (Some(_), Some(_)) => return Err(ScheduleError::BothWhen(name)),
            (Some(every), None) => When::Every(parse_every(&name, every)?),
            (None, Some(expr)) => {
                let cron = Box::new(parse_cron(&name, &expr)?);
                When::Cron { expr, cron }
            }
        };
        let timezone = spec
            .timezone
            .unwrap_or_else(|| DEFAULT_TIMEZONE.to_string());
        let Ok(timezone) = Tz::from_str(&timezone) else {
            return Err(ScheduleError::UnknownTimezone { name, timezone });
        };
        if spec.task_type.trim().is_empty() {
            return Err(ScheduleError::EmptyTaskType(name));
        }
        if let Some(group) = &spec.task_group {
            if group.is_empty() || group.len() > crate::task::MAX_GROUP_LEN {
                return Err(ScheduleError::BadTaskGroup(name));
            }
        }
        let catch_up_limit = spec.catch_up_limit.unwrap_or(DEFAULT_CATCH_UP_LIMIT);
        if !(1..=MAX_CATCH_UP_LIMIT).contains(&catch_up_limit) {
            return Err(ScheduleError::CatchUpLimit {
                name,
                limit: catch_up_limit,
            });
        }
        let mut task_para = spec.task_para;
        toml_datetimes_as_text(&mut task_para);
        Ok(Schedule {
            name,
            when,
            timezone,
            task: TickTask {
                task_type: spec.task_type,
                task_para,
                task_group: spec.task_group,
            },
            catch_up: spec.catch_up.unwrap_or_default(),
            catch_up_limit,
            paused: spec.paused,
        })
    }

    /// The wire form, with every default written out, so a stored schedule reads the same
    /// whatever defaults a later version has.
    pub fn to_spec(&self) -> ScheduleSpec {
        let (every, cron) = match &self.when {
            When::Every(interval) => (Some(duration::format(*interval)), None),
            When::Cron { expr, .. } => (None, Some(expr.clone())),
        };
        ScheduleSpec {
            name: self.name.clone(),
            every,
            cron,
            timezone: Some(self.timezone.name().to_string()),
            task_type: self.task.task_type.clone(),
            task_para: self.task.task_para.clone(),
            task_group: self.task.task_group.clone(),
            catch_up: Some(self.catch_up),
            catch_up_limit: Some(self.catch_up_limit),
            paused: self.paused,
        }
    }
}

/// A schedule file: `[[schedule]]` tables, one per schedule.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleFile {
    #[serde(default)]
    schedule: Vec<ScheduleSpec>,
}

/// Reads a TOML file of `[[schedule]]` tables, checking each and refusing two with one name.
pub fn parse_file(toml_text: &str) -> Result<Vec<Schedule>, ScheduleError> {
    let file: ScheduleFile = toml::from_str(toml_text)
        .map_err(|e| ScheduleError::File(e.to_string().trim_end().to_string()))?;
    let mut schedules: Vec<Schedule> = Vec::with_capacity(file.schedule.len());
    for spec in file.schedule {
        let schedule = Schedule::from_spec(spec)?;
        if schedules.iter().any(|s| s.name == schedule.name) {
            return Err(ScheduleError::DuplicateName(schedule.name));
        }
        schedules.push(schedule);
    }
    Ok(schedules)
}

/// The key under which the toml crate hands a TOML date-time to a self-describing value
/// such as JSON's: a one-entry object holding its text.
const TOML_DATETIME_KEY: &str = "$__toml_private_datetime";

/// Replaces each TOML date-time in `value` (`when = 2026-05-01T10:00:00Z` in a file's
/// `task_para`) with its text, which is what a handler reading JSON expects to find.
fn toml_datetimes_as_text(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            if fields.len() == 1 {
                if let Some(Value::String(text)) = fields.get(TOML_DATETIME_KEY) {
                    *value = Value::String(text.clone());
                    return;
                }
            }
            fields.values_mut().for_each(toml_datetimes_as_text);
        }
        Value::Array(items) => items.iter_mut().for_each(toml_datetimes_as_text),
        _ => {}
    }
}

/// 1 to [`NAME_MAX`] of `[A-Za-z0-9._-]`, and not `.` or `..`, which a key path would read
/// as a directory.
fn valid_name(name: &str) -> bool {
    (1..=NAME_MAX).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn parse_every(name: &str, every: String) -> Result<Duration, ScheduleError> {
    let interval = match duration::parse(&every) {
        Ok(interval) => interval,
        Err(reason) => {
            return Err(ScheduleError::BadEvery {
                name: name.to_string(),
                every,
                reason,
            })
        }
    };
    // Ticks are ids in milliseconds (plan::tick_id); a finer interval would put ticks
    // between two ids.
    let whole_ms = interval.subsec_nanos() % 1_000_000 == 0;
    if interval < EVERY_MIN || interval > EVERY_MAX || !whole_ms {
        return Err(ScheduleError::EveryOutOfRange {
            name: name.to_string(),
            every,
        });
    }
    Ok(interval)
}

fn parse_cron(name: &str, expr: &str) -> Result<Cron, ScheduleError> {
    let fields = expr.split_whitespace().count();
    // `@daily` and its kin are one field that croner expands to five.
    let nickname = fields == 1 && expr.trim_start().starts_with('@');
    if !nickname && !(5..=6).contains(&fields) {
        return Err(ScheduleError::CronFields {
            name: name.to_string(),
            cron: expr.to_string(),
            fields,
        });
    }
    let parser = CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build();
    let cron = parser.parse(expr).map_err(|e| ScheduleError::BadCron {
        name: name.to_string(),
        cron: expr.to_string(),
        reason: e.to_string().trim_end_matches('.').to_lowercase(),
    })?;
    let probe = DateTime::<Utc>::from_timestamp(CRON_PROBE_FROM, 0)
        .expect("2000-01-01 is within chrono's range");
    if cron.find_next_occurrence(&probe, false).is_err() {
        return Err(ScheduleError::CronNeverMatches {
            name: name.to_string(),
            cron: expr.to_string(),
        });
    }
    Ok(cron)
}

#[cfg(test)]
mod tests;
