//! The `leaderq` binary: parses the command line (its definition is in `cli.rs`), sets up
//! logging and calls the library. Every error ends here as one message on stderr and a
//! non-zero exit code: 2 for input refused before anything was sent (like clap's usage
//! errors), 1 for other failures, and 141, quietly, when stdout's reader went away
//! (`leaderq tasks list | head -1`), the status a shell shows for a Unix tool killed by
//! SIGPIPE.

mod cli;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use cli::{
    Cli, Cmd, ConfigArgs, ConsumeArgs, DevArgs, EnqueueArgs, GatewayArgs, LogFormat, PauseArgs,
    RunArgs, SchedulesArgs, SchedulesCmd, ServerArgs, StatusArgs, TasksArgs, TasksCmd, UiArgs,
};
use leaderq::operate::{
    bulk, dead, history, leadership, output, schedules, status, tasks, Line, OperateError,
};
use leaderq::server;
use leaderq::util::escape::escape;

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
    let format = match cli.log_format {
        LogFormat::Pretty => leaderq::observe::logging::Format::Pretty,
        LogFormat::Json => leaderq::observe::logging::Format::Json,
    };
    leaderq::observe::logging::init("info", format);
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
            Cmd::Pause(args) => run_pause(true, args, &cli.config).await,
            Cmd::Schedules(args) => run_schedules(args, &cli.config).await,
            Cmd::Resume(args) => run_pause(false, args, &cli.config).await,
            Cmd::Ui(args) => run_ui(args, &cli.config).await,
            Cmd::Gateway(args) => run_gateway(args, &cli.config).await,
            Cmd::Server(args) => run_server(args).await,
            Cmd::Completions { shell } => {
                use clap::CommandFactory as _;
                let mut out = Vec::new();
                clap_complete::generate(shell, &mut Cli::command(), "leaderq", &mut out);
                std::io::Write::write_all(&mut std::io::stdout().lock(), &out)
                    .map_err(|_| anyhow::Error::new(StdoutClosed))
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
    if args.stdin {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin().lock(), &mut text)
            .context("cannot read the tasks from stdin (JSON lines, UTF-8)")?;
        return bulk::enqueue_lines(coord.as_ref(), &settings.queue, &text, say).await;
    }
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
        let entries = leadership::timeline(coord, &settings.election, keep)
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
    let limits = leaderq::operate::waits::Limits::of(&settings);
    let report = status::status_under(coord, &settings.queue, &settings.election, &limits)
        .await
        .with_context(|| format!("cannot read the queue from {}", from()))?;
    json_or_text(args.json, &report, |r| {
        status::render(r, chrono::Utc::now())
    })
}

/// `leaderq pause` (`pause` true) and `leaderq resume`.
async fn run_pause(pause: bool, args: PauseArgs, config: &ConfigArgs) -> anyhow::Result<()> {
    let settings = load_settings(config)?;
    let coord = leaderq::service::connect::connect(&settings)?;
    let (coord, queue) = (coord.as_ref(), &settings.queue);
    let text = match (pause, args.task_type) {
        (true, None) => status::render_paused(&queue.prefix, status::pause(coord, queue).await?),
        (false, None) => status::render_resumed(&queue.prefix, status::resume(coord, queue).await?),
        (true, Some(kind)) => {
            status::render_type_paused(&kind, status::pause_type(coord, queue, &kind).await?)
        }
        (false, Some(kind)) => {
            status::render_type_resumed(&kind, status::resume_type(coord, queue, &kind).await?)
        }
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
            let views = schedules::list(coord, &settings.queue, now).await?;
            outln!("{}", serde_json::to_string_pretty(&views)?)
        }
        SchedulesCmd::List { json: false } => {
            let views = schedules::list(coord, &settings.queue, now).await?;
            outln!("{}", schedules::render(&views).trim_end())
        }
        SchedulesCmd::Show { name } => {
            let views = schedules::list(coord, &settings.queue, now).await?;
            let view = schedules::find_view(views, &name)?;
            outln!("{}", serde_json::to_string_pretty(&view)?)
        }
        SchedulesCmd::Apply { .. } => {
            let changes = schedules::apply(coord, &settings, file, now).await?;
            outln!("{}", schedules::render_changes(&changes))
        }
        SchedulesCmd::Delete { name } => {
            schedules::delete(coord, &settings.queue, &name).await?;
            outln!("deleted schedule {name}")
        }
        SchedulesCmd::Pause { name } => {
            let changed = schedules::set_paused(coord, &settings.queue, &name, true).await?;
            outln!("{}", schedules::render_paused(&name, true, changed))
        }
        SchedulesCmd::Resume { name } => {
            let changed = schedules::set_paused(coord, &settings.queue, &name, false).await?;
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
            let limits = leaderq::operate::waits::Limits::of(&settings);
            let mut rows = tasks::list(coord, &settings.queue, &limits).await?;
            tasks::name_shards(&mut rows, settings.election.shards);
            json_or_text(json, &rows, |rows| {
                tasks::render_list(rows, chrono::Utc::now())
            })
        }
        TasksCmd::Show { key, output: false } => {
            let pair = tasks::find(coord, &settings.queue, &key).await?;
            outln!("{}", tasks::render_show(&pair))
        }
        TasksCmd::Show { key, output: true } => {
            // A completed task is gone from the queue; its output may still be kept.
            let task = match tasks::find(coord, &settings.queue, &key).await {
                Ok(pair) => Some(pair),
                Err(OperateError::NoSuchTask { .. }) => None,
                Err(err) => return Err(err.into()),
            };
            let kept = output::read(coord, &settings.queue, &key).await?;
            match &task {
                Some(pair) => outln!("{}\n", tasks::render_show(pair))?,
                None if kept.attempts.is_empty() => {
                    return Err(OperateError::NoSuchTask { key }.into())
                }
                None => outln!(
                    "{} is no longer queued (completed or deleted)\n",
                    escape(&kept.key)
                )?,
            }
            outln!("{}", output::render(&kept))
        }
        TasksCmd::Retry { key: Some(key), .. } => {
            let target = dead::retry(coord, &settings.queue, &key).await?;
            outln!("requeued as {target}")
        }
        TasksCmd::Retry {
            key: None,
            task_type,
            ..
        } => {
            let mut progress = dead::Progress::new("retrying");
            let show = &mut |done, total| progress.show(done, total);
            let report =
                dead::retry_all(coord, &settings.queue, task_type.as_deref(), show).await?;
            progress.finish();
            dead::render_retried_all(&report)
                .into_iter()
                .try_for_each(say)?;
            match report.failed.is_empty() {
                true => Ok(()),
                false => Err(ExitWith(1).into()),
            }
        }
        TasksCmd::Cancel { key } => {
            tasks::cancel_and_wait(coord, &settings.queue, &settings.election, &key, say).await
        }
        TasksCmd::Delete { key } => {
            let deleted = tasks::delete(coord, &settings.queue, &key).await?;
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
            let records = history::history(coord, &settings.queue, &filter).await?;
            json_or_text(json, &records, |records| history::render(records))
        }
        TasksCmd::PurgeDead { older_than, yes } => {
            if !yes {
                dead::confirm_purge(coord, &settings.queue, older_than).await?;
            }
            let mut progress = dead::Progress::new("purging");
            let show = &mut |done, total| progress.show(done, total);
            let purged =
                dead::purge_dead_with_progress(coord, &settings.queue, older_than, show).await?;
            progress.finish();
            outln!("purged {purged} dead letter(s)")
        }
    }
}

async fn run_ui(args: UiArgs, config: &ConfigArgs) -> anyhow::Result<()> {
    let settings = load_settings(config)?;
    let listener = leaderq::ui::bind(args.listen, &settings.observe).await?;
    let address = listener.local_addr()?;
    outln!("dashboard: http://{address}/ui/")?;
    let shutdown = leaderq::service::cancel_on_signal();
    let coord = leaderq::service::connect::connect(&settings)?;
    leaderq::ui::serve(coord, (&settings).into(), listener, shutdown).await?;
    Ok(())
}

async fn run_gateway(args: GatewayArgs, config: &ConfigArgs) -> anyhow::Result<()> {
    let settings = load_settings(config)?;
    let listen = args.listen.unwrap_or(settings.gateway.listen);
    let coord = leaderq::service::connect::connect(&settings)?;
    let door = leaderq::gateway::Door::new(coord, &settings)?;
    let listener = leaderq::gateway::bind(listen, &door).await?;
    let address = listener.local_addr()?;
    // One plain line on stdout so scripts and tests find the port when --listen used 0.
    outln!("gateway: http://{address}/v1/tasks")?;
    let shutdown = leaderq::service::cancel_on_signal();
    leaderq::gateway::serve(door, listener, shutdown).await?;
    Ok(())
}

async fn run_server(args: ServerArgs) -> anyhow::Result<()> {
    let tls = server::tls_config(&args.tls_files(), args.verify_incoming)
        .map_err(|reason| anyhow::anyhow!(reason))?;
    let scheme = if tls.is_some() { "https" } else { "http" };
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
        tls,
    };
    let server = server::Server::start(&config, address)
        .await
        .context("cannot start the server")?;
    tracing::info!(%address, data_dir = %config.data_dir.display(), node = %config.node_name, "leaderq server ready");
    // One plain line on stdout so scripts and tests can find the port when --listen used 0.
    // A server keeps serving if nobody reads it.
    let _ = outln!("leaderq server listening on {scheme}://{address}");
    server
        .serve(listener, leaderq::service::shutdown_signal())
        .await?;
    tracing::info!("leaderq server stopped");
    Ok(())
}
