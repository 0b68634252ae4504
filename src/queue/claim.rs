//! Claiming: working through a backlog in `taskTime` order, each claim planned within the
//! coordinator's limits (`plan.rs` decides, this file writes), finished tasks riding along
//! in the next claim, and claims that did not start put back.

use super::*;

impl Queue {
    /// Works through a listing's backlog. Before each claim the plan decides: look at the
    /// queue's keys (every LOOK_INTERVAL) for tasks that arrived and retries written back,
    /// list again, or claim. A cheap look is made before the claim; the names of a costly
    /// one, and a listing, are read while the claims go on, and merged (new keys read and
    /// put in their places) before the first claim after they arrive. Retries that fall due join the pending tasks, so the earliest
    /// eligible task known is always claimed next. Tasks are claimed one at a time, or in
    /// batches of up to `claim_batch` while handlers finish fast, each batch within the
    /// coordinator's write limits; a task too large to claim at all is dead-lettered. Each
    /// claim is conditioned on the version read; a conflict on some of the batch's claims
    /// reads just those tasks again (any other conflict sends the leader back to list
    /// again). Finished tasks are completed in the next claim's write.
    pub(super) async fn work_through(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
        mut backlog: Backlog,
        memory: &mut Memory,
    ) -> (Option<LeadEnd>, Vec<Finished>) {
        let mut finished: Vec<Finished> = Vec::new();
        let mut fast = false;
        // After the coordinator refused a batch as too large (a Consul whose limits are
        // below leaderq's), claim one task at a time, alone in its write, until the next
        // listing.
        let mut single = false;
        let mut end = None;
        // A look whose names are being read.
        let mut reading: Option<sort::Reading> = None;
        'listing: loop {
            if let Some(stop) = self.must_stop(lease, shutdown) {
                end = Some(stop);
                break;
            }
            if !lease.outlasts(self.lease_rules.claim_headroom) {
                // Renewals are late: a run claimed now could be cut by its supervisor's
                // kill window. Claim nothing until a renewal comes or the lease runs out.
                tracing::warn!(headroom = %crate::util::duration::format(self.lease_rules.claim_headroom), "the lease may not outlast a run's kill sequence; claiming nothing until it is renewed");
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = lease.until_it_outlasts(self.lease_rules.claim_headroom) => {}
                }
                continue;
            }
            let in_line = match backlog.next(Utc::now()) {
                Next::Claim => None,
                // A cheap look is made before this claim, so that a task that arrived goes
                // first; a costly one, and a listing, are read while this claim and the
                // next ones are written (the backlog asks for one read at a time).
                Next::Look if backlog.looks_in_line() => Some(self.start_look(&mut backlog)),
                Next::Look => {
                    reading = Some(self.start_look(&mut backlog));
                    None
                }
                Next::Relist => {
                    reading = Some(self.start_relist(&mut backlog));
                    None
                }
                Next::Done => break,
            };
            if let Some(read) = in_line.or_else(|| reading.take_if(|reading| reading.is_ready())) {
                match self
                    .finish_reading(leadership, &mut backlog, memory, read)
                    .await
                {
                    // A pause takes effect between batches: the loop waits it out.
                    Ok(Look::Continue) if self.paused().await => break,
                    // What was read may come first: decide again.
                    Ok(Look::Continue) => continue,
                    Ok(Look::Relist) => break,
                    Err(stop) => {
                        end = Some(stop);
                        break;
                    }
                }
            }
            let max_tasks = if fast && !single {
                self.settings.claim_batch
            } else {
                1
            };
            let riders = &finished[..if single { 0 } else { finished.len() }];
            let (batch, candidates, deletions) =
                match self.plan_batch(leadership, &mut backlog, riders, max_tasks) {
                    Planned::Batch {
                        tasks,
                        candidates,
                        deletions,
                    } => (tasks, candidates, deletions),
                    Planned::TooLarge { task, cost } => {
                        match self.dead_letter_too_large(leadership, &task, cost).await {
                            Ok(_) => backlog.forget(&task.key),
                            Err(stop) => {
                                end = Some(stop);
                                break;
                            }
                        }
                        continue;
                    }
                };
            let deleted: Vec<String> = finished[..deletions]
                .iter()
                .map(|done| done.task.key.clone())
                .collect();
            let claimed = match self
                .claim_batch(leadership, batch, candidates, &mut finished, deletions)
                .await
            {
                Claim::Claimed(claimed) => {
                    for key in &deleted {
                        backlog.forget(key);
                    }
                    claimed
                }
                Claim::Relist => break,
                Claim::Moved(batch, keys, current) => {
                    match self
                        .reread(leadership, &mut backlog, memory, batch, &keys, current)
                        .await
                    {
                        Ok(()) => continue,
                        Err(stop) => {
                            end = Some(stop);
                            break;
                        }
                    }
                }
                Claim::LockDelayed(batch, refused) => {
                    // The coordinator refuses these keys for a while (Consul: another
                    // session's lock-delay): nothing was applied.
                    // They step aside for a while, and the tasks after them go first.
                    let (delayed, others): (Vec<_>, Vec<_>) = batch
                        .into_iter()
                        .enumerate()
                        .partition(|(n, _)| refused.contains(n));
                    let delayed: Vec<Task> = delayed.into_iter().map(|(_, task)| task).collect();
                    for task in &delayed {
                        tracing::info!(task_key = %task.key, retry_in = %crate::util::duration::format(LOCK_DELAY_RETRY), "task is under another session's lock-delay; claiming the next ones meanwhile");
                    }
                    backlog.put_back(others.into_iter().map(|(_, task)| task).collect());
                    let until = Utc::now()
                        + chrono::Duration::from_std(LOCK_DELAY_RETRY).unwrap_or_default();
                    for task in &delayed {
                        memory.deferred.insert(task.key.clone(), until);
                    }
                    backlog.defer(delayed, until);
                    continue;
                }
                Claim::End(stop) => {
                    end = Some(stop);
                    break;
                }
                Claim::TooLarge(mut batch, why) => {
                    if batch.len() > 1 || deletions > 0 || !single {
                        tracing::warn!(error = %why, "the coordinator refused a claim as too large; claiming one task at a time");
                        single = true;
                        if !finished.is_empty() {
                            finished = self
                                .complete_known(
                                    leadership,
                                    &mut backlog,
                                    std::mem::take(&mut finished),
                                )
                                .await;
                        }
                        backlog.put_back(batch);
                        continue;
                    }
                    let Some(task) = batch.pop() else { continue };
                    let reason =
                        format!("too large to claim: the coordinator refused its claim: {why}");
                    let pair = pair_of(&task, task.with(&[]), task.version);
                    match self.dead_letter(leadership, &pair, &reason).await {
                        Ok(_) => backlog.forget(&task.key),
                        Err(stop) => {
                            end = Some(stop);
                            break;
                        }
                    }
                    continue;
                }
            };
            let mut claimed = claimed.into_iter();
            while let Some((task, claim_index)) = claimed.next() {
                // "Renew between tasks": a batch claimed ahead still runs only while the lease
                // is fresh; what did not start (this task included) goes back untouched.
                if let Some(stop) = self.must_stop(lease, shutdown) {
                    let unstarted = std::iter::once((task, claim_index))
                        .chain(claimed.by_ref())
                        .collect();
                    self.release_unstarted(leadership, unstarted).await;
                    end = Some(stop);
                    break 'listing;
                }
                let key = task.task.key.clone();
                let finished_before = finished.len();
                let run = self
                    .run_claimed(
                        leadership,
                        lease,
                        shutdown,
                        task,
                        claim_index,
                        &mut finished,
                    )
                    .await;
                if finished.len() == finished_before {
                    // Not a success: a retry was written back or the task moved. The next
                    // look reads the key again, so the retry is known when due.
                    backlog.forget(&key);
                }
                fast = run.elapsed < FAST_HANDLER;
                // Past a slow run, finished tasks are recorded at once rather than at the
                // next claim, which keeps the window in which a crash makes them run again
                // short.
                if !fast && !finished.is_empty() {
                    finished = self
                        .complete_known(leadership, &mut backlog, std::mem::take(&mut finished))
                        .await;
                }
                let stop = run.end;
                if let Some(stop) = stop {
                    self.release_unstarted(leadership, claimed.collect()).await;
                    end = Some(stop);
                    break 'listing;
                }
                if !fast && claimed.len() > 0 {
                    // The batch was claimed on the promise of fast runs. A slow one sends the
                    // rest back unchanged, so that a batch of slow tasks never holds up an
                    // earlier task that arrives or falls due. Sent back, they have new
                    // versions the backlog does not know, and they come before every task
                    // still in it: list again, so they are claimed next, in order.
                    let rest: Vec<(Claimed, u64)> = claimed.by_ref().collect();
                    self.release_unstarted(leadership, rest).await;
                    break 'listing;
                }
            }
        }
        let unrecorded = self.complete_all(leadership, finished).await;
        (end, unrecorded)
    }

    /// Plans the next claim: prepares claims of up to `max_tasks` pending tasks while they
    /// fit one write, with as many of the `finished` completions as leave room; or, when
    /// the first task cannot be claimed even alone, takes that task out of the backlog.
    pub(super) fn plan_batch(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        finished: &[Finished],
        max_tasks: usize,
    ) -> Planned {
        let now = Utc::now();
        let completions: Vec<WriteCost> = finished.iter().map(|done| done.cost).collect();
        let guard = self.coord.guard_cost();
        let limits = self.coord.limits();
        // Claims are prepared one at a time and only while they fit: preparing one writes
        // the task's whole value, which is worth skipping for large values.
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut claims: Vec<WriteCost> = Vec::new();
        let mut plan = ClaimPlan::Take {
            finished: 0,
            tasks: 0,
        };
        for task in backlog.pending().take(max_tasks) {
            let candidate = Candidate::new(task, leadership, &self.node_id, now);
            claims.push(self.coord.cost(&candidate.op));
            let next = plan::plan_claim(guard, &completions, &claims, max_tasks, limits);
            match next {
                ClaimPlan::Take { tasks, .. } if tasks == claims.len() => {
                    candidates.push(candidate);
                    plan = next;
                }
                ClaimPlan::Take { .. } => break,
                ClaimPlan::TooLarge { .. } => {
                    plan = next;
                    break;
                }
            }
        }
        match plan {
            ClaimPlan::Take { finished, tasks } => Planned::Batch {
                tasks: backlog.take(tasks),
                candidates,
                deletions: finished,
            },
            ClaimPlan::TooLarge { cost } => match backlog.take_first() {
                Some(task) => Planned::TooLarge {
                    task: Box::new(task),
                    cost,
                },
                None => Planned::Batch {
                    tasks: Vec::new(),
                    candidates: Vec::new(),
                    deletions: 0,
                },
            },
        }
    }

    /// Claims `batch` (with its prepared `candidates`) in one write that also completes
    /// the first `deletions` finished tasks.
    pub(super) async fn claim_batch(
        &self,
        leadership: &Leadership,
        batch: Vec<Task>,
        candidates: Vec<Candidate>,
        finished: &mut Vec<Finished>,
        deletions: usize,
    ) -> Claim {
        let mut ops = Vec::with_capacity(deletions + batch.len());
        // Finished tasks are completed in this claim's write: one commit, not two. It is
        // applied only if the whole claim is.
        ops.extend(finished[..deletions].iter().map(Finished::completion));
        let mut values = Vec::with_capacity(candidates.len());
        for candidate in candidates {
            ops.push(candidate.op);
            values.push(candidate.value);
        }
        let (versions, fencing_token) = match self.write(leadership, &ops).await {
            Ok(Written::Done {
                versions,
                fencing_token,
            }) => (versions, fencing_token),
            // Nothing was applied; the finished tasks are completed on their own later.
            Ok(Written::NotLeader) => {
                return Claim::End(LeadEnd::StepDown("lost leadership at claim".into()))
            }
            Ok(Written::Conflict(keys)) => {
                self.metrics.claim_conflicts.inc();
                // Only claims of the batch conflicted: its other tasks and the rest of the
                // backlog are as read, and those tasks read again are enough.
                let own =
                    !keys.is_empty() && keys.iter().all(|key| batch.iter().any(|t| t.key == *key));
                if !own {
                    tracing::debug!(?keys, "claim conflict; listing again");
                    return Claim::Relist;
                }
                let current = match self.coord.get(&keys).await {
                    Ok(current) => current,
                    Err(err) => {
                        self.metrics.coordinator_error(&err);
                        tracing::warn!(error = %err, "cannot read tasks that moved; listing again");
                        return Claim::Relist;
                    }
                };
                let refused = refused_for_a_while(&batch, &keys, &current);
                if !refused.is_empty() && refused.len() == keys.len() {
                    return Claim::LockDelayed(batch, refused);
                }
                tracing::debug!(
                    ?keys,
                    "claim conflict; taking the moved tasks as read again"
                );
                return Claim::Moved(batch, keys, current);
            }
            Err(CoordError::Refused(why)) => return Claim::TooLarge(batch, why),
            Err(err) => {
                tracing::warn!(error = %err, "claim failed");
                return Claim::Relist;
            }
        };
        for done in finished.drain(..deletions) {
            self.log_completed(leadership, &done, fencing_token);
        }
        let mut claimed = Vec::with_capacity(batch.len());
        for (task, value) in batch.into_iter().zip(values) {
            let claim_index = versions
                .iter()
                .find(|(key, _)| *key == task.key)
                .map_or(0, |(_, version)| *version);
            let attempt = task.run_number();
            self.metrics.claimed(&task.task_type);
            tracing::info!(
                task_key = %task.key,
                task_id = %task.id,
                task_type = %task.task_type,
                attempt,
                fencing_token = leadership.fencing_token,
                "task claimed"
            );
            claimed.push((
                Claimed {
                    task: Box::new(task),
                    value,
                },
                claim_index,
            ));
        }
        Claim::Claimed(claimed)
    }

    /// After a claim conflicted on `keys` of `batch` only: puts the rest of the batch back
    /// and takes those keys as `current` read them, so that a task that moved takes its new
    /// place (or goes, if it was deleted) without listing the whole queue.
    pub(super) async fn reread(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        memory: &mut Memory,
        batch: Vec<Task>,
        keys: &[String],
        current: Vec<StoredTask>,
    ) -> Result<(), LeadEnd> {
        let (_, others): (Vec<Task>, Vec<Task>) =
            batch.into_iter().partition(|task| keys.contains(&task.key));
        backlog.put_back(others);
        for key in keys {
            backlog.forget(key);
        }
        let sorted = self
            .sort_out(leadership, current, memory, Utc::now())
            .await?;
        backlog.learn(
            sorted.keys.into_iter().collect(),
            sorted.pending,
            sorted.delayed,
        );
        Ok(())
    }

    /// After a restart that took this replica's lease up again (before it leads, if it
    /// ever does): every task that lease still holds was a run of the previous process,
    /// gone by now (the replica waits for its handlers at start). Each is put back as a
    /// failed attempt, as the leader would, so that no claim is left held by a live lease
    /// that runs nothing: the next leader starts nothing while one is.
    pub async fn release_previous(&self, lease: &crate::coord::LeaseId) {
        let listed = self
            .coord
            .list(
                &self.settings.prefix,
                crate::coord::Version::default(),
                Duration::ZERO,
            )
            .await;
        let tasks = match listed {
            Ok((tasks, _)) => tasks,
            Err(err) => {
                tracing::warn!(error = %err, "cannot look for tasks the previous process left claimed; the leader requeues them when this lease ends");
                return;
            }
        };
        let reason = "the replica restarted while running the task";
        for stored in tasks.iter().filter(|t| t.holder.as_ref() == Some(lease)) {
            let Ok(task) = Task::parse(stored) else {
                continue;
            };
            let value = task.retried(task.run_number(), reason, Utc::now());
            let op = [TaskOp::Release {
                key: task.key.clone(),
                version: task.version,
                value,
            }];
            match self.coord.write_own(lease, &op).await {
                Ok(Written::Done { .. }) => {
                    tracing::warn!(task_key = %task.key, reason, "task requeued")
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(task_key = %task.key, error = %err, "cannot put back a task the previous process left claimed; the leader requeues it when this lease ends")
                }
            }
        }
    }

    /// Releases claimed tasks whose handlers never started, restoring their value, so they
    /// go back to the queue without using an attempt. Only this lease's own claims are
    /// touched, so no leadership guard is needed; a batch that no longer applies whole
    /// (the lease ended, leaving orphans) is put back task by task.
    pub(super) async fn release_unstarted(
        &self,
        leadership: &Leadership,
        unstarted: Vec<(Claimed, u64)>,
    ) {
        if unstarted.is_empty() {
            return;
        }
        let ops: Vec<TaskOp> = unstarted
            .iter()
            .map(|(claimed, claim_index)| TaskOp::Release {
                key: claimed.task.key.clone(),
                version: *claim_index,
                value: claimed.task.with(&[]),
            })
            .collect();
        let costs: Vec<WriteCost> = ops.iter().map(|op| self.coord.cost(op)).collect();
        for range in plan::chunks(None, &costs, self.coord.limits()) {
            match self
                .coord
                .write_own(&leadership.lease, &ops[range.clone()])
                .await
            {
                Ok(Written::Done { .. }) => continue,
                Ok(_) => {}
                Err(err) => self.metrics.coordinator_error(&err),
            }
            for op in &ops[range] {
                let TaskOp::Release { key, value, .. } = op else {
                    continue;
                };
                let put_back = |version| {
                    vec![crate::coord::Edit::Replace {
                        key: key.clone(),
                        version,
                        value: value.clone(),
                    }]
                };
                let own = std::slice::from_ref(op);
                if let Err(why) = self
                    .write_own_or_orphan(&leadership.lease, own, put_back)
                    .await
                {
                    tracing::warn!(task_key = %key, error = %why, "cannot put back a task claimed but not started; the next leader requeues it");
                }
            }
        }
    }
}

/// Of a conflicted claim's `keys` (all of them tasks of `batch`), the tasks of `batch`
/// (indexes) that `current` shows still as read and held by no lease: nothing moved them,
/// the coordinator refuses them for a while (Consul: lock-delay). Empty unless every
/// conflicted key is such a task.
fn refused_for_a_while(batch: &[Task], keys: &[String], current: &[StoredTask]) -> Vec<usize> {
    let tried: Vec<usize> = keys
        .iter()
        .filter_map(|key| batch.iter().position(|task| task.key == *key))
        .collect();
    let still = plan::unmoved(batch, &tried, current);
    if still.len() == tried.len() {
        still
    } else {
        Vec::new()
    }
}
