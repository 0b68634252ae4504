//! Keeping a run's output (`[queue] output_limit`): what an exec handler printed, as its
//! slot in the run's context holds it, written by the leader as one record per attempt
//! (`task::output`) in a guarded write of its own, right after the run and before its
//! settlement. That write never decides the settlement: a record the coordinator refuses as
//! too large is cut further and written again, saying so; a lost leadership or a
//! coordinator that does not answer loses the record (logged), never the run's outcome.
//! A run that printed nothing writes nothing. The records are deleted with the history
//! record of the task's completion (`history.rs`).
//!
//! Where: `leaderq/output/<queue prefix without its '/'>/<task name>/<attempt>`, outside
//! the queue's prefix (its listings stay as cheap as without them) and under
//! [`crate::config::OWN_NAMESPACE`], as the pause flags are.

use super::Queue;
use crate::coord::{CoordError, Leadership, TaskOp, Written};
use crate::handler::RunOutput;
use crate::task::attempts;
use crate::task::output::{text, OutputRecord};
use crate::task::{rfc3339, Task};

/// How many times a record refused as too large is cut (to a quarter each time) and
/// written again before it is given up.
const SHORTEN_TRIES: usize = 3;

/// The prefix of the records of the task `task_name` of the queue under `queue_prefix`.
pub fn output_prefix(queue_prefix: &str, task_name: &str) -> String {
    format!("{}{task_name}/", queue_output_prefix(queue_prefix))
}

/// The prefix of every record of the queue under `queue_prefix`.
pub fn queue_output_prefix(queue_prefix: &str) -> String {
    format!(
        "{}output/{}/",
        crate::config::OWN_NAMESPACE,
        queue_prefix.trim_end_matches('/')
    )
}

/// The key of the record of run `attempt` of the task at `task_key`; `None` for a key
/// outside `queue_prefix`.
pub fn output_key(queue_prefix: &str, task_key: &str, attempt: u32) -> Option<String> {
    let name = task_key.strip_prefix(queue_prefix)?;
    (!name.is_empty()).then(|| format!("{}{attempt}", output_prefix(queue_prefix, name)))
}

/// The attempt a key found under `prefix` ([`output_prefix`]) holds the record of; `None`
/// for a key of another task (one whose name continues this one's, `a/b` under `a/`).
pub fn attempt_of(prefix: &str, key: &str) -> Option<u32> {
    let rest = key.strip_prefix(prefix)?;
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

/// Deletes what is left of the tasks' output prefixes `prefixes` ([`output_prefix`]) once
/// their records are gone: on ZooKeeper a prefix is a znode of its own, which would stay
/// behind empty, one per task, for good; elsewhere there is nothing to find. One still
/// holding records (a task whose name continues this one's) conflicts and stays, and one
/// that is itself a record is left alone. Errors are left: a later deletion of the same
/// task's output tries again.
pub async fn forget_prefixes(coord: &dyn crate::coord::Coordinator, prefixes: &[String]) {
    let keys: Vec<String> = prefixes
        .iter()
        .map(|prefix| prefix.trim_end_matches('/').to_string())
        .collect();
    let Ok(found) = coord.get(&keys).await else {
        return;
    };
    // A key that holds a record is one (attempt 5 of `x` is also the prefix of task `x/5`).
    let empty = found
        .into_iter()
        .filter(|stored| OutputRecord::decode(&stored.value).is_none());
    for stored in empty {
        // One at a time: a prefix with records left fails alone.
        let delete = [crate::coord::Edit::Delete {
            key: stored.key,
            version: stored.version,
        }];
        let _ = coord.edit(&delete).await;
    }
}

/// What the record says of the run besides its output.
pub(super) struct OutputRun {
    pub(super) attempt: u32,
    pub(super) outcome: &'static str,
    pub(super) started: chrono::DateTime<chrono::Utc>,
}

/// Why a record could not be written.
enum NotKept {
    /// The coordinator refused it as too large: a shorter one may do.
    TooLarge(String),
    /// Anything else: given up.
    Lost(String),
}

impl Queue {
    /// Writes the record of `run` of `task` from `output`, if the run printed anything.
    pub(super) async fn keep_output(
        &self,
        leadership: &Leadership,
        task: &Task,
        run: OutputRun,
        output: Option<RunOutput>,
    ) {
        let Some(output) = output else { return };
        let Some(key) = output_key(&self.settings.prefix, &task.key, run.attempt) else {
            return;
        };
        let mut record = OutputRecord {
            attempt: run.attempt,
            outcome: run.outcome.to_string(),
            started_at: rfc3339(run.started),
            finished_at: rfc3339(self.clock().now()),
            node: self.node_id.clone(),
            fencing_token: Some(leadership.fencing_token),
            stdout: text(&output.stdout),
            stdout_dropped: output.stdout_dropped,
            stderr: text(&output.stderr),
            stderr_dropped: output.stderr_dropped,
            note: None,
        };
        if record.is_empty() {
            return;
        }
        let mut keep = self.settings.output_limit;
        for _ in 0..=SHORTEN_TRIES {
            let why = match self.put_output(leadership, &key, record.encode()).await {
                Ok(()) => return,
                Err(NotKept::TooLarge(why)) => why,
                Err(NotKept::Lost(why)) => {
                    tracing::warn!(task_key = %task.key, attempt = run.attempt, error = %why, "cannot keep the run's output");
                    return;
                }
            };
            keep /= 4;
            tracing::warn!(task_key = %task.key, attempt = run.attempt, keep, error = %why, "the run's output is too large for the coordinator; keeping less of it");
            record.shorten(keep, "the coordinator refused the record as too large");
        }
    }

    /// Writes `value` at `key`, guarded by the leadership: created, or, if a record is
    /// there already (a run put back without using an attempt, a task key used again),
    /// rewritten at the version read.
    async fn put_output(
        &self,
        leadership: &Leadership,
        key: &str,
        value: Vec<u8>,
    ) -> Result<(), NotKept> {
        let create = [TaskOp::Create {
            key: key.to_string(),
            value: value.clone(),
        }];
        match self.write(leadership, &create).await {
            Ok(Written::Done { .. }) => return Ok(()),
            Ok(Written::Conflict(_) | Written::Deferred(_)) => {}
            Ok(Written::NotLeader) => return Err(NotKept::Lost("leadership lost".into())),
            Err(err) => return Err(not_kept(err)),
        }
        let found = self.coord.get(&[key.to_string()]).await;
        let version = match found.map_err(not_kept)?.pop() {
            Some(stored) if stored.key == key => stored.version,
            // Deleted since the create conflicted: another writer's business; given up.
            _ => {
                return Err(NotKept::Lost(
                    "the record moved while it was written".into(),
                ))
            }
        };
        let rewrite = [TaskOp::Rewrite {
            key: key.to_string(),
            version,
            value,
        }];
        match self.write(leadership, &rewrite).await {
            Ok(Written::Done { .. }) => Ok(()),
            Ok(Written::NotLeader) => Err(NotKept::Lost("leadership lost".into())),
            Ok(_) => Err(NotKept::Lost(
                "the record moved while it was written".into(),
            )),
            Err(err) => Err(not_kept(err)),
        }
    }
}

fn not_kept(err: CoordError) -> NotKept {
    match err {
        CoordError::Refused(why) => NotKept::TooLarge(why),
        other => NotKept::Lost(other.to_string()),
    }
}

/// How a run ended, in the attempt log's words, from what the handler answered and
/// whether it was stopped or cancelled.
pub(super) fn outcome_of(
    result: &Result<(), crate::handler::HandlerError>,
    cancelled: bool,
    stopped: bool,
) -> &'static str {
    match result {
        Ok(()) => attempts::COMPLETED,
        Err(_) if cancelled => attempts::CANCELLED,
        Err(err) if err.interrupted || stopped => attempts::INTERRUPTED,
        Err(_) => attempts::FAILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records live under leaderq's own namespace, named after the queue and the task,
    /// one key per attempt; a key outside the queue has none.
    #[test]
    fn keys_name_the_queue_the_task_and_the_attempt() {
        assert_eq!(
            output_key("oracleTask/", "oracleTask/t1", 2).as_deref(),
            Some("leaderq/output/oracleTask/t1/2")
        );
        assert_eq!(
            output_key("jobs/", "jobs/a/b", 1).as_deref(),
            Some("leaderq/output/jobs/a/b/1")
        );
        assert_eq!(output_key("jobs/", "other/t1", 1), None);
        assert_eq!(output_key("jobs/", "jobs/", 1), None);
        assert_eq!(output_prefix("jobs/", "a"), "leaderq/output/jobs/a/");
    }

    /// Only a key whose rest is a number is an attempt of that task.
    #[test]
    fn attempts_are_told_from_tasks_whose_names_continue() {
        let prefix = output_prefix("jobs/", "a");
        assert_eq!(attempt_of(&prefix, "leaderq/output/jobs/a/12"), Some(12));
        assert_eq!(attempt_of(&prefix, "leaderq/output/jobs/a/b/1"), None);
        assert_eq!(attempt_of(&prefix, "leaderq/output/jobs/a/"), None);
        assert_eq!(attempt_of(&prefix, "leaderq/output/jobs/ab/1"), None);
    }

    /// A run's record says how it ended in the attempt log's words.
    #[test]
    fn outcomes_use_the_attempt_logs_words() {
        use crate::handler::HandlerError;
        assert_eq!(outcome_of(&Ok(()), false, false), attempts::COMPLETED);
        assert_eq!(outcome_of(&Ok(()), false, true), attempts::COMPLETED);
        let failed = Err(HandlerError::new("boom"));
        assert_eq!(outcome_of(&failed, false, false), attempts::FAILED);
        assert_eq!(outcome_of(&failed, true, true), attempts::CANCELLED);
        assert_eq!(outcome_of(&failed, false, true), attempts::INTERRUPTED);
        let cut = Err(HandlerError::interrupted("lease"));
        assert_eq!(outcome_of(&cut, false, false), attempts::INTERRUPTED);
    }
}
