//! The leader's ticker: for as long as a term lasts, it enqueues each schedule's due ticks
//! and sleeps until the next tick or a change to the schedules.
//!
//! Exactly once per tick, whoever leads: a tick's task is created (create-only, under a key
//! derived from the schedule and the tick's target time) in one write guarded by the
//! leadership that also advances the schedule's tick record, conditioned on the version of
//! the record the plan was made from. A leader killed, frozen or partitioned before the
//! write leaves the tick to the next leader; after it, the record says the tick is done. A
//! lost answer is settled by reading again. Two leaders cannot both write (the guard), and
//! a stale plan cannot be written twice (the record's version). The next tick is computed
//! from the last target time, never from when the leader woke ([`super::plan`]).
//!
//! A schedule whose tick record is missing (a new schedule, or a record deleted by hand)
//! starts from when it was applied if that was within [`plan::ON_TIME_GRACE`], else from
//! now: a deleted record never makes a tick run again.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::plan;
use super::store::{self, Definition, StoredTick, TickRecord};
use crate::coord::{Coordinator, Leadership, StoredTask, TaskOp, TaskVersion, Version, Written};
use crate::leader::Lease;

/// Ticks created in one write at most, with their record: a catch-up of many ticks is
/// written in several, each advancing the record, so no write nears a coordinator's limit.
pub const TICKS_PER_WRITE: usize = 16;

/// After a failed read or write, the ticker tries again this soon.
const RETRY: Duration = Duration::from_millis(500);

/// One write for one schedule: the ticks' tasks and the record that goes with them.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub ops: Vec<TaskOp>,
    /// The tick times created by `ops`.
    pub ticks: Vec<DateTime<Utc>>,
    pub skipped: u64,
}

/// What one schedule asks of the leader now: the write to make (if any) and when its next
/// tick falls. Pure: `tick` is the record as read (`None`: missing), `now` the wall clock.
pub fn step(
    definition: &Definition,
    tick: Option<&StoredTick>,
    now: DateTime<Utc>,
    queue_prefix: &str,
    leadership: &Leadership,
    node: &str,
) -> (Option<Step>, Option<DateTime<Utc>>) {
    let schedule = &definition.schedule;
    let last = tick.and_then(|t| t.record.last());
    let since = match tick {
        Some(_) => definition.since,
        // A record deleted by hand must not make a tick run again.
        None if now - definition.since > plan::ON_TIME_GRACE => now,
        None => definition.since,
    };
    let planned = plan::plan(schedule, last, since, now);
    let Some(planned_last) = planned.last else {
        return (None, planned.next);
    };
    let ticks: Vec<DateTime<Utc>> = planned
        .enqueue
        .iter()
        .copied()
        .take(TICKS_PER_WRITE)
        .collect();
    // A catch-up longer than one write records the last tick it wrote; the next step
    // plans the rest from there.
    let (recorded, next) = if ticks.len() < planned.enqueue.len() {
        (*ticks.last().unwrap_or(&planned_last), Some(now))
    } else {
        (planned_last, planned.next)
    };
    let mut ops: Vec<TaskOp> = ticks
        .iter()
        .map(|target| TaskOp::Create {
            key: store::tick_task_key(queue_prefix, &schedule.name, *target),
            value: store::tick_task(schedule, *target),
        })
        .collect();
    let previous = tick.map(|t| &t.record);
    let record = TickRecord {
        last: store::rfc3339_ms(recorded),
        last_task: ops
            .last()
            .map(|op| op.key().to_string())
            .or_else(|| previous.and_then(|p| p.last_task.clone())),
        skipped: previous.map_or(0, |p| p.skipped) + planned.skipped,
        written_at: store::rfc3339_ms(now),
        node: node.to_string(),
        fencing_token: leadership.fencing_token,
    };
    let key = format!("{}{}", store::ticks_prefix(queue_prefix), schedule.name);
    ops.push(record.write(key, tick.map(|t| t.version)));
    let step = Step {
        ops,
        ticks,
        skipped: planned.skipped,
    };
    (Some(step), next)
}

/// Writes one step. A tick whose task exists already (its record was rewritten by hand to
/// an earlier tick) was enqueued before: it is left out and the rest written, with the
/// record; a conflict on the record itself is answered as it is.
async fn write_step(
    coord: &dyn Coordinator,
    leadership: &Leadership,
    mut ops: Vec<TaskOp>,
) -> Result<Written, crate::coord::CoordError> {
    loop {
        let written = coord.write(leadership, &ops).await?;
        let Written::Conflict(keys) = &written else {
            return Ok(written);
        };
        let record = ops.last().map(|op| op.key().to_string());
        let before = ops.len();
        ops.retain(|op| Some(op.key()) == record.as_deref() || !keys.iter().any(|k| k == op.key()));
        if ops.len() == before || keys.iter().any(|k| Some(k) == record.as_ref()) {
            return Ok(written);
        }
        for key in keys {
            tracing::info!(task_key = %key, "a schedule's tick task exists already; it is not enqueued again");
        }
    }
}

/// The schedules' records as a listing found them: each key with its version.
type Seen = Vec<(String, TaskVersion)>;

fn seen(stored: &[StoredTask]) -> Seen {
    stored
        .iter()
        .map(|entry| (entry.key.clone(), entry.version))
        .collect()
}

/// Whether a listing found the records `seen` saw, each at the same version (compared
/// in place: a wake of the ticker copies no key).
fn unchanged(stored: &[StoredTask], seen: &Seen) -> bool {
    stored
        .iter()
        .map(|entry| (entry.key.as_str(), entry.version))
        .eq(seen.iter().map(|(key, version)| (key.as_str(), *version)))
}

/// Read and decoded schedules: the definitions, their tick records by name, and what the
/// definitions' listing saw (its version to wait on for a change, and its records).
type Read = (Vec<Definition>, HashMap<String, StoredTick>, Version, Seen);

/// The schedules of the queue and their tick records, as read now.
async fn read(
    coord: &dyn Coordinator,
    queue_prefix: &str,
    warned: &mut HashMap<String, TaskVersion>,
) -> Result<Read, crate::coord::CoordError> {
    let definitions_prefix = store::definitions_prefix(queue_prefix);
    let ticks_prefix = store::ticks_prefix(queue_prefix);
    let (stored_definitions, version) = coord
        .list(&definitions_prefix, Version::default(), Duration::ZERO)
        .await?;
    let mut definitions = Vec::with_capacity(stored_definitions.len());
    for entry in &stored_definitions {
        match Definition::decode(&entry.value) {
            Ok(definition) => definitions.push(definition),
            Err(err) => {
                if warned.insert(entry.key.clone(), entry.version) != Some(entry.version) {
                    tracing::warn!(key = %entry.key, error = %err, "a schedule record cannot be read; it is skipped until it is fixed (leaderq schedules apply)");
                }
            }
        }
    }
    let (stored, _) = coord
        .list(&ticks_prefix, Version::default(), Duration::ZERO)
        .await?;
    let ticks = stored
        .iter()
        .filter_map(|entry| {
            let name = store::name_of(&ticks_prefix, entry)?;
            let record = TickRecord::decode(&entry.value)?;
            Some((
                name.to_string(),
                StoredTick {
                    record,
                    version: entry.version,
                },
            ))
        })
        .collect();
    Ok((definitions, ticks, version, seen(&stored_definitions)))
}

/// Enqueues the due ticks of every schedule of the queue under `queue_prefix` until the
/// leadership is lost (a write answers `NotLeader`) or the lease is no longer fresh; the
/// caller drops it when the term ends. `wait` bounds one blocking read of the schedules.
pub async fn tick_while_leading(
    coord: &dyn Coordinator,
    leadership: &Leadership,
    lease: &Lease,
    queue_prefix: &str,
    node: &str,
    wait: Duration,
) {
    let mut warned = HashMap::new();
    loop {
        if !lease.is_fresh() {
            return;
        }
        let (definitions, ticks, mut version, records) =
            match read(coord, queue_prefix, &mut warned).await {
                Ok(read) => read,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read the schedules; trying again");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
        let now = Utc::now();
        let mut next: Option<DateTime<Utc>> = None;
        let mut again = false;
        for definition in &definitions {
            let name = &definition.schedule.name;
            let (step, due) = step(
                definition,
                ticks.get(name),
                now,
                queue_prefix,
                leadership,
                node,
            );
            next = match (next, due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let Some(step) = step else {
                continue;
            };
            if !lease.is_fresh() {
                return;
            }
            match write_step(coord, leadership, step.ops).await {
                Ok(Written::Done { .. }) => {
                    for target in &step.ticks {
                        tracing::info!(schedule = %name, tick = %store::rfc3339_ms(*target), late_ms = (now - *target).num_milliseconds(), fencing_token = leadership.fencing_token.0, "schedule tick enqueued");
                    }
                    if step.skipped > 0 {
                        tracing::warn!(schedule = %name, skipped = step.skipped, catch_up = ?definition.schedule.catch_up, "ticks missed while no leader ran were skipped");
                    }
                }
                Ok(Written::NotLeader) => return,
                Ok(Written::Conflict(keys) | Written::Deferred(keys)) => {
                    // The record moved (a lost answer of an earlier write of ours, or an
                    // operator's edit): read again.
                    tracing::info!(schedule = %name, ?keys, "a schedule's tick record changed meanwhile; reading it again");
                    again = true;
                }
                Err(err) => {
                    tracing::warn!(schedule = %name, error = %err, "cannot enqueue a schedule's tick yet; trying again");
                    again = true;
                }
            }
        }
        if again {
            tokio::time::sleep(RETRY.min(wait)).await;
            continue;
        }
        // Sleep until the next tick, or until the schedules change.
        let until = next.map(|at| (at - Utc::now()).to_std().unwrap_or_default());
        let nap = until.map_or(wait, |until| until.min(wait));
        let definitions_prefix = store::definitions_prefix(queue_prefix);
        let woken = tokio::time::Instant::now() + nap;
        // A backend whose listings carry one version for all its keys (Redis; Consul's
        // for a prefix without keys) answers at every write of the queue's: the leader's
        // claims and completions. Unless the schedules' records changed, wait on.
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(woken) => break,
                changed = coord.list(&definitions_prefix, version, wait) => match changed {
                    Ok((stored, now)) if now > version && unchanged(&stored, &records) => {
                        version = now;
                    }
                    Ok(_) => break,
                    Err(_) => {
                        tokio::time::sleep(RETRY).await;
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::{FencingToken, LeaseId};
    use crate::schedule::{CatchUp, Schedule, ScheduleSpec};

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_795_000_000 + secs, 0).unwrap()
    }

    fn definition(catch_up: CatchUp, since: DateTime<Utc>) -> Definition {
        let schedule = Schedule::from_spec(ScheduleSpec {
            name: "beat".into(),
            every: Some("1s".into()),
            task_type: "Tick".into(),
            catch_up: Some(catch_up),
            ..ScheduleSpec::default()
        })
        .unwrap();
        Definition { schedule, since }
    }

    fn leadership() -> Leadership {
        Leadership {
            lease: LeaseId("l".into()),
            fencing_token: FencingToken(7),
        }
    }

    fn tick(last: DateTime<Utc>, version: u64) -> StoredTick {
        StoredTick {
            record: TickRecord {
                last: store::rfc3339_ms(last),
                ..TickRecord::default()
            },
            version: TaskVersion(version),
        }
    }

    fn keys(step: &Step) -> Vec<&str> {
        step.ops.iter().map(TaskOp::key).collect()
    }

    /// A new schedule's first tick creates its task and its record, both create-only;
    /// the next tick is a second later.
    #[test]
    fn a_first_tick_creates_its_task_and_the_record() {
        let def = definition(CatchUp::All, at(0));
        let (step, next) = step(&def, None, at(1), "q/", &leadership(), "n");
        let step = step.unwrap();
        assert_eq!(step.ticks, [at(1)]);
        assert_eq!(
            keys(&step),
            ["q/tick_beat-1795000001000", "leaderq/schedule-ticks/q/beat"]
        );
        assert!(step
            .ops
            .iter()
            .all(|op| matches!(op, TaskOp::Create { .. })));
        assert_eq!(next, Some(at(2)));
    }

    /// Later ticks rewrite the record at the version read, and record the tick written.
    #[test]
    fn a_later_tick_rewrites_the_record_at_its_version() {
        let def = definition(CatchUp::All, at(0));
        let (step, _) = step(
            &def,
            Some(&tick(at(4), 42)),
            at(5),
            "q/",
            &leadership(),
            "n",
        );
        let step = step.unwrap();
        let Some(TaskOp::Rewrite { version, value, .. }) = step.ops.last() else {
            panic!("{:?}", step.ops);
        };
        assert_eq!(*version, TaskVersion(42));
        let record = TickRecord::decode(value).unwrap();
        assert_eq!(record.last(), Some(at(5)));
        assert_eq!(record.fencing_token, FencingToken(7));
        assert_eq!(
            record.last_task.as_deref(),
            Some("q/tick_beat-1795000005000")
        );
    }

    /// Nothing due: no write, only the next tick.
    #[test]
    fn nothing_due_writes_nothing() {
        let def = definition(CatchUp::All, at(0));
        let (step, next) = step(&def, Some(&tick(at(5), 1)), at(5), "q/", &leadership(), "n");
        assert_eq!(step, None);
        assert_eq!(next, Some(at(6)));
    }

    /// A long catch-up is written a few ticks at a time, each write recording its own
    /// last tick, and asks to be stepped again at once.
    #[test]
    fn a_long_catch_up_is_written_in_parts() {
        let def = definition(CatchUp::All, at(0));
        let (step, next) = step(
            &def,
            Some(&tick(at(10), 1)),
            at(60),
            "q/",
            &leadership(),
            "n",
        );
        let step = step.unwrap();
        assert_eq!(step.ticks.len(), TICKS_PER_WRITE);
        assert_eq!(step.ticks[0], at(11));
        let Some(TaskOp::Rewrite { value, .. }) = step.ops.last() else {
            panic!()
        };
        let last = TickRecord::decode(value).unwrap().last();
        assert_eq!(last, Some(at(10 + TICKS_PER_WRITE as i64)));
        assert_eq!(next, Some(at(60)));
    }

    /// A tick record deleted by hand on an old schedule starts it afresh from now: no
    /// tick before now runs again; a new schedule starts from when it was applied.
    #[test]
    fn a_missing_record_never_replays_old_ticks() {
        let old = definition(CatchUp::All, at(0));
        let (step, next) = step(&old, None, at(100), "q/", &leadership(), "n");
        assert_eq!(step, None);
        assert_eq!(next, Some(at(101)));
        let fresh = definition(CatchUp::All, at(97));
        let (first, _) = super::step(&fresh, None, at(100), "q/", &leadership(), "n");
        assert_eq!(first.unwrap().ticks, [at(98), at(99), at(100)]);
    }
}
