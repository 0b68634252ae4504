//! Schedules in the coordinator: where a schedule and its last tick are kept, what each
//! record holds, and the task a tick enqueues. Every replica reads the same records, so
//! no replica can lead without its schedules, whatever its settings file says.
//!
//! Keys lie under leaderq's own namespace, scoped by the queue prefix (as the pause flag
//! is), so queues that share a coordinator keep their own schedules:
//! - `leaderq/schedules/<queue prefix><name>`: the schedule ([`Definition`]), written by
//!   `leaderq schedules apply|pause|resume|delete`, with `since`, when it was first applied
//!   (no tick at or before it fires);
//! - `leaderq/schedule-ticks/<queue prefix><name>`: its last tick ([`TickRecord`]), written
//!   only by the leader, in the same guarded write that creates the tick's task;
//! - the tick's task: `<queue prefix>tick_<name>-<target in epoch ms>`, a task as any
//!   producer's, run under the queue's usual guarantees.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{plan, Schedule, ScheduleError, ScheduleSpec};
use crate::coord::{FencingToken, StoredTask, TaskOp, TaskVersion};

/// Where the schedules of the queue under `queue_prefix` are kept.
pub fn definitions_prefix(queue_prefix: &str) -> String {
    format!("{}schedules/{queue_prefix}", crate::config::OWN_NAMESPACE)
}

/// Where the last ticks of the schedules of the queue under `queue_prefix` are kept.
pub fn ticks_prefix(queue_prefix: &str) -> String {
    format!(
        "{}schedule-ticks/{queue_prefix}",
        crate::config::OWN_NAMESPACE
    )
}

/// The key of the task a tick of `name` at `target` enqueues: the same on every replica
/// whatever its settings, so a tick's task can be created once only.
pub fn tick_task_key(queue_prefix: &str, name: &str, target: DateTime<Utc>) -> String {
    format!("{queue_prefix}tick_{}", plan::tick_id(name, target))
}

/// A schedule as stored: its definition and when it was first applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Definition {
    pub schedule: Schedule,
    pub since: DateTime<Utc>,
}

/// The stored form of a [`Definition`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefinitionRecord {
    schedule: ScheduleSpec,
    since: String,
}

impl Definition {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(&DefinitionRecord {
            schedule: self.schedule.to_spec(),
            since: rfc3339_ms(self.since),
        })
        .expect("a schedule serializes")
    }

    /// The definition in a stored value, or why it is not one (a record edited by hand).
    pub fn decode(value: &[u8]) -> Result<Definition, ScheduleError> {
        let record: DefinitionRecord = serde_json::from_slice(value)
            .map_err(|e| ScheduleError::File(format!("not a stored schedule: {e}")))?;
        let since = DateTime::parse_from_rfc3339(&record.since)
            .map_err(|e| ScheduleError::File(format!("since {:?}: {e}", record.since)))?
            .with_timezone(&Utc);
        Ok(Definition {
            schedule: Schedule::from_spec(record.schedule)?,
            since,
        })
    }
}

/// A schedule's last tick, as the leader records it with the tick's task.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TickRecord {
    /// The target time of the latest tick enqueued or skipped (RFC 3339, milliseconds).
    pub last: String,
    /// The key of the last task enqueued, if any was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_task: Option<String>,
    /// Ticks skipped so far under the catch-up policy.
    #[serde(default)]
    pub skipped: u64,
    /// When the record was written, and by which leader (node and fencing token).
    #[serde(default)]
    pub written_at: String,
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub fencing_token: FencingToken,
}

impl TickRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a tick record serializes")
    }

    pub fn decode(value: &[u8]) -> Option<TickRecord> {
        serde_json::from_slice(value).ok()
    }

    /// The write, in a leader's guarded batch, that records this at `key`: a rewrite at
    /// `read_at`, the version of the record as read, or its creation when there was none.
    pub fn write(&self, key: String, read_at: Option<TaskVersion>) -> TaskOp {
        match read_at {
            Some(version) => TaskOp::Rewrite {
                key,
                version,
                value: self.encode(),
            },
            None => TaskOp::Create {
                key,
                value: self.encode(),
            },
        }
    }

    /// The last tick's target time.
    pub fn last(&self) -> Option<DateTime<Utc>> {
        DateTime::parse_from_rfc3339(&self.last)
            .ok()
            .map(|at| at.with_timezone(&Utc))
    }
}

/// A schedule's last tick as read, with the version its next write is conditioned on.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredTick {
    pub record: TickRecord,
    pub version: TaskVersion,
}

/// The name a record under `prefix` is kept for.
pub fn name_of<'a>(prefix: &str, stored: &'a StoredTask) -> Option<&'a str> {
    stored
        .key
        .strip_prefix(prefix)
        .filter(|name| !name.is_empty())
}

/// The JSON of the task the tick of `schedule` at `target` enqueues: the producers' format,
/// ordered by the tick's target time, with `scheduledBy` naming the schedule and the tick.
pub fn tick_task(schedule: &Schedule, target: DateTime<Utc>) -> Vec<u8> {
    let mut task = json!({
        "taskId": plan::tick_id(&schedule.name, target),
        "taskTime": rfc3339_ms(target),
        "taskTaken": false,
        "taskType": schedule.task.task_type,
        "taskPara": schedule.task.task_para,
        "scheduledBy": {"schedule": schedule.name, "tick": rfc3339_ms(target)},
    });
    if let (Some(group), Value::Object(fields)) = (&schedule.task.task_group, &mut task) {
        fields.insert("taskGroup".into(), Value::String(group.clone()));
    }
    serde_json::to_vec(&task).expect("a JSON object serializes")
}

/// RFC 3339 in UTC with milliseconds: tick times are whole milliseconds.
pub fn rfc3339_ms(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule() -> Schedule {
        Schedule::from_spec(ScheduleSpec {
            name: "nightly".into(),
            cron: Some("0 3 * * *".into()),
            timezone: Some("Europe/Berlin".into()),
            task_type: "Export".into(),
            task_para: json!({"table": "orders"}),
            task_group: Some("exports".into()),
            ..ScheduleSpec::default()
        })
        .unwrap()
    }

    /// A definition reads back as written, `since` to the millisecond.
    #[test]
    fn a_definition_round_trips() {
        let since = DateTime::from_timestamp_millis(1_795_000_000_123).unwrap();
        let stored = Definition {
            schedule: schedule(),
            since,
        };
        assert_eq!(Definition::decode(&stored.encode()).unwrap(), stored);
        assert!(Definition::decode(b"{\"schedule\":{}}").is_err());
    }

    /// A tick's task is a producer's task: its id and key name the schedule and the tick,
    /// its taskTime is the tick's target, and it carries the schedule's type, para, group.
    #[test]
    fn a_ticks_task_names_its_schedule_and_tick() {
        let target = DateTime::from_timestamp_millis(1_795_000_000_000).unwrap();
        let value: Value = serde_json::from_slice(&tick_task(&schedule(), target)).unwrap();
        assert_eq!(value["taskId"], "nightly-1795000000000");
        assert_eq!(value["taskTime"], "2026-11-18T11:06:40.000Z");
        assert_eq!(value["taskType"], "Export");
        assert_eq!(value["taskPara"]["table"], "orders");
        assert_eq!(value["taskGroup"], "exports");
        assert_eq!(value["scheduledBy"]["schedule"], "nightly");
        assert_eq!(
            tick_task_key("oracleTask/", "nightly", target),
            "oracleTask/tick_nightly-1795000000000"
        );
        let parsed = crate::task::Task::parse(&StoredTask {
            key: tick_task_key("oracleTask/", "nightly", target),
            value: tick_task(&schedule(), target),
            ..StoredTask::default()
        })
        .unwrap();
        assert_eq!(parsed.time, target);
    }

    /// Records are kept under leaderq's own namespace, scoped by the queue prefix.
    #[test]
    fn records_live_under_the_own_namespace_per_queue() {
        assert_eq!(
            definitions_prefix("oracleTask/"),
            "leaderq/schedules/oracleTask/"
        );
        assert_eq!(ticks_prefix("q/"), "leaderq/schedule-ticks/q/");
    }
}
