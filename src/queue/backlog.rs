//! The leader's picture of the queue between two listings (pure: no I/O, no clock; `now`
//! comes in): pending tasks in claim order, tasks waiting for a time (a retry's
//! notBefore, a producer's runAt, a deferral's end), and every key it knows of; what it
//! does next between claims ([`Backlog::next`]: claim, look at the keys, list again, or
//! stop); how a look or a listing read while claiming merges into it; and when an idle
//! leader wakes by itself ([`wake_at`]). `sort.rs`, `driver.rs` and `claim.rs`
//! perform the I/O it asks for.
//!
//! Size: over half of it is the scripted-time tests of these decisions.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::cmp::Reverse;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::pending::{Incoming, Order, Out, PendingSet, Popped};
use crate::coord::{Names, StoredTask, TaskVersion};
use crate::task::Task;

/// Least time between two looks at the queue's keys while the leader works through a
/// backlog: a task that arrives meanwhile waits at most this long plus the batch in progress.
pub const LOOK_INTERVAL: Duration = Duration::from_millis(20);
/// A look costs time in proportion to the number of keys; looks are spaced at least this
/// many times the last one's duration, so that on a huge backlog they take at most a tenth
/// of the leader's time.
pub const LOOK_COST_FACTOR: u32 = 10;
/// A look that took less than this is made before the next claim; a costlier one is read
/// while the leader claims (a cheap look in line keeps the wait of a task that arrives
/// during a backlog at its shortest; a costly one would hold every claim up).
pub const LOOK_IN_LINE: Duration = Duration::from_millis(5);
/// Tasks claimed from one listing before listing again, at least. New keys and due retries
/// are seen by the looks; only a pending task that a producer rewrote in place with an
/// earlier taskTime (its key is not new) waits for the next listing.
pub const MAX_TASKS_PER_LISTING: usize = 256;
/// On a large backlog the leader lists again only after claiming this fraction of the
/// tasks the listing held (1/2): each listing reads what is left, so the listings of a
/// whole drain read about twice the backlog, and a task costs the same to drain whatever
/// the backlog (relisting every MAX_TASKS_PER_LISTING claims read the backlog again and
/// again: O(N²) for a drain of N). A listing is read while the backlog is held, so its
/// size sets the leader's peak memory: after half of the backlog it is half as large.
pub const RELIST_FRACTION: usize = 2;
/// A listing costs time in proportion to the queue's bytes (a backlog of large values is
/// tens of MB); the leader lists again no sooner than this many times the last listing's
/// duration, so that listing again takes at most a tenth of its time.
pub const LIST_COST_FACTOR: u32 = 10;
/// More new keys than this at one look: list the queue again rather than read them.
pub const MAX_FETCH: usize = 256;

/// When a leader with nothing to claim wakes by itself: at the earliest time a waiting task
/// (a retry's notBefore, a producer's runAt, a deferral's end) falls due, or an orphan's
/// fence ends. Between now and then it only waits for the queue to change.
pub fn wake_at(
    waiting: &[(DateTime<Utc>, Task)],
    fenced: Option<DateTime<Utc>>,
) -> Option<DateTime<Utc>> {
    waiting.iter().map(|(at, _)| *at).chain(fenced).min()
}

/// How many of `waiting` wait for their producer's runAt.
pub fn scheduled_count(waiting: &[(DateTime<Utc>, Task)]) -> usize {
    waiting
        .iter()
        .filter(|(at, task)| task.waits_for_run_at(*at))
        .count()
}

/// Whether `then` is at least `age` before `now`, or after it (the wall clock went back).
fn older_than(now: DateTime<Utc>, then: DateTime<Utc>, age: Duration) -> bool {
    now.signed_duration_since(then)
        .to_std()
        .map_or(true, |since| since >= age)
}

/// What the leader does next while working through a listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Claim from the front of the pending tasks.
    Claim,
    /// Look at the queue's keys for tasks that arrived or went away.
    Look,
    /// List the whole queue again.
    Relist,
    /// Nothing is pending: back to the blocking listing.
    Done,
}

/// What a look at the keys found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Looked {
    /// These keys are new (possibly none): read them and `learn` them.
    New(Vec<String>),
    /// Too many new keys to read one by one: list again.
    Relist,
}

/// The hash of the backlog's key sets: seeded per process, and several times faster than
/// std's SipHash on keys of queue names (the sets hold every task of the backlog).
pub type KeyHash = foldhash::fast::RandomState;
/// A set of task keys. A key is held once, shared by the sets and the pending tasks.
pub type Keys = HashSet<Arc<str>, KeyHash>;

/// A pending task as the backlog takes it in: its place in claim order (its priority as
/// resolved when it was sorted out: its own `taskPriority`, else its type's) and what a
/// claim needs besides (the version, the value as read, the group). The backlog holds it
/// compactly (`pending.rs`), and parses it again from its value when it is looked at or
/// taken (a value that parsed once parses the same again).
#[derive(Debug)]
pub struct Pending {
    key: Arc<str>,
    kind: Box<str>,
    priority: i32,
    time: DateTime<Utc>,
    created: u64,
    version: TaskVersion,
    value: Box<[u8]>,
    group: Box<str>,
}

impl Pending {
    /// The size of its value.
    pub(super) fn value_len(&self) -> usize {
        self.value.len()
    }

    /// The task as the pending set takes it, without its value unless `keep_value` (it is
    /// then read again before it is claimed).
    pub(super) fn incoming(&mut self, keep_value: bool) -> Incoming<'_> {
        Incoming {
            key: &self.key,
            order: Order {
                priority: Reverse(self.priority),
                time: self.time,
                created: self.created,
            },
            version: self.version,
            value: keep_value.then(|| std::mem::take(&mut self.value)),
            kind: &self.kind,
            group: &self.group,
        }
    }
}

impl From<Popped> for Pending {
    fn from(popped: Popped) -> Pending {
        Pending {
            key: Arc::from(popped.key.as_str()),
            kind: popped.kind.into_boxed_str(),
            priority: popped.order.priority.0,
            time: popped.order.time,
            created: popped.order.created,
            version: popped.version,
            value: popped.value.expect("a pending task's value is held"),
            group: popped.group.into_boxed_str(),
        }
    }
}

impl From<Task> for Pending {
    fn from(mut task: Task) -> Pending {
        let key = Arc::from(task.key.as_str());
        let kind = std::mem::take(&mut task.task_type).into_boxed_str();
        let (time, created, version) = (task.time, task.created, task.version);
        let priority = task.priority.unwrap_or(0);
        let (value, group) = task.into_value_and_group();
        Pending {
            key,
            kind,
            priority,
            time,
            created,
            version,
            value,
            group,
        }
    }
}

/// The task of `key` at `order` with `value`, parsed again as it was when listed.
fn task_of(key: &str, order: Order, version: TaskVersion, value: Vec<u8>) -> Task {
    let pair = StoredTask {
        key: key.to_string(),
        value,
        version,
        created: order.created,
        holder: None,
    };
    match Task::parse_owned(pair) {
        Ok(mut task) => {
            task.priority = Some(order.priority.0);
            task
        }
        Err((invalid, _)) => unreachable!("a pending task's value parsed when listed: {invalid}"),
    }
}

/// A pending task read out of the set, parsed again.
fn task_out(out: Out<'_>) -> Task {
    let value = out.value.expect("a pending task's value is held").to_vec();
    task_of(&out.key, out.order, out.version, value)
}

/// A pending task taken out of the set, parsed again.
fn task_popped(popped: Popped) -> Task {
    let value = popped.value.expect("a pending task's value is held");
    task_of(&popped.key, popped.order, popped.version, value.into_vec())
}

/// An entry of a listing read beside the claims, without its value: its key, version and
/// who holds it.
#[derive(Debug)]
pub struct Relisted {
    pub key: Box<str>,
    pub version: crate::coord::TaskVersion,
    pub held: Held,
}

/// Who holds a relisted entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    Free,
    /// The leader's own lease: one of its runs, or one that ended during the read.
    Own,
    Other,
}

impl Relisted {
    pub fn of(entry: StoredTask, own: &crate::coord::LeaseId) -> Relisted {
        let held = match &entry.holder {
            None => Held::Free,
            Some(holder) if holder == own => Held::Own,
            Some(_) => Held::Other,
        };
        Relisted {
            key: entry.key.into_boxed_str(),
            version: entry.version,
            held,
        }
    }
}

/// The leader's picture of the queue between two listings: pending tasks in claim order,
/// tasks waiting for their backoff, and every key it knows of. Finding, adding or dropping
/// one task costs O(log N) at most, not O(N): a drain touches every task of the backlog
/// several times.
#[derive(Debug)]
pub struct Backlog {
    pending: PendingSet,
    /// Tasks not eligible before a time: a retry's notBefore, a producer's runAt, or a key
    /// refused for a while by the coordinator.
    delayed: Vec<(DateTime<Utc>, Task)>,
    /// The earliest time in `delayed` (or one before it): until then, nothing is due and
    /// `next` does not look through them, however many wait.
    due_from: Option<DateTime<Utc>>,
    /// The keys known besides the pending tasks' (in flight, foreign, delayed, set aside):
    /// a key is in `pending` or here, never both.
    known: Keys,
    listed_at: DateTime<Utc>,
    list_cost: Duration,
    last_look: DateTime<Utc>,
    look_cost: Duration,
    claimed: usize,
    /// Pending tasks the listing held: claims before listing again scale with it.
    listed: usize,
    /// While a look's names are being read: the keys forgotten since it began (deleted,
    /// or to be read again). They may be among the names, yet are not new to that look.
    forgotten: Option<Keys>,
}

impl Backlog {
    /// The picture a listing at `now` gave, which took `list_cost`: `known` holds the keys
    /// listed that are not pending (in flight, foreign and delayed ones included).
    #[cfg(test)]
    pub fn new(
        pending: Vec<impl Into<Pending>>,
        delayed: Vec<(DateTime<Utc>, Task)>,
        known: Keys,
        now: DateTime<Utc>,
        list_cost: Duration,
    ) -> Backlog {
        let mut set = PendingSet::default();
        for task in pending {
            let mut task: Pending = task.into();
            set.push_line(task.incoming(true));
        }
        set.finish_line();
        Backlog::from_set(set, delayed, known, now, list_cost)
    }

    /// The same from the pending tasks a listing's intake sorted (`sort.rs`).
    pub fn from_set(
        set: PendingSet,
        delayed: Vec<(DateTime<Utc>, Task)>,
        known: Keys,
        now: DateTime<Utc>,
        list_cost: Duration,
    ) -> Backlog {
        let listed = set.len();
        let mut known = known;
        known.retain(|key| !set.contains(key));
        let mut backlog = Backlog {
            pending: set,
            delayed: Vec::new(),
            due_from: None,
            known,
            listed_at: now,
            list_cost,
            last_look: now,
            look_cost: Duration::ZERO,
            claimed: 0,
            listed,
            forgotten: None,
        };
        backlog.learn(Keys::default(), Vec::<Pending>::new(), delayed);
        backlog
    }

    /// Whether `key` is known: pending, or among the other keys known.
    fn is_known(&self, key: &str) -> bool {
        self.pending.contains(key) || self.known.contains(key)
    }

    /// How many keys are known.
    fn known_count(&self) -> usize {
        self.pending.len() + self.known.len()
    }

    /// Decides the next step: move retries that are due now among the pending ones; done
    /// when nothing is pending; list again after MAX_TASKS_PER_LISTING claims, or a
    /// RELIST_FRACTION of the tasks listed if more, once the listing is ten times its cost
    /// old; look at the keys when the last look is LOOK_INTERVAL (or ten times its cost)
    /// old; otherwise claim. A clock that went back counts as old enough.
    pub fn next(&mut self, now: DateTime<Utc>) -> Next {
        self.promote(now);
        if self.pending.is_empty() {
            return Next::Done;
        }
        // A look or a listing is being read: it is finished first.
        if self.forgotten.is_some() {
            return Next::Claim;
        }
        if self.claimed >= MAX_TASKS_PER_LISTING.max(self.listed / RELIST_FRACTION)
            && older_than(now, self.listed_at, self.list_cost * LIST_COST_FACTOR)
        {
            return Next::Relist;
        }
        let spacing = LOOK_INTERVAL.max(self.look_cost * LOOK_COST_FACTOR);
        if older_than(now, self.last_look, spacing) {
            Next::Look
        } else {
            Next::Claim
        }
    }

    /// Records that a listing began at `now`, read while the leader claims: no other
    /// look or listing is asked for until it is merged (`relisted`).
    pub fn relist_started(&mut self, now: DateTime<Utc>) {
        self.look_started(now);
        self.listed_at = now;
    }

    /// How many tasks are pending, how many wait for a retry's time (or a deferral), and
    /// how many for their producer's runAt.
    pub fn depth(&self) -> (usize, usize, usize) {
        let scheduled = scheduled_count(&self.delayed);
        (
            self.pending.len(),
            self.delayed.len() - scheduled,
            scheduled,
        )
    }

    /// Whether any pending task is of a type `of` says yes to (asked once per type).
    pub fn has_pending_of(&self, of: impl Fn(&str) -> bool) -> bool {
        self.pending.has_kind(of)
    }

    /// The pending tasks, front (next to claim) first, each parsed again from its value; up
    /// to the first held without its value ([`Backlog::unfilled_front`]).
    pub fn pending(&self) -> impl Iterator<Item = Task> + '_ {
        self.pending
            .iter()
            .take_while(|out| out.value.is_some())
            .map(task_out)
    }

    /// The keys of the tasks held without their value among the first `n` in claim order:
    /// on a large backlog only the front's values are held, read as the claims reach them.
    pub fn unfilled_front(&self, n: usize) -> Vec<String> {
        self.pending.unfilled_front(n)
    }

    /// Gives the tasks of `asked` the values read (`found`): a task whose key is gone, or
    /// holds another version now, is forgotten (the next look reads it again if it is
    /// there).
    pub fn filled(&mut self, asked: &[String], found: Vec<StoredTask>) {
        let mut found: std::collections::HashMap<String, StoredTask, KeyHash> = found
            .into_iter()
            .map(|entry| (entry.key.clone(), entry))
            .collect();
        for key in asked {
            let filled = found.remove(key).is_some_and(|entry| {
                entry.holder.is_none()
                    && self
                        .pending
                        .fill(key, entry.version, entry.value.into_boxed_slice())
            });
            if !filled {
                self.forget(key);
            }
        }
    }

    /// Takes the first `n` pending tasks to claim them (the leader reads them through
    /// [`Backlog::pending`] first, and takes them with [`Backlog::take_read`]).
    #[cfg(test)]
    pub fn take(&mut self, n: usize) -> Vec<Task> {
        let taken: Vec<Task> = std::iter::from_fn(|| self.take_first()).take(n).collect();
        self.claimed += taken.len();
        taken
    }

    /// Takes out the first `n` pending tasks to claim them, as [`Backlog::take`] does, when
    /// the caller holds them already (read through [`Backlog::pending`]): they are not
    /// parsed again.
    pub fn take_read(&mut self, n: usize) {
        for _ in 0..n {
            if self.pop_first().is_none() {
                return;
            }
            self.claimed += 1;
        }
    }

    /// The first pending task in claim order, out of the pending set (its key still known),
    /// unparsed.
    fn pop_first(&mut self) -> Option<Popped> {
        let popped = self.pending.pop_first()?;
        self.known.insert(Arc::from(popped.key.as_str()));
        Some(popped)
    }

    /// Takes, to claim it, the first pending task whose group (`taskGroup`, empty when
    /// none) and type `free` admits. With concurrency groups `free` admits the groups with
    /// no run in progress and the types under their cap, and the first such task is its group's earliest pending one, unless a
    /// delayed task of its group comes before it (a retry waiting for its backoff): then
    /// the whole group waits. A task scheduled for later (runAt) is not due, so it holds no
    /// place in its group's order until then.
    pub fn take_first_free(&mut self, free: impl Fn(&str, &str) -> bool) -> Option<Task> {
        let key = self
            .pending
            .iter()
            .find(|out| {
                out.value.is_some() && free(out.group, out.kind) && !self.waits_in_group(out)
            })
            .map(|out| out.key.to_string())?;
        let popped = self.pending.take(&key)?;
        self.known.insert(Arc::from(key.as_str()));
        self.claimed += 1;
        Some(task_popped(popped))
    }

    /// Whether a delayed task of `pending`'s group (not one scheduled for later) comes
    /// before it in claim order.
    fn waits_in_group(&self, pending: &Out<'_>) -> bool {
        let order = (
            pending.order.priority,
            pending.order.time,
            pending.order.created,
            pending.key.as_str(),
        );
        self.delayed.iter().any(|(at, delayed)| {
            delayed.group() == pending.group
                && delayed.order_key() < order
                && !delayed.waits_for_run_at(*at)
        })
    }

    /// Puts one task taken but not claimed back in its place in claim order.
    pub fn put_back_one(&mut self, task: Task) {
        self.claimed = self.claimed.saturating_sub(1);
        self.insert(task);
    }

    /// Takes the first pending task out without claiming it (it is to be moved away).
    pub fn take_first(&mut self) -> Option<Task> {
        self.pop_first().map(task_popped)
    }

    /// Puts tasks taken but not claimed back in their places (at the front, unless
    /// earlier tasks arrived meanwhile).
    pub fn put_back(&mut self, tasks: Vec<Task>) {
        self.claimed = self.claimed.saturating_sub(tasks.len());
        for task in tasks {
            self.insert(task);
        }
    }

    /// Adds a pending task in claim order, replacing what was pending under its key.
    fn insert(&mut self, task: impl Into<Pending>) {
        let mut task: Pending = task.into();
        self.known.remove(&*task.key);
        self.pending.insert(task.incoming(true));
    }

    /// Drops the pending task under `key`, if there is one.
    fn remove(&mut self, key: &str) {
        self.pending.remove(key);
    }

    /// Whether the next look is made before the next claim: the last one was cheap.
    pub fn looks_in_line(&self) -> bool {
        self.look_cost < LOOK_IN_LINE
    }

    /// Records that a look began at `now`: no other is asked for until it is spaced from
    /// this one (the look's names are read while the leader claims).
    pub fn look_started(&mut self, now: DateTime<Utc>) {
        self.last_look = now;
        self.forgotten = Some(Keys::default());
    }

    /// Records a look at `now` that took `cost` and found `keys` under the prefix: tasks
    /// whose keys are gone are dropped; keys never seen (or forgotten) are new.
    pub fn looked(&mut self, keys: Names, now: DateTime<Utc>, cost: Duration) -> Looked {
        self.last_look = now;
        self.look_cost = cost;
        let mut new = self.compare(&keys);
        if new.len() > MAX_FETCH {
            return Looked::Relist;
        }
        new.sort();
        Looked::New(new)
    }

    /// Compares the keys under the prefix with the known ones: drops the tasks whose keys
    /// are gone, and returns the keys that are new (not known, and not forgotten since the
    /// look or listing that read them began). Ends that look or listing.
    fn compare(&mut self, keys: &Names) -> Vec<String> {
        // One pass over the names, one hash each: on a large backlog the comparison costs
        // as much as reading them, and it is made every look. Nothing is dropped unless
        // some known key is missing (the leader forgets the keys it deletes itself).
        let forgotten = self.forgotten.take().unwrap_or_default();
        let mut still = 0;
        let mut new = Vec::new();
        keys.each(|key| {
            if self.is_known(key) {
                still += 1;
            } else if !forgotten.contains(key) {
                new.push(key.to_string());
            }
        });
        if still < self.known_count() {
            let present = keys.set();
            self.drop_missing(|key| present.contains(key));
        }
        new
    }

    /// Drops every task and known key not `present` under the prefix.
    fn drop_missing(&mut self, present: impl Fn(&str) -> bool) {
        let gone = self.pending.keys_but(&present);
        for key in gone {
            self.remove(&key);
        }
        self.delayed.retain(|(_, task)| present(task.key.as_str()));
        self.known.retain(|key| present(key));
    }

    /// Records a listing read while the leader claimed (started with `look_started`), at
    /// `now`, which took `cost`, and returns the keys to read and sort out: keys never seen
    /// (or forgotten since the listing began) and pending tasks whose version is not the
    /// one known (a producer rewrote them in place: an earlier taskTime moves them up).
    /// Every other entry is left as known: a task the leader claimed or let go during the
    /// read is not taken back from it, and an entry held by the leader's own lease never
    /// is. Keys the listing lacks drop their tasks, as a look's names do. The listing counts
    /// as a look.
    pub fn relisted(
        &mut self,
        listed: Vec<Relisted>,
        now: DateTime<Utc>,
        cost: Duration,
    ) -> Vec<String> {
        // One pass, one probe of the known keys per entry (and one of the pending set for
        // the known ones): on a large backlog the merge is on the leader's path.
        let forgotten = self.forgotten.take().unwrap_or_default();
        let mut still = 0;
        let mut read = Vec::new();
        let mut rewritten = Vec::new();
        for entry in &listed {
            let key = &*entry.key;
            let known = self.is_known(key);
            still += usize::from(known);
            if entry.held == Held::Own {
                continue;
            }
            if !known {
                if !forgotten.contains(key) {
                    read.push(key.to_string());
                }
            } else if entry.held == Held::Free
                && self
                    .pending
                    .version(key)
                    .is_some_and(|version| version != entry.version)
            {
                read.push(key.to_string());
                rewritten.push(key.to_string());
            }
        }
        if still < self.known_count() {
            let present: HashSet<&str, KeyHash> = listed.iter().map(|entry| &*entry.key).collect();
            self.drop_missing(|key| present.contains(key));
        }
        drop(listed);
        for key in rewritten {
            self.known.remove(key.as_str());
            self.remove(&key);
        }
        self.last_look = now;
        self.listed_at = now;
        self.list_cost = cost;
        self.claimed = 0;
        self.listed = self.pending.len() + read.len();
        read
    }

    /// Records what the whole last look cost (reading the names, comparing them with the
    /// backlog's, reading the new tasks), once known: on a large backlog the comparison
    /// costs as much as the read, and looks are spaced by their whole cost.
    pub fn look_took(&mut self, cost: Duration) {
        self.look_cost = self.look_cost.max(cost);
    }

    /// Adds what reading new keys found: every key read (whatever became of it) is known,
    /// pending tasks go in claim order, delayed ones wait for their time.
    pub fn learn(
        &mut self,
        keys: Keys,
        pending: impl IntoIterator<Item = impl Into<Pending>>,
        delayed: Vec<(DateTime<Utc>, Task)>,
    ) {
        for key in keys {
            if !self.pending.contains(&key) {
                self.known.insert(key);
            }
        }
        for task in pending {
            self.insert(task);
        }
        for (at, task) in delayed {
            self.remove(&task.key);
            self.known.insert(Arc::from(task.key.as_str()));
            self.due_from = Some(self.due_from.map_or(at, |from| from.min(at)));
            self.delayed.push((at, task));
        }
    }

    /// Forgets a key: its task was deleted, or changed in a way that the next look must
    /// read again (a retry written back).
    pub fn forget(&mut self, key: &str) {
        if let Some(forgotten) = &mut self.forgotten {
            forgotten.insert(Arc::from(key));
        }
        self.known.remove(key);
        self.remove(key);
        if self.delayed.iter().any(|(_, task)| task.key == key) {
            self.delayed.retain(|(_, task)| task.key != key);
        }
    }

    /// Puts tasks taken but refused by the coordinator for a while (their keys are under another
    /// lease's takeover delay) aside until `until`, so that the tasks after them go first.
    pub fn defer(&mut self, tasks: Vec<Task>, until: DateTime<Utc>) {
        self.claimed = self.claimed.saturating_sub(tasks.len());
        if !tasks.is_empty() {
            self.due_from = Some(self.due_from.map_or(until, |from| from.min(until)));
        }
        self.delayed
            .extend(tasks.into_iter().map(|task| (until, task)));
    }

    /// Moves the delayed tasks that are due at `now` among the pending ones.
    fn promote(&mut self, now: DateTime<Utc>) {
        // Removals leave `due_from` early, never late: at worst one pass finds nothing due.
        if self.delayed.is_empty() || self.due_from.is_none_or(|from| from > now) {
            return;
        }
        let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.delayed)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        self.due_from = waiting.iter().map(|(at, _)| *at).min();
        self.delayed = waiting;
        let due: Vec<Task> = due.into_iter().map(|(_, task)| task).collect();
        self.learn(Keys::default(), due, Vec::new());
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Duration;

    use super::{
        scheduled_count, wake_at, Backlog, Keys, Looked, Next, Relisted, MAX_FETCH,
        MAX_TASKS_PER_LISTING, RELIST_FRACTION,
    };
    use crate::coord::StoredTask;
    use crate::coord::{LeaseId, Names, TaskVersion};
    use crate::queue::scripted::{at, grouped, scheduled, task};

    /// A task with a priority (its own `taskPriority`, or its type's once sorted out).
    fn urgent(key: &str, time: i64, priority: i32) -> crate::task::Task {
        let mut task = task(key, time, None);
        task.priority = Some(priority);
        task
    }

    /// Higher priority goes first, whatever its `taskTime`; within one priority the
    /// order is `taskTime`'s. A task taken and put back keeps its place, priority
    /// included (the priority it was sorted out with, which its value may not say).
    #[test]
    fn higher_priority_goes_first_and_keeps_its_place_when_put_back() {
        let mut backlog = Backlog::new(
            vec![
                task("q/a", 1, None),
                task("q/b", 2, None),
                urgent("q/late", 999, 10),
                urgent("q/low", 0, -1),
            ],
            vec![],
            known(&["q/a", "q/b", "q/late", "q/low"]),
            at(0),
            Duration::ZERO,
        );
        assert_eq!(keys(&backlog), ["q/late", "q/a", "q/b", "q/low"]);
        let taken = backlog.take(2);
        assert_eq!(taken[0].priority, Some(10));
        backlog.put_back(taken);
        assert_eq!(keys(&backlog), ["q/late", "q/a", "q/b", "q/low"]);
        backlog.put_back_one(urgent("q/new", 5, 3));
        assert_eq!(keys(&backlog), ["q/late", "q/new", "q/a", "q/b", "q/low"]);
    }

    /// With groups, the next claim is the earliest task of a group with nothing running,
    /// and a group whose earlier task waits for a retry waits with it.
    #[test]
    fn a_group_runs_in_order_one_at_a_time_and_waits_for_its_retry() {
        let now = at(0);
        let pending = vec![
            grouped("q/a1", 1, "a"),
            grouped("q/a2", 2, "a"),
            grouped("q/b1", 3, "b"),
            grouped("q/c2", 5, "c"),
        ];
        let retry = grouped("q/c1", 4, "c");
        let mut backlog = Backlog::new(
            pending,
            vec![(at(60_000), retry)],
            Keys::default(),
            now,
            Duration::ZERO,
        );
        let mut running: HashSet<String> = HashSet::new();
        let take = |backlog: &mut Backlog, running: &mut HashSet<String>| {
            let task = backlog.take_first_free(|group, _| !running.contains(group))?;
            running.insert(task.group().to_string());
            Some(task.key)
        };
        assert_eq!(take(&mut backlog, &mut running).as_deref(), Some("q/a1"));
        // a2 waits for a1; c2 waits for c1's retry, due in a minute.
        assert_eq!(take(&mut backlog, &mut running).as_deref(), Some("q/b1"));
        assert_eq!(take(&mut backlog, &mut running), None);
        running.remove("a");
        assert_eq!(take(&mut backlog, &mut running).as_deref(), Some("q/a2"));
        assert_eq!(keys(&backlog), vec!["q/c2"]);
        // Once c1 is due it goes first, then c2 after it.
        backlog.promote(at(60_000));
        running.clear();
        assert_eq!(take(&mut backlog, &mut running).as_deref(), Some("q/c1"));
        assert_eq!(take(&mut backlog, &mut running), None);
        running.clear();
        assert_eq!(take(&mut backlog, &mut running).as_deref(), Some("q/c2"));
    }

    /// A task taken but not claimed goes back to its place, not to the front.
    #[test]
    fn a_task_put_back_alone_keeps_its_place() {
        let mut backlog = Backlog::new(
            vec![
                grouped("q/a1", 1, "a"),
                grouped("q/b1", 2, "b"),
                grouped("q/b2", 3, "b"),
            ],
            Vec::new(),
            Keys::default(),
            at(0),
            Duration::ZERO,
        );
        let b1 = backlog.take_first_free(|group, _| group == "b").unwrap();
        backlog.put_back_one(b1);
        assert_eq!(keys(&backlog), vec!["q/a1", "q/b1", "q/b2"]);
    }

    fn keys(backlog: &Backlog) -> Vec<String> {
        backlog.pending().map(|t| t.key).collect()
    }

    fn known(names: &[&str]) -> Keys {
        names.iter().map(|&s| s.into()).collect()
    }

    /// Right after a listing the leader claims; once LOOK_INTERVAL has passed it looks at
    /// the keys first; a clock that went back also makes it look.
    #[test]
    fn the_leader_looks_at_the_keys_every_interval() {
        let mut backlog = Backlog::new(
            vec![task("q/b", 2, None), task("q/a", 1, None)],
            vec![],
            known(&["q/a", "q/b"]),
            at(0),
            Duration::ZERO,
        );
        assert_eq!(keys(&backlog), ["q/a", "q/b"]);
        assert_eq!(backlog.next(at(0)), Next::Claim);
        assert_eq!(backlog.next(at(19)), Next::Claim);
        assert_eq!(backlog.next(at(20)), Next::Look);
        assert_eq!(
            backlog.looked(Names::from_iter(["q/a", "q/b"]), at(20), Duration::ZERO),
            Looked::New(vec![])
        );
        assert_eq!(backlog.next(at(21)), Next::Claim);
        assert_eq!(backlog.next(at(10)), Next::Look, "the clock went back");
    }

    /// A look whose names are read while the leader claims: no other look is asked for
    /// meanwhile; keys the leader deleted or let go during the read are among the names
    /// but not new to that look (the next one reads a key that is still there).
    #[test]
    fn a_look_read_while_claiming_takes_no_deleted_key_for_new() {
        let mut backlog = Backlog::new(
            vec![
                task("q/a", 1, None),
                task("q/b", 2, None),
                task("q/c", 3, None),
            ],
            vec![],
            known(&["q/a", "q/b", "q/c"]),
            at(0),
            Duration::ZERO,
        );
        assert_eq!(backlog.next(at(20)), Next::Look);
        backlog.look_started(at(20));
        assert_eq!(backlog.next(at(21)), Next::Claim, "one look at a time");
        // The names, read at 20: q/a is claimed and completed meanwhile, q/b claimed and
        // written back as a retry (forgotten, to be read again); q/new arrived.
        let names = Names::from_iter(["q/a", "q/b", "q/c", "q/new"]);
        let taken: Vec<String> = backlog.take(2).into_iter().map(|t| t.key).collect();
        assert_eq!(taken, ["q/a", "q/b"]);
        backlog.forget("q/a");
        backlog.forget("q/b");
        assert_eq!(
            backlog.looked(names, at(30), Duration::from_millis(10)),
            Looked::New(vec!["q/new".into()])
        );
        assert_eq!(
            backlog.looked(Names::from_iter(["q/b", "q/c"]), at(130), Duration::ZERO),
            Looked::New(vec!["q/b".into()]),
            "the retry is read at the next look"
        );
    }

    /// Tasks read through `pending` and then taken with `take_read` are the ones `take`
    /// would have taken, and count as claimed the same: the relisting comes as soon.
    #[test]
    fn tasks_read_then_taken_are_the_first_and_count_as_claimed() {
        let backlog_of = || {
            let tasks = (0..300)
                .map(|n| task(&format!("q/{n:03}"), 300 - n, None))
                .collect();
            Backlog::new(tasks, vec![], Keys::default(), at(0), Duration::ZERO)
        };
        let (mut read, mut taken) = (backlog_of(), backlog_of());
        let first: Vec<String> = read.pending().take(3).map(|t| t.key).collect();
        read.take_read(3);
        let names =
            |tasks: Vec<crate::task::Task>| tasks.into_iter().map(|t| t.key).collect::<Vec<_>>();
        assert_eq!(first, names(taken.take(3)));
        assert_eq!(first, ["q/299", "q/298", "q/297"]);
        assert_eq!(names(read.take(1)), names(taken.take(1)));
        read.take_read(MAX_TASKS_PER_LISTING - 5);
        assert_eq!(read.next(at(1)), Next::Claim);
        read.take_read(1);
        assert_eq!(read.next(at(1)), Next::Relist);
        read.take_read(1_000);
        assert_eq!(read.pending().count(), 0);
    }

    /// A listing read while the leader claims is merged, not taken whole: only new keys
    /// and pending tasks rewritten in place are to be sorted out; a task claimed during the
    /// read (and any held by the leader's lease) is not taken back; gone keys drop their
    /// tasks; claims before the next listing count from the merge.
    #[test]
    fn a_listing_read_while_claiming_is_merged() {
        let tasks = (0..300)
            .map(|n| task(&format!("q/{n:03}"), n, None))
            .collect();
        let names: Vec<&str> = (0..300)
            .map(|n| format!("q/{n:03}"))
            .map(|k| &*k.leak())
            .collect();
        let mut backlog = Backlog::new(tasks, vec![], known(&names), at(0), Duration::ZERO);
        backlog.take(MAX_TASKS_PER_LISTING);
        assert_eq!(backlog.next(at(1)), Next::Relist);
        backlog.relist_started(at(1));
        assert_eq!(backlog.next(at(2)), Next::Claim, "one listing at a time");
        // Claimed during the read: q/256; completed during it: q/000.
        assert_eq!(backlog.take(1)[0].key, "q/256");
        backlog.forget("q/000");
        let own = LeaseId("mine".into());
        let entry = |key: &str, version: u64, holder: Option<&LeaseId>| StoredTask {
            key: key.into(),
            value: b"{}".to_vec(),
            version: TaskVersion(version),
            created: 1,
            holder: holder.cloned(),
        };
        let mut entries = vec![
            entry("q/000", 2, Some(&own)),
            entry("q/255", 2, Some(&own)),
            entry("q/256", 1, None),
            entry("q/257", 1, None),
            entry("q/258", 5, None),
            entry("q/259", 5, Some(&LeaseId("other".into()))),
            entry("q/new", 1, None),
        ];
        entries.extend((260..299).map(|n| entry(&format!("q/{n:03}"), 1, None)));
        let listed = entries
            .into_iter()
            .map(|entry| Relisted::of(entry, &own))
            .collect();
        let sort: Vec<String> = backlog.relisted(listed, at(3), Duration::from_millis(1));
        assert_eq!(sort, ["q/258", "q/new"]);
        // q/258 is sorted out again, q/299 is gone; q/259 stays as known.
        assert_eq!(keys(&backlog).first().map(String::as_str), Some("q/257"));
        assert!(!keys(&backlog).contains(&"q/258".to_string()));
        assert!(!keys(&backlog).contains(&"q/299".to_string()));
        assert!(keys(&backlog).contains(&"q/259".to_string()));
        assert_eq!(
            backlog.next(at(4)),
            Next::Claim,
            "claims count from the merge"
        );
    }

    /// A look that cost less than LOOK_IN_LINE is made before the next claim; a costlier
    /// one is read while the leader claims.
    #[test]
    fn cheap_looks_are_made_in_line_and_costly_ones_beside_the_claims() {
        let mut backlog = Backlog::new(
            vec![task("q/a", 1, None)],
            vec![],
            known(&["q/a"]),
            at(0),
            Duration::ZERO,
        );
        assert!(backlog.looks_in_line(), "the first look measures its cost");
        backlog.looked(Names::from_iter(["q/a"]), at(20), Duration::from_millis(4));
        assert!(backlog.looks_in_line());
        backlog.looked(Names::from_iter(["q/a"]), at(40), Duration::from_millis(5));
        assert!(!backlog.looks_in_line());
    }

    /// A costly look spaces the next one out to ten times its cost.
    #[test]
    fn costly_looks_are_spaced_out() {
        let mut backlog = Backlog::new(
            vec![task("q/a", 1, None)],
            vec![],
            known(&["q/a"]),
            at(0),
            Duration::ZERO,
        );
        backlog.looked(Names::from_iter(["q/a"]), at(0), Duration::from_millis(8));
        assert_eq!(backlog.next(at(79)), Next::Claim);
        assert_eq!(backlog.next(at(80)), Next::Look);
        // The whole look (names compared, new tasks read) cost 30 ms: the next one waits
        // ten times that, not ten times the 8 ms the names took to arrive.
        backlog.looked(Names::from_iter(["q/a"]), at(100), Duration::from_millis(8));
        backlog.look_took(Duration::from_millis(30));
        assert_eq!(backlog.next(at(399)), Next::Claim);
        assert_eq!(backlog.next(at(400)), Next::Look);
    }

    /// A task with an earlier taskTime that arrives is found at the next look and claimed
    /// before the later ones; keys that went away drop their tasks.
    #[test]
    fn a_new_earlier_task_goes_first_and_vanished_ones_go() {
        let mut backlog = Backlog::new(
            vec![
                task("q/b", 20, None),
                task("q/c", 30, None),
                task("q/d", 40, None),
            ],
            vec![],
            known(&["q/b", "q/c", "q/d", "q/running"]),
            at(0),
            Duration::ZERO,
        );
        assert_eq!(backlog.take(1).len(), 1);
        let looked = backlog.looked(
            Names::from_iter(["q/a", "q/c", "q/d", "q/running"]),
            at(30),
            Duration::ZERO,
        );
        assert_eq!(looked, Looked::New(vec!["q/a".into()]));
        backlog.learn(known(&["q/a"]), vec![task("q/a", 1, None)], vec![]);
        assert_eq!(keys(&backlog), ["q/a", "q/c", "q/d"]);
        // Known now: the same key is not new at the next look.
        assert_eq!(
            backlog.looked(Names::from_iter(["q/a", "q/c"]), at(60), Duration::ZERO),
            Looked::New(vec![])
        );
        assert_eq!(keys(&backlog), ["q/a", "q/c"]);
    }

    /// A key forgotten (its task deleted, or a retry written back) is new again when it
    /// shows up: a producer's re-PUT of a finished task's key is not missed.
    #[test]
    fn a_forgotten_key_is_read_again() {
        let mut backlog = Backlog::new(
            vec![task("q/a", 1, None)],
            vec![],
            known(&["q/a"]),
            at(0),
            Duration::ZERO,
        );
        let claimed = backlog.take(1);
        backlog.forget(&claimed[0].key);
        assert_eq!(
            backlog.looked(Names::from_iter(["q/a"]), at(30), Duration::ZERO),
            Looked::New(vec!["q/a".into()])
        );
    }

    /// A retry that falls due while later tasks are pending is claimed next.
    #[test]
    fn a_retry_that_falls_due_goes_before_later_tasks() {
        let mut backlog = Backlog::new(
            vec![task("q/b", 20, None), task("q/c", 30, None)],
            vec![(at(100), task("q/a", 1, Some(at(100))))],
            known(&["q/a", "q/b", "q/c"]),
            at(0),
            Duration::ZERO,
        );
        assert_eq!(backlog.next(at(10)), Next::Claim);
        assert_eq!(keys(&backlog), ["q/b", "q/c"]);
        backlog.looked(
            Names::from_iter(["q/a", "q/b", "q/c"]),
            at(99),
            Duration::ZERO,
        );
        assert_eq!(backlog.next(at(100)), Next::Claim);
        assert_eq!(keys(&backlog), ["q/a", "q/b", "q/c"]);
    }

    /// A task deferred (its claim refused for a while) lets the later ones go first and comes
    /// back at the front when its time is up.
    #[test]
    fn a_deferred_task_steps_aside_until_its_time() {
        let mut backlog = Backlog::new(
            vec![
                task("q/a", 1, None),
                task("q/b", 2, None),
                task("q/c", 3, None),
            ],
            vec![],
            known(&["q/a", "q/b", "q/c"]),
            at(0),
            Duration::ZERO,
        );
        let mut taken = backlog.take(2);
        let refused = taken.remove(0);
        backlog.put_back(taken);
        backlog.defer(vec![refused], at(1_000));
        assert_eq!(backlog.next(at(10)), Next::Claim);
        assert_eq!(keys(&backlog), ["q/b", "q/c"]);
        backlog.looked(
            Names::from_iter(["q/a", "q/b", "q/c"]),
            at(990),
            Duration::ZERO,
        );
        assert_eq!(backlog.next(at(1_000)), Next::Claim);
        assert_eq!(keys(&backlog), ["q/a", "q/b", "q/c"]);
        assert_eq!(backlog.take(3).len(), 3);
    }

    /// After MAX_TASKS_PER_LISTING claims the leader lists again; tasks put back unclaimed
    /// do not count; an empty backlog is done, even with retries still waiting.
    #[test]
    fn relists_after_a_listing_worth_of_claims_and_ends_when_empty() {
        let tasks = (0..300)
            .map(|n| task(&format!("q/{n:03}"), n, None))
            .collect();
        let mut backlog = Backlog::new(tasks, vec![], Keys::default(), at(0), Duration::ZERO);
        let taken = backlog.take(MAX_TASKS_PER_LISTING);
        assert_eq!(backlog.next(at(1)), Next::Relist);
        let mut taken = taken;
        backlog.put_back(taken.split_off(MAX_TASKS_PER_LISTING - 2));
        assert_eq!(backlog.next(at(1)), Next::Claim);
        assert_eq!(keys(&backlog)[0], "q/254");
        let mut waiting = Backlog::new(
            Vec::<crate::task::Task>::new(),
            vec![(at(500), task("q/a", 1, Some(at(500))))],
            Keys::default(),
            at(0),
            Duration::ZERO,
        );
        assert_eq!(waiting.next(at(1)), Next::Done);
    }

    /// A costly listing (a backlog of large values) is repeated no sooner than ten times
    /// its cost, however many tasks were claimed.
    #[test]
    fn costly_listings_are_spaced_out() {
        let tasks = (0..300)
            .map(|n| task(&format!("q/{n:03}"), n, None))
            .collect();
        let mut backlog = Backlog::new(
            tasks,
            vec![],
            Keys::default(),
            at(0),
            Duration::from_millis(200),
        );
        backlog.take(MAX_TASKS_PER_LISTING);
        assert_eq!(backlog.next(at(10)), Next::Claim);
        assert_eq!(backlog.next(at(2_000)), Next::Relist);
    }

    /// On a large backlog the leader lists again only after claiming half of what the
    /// listing held, not after every MAX_TASKS_PER_LISTING claims: a drain of N tasks
    /// reads about 2N tasks in all, not N²/256.
    #[test]
    fn a_large_backlog_is_listed_again_after_half_of_it() {
        let tasks = (0..4_000)
            .map(|n| task(&format!("q/{n:04}"), n, None))
            .collect();
        let mut backlog = Backlog::new(tasks, vec![], Keys::default(), at(0), Duration::ZERO);
        backlog.take(MAX_TASKS_PER_LISTING);
        assert_eq!(backlog.next(at(1)), Next::Claim);
        backlog.take(4_000 / RELIST_FRACTION - MAX_TASKS_PER_LISTING - 1);
        assert_eq!(backlog.next(at(2)), Next::Claim);
        assert_eq!(
            keys(&backlog)[0],
            format!("q/{:04}", 4_000 / RELIST_FRACTION - 1)
        );
        backlog.take(1);
        assert_eq!(backlog.next(at(3)), Next::Relist);
    }

    /// A task read again under a key the backlog holds (a conflict's re-read, a retry)
    /// replaces the old one and takes its new place; forgetting one task leaves the order
    /// of the others; a task put back goes before later ones that arrived meanwhile.
    #[test]
    fn one_task_moves_without_disturbing_the_others() {
        let tasks = (0..1_000)
            .map(|n| task(&format!("q/{n:04}"), 10 + n, None))
            .collect();
        let mut backlog = Backlog::new(tasks, vec![], Keys::default(), at(0), Duration::ZERO);
        backlog.learn(Keys::default(), vec![task("q/0500", 1, None)], vec![]);
        assert_eq!(keys(&backlog)[..2], ["q/0500", "q/0000"]);
        assert_eq!(backlog.pending().count(), 1_000);
        backlog.forget("q/0000");
        assert_eq!(keys(&backlog)[..2], ["q/0500", "q/0001"]);
        let taken = backlog.take(2);
        backlog.learn(Keys::default(), vec![task("q/new", 5_000, None)], vec![]);
        backlog.put_back(taken);
        assert_eq!(keys(&backlog)[..2], ["q/0500", "q/0001"]);
        assert_eq!(keys(&backlog).last().map(String::as_str), Some("q/new"));
        assert_eq!(backlog.pending().count(), 1_000);
    }

    /// More new keys than MAX_FETCH at one look: list again.
    #[test]
    fn a_flood_of_new_keys_means_listing_again() {
        let mut backlog = Backlog::new(
            vec![task("q/a", 1, None)],
            vec![],
            known(&["q/a"]),
            at(0),
            Duration::ZERO,
        );
        let flood = (0..=MAX_FETCH)
            .map(|n| format!("q/n{n}"))
            .collect::<Names>();
        assert_eq!(
            backlog.looked(flood, at(30), Duration::ZERO),
            Looked::Relist
        );
    }

    /// An idle leader wakes at the earliest time a waiting task falls due, a scheduled one
    /// or a retry, or an orphan's fence ends; with nothing waiting it only waits for a change.
    #[test]
    fn the_idle_leader_wakes_for_the_earliest_due_task() {
        let waiting = vec![
            (at(5_000), scheduled("q/s", 1, at(5_000), None)),
            (at(2_000), task("q/r", 2, Some(at(2_000)))),
            (at(9_000), scheduled("q/t", 3, at(9_000), None)),
        ];
        assert_eq!(wake_at(&waiting, None), Some(at(2_000)));
        assert_eq!(wake_at(&waiting[..1], None), Some(at(5_000)));
        assert_eq!(wake_at(&waiting, Some(at(1_000))), Some(at(1_000)));
        assert_eq!(wake_at(&[], None), None);
        assert_eq!(scheduled_count(&waiting), 2);
    }

    /// A scheduled task waits in the backlog until its runAt, then is claimed in taskTime
    /// order among the pending ones; while it waits it holds no place in its group, unlike
    /// a retry waiting for its backoff.
    #[test]
    fn a_scheduled_task_falls_due_in_task_time_order_and_holds_no_group() {
        let early = scheduled("q/early", 1, at(10_000), None);
        let mut backlog = Backlog::new(
            vec![grouped("q/g2", 2, "g"), grouped("q/g3", 3, "g")],
            vec![(at(10_000), early)],
            Keys::default(),
            at(0),
            Duration::ZERO,
        );
        assert_eq!(backlog.depth(), (2, 0, 1));
        let first = backlog.take_first_free(|_, _| true).unwrap();
        assert_eq!(
            first.key, "q/g2",
            "the scheduled task does not hold its group"
        );
        backlog.put_back_one(first);
        backlog.next(at(9_999));
        assert_eq!(keys(&backlog), vec!["q/g2", "q/g3"]);
        backlog.next(at(10_000));
        assert_eq!(
            keys(&backlog),
            vec!["q/early", "q/g2", "q/g3"],
            "once due, it goes by its taskTime"
        );
        assert_eq!(backlog.depth(), (3, 0, 0));
    }
}
