//! Handlers: the `Handler` trait library users implement, the registry by `taskType`, and
//! the built-in handlers configured in `[handlers.<taskType>]`: `exec` (an external command
//! that gets the task on stdin) and `log`.
//!
//! A handler only runs a task; claiming, retrying and deleting are `queue.rs`'s business.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::config::{HandlerKind, HandlerSettings};

/// How much of an exec handler's stderr becomes `lastError`.
const STDERR_TAIL_BYTES: usize = 2048;

/// Everything a handler knows about the run it is asked to do.
#[derive(Clone, Debug)]
pub struct TaskContext {
    pub key: String,
    pub task_id: String,
    pub task_type: String,
    /// The task's JSON exactly as stored when it was claimed.
    pub task_json: Vec<u8>,
    /// 1 for the first run, 2 for the first retry, …
    pub attempt: u32,
    /// The leader key's LockIndex: grows with every new leader. Handlers that must not act
    /// twice can refuse work stamped with a token lower than one they have seen.
    pub fencing_token: u64,
    /// Cancelled when this replica stops leading or its shutdown grace runs out; a handler
    /// should stop promptly. The task is retried.
    pub cancel: CancellationToken,
}

/// Why a run failed; becomes the task's `lastError`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HandlerError(pub String);

pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'a>>;

/// A task handler. Implement it and register it for a `taskType`:
///
/// ```
/// use leaderq::handler::{Handler, HandlerFuture, TaskContext};
/// struct Hello;
/// impl Handler for Hello {
///     fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
///         Box::pin(async move {
///             println!("task {} (attempt {})", ctx.task_id, ctx.attempt);
///             Ok(())
///         })
///     }
/// }
/// ```
pub trait Handler: Send + Sync {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a>;
}

/// Handlers by `taskType`.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: HashMap<String, Arc<dyn Handler>>,
}

impl Registry {
    /// The built-in handlers named in the settings.
    pub fn from_settings(
        settings: &std::collections::BTreeMap<String, HandlerSettings>,
    ) -> Registry {
        let mut registry = Registry::default();
        for (task_type, handler) in settings {
            match handler.kind {
                HandlerKind::Log => registry.register(task_type, LogHandler),
                HandlerKind::Exec => registry.register(
                    task_type,
                    ExecHandler {
                        command: handler.command.clone(),
                        timeout: handler.timeout,
                    },
                ),
            }
        }
        registry
    }

    pub fn register(&mut self, task_type: &str, handler: impl Handler + 'static) {
        self.handlers
            .insert(task_type.to_string(), Arc::new(handler));
    }

    pub fn get(&self, task_type: &str) -> Option<Arc<dyn Handler>> {
        self.handlers.get(task_type).cloned()
    }

    pub fn task_types(&self) -> impl Iterator<Item = &str> {
        self.handlers.keys().map(String::as_str)
    }
}

/// The file an exec handler's `program` (its `command[0]`) would run, looked up as the
/// spawn will: a name with a '/' as a path (relative to the working dir), any other name in
/// each directory of `path` (the `PATH` variable) in turn, skipping files that are not
/// executable. The error says why it cannot run, for a message at start.
pub fn find_program(program: &str, path: Option<&std::ffi::OsStr>) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt as _;
    let executable = |file: &Path| -> Result<(), String> {
        let metadata = std::fs::metadata(file).map_err(|err| match err.kind() {
            std::io::ErrorKind::NotFound => format!("{} not found", file.display()),
            _ => format!("cannot read {}: {err}", file.display()),
        })?;
        if !metadata.is_file() {
            return Err(format!("{} is not a file", file.display()));
        }
        if metadata.permissions().mode() & 0o111 == 0 {
            return Err(format!(
                "{} is not executable (chmod +x it)",
                file.display()
            ));
        }
        Ok(())
    };
    if program.is_empty() {
        return Err("the program name is empty".into());
    }
    if program.contains('/') {
        let file = PathBuf::from(program);
        return executable(&file).map(|()| file);
    }
    let mut refused = None;
    for dir in std::env::split_paths(path.unwrap_or_default()) {
        // An empty PATH entry means the working dir for a shell, but not for Rust's spawn.
        if dir.as_os_str().is_empty() {
            continue;
        }
        let file = dir.join(program);
        match executable(&file) {
            Ok(()) => return Ok(file),
            Err(reason) if file.exists() => refused = Some(reason),
            Err(_) => {}
        }
    }
    Err(refused.unwrap_or_else(|| {
        format!(
            "{program} not found in PATH ({})",
            path.unwrap_or_default().to_string_lossy()
        )
    }))
}

#[cfg(test)]
mod find_program_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    /// Paths are checked as given, names through PATH; missing, non-executable and
    /// directory entries are refused with the reason.
    #[test]
    fn programs_are_found_like_the_spawn_finds_them() {
        let temp = tempfile::tempdir().unwrap();
        let bin = temp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let tool = bin.join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let plain = bin.join("plain");
        std::fs::write(&plain, "").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path = std::env::join_paths([temp.path().join("nowhere"), bin.clone()]).unwrap();
        let path = Some(path.as_os_str());

        assert_eq!(find_program("tool", path), Ok(tool.clone()));
        assert_eq!(find_program(tool.to_str().unwrap(), None), Ok(tool));
        let err = find_program("missing", path).unwrap_err();
        assert!(err.contains("missing not found in PATH"), "{err}");
        let err = find_program("plain", path).unwrap_err();
        assert!(err.contains("not executable"), "{err}");
        let err = find_program(plain.to_str().unwrap(), path).unwrap_err();
        assert!(err.contains("not executable"), "{err}");
        let err = find_program("/nonexistent/tool", path).unwrap_err();
        assert!(err.contains("/nonexistent/tool not found"), "{err}");
        let err = find_program(bin.to_str().unwrap(), path).unwrap_err();
        assert!(err.contains("is not a file"), "{err}");
        assert!(find_program("sh", std::env::var_os("PATH").as_deref()).is_ok());
    }
}

/// Logs the task and succeeds: for trying leaderq out and for task types that only need
/// to be acknowledged.
pub struct LogHandler;

impl Handler for LogHandler {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            tracing::info!(
                task_key = %ctx.key,
                task_id = %ctx.task_id,
                task_type = %ctx.task_type,
                attempt = ctx.attempt,
                fencing_token = ctx.fencing_token,
                task = %String::from_utf8_lossy(&ctx.task_json),
                "task executed by the log handler"
            );
            Ok(())
        })
    }
}

/// Runs an external command: argv (never a shell), the task JSON on stdin, the task's
/// identity in the environment; exit 0 is success, anything else a failure whose stderr
/// tail becomes `lastError`. Killed on time-out and on cancellation.
pub struct ExecHandler {
    pub command: Vec<String>,
    pub timeout: Option<Duration>,
}

impl Handler for ExecHandler {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(self.run(ctx))
    }
}

impl ExecHandler {
    async fn run(&self, ctx: &TaskContext) -> Result<(), HandlerError> {
        let (program, args) = self
            .command
            .split_first()
            .ok_or_else(|| HandlerError("exec handler has an empty command".into()))?;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .env("TASK_ID", &ctx.task_id)
            .env("TASK_TYPE", &ctx.task_type)
            .env("TASK_KEY", &ctx.key)
            .env("LEADERQ_ATTEMPT", ctx.attempt.to_string())
            .env("LEADERQ_FENCING_TOKEN", ctx.fencing_token.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| HandlerError(format!("cannot start {program}: {e}")))?;

        let mut stdin = child.stdin.take().expect("stdin is piped");
        let input = ctx.task_json.clone();
        let feed = async move {
            // A command that does not read stdin closes it early; that is not an error.
            let _ = stdin.write_all(&input).await;
            drop(stdin);
        };
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let collect = async move {
            let mut tail = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > STDERR_TAIL_BYTES * 2 {
                    tail.drain(..tail.len() - STDERR_TAIL_BYTES);
                }
            }
            tail
        };
        let timeout = async {
            match self.timeout {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        let run = async {
            let (_, tail, status) = tokio::join!(feed, collect, child.wait());
            (tail, status)
        };
        tokio::select! {
            (tail, status) = run => {
                let status = status.map_err(|e| HandlerError(format!("cannot wait for {program}: {e}")))?;
                if status.success() {
                    return Ok(());
                }
                let start = tail.len().saturating_sub(STDERR_TAIL_BYTES);
                let text = String::from_utf8_lossy(&tail[start..]).trim().to_string();
                Err(HandlerError(match text.is_empty() {
                    true => format!("{program} failed with {status}"),
                    false => format!("{program} failed with {status}: {text}"),
                }))
            }
            _ = timeout => Err(HandlerError(format!(
                "{program} timed out after {}",
                crate::server::duration::format(self.timeout.unwrap_or_default())
            ))),
            _ = ctx.cancel.cancelled() => Err(HandlerError(format!("{program} was cancelled"))),
        }
        // Leaving the select drops `run`, and with it the child, which kill_on_drop kills.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> TaskContext {
        TaskContext {
            key: "oracleTask/t1".into(),
            task_id: "t1".into(),
            task_type: "Demo".into(),
            task_json: br#"{"taskId":"t1"}"#.to_vec(),
            attempt: 2,
            fencing_token: 9,
            cancel: CancellationToken::new(),
        }
    }

    fn sh(script: &str) -> ExecHandler {
        ExecHandler {
            command: vec!["sh".into(), "-c".into(), script.into()],
            timeout: None,
        }
    }

    /// The command gets the task on stdin and its identity in the environment.
    #[tokio::test]
    async fn exec_passes_task_on_stdin_and_env() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let script = format!(
            "cat > {0}; echo \" $TASK_ID $TASK_TYPE $TASK_KEY $LEADERQ_ATTEMPT $LEADERQ_FENCING_TOKEN\" >> {0}",
            out.display()
        );
        sh(&script).handle(&ctx()).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(out).unwrap(),
            "{\"taskId\":\"t1\"} t1 Demo oracleTask/t1 2 9\n"
        );
    }

    /// A non-zero exit is a failure carrying the tail of stderr.
    #[tokio::test]
    async fn exec_failure_reports_stderr_tail() {
        let err = sh("echo 'disk full' >&2; exit 3")
            .handle(&ctx())
            .await
            .unwrap_err();
        assert!(
            err.0.contains("exit status: 3") && err.0.ends_with("disk full"),
            "{err}"
        );
        let missing = ExecHandler {
            command: vec!["/nonexistent/handler".into()],
            timeout: None,
        };
        assert!(missing
            .handle(&ctx())
            .await
            .unwrap_err()
            .0
            .contains("cannot start"));
    }

    /// Time-out and cancellation stop the command instead of waiting for it.
    #[tokio::test]
    async fn exec_timeout_and_cancel_kill_the_command() {
        let slow = ExecHandler {
            command: vec!["sleep".into(), "30".into()],
            timeout: Some(Duration::from_millis(100)),
        };
        assert!(slow
            .handle(&ctx())
            .await
            .unwrap_err()
            .0
            .contains("timed out"));
        let context = ctx();
        let cancel = context.cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            cancel.cancel();
        });
        let err = sh("sleep 30").handle(&context).await.unwrap_err();
        assert!(err.0.contains("cancelled"), "{err}");
    }
}
