//! The command line as clap reads it: the global flags, every subcommand and its flags,
//! each with the help text `leaderq --help` prints, and the parsers of the values they
//! take. What each command does is dispatched in `main.rs`; nothing here runs a command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use leaderq::server;

#[derive(Parser)]
#[command(
    name = "leaderq",
    version,
    about = "Leader-elected task queue and leader-gated commands on Consul, ZooKeeper, Redis or etcd, with an embedded Consul-compatible server"
)]
pub struct Cli {
    /// Log format on stderr; the level filter comes from RUST_LOG (default info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Pretty)]
    pub log_format: LogFormat,
    /// --config FILE, accepted before or after the subcommand (for `dev`: the replicas'
    /// settings instead of the generated data-dir/dev.toml).
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Pretty,
    Json,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run one consumer replica: join the election and, while leading, run the queue's tasks.
    Consume(ConsumeArgs),
    /// Leader-gate any command: of all replicas running `leaderq run --name NAME -- COMMAND`,
    /// only the leader runs COMMAND, never past its lease. Exits with the command's status,
    /// or 75 when leadership is lost (with --on-loss exit).
    Run(RunArgs),
    /// Quick start: the embedded server plus N consumer replicas, with log handlers for the
    /// example task types in tasks/.
    Dev(DevArgs),
    /// Enqueue tasks as a producer does: task files in the producers' format, one task built
    /// from --type and --para, or JSON lines on stdin (--stdin).
    Enqueue(EnqueueArgs),
    /// Show the leader, its fencing token, queue depth, tasks in flight and dead letters.
    Status(StatusArgs),
    /// Inspect and repair the queue: list, show, retry a dead letter, purge dead letters.
    Tasks(TasksArgs),
    /// Pause the queue: the leader finishes the run in progress and claims nothing more
    /// until `leaderq resume`. With --type, pause one task type only: none of its tasks
    /// starts, the other types' do. Kept in the coordinator, so it survives a failover.
    Pause(PauseArgs),
    /// Resume a paused queue, or with --type a paused task type.
    Resume(PauseArgs),
    /// Schedules kept in the coordinator: the leader enqueues one task per tick (`every` an
    /// interval, or on a `cron` expression in a time zone), exactly once whoever leads.
    Schedules(SchedulesArgs),
    /// Serve the web dashboard alone, against the configured coordinator (any backend):
    /// overview, queue, dead letters, history, leadership; retry, delete, pause, resume.
    /// Off loopback it needs observe.admin_token (LEADERQ__OBSERVE__ADMIN_TOKEN).
    Ui(UiArgs),
    /// The producers' front door: an HTTP endpoint that checks tasks as the leader would and
    /// enqueues them on the configured coordinator (any backend). POST /v1/tasks takes one
    /// task (key from the Idempotency-Key header) or an array; GET /v1/tasks/KEY answers
    /// its state. Off loopback it needs gateway.token (LEADERQ__GATEWAY__TOKEN) or
    /// gateway.token_file. See docs/producers.md.
    Gateway(GatewayArgs),
    /// Run the embedded single-node, durable, Consul-compatible KV/session/txn server.
    Server(ServerArgs),
    /// Print a completion script for SHELL: `leaderq completions bash > /etc/bash_completion.d/leaderq`,
    /// `leaderq completions zsh > "${fpath[1]}/_leaderq"`, `leaderq completions fish > ~/.config/fish/completions/leaderq.fish`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(clap::Args)]
pub struct ConfigArgs {
    /// Settings file (TOML); see config/default.toml for every key. Environment variables
    /// LEADERQ__SECTION__KEY, CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN override it.
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct ConsumeArgs {
    /// This replica's name (election.node_id); default: generated once and kept in the
    /// data dir.
    #[arg(long)]
    pub node_id: Option<String>,
    /// Where this replica keeps its node id and session (data.dir); one replica per dir.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct DevArgs {
    /// Number of consumer replicas.
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// Address of the embedded server.
    #[arg(long, default_value = "127.0.0.1:8500")]
    pub listen: SocketAddr,
    /// Data for the server and the replicas.
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,
}

#[derive(clap::Args)]
pub struct EnqueueArgs {
    /// taskType of a task built from flags.
    #[arg(long = "type", conflicts_with = "files")]
    pub task_type: Option<String>,
    /// taskPara of that task, as JSON.
    #[arg(long, requires = "task_type")]
    pub para: Option<String>,
    /// taskId of that task (default: a fresh one).
    #[arg(long, requires = "task_type")]
    pub id: Option<String>,
    /// Read tasks from stdin, one JSON object a line (JSON lines), each checked as the
    /// leader would check it. Says per line what became of it: a refused line (naming the
    /// field) and a key that exists are not written, the others are, in as few writes as
    /// the coordinator takes; exits non-zero if any line was not enqueued.
    #[arg(long, conflicts_with_all = ["task_type", "files"])]
    pub stdin: bool,
    /// Task files (JSON objects in the producers' format).
    pub files: Vec<PathBuf>,
}

#[derive(clap::Args)]
pub struct SchedulesArgs {
    #[command(subcommand)]
    pub command: SchedulesCmd,
}

#[derive(Subcommand)]
pub enum SchedulesCmd {
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
pub struct TasksArgs {
    #[command(subcommand)]
    pub command: TasksCmd,
}

#[derive(Subcommand)]
pub enum TasksCmd {
    /// Every task (pending, delayed, in flight, …) and dead letter, with age, attempts and
    /// last error.
    List {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One task or dead letter, by key or by name; with --output, what each of its runs
    /// printed (kept per `queue.output_limit`), even once the task is gone.
    Show {
        key: String,
        /// Each attempt's kept stdout and stderr too.
        #[arg(long)]
        output: bool,
    },
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
pub struct RunArgs {
    /// The run's name: replicas with the same name contend for the leader key
    /// leaderq/run/NAME/leader. Letters, digits, '.', '_' or '-'.
    #[arg(long, default_value = "default")]
    pub name: String,
    /// The coordinator ([coordinator] backend), if not the settings' one.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(leaderq::config::BACKENDS))]
    pub backend: Option<String>,
    /// After the command exits: start it again (contesting for leadership anew, with
    /// backoff after quick failures), or exit with its status.
    #[arg(long, value_enum, default_value = "never")]
    pub restart: leaderq::service::run::plan::Restart,
    /// The periodic form: while leading, run the command once every DUR (ticks on
    /// multiples of DUR since the epoch, e.g. 30s, 5m, 1h). Each tick is recorded in the
    /// coordinator before its run, so a failover neither repeats nor skips it; a run that
    /// outlasts its tick is not overlapped (see --catch-up). The command gets LEADERQ_TICK.
    #[arg(long, value_name = "DUR", conflicts_with_all = ["cron", "restart", "handover"])]
    pub every: Option<String>,
    /// The periodic form on a cron expression (5 fields, or 6 with seconds first), read in
    /// --timezone.
    #[arg(long, value_name = "EXPR", conflicts_with_all = ["restart", "handover"])]
    pub cron: Option<String>,
    /// The IANA time zone --cron is read in (default UTC).
    #[arg(long, value_name = "TZ", requires = "cron")]
    pub timezone: Option<String>,
    /// With --every or --cron: ticks that fell while no leader ran or while the command
    /// ran: "latest" runs the latest once, at once; "none" runs the latest only if at most
    /// 10s late; "all" runs each, up to 100. Each tick not run is named in the log.
    #[arg(long, value_name = "POLICY", default_value = "latest")]
    pub catch_up: String,
    /// When leadership is lost while the command runs (it is stopped first): exit with
    /// status 75, or contest again and rerun it on winning.
    #[arg(long, value_enum, default_value = "exit")]
    pub on_loss: leaderq::service::run::plan::OnLoss,
    /// Before contesting again after the command exited (with --restart), stand back until
    /// another replica leads (or a session TTL passes), so leadership moves on.
    #[arg(long)]
    pub handover: bool,
    /// SIGTERM to SIGKILL of the command's process group when it must stop (queue.kill_grace).
    #[arg(long, value_parser = parse_duration)]
    pub kill_grace: Option<Duration>,
    /// Also pass this environment variable to the command (repeatable); the command gets
    /// a clean environment (PATH, HOME, LANG, TZ, LC_*, …) plus LEADERQ_FENCING_TOKEN,
    /// LEADERQ_LEADER_ID and LEADERQ_NAME.
    #[arg(long = "pass-env", value_name = "NAME")]
    pub pass_env: Vec<String>,
    /// This replica's data dir (node id, session); default: <data.dir>/run/NAME, or the
    /// first NAME-2, NAME-3, … no other process holds.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// This replica's name (election.node_id); default: generated once, kept in the data dir.
    #[arg(long)]
    pub node_id: Option<String>,
    /// Do not run anything: print who leads NAME, and exit 0 if this replica would lead
    /// (leadership is free, or held by this node id), 1 if another does.
    #[arg(long)]
    pub wait_leader: bool,
    /// The command and its arguments (after --).
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Show the leadership of `leaderq run --name NAME` (holder, fencing token, since)
    /// instead of the queue.
    #[arg(long)]
    pub name: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Show the leadership timeline instead (of the queue's leadership, or with --name of
    /// that run's): who led when, with which fencing token, and why each term ended
    /// (newest first).
    #[arg(long)]
    pub timeline: bool,
}

#[derive(clap::Args)]
pub struct UiArgs {
    /// Address to serve the dashboard on (http://ADDR/ui/); port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:9463")]
    pub listen: SocketAddr,
}

#[derive(clap::Args)]
pub struct GatewayArgs {
    /// Address to serve on (http://ADDR/v1/tasks), instead of gateway.listen; port 0 picks
    /// a free port.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
}

#[derive(clap::Args)]
pub struct ServerArgs {
    /// Address to serve Consul's HTTP API on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8500")]
    pub listen: SocketAddr,
    /// Directory for the data file; created if missing.
    #[arg(long, default_value = "./data/server")]
    pub data_dir: PathBuf,
    /// Node name sessions are registered on (default: this machine's hostname).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Smallest session TTL accepted, like Consul's `session_ttl_min`; lower it only in tests.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub session_ttl_min: Duration,
    /// Test-only: make every commit take at least this long, as a slow disk would; 0s is off.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub test_commit_delay: Duration,
    /// Connections open at once from one client address, like Consul's
    /// `http_max_conns_per_client`; more get 429 and are closed. 0 means no cap.
    #[arg(long, default_value_t = server::serve::DEFAULT_MAX_CONNS_PER_CLIENT)]
    pub http_max_conns_per_client: usize,
    /// Time to receive a request's head; the connection is closed after it.
    #[arg(long, default_value = "30s", value_parser = parse_timeout)]
    pub http_header_timeout: Duration,
    /// Time to receive a request's body; answered 408 after it.
    #[arg(long, default_value = "60s", value_parser = parse_timeout)]
    pub http_body_timeout: Duration,
    /// Time a keep-alive connection may wait for its next request (not a blocking query in
    /// progress), or take to read an answer.
    #[arg(long, default_value = "2m", value_parser = parse_timeout)]
    pub http_idle_timeout: Duration,
    /// On SIGTERM or Ctrl-C, time in-flight requests get before their connections are
    /// dropped and the data file is closed; a request still arriving is dropped at once.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
    /// Serve HTTPS instead of HTTP with this certificate chain (PEM), as Consul's
    /// `tls.defaults.cert_file`; needs --key-file.
    #[arg(long, value_name = "FILE", requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// The private key of --cert-file (PEM), as Consul's `tls.defaults.key_file`.
    #[arg(long, value_name = "FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// CA certificates (PEM) that sign the clients' certificates checked by
    /// --verify-incoming, as Consul's `tls.defaults.ca_file`.
    #[arg(long, value_name = "FILE", requires = "cert_file")]
    pub ca_file: Option<PathBuf>,
    /// Require every client to present a certificate signed by --ca-file; one without is
    /// refused at the TLS handshake, as Consul's `tls.defaults.verify_incoming`.
    #[arg(long, requires = "ca_file")]
    pub verify_incoming: bool,
}

impl ServerArgs {
    /// The TLS flags' files (an empty string: not given).
    pub fn tls_files(&self) -> leaderq::util::tls::TlsFiles {
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        leaderq::util::tls::TlsFiles {
            ca_file: path(&self.ca_file),
            cert_file: path(&self.cert_file),
            key_file: path(&self.key_file),
            server_name: String::new(),
        }
    }
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    leaderq::util::duration::parse(text)
        .map_err(|e| format!("{e} (use a Go duration such as 10s or 500ms)"))
}

/// A duration that must be more than zero: a zero timeout would cut every connection.
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        duration if duration.is_zero() => Err("must be more than 0s".into()),
        duration => Ok(duration),
    }
}

/// `pause` and `resume`: the whole queue, or one task type.
#[derive(clap::Args, Debug)]
pub struct PauseArgs {
    /// Only this taskType (one key segment: letters, digits and `-_.~` and the like, no `/`)
    #[arg(long = "type", value_name = "TASK_TYPE")]
    pub task_type: Option<String>,
}
