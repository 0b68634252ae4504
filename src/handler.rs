//! Handlers: the `Handler` trait library users implement, the registry by `taskType`, and
//! the built-in handlers configured in `[handlers.<taskType>]`: `exec` (an external command
//! that gets the task on stdin) and `log`.
//!
//! An exec handler's process runs under a supervisor (`supervise/`) that kills it and
//! everything it started before the lease could end; this module decides what the command
//! gets (argv, a clean environment, a working directory) and turns its end into a result.
//! A handler only runs a task; claiming, retrying and deleting are `queue`'s business.
//!
//! Size: the trait, the registry (with each type's policy from its section) and the two
//! built-in handlers are what a handler's author reads, top to bottom, in one place.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
/// Re-exported so a handler written in another crate needs no tokio-util of its own.
pub use tokio_util::sync::CancellationToken;

use crate::config::{HandlerKind, HandlerSettings, Settings};
use crate::coord::FencingToken;
use crate::supervise::leader::{Asked, Job, RunError};
use crate::supervise::plan::StopReason;
use crate::supervise::{self, Supervision};

/// The replica's environment variables an exec handler gets: what programs need to find
/// their tools, their home, their locale, their time zone and a temp dir. Anything else
/// (tokens, LEADERQ__ settings) reaches a handler only through `env` or `pass_env`.
pub const ENV_ALLOW_LIST: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
];
/// Besides the allow-list, every locale variable (`LC_ALL`, `LC_CTYPE`, …) is passed.
pub const ENV_ALLOW_PREFIX: &str = "LC_";
/// The file an exec handler appends its report lines to (progress, checkpoints).
pub const PROGRESS_VAR: &str = "LEADERQ_PROGRESS";
/// The last checkpoint recorded for the task, as JSON, when there is one.
pub const CHECKPOINT_VAR: &str = "LEADERQ_CHECKPOINT";
/// PATH for a handler when the replica has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

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
    /// The leadership's fencing token: grows with every new leader. Handlers that must not act
    /// twice can refuse work stamped with a token lower than one they have seen.
    pub fencing_token: FencingToken,
    /// Cancelled when this replica stops leading or its shutdown grace runs out; a handler
    /// should stop promptly. The task is retried.
    pub cancel: CancellationToken,
    /// The deadline of the lease this run is bound to, as renewals move it (`None`: not
    /// confirmed). Exec handlers are killed by it even if this process is paused; an
    /// in-process handler runs inside this process and so stops with it.
    pub lease_deadline: watch::Receiver<Option<Instant>>,
    /// Where the run leaves what it printed, for the leader to keep with the attempt
    /// (`[queue] output_limit`): exec handlers do; an in-process handler may.
    pub output: OutputSlot,
    /// Where the run reports how far it got and where a rerun may start from: the leader
    /// records both in the task (`progress`, `checkpoint`); exec handlers report through
    /// the file named in `LEADERQ_PROGRESS`.
    pub progress: crate::progress::Reporter,
}

/// What a run printed, as far as it is kept: the end of each stream and how many bytes
/// came before it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunOutput {
    pub stdout: Vec<u8>,
    pub stdout_dropped: u64,
    pub stderr: Vec<u8>,
    pub stderr_dropped: u64,
}

/// Where a handler leaves its run's output: at most `limit` bytes of each stream are
/// kept (0: none, [`OutputSlot::default`]). Clones share the slot.
#[derive(Clone, Debug, Default)]
pub struct OutputSlot {
    limit: usize,
    kept: Arc<std::sync::Mutex<Option<RunOutput>>>,
}

impl OutputSlot {
    /// A slot that keeps the last `limit` bytes of each stream.
    pub fn new(limit: usize) -> OutputSlot {
        OutputSlot {
            limit,
            kept: Arc::default(),
        }
    }

    /// How many bytes of each stream are kept (0: none).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Leaves the run's output, each stream cut to its last `limit` bytes (the rest
    /// counted as dropped); nothing when the slot keeps none.
    pub fn keep(&self, mut output: RunOutput) {
        if self.limit == 0 {
            return;
        }
        for (stream, dropped) in [
            (&mut output.stdout, &mut output.stdout_dropped),
            (&mut output.stderr, &mut output.stderr_dropped),
        ] {
            let over = stream.len().saturating_sub(self.limit);
            stream.drain(..over);
            *dropped += over as u64;
        }
        if let Ok(mut kept) = self.kept.lock() {
            *kept = Some(output);
        }
    }

    /// The output left, once.
    pub fn take(&self) -> Option<RunOutput> {
        self.kept.lock().ok()?.take()
    }
}

impl TaskContext {
    /// The task's `taskPara` decoded into the handler's own type: the typed view of
    /// [`TaskContext::task_json`]. A task without `taskPara` decodes from `null`.
    pub fn para<T: serde::de::DeserializeOwned>(&self) -> Result<T, HandlerError> {
        let task: serde_json::Value = serde_json::from_slice(&self.task_json)
            .map_err(|e| HandlerError::permanent(format!("the task is not JSON: {e}")))?;
        let para = task.get("taskPara").cloned().unwrap_or_default();
        serde_json::from_value(para).map_err(|e| HandlerError::permanent(format!("taskPara: {e}")))
    }

    /// The last checkpoint recorded for this task by an earlier run (its `checkpoint`
    /// field), for a rerun to start from; `None` on a first run or when none was recorded.
    pub fn checkpoint(&self) -> Option<serde_json::Value> {
        let task: serde_json::Value = serde_json::from_slice(&self.task_json).ok()?;
        task.get(crate::task::progress::CHECKPOINT)
            .filter(|c| !c.is_null())
            .cloned()
    }

    /// A lease deadline that never comes, for running a handler outside a leader (tests,
    /// tools): `watch::Receiver` of a deadline far in the future.
    pub fn unbounded_lease() -> watch::Receiver<Option<Instant>> {
        const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
        watch::channel(Some(Instant::now() + FAR)).1
    }
}

/// Why a run failed; becomes the task's `lastError`. A failure is retried (with backoff,
/// up to `queue.max_attempts`) unless it is [`HandlerError::permanent`]: then the task
/// goes to the dead letters at once, with the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    pub message: String,
    /// Retrying cannot help (bad input, a task that can never succeed).
    pub permanent: bool,
    /// Not the handler's failure: leaderq stopped the run because its lease could not be
    /// confirmed in time. The task goes back without using an attempt.
    pub interrupted: bool,
}

impl HandlerError {
    /// A failure worth retrying (the default).
    pub fn new(message: impl Into<String>) -> HandlerError {
        HandlerError {
            message: message.into(),
            permanent: false,
            interrupted: false,
        }
    }

    /// A failure retrying cannot fix: the task is dead-lettered at once.
    pub fn permanent(message: impl Into<String>) -> HandlerError {
        HandlerError {
            message: message.into(),
            permanent: true,
            interrupted: false,
        }
    }

    /// A run leaderq cut short for its lease, not a failure of the handler.
    pub fn interrupted(message: impl Into<String>) -> HandlerError {
        HandlerError {
            message: message.into(),
            permanent: false,
            interrupted: true,
        }
    }
}

impl From<String> for HandlerError {
    fn from(message: String) -> HandlerError {
        HandlerError::new(message)
    }
}

impl From<&str> for HandlerError {
    fn from(message: &str) -> HandlerError {
        HandlerError::new(message)
    }
}

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

/// Handlers by `taskType`, and each type's retry policy.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: HashMap<String, Arc<dyn Handler>>,
    policies: HashMap<String, TypePolicy>,
}

/// A task type's own policy (its `[handlers.T]` section): retries, each `None` the
/// queue's (`[queue]`), with a task's own `maxAttempts` over `max_attempts`; the priority
/// of its tasks that give none; and its cap on runs at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TypePolicy {
    pub max_attempts: Option<u32>,
    pub backoff_base: Option<Duration>,
    pub backoff_max: Option<Duration>,
    /// The `taskPriority` of the type's tasks that give none.
    pub priority: Option<i32>,
    /// At most this many runs of the type at once.
    pub concurrency: Option<usize>,
    /// At most so many starts of the type in any window of a period, whoever leads.
    pub rate: Option<crate::util::rate::Rate>,
}

impl Registry {
    /// The built-in handlers named in the settings. Exec handlers are supervised by this
    /// executable (see `supervise::run_if_supervisor`) and get the environment built from
    /// this process's own by `handler_env`.
    pub fn from_settings(settings: &Settings) -> Registry {
        let lock_file = std::path::absolute(supervise::lock::lock_file(&settings.data.dir)).ok();
        let supervision = Supervision {
            program: supervise::leader::this_program(),
            kill_grace: settings.queue.kill_grace,
            margin: supervise::lease_margin(settings.election.lease_ttl),
            lock_file,
            pool: Default::default(),
        };
        let parent: Vec<(String, String)> = std::env::vars().collect();
        let mut registry = Registry::default();
        for (task_type, handler) in &settings.handlers {
            registry.set_policy(
                task_type,
                TypePolicy {
                    max_attempts: handler.max_attempts,
                    backoff_base: handler.backoff_base,
                    backoff_max: handler.backoff_max,
                    priority: handler.priority,
                    concurrency: handler.concurrency,
                    // Checked when the settings were read.
                    rate: handler
                        .rate
                        .as_deref()
                        .and_then(|rate| crate::util::rate::Rate::parse(rate).ok()),
                },
            );
            match handler.kind {
                HandlerKind::Log => registry.register(task_type, LogHandler),
                HandlerKind::Exec => registry.register(
                    task_type,
                    ExecHandler {
                        command: handler.command.clone(),
                        timeout: handler.timeout,
                        env: handler_env(&parent, handler),
                        cwd: handler.cwd.clone(),
                        supervision: supervision.clone(),
                        permanent_exit_codes: handler.permanent_exit_codes.clone(),
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

    /// Sets `task_type`'s own retry policy.
    pub fn set_policy(&mut self, task_type: &str, policy: TypePolicy) {
        self.policies.insert(task_type.to_string(), policy);
    }

    /// `task_type`'s own retry policy: all the queue's when it has none.
    pub fn policy(&self, task_type: &str) -> TypePolicy {
        self.policies.get(task_type).copied().unwrap_or_default()
    }

    /// Whether any type has a default priority of its own (when none does, a task's
    /// priority is its own `taskPriority` or 0, with no lookup).
    pub fn has_priorities(&self) -> bool {
        self.policies
            .values()
            .any(|policy| policy.priority.is_some())
    }

    /// Whether `task_type` has a rate of its own.
    pub fn has_rate(&self, task_type: &str) -> bool {
        self.policies
            .get(task_type)
            .is_some_and(|policy| policy.rate.is_some())
    }

    /// The types with a rate of their own, and their rates.
    pub fn rates(&self) -> impl Iterator<Item = (&str, crate::util::rate::Rate)> {
        self.policies
            .iter()
            .filter_map(|(kind, policy)| Some((kind.as_str(), policy.rate?)))
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
    /// `para` decodes taskPara into the handler's type and says what is wrong when it
    /// does not fit.
    #[test]
    fn para_decodes_task_para_into_a_typed_value() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Para {
            name: String,
        }
        let mut ctx = super::TaskContext {
            key: "oracleTask/t".into(),
            task_id: "t".into(),
            task_type: "Demo".into(),
            task_json: br#"{"taskPara":{"name":"users"}}"#.to_vec(),
            attempt: 1,
            fencing_token: FencingToken(1),
            cancel: super::CancellationToken::new(),
            lease_deadline: super::TaskContext::unbounded_lease(),
            output: super::OutputSlot::default(),
            progress: Default::default(),
        };
        assert_eq!(
            ctx.para::<Para>().unwrap(),
            Para {
                name: "users".into()
            }
        );
        ctx.task_json = br#"{"taskPara":{"size":1}}"#.to_vec();
        let err = ctx.para::<Para>().unwrap_err();
        assert!(err.message.contains("name") && err.permanent, "{err:?}");
    }

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

/// An exec handler's environment before the task's variables: the allow-listed variables
/// of `parent` (the replica's environment), then those named in `pass_env`, then `env`.
pub fn handler_env(
    parent: &[(String, String)],
    settings: &HandlerSettings,
) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = parent
        .iter()
        .filter(|(name, _)| {
            ENV_ALLOW_LIST.contains(&name.as_str())
                || name.starts_with(ENV_ALLOW_PREFIX)
                || settings.pass_env.contains(name)
        })
        .cloned()
        .collect();
    env.entry("PATH".into())
        .or_insert_with(|| DEFAULT_PATH.into());
    env.extend(settings.env.clone());
    env.into_iter().collect()
}

/// The task's own variables, which come last and so win over any configured ones.
pub fn task_env(ctx: &TaskContext) -> [(String, String); 5] {
    [
        ("TASK_ID".into(), ctx.task_id.clone()),
        ("TASK_TYPE".into(), ctx.task_type.clone()),
        ("TASK_KEY".into(), ctx.key.clone()),
        ("LEADERQ_ATTEMPT".into(), ctx.attempt.to_string()),
        (
            "LEADERQ_FENCING_TOKEN".into(),
            ctx.fencing_token.to_string(),
        ),
    ]
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
                fencing_token = ctx.fencing_token.0,
                task = %String::from_utf8_lossy(&ctx.task_json),
                "task executed by the log handler"
            );
            Ok(())
        })
    }
}

/// Runs an external command under a supervisor: argv (never a shell), the task JSON on
/// stdin, a clean environment plus the task's identity; exit 0 is success, anything else
/// a failure whose stderr tail becomes `lastError`. On time-out, cancellation or a lease
/// that is not confirmed in time, its whole process group gets SIGTERM, then SIGKILL after
/// the kill grace; the run ends only once every process it started is gone.
pub struct ExecHandler {
    pub command: Vec<String>,
    pub timeout: Option<Duration>,
    /// The command's environment before the task's variables (see `handler_env`).
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    pub supervision: Supervision,
    /// Exit codes that mean "do not retry" (`permanent_exit_codes`).
    pub permanent_exit_codes: Vec<i32>,
}

impl Handler for ExecHandler {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(self.run(ctx))
    }
}

impl ExecHandler {
    async fn run(&self, ctx: &TaskContext) -> Result<(), HandlerError> {
        let program = self
            .command
            .first()
            .ok_or_else(|| HandlerError::new("exec handler has an empty command"))?;
        let mut env = self.env.clone();
        env.retain(|(name, _)| !task_env(ctx).iter().any(|(task, _)| task == name));
        env.extend(task_env(ctx));
        // Without a report file (a full temp dir) the run goes on, reporting nothing.
        let mut reports = crate::progress::Reports::open(&ctx.key).await;
        env.retain(|(name, _)| name != PROGRESS_VAR && name != CHECKPOINT_VAR);
        if let Some(reports) = &reports {
            env.push((PROGRESS_VAR.into(), reports.path().display().to_string()));
        }
        if let Some(checkpoint) = ctx.checkpoint() {
            env.push((CHECKPOINT_VAR.into(), checkpoint.to_string()));
        }
        let job = Job {
            command: &self.command,
            env,
            cwd: self.cwd.as_deref(),
            task_json: &ctx.task_json,
            timeout: self.timeout,
            cancel: &ctx.cancel,
            lease_deadline: ctx.lease_deadline.clone(),
            pass_stderr: false,
            keep_output: ctx.output.limit(),
        };
        let running = supervise::leader::run(&self.supervision, job);
        tokio::pin!(running);
        let mut every = tokio::time::interval(crate::progress::TAIL_EVERY);
        let ended = loop {
            tokio::select! {
                ended = &mut running => break ended,
                _ = every.tick(), if reports.is_some() => {
                    if let Some(reports) = &mut reports {
                        reports.look(&ctx.progress).await;
                    }
                }
            }
        };
        // What the handler wrote just before it ended.
        if let Some(mut reports) = reports {
            reports.look(&ctx.progress).await;
        }
        let ended = ended.map_err(|err| match err {
            RunError::NotStarted(reason) | RunError::SupervisorLost(reason) => {
                HandlerError::new(reason)
            }
        })?;
        ctx.output.keep(RunOutput {
            stdout: ended.stdout_tail,
            stdout_dropped: ended.stdout_dropped,
            stderr: ended.stderr_tail.clone(),
            stderr_dropped: ended.stderr_dropped,
        });
        if ended.status.success() {
            // A clean end is an end, whatever stopped it meanwhile: a handler that exits 0
            // after a SIGTERM (shutdown, step-down, a late lease) has done its work.
            return Ok(());
        }
        match (ended.asked, ended.stopped) {
            (Some(Asked::TimedOut), _) => {
                return Err(HandlerError::new(format!(
                    "{program} timed out after {}",
                    crate::util::duration::format(self.timeout.unwrap_or_default())
                )))
            }
            (Some(Asked::Cancelled), _) => {
                return Err(HandlerError::new(format!("{program} was cancelled")))
            }
            (None, Some(StopReason::Lease)) => {
                return Err(HandlerError::interrupted(format!(
                    "{program} was stopped: the lease was not confirmed in time"
                )))
            }
            _ => {}
        }
        let tail = &ended.stderr_tail;
        let tail = &tail[tail
            .len()
            .saturating_sub(supervise::leader::STDERR_TAIL_BYTES)..];
        let text = String::from_utf8_lossy(tail).trim().to_string();
        let message = match text.is_empty() {
            true => format!("{program} failed with {}", ended.status),
            false => format!("{program} failed with {}: {text}", ended.status),
        };
        match ended.status.code() {
            Some(code) if self.permanent_exit_codes.contains(&code) => Err(
                HandlerError::permanent(format!("{message} (exit code {code}: do not retry)")),
            ),
            _ => Err(HandlerError::new(message)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn exec_settings() -> HandlerSettings {
        HandlerSettings {
            kind: HandlerKind::Exec,
            command: vec!["true".into()],
            timeout: None,
            env: BTreeMap::new(),
            pass_env: Vec::new(),
            cwd: None,
            permanent_exit_codes: vec![65],
            max_attempts: None,
            backoff_base: None,
            backoff_max: None,
            priority: None,
            concurrency: None,
            rate: None,
        }
    }

    /// Only allow-listed variables of the replica pass; the Consul token and LEADERQ__
    /// settings do not, unless named in `pass_env`; `env` wins over both.
    #[test]
    fn handler_env_is_the_allow_list_plus_what_is_configured() {
        let parent = vars(&[
            ("PATH", "/usr/bin"),
            ("HOME", "/home/q"),
            ("LC_TIME", "de_DE.UTF-8"),
            ("CONSUL_HTTP_TOKEN", "secret"),
            ("LEADERQ__CONSUL__TOKEN", "secret"),
            ("DB_PASSWORD", "pw"),
            ("TZ", "UTC"),
        ]);
        assert_eq!(
            handler_env(&parent, &exec_settings()),
            vars(&[
                ("HOME", "/home/q"),
                ("LC_TIME", "de_DE.UTF-8"),
                ("PATH", "/usr/bin"),
                ("TZ", "UTC"),
            ])
        );
        let mut settings = exec_settings();
        settings.pass_env = vec!["DB_PASSWORD".into(), "MISSING".into()];
        settings.env = [("TZ", "Europe/Berlin"), ("CONSUL_HTTP_TOKEN", "given")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(
            handler_env(&parent, &settings),
            vars(&[
                ("CONSUL_HTTP_TOKEN", "given"),
                ("DB_PASSWORD", "pw"),
                ("HOME", "/home/q"),
                ("LC_TIME", "de_DE.UTF-8"),
                ("PATH", "/usr/bin"),
                ("TZ", "Europe/Berlin"),
            ])
        );
    }

    /// A replica without PATH still gives its handlers one.
    #[test]
    fn handler_env_always_has_a_path() {
        assert_eq!(
            handler_env(&[], &exec_settings()),
            vars(&[("PATH", DEFAULT_PATH)])
        );
    }

    /// The task's variables carry its identity.
    #[test]
    fn task_env_names_the_run() {
        let ctx = TaskContext {
            key: "oracleTask/t1".into(),
            task_id: "t1".into(),
            task_type: "Demo".into(),
            task_json: Vec::new(),
            attempt: 2,
            fencing_token: FencingToken(9),
            cancel: CancellationToken::new(),
            lease_deadline: TaskContext::unbounded_lease(),
            output: OutputSlot::default(),
            progress: Default::default(),
        };
        assert_eq!(
            task_env(&ctx).to_vec(),
            vars(&[
                ("TASK_ID", "t1"),
                ("TASK_TYPE", "Demo"),
                ("TASK_KEY", "oracleTask/t1"),
                ("LEADERQ_ATTEMPT", "2"),
                ("LEADERQ_FENCING_TOKEN", "9"),
            ])
        );
    }
}
