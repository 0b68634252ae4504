//! The `leaderq` binary: parses the command line, sets up logging and calls the library.
//! Every error ends here as one message on stderr and a non-zero exit code.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use leaderq::server;

#[derive(Parser)]
#[command(
    name = "leaderq",
    version,
    about = "Leader-elected task queue on Consul KV, with an embedded Consul-compatible server"
)]
struct Cli {
    /// Log format on stderr; the level filter comes from RUST_LOG (default info).
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
    /// Run one consumer replica: join the election and, while leading, run the queue's tasks.
    Consume(ConsumeArgs),
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
    /// Run the embedded single-node, durable, Consul-compatible KV/session/txn server.
    Server(ServerArgs),
    /// Measure the server (durable PUTs/s, blocking-query wake, ?recurse, RSS) and the
    /// consumer (dispatch latency, drain rate, handover, RSS). Starts its own servers on free
    /// ports with temp dirs; takes a few minutes.
    Bench(BenchArgs),
    /// Run thousands of tasks on a server and three replicas (real processes) while leaders
    /// are SIGKILLed and paused and the server is restarted, then audit the invariants:
    /// nothing lost, no unexplained repeat, no completion by a stale leader. Exits 1 if one
    /// breaks.
    Chaos(ChaosArgs),
}

#[derive(clap::Args)]
struct ChaosArgs {
    /// Tasks to run (default 10,000; 300 with --short).
    #[arg(long)]
    tasks: Option<usize>,
    /// The short run: a few hundred tasks, two kills, one pause, one server restart.
    #[arg(long)]
    short: bool,
    /// Seed of the event schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
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
    #[arg(long, value_parser = ["server", "consumer", "failover"])]
    only: Option<String>,
}

#[derive(clap::Args)]
struct ConfigArgs {
    /// Settings file (TOML); see config/default.toml for every key. Environment variables
    /// LEADERQ__SECTION__KEY, CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN override it.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(clap::Args)]
struct ConsumeArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// This replica's name (election.node_id); default hostname-pid.
    #[arg(long)]
    node_id: Option<String>,
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
    /// Settings file for the replicas instead of the generated one (data-dir/dev.toml).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(clap::Args)]
struct EnqueueArgs {
    #[command(flatten)]
    config: ConfigArgs,
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
struct TasksArgs {
    #[command(flatten)]
    config: ConfigArgs,
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
    /// Move a dead letter back to the queue under its original key, attempts reset.
    Retry { key: String },
    /// Delete dead letters (all, or those dead longer than --older-than).
    PurgeDead {
        /// Only dead letters older than this (a duration such as 24h).
        #[arg(long, value_parser = parse_duration)]
        older_than: Option<Duration>,
    },
}

#[derive(clap::Args)]
struct StatusArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
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
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    server::duration::parse(text)
        .map_err(|e| format!("{e} (use a Go duration such as 10s or 500ms)"))
}

fn main() -> ExitCode {
    // A handler supervisor is this executable started with a hidden first argument.
    leaderq::supervise::run_if_supervisor();
    let cli = Cli::parse();
    // The benchmark runs replicas in-process; their per-task events would drown its table.
    let level = if matches!(cli.command, Cmd::Bench(_)) {
        "warn"
    } else {
        "info"
    };
    init_logging(level, cli.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Cmd::Consume(args) => run_consume(args).await,
            Cmd::Dev(args) => run_dev(args).await,
            Cmd::Enqueue(args) => run_enqueue(args).await,
            Cmd::Status(args) => run_status(args).await,
            Cmd::Tasks(args) => run_tasks(args).await,
            Cmd::Server(args) => run_server(args).await,
            Cmd::Chaos(args) => run_chaos(args).await,
            Cmd::Bench(args) => {
                let options = leaderq::bench::Options {
                    seconds: args.seconds,
                    memory_keys: args.memory_keys,
                    only: args.only,
                    ..Default::default()
                };
                leaderq::bench::run(options, args.json).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(default_level: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Pretty => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn load_settings(config: &ConfigArgs) -> anyhow::Result<leaderq::config::Settings> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    Ok(leaderq::config::Settings::load(
        config.config.as_deref(),
        env,
    )?)
}

async fn run_consume(args: ConsumeArgs) -> anyhow::Result<()> {
    let mut settings = load_settings(&args.config)?;
    if let Some(node_id) = args.node_id {
        settings.election.node_id = node_id;
    }
    let registry = leaderq::handler::Registry::from_settings(&settings);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        trigger.cancel();
    });
    leaderq::consumer::run(settings, registry, shutdown).await?;
    Ok(())
}

async fn run_dev(args: DevArgs) -> anyhow::Result<()> {
    let options = leaderq::dev::DevOptions {
        replicas: args.replicas,
        listen: args.listen,
        data_dir: args.data_dir,
        config: args.config,
        tasks_dir: PathBuf::from("tasks"),
    };
    leaderq::dev::run(options, shutdown_signal()).await
}

async fn run_enqueue(args: EnqueueArgs) -> anyhow::Result<()> {
    let settings = load_settings(&args.config)?;
    let client = leaderq::consumer::client(&settings)?;
    let tasks = match &args.task_type {
        Some(task_type) => vec![leaderq::admin::task_from_flags(
            task_type,
            args.para.as_deref(),
            args.id.as_deref(),
        )?],
        None if args.files.is_empty() => {
            anyhow::bail!("nothing to enqueue: give task files, or --type TYPE [--para JSON]")
        }
        None => args
            .files
            .iter()
            .map(|path| leaderq::admin::task_from_file(path))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let total = tasks.len();
    for (n, task) in tasks.iter().enumerate() {
        let key = leaderq::admin::enqueue(&client, &settings.queue.prefix, task).await?;
        println!("[{}/{total}] enqueued {key}", n + 1);
    }
    Ok(())
}

async fn run_status(args: StatusArgs) -> anyhow::Result<()> {
    let settings = load_settings(&args.config)?;
    let client = leaderq::consumer::client(&settings)?;
    let report = leaderq::admin::status(&client, &settings)
        .await
        .with_context(|| format!("cannot read the queue from Consul at {}", client.address()))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    match &report.leader {
        Some(leader) => println!(
            "leader:        {} (session {}, since {})",
            leader["node"].as_str().unwrap_or("?"),
            leader["session"].as_str().unwrap_or("?"),
            leader["since"].as_str().unwrap_or("?")
        ),
        None => println!("leader:        none"),
    }
    if let Some(token) = report.fencing_token {
        println!("fencing token: {token}");
    }
    println!("pending:       {}", report.pending);
    println!("delayed:       {}", report.delayed);
    println!("in flight:     {}", report.in_flight);
    println!("orphaned:      {}", report.orphaned);
    println!("foreign:       {}", report.foreign);
    println!("malformed:     {}", report.malformed);
    println!("dead letters:  {}", report.dead);
    Ok(())
}

async fn run_tasks(args: TasksArgs) -> anyhow::Result<()> {
    let settings = load_settings(&args.config)?;
    let client = leaderq::consumer::client(&settings)?;
    match args.command {
        TasksCmd::List { json } => {
            let rows = leaderq::admin::list(&client, &settings).await?;
            if json {
                println!("{}", serde_json::to_string(&rows)?);
                return Ok(());
            }
            println!(
                "{:<10} {:<40} {:<20} {:>10} {:>8}  LAST ERROR",
                "STATE", "KEY", "TYPE", "AGE", "ATTEMPTS"
            );
            for row in &rows {
                let age = row
                    .age_seconds
                    .map(|s| server::duration::format(Duration::from_secs(s.max(0) as u64)))
                    .unwrap_or_default();
                let error: String = row.last_error.chars().take(80).collect();
                println!(
                    "{:<10} {:<40} {:<20} {:>10} {:>8}  {}",
                    row.state, row.key, row.task_type, age, row.attempts, error
                );
            }
            println!("{} task(s)", rows.len());
        }
        TasksCmd::Show { key } => {
            let pair = leaderq::admin::find(&client, &settings, &key).await?;
            let value: serde_json::Value =
                serde_json::from_slice(&pair.value).unwrap_or_else(|_| {
                    serde_json::Value::String(String::from_utf8_lossy(&pair.value).into_owned())
                });
            println!("key:          {}", pair.key);
            println!(
                "session:      {}",
                pair.session.as_deref().unwrap_or("(none)")
            );
            println!("create index: {}", pair.create_index);
            println!("modify index: {}", pair.modify_index);
            println!("{}", serde_json::to_string_pretty(&value)?);
        }
        TasksCmd::Retry { key } => {
            let target = leaderq::admin::retry(&client, &settings, &key).await?;
            println!("requeued as {target}");
        }
        TasksCmd::PurgeDead { older_than } => {
            let purged = leaderq::admin::purge_dead(&client, &settings, older_than).await?;
            println!("purged {purged} dead letter(s)");
        }
    }
    Ok(())
}

async fn run_chaos(args: ChaosArgs) -> anyhow::Result<()> {
    let mut options = if args.short {
        leaderq::chaos::ChaosOptions::short()
    } else {
        leaderq::chaos::ChaosOptions::full()
    };
    if let Some(tasks) = args.tasks {
        options.tasks = tasks;
    }
    options.seed = args.seed;
    let audit = leaderq::chaos::run(options).await?;
    if args.json {
        println!("{}", serde_json::to_string(&audit)?);
    } else {
        leaderq::chaos::print(&audit);
    }
    if !audit.passed() {
        anyhow::bail!("chaos run broke an invariant");
    }
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
        node_name: args.node_name.unwrap_or_else(leaderq::config::hostname),
        session_ttl_min: args.session_ttl_min,
    };
    let server = server::Server::start(&config, address)
        .await
        .context("cannot start the server")?;
    tracing::info!(%address, data_dir = %config.data_dir.display(), node = %config.node_name, "leaderq server ready");
    // One plain line on stdout so scripts and tests can find the port when --listen used 0.
    println!("leaderq server listening on http://{address}");
    let _ = std::io::stdout().flush();
    server.serve(listener, shutdown_signal()).await?;
    tracing::info!("leaderq server stopped");
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutdown requested");
}
