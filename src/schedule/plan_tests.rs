//! The tick planner's tests, on scripted time: tick alignment, cron fields, daylight saving
//! in America/New_York, Europe/Berlin and Australia/Lord_Howe, month ends and leap days,
//! each catch-up policy after a leaderless hour, the limits that keep planning bounded,
//! and the clock going back.

use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;

use super::*;
use crate::schedule::{Schedule, ScheduleSpec};

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

fn zone(name: &str) -> Tz {
    name.parse().unwrap()
}

fn every(interval: &str, catch_up: CatchUp) -> Schedule {
    Schedule::from_spec(ScheduleSpec {
        name: "s".into(),
        every: Some(interval.into()),
        task_type: "t".into(),
        catch_up: Some(catch_up),
        ..ScheduleSpec::default()
    })
    .unwrap()
}

fn cron(expr: &str, timezone: &str, catch_up: CatchUp) -> Schedule {
    Schedule::from_spec(ScheduleSpec {
        name: "s".into(),
        cron: Some(expr.into()),
        timezone: Some(timezone.into()),
        task_type: "t".into(),
        catch_up: Some(catch_up),
        catch_up_limit: Some(10_000),
        ..ScheduleSpec::default()
    })
    .unwrap()
}

/// The ticks after `from` and at or before `to`, one `next_tick` after another.
fn forward(schedule: &Schedule, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let mut ticks = Vec::new();
    let mut after = from;
    while let Some(tick) = next_tick(&schedule.when, schedule.timezone, after) {
        if tick > to {
            break;
        }
        ticks.push(tick);
        after = tick;
    }
    ticks
}

fn minutes(from: &str, count: i64) -> Vec<DateTime<Utc>> {
    (0..count)
        .map(|n| at(from) + TimeDelta::minutes(n))
        .collect()
}

/// `every` ticks are the multiples of the interval since the epoch, whatever the zone and
/// however far into a second `after` is.
#[test]
fn every_ticks_fall_on_multiples_of_the_interval_since_the_epoch() {
    let second = every("1s", CatchUp::All);
    let utc = zone("UTC");
    let next = |s: &Schedule, tz: Tz, after: &str| next_tick(&s.when, tz, at(after));
    assert_eq!(
        next(&second, utc, "2026-05-01T10:00:00.500Z"),
        Some(at("2026-05-01T10:00:01Z"))
    );
    assert_eq!(
        next(&second, utc, "2026-05-01T10:00:01Z"),
        Some(at("2026-05-01T10:00:02Z"))
    );
    let seven = every("7m", CatchUp::All);
    assert_eq!(
        next(&seven, utc, "1970-01-01T00:00:00Z"),
        Some(at("1970-01-01T00:07:00Z"))
    );
    // 2026-05-01T10:00Z is minute 29,627,160 since the epoch, 3 past a multiple of 7; the
    // zone changes nothing.
    for tz in [utc, zone("Asia/Kolkata")] {
        assert_eq!(
            next(&seven, tz, "2026-05-01T10:00:00Z"),
            Some(at("2026-05-01T10:04:00Z"))
        );
    }
}

/// A five-field cron runs on the minute of its zone's wall clock.
#[test]
fn five_field_cron_runs_on_its_zones_wall_clock() {
    let daily = cron("0 3 * * *", "Europe/Berlin", CatchUp::All);
    assert_eq!(
        forward(
            &daily,
            at("2026-06-01T00:00:00Z"),
            at("2026-06-03T00:00:00Z")
        ),
        vec![at("2026-06-01T01:00:00Z"), at("2026-06-02T01:00:00Z")]
    );
    let utc = cron("*/20 * * * *", "UTC", CatchUp::All);
    assert_eq!(
        next_tick(&utc.when, utc.timezone, at("2026-06-01T10:20:00.999Z")),
        Some(at("2026-06-01T10:40:00Z"))
    );
}

/// A six-field cron reads its first field as seconds.
#[test]
fn six_field_cron_reads_seconds_first() {
    let half = cron("30 * * * * *", "UTC", CatchUp::All);
    assert_eq!(
        forward(
            &half,
            at("2026-06-01T10:00:00Z"),
            at("2026-06-01T10:02:00Z")
        ),
        vec![at("2026-06-01T10:00:30Z"), at("2026-06-01T10:01:30Z")]
    );
}

/// 02:30 does not exist in New York on 2026-03-08: the tick runs once, at 03:00 EDT.
#[test]
fn a_fixed_time_in_the_spring_forward_gap_runs_once_just_after_it() {
    let s = cron("30 2 * * *", "America/New_York", CatchUp::All);
    assert_eq!(
        forward(&s, at("2026-03-07T00:00:00Z"), at("2026-03-10T00:00:00Z")),
        vec![
            at("2026-03-07T07:30:00Z"),
            at("2026-03-08T07:00:00Z"),
            at("2026-03-09T06:30:00Z"),
        ]
    );
}

/// 01:30 happens twice in New York on 2026-11-01: the tick runs once, in EDT.
#[test]
fn a_fixed_time_repeated_by_fall_back_runs_once_at_its_first_pass() {
    let s = cron("30 1 * * *", "America/New_York", CatchUp::All);
    assert_eq!(
        forward(&s, at("2026-10-31T00:00:00Z"), at("2026-11-03T00:00:00Z")),
        vec![
            at("2026-10-31T05:30:00Z"),
            at("2026-11-01T05:30:00Z"),
            at("2026-11-02T06:30:00Z"),
        ]
    );
}

/// An interval cron runs in both passes of the repeated hour, every 15 real minutes.
#[test]
fn an_interval_cron_runs_in_both_passes_of_the_repeated_hour() {
    let s = cron("*/15 * * * *", "America/New_York", CatchUp::All);
    let ticks = forward(&s, at("2026-11-01T04:50:00Z"), at("2026-11-01T07:00:00Z"));
    // 01:00 to 01:45 EDT, 01:00 to 01:45 EST, then 02:00 EST.
    let expected: Vec<_> = (0..9)
        .map(|n| at("2026-11-01T05:00:00Z") + TimeDelta::minutes(15 * n))
        .collect();
    assert_eq!(ticks, expected);
    let hourly = cron("0 * * * *", "America/New_York", CatchUp::All);
    assert_eq!(
        forward(
            &hourly,
            at("2026-11-01T04:30:00Z"),
            at("2026-11-01T06:30:00Z")
        ),
        vec![at("2026-11-01T05:00:00Z"), at("2026-11-01T06:00:00Z")]
    );
}

/// Interval ticks inside the spring-forward gap do not exist and are not run.
#[test]
fn an_interval_cron_skips_the_spring_forward_gap() {
    let s = cron("*/15 * * * *", "America/New_York", CatchUp::All);
    assert_eq!(
        forward(&s, at("2026-03-08T06:40:00Z"), at("2026-03-08T07:15:00Z")),
        vec![
            at("2026-03-08T06:45:00Z"),
            at("2026-03-08T07:00:00Z"),
            at("2026-03-08T07:15:00Z"),
        ]
    );
}

/// A leader planning inside a repeated or skipped hour finds the same ticks as one
/// walking forward: the second pass of 01:30 never runs, both passes of `*/15` do, and
/// 02:30 on the spring-forward day runs at 03:00.
#[test]
fn planning_inside_a_daylight_saving_change_runs_each_tick_once() {
    let since = at("2026-01-01T00:00:00Z");
    let fixed = cron("30 1 * * *", "America/New_York", CatchUp::All);
    let first_pass = Some(at("2026-11-01T05:30:00Z"));
    for now in ["2026-11-01T06:30:00Z", "2026-11-01T06:45:00Z"] {
        let p = plan(&fixed, first_pass, since, at(now));
        assert!(p.enqueue.is_empty(), "{now}");
        assert_eq!(p.next, Some(at("2026-11-02T06:30:00Z")));
    }
    let p = plan(
        &fixed,
        None,
        at("2026-11-01T05:00:00Z"),
        at("2026-11-01T06:31:00Z"),
    );
    assert_eq!(p.enqueue, vec![at("2026-11-01T05:30:00Z")]);
    let interval = cron("*/15 * * * *", "America/New_York", CatchUp::All);
    let p = plan(
        &interval,
        Some(at("2026-11-01T05:45:00Z")),
        since,
        at("2026-11-01T06:16:00Z"),
    );
    assert_eq!(
        p.enqueue,
        vec![at("2026-11-01T06:00:00Z"), at("2026-11-01T06:15:00Z")]
    );
    let gap = cron("30 2 * * *", "America/New_York", CatchUp::None);
    let p = plan(
        &gap,
        Some(at("2026-03-07T07:30:00Z")),
        since,
        at("2026-03-08T07:00:05Z"),
    );
    assert_eq!(p.enqueue, vec![at("2026-03-08T07:00:00Z")]);
    assert_eq!(p.next, Some(at("2026-03-09T06:30:00Z")));
}

/// Berlin's changes follow the same rules: once after the gap, once at the first pass.
#[test]
fn berlin_fixed_times_follow_the_same_daylight_saving_rules() {
    let s = cron("30 2 * * *", "Europe/Berlin", CatchUp::All);
    assert_eq!(
        forward(&s, at("2026-03-28T12:00:00Z"), at("2026-03-30T12:00:00Z")),
        vec![at("2026-03-29T01:00:00Z"), at("2026-03-30T00:30:00Z")]
    );
    assert_eq!(
        forward(&s, at("2026-10-24T12:00:00Z"), at("2026-10-26T12:00:00Z")),
        vec![at("2026-10-25T00:30:00Z"), at("2026-10-26T01:30:00Z")]
    );
}

/// Walking back from `now` (the planner) finds the same cron ticks as walking forward
/// (`next_tick`), across every daylight-saving change of 2026 in three zones, Lord Howe's
/// half-hour change among them.
#[test]
fn cron_plans_agree_with_forward_ticks_across_daylight_saving() {
    let days = [
        (
            "America/New_York",
            "2026-03-07T12:00:00Z",
            "2026-03-09T12:00:00Z",
        ),
        (
            "America/New_York",
            "2026-10-31T12:00:00Z",
            "2026-11-02T12:00:00Z",
        ),
        (
            "Europe/Berlin",
            "2026-03-28T12:00:00Z",
            "2026-03-30T12:00:00Z",
        ),
        (
            "Europe/Berlin",
            "2026-10-24T12:00:00Z",
            "2026-10-26T12:00:00Z",
        ),
        (
            "Australia/Lord_Howe",
            "2026-04-04T00:00:00Z",
            "2026-04-06T00:00:00Z",
        ),
        (
            "Australia/Lord_Howe",
            "2026-10-03T00:00:00Z",
            "2026-10-05T00:00:00Z",
        ),
    ];
    let patterns = [
        "*/15 * * * *",
        "0 * * * *",
        "30 2 * * *",
        "30 1 * * *",
        "15 2 * * *",
        "0 30 1 * * *",
        "*/10 2 * * *",
    ];
    for (tz, from, to) in days {
        for pattern in patterns {
            let s = cron(pattern, tz, CatchUp::All);
            let planned = plan(&s, Some(at(from)), at(from), at(to));
            assert_eq!(
                planned.enqueue,
                forward(&s, at(from), at(to)),
                "{pattern} in {tz}"
            );
            assert_eq!(planned.skipped, 0, "{pattern} in {tz}");
        }
    }
}

/// `0 0 31 * *` runs only in months with a 31st.
#[test]
fn a_day_31_cron_skips_shorter_months() {
    let s = cron("0 0 31 * *", "UTC", CatchUp::All);
    assert_eq!(
        forward(&s, at("2026-04-01T00:00:00Z"), at("2026-09-01T00:00:00Z")),
        vec![
            at("2026-05-31T00:00:00Z"),
            at("2026-07-31T00:00:00Z"),
            at("2026-08-31T00:00:00Z"),
        ]
    );
}

/// `L` is the last day of each month, the 29th of February in a leap year.
#[test]
fn a_last_day_cron_follows_each_months_length() {
    let s = cron("0 0 L * *", "UTC", CatchUp::All);
    assert_eq!(
        forward(&s, at("2026-02-01T00:00:00Z"), at("2026-05-01T00:00:00Z")),
        vec![
            at("2026-02-28T00:00:00Z"),
            at("2026-03-31T00:00:00Z"),
            at("2026-04-30T00:00:00Z"),
        ]
    );
    assert_eq!(
        next_tick(&s.when, s.timezone, at("2028-02-01T00:00:00Z")),
        Some(at("2028-02-29T00:00:00Z"))
    );
}

/// A leap-day cron waits for the next 29th of February.
#[test]
fn a_leap_day_cron_waits_for_the_next_leap_year() {
    let s = cron("0 0 29 2 *", "UTC", CatchUp::All);
    assert_eq!(
        next_tick(&s.when, s.timezone, at("2026-03-01T00:00:00Z")),
        Some(at("2028-02-29T00:00:00Z"))
    );
}

/// After a leaderless hour, `all` enqueues every missed minute, 10:01 to 11:00.
#[test]
fn catch_up_all_enqueues_every_missed_tick() {
    for s in [
        every("1m", CatchUp::All),
        cron("* * * * *", "UTC", CatchUp::All),
    ] {
        let p = plan(
            &s,
            Some(at("2026-05-01T10:00:00Z")),
            at("2026-01-01T00:00:00Z"),
            at("2026-05-01T11:00:00.500Z"),
        );
        assert_eq!(p.enqueue, minutes("2026-05-01T10:01:00Z", 60), "{}", s.when);
        assert_eq!((p.skipped, p.skipped_at_least), (0, false));
        assert_eq!(p.last, Some(at("2026-05-01T11:00:00Z")));
        assert_eq!(p.next, Some(at("2026-05-01T11:01:00Z")));
    }
}

/// After a leaderless hour, `latest` enqueues 11:00 alone and skips the other 59.
#[test]
fn catch_up_latest_enqueues_only_the_latest_missed_tick() {
    for s in [
        every("1m", CatchUp::Latest),
        cron("* * * * *", "UTC", CatchUp::Latest),
    ] {
        let p = plan(
            &s,
            Some(at("2026-05-01T10:00:00Z")),
            at("2026-01-01T00:00:00Z"),
            at("2026-05-01T11:00:00.500Z"),
        );
        assert_eq!(p.enqueue, vec![at("2026-05-01T11:00:00Z")], "{}", s.when);
        assert_eq!(p.skipped, 59);
        assert_eq!(p.next, Some(at("2026-05-01T11:01:00Z")));
    }
}

/// `none` enqueues the latest tick while it is on time (up to ON_TIME_GRACE late) and
/// skips everything once it is later than that, recording it so it is not planned again.
#[test]
fn catch_up_none_enqueues_a_tick_only_while_it_is_on_time() {
    for s in [
        every("1m", CatchUp::None),
        cron("* * * * *", "UTC", CatchUp::None),
    ] {
        let last = Some(at("2026-05-01T10:00:00Z"));
        let since = at("2026-01-01T00:00:00Z");
        let half_second_late = plan(&s, last, since, at("2026-05-01T11:00:00.500Z"));
        assert_eq!(half_second_late.enqueue, vec![at("2026-05-01T11:00:00Z")]);
        assert_eq!(half_second_late.skipped, 59);
        let at_the_grace = plan(&s, last, since, at("2026-05-01T11:00:10Z"));
        assert_eq!(at_the_grace.enqueue, vec![at("2026-05-01T11:00:00Z")]);
        let half_minute_late = plan(&s, last, since, at("2026-05-01T11:00:30Z"));
        assert!(half_minute_late.enqueue.is_empty());
        assert_eq!(half_minute_late.skipped, 60);
        assert_eq!(half_minute_late.last, Some(at("2026-05-01T11:00:00Z")));
        assert_eq!(half_minute_late.next, Some(at("2026-05-01T11:01:00Z")));
    }
}

/// `all` enqueues at most `catch_up_limit` ticks, the latest ones, and counts the rest.
#[test]
fn catch_up_all_keeps_only_the_latest_limit_ticks() {
    for mut s in [
        every("1m", CatchUp::All),
        cron("* * * * *", "UTC", CatchUp::All),
    ] {
        s.catch_up_limit = 10;
        let p = plan(
            &s,
            Some(at("2026-05-01T10:00:00Z")),
            at("2026-01-01T00:00:00Z"),
            at("2026-05-01T11:00:00Z"),
        );
        assert_eq!(p.enqueue, minutes("2026-05-01T10:51:00Z", 10), "{}", s.when);
        assert_eq!((p.skipped, p.skipped_at_least), (50, false));
    }
}

/// A year without a leader, ticking every second, is counted by arithmetic: 31,536,000
/// due, the latest 10,000 enqueued.
#[test]
fn a_leaderless_year_of_every_second_is_planned_without_walking_it() {
    let mut s = every("1s", CatchUp::All);
    s.catch_up_limit = 10_000;
    let since = at("2024-06-01T00:00:00Z");
    let now = at("2026-01-01T00:00:00Z");
    let p = plan(&s, Some(at("2025-01-01T00:00:00Z")), since, now);
    assert_eq!(p.enqueue.len(), 10_000);
    assert_eq!(p.enqueue.first(), Some(&(now - TimeDelta::seconds(9_999))));
    assert_eq!(p.enqueue.last(), Some(&now));
    assert_eq!(
        (p.skipped, p.skipped_at_least),
        (31_536_000 - 10_000, false)
    );
}

/// A cron's skipped ticks are counted up to SKIPPED_COUNT_LIMIT, and the plan says when
/// the count stopped there.
#[test]
fn cron_skip_counts_stop_at_the_limit() {
    let s = cron("* * * * * *", "UTC", CatchUp::Latest);
    let last = Some(at("2026-05-01T00:00:00Z"));
    let since = at("2026-01-01T00:00:00Z");
    let day = plan(&s, last, since, at("2026-05-02T00:00:00Z"));
    assert_eq!(day.enqueue, vec![at("2026-05-02T00:00:00Z")]);
    assert_eq!(
        (day.skipped, day.skipped_at_least),
        (SKIPPED_COUNT_LIMIT, true)
    );
    let hour = plan(&s, last, since, at("2026-05-01T01:00:00Z"));
    assert_eq!((hour.skipped, hour.skipped_at_least), (3_599, false));
}

/// A clock that went back behind the last tick plans nothing, and the next tick is the one
/// after the last: a tick is never planned twice.
#[test]
fn a_clock_that_steps_back_plans_nothing_again() {
    for s in [
        every("1m", CatchUp::All),
        cron("* * * * *", "UTC", CatchUp::All),
    ] {
        let p = plan(
            &s,
            Some(at("2026-05-01T11:00:00Z")),
            at("2026-01-01T00:00:00Z"),
            at("2026-05-01T10:30:00Z"),
        );
        assert!(p.enqueue.is_empty(), "{}", s.when);
        assert_eq!((p.skipped, p.last), (0, None));
        assert_eq!(p.next, Some(at("2026-05-01T11:01:00Z")));
    }
}

/// A paused schedule enqueues nothing and asks for no wake-up.
#[test]
fn a_paused_schedule_plans_nothing() {
    let mut s = every("1m", CatchUp::All);
    s.paused = true;
    let p = plan(
        &s,
        Some(at("2026-05-01T10:00:00Z")),
        at("2026-01-01T00:00:00Z"),
        at("2026-05-01T11:00:00Z"),
    );
    assert!(p.enqueue.is_empty());
    assert_eq!((p.skipped, p.last, p.next), (0, None, None));
}

/// A schedule never fires a tick at or before the time it was applied, even one that falls
/// on that very instant.
#[test]
fn a_new_schedule_never_fires_at_or_before_since() {
    let s = every("1m", CatchUp::All);
    let since = at("2026-05-01T10:00:00Z");
    let at_since = plan(&s, None, since, since);
    assert!(at_since.enqueue.is_empty());
    assert_eq!(at_since.next, Some(at("2026-05-01T10:01:00Z")));
    let later = plan(&s, None, since, at("2026-05-01T10:05:00Z"));
    assert_eq!(later.enqueue, minutes("2026-05-01T10:01:00Z", 5));
    // A `last` older than `since` (the schedule was removed and applied again) is ignored.
    let reapplied = plan(
        &s,
        Some(at("2026-04-01T00:00:00Z")),
        since,
        at("2026-05-01T10:02:00Z"),
    );
    assert_eq!(reapplied.enqueue, minutes("2026-05-01T10:01:00Z", 2));
}

/// `next` is always after `now` and is the very next tick, so no tick is slept through.
#[test]
fn next_is_the_first_tick_after_now() {
    let s = every("15m", CatchUp::Latest);
    let last = Some(at("2026-05-01T10:00:00Z"));
    let since = at("2026-01-01T00:00:00Z");
    for (now, next) in [
        ("2026-05-01T10:00:00Z", "2026-05-01T10:15:00Z"),
        ("2026-05-01T10:14:59.999Z", "2026-05-01T10:15:00Z"),
        ("2026-05-01T10:15:00Z", "2026-05-01T10:30:00Z"),
        ("2026-05-01T13:07:00Z", "2026-05-01T13:15:00Z"),
    ] {
        assert_eq!(plan(&s, last, since, at(now)).next, Some(at(next)), "{now}");
    }
}

/// A tick's id is its schedule's name and its epoch milliseconds padded to 13 digits, so
/// ids sort by time as strings.
#[test]
fn tick_ids_sort_by_time() {
    assert_eq!(
        tick_id("backup", at("2026-05-01T10:00:00Z")),
        "backup-1777629600000"
    );
    assert_eq!(
        tick_id("backup", at("1970-01-01T00:00:01Z")),
        "backup-0000000001000"
    );
    assert!(tick_id("a", at("1970-01-01T00:00:01Z")) < tick_id("a", at("2001-09-09T01:46:40Z")));
}
