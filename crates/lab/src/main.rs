//! `leaderq-lab`: measures and breaks leaderq with real processes. `bench` measures the
//! server and the consumer (`bench/`), `chaos` injects failures into a cluster of replicas
//! and audits the invariants (`chaos/`). Both start the `leaderq` binary built beside this
//! one (`exe.rs`) and the coordinators through testkit's process harness; some of the
//! bench's replicas run in this process, through the library.

mod bench;
mod chaos;
mod exe;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "leaderq-lab",
    version,
    about = "Measure (bench) and break (chaos) leaderq with real processes; runs the leaderq binary built beside it"
)]
struct Cli {
    /// The leaderq binary to run (default: `leaderq` beside this executable, as
    /// `cargo build --release --workspace` puts it). Also read from LEADERQ_BIN.
    #[arg(long, global = true)]
    leaderq: Option<PathBuf>,
    /// Log format on stderr; the level filter comes from RUST_LOG.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Pretty)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Pretty,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measure the server (durable PUTs/s, blocking-query wake, ?recurse, RSS) and the
    /// consumer (dispatch latency, drain rate, handover, RSS). Starts its own servers on free
    /// ports with temp dirs; takes a few minutes.
    Bench(BenchArgs),
    /// Run thousands of tasks on a server and three replicas (real processes) while leaders
    /// are SIGKILLed (process group, PID only, PID only with an immediate restart), paused
    /// past their lease and partitioned away, and the server is restarted; the handler
    /// forks a worker that journals its own runs. Then audit the invariants: nothing lost,
    /// no two runs of a task at once, no work under two fencing tokens at once, no token
    /// reused by a restarted replica, no unexplained repeat, no completion by a stale
    /// leader. Exits 1 if one breaks.
    Chaos(ChaosArgs),
}

#[derive(clap::Args)]
struct ChaosArgs {
    /// Tasks to run (default 10,000; 400 with --short).
    #[arg(long)]
    tasks: Option<usize>,
    /// The short run: a few hundred tasks and one event of each kind.
    #[arg(long)]
    short: bool,
    /// SIGKILLs of the leader's process group (default 2; 1 with --short).
    #[arg(long)]
    kills: Option<usize>,
    /// SIGKILLs of the leader's PID only, its handlers left to leaderq (default 2; 1).
    #[arg(long)]
    pid_kills: Option<usize>,
    /// SIGKILLs of the leader's PID followed by an immediate restart (default 2; 1).
    #[arg(long)]
    restarts: Option<usize>,
    /// SIGSTOPs of the leader's PID past its lease, then SIGCONT (default 2; 1).
    #[arg(long)]
    pauses: Option<usize>,
    /// Partitions of the leader from the coordinator through its links (default 2; 1).
    #[arg(long)]
    partitions: Option<usize>,
    /// Bursts of errors on the leader's links, every connection reset for 1-2 s
    /// (default 2; 1).
    #[arg(long)]
    bursts: Option<usize>,
    /// The coordinator's answers to the leader held late (0.8 of the bound within which
    /// no run stops) for three TTLs (default 2; 1).
    #[arg(long)]
    latencies: Option<usize>,
    /// SIGKILL-and-restarts of the server, or of one member of a cluster (default 2; 1).
    #[arg(long)]
    server_restarts: Option<usize>,
    /// The leader record deleted by hand, as an operator would (curl -X DELETE, etcdctl
    /// del, redis-cli DEL, zkCli.sh delete) while the leader works (default 2; 1).
    #[arg(long)]
    record_deletions: Option<usize>,
    /// The leader's lease ended by hand while it works: Consul session destroyed, etcd
    /// lease revoked, Redis lease key deleted; ZooKeeper has no such tool (default 2; 1).
    #[arg(long)]
    revocations: Option<usize>,
    /// The leader's renewals alone stalled (its claims still go through) until another
    /// replica leads (default 2; 1).
    #[arg(long)]
    renewal_stalls: Option<usize>,
    /// Seed of the event schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The coordinator to run on, started on loopback by the run itself (its server must
    /// be installed).
    #[arg(long, default_value = "consul", value_parser = clap::builder::PossibleValuesParser::new(leaderq::config::BACKENDS))]
    backend: String,
    /// Print the audit as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Seconds each throughput phase runs.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Keys held by the server when its RSS is read.
    #[arg(long, default_value_t = 100_000)]
    memory_keys: usize,
    /// Run one section only.
    #[arg(long, value_parser = ["server", "contention", "consumer", "backlog", "exec", "failover", "run", "groups", "shards", "schedules", "reports", "gateway"])]
    only: Option<String>,
    /// Blocked queries (one per key) parked while their keys are written.
    #[arg(long, default_value_t = 10_000)]
    watchers: usize,
    /// Another leaderq binary (an older build) whose server also runs the contention
    /// measurements (reads under writes, wakes among many watchers), and whose consumer
    /// also drains the exec section's backlogs, printed beside these.
    #[arg(long)]
    baseline_exe: Option<PathBuf>,
    /// The backlog section's replica runs with per-type policies configured that do not
    /// bind its tasks (a cap at the queue's concurrency, its own retry policy, and a rate
    /// on another type), to compare with a drain without them.
    #[arg(long)]
    policies: bool,
    /// The coordinator the consumer, failover, run, groups, schedules, reports and gateway
    /// sections run on, started on loopback by the bench itself (its server must be
    /// installed); server and
    /// contention always measure `leaderq server`, and the schedules section counts requests
    /// on it only.
    #[arg(long, default_value = "consul", value_parser = clap::builder::PossibleValuesParser::new(leaderq::config::BACKENDS))]
    backend: String,
    /// Backlogs the backlog section enqueues and drains, comma-separated (1 to 10,000,000).
    #[arg(long, value_delimiter = ',', default_values_t = bench::DEFAULT_BACKLOGS, value_parser = backlog_size)]
    backlogs: Vec<usize>,
    /// How many times the backlog section drains each backlog (each way, leaderq and the
    /// minimal native client); the median is reported. Default: 15 up to 20,000 tasks,
    /// fewer above, 3 at 100,000 and more.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    backlog_runs: Option<u32>,
    /// Where the backlog section writes its SVG chart (rate and RSS against backlog).
    #[arg(long, default_value = bench::DEFAULT_CHART)]
    chart: PathBuf,
    /// Backlogs of `/bin/true` exec tasks the exec section drains, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = bench::DEFAULT_EXEC_BACKLOGS, value_parser = backlog_size)]
    exec_backlogs: Vec<usize>,
}

/// A backlog for the bench: at least one task (the last one tells the drain is over).
fn backlog_size(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n @ 1..=10_000_000) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a backlog: give a count from 1 to 10000000"
        )),
    }
}

fn main() -> ExitCode {
    // A replica the bench runs in this process starts an exec handler's supervisor from
    // its own executable (`/proc/self/exe`), which is this one with the hidden argument.
    leaderq::supervise::run_if_supervisor();
    let cli = Cli::parse();
    if let Some(path) = &cli.leaderq {
        // Read by `exe::leaderq` wherever a run starts leaderq; set before any thread.
        std::env::set_var(exe::ENV, path);
    }
    // The benchmark runs replicas in-process; their per-task events would drown its table.
    let level = if matches!(cli.command, Cmd::Bench(_)) {
        "warn"
    } else {
        "info"
    };
    let format = match cli.log_format {
        LogFormat::Pretty => leaderq::observe::logging::Format::Pretty,
        LogFormat::Json => leaderq::observe::logging::Format::Json,
    };
    leaderq::observe::logging::init(level, format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Cmd::Chaos(args) => run_chaos(args).await,
            Cmd::Bench(args) => {
                let options = bench::Options {
                    seconds: args.seconds,
                    memory_keys: args.memory_keys,
                    only: args.only,
                    watchers: args.watchers,
                    baseline_exe: args.baseline_exe,
                    policies: args.policies,
                    backend: args.backend,
                    backlogs: args.backlogs,
                    backlog_runs: args.backlog_runs.map(|runs| runs as usize),
                    chart: Some(args.chart),
                    exec_backlogs: args.exec_backlogs,
                    ..Default::default()
                };
                bench::run(options, args.json).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let message = format!("{err:#}");
            eprintln!("error: {}", leaderq::util::escape::escape(&message));
            ExitCode::FAILURE
        }
    }
}

async fn run_chaos(args: ChaosArgs) -> anyhow::Result<()> {
    let mut options = if args.short {
        chaos::ChaosOptions::short()
    } else {
        chaos::ChaosOptions::full()
    };
    let counts = [
        (args.tasks, &mut options.tasks),
        (args.kills, &mut options.kills),
        (args.pid_kills, &mut options.pid_kills),
        (args.restarts, &mut options.restarts),
        (args.pauses, &mut options.pauses),
        (args.partitions, &mut options.partitions),
        (args.bursts, &mut options.bursts),
        (args.latencies, &mut options.latencies),
        (args.server_restarts, &mut options.server_restarts),
        (args.record_deletions, &mut options.record_deletions),
        (args.revocations, &mut options.revocations),
        (args.renewal_stalls, &mut options.renewal_stalls),
    ];
    for (given, option) in counts {
        if let Some(given) = given {
            *option = given;
        }
    }
    options.seed = args.seed;
    options.backend = args.backend;
    let audit = chaos::run(options).await?;
    if args.json {
        let line = serde_json::to_string(&audit)?;
        writeln!(std::io::stdout().lock(), "{line}").context("cannot write the audit")?;
    } else {
        chaos::print(&audit);
    }
    if !audit.passed() {
        anyhow::bail!("chaos run broke an invariant");
    }
    Ok(())
}
