//! Recording a run's reports (`crate::progress::Reporter`) in its task while it runs: the
//! latest progress (at most once a second) and the latest checkpoint (at most four times a
//! second, never before the write before it is answered), written as the claim taken up
//! again by the run's own lease (`TaskOp::Claim` at the claim's current version), guarded
//! by the leadership. A write
//! answered `NotLeader` or `Conflict` means the run's reports are no longer this leader's
//! to write: it stops reporting, and the run goes on. Each write's new version becomes the
//! run's (`Recorded`), which its settlement and an operator's cancel are conditioned on;
//! the settlement's value carries the last reports too, so a retry keeps the checkpoint.

use std::sync::Mutex;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::Queue;
use crate::coord::{Leadership, TaskOp, TaskVersion, Written};
use crate::handler::TaskContext;
use crate::progress::Pending;
use crate::task::progress::{fields, Throttle};
use crate::task::Task;

/// What the run's recorder wrote: the claim's versions (the first the claim's own, the
/// last the current one), and the reports written or still to write.
#[derive(Debug)]
pub(super) struct Recorded {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    versions: Vec<TaskVersion>,
    latest: Pending,
    /// The value of a write whose answer was lost and which no read has found yet: it may
    /// have been applied, moving the claim's version without this run knowing.
    unsure: Option<Vec<u8>>,
}

impl Recorded {
    pub(super) fn new(claimed: TaskVersion) -> Recorded {
        Recorded {
            state: Mutex::new(State {
                versions: vec![claimed],
                ..State::default()
            }),
        }
    }

    /// The claim's current version: the last the run's own writes made.
    pub(super) fn version(&self) -> TaskVersion {
        let state = self.state.lock().ok();
        let last = state.as_ref().and_then(|s| s.versions.last().copied());
        last.unwrap_or_default()
    }

    /// Whether `version` is one this run's claim had.
    pub(super) fn had(&self, version: TaskVersion) -> bool {
        let state = self.state.lock().ok();
        state.is_some_and(|s| s.versions.contains(&version))
    }

    /// Joins `pending` to the latest reports; answers their fields.
    fn merge(&self, pending: Pending) -> Vec<(&'static str, Value)> {
        let Ok(mut state) = self.state.lock() else {
            return Vec::new();
        };
        if pending.progress.is_some() {
            state.latest.progress = pending.progress;
        }
        if pending.checkpoint.is_some() {
            state.latest.checkpoint = pending.checkpoint;
        }
        let progress = state.latest.progress.as_ref();
        let progress = progress.map(|(p, m)| (*p, m.as_deref()));
        fields(progress, state.latest.checkpoint.as_ref())
    }

    fn wrote(&self, version: TaskVersion) {
        if let Ok(mut state) = self.state.lock() {
            state.versions.push(version);
        }
    }

    fn unsure(&self) -> Option<Vec<u8>> {
        self.state
            .lock()
            .ok()
            .and_then(|state| state.unsure.clone())
    }

    fn set_unsure(&self, value: Option<Vec<u8>>) {
        if let Ok(mut state) = self.state.lock() {
            state.unsure = value;
        }
    }

    /// `task` with the run's last reports (`pending`: those not yet written), for its
    /// settlement to write.
    pub(super) fn onto(&self, task: Box<Task>, pending: Pending) -> Box<Task> {
        let fields = self.merge(pending);
        match fields.is_empty() {
            true => task,
            false => Box::new(task.updated(&fields)),
        }
    }
}

impl Queue {
    /// Records the reports of the run `ctx` until `stop`, then returns once the write on
    /// its way (if any) is answered. Returns at once when a write is refused.
    pub(super) async fn record_reports(
        &self,
        leadership: &Leadership,
        ctx: &TaskContext,
        recorded: &Recorded,
        stop: &CancellationToken,
    ) {
        let Ok(Value::Object(claimed)) = serde_json::from_slice::<Value>(&ctx.task_json) else {
            return;
        };
        let mut throttle = Throttle::default();
        let mut pending = Pending::default();
        loop {
            let wait = throttle.wait(self.clock().instant(), pending.checkpoint.is_some());
            if pending.is_empty() || !wait.is_zero() {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = ctx.progress.changed() => {}
                    _ = tokio::time::sleep(wait), if !pending.is_empty() => {}
                }
            }
            let more = ctx.progress.take();
            pending.progress = more.progress.or(pending.progress);
            pending.checkpoint = more.checkpoint.or(pending.checkpoint);
            let now = self.clock().instant();
            if pending.is_empty() || !throttle.wait(now, pending.checkpoint.is_some()).is_zero() {
                continue;
            }
            let mut value = claimed.clone();
            for (name, field) in recorded.merge(std::mem::take(&mut pending)) {
                value.insert(name.to_string(), field);
            }
            throttle.wrote(now);
            if !self.write_reports(leadership, ctx, recorded, value).await {
                return;
            }
        }
    }

    /// One write of the run's reports; answers whether reporting goes on.
    async fn write_reports(
        &self,
        leadership: &Leadership,
        ctx: &TaskContext,
        recorded: &Recorded,
        value: serde_json::Map<String, Value>,
    ) -> bool {
        let Ok(value) = serde_json::to_vec(&value) else {
            return true;
        };
        self.find_unsure(leadership, &ctx.key, recorded).await;
        let ops = [TaskOp::Claim {
            key: ctx.key.clone(),
            version: recorded.version(),
            value: value.clone(),
        }];
        let why = match self.write(leadership, &ops).await {
            Ok(Written::Done { versions, .. }) => {
                let new = versions.iter().find(|(key, _)| *key == ctx.key);
                if let Some((_, version)) = new {
                    recorded.wrote(*version);
                }
                return true;
            }
            Ok(Written::NotLeader) => "this replica no longer leads".to_string(),
            Ok(Written::Conflict(_)) => "the task's claim moved".to_string(),
            Ok(other) => format!("the coordinator refused the write: {other:?}"),
            Err(err) => {
                // Perhaps applied: found now, or once the coordinator answers a read.
                tracing::debug!(task_key = %ctx.key, error = %err, "cannot record the run's report; trying with the next");
                recorded.set_unsure(Some(value));
                self.find_unsure(leadership, &ctx.key, recorded).await;
                return true;
            }
        };
        tracing::warn!(task_key = %ctx.key, fencing_token = ctx.fencing_token.0, reason = %why, "the run's reports are refused: no more are recorded for this run");
        false
    }

    /// Settles a report write whose answer was lost (`Recorded::unsure`): if the task holds
    /// exactly that write under this lease, its version is the run's; once a read answers,
    /// the question is closed either way. A read that fails leaves it for the next look
    /// (the next report write, or the run's end, before its settlement).
    pub(super) async fn find_unsure(
        &self,
        leadership: &Leadership,
        key: &str,
        recorded: &Recorded,
    ) {
        let Some(value) = recorded.unsure() else {
            return;
        };
        let Ok(found) = self.coord.get(&[key.to_string()]).await else {
            return;
        };
        let applied = found.iter().find(|t| {
            t.key == key && t.holder.as_ref() == Some(&leadership.lease) && t.value == value
        });
        if let Some(task) = applied {
            recorded.wrote(task.version);
        }
        recorded.set_unsure(None);
    }
}
