//! What a listing holds, sorted out: which tasks can run now or later (a retry's backoff, a
//! producer's runAt), which are orphans to requeue or malformed ones (a runAt too far ahead
//! included) to dead-letter (`pick`, `sort_out`), and the quick look at the keys between
//! claims that catches newer or earlier tasks (`look`).

use tokio_util::task::AbortOnDropHandle;

use super::*;

impl Queue {
    /// Sorts a listing out and says what to do with it: work through its pending tasks,
    /// wait for the earliest retry, or list again. `listed_from` is when the listing began
    /// costing time.
    pub(super) async fn pick(
        &self,
        leadership: &Leadership,
        entries: Vec<StoredTask>,
        memory: &mut Memory,
        listed_from: Instant,
    ) -> Result<Pick, LeadEnd> {
        let now = Utc::now();
        memory.held_groups.clear();
        let sorted = self.sort_out(leadership, entries, memory, now).await?;
        let scheduled = plan::scheduled_count(&sorted.delayed);
        self.metrics.queue_depth(
            sorted.pending.len(),
            sorted.in_flight,
            sorted.delayed.len() - scheduled,
            scheduled,
        );
        if self.settings.concurrency <= 1 && (sorted.in_flight > 0 || sorted.fenced_until.is_some())
        {
            // One run at a time: a run of an earlier holder may still go on (its task held
            // by a live lease, or an orphan whose lease may have been revoked mid-run), so
            // nothing starts here until it is provably over. A held task's end changes the
            // queue, which ends the next listing's wait.
            if sorted.changed {
                return Ok(Pick::Again);
            }
            return Ok(match sorted.fenced_until {
                Some(at) => Pick::WaitUntil(
                    Utc::now()
                        + chrono::Duration::from_std(
                            at.saturating_duration_since(tokio::time::Instant::now()),
                        )
                        .unwrap_or_default(),
                ),
                None => Pick::Nothing,
            });
        }
        if !sorted.pending.is_empty() {
            let backlog = Backlog::new(
                sorted.pending,
                sorted.delayed,
                sorted.keys,
                Utc::now(),
                listed_from.elapsed(),
            );
            return Ok(Pick::Run(Box::new(backlog)));
        }
        if sorted.changed {
            return Ok(Pick::Again);
        }
        let fenced = sorted.fenced_until.map(|at| {
            Utc::now()
                + chrono::Duration::from_std(
                    at.saturating_duration_since(tokio::time::Instant::now()),
                )
                .unwrap_or_default()
        });
        Ok(plan::wake_at(&sorted.delayed, fenced).map_or(Pick::Nothing, Pick::WaitUntil))
    }

    /// Sorts entries of the queue out: dead-letters what cannot run, requeues orphans, and
    /// returns the pending and delayed tasks (a listing's, or new keys' a look read).
    pub(super) async fn sort_out(
        &self,
        leadership: &Leadership,
        entries: Vec<StoredTask>,
        memory: &mut Memory,
        now: DateTime<Utc>,
    ) -> Result<Sorted, LeadEnd> {
        let horizon = self.not_before_horizon();
        memory.deferred.retain(|_, until| *until > now);
        let mut sorted = Sorted::default();
        // Sized once: grown by doubling, a 100k listing's tasks would be copied at their
        // largest, and both copies held at once.
        sorted.pending.reserve(entries.len());
        sorted.keys.reserve(entries.len());
        for pair in entries {
            // A key that breaks the key rule could not be addressed safely (a `..` segment
            // resolves elsewhere in a URL): such a task is not run but dead-lettered.
            if let Err(invalid) = Key::within(&pair.key, &[&self.settings.prefix]) {
                if pair.holder.is_none() {
                    let reason = format!("the key is not a valid task key: {invalid}");
                    self.dead_letter(leadership, &pair, &reason).await?;
                    sorted.changed = true;
                }
                continue;
            }
            let task = match Task::parse_owned(pair) {
                Ok(task) => task,
                Err((invalid, pair)) => {
                    // A locked entry is someone's run in progress: left alone until it ends.
                    if pair.holder.is_none() {
                        sorted.changed = true;
                        if self
                            .dead_letter(leadership, &pair, &invalid.to_string())
                            .await?
                        {
                            continue;
                        }
                    }
                    sorted.keys.insert(pair.key);
                    continue;
                }
            };
            let deferred = memory.deferred.get(&task.key).copied();
            let status = plan::eligibility(&task, now, horizon, deferred);
            if let (Status::Scheduled(_), Err(invalid)) = (
                &status,
                task.check_run_at(now, self.settings.run_at_max_ahead),
            ) {
                // Scheduled further ahead than the queue allows: the producer's mistake,
                // said in a dead letter rather than kept out of sight for years.
                let pair = pair_of(&task, task.value().to_vec(), task.version);
                self.dead_letter(leadership, &pair, &invalid.to_string())
                    .await?;
                sorted.changed = true;
                continue;
            }
            match status {
                Status::Pending if self.registry.get(&task.task_type).is_none() => {
                    let reason = format!("no handler for taskType {:?}", task.task_type);
                    let pair = pair_of(&task, task.value().to_vec(), task.version);
                    self.dead_letter(leadership, &pair, &reason).await?;
                    sorted.changed = true;
                }
                Status::Pending => {
                    if let Status::Delayed(at) = task.status(now) {
                        if memory.warned.insert(format!("notBefore {}", task.key)) {
                            tracing::warn!(task_key = %task.key, not_before = %crate::task::rfc3339(at), "notBefore is further ahead than any backoff leaderq writes (a clock that jumped, or a crafted value); ignoring it");
                        }
                    }
                    sorted.keys.insert(task.key.clone());
                    sorted.pending.push(task);
                }
                Status::Delayed(at) | Status::Scheduled(at) => {
                    sorted.keys.insert(task.key.clone());
                    sorted.delayed.push((at, task));
                }
                Status::InFlight if task.holder.as_ref() == Some(&leadership.lease) => {
                    // Held by this very lease, yet nothing runs here: a run cut short by a
                    // restart that took the lease up again. Put it back as a failed attempt.
                    self.requeue(
                        leadership,
                        &task,
                        "the replica restarted while running the task",
                    )
                    .await?;
                    sorted.changed = true;
                }
                Status::InFlight => {
                    memory.held_groups.insert(task.group().to_string());
                    sorted.in_flight += 1;
                    sorted.keys.insert(task.key.clone());
                }
                Status::Orphan => {
                    let seen = *memory
                        .orphans_seen
                        .entry(task.key.clone())
                        .or_insert_with(tokio::time::Instant::now);
                    let free_at = seen + self.lease_rules.orphan_fence;
                    if tokio::time::Instant::now() < free_at {
                        // Its lease may have been revoked while its run went on: that run
                        // is provably over only once the earlier holder's own view of its
                        // lease has run out.
                        if memory.warned.insert(format!("fenced {}", task.key)) {
                            tracing::info!(task_key = %task.key, requeue_in = %crate::util::duration::format(free_at - tokio::time::Instant::now()), "the lease that claimed this task ended; requeueing it once that lease's runs are provably over");
                        }
                        memory.held_groups.insert(task.group().to_string());
                        sorted.fenced_until =
                            Some(sorted.fenced_until.map_or(free_at, |at| at.min(free_at)));
                        sorted.keys.insert(task.key.clone());
                        continue;
                    }
                    memory.orphans_seen.remove(&task.key);
                    self.requeue(leadership, &task, "the replica running the task died")
                        .await?;
                    sorted.changed = true;
                }
                Status::Foreign => {
                    if memory.warned.insert(format!("foreign {}", task.key)) {
                        tracing::warn!(task_key = %task.key, "task is marked taken by a program other than leaderq; leaving it alone");
                    }
                    sorted.keys.insert(task.key.clone());
                }
            }
        }
        sorted
            .pending
            .sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        Ok(sorted)
    }

    /// How far ahead a notBefore is believed: the longest backoff leaderq writes
    /// (backoff_max plus 20% jitter) plus NOT_BEFORE_SLACK.
    pub(super) fn not_before_horizon(&self) -> chrono::Duration {
        let max = self.settings.backoff_max;
        let longest = max.saturating_add(max / 5).saturating_add(NOT_BEFORE_SLACK);
        chrono::Duration::from_std(longest).unwrap_or(chrono::Duration::MAX)
    }

    /// Looks at the queue's keys: drops tasks whose keys went away, reads the new keys
    /// (tasks that arrived, retries written back, tasks released to a producer's newer
    /// version) and adds what they hold to the backlog.
    pub(super) async fn look(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        memory: &mut Memory,
    ) -> Result<Look, LeadEnd> {
        let reading = self.start_look(backlog);
        self.finish_reading(leadership, backlog, memory, reading)
            .await
    }

    /// Starts reading the queue's keys for a look, in the background: the leader goes on
    /// claiming meanwhile (on a large backlog the names take as long to read as several
    /// claims), and finishes the look once they are read. The backlog counts the look
    /// from now, so that it asks for no other look meanwhile.
    pub(super) fn start_look(&self, backlog: &mut Backlog) -> Reading {
        backlog.look_started(Utc::now());
        let coord = self.coord.clone();
        let prefix = self.settings.prefix.clone();
        self.read_in_background(async move {
            Read::Names(coord.keys(&prefix).await.map(|(keys, _)| keys))
        })
    }

    /// Starts listing the queue again, in the background, as `start_look` does: the
    /// listing is merged into the backlog once read (`finish_reading`), parsing only what
    /// is new or rewritten.
    pub(super) fn start_relist(&self, backlog: &mut Backlog) -> Reading {
        backlog.relist_started(Utc::now());
        let coord = self.coord.clone();
        let prefix = self.settings.prefix.clone();
        let wait = self.wait;
        self.read_in_background(async move {
            Read::Tasks(
                coord
                    .list(&prefix, Version::default(), wait)
                    .await
                    .map(|(entries, _)| entries),
            )
        })
    }

    fn read_in_background(
        &self,
        read: impl std::future::Future<Output = Read> + Send + 'static,
    ) -> Reading {
        let started = Instant::now();
        Reading {
            read: AbortOnDropHandle::new(tokio::spawn(async move {
                let read = read.await;
                (read, started.elapsed())
            })),
        }
    }

    /// Finishes a look or a listing read in the background.
    ///
    /// A look's names: tasks whose keys were gone then are dropped (unless learned again
    /// since), new keys are read and sorted out. Tasks the leader claimed or deleted
    /// meanwhile are not new: it knows their keys, or forgot them on purpose (then reading
    /// them again finds what they hold now, or nothing).
    ///
    /// A listing: merged as `Backlog::relisted` says, the new and rewritten entries sorted
    /// out.
    pub(super) async fn finish_reading(
        &self,
        leadership: &Leadership,
        backlog: &mut Backlog,
        memory: &mut Memory,
        reading: Reading,
    ) -> Result<Look, LeadEnd> {
        let (read, read_in) = match reading.read.await {
            Ok(read) => read,
            Err(err) => {
                tracing::warn!(error = %err, "the read of the queue did not end; listing again");
                return Ok(Look::Relist);
            }
        };
        let merging = Instant::now();
        // The entries to sort out, and for a listing the tasks it found in flight.
        let (entries, listed_in_flight) = match read {
            Read::Names(Ok(keys)) => {
                let new = match backlog.looked(keys, Utc::now(), read_in) {
                    Looked::Relist => return Ok(Look::Relist),
                    Looked::New(new) => new,
                };
                if new.is_empty() {
                    backlog.look_took(read_in + merging.elapsed());
                    return Ok(Look::Continue);
                }
                // A key that went away meanwhile is simply not among them.
                match self.coord.get(&new).await {
                    Ok(entries) => (entries, None),
                    Err(err) => {
                        self.metrics.coordinator_error(&err);
                        tracing::warn!(error = %err, "cannot read new tasks; listing again");
                        return Ok(Look::Relist);
                    }
                }
            }
            Read::Tasks(Ok(entries)) => {
                let in_flight = entries.iter().filter(|e| e.holder.is_some()).count();
                let changed = backlog.relisted(&leadership.lease, entries, Utc::now(), read_in);
                (changed, Some(in_flight))
            }
            Read::Names(Err(err)) | Read::Tasks(Err(err)) => {
                self.metrics.coordinator_error(&err);
                tracing::warn!(error = %err, "cannot read the queue; listing again");
                return Ok(Look::Relist);
            }
        };
        let sorted = self
            .sort_out(leadership, entries, memory, Utc::now())
            .await?;
        backlog.learn(
            sorted.keys.into_iter().collect(),
            sorted.pending,
            sorted.delayed,
        );
        match listed_in_flight {
            Some(in_flight) => {
                let (pending, delayed, scheduled) = backlog.depth();
                self.metrics
                    .queue_depth(pending, in_flight, delayed, scheduled);
            }
            None => backlog.look_took(read_in + merging.elapsed()),
        }
        Ok(Look::Continue)
    }
}

/// What a read in the background brings.
enum Read {
    Names(Result<Vec<String>, CoordError>),
    Tasks(Result<Vec<StoredTask>, CoordError>),
}

/// A look's names or a listing being read in the background (`Queue::start_look`,
/// `start_relist`); dropped, the read is abandoned.
pub(super) struct Reading {
    read: AbortOnDropHandle<(Read, Duration)>,
}

impl Reading {
    /// Whether the read is over (done or failed): finishing it waits no more.
    pub(super) fn is_ready(&self) -> bool {
        self.read.is_finished()
    }
}
