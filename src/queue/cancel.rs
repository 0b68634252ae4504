//! Cancelling a running task (`leaderq tasks cancel KEY` of a task in flight): the operator
//! writes a marker under `leaderq/cancel/<task key>` naming the version of the claim it
//! means; while a handler runs, the leader looks for a marker of its task every
//! [`CANCEL_POLL`], and on one for this very run stops the handler (its process group,
//! through the supervisor) and dead-letters the task as cancelled, then deletes the marker.
//! A marker naming another version (a run that ended, a task enqueued anew under the key)
//! is ignored, so a late one can never cancel a later run.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::run::RELEASE_ATTEMPTS;
use super::Queue;
use crate::coord::{Edit, Edited, StoredTask, TaskVersion};

/// While a handler runs, the leader looks for a cancel marker this often.
pub(super) const CANCEL_POLL: Duration = Duration::from_secs(1);

/// The key of the cancel marker of the task at `task_key`.
pub fn cancel_key(task_key: &str) -> String {
    format!("{}cancel/{task_key}", crate::config::OWN_NAMESPACE)
}

/// What an operator's cancel marker holds: the run it means.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelMarker {
    /// The task's version while claimed by the run to cancel.
    pub version: TaskVersion,
    #[serde(default)]
    pub requested_at: String,
}

/// Whether `stored` (a marker, if any) asks to cancel a run whose claim had a version `had` says it had (a
/// run's recorded reports move its claim's version).
pub fn cancels(stored: Option<&StoredTask>, had: impl Fn(TaskVersion) -> bool) -> bool {
    stored
        .and_then(|s| serde_json::from_slice::<CancelMarker>(&s.value).ok())
        .is_some_and(|marker| had(marker.version))
}

impl Queue {
    /// Resolves once a marker asks to cancel the run of `key` claimed at `version`; an
    /// unreadable marker is looked at again at the next poll.
    pub(super) async fn cancel_requested(&self, key: &str, had: impl Fn(TaskVersion) -> bool) {
        let keys = [cancel_key(key)];
        loop {
            tokio::time::sleep(CANCEL_POLL).await;
            if let Ok(found) = self.coord.get(&keys).await {
                if cancels(found.first(), &had) {
                    return;
                }
            }
        }
    }

    /// Deletes the cancel marker of `key`, once acted on.
    pub(super) async fn clear_cancel(&self, key: &str) {
        let keys = [cancel_key(key)];
        for _ in 0..RELEASE_ATTEMPTS {
            let Ok(found) = self.coord.get(&keys).await else {
                return;
            };
            let ops: Vec<Edit> = found
                .into_iter()
                .map(|s| Edit::Delete {
                    key: s.key,
                    version: s.version,
                })
                .collect();
            if !matches!(self.coord.edit(&ops).await, Ok(Edited::Conflict(_))) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{cancel_key, cancels, CancelMarker};
    use crate::coord::{StoredTask, TaskVersion};

    /// Only a marker naming this run's claim version cancels it.
    #[test]
    fn a_marker_cancels_only_the_run_it_names() {
        let marker = |version: u64| StoredTask {
            key: cancel_key("q/t"),
            value: serde_json::to_vec(&CancelMarker {
                version: TaskVersion(version),
                requested_at: String::new(),
            })
            .unwrap(),
            ..StoredTask::default()
        };
        assert_eq!(cancel_key("q/t"), "leaderq/cancel/q/t");
        assert!(cancels(Some(&marker(7)), |v| v == TaskVersion(7)));
        assert!(!cancels(Some(&marker(6)), |v| v == TaskVersion(7)));
        assert!(!cancels(None, |v| v == TaskVersion(7)));
        let junk = StoredTask {
            value: b"x".to_vec(),
            ..marker(7)
        };
        assert!(!cancels(Some(&junk), |v| v == TaskVersion(7)));
    }
}
