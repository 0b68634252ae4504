//! The backlog measurement: how fast one `leaderq consume` process drains a queue that
//! backed up, and how much memory it takes, at growing backlogs (1k, 10k, 100k no-op tasks
//! by default), beside the protocol's floor. Each backlog is enqueued first on a fresh
//! coordinator (in create-only batches through the seam, so it is quick on every backend),
//! then one replica starts; the drain is timed from its election to an empty queue, and
//! its peak RSS read from /proc before it stops. On the same coordinator the same backlog
//! is enqueued again and drained by the minimal native client of `floor/`, before or after
//! leaderq's drain by turns. Each backlog is drained several times (`runs_for`), and the
//! median rates reported, with their ratio and what a task cost the server either way (its
//! own counters, with the bench's own polling of the queue taken out). Writes a row per
//! backlog, a JSON object and an SVG chart (rate and RSS against backlog, drawn here by
//! hand: a chart is a few lines of SVG).
//!
//! Size: one measurement, leaderq's drain with the floor's beside it, what each cost the
//! server, and its chart.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

use super::consumer::{task_body, task_body_at, Target, BACKLOG_TASK_TIME, TASK_TYPE};
use super::floor::{self, Counters};
use super::{mib, progress, rss_of, Options, Report, TempDir};
use crate::chaos::leader_node;
use leaderq::coord::{Coordinator, Edit, Edited};

/// Backlogs measured when none are given.
pub const DEFAULT_BACKLOGS: [usize; 3] = [1_000, 10_000, 100_000];
/// Where the chart goes when no path is given (the current directory).
pub const DEFAULT_CHART: &str = "bench-backlog.svg";
/// Concurrent writers of the backlog.
const ENQUEUE_CLIENTS: usize = 16;
/// Tasks per create-only batch at most (fewer if the coordinator's limits are lower).
const ENQUEUE_BATCH: usize = 64;
/// A drain that has not emptied the queue by then is reported as far as it got.
const DRAIN_LIMIT: Duration = Duration::from_secs(300);
/// How many times a backlog is drained; the median rate is reported. A 1k drain lasts
/// tens of milliseconds and moves with whatever else the machine does, so small backlogs
/// are drained more often: 15 times up to 20k tasks, 3 times at 100k and more.
fn runs_for(backlog: usize) -> usize {
    (300_000 / backlog.max(1)).clamp(3, 15)
}
/// How long the bench waits for the replica to win the election.
const LEADER_LIMIT: Duration = Duration::from_secs(30);
/// Polls of each kind the bench makes to learn what one costs the server, so that its
/// polling during leaderq's drain can be taken out of leaderq's cost.
const POLL_PROBES: usize = 20;
/// A server's counters that cannot be read by then are left out.
const COUNTERS_LIMIT: Duration = Duration::from_secs(5);

/// One backlog's drain.
#[derive(Clone, Debug)]
pub struct Drain {
    pub backlog: usize,
    pub drained: usize,
    pub seconds: f64,
    pub rate: f64,
    pub peak_rss: u64,
}

/// The floor's drains of one backlog beside leaderq's, and what a task cost the server
/// either way (per task, summed over the runs; `None` where it keeps no counters).
#[derive(Clone, Debug)]
struct Beside {
    floor_rate: f64,
    leaderq_cost: Option<Counters>,
    floor_cost: Option<Counters>,
}

impl Beside {
    fn ratio(&self, drain: &Drain) -> f64 {
        if self.floor_rate > 0.0 {
            drain.rate / self.floor_rate
        } else {
            0.0
        }
    }
}

pub async fn section(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let mut drains = Vec::new();
    let mut besides = Vec::new();
    for &backlog in &options.backlogs {
        let mut runs = Vec::new();
        let mut floor_rates = Vec::new();
        // Sums: a server without CPU counters makes the first `add` drop the CPU.
        let zero = Some(Counters {
            cpu_seconds: Some(0.0),
            ..Counters::default()
        });
        let (mut leaderq_cost, mut floor_cost) = (zero, zero);
        let (mut leaderq_tasks, mut floor_tasks) = (0usize, 0usize);
        for run in 0..options.backlog_runs.unwrap_or_else(|| runs_for(backlog)) {
            let pair = pair(&options.backend, backlog, run % 2 == 1, options.policies).await?;
            leaderq_tasks += pair.drain.drained;
            floor_tasks += pair.floor.drained;
            leaderq_cost = leaderq_cost.zip(pair.leaderq_cost).map(|(a, b)| a.add(b));
            floor_cost = floor_cost.zip(pair.floor_cost).map(|(a, b)| a.add(b));
            floor_rates.push(pair.floor.rate());
            runs.push(pair.drain);
        }
        floor_rates.sort_by(f64::total_cmp);
        let per_task = |cost: Option<Counters>, tasks: usize| {
            cost.filter(|_| tasks > 0)
                .map(|c| c.scaled(1.0 / tasks as f64))
        };
        besides.push(Beside {
            floor_rate: floor_rates[floor_rates.len() / 2],
            leaderq_cost: per_task(leaderq_cost, leaderq_tasks),
            floor_cost: per_task(floor_cost, floor_tasks),
        });
        drains.push(median(runs));
    }
    let first = drains.first().map_or(0.0, |d| d.rate);
    for (d, beside) in drains.iter().zip(&besides) {
        let result = if d.drained < d.backlog {
            format!(
                "{:.0} ({} in {:.0} s), {:.1} MiB",
                d.rate,
                d.drained,
                d.seconds,
                mib(d.peak_rss)
            )
        } else {
            format!("{:.0}, {:.1} MiB", d.rate, mib(d.peak_rss))
        };
        let target = if d.backlog >= 1_000_000 {
            ">= 5000 and >= 80% of the first; <= 128 MiB"
        } else if d.backlog >= 100_000 {
            ">= 5000 and >= 80% of the first; <= 64 MiB"
        } else {
            ""
        };
        report.row(
            format!(
                "backlog: drain {} no-op tasks, 1 `leaderq consume`, tasks/s (median of {}), peak RSS ({})",
                d.backlog,
                options.backlog_runs.unwrap_or_else(|| runs_for(d.backlog)),
                options.backend
            ),
            result,
            target,
        );
        report.row(
            format!(
                "backlog: drain {}, minimal native protocol, tasks/s (median of {})",
                d.backlog,
                options.backlog_runs.unwrap_or_else(|| runs_for(d.backlog))
            ),
            format!("{:.0}", beside.floor_rate),
            "",
        );
        report.row(
            format!("backlog: drain {}, leaderq / minimal protocol", d.backlog),
            format!("{:.2}", beside.ratio(d)),
            ">= 0.7",
        );
        if let (Some(leaderq), Some(floor)) = (beside.leaderq_cost, beside.floor_cost) {
            report.row(
                format!(
                    "backlog: drain {}, server reads/writes per task, leaderq vs minimal",
                    d.backlog
                ),
                format!(
                    "{:.2}/{:.2} vs {:.2}/{:.2}",
                    leaderq.reads, leaderq.writes, floor.reads, floor.writes
                ),
                floor::counted(&options.backend),
            );
            if let (Some(a), Some(b)) = (leaderq.cpu_seconds, floor.cpu_seconds) {
                report.row(
                    format!(
                        "backlog: drain {}, server CPU per task, us, leaderq vs minimal",
                        d.backlog
                    ),
                    format!("{:.0} vs {:.0}", a * 1e6, b * 1e6),
                    "",
                );
            }
        }
    }
    let chart = options
        .chart
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CHART));
    std::fs::write(&chart, svg(&drains, &options.backend))
        .with_context(|| format!("cannot write the chart to {}", chart.display()))?;
    progress(&format!("backlog: chart written to {}", chart.display()));
    let cost_json = |cost: Option<Counters>| {
        cost.map(|c| {
            json!({
                "reads_per_task": (c.reads * 100.0).round() / 100.0,
                "writes_per_task": (c.writes * 100.0).round() / 100.0,
                "cpu_us_per_task": c.cpu_seconds.map(|s| (s * 1e6).round()),
            })
        })
    };
    report.json.insert(
        "backlog".into(),
        json!({
            "backend": options.backend,
            "chart": chart.display().to_string(),
            "server_counts": floor::counted(&options.backend),
            "drains": drains.iter().zip(&besides).map(|(d, beside)| json!({
                "backlog": d.backlog,
                "drained": d.drained,
                "seconds": (d.seconds * 1000.0).round() / 1000.0,
                "tasks_per_sec": d.rate.round(),
                "peak_rss_mib": (mib(d.peak_rss) * 10.0).round() / 10.0,
                "floor_tasks_per_sec": beside.floor_rate.round(),
                "ratio": (beside.ratio(d) * 100.0).round() / 100.0,
                "server_cost": {
                    "leaderq": cost_json(beside.leaderq_cost),
                    "floor": cost_json(beside.floor_cost),
                },
            })).collect::<Vec<_>>(),
            "rate_vs_first": drains.last().map(|d| if first > 0.0 { (d.rate / first * 100.0).round() / 100.0 } else { 0.0 }),
        }),
    );
    Ok(())
}

/// The run with the median rate, with the highest peak RSS of all.
fn median(mut runs: Vec<Drain>) -> Drain {
    runs.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    let peak_rss = runs.iter().map(|d| d.peak_rss).max().unwrap_or(0);
    let mut median = runs.swap_remove(runs.len() / 2);
    median.peak_rss = peak_rss;
    median
}

/// One run: leaderq's drain and the floor's, on one fresh coordinator, the floor's first
/// when `floor_first`; each with what it cost the server.
struct Pair {
    drain: Drain,
    floor: floor::Floor,
    leaderq_cost: Option<Counters>,
    floor_cost: Option<Counters>,
}

async fn pair(
    backend: &str,
    backlog: usize,
    floor_first: bool,
    policies: bool,
) -> anyhow::Result<Pair> {
    let server = Target::start(backend)?;
    // A deployment's replicas have read its queue before a backlog builds up. On Redis that
    // first read marks the index of task keys whole (coord/redis/index.rs); without it, the
    // first read would walk the whole backlog during the drain, once per fresh server
    // (docs/performance.md measures that walk apart).
    server
        .coord
        .keys("oracleTask/")
        .await
        .context("the first read of the queue")?;
    let mut leaderq = None;
    let mut minimal = None;
    for floor_turn in [floor_first, !floor_first] {
        if floor_turn {
            progress(&format!(
                "backlog: enqueueing {backlog} tasks for the minimal client"
            ));
            enqueue(&server.coord, backlog).await?;
            progress(&format!(
                "backlog: draining {backlog} tasks with the minimal native client"
            ));
            let before = counters(&server, backend).await;
            let drained = floor::drain(&server, backend).await?;
            let after = counters(&server, backend).await;
            minimal = Some((drained, after.zip(before).map(|(a, b)| a.since(b))));
        } else {
            leaderq = Some(drain(&server, backend, backlog, policies).await?);
        }
    }
    let (Some((drain, leaderq_cost)), Some((floor, floor_cost))) = (leaderq, minimal) else {
        bail!("a drain of the pair did not run");
    };
    Ok(Pair {
        drain,
        floor,
        leaderq_cost,
        floor_cost,
    })
}

/// The server's counters now, if it keeps them and answers in time.
async fn counters(server: &Target, backend: &str) -> Option<Counters> {
    tokio::time::timeout(COUNTERS_LIMIT, floor::counters(server, backend))
        .await
        .ok()
        .flatten()
}

/// Enqueues `backlog` tasks on `server`, then drains them with one child `leaderq consume`
/// whose handler for the bench's taskType is the built-in log handler; with what the
/// drain cost the server, less the bench's own polls.
async fn drain(
    server: &Target,
    backend: &str,
    backlog: usize,
    policies: bool,
) -> anyhow::Result<(Drain, Option<Counters>)> {
    let dir = TempDir::new()?;
    progress(&format!("backlog: enqueueing {backlog} tasks"));
    enqueue(&server.coord, backlog).await?;
    let config = dir.0.join("consume.toml");
    std::fs::write(&config, replica_config(policies))
        .context("cannot write the replica's settings")?;
    let probes = poll_costs(server, backend, backlog).await?;
    progress(&format!(
        "backlog: draining {backlog} tasks with one replica"
    ));
    let before = counters(server, backend).await;
    let exe = crate::exe::leaderq()?;
    let mut child = start_replica(&exe, server, &config, &dir)?;
    let measured = measure(server, &child, backlog).await;
    let after = counters(server, backend).await;
    let _ = child.kill();
    let _ = child.wait();
    let (drain, polls) = measured?;
    let cost = match (after.zip(before), probes) {
        (Some((after, before)), Some((leader_poll, task_poll))) => Some(
            after
                .since(before)
                .less(leader_poll, polls.leader as f64)
                .less(task_poll, polls.task as f64),
        ),
        _ => None,
    };
    Ok((drain, cost))
}

/// The bench's own reads of the queue while it times a drain.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Polls {
    /// Looks for a leader, until the election.
    leader: usize,
    /// Reads of the last task, until it is gone.
    task: usize,
}

/// What one look for a leader and one read of the last task cost the server, measured
/// before the replica starts: [`POLL_PROBES`] of each.
async fn poll_costs(
    server: &Target,
    backend: &str,
    backlog: usize,
) -> anyhow::Result<Option<(Counters, Counters)>> {
    let last = [task_key(backlog - 1)];
    let Some(start) = counters(server, backend).await else {
        return Ok(None);
    };
    for _ in 0..POLL_PROBES {
        leader_node(server.coord.as_ref()).await;
    }
    let Some(middle) = counters(server, backend).await else {
        return Ok(None);
    };
    for _ in 0..POLL_PROBES {
        server.coord.get(&last).await?;
    }
    let Some(end) = counters(server, backend).await else {
        return Ok(None);
    };
    let each = 1.0 / POLL_PROBES as f64;
    Ok(Some((
        middle.since(start).scaled(each),
        end.since(middle).scaled(each),
    )))
}

/// The drained replica's settings: the bench's type logged, and with `policies` per-type
/// policies that do not bind it: a cap at the queue's concurrency, a retry policy of its
/// own, and a rate on another type (which no task of the backlog has).
fn replica_config(policies: bool) -> String {
    let mut config = format!("[handlers.{TASK_TYPE}]\nkind = \"log\"\n");
    if policies {
        config.push_str(
            "concurrency = 1\nmax_attempts = 5\nbackoff_base = \"2s\"\n\n\
             [handlers.Rated]\nkind = \"log\"\nrate = \"10/1m\"\n",
        );
    }
    config
}

/// Starts `exe consume` with `config` on `server`, its data dir in `dir`, its metrics on a
/// free port and its log at warnings only: the one replica a drain is timed on.
pub(super) fn start_replica(
    exe: &Path,
    server: &Target,
    config: &Path,
    dir: &TempDir,
) -> anyhow::Result<std::process::Child> {
    Command::new(exe)
        .arg("consume")
        .arg("--config")
        .arg(config)
        .envs(server.env.iter().map(|(k, v)| (k, v)))
        .env("LEADERQ__DATA__DIR", dir.0.join("replica"))
        .env("LEADERQ__OBSERVE__LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {} consume", exe.display()))
}

pub(super) async fn measure(
    server: &Target,
    child: &std::process::Child,
    backlog: usize,
) -> anyhow::Result<(Drain, Polls)> {
    let mut polls = Polls::default();
    // The drain is timed from the election, seen within a millisecond: a 1k backlog
    // drains in tens of them.
    let waiting = Instant::now();
    while leader_node(server.coord.as_ref()).await.is_none() {
        polls.leader += 1;
        if waiting.elapsed() > LEADER_LIMIT {
            bail!("no leader within {LEADER_LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    polls.leader += 1;
    let started = Instant::now();
    // The last task comes last in claim order (a later taskTime), so the queue is empty
    // once it is gone: it alone is read, every millisecond at first and then less often
    // (`poll_gap`); a count of the names (which costs the coordinator in proportion to the
    // backlog) confirms it once.
    let last = [task_key(backlog - 1)];
    let mut left = backlog;
    while started.elapsed() < DRAIN_LIMIT {
        polls.task += 1;
        if server.coord.get(&last).await?.is_empty() {
            left = server.coord.keys("oracleTask/").await?.0.len();
            if left == 0 {
                break;
            }
        }
        tokio::time::sleep(poll_gap(started.elapsed())).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let (_, peak_rss) = rss_of(child.id()).unwrap_or((0, 0));
    let drained = backlog - left.min(backlog);
    Ok((
        Drain {
            backlog,
            drained,
            seconds,
            rate: drained as f64 / seconds,
            peak_rss,
        },
        polls,
    ))
}

/// How long the drain's end is waited for between two reads, `elapsed` into the drain: a
/// millisecond at first, then a five-hundredth of the time so far (the end is seen within
/// 0.2% of the drain), at most 20 ms. The reads are the bench's, not the drain's, and cost
/// the server the drain is measured on: at every millisecond, a 3-member etcd's member
/// spent more of its CPU answering them than answering the leader of an exec drain.
fn poll_gap(elapsed: Duration) -> Duration {
    (elapsed / 500).clamp(Duration::from_millis(1), Duration::from_millis(20))
}

/// The key of the `n`th task of a backlog.
fn task_key(n: usize) -> String {
    format!("oracleTask/b{n:06}")
}

/// Creates `count` no-op tasks as `leaderq enqueue` would, in create-only batches; the
/// last one is written alone after the others, a second later in taskTime: it is the
/// last to be claimed.
pub(super) async fn enqueue(coord: &Arc<dyn Coordinator>, count: usize) -> anyhow::Result<()> {
    let body_len = task_body("b000000").len() + "oracleTask/b000000".len();
    let limits = coord.limits();
    // Room for each op's own overhead in the backend's encoding.
    let batch = ENQUEUE_BATCH
        .min(limits.max_ops)
        .min(limits.max_bytes / (2 * body_len + 256))
        .max(1);
    let mut clients = Vec::new();
    for client in 0..ENQUEUE_CLIENTS {
        let coord = coord.clone();
        clients.push(tokio::spawn(async move {
            let mut start = client * batch;
            while start < count - 1 {
                let edits: Vec<Edit> = (start..(start + batch).min(count - 1))
                    .map(|n| Edit::Create {
                        key: task_key(n),
                        value: task_body(&format!("b{n:06}")).into_bytes(),
                    })
                    .collect();
                match coord.edit(&edits).await? {
                    Edited::Done => {}
                    Edited::Conflict(keys) => bail!("enqueue: {keys:?} exist"),
                }
                start += ENQUEUE_CLIENTS * batch;
            }
            anyhow::Ok(())
        }));
    }
    for client in clients {
        client.await??;
    }
    let later = (BACKLOG_TASK_TIME.parse::<u64>()? + 1).to_string();
    let last = Edit::Create {
        key: task_key(count - 1),
        value: task_body_at(&format!("b{:06}", count - 1), &later).into_bytes(),
    };
    match coord.edit(&[last]).await? {
        Edited::Done => Ok(()),
        Edited::Conflict(keys) => bail!("enqueue: {keys:?} exist"),
    }
}

/// A chart of drain rate (left axis) and peak RSS (right axis) against the backlog (log
/// scale), as a standalone SVG document.
pub fn svg(drains: &[Drain], backend: &str) -> String {
    const W: f64 = 640.0;
    const H: f64 = 360.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 70.0;
    const TOP: f64 = 40.0;
    const BOTTOM: f64 = 50.0;
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let max_rate = nice_max(drains.iter().map(|d| d.rate).fold(0.0, f64::max));
    let max_rss = nice_max(drains.iter().map(|d| mib(d.peak_rss)).fold(0.0, f64::max));
    let (lo, hi) = drains.iter().fold((f64::MAX, f64::MIN), |(lo, hi), d| {
        let x = (d.backlog.max(1) as f64).log10();
        (lo.min(x), hi.max(x))
    });
    let span = if hi > lo { hi - lo } else { 1.0 };
    let x_of = |backlog: usize| {
        if drains.len() < 2 {
            LEFT + plot_w / 2.0
        } else {
            LEFT + ((backlog.max(1) as f64).log10() - lo) / span * plot_w
        }
    };
    let y_of = |value: f64, max: f64| TOP + plot_h - value / max * plot_h;
    let mut out = String::new();
    out.push_str(&format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    ));
    out.push_str(&format!(
        "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">leaderq: drain of a backlog, one replica ({})</text>\n",
        W / 2.0,
        escape(backend)
    ));
    // Axes and grid: five steps on each value axis.
    for step in 0..=4 {
        let frac = f64::from(step) / 4.0;
        let y = TOP + plot_h - frac * plot_h;
        out.push_str(&format!(
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\n",
            LEFT + plot_w
        ));
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#1f77b4\">{:.0}</text>\n",
            LEFT - 6.0,
            y + 4.0,
            max_rate * frac
        ));
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#d62728\">{:.0}</text>\n",
            LEFT + plot_w + 6.0,
            y + 4.0,
            max_rss * frac
        ));
    }
    out.push_str(&format!(
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{plot_w}\" height=\"{plot_h}\" fill=\"none\" stroke=\"#333\"/>\n"
    ));
    for d in drains {
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            x_of(d.backlog),
            TOP + plot_h + 18.0,
            d.backlog
        ));
    }
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">backlog (tasks, log scale)</text>\n",
        LEFT + plot_w / 2.0,
        H - 10.0
    ));
    out.push_str(&format!(
        "<text transform=\"translate(16 {:.1}) rotate(-90)\" text-anchor=\"middle\" fill=\"#1f77b4\">drain, tasks/s</text>\n",
        TOP + plot_h / 2.0
    ));
    out.push_str(&format!(
        "<text transform=\"translate({:.1} {:.1}) rotate(90)\" text-anchor=\"middle\" fill=\"#d62728\">peak RSS, MiB</text>\n",
        W - 14.0,
        TOP + plot_h / 2.0
    ));
    let series = |values: Vec<(f64, f64)>, colour: &str| {
        let points: Vec<String> = values
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let mut s = format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/>\n",
            points.join(" ")
        );
        for (x, y) in values {
            s.push_str(&format!(
                "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4\" fill=\"{colour}\"/>\n"
            ));
        }
        s
    };
    out.push_str(&series(
        drains
            .iter()
            .map(|d| (x_of(d.backlog), y_of(d.rate, max_rate)))
            .collect(),
        "#1f77b4",
    ));
    out.push_str(&series(
        drains
            .iter()
            .map(|d| (x_of(d.backlog), y_of(mib(d.peak_rss), max_rss)))
            .collect(),
        "#d62728",
    ));
    out.push_str("</svg>\n");
    out
}

/// A round number at or above `value` for an axis' top (1, 2 or 5 times a power of ten).
fn nice_max(value: f64) -> f64 {
    if value <= 0.0 || !value.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|top| *top >= value)
        .unwrap_or(10.0 * power)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Whether `path`'s directory exists, for a clear error before a long measurement.
pub fn check_chart_path(path: &Path) -> anyhow::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => {
            bail!(
                "cannot write the chart to {}: {} is not a directory (create it or pass another --chart)",
                path.display(),
                dir.display()
            )
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(backlog: usize, rate: f64, rss_mib: u64) -> Drain {
        Drain {
            backlog,
            drained: backlog,
            seconds: backlog as f64 / rate,
            rate,
            peak_rss: rss_mib * 1024 * 1024,
        }
    }

    #[test]
    fn axes_top_at_round_numbers() {
        assert_eq!(nice_max(3255.0), 5000.0);
        assert_eq!(nice_max(1000.0), 1000.0);
        assert_eq!(nice_max(41.0), 50.0);
        assert_eq!(nice_max(0.0), 1.0);
    }

    #[test]
    fn the_chart_has_a_point_per_backlog_on_each_series() {
        let chart = svg(
            &[
                drain(1_000, 3000.0, 20),
                drain(10_000, 2500.0, 30),
                drain(100_000, 1000.0, 60),
            ],
            "consul",
        );
        assert!(chart.starts_with("<svg") && chart.ends_with("</svg>\n"));
        assert_eq!(chart.matches("<circle").count(), 6);
        assert_eq!(chart.matches("<polyline").count(), 2);
        assert!(chart.contains(">100000<"));
    }

    #[test]
    fn the_median_run_is_reported_with_the_highest_rss() {
        let median = median(vec![
            drain(1_000, 900.0, 20),
            drain(1_000, 1500.0, 10),
            drain(1_000, 1000.0, 30),
        ]);
        assert_eq!(median.rate, 1000.0);
        assert_eq!(median.peak_rss, 30 * 1024 * 1024);
    }

    /// The drain's end is read every millisecond at first, within 0.2% later, at most
    /// every 20 ms.
    #[test]
    fn the_end_is_read_less_often_as_the_drain_goes_on() {
        let ms = Duration::from_millis;
        assert_eq!(poll_gap(ms(0)), ms(1));
        assert_eq!(poll_gap(ms(400)), ms(1));
        assert_eq!(poll_gap(ms(3_000)), ms(6));
        assert_eq!(poll_gap(ms(60_000)), ms(20));
    }

    #[test]
    fn small_backlogs_are_drained_more_often() {
        assert_eq!(runs_for(1_000), 15);
        assert_eq!(runs_for(20_000), 15);
        assert_eq!(runs_for(30_000), 10);
        assert_eq!(runs_for(100_000), 3);
        assert_eq!(runs_for(10_000_000), 3);
    }
}
