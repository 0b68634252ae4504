//! Running a claimed task and settling it: the handler under the lease's deadline, then
//! what `settlement.rs` decides (complete: delete the version claimed; retry with backoff;
//! put back; dead letter), written here; completions that could not be recorded are kept
//! and retried, never mistaken for runs cut short; and the settling of a run's outcome
//! once the leadership, or the lease too, is gone (`write_own_or_orphan`, `settle_orphan`).
//!
//! Size: every write of a run's outcome and its fallbacks (the lease's own claim, the
//! orphan it left) are kept together, since they must agree on what a settled task is.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::backlog::Backlog;
use super::entry::pair_of;
use super::finished::{completions, mark_unanswered, riders, Finished};
use super::output::{outcome_of, OutputRun};
use super::plan::chunks;
use super::progress::Recorded;
use super::settlement::{
    self, after_run, after_write, retry_policy, AfterWrite, Retry, RunEnd, Settlement, Settling,
};
use super::work::Leading;
use super::{LeadEnd, Queue};
use crate::coord::{
    CoordError, Edit, Edited, FencingToken, Leadership, LeaseId, StoredTask, TaskOp, TaskVersion,
    Written,
};
use crate::handler::{HandlerError, OutputSlot, TaskContext};
use crate::task::attempts::{self, Attempt};
use crate::task::Task;

/// The first pause before a run's outcome is asked to be written again, after the
/// leadership was lost and the coordinator did not answer; doubled each time up to
/// `OWN_RETRY_MAX`.
const OWN_RETRY_FIRST: Duration = Duration::from_millis(50);
const OWN_RETRY_MAX: Duration = Duration::from_millis(500);

/// Why a run's outcome could not be settled outside the leadership.
#[derive(Debug)]
pub(super) enum Unsettled {
    /// The coordinator did not answer: asking again may settle it.
    Unanswered(String),
    /// The task is not this lease's any more: nothing to settle.
    Final(String),
    /// The task is gone: settled by a try whose answer was lost, by the next leader, or
    /// deleted by an operator.
    Gone,
}

impl std::fmt::Display for Unsettled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unsettled::Unanswered(why) | Unsettled::Final(why) => f.write_str(why),
            Unsettled::Gone => f.write_str("the task is gone"),
        }
    }
}

/// A claimed task and the value its claim wrote (what the handler gets).
pub(super) struct Claimed {
    pub(super) task: Box<Task>,
    pub(super) value: Vec<u8>,
}

/// How many times a completion re-reads a task that a producer keeps rewriting.
pub(super) const RELEASE_ATTEMPTS: usize = 5;

/// A handler's run that is over, before it is settled: its result, why the leading ends
/// (if it does), whether an operator cancelled it and whether it was stopped, when it
/// started and how long it took.
struct Handled {
    result: Result<(), HandlerError>,
    ending: Option<LeadEnd>,
    cancelled: bool,
    stopped: bool,
    started_at: chrono::DateTime<chrono::Utc>,
    elapsed: Duration,
    /// The report lines refused, for the attempt's record.
    refused: Option<String>,
}

/// How one handler run went: how long it took, and whether leadership ends.
pub(super) struct RunOutcome {
    pub(super) elapsed: Duration,
    pub(super) end: Option<LeadEnd>,
}

impl Queue {
    /// Runs one claimed task's handler and settles a failure; a success joins `finished`.
    pub(super) async fn run_claimed(
        &self,
        lead: Leading<'_>,
        claimed: Claimed,
        claimed_version: TaskVersion,
        finished: &mut Vec<Finished>,
    ) -> RunOutcome {
        let Claimed { task, value } = claimed;
        self.term.ran_one();
        let clock = self.clock();
        let started = clock.instant();
        let Some(handler) = self.registry.get(&task.task_type) else {
            // Checked before the claim; the task is requeued as ours at the next listing.
            return RunOutcome {
                elapsed: clock.since(started),
                end: None,
            };
        };
        let ctx = TaskContext {
            key: task.key.clone(),
            task_id: task.id.clone(),
            task_type: task.task_type.clone(),
            task_json: value,
            attempt: task.attempts + 1,
            fencing_token: lead.leadership.fencing_token,
            cancel: CancellationToken::new(),
            lease_deadline: lead.lease.deadline_watch(),
            output: OutputSlot::new(self.settings.output_limit),
            progress: Default::default(),
        };
        let recorded = Recorded::new(claimed_version);
        let (result, ending, cancelled) =
            self.handle(lead, handler.as_ref(), &ctx, &recorded).await;
        // The run's own report writes moved its claim's version (one whose answer was lost
        // is looked for once more); its settlement writes the reports not yet written too.
        self.find_unsure(lead.leadership, &task.key, &recorded)
            .await;
        let claimed_version = recorded.version();
        let task = recorded.onto(task, ctx.progress.take());
        let handled = Handled {
            result,
            ending,
            cancelled,
            stopped: ctx.cancel.is_cancelled(),
            started_at: clock.wall_at(started),
            elapsed: clock.since(started),
            refused: ctx.progress.refusals(),
        };
        let run = OutputRun {
            attempt: ctx.attempt,
            outcome: outcome_of(&handled.result, handled.cancelled, handled.stopped),
            started: handled.started_at,
        };
        // A lease no longer fresh cannot write it: its settlement comes first.
        if lead.lease.is_fresh() {
            self.keep_output(lead.leadership, &task, run, ctx.output.take())
                .await;
        }
        let elapsed = handled.elapsed;
        let end = self
            .settle_run(lead, task, claimed_version, handled, finished)
            .await;
        RunOutcome { elapsed, end }
    }

    /// Runs the handler until it ends: stopped (through `ctx.cancel`) when an operator
    /// cancels the run, or at once when the lease expires; given the shutdown grace when
    /// the replica shuts down. Answers its result, why the leading ends if it does, and
    /// whether an operator cancelled it.
    async fn handle(
        &self,
        lead: Leading<'_>,
        handler: &dyn crate::handler::Handler,
        ctx: &TaskContext,
        recorded: &Recorded,
    ) -> (Result<(), HandlerError>, Option<LeadEnd>, bool) {
        let (lease, cancel, key) = (lead.lease, &ctx.cancel, &ctx.key);
        let mut run = handler.handle(ctx);
        let stop = CancellationToken::new();
        let recording = self.record_reports(lead.leadership, ctx, recorded, &stop);
        tokio::pin!(recording);
        let mut recording_over = false;
        let mut ending: Option<LeadEnd> = None;
        // `leaderq tasks cancel` of this run: its handler is stopped, the task dead-lettered.
        let mut cancelled = false;
        let result = loop {
            tokio::select! {
                result = &mut run => break result,
                _ = &mut recording, if !recording_over => recording_over = true,
                _ = self.cancel_requested(key, |v| recorded.had(v)), if ending.is_none() && !cancelled => {
                    tracing::warn!(task_key = %key, fencing_token = ctx.fencing_token.0, "cancel requested by an operator: stopping the handler");
                    cancelled = true;
                    cancel.cancel();
                }
                _ = lease.expired(), if ending.is_none() => {
                    // Another replica may lead soon: stop the handler now.
                    cancel.cancel();
                    ending = Some(LeadEnd::StepDown(lease.why_not_fresh()));
                }
                _ = lead.shutdown.cancelled(), if ending.is_none() => {
                    ending = Some(LeadEnd::Shutdown);
                    let grace = self.settings.shutdown_grace;
                    tracing::info!(task_key = %key, grace = %crate::util::duration::format(grace), "shutting down: waiting for the running handler");
                    match tokio::time::timeout(grace, &mut run).await {
                        Ok(result) => break result,
                        Err(_) => cancel.cancel(),
                    }
                }
            }
        };
        // A report write on its way is answered first: its version is the settlement's.
        stop.cancel();
        if !recording_over {
            recording.await;
        }
        (result, ending, cancelled)
    }

    /// Settles a run that is over as `settlement.rs` decides: a success joins `finished`
    /// (completed in the next write), a failure is retried or dead-lettered, a run stopped
    /// for the lease is put back. Answers why the leading ends, if it does.
    async fn settle_run(
        &self,
        lead: Leading<'_>,
        task: Box<Task>,
        claimed_version: TaskVersion,
        handled: Handled,
        finished: &mut Vec<Finished>,
    ) -> Option<LeadEnd> {
        let leadership = lead.leadership;
        let attempt = task.attempts + 1;
        let now = self.clock().now();
        let settlement = self.settlement_of(leadership, &task, &handled, now);
        // This run, for the task's attempt log (written with the retry or the dead letter).
        let logged = |outcome: &str, error: &str| {
            let (started, node, token) =
                (handled.started_at, &self.node_id, leadership.fencing_token);
            let mut run = Attempt::new(attempt, started, now, outcome, error, node, token);
            run.note = handled.refused.clone().unwrap_or_default();
            run
        };
        match settlement {
            Settlement::Complete { clear_cancel } => {
                let done = self
                    .finished_run(leadership, task, claimed_version, &handled, clear_cancel)
                    .await;
                finished.push(done)
            }
            Settlement::DeadLetter {
                attempts,
                last_error,
                reason,
                failed,
            } => {
                let outcome = if failed {
                    attempts::FAILED
                } else {
                    attempts::CANCELLED
                };
                let value = task.with(&[
                    ("attempts", serde_json::json!(attempts)),
                    task.logged(&logged(outcome, &last_error)),
                    ("lastError", serde_json::Value::String(last_error)),
                ]);
                let moved = self
                    .dead_letter_run(leadership, &task, value, claimed_version, &reason, failed)
                    .await;
                if let Err(end) = moved {
                    return Some(handled.ending.unwrap_or(end));
                }
            }
            Settlement::PutBack {
                attempts,
                error,
                lease_lost,
            } => {
                if let Some(why) = lease_lost {
                    tracing::warn!(task_key = %task.key, fencing_token = leadership.fencing_token.0, reason = %why, "run stopped for the lease; putting the task back without using an attempt");
                }
                let run = logged(attempts::INTERRUPTED, &error);
                let value = task.retried_after(attempts, &error, now, &run);
                self.settle(lead, &task, claimed_version, value, "put back")
                    .await;
            }
            Settlement::Retry {
                attempts,
                error,
                not_before,
            } => {
                let run = logged(attempts::FAILED, &error);
                let value = task.retried_after(attempts, &error, not_before, &run);
                self.settle(lead, &task, claimed_version, value, "schedule a retry")
                    .await;
            }
        }
        handled.ending
    }

    /// A run that succeeded, to be completed: its history record made, and an operator's
    /// cancel that came too late cleared.
    async fn finished_run(
        &self,
        leadership: &Leadership,
        task: Box<Task>,
        claimed_version: TaskVersion,
        handled: &Handled,
        clear_cancel: bool,
    ) -> Finished {
        if clear_cancel {
            self.clear_cancel(&task.key).await;
        }
        let history = self.history_of(&task, leadership, handled.started_at);
        let elapsed_ms = handled.elapsed.as_millis() as u64;
        let coord = self.coord.as_ref();
        Finished::new(coord, task, claimed_version, elapsed_ms, history)
    }

    /// What becomes of a run that is over (`settlement::after_run`); a failure is counted
    /// and logged.
    fn settlement_of(
        &self,
        leadership: &Leadership,
        task: &Task,
        handled: &Handled,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Settlement {
        let attempt = task.attempts + 1;
        let ended = RunEnd {
            result: &handled.result,
            ending: handled.ending.as_ref(),
            cancelled: handled.cancelled,
            stopped: handled.stopped,
            attempts_before: task.attempts,
        };
        let retry = self.retry_of(task);
        let backoff = self.backoff(&retry, attempt);
        let settlement = after_run(ended, retry.max_attempts, backoff, now);
        if let (Err(err), Settlement::Retry { .. } | Settlement::DeadLetter { failed: true, .. }) =
            (&handled.result, &settlement)
        {
            self.metrics.failed(&task.task_type, handled.elapsed);
            let elapsed_ms = handled.elapsed.as_millis() as u64;
            tracing::warn!(task_key = %task.key, task_type = %task.task_type, attempt, fencing_token = leadership.fencing_token.0, error = %err, elapsed_ms, "task failed");
        }
        settlement
    }

    /// Moves a run's task to the dead letters with `value` (its attempt log and last
    /// error); an operator's cancel (`failed` false), acted on, has its marker cleared.
    async fn dead_letter_run(
        &self,
        leadership: &Leadership,
        task: &Task,
        value: Vec<u8>,
        claimed_version: TaskVersion,
        reason: &str,
        failed: bool,
    ) -> Result<(), LeadEnd> {
        let pair = pair_of(task, value, claimed_version);
        let moved = self.dead_letter(leadership, &pair, reason).await;
        if !failed {
            self.clear_cancel(&task.key).await;
        }
        moved.map(|_| ())
    }

    /// The history record of a task that finished now, and its key; `None` with history
    /// off (`history_keep = 0`).
    fn history_of(
        &self,
        task: &Task,
        leadership: &Leadership,
        started: chrono::DateTime<chrono::Utc>,
    ) -> Option<(String, Vec<u8>)> {
        if self.settings.history_keep == 0 {
            return None;
        }
        let finished = self.clock().now();
        let run = crate::task::history::Run {
            started,
            finished,
            fencing_token: leadership.fencing_token,
            node: &self.node_id,
        };
        let record = crate::task::history::HistoryRecord::completed(task, &run);
        let key = crate::task::history::record_key(
            &self.settings.prefix,
            &self.settings.done_prefix,
            &task.key,
            finished,
        );
        Some((key, record.encode()))
    }

    /// `fencing_token` is the leadership's token as the committed write saw it: logging it
    /// beside the leadership's own lets an audit prove no stale leader completed a task.
    pub(super) fn log_completed(
        &self,
        leadership: &Leadership,
        done: &Finished,
        fencing_token: FencingToken,
    ) {
        let task = &done.task;
        // The token the committing write saw (Consul: the leader key's ModifyIndex), under
        // the field name the chaos audit reads.
        let leader_lock_index = fencing_token.0;
        self.metrics
            .completed(&task.task_type, Duration::from_millis(done.elapsed_ms));
        tracing::info!(
            task_key = %task.key,
            task_id = %task.id,
            task_type = %task.task_type,
            attempt = task.run_number(),
            fencing_token = leadership.fencing_token.0,
            elapsed_ms = done.elapsed_ms,
            leader_lock_index,
            "task completed"
        );
    }

    /// Deletes a finished task, but only the version this run claimed: a producer's newer
    /// write under the same key is released back to the queue instead.
    /// Returns the task back when its completion could not be recorded (coordinator
    /// unavailable), so that the caller retries it: a finished task is never mistaken for a
    /// cut-short one.
    pub(super) async fn complete(
        &self,
        leadership: &Leadership,
        mut done: Finished,
    ) -> Option<Finished> {
        let written = self.write(leadership, &[done.completion()]).await;
        let key = &done.task.key;
        match after_write(&written, Settling::Completion) {
            AfterWrite::Settled => {
                let fencing_token = match written {
                    Ok(Written::Done { fencing_token, .. }) => fencing_token,
                    _ => leadership.fencing_token,
                };
                self.log_completed(leadership, &done, fencing_token)
            }
            AfterWrite::ReadAgain => {
                // The lease ended and left the task an orphan, where that moves its version
                // (Redis); or a producer rewrote it while it ran.
                let edits = |version| orphan_completion(&done, version);
                let orphan = match self.release_current(leadership, key).await {
                    Some(current) => self
                        .settle_orphan(&leadership.lease, &current, edits)
                        .await
                        .is_ok(),
                    None => false,
                };
                if orphan {
                    tracing::info!(task_key = %key, "lease lost: the finished run is recorded on the orphan it left");
                    self.log_completed(leadership, &done, leadership.fencing_token);
                } else {
                    tracing::info!(task_key = %key, "task completed, but a producer rewrote it meanwhile; the new version stays queued");
                }
            }
            // The run is over and done: recorded under this lease's own claim, or on the
            // orphan its ended lease left, so the next leader does not run it again.
            AfterWrite::OwnOrOrphan => self.record_own(leadership, vec![done]).await,
            AfterWrite::LeftAsIs(why) | AfterWrite::DeadLetter(why) => {
                tracing::error!(task_key = %key, error = %why, "cannot record the completed task: the coordinator refused it as too large");
            }
            AfterWrite::Keep | AfterWrite::AskAgain => {
                tracing::warn!(task_key = %key, error = ?written, "cannot record the completed task yet; retrying");
                mark_unanswered(&self.settings.done_prefix, std::slice::from_mut(&mut done));
                return Some(done);
            }
        }
        None
    }

    /// `finished` without those a completion write whose answer never came did record
    /// ([`Queue::recorded_already`]); those it cannot tell about yet come first, so that
    /// nothing rides a claim after them.
    pub(super) async fn settle_unsure(
        &self,
        leadership: &Leadership,
        finished: Vec<Finished>,
    ) -> Vec<Finished> {
        let (write, mut unsure) = self.recorded_already(leadership, finished).await;
        unsure.extend(write);
        unsure
    }

    /// Of `finished`, those a completion write whose answer never came did record: their
    /// record key exists, so that write was applied, and they are logged as completed
    /// rather than written again (which, where the completion of a task already gone
    /// succeeds, would record their runs twice). Answers the others, to complete, and
    /// those it cannot tell about yet (the coordinator cannot be read), to keep.
    async fn recorded_already(
        &self,
        leadership: &Leadership,
        finished: Vec<Finished>,
    ) -> (Vec<Finished>, Vec<Finished>) {
        let mut keys: Vec<String> = finished
            .iter()
            .filter_map(|done| done.sent_under.clone())
            .collect();
        if keys.is_empty() {
            return (finished, Vec::new());
        }
        keys.sort();
        keys.dedup();
        let found = match self.coord.get(&keys).await {
            Ok(found) => found,
            Err(err) => {
                tracing::warn!(error = %err, "cannot tell yet whether completions whose answer was lost were recorded; retrying");
                return finished
                    .into_iter()
                    .partition(|done| done.sent_under.is_none());
            }
        };
        let mut write = Vec::with_capacity(finished.len());
        for mut done in finished {
            match done.sent_under.take() {
                Some(key) if found.iter().any(|stored| stored.key == key) => {
                    tracing::info!(task_key = %done.task.key, "a completion whose answer was lost was recorded");
                    self.log_completed(leadership, &done, leadership.fencing_token);
                }
                _ => write.push(done),
            }
        }
        (write, Vec::new())
    }

    /// Completes finished tasks, in as few writes as the limits allow; if one of them was
    /// rewritten meanwhile, each of its write's tasks is completed on its own so the
    /// rewritten one is released, not deleted. Returns those whose completion could not be
    /// recorded yet.
    pub(super) async fn complete_all(
        &self,
        leadership: &Leadership,
        finished: Vec<Finished>,
    ) -> Vec<Finished> {
        let (finished, mut left) = self.recorded_already(leadership, finished).await;
        if finished.len() <= 1 {
            for done in finished {
                left.extend(self.complete(leadership, done).await);
            }
            return left;
        }
        let (guard, costs) = riders(self.coord.guard_cost(), &finished);
        let mut finished = finished.into_iter();
        for range in chunks(Some(guard), &costs, self.coord.limits()) {
            let mut group: Vec<Finished> = finished.by_ref().take(range.len()).collect();
            let ops = completions(&self.settings.done_prefix, &group);
            match self.write(leadership, &ops).await {
                Ok(Written::Done { fencing_token, .. }) => {
                    for done in &group {
                        self.log_completed(leadership, done, fencing_token);
                    }
                }
                Err(err) if !matches!(err, CoordError::Refused(_)) => {
                    // Perhaps applied: tried again as they are once it is known.
                    tracing::warn!(error = %err, tasks = group.len(), "cannot record completed tasks yet; retrying");
                    mark_unanswered(&self.settings.done_prefix, &mut group);
                    left.extend(group);
                }
                _ => {
                    for done in group {
                        left.extend(self.complete(leadership, done).await);
                    }
                }
            }
        }
        left
    }

    /// Finished runs whose completion the leadership could not record because it was lost
    /// (a run that ended cleanly while being stopped included): the runs are over, so each
    /// is completed under the lease's own claim, or, if the lease ended too (revoked), as
    /// the orphan it left ([`Queue::own_orphan`]). Only if neither can be written (the
    /// coordinator cannot be reached for one orphan fence) does the next leader run the
    /// task again; its history record is written anyway, saying why, so that the repeat is
    /// explained. A task found gone is not run again, and gets no such record.
    pub(super) async fn record_own(&self, leadership: &Leadership, unrecorded: Vec<Finished>) {
        let until = self.own_deadline();
        for done in unrecorded {
            let ops = [done.completion()];
            let orphan_edits = |version| orphan_completion(&done, version);
            match self
                .write_own_or_orphan(&leadership.lease, &ops, orphan_edits, until)
                .await
            {
                Ok(how) => {
                    tracing::info!(task_key = %done.task.key, "leadership lost: the finished run is recorded {how}");
                    self.log_completed(leadership, &done, leadership.fencing_token);
                }
                Err(Unsettled::Gone) => {
                    // Deleted by a try whose answer was lost (its history went with it), by
                    // the next leader's run, or by hand: nothing runs it again for this.
                    tracing::info!(task_key = %done.task.key, "leadership lost: the finished run's task is gone already");
                }
                Err(why) => {
                    tracing::warn!(task_key = %done.task.key, error = %why, "a run finished, but leadership and lease were lost before its completion was recorded: the next leader runs the task again");
                    let Some((key, value)) = &done.history else {
                        continue;
                    };
                    let Ok(mut record) =
                        serde_json::from_slice::<crate::task::history::HistoryRecord>(value)
                    else {
                        continue;
                    };
                    record.reason = Some(
                        "finished, but leadership and lease were lost before the completion was recorded: the next leader runs the task again".into(),
                    );
                    let put = [Edit::Put {
                        key: key.clone(),
                        value: record.encode(),
                    }];
                    if let Err(err) = self.coord.edit(&put).await {
                        tracing::warn!(task_key = %done.task.key, error = %err, "cannot write the history record of an unrecorded completion");
                    }
                }
            }
        }
    }

    /// Completes finished tasks, and forgets the keys whose outcome is recorded: deleted,
    /// or released to a producer's newer version, which the next look then reads.
    pub(super) async fn complete_known(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        finished: Vec<Finished>,
    ) -> Vec<Finished> {
        let keys: Vec<String> = finished.iter().map(|done| done.task.key.clone()).collect();
        let left = self.complete_all(leadership, finished).await;
        for key in keys {
            if !left.iter().any(|done| done.task.key == key) {
                backlog.forget(&key);
            }
        }
        left
    }

    /// Writes `value` and releases the task, if it is still the version this run claimed.
    /// A value too large to write back sends the task to dead-letter instead. A write the
    /// coordinator did not answer (an error, a time-out) is tried again while the lease is
    /// fresh: it is guarded and conditioned on the claim's version, so a try whose answer
    /// was lost is never applied twice (the next one conflicts and finds the task
    /// released). Left held by this lease, the task would be requeued by the next listing
    /// as a run cut short, using an attempt the handler never failed; once the lease is
    /// stale the term ends and the lease with it, and the next leader requeues the orphan.
    pub(super) async fn settle(
        &self,
        lead: Leading<'_>,
        task: &Task,
        claimed_version: TaskVersion,
        value: Vec<u8>,
        what: &str,
    ) {
        let leadership = lead.leadership;
        let ops = [TaskOp::Release {
            key: task.key.clone(),
            version: claimed_version,
            value: value.clone(),
        }];
        let orphan_edits = |version| {
            vec![Edit::Replace {
                key: task.key.clone(),
                version,
                value: value.clone(),
            }]
        };
        let mut pause = OWN_RETRY_FIRST;
        loop {
            let written = self.write(leadership, &ops).await;
            let lease_fresh = lead.lease.is_fresh();
            match after_write(&written, Settling::WriteBack { lease_fresh }) {
                AfterWrite::AskAgain => {
                    tracing::debug!(task_key = %task.key, error = ?written, "cannot {what} yet; asking again while the lease lives");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(OWN_RETRY_MAX);
                    continue;
                }
                AfterWrite::Settled => {}
                AfterWrite::ReadAgain => {
                    if let Some(current) = self.release_current(leadership, &task.key).await {
                        if self
                            .settle_orphan(&leadership.lease, &current, orphan_edits)
                            .await
                            .is_ok()
                        {
                            tracing::info!(task_key = %task.key, "lease lost: {what} on the orphan it left");
                        }
                    }
                }
                AfterWrite::DeadLetter(why) => {
                    let pair = pair_of(task, value.clone(), claimed_version);
                    let reason =
                        format!("cannot {what}: the task is too large to write back: {why}");
                    if let Err(end) = self.dead_letter(leadership, &pair, &reason).await {
                        tracing::warn!(task_key = %task.key, ?end, "cannot dead-letter a task too large to {what}; the task is requeued when this lease ends");
                    }
                }
                AfterWrite::OwnOrOrphan => {
                    // The run is over: write it back without the leadership guard, so that
                    // the next leader finds the task as settled here rather than as a run
                    // cut short (which would cost it an attempt).
                    let until = self.own_deadline();
                    match self
                        .write_own_or_orphan(&leadership.lease, &ops, orphan_edits, until)
                        .await
                    {
                        Ok(how) => {
                            tracing::info!(task_key = %task.key, "leadership lost: {what} {how}")
                        }
                        Err(why) => {
                            tracing::warn!(task_key = %task.key, error = %why, "cannot {what}: leadership and claim lost; the next leader requeues the task")
                        }
                    }
                }
                AfterWrite::LeftAsIs(why) => {
                    tracing::warn!(task_key = %task.key, error = %why, "cannot {what} while the lease is fresh; the task is requeued when this lease ends")
                }
                // A completion's answer only; a write back is asked again or left as is.
                AfterWrite::Keep => {
                    tracing::warn!(task_key = %task.key, error = ?written, "cannot {what}; the task is requeued when this lease ends")
                }
            }
            return;
        }
    }

    /// Writes the outcome of a run that is over, on one task, after leadership was lost:
    /// `ops` under the lease's own claim while the lease holds it, or else, if the lease
    /// ended leaving the task as its orphan, the `orphan_edits` at the orphan's version.
    /// Says how it was written, or why it could not be. A coordinator that cannot answer
    /// is asked again, with backoff, until `until` ([`Queue::own_deadline`]). Each try
    /// writes at a version just read, so a try whose answer was lost is never applied
    /// twice.
    pub(super) async fn write_own_or_orphan(
        &self,
        lease: &LeaseId,
        ops: &[TaskOp],
        orphan_edits: impl Fn(TaskVersion) -> Vec<Edit>,
        until: tokio::time::Instant,
    ) -> Result<&'static str, Unsettled> {
        let mut pause = OWN_RETRY_FIRST;
        loop {
            match self.try_own_or_orphan(lease, ops, &orphan_edits).await {
                Ok(how) => return Ok(how),
                Err(Unsettled::Unanswered(why)) if tokio::time::Instant::now() + pause <= until => {
                    let key = ops.first().map(TaskOp::key).unwrap_or_default();
                    tracing::debug!(task_key = %key, error = %why, "cannot settle a run that is over yet; asking again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(OWN_RETRY_MAX);
                }
                Err(unsettled) => return Err(unsettled),
            }
        }
    }

    /// Until when the outcomes of runs that are over are asked to be written after the
    /// leadership was lost, from now: one orphan fence, after which the next leader
    /// requeues what the lease left (and runs it again).
    pub(super) fn own_deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.lease_rules.orphan_fence
    }

    /// One try of [`Queue::write_own_or_orphan`].
    async fn try_own_or_orphan(
        &self,
        lease: &LeaseId,
        ops: &[TaskOp],
        orphan_edits: impl FnOnce(TaskVersion) -> Vec<Edit>,
    ) -> Result<&'static str, Unsettled> {
        let key = ops.first().map(TaskOp::key).unwrap_or_default();
        let mut unanswered = None;
        match self.coord.write_own(lease, ops).await {
            Ok(Written::Done { .. }) => return Ok("under this replica's own claim"),
            Ok(_) => {}
            Err(err) => {
                tracing::debug!(task_key = %key, error = %err, "cannot write under this replica's own claim; looking for the orphan its lease left");
                if !matches!(err, CoordError::Refused(_)) {
                    unanswered = Some(err.to_string());
                }
            }
        }
        let current = match self.coord.get(&[key.to_string()]).await {
            Ok(mut found) => found.pop().filter(|t| t.key == key),
            Err(err) => return Err(Unsettled::Unanswered(err.to_string())),
        };
        let Some(current) = current else {
            return Err(Unsettled::Gone);
        };
        if let (Some(why), Some(holder)) = (unanswered, &current.holder) {
            if holder == lease {
                // Still this lease's claim: its own write was not answered, try it again.
                return Err(Unsettled::Unanswered(why));
            }
        }
        self.settle_orphan(lease, &current, orphan_edits)
            .await
            .map(|()| "on the orphan its ended lease left")
    }

    /// Settles `current` (a task as just read) with `edits` at its version if it is the
    /// orphan this lease left ([`own_orphan`]); else says why not.
    pub(super) async fn settle_orphan(
        &self,
        lease: &LeaseId,
        current: &StoredTask,
        edits: impl FnOnce(TaskVersion) -> Vec<Edit>,
    ) -> Result<(), Unsettled> {
        let Some(version) = own_orphan(lease, current) else {
            return Err(Unsettled::Final(
                "the task is no longer this lease's claim nor its orphan".into(),
            ));
        };
        match self.coord.edit(&edits(version)).await {
            Ok(Edited::Done) => Ok(()),
            Ok(Edited::Conflict(_)) => Err(Unsettled::Final(
                "the orphan its ended lease left moved meanwhile (the next leader took it)".into(),
            )),
            Err(err) => Err(Unsettled::Unanswered(err.to_string())),
        }
    }

    /// Releases a task a producer rewrote while it ran, keeping the producer's value.
    /// Answers the task as last read when this lease does not hold it (an orphan, or
    /// another's), for the caller to settle; `None` once released, gone or unreadable.
    pub(super) async fn release_current(
        &self,
        leadership: &Leadership,
        key: &str,
    ) -> Option<StoredTask> {
        let keys = [key.to_string()];
        for _ in 0..RELEASE_ATTEMPTS {
            let current = match self.coord.get(&keys).await {
                Ok(found) => found.into_iter().next()?,
                Err(err) => {
                    tracing::warn!(task_key = %key, error = %err, "cannot read a rewritten task");
                    return None;
                }
            };
            if current.holder.as_ref() != Some(&leadership.lease) {
                return Some(current);
            }
            let ops = [TaskOp::Release {
                key: key.to_string(),
                version: current.version,
                value: current.value,
            }];
            match self.write(leadership, &ops).await {
                Ok(Written::Conflict(_)) => continue,
                _ => return None,
            }
        }
        None
    }

    /// The backoff before retry `attempt` under `retry`, its jitter drawn now
    /// (`settlement::backoff`).
    fn backoff(&self, retry: &Retry, attempt: u32) -> Duration {
        let (base, max) = (retry.backoff_base, retry.backoff_max);
        settlement::backoff(base, max, attempt, fastrand::f64())
    }

    /// `task`'s retry policy: its own `maxAttempts`, over its type's, over the queue's.
    pub(super) fn retry_of(&self, task: &Task) -> Retry {
        let queue = Retry {
            max_attempts: self.settings.max_attempts,
            backoff_base: self.settings.backoff_base,
            backoff_max: self.settings.backoff_max,
        };
        retry_policy(
            task.max_attempts,
            self.registry.policy(&task.task_type),
            queue,
        )
    }
}

/// The version of `stored` if it is a task this lease claimed and left as an orphan when
/// the lease ended (revoked, or expired) before the run's outcome was written under it,
/// with nothing written to it since: a requeue or another claim rewrites `takenBy`, so
/// the marks of this lease's claim prove it. Only the replica whose run it was, and whose
/// run is over, settles such a task outside any leadership, with an edit at exactly that
/// version; `None` for anything else (settled, requeued, claimed, held).
fn own_orphan(lease: &LeaseId, stored: &StoredTask) -> Option<TaskVersion> {
    if stored.holder.is_some() {
        return None;
    }
    let task = Task::parse(stored).ok()?;
    let claimed_by = task
        .taken_by
        .as_deref()
        .and_then(|by| by.get("session"))
        .and_then(serde_json::Value::as_str);
    (task.taken && claimed_by == Some(lease.0.as_str())).then_some(stored.version)
}

/// A finished run's completion as edits of the orphan its lease left at `version`, for the
/// replica whose run it was once its lease ended: delete the task, write its history.
fn orphan_completion(done: &Finished, version: TaskVersion) -> Vec<Edit> {
    let mut edits = vec![Edit::Delete {
        key: done.task.key.clone(),
        version,
    }];
    if let Some((key, value)) = &done.history {
        edits.push(Edit::Put {
            key: key.clone(),
            value: value.clone(),
        });
    }
    edits
}
