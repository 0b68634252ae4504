//! Schedule and scheduled-task measurements: tick accuracy (how late after its target time
//! each tick of an `every = "1s"` schedule reaches the coordinator) and the cost of an idle
//! scheduled task (the server's requests per minute while a task whose `runAt` is far
//! ahead waits, beside the same window with an empty queue).
//!
//! One replica runs in this process, as in `consumer.rs`. Tick times are observed on the
//! coordinator, not in the replica: a blocking read of the schedule's tick record, which
//! the leader writes in the same transaction as the tick's task, returns when the tick is
//! enqueued, and the record names the tick's target time. So a tick is measured as a
//! consumer of the queue sees it. Request counts come from `leaderq server`'s `/metrics`,
//! so the idle cost is measured on that backend only.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chrono::Utc;
use serde_json::json;
use tokio::sync::mpsc;

use super::consumer::{self, Target, LEADER_LIMIT, TASK_TYPE};
use super::{progress, Options, Report, TempDir};
use crate::chaos::wait_for_leader;
use leaderq::coord::{Coordinator, Version};
use leaderq::schedule::store::{self, TickRecord};

/// Ticks of the 1 s schedule measured (the first one seen is not: it may predate the watch).
const TICKS: usize = 15;
/// The schedule measured; a tick a second is the finest `every` an operator would use.
const SCHEDULE: &str = "[[schedule]]\nname = \"bench\"\nevery = \"1s\"\ntask_type = \"Bench\"\n";
/// Each request-count window; long enough that a once-a-minute request would show up
/// about every fourth run, short enough to keep the section near half a minute.
const IDLE_WINDOW: Duration = Duration::from_secs(8);
/// How far ahead the idle scheduled task's `runAt` is: well past the windows.
const RUN_AT_AHEAD: chrono::Duration = chrono::Duration::minutes(10);
/// What a new leader does once (its records, the first prune of the history) is over by
/// then, and so is the leader's reaction to a new task.
const SETTLE: Duration = Duration::from_secs(1);
/// How long one blocking read of the tick records waits.
const WATCH_WAIT: Duration = Duration::from_secs(5);

/// Milliseconds at quantile `q` of sorted `samples`.
fn quantile(samples: &[f64], q: f64) -> f64 {
    let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
    samples[i]
}

/// Requests the server answered between two reads of its counters.
fn spent(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> f64 {
    after
        .iter()
        .map(|(endpoint, n)| n - before.get(endpoint).copied().unwrap_or(0.0))
        .sum()
}

/// The server's requests per minute over `IDLE_WINDOW`, or None off `leaderq server`.
async fn requests_per_minute(target: &Target) -> Option<f64> {
    let before = target.requests().await?;
    tokio::time::sleep(IDLE_WINDOW).await;
    let after = target.requests().await?;
    Some(spent(&before, &after) * 60.0 / IDLE_WINDOW.as_secs_f64())
}

pub async fn section(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let target = Target::start(&options.backend)?;
    let dir = TempDir::new()?;
    let (starts_tx, _starts) = mpsc::unbounded_channel();
    let replica = consumer::start_replica(&target, "sched-1", &dir, &starts_tx)?;
    wait_for_leader(target.coord.as_ref(), &[], LEADER_LIMIT).await?;
    tokio::time::sleep(SETTLE).await;

    // The idle cost: the same window with an empty queue, then with one task due later.
    progress(&format!(
        "schedules: server requests over {}s, empty queue, then one task due in 10 min",
        IDLE_WINDOW.as_secs()
    ));
    let empty = requests_per_minute(&target).await;
    let run_at = leaderq::task::rfc3339(Utc::now() + RUN_AT_AHEAD);
    let body = json!({"taskId": "later", "taskTime": 1, "taskTaken": false, "taskType": TASK_TYPE, "taskPara": {}, "runAt": run_at});
    consumer::put_body(target.coord.as_ref(), "later", body.to_string()).await?;
    tokio::time::sleep(SETTLE).await;
    let waiting = match empty {
        Some(_) => requests_per_minute(&target).await,
        None => None,
    };

    // Tick accuracy, with that task still waiting in the queue.
    progress(&format!(
        "schedules: {TICKS} ticks of an every = \"1s\" schedule"
    ));
    let settings = consumer::settings(&target, "bench-apply", &dir)?;
    let schedules = leaderq::schedule::parse_file(SCHEDULE)?;
    leaderq::operate::schedules::apply(target.coord.as_ref(), &settings, schedules, Utc::now())
        .await
        .context("cannot apply the bench schedule")?;
    let late = watch_ticks(
        target.coord.as_ref(),
        &store::ticks_prefix(&settings.queue.prefix),
    )
    .await?;
    consumer::stop_all(vec![replica]).await;
    drop(target);

    let mut sorted = late.clone();
    sorted.sort_by(f64::total_cmp);
    let (p50, p99, max) = (
        quantile(&sorted, 0.5),
        quantile(&sorted, 0.99),
        quantile(&sorted, 1.0),
    );
    report.row(
        format!("schedules: tick enqueued - target, every 1s ({TICKS}x), ms p50/p99"),
        format!("{p50:.1}/{p99:.1}"),
        "p99 < 100",
    );
    let show = |rate: Option<f64>| rate.map_or("n/a".to_string(), |r| format!("{r:.1}"));
    report.row(
        "schedules: server requests/min, leader of an empty queue",
        show(empty),
        "",
    );
    report.row(
        "schedules: server requests/min, one task due in 10 min",
        show(waiting),
        "",
    );
    let extra = empty.zip(waiting).map(|(e, w)| w - e);
    report.row(
        "schedules: extra requests/min of the waiting task",
        show(extra),
        "0",
    );
    report.json.insert(
        "schedules".into(),
        json!({
            "tick_late_ms": {"every": "1s", "ticks": TICKS, "p50": p50, "p99": p99, "max": max, "samples": late},
            "idle_requests_per_min": {"window_s": IDLE_WINDOW.as_secs(), "empty_queue": empty, "task_waiting": waiting, "extra": extra},
        }),
    );
    Ok(())
}

/// Watches the schedule's tick record with blocking reads until `TICKS` new ticks have been
/// seen, and returns for each how many milliseconds after its target time it appeared.
async fn watch_ticks(coord: &dyn Coordinator, prefix: &str) -> anyhow::Result<Vec<f64>> {
    // Twice the ticks' own time, plus an election's worth, guards against a stalled ticker.
    let limit = Instant::now() + Duration::from_secs(2 * TICKS as u64) + LEADER_LIMIT;
    let mut after = Version::default();
    let mut last = None;
    let mut late = Vec::with_capacity(TICKS);
    while late.len() < TICKS {
        if Instant::now() > limit {
            bail!("only {} ticks were enqueued", late.len());
        }
        let (records, version) = coord.list(prefix, after, WATCH_WAIT).await?;
        let seen = Utc::now();
        after = version;
        let target = records
            .iter()
            .filter_map(|record| TickRecord::decode(&record.value)?.last())
            .max();
        if let Some(target) = target {
            if last.is_some() && last != Some(target) {
                late.push((seen - target).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e3);
            }
            last = Some(target);
        }
    }
    Ok(late)
}
