//! The schedule definition's tests: reading specs from TOML and JSON, defaults, the way
//! back to a spec, every refusal with its message, and schedule files.

use serde_json::json;

use super::*;

fn spec() -> ScheduleSpec {
    ScheduleSpec {
        name: "nightly-backup".into(),
        cron: Some("30 2 * * *".into()),
        task_type: "backup".into(),
        ..ScheduleSpec::default()
    }
}

/// The message `spec`, changed by `change`, is refused with.
fn refusal(change: impl FnOnce(&mut ScheduleSpec)) -> String {
    let mut spec = spec();
    change(&mut spec);
    Schedule::from_spec(spec).unwrap_err().to_string()
}

/// A spec reads from TOML and from JSON, in our spelling or the producers'
/// (`taskType`, `taskPara`, `taskGroup`).
#[test]
fn a_spec_reads_from_toml_and_from_json_in_either_spelling() {
    let from_toml: ScheduleSpec = toml::from_str(
        r#"
        name = "report"
        every = "1h30m"
        task_type = "report"
        task_para = { to = "ops", pages = [1, 2] }
        task_group = "reports"
        catch_up = "all"
        catch_up_limit = 5
        paused = true
        "#,
    )
    .unwrap();
    let from_json: ScheduleSpec = serde_json::from_value(json!({
        "name": "report",
        "every": "1h30m",
        "taskType": "report",
        "taskPara": {"to": "ops", "pages": [1, 2]},
        "taskGroup": "reports",
        "catch_up": "all",
        "catch_up_limit": 5,
        "paused": true,
    }))
    .unwrap();
    assert_eq!(from_toml, from_json);
    let schedule = Schedule::from_spec(from_json).unwrap();
    assert_eq!(schedule.when, When::Every(Duration::from_secs(5400)));
    assert_eq!(
        schedule.task.task_para,
        json!({"to": "ops", "pages": [1, 2]})
    );
    assert_eq!(schedule.task.task_group.as_deref(), Some("reports"));
    assert_eq!(
        (schedule.catch_up, schedule.catch_up_limit),
        (CatchUp::All, 5)
    );
    assert!(schedule.paused);
}

/// A TOML date-time in `task_para` reaches the task as its RFC 3339 text.
#[test]
fn a_toml_date_time_in_task_para_becomes_its_text() {
    let spec: ScheduleSpec = toml::from_str(
        "name = \"a\"\nevery = \"1m\"\ntask_type = \"t\"\n\
         task_para = { since = 2026-05-01T10:00:00Z, days = [1979-05-27] }\n",
    )
    .unwrap();
    let schedule = Schedule::from_spec(spec).unwrap();
    assert_eq!(
        schedule.task.task_para,
        json!({"since": "2026-05-01T10:00:00Z", "days": ["1979-05-27"]})
    );
}

/// Left out, the time zone is UTC, catch-up is `latest` with a limit of 100, the task's
/// parameters are null and the schedule runs.
#[test]
fn defaults_fill_in_what_a_spec_leaves_out() {
    let schedule = Schedule::from_spec(spec()).unwrap();
    assert_eq!(schedule.timezone, Tz::UTC);
    assert_eq!(schedule.catch_up, CatchUp::Latest);
    assert_eq!(schedule.catch_up_limit, DEFAULT_CATCH_UP_LIMIT);
    assert_eq!(schedule.task.task_para, Value::Null);
    assert_eq!(schedule.task.task_group, None);
    assert!(!schedule.paused);
    assert_eq!(schedule.when.to_string(), "cron 30 2 * * *");
}

/// A schedule stored as JSON through `to_spec` reads back as the same schedule, with its
/// defaults written out.
#[test]
fn a_schedule_round_trips_through_its_spec_as_json() {
    let cron = Schedule::from_spec(ScheduleSpec {
        timezone: Some("Europe/Berlin".into()),
        task_group: Some("backups".into()),
        catch_up: Some(CatchUp::All),
        paused: true,
        ..spec()
    })
    .unwrap();
    let stored = serde_json::to_string(&cron.to_spec()).unwrap();
    let read: ScheduleSpec = serde_json::from_str(&stored).unwrap();
    assert_eq!(Schedule::from_spec(read).unwrap(), cron);
    let every = Schedule::from_spec(ScheduleSpec {
        every: Some("1h30m".into()),
        cron: None,
        task_para: json!([1, "two"]),
        ..spec()
    })
    .unwrap();
    let stored = serde_json::to_value(every.to_spec()).unwrap();
    assert_eq!(
        stored,
        json!({
            "name": "nightly-backup",
            "every": "1h30m0s",
            "timezone": "UTC",
            "task_type": "backup",
            "task_para": [1, "two"],
            "catch_up": "latest",
            "catch_up_limit": 100,
            "paused": false,
        })
    );
    let read: ScheduleSpec = serde_json::from_value(stored).unwrap();
    assert_eq!(Schedule::from_spec(read).unwrap(), every);
}

/// A name becomes part of coordinator keys: letters, digits, '.', '_' and '-', 1 to 128 of
/// them, and not "." or "..".
#[test]
fn a_name_must_be_safe_in_a_key() {
    for name in ["a", "nightly.backup_2-x", &"n".repeat(NAME_MAX)] {
        let mut spec = spec();
        spec.name = name.to_string();
        assert!(Schedule::from_spec(spec).is_ok(), "{name}");
    }
    for name in [
        "",
        "a/b",
        ".",
        "..",
        "with space",
        "é",
        &"n".repeat(NAME_MAX + 1),
    ] {
        let message = refusal(|s| s.name = name.to_string());
        assert!(message.starts_with("schedule name"), "{name}: {message}");
    }
    assert_eq!(
        refusal(|s| s.name = "a/b".into()),
        r#"schedule name "a/b" is not valid: use 1 to 128 letters, digits, '.', '_' or '-' (it becomes part of coordinator keys), and not "." or "..""#
    );
}

/// A schedule says when it runs with `every` or `cron`, exactly one of them.
#[test]
fn exactly_one_of_every_and_cron_is_given() {
    assert_eq!(
        refusal(|s| s.cron = None),
        r#"schedule "nightly-backup": say when it runs, with `every` (such as "5m") or `cron` (such as "0 3 * * *")"#
    );
    assert_eq!(
        refusal(|s| s.every = Some("5m".into())),
        r#"schedule "nightly-backup": give either `every` or `cron`, not both"#
    );
}

/// `every` is a Go duration of whole milliseconds, from 1s to 366 days.
#[test]
fn every_must_be_a_duration_in_range() {
    let every = |text: &str| {
        refusal(|s| {
            s.cron = None;
            s.every = Some(text.into());
        })
    };
    assert_eq!(
        every("5"),
        r#"schedule "nightly-backup": every "5" is not a duration (time: missing unit in duration "5"); write it like "30s", "5m" or "1h30m""#
    );
    assert!(every("10z").contains(r#"unknown unit "z""#));
    let out_of_range = r#"schedule "nightly-backup": every "500ms" is out of range; use at least 1s and at most 8784h (366 days), in whole milliseconds"#;
    assert_eq!(every("500ms"), out_of_range);
    for text in ["0", "8784h1s", "1.0005s"] {
        assert!(every(text).contains("is out of range"), "{text}");
    }
    for text in ["1s", "8784h", "1.5s"] {
        let mut spec = spec();
        spec.cron = None;
        spec.every = Some(text.into());
        assert!(Schedule::from_spec(spec).is_ok(), "{text}");
    }
}

/// A cron has 5 fields, or 6 with seconds first; the 7-field form with a year is refused.
#[test]
fn a_cron_has_five_or_six_fields() {
    assert_eq!(
        refusal(|s| s.cron = Some("0 0 1 1 * 2027 *".into())),
        r#"schedule "nightly-backup": cron "0 0 1 1 * 2027 *" has 7 fields; use 5 (minute hour day-of-month month day-of-week) or 6 with seconds first (a year field is not supported)"#
    );
    assert!(refusal(|s| s.cron = Some("* * * *".into())).contains("has 4 fields"));
    for expr in [
        "0 0 * * MON-FRI",
        "*/10 * * * * *",
        "0 0 L * *",
        "@daily",
        "0 0 ? * 5#2",
    ] {
        let mut spec = spec();
        spec.cron = Some(expr.into());
        assert!(Schedule::from_spec(spec).is_ok(), "{expr}");
    }
}

/// A cron croner cannot read is refused with croner's reason.
#[test]
fn a_cron_croner_refuses_is_refused() {
    let message = refusal(|s| s.cron = Some("61 * * * *".into()));
    assert!(
        message.starts_with(r#"schedule "nightly-backup": cron "61 * * * *" is not valid ("#),
        "{message}"
    );
    assert!(message.ends_with(
        "; use 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first"
    ));
}

/// A cron naming a date that never comes (February 30th) is refused.
#[test]
fn a_cron_that_never_matches_is_refused() {
    assert_eq!(
        refusal(|s| s.cron = Some("0 0 30 2 *".into())),
        r#"schedule "nightly-backup": cron "0 0 30 2 *" never matches a date; check its day of month against its months (February has at most 29 days)"#
    );
}

/// The time zone is an IANA name.
#[test]
fn an_unknown_time_zone_is_refused() {
    assert_eq!(
        refusal(|s| s.timezone = Some("Mars/Olympus".into())),
        r#"schedule "nightly-backup": unknown time zone "Mars/Olympus"; use an IANA name such as "UTC" or "Europe/Berlin""#
    );
}

/// A tick's task has a type, and a group, when given, is a short non-empty string.
#[test]
fn the_task_needs_a_type_and_a_sane_group() {
    assert_eq!(
        refusal(|s| s.task_type = " ".into()),
        r#"schedule "nightly-backup": task_type is empty; name the handler that runs its ticks"#
    );
    assert_eq!(
        refusal(|s| s.task_group = Some(String::new())),
        r#"schedule "nightly-backup": task_group must be a non-empty string of at most 256 bytes; leave it out for no group"#
    );
}

/// `catch_up_limit` runs from 1 to 10,000.
#[test]
fn catch_up_limit_must_be_in_range() {
    assert_eq!(
        refusal(|s| s.catch_up_limit = Some(0)),
        r#"schedule "nightly-backup": catch_up_limit 0 is out of range; use 1 to 10000"#
    );
    assert!(refusal(|s| s.catch_up_limit = Some(10_001)).contains("catch_up_limit 10001"));
}

/// A misspelt field or an unknown catch-up policy is refused when the spec is read.
#[test]
fn unknown_fields_and_policies_are_refused_when_read() {
    let misspelt = serde_json::from_value::<ScheduleSpec>(json!({
        "name": "a", "every": "1m", "task_type": "t", "catchup": "all",
    }));
    assert!(misspelt
        .unwrap_err()
        .to_string()
        .contains("unknown field `catchup`"));
    let policy = serde_json::from_value::<ScheduleSpec>(json!({
        "name": "a", "every": "1m", "task_type": "t", "catch_up": "sometimes",
    }));
    assert!(policy
        .unwrap_err()
        .to_string()
        .contains("unknown variant `sometimes`"));
}

/// A file of two `[[schedule]]` tables gives two schedules, in order.
#[test]
fn a_schedule_file_reads_every_table() {
    let schedules = parse_file(
        r#"
        [[schedule]]
        name = "nightly-backup"
        cron = "30 2 * * *"
        timezone = "America/New_York"
        taskType = "backup"

        [[schedule]]
        name = "heartbeat"
        every = "30s"
        task_type = "ping"
        catch_up = "none"
        [schedule.task_para]
        target = "db"
        "#,
    )
    .unwrap();
    let names: Vec<&str> = schedules.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["nightly-backup", "heartbeat"]);
    assert_eq!(schedules[0].timezone, chrono_tz::America::New_York);
    assert_eq!(schedules[1].task.task_para, json!({"target": "db"}));
    assert_eq!(schedules[1].catch_up, CatchUp::None);
    assert_eq!(parse_file("").unwrap(), vec![]);
}

/// Two schedules with one name are refused, as are TOML errors and invalid schedules.
#[test]
fn a_schedule_file_refuses_a_duplicate_name() {
    let twice = r#"
        [[schedule]]
        name = "a"
        every = "1m"
        task_type = "t"

        [[schedule]]
        name = "a"
        cron = "* * * * *"
        task_type = "t"
        "#;
    assert_eq!(
        parse_file(twice).unwrap_err().to_string(),
        r#"two schedules are named "a"; give each a unique name"#
    );
    let broken = parse_file("[[schedule]]\nname = \n");
    assert!(matches!(broken, Err(ScheduleError::File(_))), "{broken:?}");
    let unknown_table = parse_file("[[schedules]]\nname = \"a\"\n");
    assert!(matches!(unknown_table, Err(ScheduleError::File(_))));
    let invalid = parse_file("[[schedule]]\nname = \"a\"\ntask_type = \"t\"\n");
    assert_eq!(invalid, Err(ScheduleError::NoWhen("a".into())));
}
