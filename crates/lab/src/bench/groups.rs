//! The concurrency-groups measurement: drain rate of 100 ms handlers at `queue.concurrency`
//! 1, 8 and 32, on a fresh coordinator each, one in-process replica. Tasks are spread over
//! 64 groups, so a group never limits the rate below the concurrency: the ideal is
//! concurrency × 10 tasks/s.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::consumer::{settings, Target};
use super::{progress, Options, Report, TempDir};
use leaderq::coord::{Edit, Edited};
use leaderq::handler::{Handler, HandlerFuture, Registry, TaskContext};

const TASK_TYPE: &str = "BenchGroup";
/// What each run takes.
pub(super) const HANDLER_TIME: Duration = Duration::from_millis(100);
/// The concurrency settings measured.
const CONCURRENCIES: [usize; 3] = [1, 8, 32];
/// Groups the tasks are spread over (round-robin).
const GROUPS: usize = 64;
/// Tasks per unit of concurrency: about two seconds of runs at the ideal rate.
const TASKS_PER_SLOT: usize = 20;
/// A drain that takes longer than this is reported as far as it got.
const LIMIT: Duration = Duration::from_secs(120);

/// Sleeps HANDLER_TIME, then reports when it ended.
pub(super) struct Sleeper(pub(super) mpsc::UnboundedSender<Instant>);

impl Handler for Sleeper {
    fn handle<'a>(&'a self, _ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            tokio::time::sleep(HANDLER_TIME).await;
            let _ = self.0.send(Instant::now());
            Ok(())
        })
    }
}

/// Drain rate (tasks/s, first run's start to last run's end) at `concurrency`.
async fn drain(backend: &str, concurrency: usize) -> anyhow::Result<(usize, f64)> {
    let target = Target::start(backend)?;
    let dir = TempDir::new()?;
    let count = TASKS_PER_SLOT * concurrency;
    let tasks: Vec<Edit> = (0..count)
        .map(|n| Edit::Create {
            key: format!("oracleTask/g{n:05}"),
            value: json!({"taskId": format!("g{n:05}"), "taskTime": 1000 + n, "taskType": TASK_TYPE, "taskGroup": format!("group-{}", n % GROUPS)})
                .to_string()
                .into_bytes(),
        })
        .collect();
    for chunk in tasks.chunks(32) {
        if let Edited::Conflict(keys) = target.coord.edit(chunk).await? {
            bail!("enqueue: {keys:?} exist");
        }
    }
    let mut settings = settings(&target, "groups-1", &dir)?;
    settings.queue.concurrency = concurrency;
    let (ended_tx, mut ended) = mpsc::unbounded_channel();
    let mut registry = Registry::default();
    registry.register(TASK_TYPE, Sleeper(ended_tx));
    let stop = CancellationToken::new();
    let token = stop.clone();
    let replica = tokio::spawn(async move {
        if let Err(err) = leaderq::service::consume::run(settings, registry, token).await {
            tracing::error!(error = %err, "bench replica failed");
        }
    });
    let timed = ends(&mut ended, count).await;
    stop.cancel();
    let _ = replica.await;
    timed
}

/// Waits for `count` runs of HANDLER_TIME to end (or LIMIT): how many did, and their rate
/// from the first run's start to the last run's end, in tasks/s.
pub(super) async fn ends(
    ended: &mut mpsc::UnboundedReceiver<Instant>,
    count: usize,
) -> anyhow::Result<(usize, f64)> {
    let started = Instant::now();
    let first = tokio::time::timeout(LIMIT, ended.recv())
        .await
        .context("no task ended within the limit")?
        .context("replica stopped")?;
    // The first run began one handler time before it ended.
    let began = first.checked_sub(HANDLER_TIME).unwrap_or(first);
    let (mut last, mut seen) = (first, 1);
    while seen < count {
        let left = LIMIT.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, ended.recv()).await {
            Ok(Some(at)) => {
                last = at;
                seen += 1;
            }
            Ok(None) => bail!("replica stopped"),
            Err(_) => break,
        }
    }
    let rate = seen as f64 / last.duration_since(began).as_secs_f64().max(1e-9);
    Ok((seen, rate))
}

pub async fn section(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let backend = options.backend.as_str();
    let mut rows = Vec::new();
    for concurrency in CONCURRENCIES {
        progress(&format!(
            "groups: {} tasks of {} ms at concurrency {concurrency}",
            TASKS_PER_SLOT * concurrency,
            HANDLER_TIME.as_millis()
        ));
        let (seen, rate) = drain(backend, concurrency).await?;
        let ideal = concurrency as f64 * 1000.0 / HANDLER_TIME.as_millis() as f64;
        report.row(
            format!(
                "groups: drain of {} ms handlers at concurrency {concurrency}, tasks/s",
                HANDLER_TIME.as_millis()
            ),
            format!("{rate:.1}"),
            &format!("ideal {ideal:.0}"),
        );
        rows.push(json!({"concurrency": concurrency, "tasks": seen, "per_sec": rate, "ideal_per_sec": ideal}));
    }
    report.json.insert(
        "groups".into(),
        json!({"backend": backend, "handler_ms": HANDLER_TIME.as_millis() as u64, "groups": GROUPS, "drains": rows}),
    );
    Ok(())
}
