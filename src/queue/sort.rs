//! What a listing holds, sorted out: each entry is what `entry.rs` says it is (pending,
//! waiting, held, an orphan to fence or requeue, something to dead-letter), and this file
//! performs that (`pick`, `sort_out`); plus the look at the keys, and the listing again,
//! read beside the claims and merged into the backlog (`look`, `start_look`,
//! `start_relist`, `finish_reading`). It also owns what the leader remembers across
//! listings ([`Memory`]).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::backlog::{self, Backlog, Held, Keys, Looked, Pending, Relisted};
use super::entry::{classify, Entry, EntryRules, Remembered, UnansweredClaim};
use super::pending::PendingSet;
use super::{LeadEnd, Queue};
use crate::coord::{CoordError, Leadership, Names, StoredTask, Version};
use crate::task::Task;

/// The most bytes of pending tasks' values a listing's intake holds: a task past them is
/// held without its value, read again before it is claimed (`Backlog::unfilled_front`).
/// A backlog whose values fit is claimed from what was listed, as ever.
pub(crate) const VALUES_HELD: usize = 4 << 20;

/// Added to the longest backoff (backoff_max + 20% jitter) before a notBefore is
/// disbelieved: the clocks of replicas differ a little.
const NOT_BEFORE_SLACK: Duration = Duration::from_secs(1);

/// What the leader remembers across listings while it leads.
#[derive(Default)]
pub(super) struct Memory {
    /// Warnings given once per key ("foreign …", "notBefore …").
    pub(super) warned: HashSet<String>,
    /// Keys whose claims are refused for a while (`Written::Deferred`), and when to try them again.
    pub(super) deferred: HashMap<String, DateTime<Utc>>,
    /// Groups (`taskGroup`) of tasks the last listing found held by another lease: a run
    /// of a previous leader may still be going, so with concurrency groups none of their
    /// tasks starts before a listing shows them free.
    pub(super) held_groups: HashSet<String>,
    /// How many tasks of each type the last listing found held by another lease: they
    /// count against their type's cap (`[handlers.T] concurrency`) until they end.
    pub(super) held_kinds: HashMap<String, usize>,
    /// Task types paused on their own (`leaderq pause --type T`), as read at the last
    /// listing: their tasks are neither claimed nor held in the backlog.
    pub(super) paused_types: HashSet<String>,
    /// When the paused types were last read (they are read at most every second).
    pub(super) types_read: Option<tokio::time::Instant>,
    /// How many tasks of paused types the last listing set aside: while there are some, an
    /// idle leader also wakes when the paused types change.
    pub(super) set_aside: usize,
    /// Orphans and when this term first saw each: requeued once `orphan_fence` has passed.
    pub(super) orphans_seen: HashMap<String, DateTime<Utc>>,
    /// Claims this term sent without an answer, by key, until an entry of that key is
    /// sorted out (the first read after the write shows whether it was applied).
    pub(super) unanswered: HashMap<String, UnansweredClaim>,
}

/// Entries sorted out: what can be claimed now or later, and the keys left as they were.
#[derive(Default)]
pub(super) struct Sorted {
    /// In claim order once the intake is finished.
    pub(super) pending: PendingSet,
    /// Tasks not eligible before a time.
    pub(super) delayed: Vec<(DateTime<Utc>, Task)>,
    /// Keys of the entries left in place unchanged; those moved or rewritten are not here,
    /// so the next look reads them again.
    pub(super) keys: Keys,
    in_flight: usize,
    /// When the earliest orphan still fenced may be requeued, if one is.
    fenced_until: Option<DateTime<Utc>>,
    /// Something was moved or rewritten.
    changed: bool,
    /// Tasks set aside because their type is paused.
    paused: usize,
    /// A task of an unanswered claim was put back: its place in the order is among the
    /// pending, so the queue is listed again before any of them runs.
    put_back: bool,
    /// The bytes of the pending tasks' values held, and the most held (`VALUES_HELD` for
    /// a listing; no limit for the tasks of new keys, a few hundred at most).
    values_held: usize,
    values_budget: usize,
}

impl Sorted {
    /// Places an entry that needs no write: pending, waiting, held (and the groups it
    /// keeps busy), fenced, foreign or unreadable. Answers the entries that need a write
    /// (`Queue::act_on`).
    fn place(&mut self, entry: Entry, memory: &mut Memory, now: DateTime<Utc>) -> Option<Entry> {
        match entry {
            // A paused type's task is known, and set aside: listed again once resumed.
            Entry::Pending { task, .. } | Entry::Waiting { task, .. }
                if memory.paused_types.contains(&task.task_type) =>
            {
                self.paused += 1;
                self.keys.insert(task.key.as_str().into());
            }
            Entry::Pending {
                task,
                ignored_not_before,
            } => {
                if let Some(at) = ignored_not_before {
                    if memory.warned.insert(format!("notBefore {}", task.key)) {
                        tracing::warn!(task_key = %task.key, not_before = %crate::task::rfc3339(at), "notBefore is further ahead than any backoff leaderq writes (a clock that jumped, or a crafted value); ignoring it");
                    }
                }
                // Its key is known as a pending task's. Its value is held while the values
                // held are under VALUES_HELD; then read again before it is claimed.
                let mut task = Pending::from(task);
                let keep = self.values_held + task.value_len() <= self.values_budget;
                self.values_held += if keep { task.value_len() } else { 0 };
                self.pending.push_line(task.incoming(keep));
            }
            Entry::Waiting { at, task } => {
                self.keys.insert(task.key.as_str().into());
                self.delayed.push((at, task));
            }
            Entry::Held { task } => {
                memory.held_groups.insert(task.group().to_string());
                *memory.held_kinds.entry(task.task_type.clone()).or_default() += 1;
                self.in_flight += 1;
                self.keys.insert(task.key.as_str().into());
            }
            Entry::Fenced { task, seen, until } => {
                memory.orphans_seen.entry(task.key.clone()).or_insert(seen);
                if memory.warned.insert(format!("fenced {}", task.key)) {
                    let left = (until - now).to_std().unwrap_or_default();
                    tracing::info!(task_key = %task.key, requeue_in = %crate::util::duration::format(left), "the lease that claimed this task ended; requeueing it once that lease's runs are provably over");
                }
                memory.held_groups.insert(task.group().to_string());
                *memory.held_kinds.entry(task.task_type.clone()).or_default() += 1;
                self.fenced_until = Some(self.fenced_until.map_or(until, |at| at.min(until)));
                self.keys.insert(task.key.as_str().into());
            }
            Entry::Foreign { task } => {
                if memory.warned.insert(format!("foreign {}", task.key)) {
                    tracing::warn!(task_key = %task.key, "task is marked taken by a program other than leaderq; leaving it alone");
                }
                self.keys.insert(task.key.as_str().into());
            }
            Entry::HeldUnreadable { key } => {
                self.keys.insert(key.into());
            }
            Entry::HeldUnaddressable => {}
            needs_a_write => return Some(needs_a_write),
        }
        None
    }
}

/// What to do with a listing.
pub(super) enum Pick {
    /// Pending tasks to work through.
    Run(Box<Backlog>),
    WaitUntil(DateTime<Utc>),
    /// Something was moved; list again at once.
    Again,
    Nothing,
}

/// The result of a look at the keys.
pub(super) enum Look {
    Continue,
    Relist,
}

impl Queue {
    /// Sorts a listing out and says what to do with it: work through its pending tasks,
    /// wait for the earliest retry, or list again. `listed_from` is when the listing began
    /// costing time.
    pub(super) async fn pick(
        &self,
        sorted: Sorted,
        memory: &mut Memory,
        listed_from: Instant,
    ) -> Result<Pick, LeadEnd> {
        let clock = self.clock();
        memory.set_aside = sorted.paused;
        let scheduled = backlog::scheduled_count(&sorted.delayed);
        self.metrics.queue_depth(
            self.sharding.shard.map(|shard| shard.index),
            [
                sorted.pending.len(),
                sorted.in_flight,
                sorted.delayed.len() - scheduled,
                scheduled,
            ],
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
            return Ok(sorted.fenced_until.map_or(Pick::Nothing, Pick::WaitUntil));
        }
        if !sorted.pending.is_empty() && !sorted.put_back {
            let backlog = Backlog::from_set(
                sorted.pending,
                sorted.delayed,
                sorted.keys,
                clock.now(),
                clock.since(listed_from),
            );
            return Ok(Pick::Run(Box::new(backlog)));
        }
        if sorted.changed {
            return Ok(Pick::Again);
        }
        Ok(backlog::wake_at(&sorted.delayed, sorted.fenced_until)
            .map_or(Pick::Nothing, Pick::WaitUntil))
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
        let mut intake = self.intake(leadership, memory, Some(now));
        entries.into_iter().for_each(|entry| intake.take(entry));
        intake.finish().await
    }

    /// An intake of entries to sort out as they arrive, at `now`; `None`: a listing's,
    /// sorted out at its first entry's arrival, whose pending tasks past VALUES_HELD are
    /// held without their values.
    pub(super) fn intake<'a>(
        &'a self,
        leadership: &'a Leadership,
        memory: &'a mut Memory,
        now: Option<DateTime<Utc>>,
    ) -> Intake<'a> {
        Intake {
            queue: self,
            leadership,
            rules: EntryRules {
                prefix: &self.settings.prefix,
                horizon: self.not_before_horizon(),
                run_at_max_ahead: self.settings.run_at_max_ahead,
                orphan_fence: self.lease_rules.orphan_fence,
                own: &leadership.lease,
            },
            // A task giving no `taskPriority` takes its type's, if types have their own.
            by_type: self.registry.has_priorities(),
            memory,
            now,
            begun: false,
            sorted: Sorted {
                pending: PendingSet::under(&self.settings.prefix),
                values_budget: if now.is_none() {
                    VALUES_HELD
                } else {
                    usize::MAX
                },
                ..Sorted::default()
            },
            actions: Vec::new(),
            answered: Vec::new(),
        }
    }

    /// Performs what an entry needs written (`Sorted::place` leaves these): a dead letter,
    /// a requeue, or a claim whose answer was lost put back.
    async fn act_on(
        &self,
        leadership: &Leadership,
        entry: Entry,
        memory: &mut Memory,
        sorted: &mut Sorted,
    ) -> Result<(), LeadEnd> {
        sorted.changed = true;
        match entry {
            Entry::DeadLetter {
                entry,
                reason,
                known_if_kept,
            } => {
                let moved = self.dead_letter(leadership, &entry, &reason).await?;
                if known_if_kept && !moved {
                    sorted.keys.insert(entry.key.into());
                }
            }
            Entry::Requeue { task, reason } => {
                memory.orphans_seen.remove(&task.key);
                self.requeue(leadership, &task, reason).await?;
            }
            Entry::Unanswered { task, value } => {
                self.put_back_unanswered(leadership, &task, value).await?;
                sorted.put_back = true;
            }
            _ => {}
        }
        Ok(())
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
        backlog.look_started(self.clock().now());
        let coord = self.coord.clone();
        let prefix = self.settings.prefix.clone();
        self.read_in_background(async move {
            Read::Names(coord.keys(&prefix).await.map(|(keys, _)| keys))
        })
    }

    /// Starts listing the queue again, in the background, as `start_look` does: the
    /// listing is merged into the backlog once read (`finish_reading`), parsing only what
    /// is new or rewritten.
    pub(super) fn start_relist(&self, leadership: &Leadership, backlog: &mut Backlog) -> Reading {
        backlog.relist_started(self.clock().now());
        let coord = self.coord.clone();
        let prefix = self.settings.prefix.clone();
        let wait = self.wait;
        let own = leadership.lease.clone();
        self.read_in_background(async move {
            // Each entry's key, version and holder only: the listing of a large backlog is
            // not held with its values; those it finds new or rewritten are read again.
            let mut listed = Vec::new();
            let mut each = |entry: StoredTask| listed.push(Relisted::of(entry, &own));
            let read = coord
                .list_each(&prefix, Version::default(), wait, &mut each)
                .await;
            Read::Listing(read.map(|_| listed))
        })
    }

    fn read_in_background(
        &self,
        read: impl std::future::Future<Output = Read> + Send + 'static,
    ) -> Reading {
        let clock = self.clock();
        let started = clock.instant();
        Reading {
            read: AbortOnDropHandle::new(tokio::spawn(async move {
                let read = read.await;
                (read, clock.since(started))
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
        let clock = self.clock();
        let merging = clock.instant();
        // The entries to sort out, and for a listing the tasks it found in flight.
        let (entries, listed_in_flight) = match read {
            Read::Names(Ok(keys)) => {
                let new = match backlog.looked(keys, clock.now(), read_in) {
                    Looked::Relist => return Ok(Look::Relist),
                    Looked::New(new) => new,
                };
                if new.is_empty() {
                    backlog.look_took(read_in + clock.since(merging));
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
            Read::Listing(Ok(listed)) => {
                let in_flight = listed.iter().filter(|e| e.held != Held::Free).count();
                let changed = backlog.relisted(listed, clock.now(), read_in);
                if changed.is_empty() {
                    (Vec::new(), Some(in_flight))
                } else {
                    match self.coord.get(&changed).await {
                        Ok(entries) => (entries, Some(in_flight)),
                        Err(err) => {
                            self.metrics.coordinator_error(&err);
                            tracing::warn!(error = %err, "cannot read new tasks; listing again");
                            return Ok(Look::Relist);
                        }
                    }
                }
            }
            Read::Names(Err(err)) | Read::Listing(Err(err)) => {
                self.metrics.coordinator_error(&err);
                tracing::warn!(error = %err, "cannot read the queue; listing again");
                return Ok(Look::Relist);
            }
        };
        let sorted = self
            .sort_out(leadership, entries, memory, clock.now())
            .await?;
        backlog.learn(sorted.keys, sorted.pending.into_pending(), sorted.delayed);
        match listed_in_flight {
            Some(in_flight) => {
                let (pending, delayed, scheduled) = backlog.depth();
                let shard = self.sharding.shard.map(|shard| shard.index);
                self.metrics
                    .queue_depth(shard, [pending, in_flight, delayed, scheduled]);
            }
            None => backlog.look_took(read_in + clock.since(merging)),
        }
        Ok(Look::Continue)
    }
}

/// Entries sorted out as they arrive (`Queue::intake`): each is classified and placed at
/// once, its pending task held compactly, so that a listing is never held whole (its
/// entries arrive as the backend reads them: `Tasks::list_each`); what needs a write is kept
/// for [`Intake::finish`], as are the claims whose answer was lost and whose entry came: if
/// the listing fails half-way, the leader still remembers them.
pub(super) struct Intake<'a> {
    queue: &'a Queue,
    leadership: &'a Leadership,
    rules: EntryRules<'a>,
    by_type: bool,
    memory: &'a mut Memory,
    now: Option<DateTime<Utc>>,
    begun: bool,
    sorted: Sorted,
    actions: Vec<Entry>,
    answered: Vec<String>,
}

impl Intake<'_> {
    /// Sorts out one entry.
    pub(super) fn take(&mut self, entry: StoredTask) {
        let now = *self.now.get_or_insert_with(|| self.queue.clock().now());
        if !self.begun {
            self.begun = true;
            self.memory.deferred.retain(|_, until| *until > now);
        }
        // Almost always empty: a probe would hash every key of a 100k listing for nothing.
        let unanswered = if self.memory.unanswered.is_empty() {
            None
        } else {
            self.memory.unanswered.get(&entry.key).cloned()
        };
        if unanswered.is_some() {
            self.answered.push(entry.key.clone());
        }
        let remembered = Remembered {
            deferred: &self.memory.deferred,
            orphans_seen: &self.memory.orphans_seen,
            unanswered: unanswered.as_ref(),
        };
        let registry = &self.queue.registry;
        let has_handler = |task_type: &str| registry.get(task_type).is_some();
        let mut entry = classify(entry, &self.rules, remembered, has_handler, now);
        // Another shard's task is known, so that no look reads it again, and its run counts
        // against its type's cap; nothing else: its shard's leader claims, settles and
        // dead-letters it.
        if let Some(shard) = self.queue.sharding.shard {
            if let Some((key, group)) = shard_name(&entry) {
                if !shard.owns(key, group) {
                    if let Entry::Held { task } | Entry::Fenced { task, .. } = &entry {
                        *self
                            .memory
                            .held_kinds
                            .entry(task.task_type.clone())
                            .or_default() += 1;
                    }
                    self.sorted.keys.insert(key.into());
                    return;
                }
            }
        }
        if let Entry::Pending { task, .. } | Entry::Waiting { task, .. } = &mut entry {
            if task.priority.is_none() && self.by_type {
                task.priority = registry.policy(&task.task_type).priority;
            }
        }
        if let Some(entry) = self.sorted.place(entry, self.memory, now) {
            self.actions.push(entry);
        }
    }

    /// Performs the writes the entries need (`Queue::act_on`), forgets the lost claims
    /// whose entries came, and answers what was sorted out, its pending tasks in claim
    /// order.
    pub(super) async fn finish(self) -> Result<Sorted, LeadEnd> {
        let Intake {
            queue,
            leadership,
            memory,
            mut sorted,
            actions,
            answered,
            ..
        } = self;
        for key in answered {
            memory.unanswered.remove(&key);
        }
        for entry in actions {
            queue.act_on(leadership, entry, memory, &mut sorted).await?;
        }
        sorted.pending.finish_line();
        Ok(sorted)
    }
}

/// What decides the entry's shard (`task/shard.rs`): its key and its group (empty:
/// none; a value that is not a task has none). `None`: an entry with no usable key.
fn shard_name(entry: &Entry) -> Option<(&str, &str)> {
    match entry {
        Entry::Pending { task, .. }
        | Entry::Waiting { task, .. }
        | Entry::Held { task }
        | Entry::Fenced { task, .. }
        | Entry::Requeue { task, .. }
        | Entry::Unanswered { task, .. }
        | Entry::Foreign { task } => Some((&task.key, task.group())),
        Entry::DeadLetter { entry, .. } => Some((&entry.key, "")),
        Entry::HeldUnreadable { key } => Some((key, "")),
        Entry::HeldUnaddressable => None,
    }
}

/// What a read in the background brings.
pub(super) enum Read {
    Names(Result<Names, CoordError>),
    Listing(Result<Vec<Relisted>, CoordError>),
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
