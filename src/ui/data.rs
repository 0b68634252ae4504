//! The dashboard's calls into what other parts of leaderq record or do, behind one small
//! seam: history of finished tasks, the leadership timeline, standbys' heartbeats, and the
//! operator actions delete, retry all and cancel.
//!
//! History, timeline and heartbeats are not recorded by this build: their calls answer
//! [`Recorded::No`], which the page shows as a "not recorded" pane. They are to be wired to
//! the history records and the `tasks cancel/delete/retry --all` functions where those are
//! kept; until then delete and retry-all are done here over `service::admin`'s reads and
//! `Coordinator::edit`, and cancel is refused with a message.

use serde::Serialize;
use serde_json::Value;

use crate::config::Settings;
use crate::coord::{Coordinator, Edit, Edited};
use crate::service::admin::{self, AdminError};

/// Rows of a pane that depends on records this build may not keep.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "recorded", rename_all = "lowercase")]
pub enum Recorded {
    /// Kept: the rows, newest first.
    Yes { rows: Vec<Value> },
    /// Not kept by this build: the page says so (and why).
    No { why: String },
}

fn not_recorded(what: &str) -> Recorded {
    Recorded::No {
        why: format!("{what} are not recorded by this version of leaderq"),
    }
}

/// Finished tasks: outcome, duration, attempts, fencing token, node.
pub async fn history(_coord: &dyn Coordinator, _settings: &Settings) -> Recorded {
    not_recorded("finished tasks")
}

/// Who led when, and why it changed.
pub async fn timeline(_coord: &dyn Coordinator, _settings: &Settings) -> Recorded {
    not_recorded("leadership changes")
}

/// The standbys and their last heartbeat.
pub async fn standbys(_coord: &dyn Coordinator, _settings: &Settings) -> Recorded {
    not_recorded("standby heartbeats")
}

/// Deletes one dead letter at the version read, so a record written anew meanwhile stays.
/// `key` was validated as a key under the dead-letter prefix.
pub async fn delete(
    coord: &dyn Coordinator,
    settings: &Settings,
    key: &str,
) -> Result<(), AdminError> {
    let found = admin::find(coord, settings, key).await?;
    if !found.key.starts_with(&settings.queue.dead_prefix) {
        return Err(AdminError::NotDead { key: found.key });
    }
    let delete = [Edit::Delete {
        key: found.key.clone(),
        version: found.version,
    }];
    match coord.edit(&delete).await? {
        Edited::Done => Ok(()),
        Edited::Conflict(_) => Err(AdminError::Conflict {
            key: found.key,
            reason: "it changed meanwhile; look again".into(),
        }),
    }
}

/// Moves every dead letter (of `task_type`, if given) back to the queue, as `tasks retry`
/// does one. Answers how many moved and the errors of those that did not.
pub async fn retry_all(
    coord: &dyn Coordinator,
    settings: &Settings,
    task_type: Option<&str>,
) -> Result<(usize, Vec<String>), AdminError> {
    let (dead, _) = coord
        .list(
            &settings.queue.dead_prefix,
            crate::coord::Version(0),
            std::time::Duration::ZERO,
        )
        .await?;
    let mut moved = 0;
    let mut errors = Vec::new();
    for stored in dead {
        let value: Value = serde_json::from_slice(&stored.value).unwrap_or_default();
        let of_type = value.get("taskType").and_then(Value::as_str);
        if task_type.is_some_and(|wanted| of_type != Some(wanted)) {
            continue;
        }
        match admin::retry(coord, settings, &stored.key).await {
            Ok(_) => moved += 1,
            Err(err) => errors.push(err.to_string()),
        }
    }
    Ok((moved, errors))
}

/// Cancels a pending or running task: not available in this build.
pub async fn cancel(
    _coord: &dyn Coordinator,
    _settings: &Settings,
    key: &str,
) -> Result<(), String> {
    Err(format!(
        "cannot cancel {key}: this version of leaderq has no cancel; delete it with the coordinator's own tools, or wait for it to finish"
    ))
}
