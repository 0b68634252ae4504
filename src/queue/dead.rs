//! Tasks taken out of the run: dead letters (malformed, unknown, too large, exhausted),
//! written within the coordinator's limits, and orphans (claimed by a lease that ended)
//! put back in the queue.

use std::time::Duration;

use super::entry::pair_of;
use super::{Applied, LeadEnd, Queue};
use crate::coord::{Leadership, StoredTask, TaskOp, TaskVersion, WriteCost};
use crate::task::{dead_letter_within, Task};

/// A task whose claim the coordinator refuses for a while (`Written::Deferred`: a dead
/// lease's takeover delay) is tried again after this long; the tasks after it are claimed
/// meanwhile. (The coordinator does not say how long the delay lasts: the dead lease set
/// it, 15 s by default, at most 60 s.)
pub(super) const DEFERRED_RETRY: Duration = Duration::from_secs(1);
/// The dead letter written when the coordinator refuses even the trimmed one (a Consul
/// whose own limits are below leaderq's): about the least that says what happened.
const MINIMAL_DEAD_LETTER: usize = 4096;

impl Queue {
    pub(super) fn dead_key(&self, key: &str) -> String {
        crate::task::key::dead_letter_key(&self.settings.prefix, &self.settings.dead_prefix, key)
            .into()
    }

    /// Moves an entry to the dead-letter prefix with `reason`, in one guarded write that
    /// deletes it only if unchanged. A dead letter the coordinator would not admit is
    /// trimmed until it does (its largest fields dropped, the reason and original key
    /// kept). Returns whether the entry moved.
    pub(super) async fn dead_letter(
        &self,
        leadership: &Leadership,
        pair: &StoredTask,
        reason: &str,
    ) -> Result<bool, LeadEnd> {
        // Which replica and leadership moved it, for the history (`tasks history`).
        let stamped = crate::task::stamped(
            pair,
            &[
                ("deadNode", serde_json::json!(self.node_id)),
                (
                    "deadFencingToken",
                    serde_json::json!(leadership.fencing_token),
                ),
            ],
        );
        let pair = &stamped;
        let dead_key = self.dead_key(&pair.key);
        let ops = |value: Vec<u8>| {
            [TaskOp::Move {
                key: pair.key.clone(),
                version: pair.version,
                to: dead_key.clone(),
                value,
            }]
        };
        let (value, mut trimmed) = self.dead_letter_admitted(pair, reason, &ops);
        let mut written = self
            .write_or_step_down(leadership, &ops(value), "dead-letter a task")
            .await?;
        if let Applied::TooLarge(why) = &written {
            tracing::warn!(task_key = %pair.key, error = %why, "the coordinator refused the dead letter as too large; writing a minimal one");
            let (value, _) =
                dead_letter_within(pair, reason, self.clock().now(), MINIMAL_DEAD_LETTER);
            trimmed = true;
            written = self
                .write_or_step_down(leadership, &ops(value), "dead-letter a task")
                .await?;
        }
        match written {
            Applied::Done => {}
            Applied::Conflict => return Ok(false),
            Applied::TooLarge(why) => {
                tracing::error!(task_key = %pair.key, error = %why, "cannot dead-letter a task: the coordinator refuses even a minimal record as too large; raise its request size limit");
                return Ok(false);
            }
        }
        let task_type = serde_json::from_slice::<serde_json::Value>(&pair.value)
            .ok()
            .and_then(|v| {
                v.get("taskType")
                    .and_then(|t| t.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        self.metrics.dead_lettered(&task_type);
        tracing::warn!(
            task_key = %pair.key,
            dead_key = %dead_key,
            reason,
            trimmed,
            fencing_token = leadership.fencing_token.0,
            "task moved to the dead-letter prefix"
        );
        Ok(true)
    }

    /// The dead letter for `pair`, shrunk until the coordinator admits its move (`ops`
    /// builds the write from a record), and whether it was trimmed.
    pub(super) fn dead_letter_admitted(
        &self,
        pair: &StoredTask,
        reason: &str,
        ops: &dyn Fn(Vec<u8>) -> [TaskOp; 1],
    ) -> (Vec<u8>, bool) {
        let now = self.clock().now();
        let limits = self.coord.limits();
        let mut room = limits.max_bytes;
        loop {
            let (value, trimmed) = dead_letter_within(pair, reason, now, room);
            let len = value.len();
            let cost = crate::coord::batch_cost(self.coord.as_ref(), &ops(value.clone()), true);
            if limits.admits(cost) || len == 0 || room == 0 {
                return (value, trimmed);
            }
            // Over by this much in the coordinator's units: shrink at least as much.
            let over = cost.bytes.saturating_sub(limits.max_bytes).max(1);
            room = len.saturating_sub(over).min(room - 1);
        }
    }

    /// Puts a task whose run was cut short back in the queue as a failed attempt (or
    /// dead-letters it when its attempts are used up, or when the rewritten task would be
    /// too large to write back).
    pub(super) async fn requeue(
        &self,
        leadership: &Leadership,
        task: &Task,
        reason: &str,
    ) -> Result<(), LeadEnd> {
        let attempts = task.run_number();
        if attempts >= self.retry_of(task).max_attempts {
            return self
                .exhausted(
                    leadership,
                    task,
                    task.version,
                    attempts,
                    &crate::handler::HandlerError::new(reason),
                )
                .await;
        }
        let value = task.retried(attempts, reason, self.clock().now());
        // A task still held (by this very lease) is released if unchanged; an orphan, whose
        // claim went with its lease, is rewritten if unchanged.
        let (key, version) = (task.key.clone(), task.version);
        let ops = match &task.holder {
            Some(_) => [TaskOp::Release {
                key,
                version,
                value: value.clone(),
            }],
            None => [TaskOp::Rewrite {
                key,
                version,
                value: value.clone(),
            }],
        };
        match self
            .write_or_step_down(leadership, &ops, "requeue a task")
            .await?
        {
            Applied::Done => {
                tracing::warn!(task_key = %task.key, task_type = %task.task_type, attempt = attempts, fencing_token = leadership.fencing_token.0, reason, "task requeued");
            }
            Applied::Conflict => {}
            Applied::TooLarge(why) => {
                let pair = pair_of(task, value, task.version);
                let reason = format!("{reason}; cannot requeue it: {why}");
                self.dead_letter(leadership, &pair, &reason).await?;
            }
        }
        Ok(())
    }

    /// Moves a task that used up its attempts, or failed for good, to the dead-letter
    /// prefix.
    pub(super) async fn exhausted(
        &self,
        leadership: &Leadership,
        task: &Task,
        claimed_version: TaskVersion,
        attempts: u32,
        error: &crate::handler::HandlerError,
    ) -> Result<(), LeadEnd> {
        let value = task.with(&[
            ("attempts", serde_json::json!(attempts)),
            (
                "lastError",
                serde_json::Value::String(error.message.clone()),
            ),
        ]);
        let pair = pair_of(task, value, claimed_version);
        let reason = if error.permanent {
            format!("failed permanently (not retried) on attempt {attempts}: {error}")
        } else {
            format!("failed {attempts} times; last error: {error}")
        };
        self.dead_letter(leadership, &pair, &reason).await?;
        Ok(())
    }

    /// Dead-letters a task whose claim would cost `cost`, over the coordinator's limits.
    pub(super) async fn dead_letter_too_large(
        &self,
        leadership: &Leadership,
        task: &Task,
        cost: WriteCost,
    ) -> Result<(), LeadEnd> {
        let limits = self.coord.limits();
        let reason = format!(
            "too large to claim: its claim would be {} operations and {} bytes as the coordinator counts them, over its limits of {} and {}; the task's value is {} bytes",
            cost.ops,
            cost.bytes,
            limits.max_ops,
            limits.max_bytes,
            task.with(&[]).len()
        );
        let pair = pair_of(task, task.with(&[]), task.version);
        self.dead_letter(leadership, &pair, &reason).await?;
        Ok(())
    }
}
