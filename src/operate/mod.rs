//! The operator's verbs over the coordinator seam, on every backend, cut by noun: what
//! `leaderq enqueue|status|tasks|pause|resume|schedules` runs and what the dashboard's
//! panes and actions call. Each noun's file owns its reads and writes (plain async
//! functions answering serializable values) and the plain text the CLI prints for them,
//! so the binary only parses flags and prints, and the dashboard (`ui`) shows the same
//! values its own way.
//!
//! - [`tasks`]: enqueue (from files or flags), list, show, cancel, delete.
//! - [`dead`]: the dead letters: retry one or all, purge.
//! - [`status`]: the queue's status with the replicas, and its pause flag.
//! - [`leadership`]: who led when (the timeline) and who leads a `leaderq run`.
//! - [`history`]: finished tasks, from their history records and the dead letters.
//! - [`output`]: what a task's runs printed, as kept (`tasks show KEY --output`).
//! - [`schedules`]: `leaderq schedules` (apply, list, pause, resume, delete).
//!
//! Every key these verbs write or read by name is a [`Key`](crate::task::key::Key) under
//! the queue or the dead-letter prefix: ids and keys from the command line and
//! `originalKey` from a dead letter are validated, and refused with a message before
//! anything is sent. Reads go through `list`/`get`/`observe`, writes through
//! `Coordinator::edit` at the versions read.
//!
//! This module stands below the dashboard, the services, the lab and the server: it
//! imports none of `ui`, `service` or `server`, and they call it.

pub mod bulk;
pub mod dead;
pub mod history;
pub mod leadership;
pub mod output;
pub mod produce;
pub mod schedules;
pub mod status;
pub mod tasks;
pub mod waits;

use crate::coord::{CoordError, Coordinator, StoredTask, Version};
use crate::task::key;

/// Why an operator verb did nothing (or not all it was asked), in words that say what to
/// do; [`OperateError::is_refused_input`] tells input refused before anything was sent.
#[derive(Debug, thiserror::Error)]
pub enum OperateError {
    #[error(transparent)]
    Coordinator(#[from] CoordError),
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path} is not a task: {reason}")]
    NotATask { path: String, reason: String },
    #[error("--para is not JSON: {0}")]
    Para(String),
    #[error("nothing to enqueue: give task files, or --type TYPE [--para JSON]")]
    NothingToEnqueue,
    #[error("{failed} of {total} task(s) were not enqueued (see above)")]
    NotAllEnqueued { failed: usize, total: usize },
    #[error("{key} already exists; tasks are enqueued only under new keys (delete it or pick another taskId)")]
    Exists { key: String },
    #[error("no task {key} under the queue or dead-letter prefix, by key, name or id (see `leaderq tasks list`)")]
    NoSuchTask { key: String },
    #[error("{key} is not a dead letter; only dead letters can be retried")]
    NotDead { key: String },
    #[error("{key} is a dead letter, not a queued task; only queued tasks can be cancelled (delete it with `leaderq tasks delete`)")]
    NotQueued { key: String },
    #[error("{key} is running; cancel it with `leaderq tasks cancel` instead")]
    Running { key: String },
    /// `key` is shown as stored text, escaped.
    #[error("{key} is no longer running but was not cancelled (it finished or was put back meanwhile); see `leaderq tasks show`")]
    NotCancelled { key: String },
    /// `key` is shown as stored text, escaped.
    #[error("{key} still runs after {waited}: is a leader running? the request stands until its handler ends")]
    StillRunning { key: String, waited: String },
    #[error("{key} changed or went meanwhile; look again with `leaderq tasks show` and try again")]
    Changed { key: String },
    #[error(
        "{key} was not a task (not a JSON object with a taskType); fix it and enqueue it anew"
    )]
    NotRetryable { key: String },
    #[error("cannot move the task back to {key}: {reason}")]
    Conflict { key: String, reason: String },
    #[error("{what} {value:?} cannot name a task: {reason}")]
    InvalidId {
        what: String,
        value: String,
        reason: key::Invalid,
    },
    #[error("{key:?} is neither a key under {prefixes} nor a task name: {reason}")]
    InvalidKey {
        key: String,
        prefixes: String,
        reason: key::Invalid,
    },
    #[error("{key} holds originalKey {original:?}, which retry will not write to: {reason}; fix the record, or enqueue the task anew")]
    BadOriginalKey {
        key: String,
        original: String,
        reason: String,
    },
    /// A purge that was not confirmed: no terminal to ask on.
    #[error("{0}")]
    Unconfirmed(String),
    #[error("nothing deleted")]
    NothingDeleted,
    #[error("cannot read the dead letters from {from}")]
    ReadDead {
        from: String,
        #[source]
        source: CoordError,
    },
    /// The terminal asked to confirm could not be read.
    #[error(transparent)]
    Ask(std::io::Error),
}

impl OperateError {
    /// Input from the command line refused before anything was sent.
    pub fn is_refused_input(&self) -> bool {
        matches!(
            self,
            OperateError::InvalidId { .. }
                | OperateError::InvalidKey { .. }
                | OperateError::Unconfirmed(_)
        )
    }
}

/// One line a verb says on the terminal: its answer (stdout), or a note on one item that
/// did not go through while the others did (stderr).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    Out(String),
    Err(String),
}

/// Every key under `prefix` now, with its value.
pub(crate) async fn list_now(
    coord: &dyn Coordinator,
    prefix: &str,
) -> Result<Vec<StoredTask>, OperateError> {
    let (tasks, _) = coord
        .list(prefix, Version(0), std::time::Duration::ZERO)
        .await?;
    Ok(tasks)
}
