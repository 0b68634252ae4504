//! `leaderq-lab bench`: measures leaderq as its users see it. It starts its own coordinators
//! (`leaderq server` processes, or with `--backend` another backend's cluster, from the
//! shared harness) on free ports with temporary data dirs, drives them and prints a table
//! (or one JSON object), each number next to its target.
//!
//! `server.rs` measures the embedded server, `consumer.rs` the consumer, `failover.rs`
//! handover and failover of replica processes, `run.rs` the takeover of `leaderq run`,
//! `groups.rs` drains at several `queue.concurrency` settings, `shards.rs` drains and
//! failovers of a split queue against one leader's, `exec.rs` what supervising
//! an exec handler costs a run and drains of exec tasks, `schedules.rs` the accuracy
//! of schedule ticks and what a task waiting for its `runAt` costs the server.
//! Numbers only: nothing here fails on a missed target; people judge.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Map, Value};

mod backlog;
mod consumer;
mod exec;
mod failover;
mod floor;
mod gateway;
mod groups;
mod reports;
mod run;
mod schedules;
mod server;
mod shards;

pub use backlog::{DEFAULT_BACKLOGS, DEFAULT_CHART};
pub use exec::DEFAULT_EXEC_BACKLOGS;

/// Size of the values written by the load phases, as in the memory target.
const VALUE_BYTES: usize = 300;

#[derive(Clone, Debug)]
pub struct Options {
    /// Seconds each throughput phase runs.
    pub seconds: f64,
    /// Keys loaded for the memory measurement.
    pub memory_keys: usize,
    /// Keys listed by the `?recurse` measurement.
    pub recurse_keys: usize,
    /// Blocking-query wake-ups measured.
    pub wakes: usize,
    /// Tasks drained by the throughput measurement.
    pub drain_tasks: usize,
    /// Tasks dispatched one at a time for the latency measurement.
    pub dispatches: usize,
    /// Tasks drained by each sized drain (300 B and 20 KB values).
    pub sized_drain_tasks: usize,
    /// Earlier-taskTime tasks PUT during a backlog by the order-window measurement.
    pub order_probes: usize,
    /// SIGTERM handovers measured.
    pub handovers: usize,
    /// Run only this section ("server", "contention", "consumer", "backlog", "exec",
    /// "failover", "run", "groups", "shards", "schedules", "reports" or "gateway").
    pub only: Option<String>,
    /// Blocked queries parked for the wake measurement among many watchers.
    pub watchers: usize,
    /// PUTs per second written to watched keys in that measurement.
    pub watch_rate: u32,
    /// Another `leaderq` binary (an older build) to run the contention measurements (reads
    /// under writes, wakes among many watchers) and the exec drains against too, printed
    /// beside this one's.
    pub baseline_exe: Option<PathBuf>,
    /// The backlog section's replica has per-type policies that do not bind its tasks.
    pub policies: bool,
    /// The coordinator the consumer and failover sections run on (`[coordinator] backend`);
    /// the server and contention sections measure `leaderq server` itself.
    pub backend: String,
    /// Backlogs the backlog section drains, one fresh coordinator each.
    pub backlogs: Vec<usize>,
    /// How many times each backlog is drained (`None`: as many as its size calls for).
    pub backlog_runs: Option<usize>,
    /// Where the backlog section writes its chart (default `bench-backlog.svg`).
    pub chart: Option<PathBuf>,
    /// Backlogs of `/bin/true` tasks the exec section drains, one fresh coordinator each.
    pub exec_backlogs: Vec<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seconds: 3.0,
            memory_keys: 100_000,
            recurse_keys: 10_000,
            wakes: 200,
            drain_tasks: 10_000,
            dispatches: 200,
            sized_drain_tasks: 2_000,
            order_probes: 40,
            handovers: 5,
            only: None,
            watchers: 10_000,
            watch_rate: 1_000,
            baseline_exe: None,
            policies: false,
            backend: "consul".into(),
            backlogs: backlog::DEFAULT_BACKLOGS.to_vec(),
            backlog_runs: None,
            chart: None,
            exec_backlogs: exec::DEFAULT_EXEC_BACKLOGS.to_vec(),
        }
    }
}

/// A `leaderq server` child process for the benchmark with its temp data dir; the process
/// is killed on drop.
struct ServerChild {
    server: testkit::harness::consul::LeaderqServer,
    base: String,
    _dir: TempDir,
}

impl ServerChild {
    fn start() -> anyhow::Result<ServerChild> {
        let exe = crate::exe::leaderq()?;
        ServerChild::start_exe(&exe, &[])
    }

    /// A server of the binary `exe`, with extra `leaderq server` flags.
    fn start_exe(exe: &std::path::Path, extra: &[&str]) -> anyhow::Result<ServerChild> {
        let dir = TempDir::new()?;
        let server = testkit::harness::consul::LeaderqServer::start(
            exe,
            "127.0.0.1:0",
            &dir.0.join("data"),
            extra,
        )
        .map_err(|stderr| anyhow::anyhow!("cannot start {} server: {stderr}", exe.display()))?;
        Ok(ServerChild {
            base: format!("http://{}", server.addr),
            server,
            _dir: dir,
        })
    }

    /// Current and peak resident set size in bytes, from /proc.
    fn rss(&self) -> Option<(u64, u64)> {
        rss_of(self.server.pid())
    }
}

/// Current and peak resident set size of a process, in bytes, from /proc.
fn rss_of(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|line| line.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
            .map(|kib| kib * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// A temporary directory removed on drop (the benchmark is a binary, not a test).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<TempDir> {
        let path = std::env::temp_dir().join(format!("leaderq-bench-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Latency summary in milliseconds.
#[derive(Clone, Copy, Debug)]
struct Latency {
    p50: f64,
    p99: f64,
    max: f64,
}

fn summarize(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1000.0
    };
    Latency {
        p50: at(0.5),
        p99: at(0.99),
        max: at(1.0),
    }
}

fn progress(message: &str) {
    eprintln!("bench: {message}");
}

/// The measurements, in the order they are printed.
#[derive(Default)]
struct Report {
    rows: Vec<(String, String, String)>,
    json: Map<String, Value>,
}

impl Report {
    fn row(&mut self, name: impl Into<String>, result: impl Into<String>, target: &str) {
        self.rows
            .push((name.into(), result.into(), target.to_string()));
    }

    fn print(&self) {
        println!("{:<64} {:>16}  target", "measurement", "result");
        for (name, result, target) in &self.rows {
            println!("{name:<64} {result:>16}  {target}");
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Raw `fdatasync` latency of 4 KiB appends in the temp dir, for `seconds`: the floor under
/// every durable write, and on shared virtual disks the main source of run-to-run noise.
fn disk_probe(seconds: f64) -> anyhow::Result<Latency> {
    use std::io::Write as _;
    let dir = TempDir::new()?;
    let mut file = std::fs::File::create(dir.0.join("probe"))?;
    let until = std::time::Instant::now() + Duration::from_secs_f64(seconds);
    let mut samples = Vec::new();
    while std::time::Instant::now() < until {
        file.write_all(&[0u8; 4096])?;
        let started = std::time::Instant::now();
        file.sync_data()?;
        samples.push(started.elapsed());
    }
    Ok(summarize(samples))
}

pub async fn run(options: Options, as_json: bool) -> anyhow::Result<()> {
    let mut report = Report::default();
    let wants = |section: &str| options.only.as_deref().is_none_or(|only| only == section);
    if wants("backlog") {
        if let Some(chart) = &options.chart {
            backlog::check_chart_path(chart)?;
        }
    }
    progress("disk: fdatasync latency for 2s");
    let disk = disk_probe(2.0)?;
    report.row(
        "disk: fdatasync of 4 KiB, ms p50/p99 (reference)",
        format!("{:.2}/{:.2}", disk.p50, disk.p99),
        "",
    );
    report.json.insert(
        "disk_fdatasync_ms".into(),
        json!({"p50": disk.p50, "p99": disk.p99, "max": disk.max}),
    );
    if wants("server") {
        server_section(&options, &mut report).await?;
    }
    if wants("contention") {
        contention_section(&options, &mut report).await?;
    }
    if wants("consumer") {
        consumer::section(&options, &mut report).await?;
    }
    if wants("backlog") {
        backlog::section(&options, &mut report).await?;
    }
    if wants("exec") {
        exec::section(&options, &mut report).await?;
    }
    if wants("failover") {
        failover::section(options.handovers, &options.backend, &mut report).await?;
    }
    if wants("run") {
        run::section(options.handovers, &options.backend, &mut report).await?;
    }
    if wants("groups") {
        groups::section(&options, &mut report).await?;
    }
    if wants("shards") {
        shards::section(&options, &mut report).await?;
    }
    if wants("schedules") {
        schedules::section(&options, &mut report).await?;
    }
    if wants("reports") {
        reports::section(&options, &mut report).await?;
    }
    if wants("gateway") {
        gateway::section(&options, &mut report).await?;
    }
    if as_json {
        println!("{}", Value::Object(report.json));
    } else {
        report.print();
    }
    Ok(())
}

async fn server_section(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let server = ServerChild::start()?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let base = Arc::new(server.base.clone());

    progress(&format!(
        "server: durable PUTs with 1 client for {}s",
        options.seconds
    ));
    let put_1 = server::put_rate(&http, &base, 1, options.seconds).await?;
    progress(&format!(
        "server: durable PUTs with 32 clients for {}s",
        options.seconds
    ));
    let put_32 = server::put_rate(&http, &base, 32, options.seconds).await?;
    progress(&format!(
        "server: blocking-query wake latency, {} wake-ups",
        options.wakes
    ));
    let wake = server::wake_latency(&http, &base, options.wakes).await?;
    progress(&format!(
        "server: loading {} keys for ?recurse",
        options.recurse_keys
    ));
    server::load_keys(&http, &base, "recurse/", options.recurse_keys).await?;
    let recurse = server::recurse_latency(&http, &base, "recurse/", options.recurse_keys).await?;
    drop(server);
    // A fresh server, so that it holds exactly the keys the memory target names.
    let server = ServerChild::start()?;
    let base = Arc::new(server.base.clone());
    progress(&format!(
        "server: loading {} keys into a fresh server for RSS",
        options.memory_keys
    ));
    server::load_keys(&http, &base, "memory/", options.memory_keys).await?;
    let (rss, peak) = server.rss().unwrap_or((0, 0));
    drop(server);

    report.row(
        "server: durable KV PUTs/s, 1 client",
        format!("{put_1:.0}"),
        "",
    );
    report.row(
        "server: durable KV PUTs/s, 32 clients",
        format!("{put_32:.0}"),
        ">= 5000",
    );
    report.row(
        "server: blocking-query wake after write, ms p50/p99",
        format!("{:.2}/{:.2}", wake.p50, wake.p99),
        "p50 < 1",
    );
    report.row(
        format!(
            "server: ?recurse over {} keys, ms p50/p99",
            options.recurse_keys
        ),
        format!("{:.1}/{:.1}", recurse.p50, recurse.p99),
        "< 20",
    );
    report.row(
        format!(
            "server: RSS with {} keys x {VALUE_BYTES} B, MiB",
            options.memory_keys
        ),
        format!("{:.1}", mib(rss)),
        "< 100 MB",
    );
    report.json.insert(
        "server".into(),
        json!({
            "put_per_sec_1_client": put_1.round(),
            "put_per_sec_32_clients": put_32.round(),
            "wake_ms": {"p50": wake.p50, "p99": wake.p99, "max": wake.max},
            "recurse_ms": {"keys": options.recurse_keys, "p50": recurse.p50, "p99": recurse.p99, "max": recurse.max},
            "rss_mib": {"keys": options.memory_keys, "value_bytes": VALUE_BYTES, "rss": mib(rss), "peak": mib(peak)},
        }),
    );
    Ok(())
}

/// The contention measurements of one server binary.
struct Contention {
    read: Latency,
    puts_meanwhile: f64,
    fanout: server::Fanout,
}

/// Writers that PUT as fast as they can while one client reads.
const CONTENTION_WRITERS: usize = 32;

/// Reads under a write load, and wakes among many blocked queries, each on a fresh server
/// of `exe` (no per-client connection cap, since the watchers all come from here).
async fn contention(
    exe: &std::path::Path,
    options: &Options,
    label: &str,
) -> anyhow::Result<Contention> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let server = ServerChild::start_exe(exe, &[])?;
    let base = Arc::new(server.base.clone());
    progress(&format!(
        "server{label}: GETs of one key while {CONTENTION_WRITERS} clients PUT, {}s",
        options.seconds
    ));
    let (read, puts_meanwhile) =
        server::read_under_writes(&http, &base, CONTENTION_WRITERS, options.seconds).await?;
    drop(server);

    leaderq::server::serve::raise_open_files_limit();
    let server = ServerChild::start_exe(exe, &["--http-max-conns-per-client", "0"])?;
    let base = Arc::new(server.base.clone());
    progress(&format!(
        "server{label}: {} blocked queries, {} PUT/s to their keys for {}s",
        options.watchers, options.watch_rate, options.seconds
    ));
    let fanout = server::watch_fanout(
        &http,
        &base,
        server.server.pid(),
        options.watchers,
        options.watch_rate,
        options.seconds,
    )
    .await?;
    Ok(Contention {
        read,
        puts_meanwhile,
        fanout,
    })
}

async fn contention_section(options: &Options, report: &mut Report) -> anyhow::Result<()> {
    let exe = crate::exe::leaderq()?;
    let baseline = match &options.baseline_exe {
        Some(path) => Some(contention(path, options, " (baseline)").await?),
        None => None,
    };
    let current = contention(&exe, options, "").await?;
    let runs: Vec<(&str, &Contention)> = std::iter::once(("", &current))
        .chain(baseline.as_ref().map(|b| (" (baseline)", b)))
        .collect();
    for (label, run) in &runs {
        report.row(
            format!(
                "server: GET of 1 key while {CONTENTION_WRITERS} clients PUT, ms p50/p99{label}"
            ),
            format!("{:.2}/{:.2}", run.read.p50, run.read.p99),
            "p99 < 1",
        );
    }
    for (label, run) in &runs {
        report.row(
            format!("server: the {CONTENTION_WRITERS} clients' PUTs/s meanwhile{label}"),
            format!("{:.0}", run.puts_meanwhile),
            "",
        );
    }
    for (label, run) in &runs {
        report.row(
            format!(
                "server: wake among {} blocked, {} PUT/s, ms p50/p99{label}",
                options.watchers, options.watch_rate
            ),
            format!("{:.2}/{:.2}", run.fanout.wake.p50, run.fanout.wake.p99),
            "",
        );
    }
    for (label, run) in &runs {
        report.row(
            format!("server: its CPU meanwhile, % of one core{label}"),
            format!("{:.0}", run.fanout.cpu_percent),
            "",
        );
    }
    let json_of = |run: &Contention| {
        json!({
            "read_under_writes_ms": {"writers": CONTENTION_WRITERS, "p50": run.read.p50, "p99": run.read.p99, "max": run.read.max, "puts_per_sec": run.puts_meanwhile.round()},
            "watch_fanout": {
                "watchers": options.watchers,
                "put_rate": options.watch_rate,
                "puts_per_sec": run.fanout.puts_per_sec.round(),
                "wake_ms": {"p50": run.fanout.wake.p50, "p99": run.fanout.wake.p99, "max": run.fanout.wake.max},
                "cpu_percent": run.fanout.cpu_percent,
                "early_returns": run.fanout.early,
            },
        })
    };
    report.json.insert("contention".into(), json_of(&current));
    if let (Some(run), Some(path)) = (&baseline, &options.baseline_exe) {
        let mut baseline = json_of(run);
        baseline["exe"] = json!(path.display().to_string());
        report.json.insert("contention_baseline".into(), baseline);
    }
    Ok(())
}
