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
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the embedded single-node, durable, Consul-compatible KV/session/txn server.
    Server(ServerArgs),
    /// Measure the embedded server: durable PUTs/s, blocking-query wake latency,
    /// ?recurse latency and RSS. Starts its own server on a free port with a temp dir.
    Bench(BenchArgs),
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
    let cli = Cli::parse();
    init_logging();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Cmd::Server(args) => run_server(args).await,
            Cmd::Bench(args) => {
                let options = leaderq::bench::Options {
                    seconds: args.seconds,
                    memory_keys: args.memory_keys,
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

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
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
        node_name: args.node_name.unwrap_or_else(hostname),
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

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "leaderq".to_string())
}
