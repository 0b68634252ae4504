//! The `leaderq` binary: parses the command line, sets up logging and calls the library.
//! Every error ends here as one message on stderr and a non-zero exit code: 2 for input
//! refused before anything was sent (like clap's usage errors), 1 for other failures, and
//! 141, quietly, when stdout's reader went away (`leaderq tasks list | head -1`), the
//! status a shell shows for a Unix tool killed by SIGPIPE.
//!
//! Size: one clap definition per command, each with its help text; the commands' work is in
//! the library.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use leaderq::operate::{dead, history, leadership, schedules, status, tasks, Line, OperateError};
use leaderq::server;
use leaderq::util::escape::escape;

#[derive(Parser)]
#[command(
    name = "leaderq",
    version,
    about = "Leader-elected task queue and leader-gated commands on Consul, ZooKeeper, Redis or etcd, with an embedded Consul-compatible server"
)]
struct Cli {
    /// Log format on stderr; the level filter comes from RUST_LOG (default info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Pretty)]
    log_format: LogFormat,
    /// --config FILE, accepted before or after the subcommand (for `dev`: the replicas'
    /// settings instead of the generated data-dir/dev.toml).
    #[command(flatten)]
    config: ConfigArgs,
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
    /// Run one consumer replica: join the election and, while leading, run the queue's tasks.
    Consume(ConsumeArgs),
    /// Leader-gate any command: of all replicas running `leaderq run --name NAME -- COMMAND`,
    /// only the leader runs COMMAND, never past its lease. Exits with the command's status,
    /// or 75 when leadership is lost (with --on-loss exit).
    Run(RunArgs),
    /// Quick start: the embedded server plus N consumer replicas, with log handlers for the
    /// example task types in tasks/.
    Dev(DevArgs),
    /// Enqueue tasks as a producer does: task files in the producers' format, or one task
    /// built from --type and --para.
    Enqueue(EnqueueArgs),
    /// Show the leader, its fencing token, queue depth, tasks in flight and dead letters.
    Status(StatusArgs),
    /// Inspect and repair the queue: list, show, retry a dead letter, purge dead letters.
    Tasks(TasksArgs),
    /// Pause the queue: the leader finishes the run in progress and claims nothing more
    /// until `leaderq resume`. Kept in the coordinator, so it survives a failover.
    Pause,
    /// Resume a paused queue.
    Resume,
    /// Schedules kept in the coordinator: the leader enqueues one task per tick (`every` an
    /// interval, or on a `cron` expression in a time zone), exactly once whoever leads.
    Schedules(SchedulesArgs),
    /// Serve the web dashboard alone, against the configured coordinator (any backend):
    /// overview, queue, dead letters, history, leadership; retry, delete, pause, resume.
    /// Off loopback it needs observe.admin_token (LEADERQ__OBSERVE__ADMIN_TOKEN).
    Ui(UiArgs),
    /// Run the embedded single-node, durable, Consul-compatible KV/session/txn server.
    Server(ServerArgs),
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
    /// Print a completion script for SHELL: `leaderq completions bash > /etc/bash_completion.d/leaderq`,
    /// `leaderq completions zsh > "${fpath[1]}/_leaderq"`, `leaderq completions fish > ~/.config/fish/completions/leaderq.fish`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
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
    #[arg(long, default_value = "consul", value_parser = clap::builder::PossibleValuesParser::new(leaderq::tools::harness::BACKENDS))]
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
    #[arg(long, value_parser = ["server", "contention", "consumer", "backlog", "exec", "failover", "run", "groups", "schedules"])]
    only: Option<String>,
    /// Blocked queries (one per key) parked while their keys are written.
    #[arg(long, default_value_t = 10_000)]
    watchers: usize,
    /// Another leaderq binary (an older build) whose server also runs the contention
    /// measurements (reads under writes, wakes among many watchers), and whose consumer
    /// also drains the exec section's backlogs, printed beside these.
    #[arg(long)]
    baseline_exe: Option<PathBuf>,
    /// The coordinator the consumer, failover, run, groups and schedules sections run on,
    /// started on loopback by the bench itself (its server must be installed); server and
    /// contention always measure `leaderq server`, and the schedules section counts requests
    /// on it only.
    #[arg(long, default_value = "consul", value_parser = clap::builder::PossibleValuesParser::new(leaderq::tools::harness::BACKENDS))]
    backend: String,
    /// Backlogs the backlog section enqueues and drains, comma-separated (1 to 10,000,000).
    #[arg(long, value_delimiter = ',', default_values_t = leaderq::tools::bench::DEFAULT_BACKLOGS, value_parser = backlog_size)]
    backlogs: Vec<usize>,
    /// How many times the backlog section drains each backlog (each way, leaderq and the
    /// minimal native client); the median is reported. Default: 15 up to 20,000 tasks,
    /// fewer above, 3 at 100,000 and more.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    backlog_runs: Option<u32>,
    /// Where the backlog section writes its SVG chart (rate and RSS against backlog).
    #[arg(long, default_value = leaderq::tools::bench::DEFAULT_CHART)]
    chart: PathBuf,
    /// Backlogs of `/bin/true` exec tasks the exec section drains, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = leaderq::tools::bench::DEFAULT_EXEC_BACKLOGS, value_parser = backlog_size)]
    exec_backlogs: Vec<usize>,
}

#[derive(clap::Args)]
struct ConfigArgs {
    /// Settings file (TOML); see config/default.toml for every key. Environment variables
    /// LEADERQ__SECTION__KEY, CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN override it.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
}

#[derive(clap::Args)]
struct ConsumeArgs {
    /// This replica's name (election.node_id); default: generated once and kept in the
    /// data dir.
    #[arg(long)]
    node_id: Option<String>,
    /// Where this replica keeps its node id and session (data.dir); one replica per dir.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
struct DevArgs {
    /// Number of consumer replicas.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Address of the embedded server.
    #[arg(long, default_value = "127.0.0.1:8500")]
    listen: SocketAddr,
    /// Data for the server and the replicas.
    #[arg(long, default_value = "./data")]
    data_dir: PathBuf,
}

#[derive(clap::Args)]
struct EnqueueArgs {
    /// taskType of a task built from flags.
    #[arg(long = "type", conflicts_with = "files")]
    task_type: Option<String>,
    /// taskPara of that task, as JSON.
    #[arg(long, requires = "task_type")]
    para: Option<String>,
    /// taskId of that task (default: a fresh one).
    #[arg(long, requires = "task_type")]
    id: Option<String>,
    /// Task files (JSON objects in the producers' format).
    files: Vec<PathBuf>,
}

#[derive(clap::Args)]
struct SchedulesArgs {
    #[command(subcommand)]
    command: SchedulesCmd,
}

#[derive(Subcommand)]
enum SchedulesCmd {
    /// Every schedule with its last tick, where that tick's task is now, and its next tick.
    List {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One schedule as JSON, with its last and next tick.
    Show { name: String },
    /// Make the coordinator hold exactly the schedules of a TOML file of `[[schedule]]`
    /// tables (name, every or cron, timezone, task_type, task_para, task_group, catch_up =
    /// "none" | "latest" | "all", catch_up_limit, paused); prints what changed. A schedule
    /// not in the file is deleted.
    Apply { file: std::path::PathBuf },
    /// Delete a schedule and its tick record (its tasks already enqueued stay queued).
    Delete { name: String },
    /// Pause a schedule: it enqueues nothing until resumed.
    Pause { name: String },
    /// Resume a paused schedule; ticks it missed follow its catch_up policy.
    Resume { name: String },
}

#[derive(clap::Args)]
struct TasksArgs {
    #[command(subcommand)]
    command: TasksCmd,
}

#[derive(Subcommand)]
enum TasksCmd {
    /// Every task (pending, delayed, in flight, …) and dead letter, with age, attempts and
    /// last error.
    List {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One task or dead letter, by key or by name.
    Show { key: String },
    /// Move a dead letter back to the queue under its original key, attempts reset; with
    /// --all, every dead letter (of --type).
    Retry {
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        key: Option<String>,
        /// Every dead letter that is a task.
        #[arg(long)]
        all: bool,
        /// With --all: only dead letters of this taskType.
        #[arg(long = "type", value_name = "T", requires = "all")]
        task_type: Option<String>,
    },
    /// Cancel a queued task: a pending one moves to the dead letters as cancelled; a running
    /// one has its handler stopped by the leader first, then is dead-lettered.
    Cancel { key: String },
    /// Delete a pending task or a dead letter (not a running task: cancel it).
    Delete { key: String },
    /// Finished tasks, newest first: completed ones (their history records) and dead
    /// letters, with outcome, duration, attempts, fencing token and node.
    History {
        /// Only tasks of this taskType.
        #[arg(long = "type", value_name = "T")]
        task_type: Option<String>,
        /// Only tasks that did not complete (dead letters).
        #[arg(long)]
        failed: bool,
        /// At most this many, the newest.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete dead letters (all, or those dead longer than --older-than).
    PurgeDead {
        /// Only dead letters older than this (a duration such as 24h).
        #[arg(long, value_parser = parse_duration)]
        older_than: Option<Duration>,
        /// Delete without asking. Without it, a terminal is asked to confirm, and a script
        /// (stdin not a terminal) is refused.
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// The run's name: replicas with the same name contend for the leader key
    /// leaderq/run/NAME/leader. Letters, digits, '.', '_' or '-'.
    #[arg(long, default_value = "default")]
    name: String,
    /// The coordinator ([coordinator] backend), if not the settings' one.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(leaderq::tools::harness::BACKENDS))]
    backend: Option<String>,
    /// After the command exits: start it again (contesting for leadership anew, with
    /// backoff after quick failures), or exit with its status.
    #[arg(long, value_enum, default_value = "never")]
    restart: leaderq::service::run::plan::Restart,
    /// The periodic form: while leading, run the command once every DUR (ticks on
    /// multiples of DUR since the epoch, e.g. 30s, 5m, 1h). Each tick is recorded in the
    /// coordinator before its run, so a failover neither repeats nor skips it; a run that
    /// outlasts its tick is not overlapped (see --catch-up). The command gets LEADERQ_TICK.
    #[arg(long, value_name = "DUR", conflicts_with_all = ["cron", "restart", "handover"])]
    every: Option<String>,
    /// The periodic form on a cron expression (5 fields, or 6 with seconds first), read in
    /// --timezone.
    #[arg(long, value_name = "EXPR", conflicts_with_all = ["restart", "handover"])]
    cron: Option<String>,
    /// The IANA time zone --cron is read in (default UTC).
    #[arg(long, value_name = "TZ", requires = "cron")]
    timezone: Option<String>,
    /// With --every or --cron: ticks that fell while no leader ran or while the command
    /// ran: "latest" runs the latest once, at once; "none" runs the latest only if at most
    /// 10s late; "all" runs each, up to 100. Each tick not run is named in the log.
    #[arg(long, value_name = "POLICY", default_value = "latest")]
    catch_up: String,
    /// When leadership is lost while the command runs (it is stopped first): exit with
    /// status 75, or contest again and rerun it on winning.
    #[arg(long, value_enum, default_value = "exit")]
    on_loss: leaderq::service::run::plan::OnLoss,
    /// Before contesting again after the command exited (with --restart), stand back until
    /// another replica leads (or a session TTL passes), so leadership moves on.
    #[arg(long)]
    handover: bool,
    /// SIGTERM to SIGKILL of the command's process group when it must stop (queue.kill_grace).
    #[arg(long, value_parser = parse_duration)]
    kill_grace: Option<Duration>,
    /// Also pass this environment variable to the command (repeatable); the command gets
    /// a clean environment (PATH, HOME, LANG, TZ, LC_*, …) plus LEADERQ_FENCING_TOKEN,
    /// LEADERQ_LEADER_ID and LEADERQ_NAME.
    #[arg(long = "pass-env", value_name = "NAME")]
    pass_env: Vec<String>,
    /// This replica's data dir (node id, session); default: <data.dir>/run/NAME, or the
    /// first NAME-2, NAME-3, … no other process holds.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// This replica's name (election.node_id); default: generated once, kept in the data dir.
    #[arg(long)]
    node_id: Option<String>,
    /// Do not run anything: print who leads NAME, and exit 0 if this replica would lead
    /// (leadership is free, or held by this node id), 1 if another does.
    #[arg(long)]
    wait_leader: bool,
    /// The command and its arguments (after --).
    #[arg(last = true)]
    command: Vec<String>,
}

#[derive(clap::Args)]
struct StatusArgs {
    /// Show the leadership of `leaderq run --name NAME` (holder, fencing token, since)
    /// instead of the queue.
    #[arg(long)]
    name: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Show the leadership timeline instead (of the queue's leadership, or with --name of
    /// that run's): who led when, with which fencing token, and why each term ended
    /// (newest first).
    #[arg(long)]
    timeline: bool,
}

#[derive(clap::Args)]
struct UiArgs {
    /// Address to serve the dashboard on (http://ADDR/ui/); port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:9463")]
    listen: SocketAddr,
}

#[derive(clap::Args)]
struct ServerArgs {
    /// Address to serve Consul's HTTP API on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8500")]
    listen: SocketAddr,
    /// Directory for the data file; created if missing.
    #[arg(long, default_value = "./data/server")]
    data_dir: PathBuf,
    /// Node name sessions are registered on (default: this machine's hostname).
    #[arg(long)]
    node_name: Option<String>,
    /// Smallest session TTL accepted, like Consul's `session_ttl_min`; lower it only in tests.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    session_ttl_min: Duration,
    /// Test-only: make every commit take at least this long, as a slow disk would; 0s is off.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    test_commit_delay: Duration,
    /// Connections open at once from one client address, like Consul's
    /// `http_max_conns_per_client`; more get 429 and are closed. 0 means no cap.
    #[arg(long, default_value_t = server::serve::DEFAULT_MAX_CONNS_PER_CLIENT)]
    http_max_conns_per_client: usize,
    /// Time to receive a request's head; the connection is closed after it.
    #[arg(long, default_value = "30s", value_parser = parse_timeout)]
    http_header_timeout: Duration,
    /// Time to receive a request's body; answered 408 after it.
    #[arg(long, default_value = "60s", value_parser = parse_timeout)]
    http_body_timeout: Duration,
    /// Time a keep-alive connection may wait for its next request (not a blocking query in
    /// progress), or take to read an answer.
    #[arg(long, default_value = "2m", value_parser = parse_timeout)]
    http_idle_timeout: Duration,
    /// On SIGTERM or Ctrl-C, time in-flight requests get before their connections are
    /// dropped and the data file is closed; a request still arriving is dropped at once.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    shutdown_timeout: Duration,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    leaderq::util::duration::parse(text)
        .map_err(|e| format!("{e} (use a Go duration such as 10s or 500ms)"))
}

/// A duration that must be more than zero: a zero timeout would cut every connection.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        duration if duration.is_zero() => Err("must be more than 0s".into()),
        duration => Ok(duration),
    }
}

/// Exit status when stdout's reader went away: 128 + SIGPIPE, what a shell reports for a
/// tool killed by the signal (Rust ignores SIGPIPE, so writes fail with EPIPE instead).
const BROKEN_PIPE_EXIT: u8 = 141;
/// Exit status for input refused before anything was sent: clap's usage-error status.
const REFUSED_INPUT_EXIT: u8 = 2;

/// Stdout's reader went away; `main` exits quietly on it.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed")]
struct StdoutClosed;

/// Writes one line to stdout, returning `StdoutClosed` if its reader went away.
macro_rules! outln {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout().lock(), $($arg)*).map_err(stdout_error)
    };
}

fn stdout_error(err: std::io::Error) -> anyhow::Error {
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        anyhow::Error::new(StdoutClosed)
    } else {
        anyhow::Error::new(err).context("cannot write to stdout")
    }
}

/// Library code prints with `println!`, which panics when stdout's reader went away; that one
/// panic becomes the same quiet exit as `StdoutClosed`. Every other panic is reported as
/// usual.
fn exit_quietly_on_broken_pipe_panics() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to std") && message.contains("Broken pipe") {
            std::process::exit(BROKEN_PIPE_EXIT.into());
        }
        report(info);
    }));
}

/// The async runtime a command runs on. A replica (`consume`, `run`) runs on one thread:
/// its leader loop is one sequence of awaits on the coordinator, its handlers are other
/// processes or awaits, and nothing in it blocks a thread. On one thread, what a
/// background read allocates is freed into the same malloc arena the leader allocates
/// from: on two workers, a 100k backlog's listing left about 20 MB of freed memory in
/// another thread's arena (peak RSS 81 MiB against 64 on ZooKeeper), and every answer
/// crossed threads to wake the leader. The other commands (the server above all) run on
/// a worker per core.
fn runtime_for(command: &Cmd) -> std::io::Result<tokio::runtime::Runtime> {
    match command {
        Cmd::Consume(_) | Cmd::Run(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Runtime::new(),
    }
}

fn main() -> ExitCode {
    // A handler supervisor is this executable started with a hidden first argument.
    leaderq::supervise::run_if_supervisor();
    exit_quietly_on_broken_pipe_panics();
    let cli = Cli::parse();
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
    let runtime = match runtime_for(&cli.command) {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Cmd::Consume(args) => run_consume(args, &cli.config).await,
            Cmd::Run(args) => run_run(args, &cli.config).await,
            Cmd::Dev(args) => run_dev(args, &cli.config).await,
            Cmd::Enqueue(args) => run_enqueue(args, &cli.config).await,
            Cmd::Status(args) => run_status(args, &cli.config).await,
            Cmd::Tasks(args) => run_tasks(args, &cli.config).await,
            Cmd::Pause => run_pause(true, &cli.config).await,
            Cmd::Schedules(args) => run_schedules(args, &cli.config).await,
            Cmd::Resume => run_pause(false, &cli.config).await,
            Cmd::Ui(args) => run_ui(args, &cli.config).await,
            Cmd::Server(args) => run_server(args).await,
            Cmd::Chaos(args) => run_chaos(args).await,
            Cmd::Completions { shell } => {
                use clap::CommandFactory as _;
                let mut out = Vec::new();
                clap_complete::generate(shell, &mut Cli::command(), "leaderq", &mut out);
                std::io::Write::write_all(&mut std::io::stdout().lock(), &out)
                    .map_err(|_| anyhow::Error::new(StdoutClosed))
            }
            Cmd::Bench(args) => {
                let options = leaderq::tools::bench::Options {
                    seconds: args.seconds,
                    memory_keys: args.memory_keys,
                    only: args.only,
                    watchers: args.watchers,
                    baseline_exe: args.baseline_exe,
                    backend: args.backend,
                    backlogs: args.backlogs,
                    backlog_runs: args.backlog_runs.map(|runs| runs as usize),
                    chart: Some(args.chart),
                    exec_backlogs: args.exec_backlogs,
                    ..Default::default()
                };
                leaderq::tools::bench::run(options, args.json).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.downcast_ref::<ExitWith>().is_some() => {
            ExitCode::from(err.downcast_ref::<ExitWith>().map_or(1, |code| code.0))
        }
        Err(err) if err.downcast_ref::<StdoutClosed>().is_some() => {
            ExitCode::from(BROKEN_PIPE_EXIT)
        }
        Err(err) => {
            // The message may quote stored keys or texts: keep it one line, free of escapes.
            let message = format!("{err:#}");
            let _ = writeln!(
                std::io::stderr().lock(),
                "error: {}",
                leaderq::util::escape::escape(&message)
            );
            let refused = err
                .chain()
                .filter_map(|cause| cause.downcast_ref::<OperateError>())
                .any(OperateError::is_refused_input)
                || err.chain().any(|cause| {
                    matches!(
                        cause.downcast_ref::<leaderq::service::run::RunError>(),
                        Some(leaderq::service::run::RunError::Refused(_))
                    )
                });
            if refused {
                ExitCode::from(REFUSED_INPUT_EXIT)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn load_settings(config: &ConfigArgs) -> anyhow::Result<leaderq::config::Settings> {
    load_settings_with(config, Vec::new())
}

/// Loads the settings with `overrides` (flags) on top of the environment, so that they are
/// validated like any other setting.
fn load_settings_with(
    config: &ConfigArgs,
    overrides: Vec<(String, String)>,
) -> anyhow::Result<leaderq::config::Settings> {
    let mut env: Vec<(String, String)> = std::env::vars().collect();
    env.retain(|(key, _)| !overrides.iter().any(|(flag, _)| flag == key));
    env.extend(overrides);
    Ok(leaderq::config::Settings::load(
        config.config.as_deref(),
        env,
    )?)
}

async fn run_consume(args: ConsumeArgs, config: &ConfigArgs) -> anyhow::Result<()> {
    let mut overrides = Vec::new();
    if let Some(node_id) = args.node_id {
        overrides.push(("LEADERQ__ELECTION__NODE_ID".to_string(), node_id));
    }
    if let Some(dir) = &args.data_dir {
        overrides.push((
            "LEADERQ__DATA__DIR".to_string(),
            dir.to_string_lossy().into_owned(),
        ));
    }
    let settings = load_settings_with(config, overrides)?;
    let registry = leaderq::handler::Registry::from_settings(&settings);
    let shutdown = leaderq::service::cancel_on_signal();
    leaderq::service::consume::run(settings, registry, shutdown).await?;
    Ok(())
}

/// Ends the process with this exit code, printing nothing more.
#[derive(Debug)]
struct ExitWith(u8);

impl std::fmt::Display for ExitWith {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}

impl std::error::Error for ExitWith {}

/// `--every` or `--cron` as a schedule of the run's name; `None` without them.
fn periodic(args: &RunArgs) -> anyhow::Result<Option<leaderq::schedule::Schedule>> {
    if args.every.is_none() && args.cron.is_none() {
        return Ok(None);
    }
    let catch_up = match args.catch_up.as_str() {
        "none" => leaderq::schedule::CatchUp::None,
        "latest" => leaderq::schedule::CatchUp::Latest,
        "all" => leaderq::schedule::CatchUp::All,
        other => anyhow::bail!("--catch-up {other:?}: use none, latest or all"),
    };
    let spec = leaderq::schedule::ScheduleSpec {
        name: args.name.clone(),
        every: args.every.clone(),
        cron: args.cron.clone(),
        timezone: args.timezone.clone(),
        // The run's ticks enqueue no task: the command is the work.
        task_type: "run".into(),
        catch_up: Some(catch_up),
        ..Default::default()
    };
    Ok(Some(leaderq::schedule::Schedule::from_spec(spec)?))
}

async fn run_run(args: RunArgs, config: &ConfigArgs) -> anyhow::Result<()> {
    let mut overrides = Vec::new();
    if let Some(node_id) = &args.node_id {
        overrides.push(("LEADERQ__ELECTION__NODE_ID".to_string(), node_id.clone()));
    }
    if let Some(backend) = &args.backend {
        overrides.push(("LEADERQ__COORDINATOR__BACKEND".to_string(), backend.clone()));
    }
    if let Some(grace) = args.kill_grace {
        overrides.push((
            "LEADERQ__QUEUE__KILL_GRACE".to_string(),
            leaderq::util::duration::format(grace),
        ));
    }
    let settings = load_settings_with(config, overrides)?;
    let settings = leaderq::service::run::settings_for(settings, &args.name)?;
    let options = leaderq::service::run::RunOptions {
        name: args.name.clone(),
        command: args.command.clone(),
        policy: leaderq::service::run::plan::Policy {
            restart: args.restart,
            on_loss: args.on_loss,
            handover: args.handover,
        },
        data_dir: args.data_dir.clone(),
        pass_env: args.pass_env.clone(),
        schedule: periodic(&args)?,
    };
    if args.wait_leader {
        let (holder, would_lead) = leaderq::service::run::who_leads(&settings, &options).await?;
        outln!("leader: {}", escape(&holder))?;
        if !would_lead {
            return Err(ExitWith(1).into());
        }
        return Ok(());
    }
    if args.command.is_empty() {
        return Err(leaderq::service::run::RunError::Refused(
            "no command: give it after --, as in leaderq run --name NAME -- COMMAND [ARGS...]"
                .into(),
        )
        .into());
    }
    let shutdown = leaderq::service::cancel_on_signal();
    let code = leaderq::service::run::run(settings, options, shutdown).await?;
    if code == 0 {
        return Ok(());
    }
    Err(ExitWith(u8::try_from(code).unwrap_or(1)).into())
}

async fn run_dev(args: DevArgs, config: &ConfigArgs) -> anyhow::Result<()> {
    let options = leaderq::service::dev::DevOptions {
        replicas: args.replicas,
        listen: args.listen,
        data_dir: args.data_dir,
        config: config.config.clone(),
        tasks_dir: PathBuf::from("tasks"),
    };
    leaderq::service::dev::run(options, leaderq::service::shutdown_signal()).await
}

/// Prints one line a verb said: its answer on stdout, a note on one item on stderr.
fn say(line: Line) -> anyhow::Result<()> {
    match line {
        Line::Out(text) => outln!("{text}"),
        Line::Err(text) => {
            eprintln!("{text}");
            Ok(())
        }
    }
}

/// Prints `value` as one line of JSON with `--json`, else as `text` renders it.
fn json_or_text<T: serde::Serialize>(
    json: bool,
    value: &T,
    text: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string(value)?)
    } else {
        outln!("{}", text(value))
    }
}

async fn run_enqueue(args: EnqueueArgs, config: &ConfigArgs) -> anyhow::Result<()> {
    let settings = load_settings(config)?;
    let coord = leaderq::service::connect::connect(&settings)?;
    let (task_type, para, id) = (
        args.task_type.as_deref(),
        args.para.as_deref(),
        args.id.as_deref(),
    );
    let tasks = tasks::to_enqueue(task_type, para, id, &args.files)?;
    tasks::enqueue_all(coord.as_ref(), &settings.queue.prefix, &tasks, say).await
}

async fn run_status(args: StatusArgs, config: &ConfigArgs) -> anyhow::Result<()> {
    let mut settings = load_settings(config)?;
    if let Some(name) = &args.name {
        settings = leaderq::service::run::settings_for(settings, name)?;
    }
    let coord = leaderq::service::connect::connect(&settings)?;
    let coord = coord.as_ref();
    let from = || coord.describe();
    if args.timeline {
        let keep = leaderq::leader::timeline::KEEP;
        let entries = leadership::timeline(coord, &settings, keep)
            .await
            .with_context(|| format!("cannot read the leadership timeline from {}", from()))?;
        return json_or_text(args.json, &entries, |e| leadership::render_timeline(e));
    }
    if let Some(name) = &args.name {
        let run = leadership::of_run(coord, name, chrono::Utc::now())
            .await
            .with_context(|| format!("cannot read the leadership from {}", from()))?;
        return json_or_text(args.json, &run, leadership::render_run);
    }
    let report = status::status(coord, &settings)
        .await
        .with_context(|| format!("cannot read the queue from {}", from()))?;
    json_or_text(args.json, &report, |r| {
        status::render(r, chrono::Utc::now())
    })
}

/// `leaderq pause` (`pause` true) and `leaderq resume`.
async fn run_pause(pause: bool, config: &ConfigArgs) -> anyhow::Result<()> {
    let settings = load_settings(config)?;
    let coord = leaderq::service::connect::connect(&settings)?;
    let (coord, prefix) = (coord.as_ref(), &settings.queue.prefix);
    let text = if pause {
        status::render_paused(prefix, status::pause(coord, &settings).await?)
    } else {
        status::render_resumed(prefix, status::resume(coord, &settings).await?)
    };
    outln!("{text}")
}

async fn run_schedules(args: SchedulesArgs, config: &ConfigArgs) -> anyhow::Result<()> {
    let settings = load_settings(config)?;
    // A file is read and checked before anything is sent.
    let file = match &args.command {
        SchedulesCmd::Apply { file } => schedules::read_file(file)?,
        _ => Vec::new(),
    };
    let coord = leaderq::service::connect::connect(&settings)?;
    let coord = coord.as_ref();
    let now = chrono::Utc::now();
    match args.command {
        SchedulesCmd::List { json: true } => {
            let views = schedules::list(coord, &settings, now).await?;
            outln!("{}", serde_json::to_string_pretty(&views)?)
        }
        SchedulesCmd::List { json: false } => {
            let views = schedules::list(coord, &settings, now).await?;
            outln!("{}", schedules::render(&views).trim_end())
        }
        SchedulesCmd::Show { name } => {
            let views = schedules::list(coord, &settings, now).await?;
            let view = schedules::find_view(views, &name)?;
            outln!("{}", serde_json::to_string_pretty(&view)?)
        }
        SchedulesCmd::Apply { .. } => {
            let changes = schedules::apply(coord, &settings, file, now).await?;
            outln!("{}", schedules::render_changes(&changes))
        }
        SchedulesCmd::Delete { name } => {
            schedules::delete(coord, &settings, &name).await?;
            outln!("deleted schedule {name}")
        }
        SchedulesCmd::Pause { name } => {
            let changed = schedules::set_paused(coord, &settings, &name, true).await?;
            outln!("{}", schedules::render_paused(&name, true, changed))
        }
        SchedulesCmd::Resume { name } => {
            let changed = schedules::set_paused(coord, &settings, &name, false).await?;
            outln!("{}", schedules::render_paused(&name, false, changed))
        }
    }
}

async fn run_tasks(args: TasksArgs, config: &ConfigArgs) -> anyhow::Result<()> {
    let settings = load_settings(config)?;
    let coord = leaderq::service::connect::connect(&settings)?;
    let coord = coord.as_ref();
    match args.command {
        TasksCmd::List { json } => {
            let rows = tasks::list(coord, &settings).await?;
            json_or_text(json, &rows, |rows| {
                tasks::render_list(rows, chrono::Utc::now())
            })
        }
        TasksCmd::Show { key } => {
            let pair = tasks::find(coord, &settings, &key).await?;
            outln!("{}", tasks::render_show(&pair))
        }
        TasksCmd::Retry { key: Some(key), .. } => {
            let target = dead::retry(coord, &settings, &key).await?;
            outln!("requeued as {target}")
        }
        TasksCmd::Retry {
            key: None,
            task_type,
            ..
        } => {
            let mut progress = dead::Progress::new("retrying");
            let show = &mut |done, total| progress.show(done, total);
            let report = dead::retry_all(coord, &settings, task_type.as_deref(), show).await?;
            progress.finish();
            dead::render_retried_all(&report)
                .into_iter()
                .try_for_each(say)?;
            match report.failed.is_empty() {
                true => Ok(()),
                false => Err(ExitWith(1).into()),
            }
        }
        TasksCmd::Cancel { key } => tasks::cancel_and_wait(coord, &settings, &key, say).await,
        TasksCmd::Delete { key } => {
            let deleted = tasks::delete(coord, &settings, &key).await?;
            outln!("{}", tasks::render_deleted(&deleted))
        }
        TasksCmd::History {
            task_type,
            failed,
            limit,
            json,
        } => {
            let limit = Some(limit);
            let filter = history::HistoryFilter {
                task_type,
                failed,
                limit,
            };
            let records = history::history(coord, &settings, &filter).await?;
            json_or_text(json, &records, |records| history::render(records))
        }
        TasksCmd::PurgeDead { older_than, yes } => {
            if !yes {
                dead::confirm_purge(coord, &settings, older_than).await?;
            }
            let mut progress = dead::Progress::new("purging");
            let show = &mut |done, total| progress.show(done, total);
            let purged = dead::purge_dead_with_progress(coord, &settings, older_than, show).await?;
            progress.finish();
            outln!("purged {purged} dead letter(s)")
        }
    }
}

async fn run_chaos(args: ChaosArgs) -> anyhow::Result<()> {
    let mut options = if args.short {
        leaderq::tools::chaos::ChaosOptions::short()
    } else {
        leaderq::tools::chaos::ChaosOptions::full()
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
    let audit = leaderq::tools::chaos::run(options).await?;
    if args.json {
        outln!("{}", serde_json::to_string(&audit)?)?;
    } else {
        leaderq::tools::chaos::print(&audit);
    }
    if !audit.passed() {
        anyhow::bail!("chaos run broke an invariant");
    }
    Ok(())
}

async fn run_ui(args: UiArgs, config: &ConfigArgs) -> anyhow::Result<()> {
    let settings = load_settings(config)?;
    let listener = leaderq::ui::bind(args.listen, &settings).await?;
    let address = listener.local_addr()?;
    outln!("dashboard: http://{address}/ui/")?;
    let shutdown = leaderq::service::cancel_on_signal();
    let coord = leaderq::service::connect::connect(&settings)?;
    leaderq::ui::serve(coord, settings, listener, shutdown).await?;
    Ok(())
}

async fn run_server(args: ServerArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (is another server running there? pick another with --listen)",
                args.listen
            )
        })?;
    let address = listener
        .local_addr()
        .context("cannot read the bound address")?;
    let config = server::Config {
        data_dir: args.data_dir,
        node_name: args.node_name.unwrap_or_else(leaderq::util::hostname),
        session_ttl_min: args.session_ttl_min,
        test_commit_delay: args.test_commit_delay,
        limits: server::Limits {
            max_conns_per_client: args.http_max_conns_per_client,
            header_timeout: args.http_header_timeout,
            body_timeout: args.http_body_timeout,
            idle_timeout: args.http_idle_timeout,
            shutdown_timeout: args.shutdown_timeout,
        },
    };
    let server = server::Server::start(&config, address)
        .await
        .context("cannot start the server")?;
    tracing::info!(%address, data_dir = %config.data_dir.display(), node = %config.node_name, "leaderq server ready");
    // One plain line on stdout so scripts and tests can find the port when --listen used 0.
    // A server keeps serving if nobody reads it.
    let _ = outln!("leaderq server listening on http://{address}");
    server
        .serve(listener, leaderq::service::shutdown_signal())
        .await?;
    tracing::info!("leaderq server stopped");
    Ok(())
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
