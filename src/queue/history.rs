//! The leader's upkeep of the history of finished tasks: now and then (at most every
//! [`HISTORY_PRUNE_EVERY`], never on the path of each task) it deletes the records that
//! `[queue] history_keep` and `history_max_age` no longer keep, at the versions it read.
//! The records themselves are written by the completions (`run.rs`); what they hold and
//! which to drop is `task::history`'s business.

use super::*;
use crate::coord::{Edit, Edited};
use crate::task::history::{to_prune, Retention};

/// How often the leader looks at the history's size.
pub(super) const HISTORY_PRUNE_EVERY: Duration = Duration::from_secs(30);
/// Records deleted per edit: well within every backend's limits on one write.
const PRUNE_BATCH: usize = 32;

impl Queue {
    /// Deletes the history records retention drops. Errors are logged and left for the
    /// next time: pruning never costs the leadership.
    pub(super) async fn prune_history(&self) {
        let prefix = &self.settings.done_prefix;
        let keys = match self.coord.keys(prefix).await {
            Ok((keys, _)) => keys,
            Err(err) => {
                self.metrics.coordinator_error(&err);
                tracing::debug!(error = %err, "cannot read the history's keys; pruning later");
                return;
            }
        };
        let retention = Retention {
            keep: self.settings.history_keep,
            max_age: self.settings.history_max_age,
        };
        let drop = to_prune(&keys, prefix, retention, Utc::now());
        let mut pruned = 0;
        for chunk in drop.chunks(PRUNE_BATCH) {
            let found = match self.coord.get(chunk).await {
                Ok(found) => found,
                Err(err) => {
                    self.metrics.coordinator_error(&err);
                    break;
                }
            };
            let ops: Vec<Edit> = found
                .iter()
                .map(|record| Edit::Delete {
                    key: record.key.clone(),
                    version: record.version,
                })
                .collect();
            match self.coord.edit(&ops).await {
                Ok(Edited::Done) => pruned += ops.len(),
                // Another pruner (a leader before this one) got there first.
                Ok(Edited::Conflict(_)) => {}
                Err(err) => {
                    self.metrics.coordinator_error(&err);
                    break;
                }
            }
        }
        if pruned > 0 {
            tracing::info!(pruned, kept = keys.len() - pruned, "history pruned");
        }
    }
}
