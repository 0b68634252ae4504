//! The tick planner: given a schedule, the last tick enqueued and `now`, which ticks are
//! due, which of them to enqueue and which to skip under the schedule's catch-up policy,
//! and when the next tick falls. Pure: it never reads the clock, does no I/O and keeps no
//! state; the leader calls it, writes the ticks it returns, records [`Plan::last`] and
//! sleeps until [`Plan::next`].
//!
//! # Ticks
//! A tick is a target time. `every` ticks fall on the multiples of the interval since the
//! Unix epoch, so every replica computes the same ticks whatever its clock reading when the
//! schedule was applied; the time zone plays no part. `cron` ticks are read on the wall
//! clock of the schedule's time zone, to the second.
//!
//! # Daylight saving
//! A cron expression whose second, minute and hour fields are each one fixed value (such
//! as `30 2 * * *`) is a fixed time; any other (a `*`, a step, a list or a range in one of
//! them) is an interval. On a spring-forward day a fixed time that does not exist (02:30 in
//! America/New_York on 2026-03-08) runs once, at the first instant after the gap (03:00
//! local, 07:00 UTC); interval ticks inside the gap do not exist and are not run. On a
//! fall-back day a fixed time that happens twice (01:30 in America/New_York on 2026-11-01)
//! runs once, at its first pass; an interval (`*/15 * * * *`, `0 * * * *`) runs in both
//! passes of the repeated hour, as its ticks are real instants an interval apart. This is
//! croner's documented behaviour (vixie-cron's and the OCPS's); the tests below hold it to
//! these rules.
//!
//! # Catch-up
//! Due ticks are those after `max(last, since)` and at or before `now`. [`CatchUp::All`]
//! enqueues them all, but at most `catch_up_limit`, the latest ones; [`CatchUp::Latest`]
//! enqueues the latest; [`CatchUp::None`] enqueues the latest only if it is on time (at
//! most [`ON_TIME_GRACE`] ago). Whatever is not enqueued is counted as skipped. A clock
//! that went back plans nothing: a tick at or before `last` is never planned again.
//!
//! `every` ticks are counted by arithmetic, so a year without a leader costs the same as a
//! minute. Cron ticks are walked back from `now`, as many as are kept, then counted up to
//! [`SKIPPED_COUNT_LIMIT`] more; past that [`Plan::skipped_at_least`] says the count stopped.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;
use croner::Cron;

use super::{CatchUp, Schedule, When};

/// How late a tick may be and still count as on time for [`CatchUp::None`]. A healthy
/// leader wakes at its tick within milliseconds, but it may be writing a batch of claims or
/// waiting on a slow coordinator write when the tick falls, and dropping a tick for that
/// would make `none` lose ticks with a leader in place; three lease renewals at the default
/// lease TTL (10s, renewed every 3.3s) cover it. A tick missed in a real outage is mostly
/// later than this, as a failed leader's lease ends only a TTL after its last renewal; a
/// quick handover within the grace still runs the tick, which is what a tick barely missed
/// should do.
pub const ON_TIME_GRACE: TimeDelta = TimeDelta::seconds(10);

/// Cron ticks skipped are counted one by one, up to this many past the kept ones; the
/// count only feeds a log line and a metric, and "at least 10000" says enough after an
/// outage long enough to miss that many.
pub const SKIPPED_COUNT_LIMIT: u64 = 10_000;

/// What the leader does now for one schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The target times of the ticks to enqueue, ascending.
    pub enqueue: Vec<DateTime<Utc>>,
    /// Due ticks not enqueued, under the catch-up policy.
    pub skipped: u64,
    /// `skipped` is a lower bound: a cron schedule missed more than [`SKIPPED_COUNT_LIMIT`]
    /// ticks beyond those kept, and the count stopped there.
    pub skipped_at_least: bool,
    /// What to record as the schedule's last tick once the ticks in `enqueue` are written:
    /// the latest due tick, enqueued or skipped, so that skipped ticks are not planned (and
    /// counted) again. None when nothing was due; keep the previous record then.
    pub last: Option<DateTime<Utc>>,
    /// The next target time after everything considered, for the leader to sleep until;
    /// None when the schedule is paused or has no tick left.
    pub next: Option<DateTime<Utc>>,
}

/// The first tick strictly after `after`. `every` ignores `tz`; a cron reads its fields on
/// `tz`'s wall clock under the daylight-saving rules in this module's header.
pub fn next_tick(when: &When, tz: Tz, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    match when {
        When::Every(interval) => {
            let step = every_ms(interval)?;
            let k = after.timestamp_millis().div_euclid(step).checked_add(1)?;
            DateTime::from_timestamp_millis(k.checked_mul(step)?)
        }
        When::Cron { cron, .. } => {
            // Cron ticks are whole seconds, so the first one after `after` is the first
            // one after its whole second; croner is given whole seconds only.
            let start = whole_second(after)?.with_timezone(&tz);
            let found = cron.find_next_occurrence(&start, false).ok()?;
            Some(found.with_timezone(&Utc))
        }
    }
}

/// Plans one schedule at `now`. `last` is the target time of the last tick recorded (see
/// [`Plan::last`]), None if there is none; `since` is when the schedule was first applied,
/// and no tick at or before it ever runs.
pub fn plan(
    schedule: &Schedule,
    last: Option<DateTime<Utc>>,
    since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Plan {
    let mut plan = Plan {
        enqueue: Vec::new(),
        skipped: 0,
        skipped_at_least: false,
        last: None,
        next: None,
    };
    if schedule.paused {
        return plan;
    }
    let from = last.map_or(since, |last| last.max(since));
    plan.next = next_tick(&schedule.when, schedule.timezone, from.max(now));
    if now <= from {
        // Nothing new is due, or the clock went back behind the last tick.
        return plan;
    }
    let keep = match schedule.catch_up {
        CatchUp::All => schedule.catch_up_limit as usize,
        CatchUp::Latest | CatchUp::None => 1,
    };
    let due = match &schedule.when {
        When::Every(interval) => every_due(interval, from, now, keep),
        When::Cron { cron, .. } => cron_due(cron, schedule.timezone, from, now, keep),
    };
    plan.last = due.latest.last().copied();
    plan.skipped = due.earlier;
    plan.skipped_at_least = due.earlier_at_least;
    match schedule.catch_up {
        CatchUp::All | CatchUp::Latest => plan.enqueue = due.latest,
        CatchUp::None => match plan.last {
            Some(tick) if now - tick <= ON_TIME_GRACE => plan.enqueue = vec![tick],
            Some(_) => plan.skipped += 1,
            None => {}
        },
    }
    plan
}

/// The stable id of a tick, for its task key: `<name>-<target in epoch milliseconds,
/// zero-padded to 13 digits>`, so that a schedule's keys sort by time (until the year
/// 2286). It depends on nothing but the schedule's name and the target time, not on the
/// replica's clock, zone or settings, so every replica, and a leader that takes over
/// mid-plan, writes the same key for the same tick.
pub fn tick_id(schedule_name: &str, target: DateTime<Utc>) -> String {
    format!("{schedule_name}-{:013}", target.timestamp_millis())
}

/// The due ticks, after `from` and at or before `now`.
struct Due {
    /// The latest ones, at most as many as were asked for, ascending.
    latest: Vec<DateTime<Utc>>,
    /// How many due ticks come before `latest`.
    earlier: u64,
    /// `earlier` stopped counting at [`SKIPPED_COUNT_LIMIT`].
    earlier_at_least: bool,
}

/// The interval in milliseconds; validation keeps it whole and at least a second.
fn every_ms(interval: &std::time::Duration) -> Option<i64> {
    i64::try_from(interval.as_millis())
        .ok()
        .filter(|ms| *ms > 0)
}

fn whole_second(at: DateTime<Utc>) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(at.timestamp(), 0)
}

/// Ticks `k * step` with `from < k * step <= now`, by arithmetic. Both bounds are taken
/// to their whole millisecond below, which keeps the same ticks as ticks are whole ms.
fn every_due(
    interval: &std::time::Duration,
    from: DateTime<Utc>,
    now: DateTime<Utc>,
    keep: usize,
) -> Due {
    let mut due = Due {
        latest: Vec::new(),
        earlier: 0,
        earlier_at_least: false,
    };
    let Some(step) = every_ms(interval) else {
        return due;
    };
    let first = from.timestamp_millis().div_euclid(step);
    let last = now.timestamp_millis().div_euclid(step);
    let count = last.saturating_sub(first).max(0);
    let kept = count.min(i64::try_from(keep).unwrap_or(i64::MAX));
    due.latest = ((last - kept + 1)..=last)
        .filter_map(|k| DateTime::from_timestamp_millis(k.checked_mul(step)?))
        .collect();
    due.earlier = u64::try_from(count - kept).unwrap_or(0);
    due
}

/// Walks cron ticks back from `now` while they are after `from`: the first `keep` are
/// kept, then up to [`SKIPPED_COUNT_LIMIT`] more are counted.
fn cron_due(cron: &Cron, tz: Tz, from: DateTime<Utc>, now: DateTime<Utc>, keep: usize) -> Due {
    let mut due = Due {
        latest: Vec::new(),
        earlier: 0,
        earlier_at_least: false,
    };
    let Some(start) = whole_second(now) else {
        return due;
    };
    let mut cursor = start.with_timezone(&tz);
    // The first search includes `now`'s own second; each later one starts from the exact
    // instant the previous one returned, which tells croner which pass of a repeated hour
    // it is on.
    let mut inclusive = true;
    let mut bound = start;
    while let Ok(found) = cron.find_previous_occurrence(&cursor, inclusive) {
        let tick = found.with_timezone(&Utc);
        // Each tick must come before the one found before it (the first may be `now`'s
        // own second): croner promises a backward search never returns a later time, and
        // this check keeps the walk finite if it ever did.
        let moved_back = if inclusive {
            tick <= bound
        } else {
            tick < bound
        };
        if tick <= from || !moved_back {
            break;
        }
        inclusive = false;
        bound = tick;
        if due.latest.len() < keep {
            due.latest.push(tick);
        } else if due.earlier < SKIPPED_COUNT_LIMIT {
            due.earlier += 1;
        } else {
            due.earlier_at_least = true;
            break;
        }
        cursor = found;
    }
    due.latest.reverse();
    due
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
