//! `leaderq dev`: the quick start. Runs the embedded server in this process and N
//! `leaderq consume` replicas as child processes (so one can be killed to watch a
//! standby take over), with the log handler for the example task types in `tasks/`, and
//! the dashboard (`dashboard: http://…/ui/`) in this process.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio_util::task::AbortOnDropHandle;

use crate::server;

/// Replica 1 serves its metrics here, replica 2 on the next port, and so on.
const FIRST_OBSERVE_PORT: u16 = 9464;
/// Task types that always get the log handler in dev, besides those found in `tasks/`.
const DEFAULT_TASK_TYPES: &[&str] = &["CreateTableSpace", "Heartbeat"];

/// The schedule `leaderq dev` applies when the queue has none yet, so the quick start
/// shows one ticking: a log task every minute.
const EXAMPLE_SCHEDULE: &str = r#"
[[schedule]]
name = "heartbeat"
every = "1m"
task_type = "Heartbeat"
task_para = { note = "one task a minute from the leader (leaderq schedules list)" }
"#;

pub struct DevOptions {
    pub replicas: usize,
    pub listen: std::net::SocketAddr,
    pub data_dir: PathBuf,
    /// A settings file for the replicas instead of the generated one.
    pub config: Option<PathBuf>,
    pub tasks_dir: PathBuf,
}

/// The settings file the replicas get: log handlers for the example task types, a short
/// session TTL and lock-delay so that a killed leader is replaced quickly, two runs at once,
/// and the policies a database's tasks want: one `CreateIndex` at a time (a cap), at most
/// 30 `DropTableSpace` a minute (a rate).
fn dev_settings(task_types: &[String]) -> String {
    let mut text = String::from(
        "# Written by `leaderq dev` for its replicas.\n[election]\nlease_ttl = \"10s\"\nlock_delay = \"1s\"\n\n[queue]\n# Two runs at once, one per taskGroup (tasks without one run in turn).\nconcurrency = 2\n\n",
    );
    for task_type in task_types {
        text.push_str(&format!("[handlers.{task_type}]\nkind = \"log\"\n"));
        match task_type.as_str() {
            "CreateIndex" => text
                .push_str("# One index build at a time against the database.\nconcurrency = 1\n"),
            "DropTableSpace" => text.push_str(
                "# Never more than 30 drops a minute, whoever leads.\nrate = \"30/1m\"\n",
            ),
            _ => {}
        }
        text.push('\n');
    }
    text
}

/// Replica n's observe address: 9464, 9465, … beside a server on 8500 (n = 0: 9463, the
/// dashboard's); a free port otherwise (as when tests and CI give the server port 0).
fn observe_address(server: std::net::SocketAddr, n: usize) -> String {
    let port = if server.port() == 8500 {
        FIRST_OBSERVE_PORT + n as u16 - 1
    } else {
        0
    };
    format!("{}:{port}", server.ip())
}

/// The distinct `taskType`s of the JSON files in `dir` (none if it does not exist).
fn example_task_types(dir: &Path) -> Vec<String> {
    let mut types: Vec<String> = DEFAULT_TASK_TYPES.iter().map(|t| t.to_string()).collect();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let Ok(text) = std::fs::read(entry.path()) else {
                continue;
            };
            let Ok(value) = serde_json::from_slice::<serde_json::Value>(&text) else {
                continue;
            };
            if let Some(task_type) = value.get("taskType").and_then(|t| t.as_str()) {
                let valid = !task_type.is_empty()
                    && task_type
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if valid && !types.iter().any(|t| t == task_type) {
                    types.push(task_type.to_string());
                }
            }
        }
    }
    types.sort();
    types
}

/// Applies [`EXAMPLE_SCHEDULE`] if the queue has no schedule yet; says what is there.
async fn example_schedule(settings: &crate::config::Settings) -> String {
    let applied = async {
        let coord = crate::service::connect::connect(settings)?;
        let now = chrono::Utc::now();
        let existing =
            crate::operate::schedules::list(coord.as_ref(), &settings.queue, now).await?;
        if existing.is_empty() {
            let example = crate::schedule::parse_file(EXAMPLE_SCHEDULE)?;
            crate::operate::schedules::apply(coord.as_ref(), settings, example, now).await?;
            return Ok::<_, anyhow::Error>(1);
        }
        Ok(existing.len())
    };
    match applied.await {
        Ok(n) => format!("schedules: {n} (leaderq schedules list; the example `heartbeat` enqueues a Heartbeat task every minute)"),
        Err(err) => format!("schedules: cannot apply the example schedule: {err:#}"),
    }
}

pub async fn run(
    options: DevOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(options.listen).await.with_context(|| {
        format!(
            "cannot listen on {} (is a server already running there? pick another with --listen)",
            options.listen
        )
    })?;
    let address = listener.local_addr()?;
    let server_config = server::Config {
        data_dir: options.data_dir.join("server"),
        node_name: crate::util::hostname(),
        session_ttl_min: server::state::DEFAULT_SESSION_TTL_MIN,
        test_commit_delay: Duration::ZERO,
        limits: server::Limits::default(),
        tls: None,
    };
    let server = server::Server::start(&server_config, address)
        .await
        .context("cannot start the embedded server")?;
    let stop_server = tokio_util::sync::CancellationToken::new();
    // Owned here: awaited at the end, aborted if a step between fails and returns early.
    let server_task = {
        let stop = stop_server.clone();
        let serve = server.serve(listener, async move { stop.cancelled().await });
        AbortOnDropHandle::new(tokio::spawn(serve))
    };

    let config_path = match &options.config {
        Some(path) => path.clone(),
        None => {
            let path = options.data_dir.join("dev.toml");
            let task_types = example_task_types(&options.tasks_dir);
            std::fs::write(&path, dev_settings(&task_types))
                .with_context(|| format!("cannot write {}", path.display()))?;
            path
        }
    };
    let exe = std::env::current_exe().context("cannot find the leaderq binary")?;
    let mut children: Vec<(String, Child)> = Vec::new();
    for n in 1..=options.replicas {
        let node = format!("replica-{n}");
        let child = Command::new(&exe)
            .args(["consume", "--config"])
            .arg(&config_path)
            .env("CONSUL_HTTP_ADDR", address.to_string())
            .env("LEADERQ__ELECTION__NODE_ID", &node)
            .env("LEADERQ__DATA__DIR", options.data_dir.join(&node))
            .env("LEADERQ__OBSERVE__LISTEN", observe_address(address, n))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {node}"))?;
        let observe = observe_address(address, n);
        match observe.ends_with(":0") {
            true => println!(
                "{node}: pid {} (metrics on a free port, named in its log)",
                child.id().unwrap_or(0)
            ),
            false => println!(
                "{node}: pid {}, metrics http://{observe}/metrics",
                child.id().unwrap_or(0)
            ),
        }
        children.push((node, child));
    }
    // The dashboard, in this process, on the replicas' settings (their queue prefixes).
    let mut env: Vec<(String, String)> = std::env::vars().collect();
    env.push(("CONSUL_HTTP_ADDR".into(), address.to_string()));
    let ui_settings = crate::config::Settings::load(Some(&config_path), env)
        .context("cannot read the replicas' settings for the dashboard")?;
    let ui_listen: std::net::SocketAddr = observe_address(address, 0)
        .parse()
        .context("dashboard address")?;
    let ui_listener = crate::ui::bind(ui_listen, &ui_settings.observe).await?;
    let ui_address = ui_listener.local_addr()?;
    let stop_ui = tokio_util::sync::CancellationToken::new();
    let schedules = example_schedule(&ui_settings).await;
    let ui_coord = crate::service::connect::connect(&ui_settings)?;
    let ui_task = AbortOnDropHandle::new(tokio::spawn(crate::ui::serve(
        ui_coord,
        crate::ui::UiSettings::from(&ui_settings),
        ui_listener,
        stop_ui.clone(),
    )));
    println!(
        "leaderq dev: server on http://{address}, {} replicas, settings {}",
        options.replicas,
        config_path.display()
    );
    println!("dashboard: http://{ui_address}/ui/");
    println!("enqueue a task:");
    println!(
        "  curl -X PUT http://{address}/v1/kv/oracleTask/task_1 -d '{{\"taskId\":\"1\",\"taskTime\":\"1445599887\",\"taskTaken\":false,\"taskType\":\"CreateTableSpace\",\"taskPara\":{{\"name\":\"users\"}}}}'"
    );
    println!("see who leads: curl -s http://{address}/v1/kv/consumerLeader?raw   (kill that replica's pid to watch a standby take over)");
    println!("{schedules}");

    shutdown.await;
    stop_ui.cancel();
    if let Ok(Err(err)) = ui_task.await {
        tracing::warn!(error = %err, "the dashboard stopped with an error");
    }
    println!("leaderq dev: stopping replicas");
    for (_, child) in &children {
        if let Some(pid) = child.id() {
            // SIGTERM, so each replica releases its lock and destroys its session.
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status();
        }
    }
    for (node, mut child) in children {
        match tokio::time::timeout(Duration::from_secs(60), child.wait()).await {
            Ok(_) => {}
            Err(_) => {
                tracing::warn!(%node, "replica did not stop in time; killing it");
                let _ = child.kill().await;
            }
        }
    }
    stop_server.cancel();
    server_task.await.context("server task")??;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Task types are collected from the example files, deduplicated, with the default.
    #[test]
    fn collects_example_task_types() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.json"),
            r#"{"taskType":"DropTableSpace"}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("b.json"),
            r#"{"taskType":"CreateTableSpace"}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("c.json"), "not json").unwrap();
        assert_eq!(
            example_task_types(dir.path()),
            ["CreateTableSpace", "DropTableSpace", "Heartbeat"]
        );
        let settings = dev_settings(&example_task_types(dir.path()));
        assert!(settings.contains("[handlers.DropTableSpace]\nkind = \"log\""));
        assert!(settings.contains("rate = \"30/1m\""), "{settings}");
        // The settings are valid as written.
        let parsed: toml::Value = toml::from_str(&settings).unwrap();
        assert_eq!(parsed["queue"]["concurrency"].as_integer(), Some(2));
    }
}
