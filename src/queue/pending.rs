//! Pure: the pending tasks of the leader's backlog, in claim order, held compactly so that a
//! backlog of a million waiting tasks fits in a small leader (`backlog.rs` uses it).
//!
//! A pending task is held as its place in claim order (priority, `taskTime` to the
//! microsecond, creation: a [`Place`] of 24 bytes in one vector), and beside it a [`Slot`]
//! of 28 bytes (its version, its type and group as small numbers, where its place is); its
//! key is kept once, after the prefix all keys share (kept once too), in one buffer of keys
//! ([`Arena`]), and found again through a table of slot numbers hashed by key (4 bytes and
//! a control byte each, at most 7/8 full); its value, while it is held (a large backlog
//! holds its front's), in a map by slot. A million waiting tasks with keys of 18 bytes under
//! an 11-byte prefix take about 24 + 28 + 7 + 10 = 69 bytes each: 69 MB.
//! The listing's tasks are sorted once, in place, into the line, which claims consume from
//! its front; tasks added later (a look's new keys, tasks put back, retries falling due) go
//! into a small ordered map beside it, and the two are read merged. A task dropped from the
//! line leaves its place there empty, skipped when reached. No task is parsed here: what a
//! claim needs is read back from the value.
//!
//! Size: the store and its tests; each operation must keep the line, the later arrivals,
//! the slots and the key table in step.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

use chrono::{DateTime, Utc};
use hashbrown::HashTable;

use crate::coord::TaskVersion;

/// The hash of the key table and the name tables: seeded per process, fast on short keys.
type KeyHash = foldhash::fast::RandomState;

/// A pending task's place in claim order, without its key: higher priority first, then
/// earlier `taskTime`, then earlier creation; ties by key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Order {
    pub priority: Reverse<i32>,
    pub time: DateTime<Utc>,
    pub created: u64,
}

/// A pending task as it is added.
#[derive(Debug)]
pub struct Incoming<'a> {
    pub key: &'a str,
    pub order: Order,
    pub version: TaskVersion,
    pub value: Option<Box<[u8]>>,
    pub kind: &'a str,
    pub group: &'a str,
}

/// A pending task as it is read out.
#[derive(Debug, PartialEq, Eq)]
pub struct Out<'a> {
    pub key: String,
    pub order: Order,
    pub version: TaskVersion,
    /// Its value, when held (a large backlog holds only its front's).
    pub value: Option<&'a [u8]>,
    pub kind: &'a str,
    pub group: &'a str,
}

/// A place in the line: the order, its time to the microsecond (the rest of a time given
/// to the nanosecond is kept aside: [`PendingSet::fine`]), and the slot it points to
/// (`u32::MAX`: left empty).
#[derive(Clone, Copy, Debug)]
struct Place {
    micros: i64,
    created: u64,
    priority: i32,
    slot: u32,
}

/// A time as a line holds it: microseconds since the epoch, and the nanoseconds past them.
fn split_time(time: DateTime<Utc>) -> (i64, u32) {
    (
        time.timestamp_micros(),
        time.timestamp_subsec_nanos() % 1000,
    )
}

/// The time [`split_time`] split.
fn join_time(micros: i64, nanos: u32) -> DateTime<Utc> {
    let secs = micros.div_euclid(1_000_000);
    let nanos = micros.rem_euclid(1_000_000) as u32 * 1000 + nanos;
    DateTime::from_timestamp(secs, nanos).expect("a time a line split")
}

const EMPTY: u32 = u32::MAX;

/// What is kept of a pending task beside its place: 28 bytes, nothing wider than four
/// (a million of them are held).
#[derive(Debug)]
struct Slot {
    key: Span,
    /// Its version, in halves.
    version: [u32; 2],
    kind: u32,
    group: u32,
    /// Where its place is ([`At`], packed).
    at: u32,
}

impl Slot {
    fn version(&self) -> TaskVersion {
        TaskVersion(u64::from(self.version[0]) << 32 | u64::from(self.version[1]))
    }

    fn at(&self) -> At {
        match self.at {
            AT_FREE => At::Free,
            AT_LATER => At::Later,
            line => At::Line(line),
        }
    }

    fn set_at(&mut self, at: At) {
        self.at = match at {
            At::Line(line) => {
                assert!(line < AT_LATER, "a line under 4 billion places");
                line
            }
            At::Later => AT_LATER,
            At::Free => AT_FREE,
        };
    }
}

/// Where a slot's place is: in the line (at this index), or among the later arrivals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    Line(u32),
    Later,
    /// A slot free for reuse.
    Free,
}

const AT_LATER: u32 = u32::MAX - 1;
const AT_FREE: u32 = u32::MAX;

/// Halves of `version`, as a slot keeps it.
fn halves(version: TaskVersion) -> [u32; 2] {
    [(version.0 >> 32) as u32, version.0 as u32]
}

/// A key in the arena: its offset and length.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u32,
    len: u32,
}

/// Every held key after the prefix they all share (kept once), one after another in one
/// buffer; keys of dropped tasks stay as garbage until it is more than the live keys, then
/// the buffer is written again.
#[derive(Debug, Default)]
struct Arena {
    prefix: String,
    bytes: String,
    garbage: usize,
}

impl Arena {
    /// Keeps `key`, which is under the shared prefix.
    fn push(&mut self, key: &str) -> Span {
        let rest = &key[self.prefix.len()..];
        let start = u32::try_from(self.bytes.len()).expect("keys under 4 GiB");
        self.bytes.push_str(rest);
        Span {
            start,
            len: u32::try_from(rest.len()).expect("a key under 4 GiB"),
        }
    }

    /// The key's rest, after the shared prefix.
    fn rest(&self, span: Span) -> &str {
        &self.bytes[span.start as usize..(span.start + span.len) as usize]
    }

    /// The key, whole.
    fn key(&self, span: Span) -> String {
        [self.prefix.as_str(), self.rest(span)].concat()
    }

    /// How the key at `span` compares with `key`, whole.
    fn cmp_whole(&self, span: Span, key: &str) -> Ordering {
        let whole = self.prefix.bytes().chain(self.rest(span).bytes());
        whole.cmp(key.bytes())
    }

    /// Whether `key` is the one at `span`.
    fn is(&self, span: Span, key: &str) -> bool {
        key.strip_prefix(self.prefix.as_str()) == Some(self.rest(span))
    }

    /// How the key at `a` compares with the one at `b`.
    fn cmp(&self, a: Span, b: Span) -> Ordering {
        self.rest(a).cmp(self.rest(b))
    }

    /// The hash of the key at `span` (of its rest: all share the prefix).
    fn hash(&self, span: Span, hash: &KeyHash) -> u64 {
        hash.hash_one(self.rest(span))
    }

    /// The hash of `key`, as [`Arena::hash`] has it; `None`: not under the prefix, so held
    /// by no slot.
    fn hash_of(&self, key: &str, hash: &KeyHash) -> Option<u64> {
        key.strip_prefix(self.prefix.as_str())
            .map(|rest| hash.hash_one(rest))
    }
}

/// Strings held once each, named by their number (types and groups: a handful of types,
/// and as many groups as the backlog's tasks name at most).
#[derive(Debug, Default)]
struct Names {
    names: Vec<Box<str>>,
    index: HashTable<u32>,
}

impl Names {
    fn number(&mut self, name: &str, hash: &KeyHash) -> u32 {
        let h = hash.hash_one(name);
        let names = &self.names;
        if let Some(&n) = self.index.find(h, |&n| &*names[n as usize] == name) {
            return n;
        }
        let n = u32::try_from(self.names.len()).expect("under 4 billion names");
        self.names.push(name.into());
        let names = &self.names;
        self.index
            .insert_unique(h, n, |&n| hash.hash_one(&*names[n as usize]));
        n
    }

    fn name(&self, n: u32) -> &str {
        self.names.get(n as usize).map_or("", |name| name)
    }
}

/// The pending tasks in claim order (module header).
#[derive(Debug, Default)]
pub struct PendingSet {
    line: Vec<Place>,
    /// The line's first place not yet consumed.
    head: usize,
    /// Tasks added after the line was sorted, by order and key; and the order of each.
    later: BTreeMap<(Order, Box<str>), u32>,
    later_orders: HashMap<u32, Order, KeyHash>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Slot numbers by key.
    index: HashTable<u32>,
    hash: KeyHash,
    keys: Arena,
    kinds: Names,
    groups: Names,
    /// The nanoseconds past the microsecond of the line's times that have some, by slot
    /// (almost always none).
    fine: HashMap<u32, u32, KeyHash>,
    live: usize,
    /// The values held, by slot: a large backlog holds only its front's.
    values: HashMap<u32, Box<[u8]>, KeyHash>,
    /// Tasks held without their value (read again before they are claimed).
    unfilled: usize,
}

impl PendingSet {
    /// No pending tasks yet; their keys are under `prefix` (kept once). A key that is not
    /// is still kept whole: the shared prefix shrinks to fit it.
    pub fn under(prefix: &str) -> PendingSet {
        PendingSet {
            keys: Arena {
                prefix: prefix.to_string(),
                ..Arena::default()
            },
            ..PendingSet::default()
        }
    }

    /// Adds a task of a listing to the line (a task of its key already there is replaced);
    /// [`PendingSet::finish_line`] sorts the line once they are all in.
    pub fn push_line(&mut self, task: Incoming<'_>) {
        self.remove(task.key);
        let order = task.order;
        let slot = self.new_slot(task, At::Line(0));
        let (micros, nanos) = split_time(order.time);
        if nanos != 0 {
            self.fine.insert(slot, nanos);
        }
        self.line.push(Place {
            micros,
            created: order.created,
            priority: order.priority.0,
            slot,
        });
    }

    /// Sorts the line pushed, in place: the listing's tasks in claim order.
    pub fn finish_line(&mut self) {
        self.line.retain(|place| place.slot != EMPTY);
        self.sort_line();
    }

    /// Sorts the line (every place in it: built, not yet consumed) and points the slots at
    /// their places.
    fn sort_line(&mut self) {
        let (slots, keys, fine) = (&self.slots, &self.keys, &self.fine);
        let nanos = |slot: u32| nanos_of(fine, slot);
        self.line.sort_unstable_by(|a, b| {
            (Reverse(a.priority), a.micros)
                .cmp(&(Reverse(b.priority), b.micros))
                .then_with(|| nanos(a.slot).cmp(&nanos(b.slot)))
                .then(a.created.cmp(&b.created))
                .then_with(|| keys.cmp(slots[a.slot as usize].key, slots[b.slot as usize].key))
        });
        self.line.shrink_to_fit();
        for (n, place) in self.line.iter().enumerate() {
            self.slots[place.slot as usize].set_at(At::Line(n as u32));
        }
        // Grown by doubling while the listing came: the room left is given back.
        self.slots.shrink_to_fit();
        self.keys.bytes.shrink_to_fit();
        let (slots, keys, hash) = (&self.slots, &self.keys, &self.hash);
        self.index
            .shrink_to_fit(|&n| keys.hash(slots[n as usize].key, hash));
    }

    /// The order of a place in the line.
    fn order_of(&self, place: &Place) -> Order {
        Order {
            priority: Reverse(place.priority),
            time: join_time(place.micros, nanos_of(&self.fine, place.slot)),
            created: place.created,
        }
    }

    fn new_slot(&mut self, task: Incoming<'_>, at: At) -> u32 {
        if !task.key.starts_with(self.keys.prefix.as_str()) {
            self.share_less(task.key);
        }
        let mut slot = Slot {
            key: self.keys.push(task.key),
            version: halves(task.version),
            kind: self.kinds.number(task.kind, &self.hash),
            group: self.groups.number(task.group, &self.hash),
            at: AT_FREE,
        };
        slot.set_at(at);
        let n = match self.free.pop() {
            Some(n) => {
                self.slots[n as usize] = slot;
                n
            }
            None => {
                self.slots.push(slot);
                u32::try_from(self.slots.len() - 1).expect("under 4 billion tasks")
            }
        };
        let (slots, keys, hash) = (&self.slots, &self.keys, &self.hash);
        let key_hash = keys.hash(slots[n as usize].key, hash);
        self.index
            .insert_unique(key_hash, n, |&n| keys.hash(slots[n as usize].key, hash));
        match task.value {
            Some(value) => {
                self.values.insert(n, value);
            }
            None => self.unfilled += 1,
        }
        self.live += 1;
        n
    }

    /// Shrinks the keys' shared prefix to what it shares with `key` (a key not under the
    /// queue's prefix: none are, but nothing here relies on it), writing the held keys and
    /// their table again.
    fn share_less(&mut self, key: &str) {
        let keep = crate::coord::shared_len(&self.keys.prefix, key);
        let given_back = self.keys.prefix.split_off(keep);
        self.rewrite_keys(&given_back);
        self.index.clear();
        let (slots, keys, hash) = (&self.slots, &self.keys, &self.hash);
        for (n, slot) in slots.iter().enumerate().filter(|(_, s)| s.at() != At::Free) {
            self.index
                .insert_unique(keys.hash(slot.key, hash), n as u32, |&m| {
                    keys.hash(slots[m as usize].key, hash)
                });
        }
    }

    /// Writes the held keys again, one after another, each after `given_back` (what the
    /// shared prefix gave back; empty: garbage shed).
    fn rewrite_keys(&mut self, given_back: &str) {
        let live = self.keys.bytes.len() - self.keys.garbage;
        let mut bytes = String::with_capacity(live + self.live * given_back.len());
        for slot in self.slots.iter_mut().filter(|s| s.at() != At::Free) {
            let start = u32::try_from(bytes.len()).expect("keys under 4 GiB");
            bytes.push_str(given_back);
            bytes.push_str(self.keys.rest(slot.key));
            slot.key = Span {
                start,
                len: u32::try_from(bytes.len()).expect("keys under 4 GiB") - start,
            };
        }
        self.keys.bytes = bytes;
        self.keys.garbage = 0;
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Whether a task of `key` is pending.
    pub fn contains(&self, key: &str) -> bool {
        self.find(key).is_some()
    }

    /// The version of the pending task of `key`.
    pub fn version(&self, key: &str) -> Option<TaskVersion> {
        self.find(key).map(|n| self.slots[n as usize].version())
    }

    fn find(&self, key: &str) -> Option<u32> {
        let (slots, keys) = (&self.slots, &self.keys);
        self.index
            .find(keys.hash_of(key, &self.hash)?, |&n| {
                keys.is(slots[n as usize].key, key)
            })
            .copied()
    }

    /// Adds a pending task in its place, replacing the one of its key if any.
    pub fn insert(&mut self, task: Incoming<'_>) {
        self.remove(task.key);
        let (order, key): (Order, Box<str>) = (task.order, task.key.into());
        let slot = self.new_slot(task, At::Later);
        self.later.insert((order, key), slot);
        self.later_orders.insert(slot, order);
    }

    /// Drops the pending task of `key`, if any.
    pub fn remove(&mut self, key: &str) -> bool {
        let Some(n) = self.find(key) else {
            return false;
        };
        self.drop_slot(n);
        true
    }

    /// Drops slot `n`, answering the value it held.
    fn drop_slot(&mut self, n: u32) -> Option<Box<[u8]>> {
        let slot = &self.slots[n as usize];
        let key_hash = self.keys.hash(slot.key, &self.hash);
        match slot.at() {
            At::Line(at) => self.line[at as usize].slot = EMPTY,
            At::Later => {
                let key: Box<str> = self.keys.key(slot.key).into();
                if let Some(order) = self.later_orders.remove(&n) {
                    self.later.remove(&(order, key));
                }
            }
            At::Free => return None,
        }
        if let Ok(entry) = self.index.find_entry(key_hash, |&m| m == n) {
            entry.remove();
        }
        let slot = &mut self.slots[n as usize];
        self.keys.garbage += slot.key.len as usize;
        slot.set_at(At::Free);
        if !self.fine.is_empty() {
            self.fine.remove(&n);
        }
        let value = self.values.remove(&n);
        self.unfilled -= usize::from(value.is_none());
        self.free.push(n);
        self.live -= 1;
        self.collect_garbage();
        value
    }

    /// Writes the arena and the line again once most of them is garbage.
    fn collect_garbage(&mut self) {
        if self.keys.garbage > 4096 && self.keys.garbage > self.keys.bytes.len() / 2 {
            self.rewrite_keys("");
        }
        if self.head > 4096 && self.head > self.line.len() / 2 {
            self.line.drain(..self.head);
            self.head = 0;
            self.line.shrink_to_fit();
            for (n, place) in self.line.iter().enumerate() {
                if place.slot != EMPTY {
                    self.slots[place.slot as usize].set_at(At::Line(n as u32));
                }
            }
        }
    }

    /// The first line place in use from `from`, and its index.
    fn line_from(&self, from: usize) -> Option<(usize, &Place)> {
        self.line[from..]
            .iter()
            .enumerate()
            .find(|(_, place)| place.slot != EMPTY)
            .map(|(n, place)| (from + n, place))
    }

    fn out(&self, order: Order, n: u32) -> Out<'_> {
        let slot = &self.slots[n as usize];
        Out {
            key: self.keys.key(slot.key),
            order,
            version: slot.version(),
            value: self.values.get(&n).map(|value| &**value),
            kind: self.kinds.name(slot.kind),
            group: self.groups.name(slot.group),
        }
    }

    /// The pending tasks' slots, front (next to claim) first, each with its order: the
    /// line's (its order made only when a later arrival is compared with it) merged with the
    /// later arrivals'.
    fn in_order(&self) -> impl Iterator<Item = (Spot<'_>, u32)> + '_ {
        let mut line = self.head;
        let mut later = self.later.iter().peekable();
        std::iter::from_fn(move || {
            let next_line = self.line_from(line);
            let take_line = match (next_line, later.peek()) {
                (None, None) => return None,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((_, place)), Some(((order, key), _))) => {
                    let line_key = self.slots[place.slot as usize].key;
                    self.order_of(place)
                        .cmp(order)
                        .then_with(|| self.keys.cmp_whole(line_key, key))
                        == Ordering::Less
                }
            };
            if take_line {
                let (at, place) = next_line?;
                line = at + 1;
                Some((Spot::Line(place), place.slot))
            } else {
                let ((order, _), &n) = later.next()?;
                Some((Spot::Later(*order), n))
            }
        })
    }

    /// The pending tasks, front (next to claim) first.
    pub fn iter(&self) -> impl Iterator<Item = Out<'_>> + '_ {
        self.in_order().map(|(spot, n)| {
            let order = match spot {
                Spot::Line(place) => self.order_of(place),
                Spot::Later(order) => order,
            };
            self.out(order, n)
        })
    }

    /// The first pending task, out of the set: its key, order, version and value.
    pub fn pop_first(&mut self) -> Option<Popped> {
        let (_, n) = self.in_order().next()?;
        self.take_slot(n)
    }

    /// The pending task of `key`, out of the set.
    pub fn take(&mut self, key: &str) -> Option<Popped> {
        let n = self.find(key)?;
        self.take_slot(n)
    }

    /// The pending task of slot `n`, out of the set.
    fn take_slot(&mut self, n: u32) -> Option<Popped> {
        let slot = &self.slots[n as usize];
        let order = match slot.at() {
            At::Line(at) => self.order_of(&self.line[at as usize]),
            At::Later => *self.later_orders.get(&n)?,
            At::Free => return None,
        };
        let (version, at) = (slot.version(), slot.at());
        let key = self.keys.key(slot.key);
        let kind = self.kinds.name(slot.kind).to_string();
        let group = self.groups.name(slot.group).to_string();
        if let At::Line(at) = at {
            if at as usize == self.head {
                self.head += 1;
            }
        }
        let popped = Popped {
            key,
            order,
            version,
            value: self.drop_slot(n),
            kind,
            group,
        };
        while self.head < self.line.len() && self.line[self.head].slot == EMPTY {
            self.head += 1;
        }
        Some(popped)
    }

    /// The keys of the tasks held without their value among the first `n` in claim order.
    pub fn unfilled_front(&self, n: usize) -> Vec<String> {
        if self.unfilled == 0 {
            return Vec::new();
        }
        self.in_order()
            .take(n)
            .filter(|(_, slot)| !self.values.contains_key(slot))
            .map(|(_, slot)| self.keys.key(self.slots[slot as usize].key))
            .collect()
    }

    /// Gives the pending task of `key` its value, if it is still at `version` (else the
    /// answer is false: the task is another now, or gone).
    pub fn fill(&mut self, key: &str, version: TaskVersion, value: Box<[u8]>) -> bool {
        match self.find(key) {
            Some(n) if self.slots[n as usize].version() == version => {
                if self.values.insert(n, value).is_none() {
                    self.unfilled -= 1;
                }
                true
            }
            _ => false,
        }
    }

    /// Whether any pending task is of a type `of` says yes to (asked once per type).
    pub fn has_kind(&self, of: impl Fn(&str) -> bool) -> bool {
        let wanted: Vec<u32> = (0..self.kinds.names.len() as u32)
            .filter(|&n| of(self.kinds.name(n)))
            .collect();
        !wanted.is_empty()
            && self
                .slots
                .iter()
                .any(|slot| slot.at() != At::Free && wanted.contains(&slot.kind))
    }

    /// The pending tasks, taken out in claim order.
    pub fn into_pending(mut self) -> impl Iterator<Item = Popped> {
        std::iter::from_fn(move || self.pop_first())
    }

    /// The keys of the pending tasks `keep` says no to (each key handed to it whole, none
    /// made a string of unless answered).
    pub fn keys_but(&self, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let mut key = self.keys.prefix.clone();
        let mut answer = Vec::new();
        for slot in self.slots.iter().filter(|slot| slot.at() != At::Free) {
            key.truncate(self.keys.prefix.len());
            key.push_str(self.keys.rest(slot.key));
            if !keep(&key) {
                answer.push(key.clone());
            }
        }
        answer
    }
}

/// The nanoseconds past the microsecond of the time of the line place pointing at `slot`.
fn nanos_of(fine: &HashMap<u32, u32, KeyHash>, slot: u32) -> u32 {
    if fine.is_empty() {
        return 0;
    }
    fine.get(&slot).copied().unwrap_or(0)
}

/// Where a pending task stands in claim order: a place in the line, or a later arrival of
/// this order.
enum Spot<'a> {
    Line(&'a Place),
    Later(Order),
}

/// A pending task taken out of the set.
#[derive(Debug, PartialEq, Eq)]
pub struct Popped {
    pub key: String,
    pub order: Order,
    pub version: TaskVersion,
    pub value: Option<Box<[u8]>>,
    pub kind: String,
    pub group: String,
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;

    use super::{Incoming, Order, PendingSet};
    use crate::coord::TaskVersion;
    use crate::queue::scripted::at;

    fn order(time: i64) -> Order {
        Order {
            priority: Reverse(0),
            time: at(time),
            created: 0,
        }
    }

    fn incoming<'a>(key: &'a str, time: i64, group: &'a str) -> Incoming<'a> {
        Incoming {
            key,
            order: order(time),
            version: TaskVersion(time as u64),
            value: Some(key.as_bytes().into()),
            kind: "T",
            group,
        }
    }

    fn keys(set: &PendingSet) -> Vec<String> {
        set.iter().map(|out| out.key).collect()
    }

    /// What a waiting task costs beside its key: a place of 24 bytes and a slot of 28, its
    /// version kept whole in halves.
    #[test]
    fn a_place_and_a_slot_stay_small() {
        assert_eq!(std::mem::size_of::<super::Place>(), 24);
        assert_eq!(std::mem::size_of::<super::Slot>(), 28);
        for version in [0, 1, u64::from(u32::MAX) + 7, u64::MAX] {
            let mut set = PendingSet::default();
            let mut task = incoming("q/a", 0, "");
            task.version = TaskVersion(version);
            set.push_line(task);
            assert_eq!(set.version("q/a"), Some(TaskVersion(version)));
        }
    }

    /// The tasks held without their value among the first n in claim order are named in
    /// that order, a later arrival among them in its place; a value given takes its task
    /// off the list, and a fill at another version is refused.
    #[test]
    fn the_front_held_without_values_is_named_in_claim_order() {
        let mut set = PendingSet::under("q/");
        for (key, time) in [("q/a", 1), ("q/b", 2), ("q/c", 3), ("q/d", 4)] {
            set.push_line(Incoming {
                value: (key == "q/a").then(|| key.as_bytes().into()),
                ..incoming(key, time, "")
            });
        }
        set.finish_line();
        assert_eq!(set.unfilled_front(4), ["q/b", "q/c", "q/d"]);
        set.insert(Incoming {
            value: None,
            ..incoming("q/bb", 2, "")
        });
        assert_eq!(set.unfilled_front(3), ["q/b", "q/bb"]);
        assert!(set.fill("q/b", TaskVersion(2), b"b".to_vec().into()));
        assert!(!set.fill("q/c", TaskVersion(9), b"c".to_vec().into()));
        assert_eq!(set.unfilled_front(5), ["q/bb", "q/c", "q/d"]);
        let popped: Vec<(String, Option<Box<[u8]>>)> = set
            .into_pending()
            .map(|task| (task.key, task.value))
            .collect();
        assert_eq!(
            popped,
            [
                ("q/a".to_string(), Some(b"q/a".to_vec().into())),
                ("q/b".to_string(), Some(b"b".to_vec().into())),
                ("q/bb".to_string(), None),
                ("q/c".to_string(), None),
                ("q/d".to_string(), None),
            ]
        );
    }

    /// A line keeps times to the nanosecond, before the epoch and in a leap second too, and
    /// orders by them: the nanoseconds past the microsecond kept aside decide before the
    /// creation does.
    #[test]
    fn times_are_kept_and_ordered_to_the_nanosecond() {
        use chrono::{DateTime, NaiveDate};
        let leap = NaiveDate::from_ymd_opt(2016, 12, 31)
            .unwrap()
            .and_hms_nano_opt(23, 59, 59, 1_500_000_001)
            .unwrap()
            .and_utc();
        for time in [
            at(0),
            DateTime::from_timestamp(1_445_599_887, 123_456_789).unwrap(),
            DateTime::from_timestamp(-1, 999_999_999).unwrap(),
            DateTime::<chrono::Utc>::MIN_UTC,
            DateTime::<chrono::Utc>::MAX_UTC,
        ] {
            let (micros, nanos) = super::split_time(time);
            assert_eq!(super::join_time(micros, nanos), time);
        }
        let (micros, nanos) = super::split_time(leap);
        assert_eq!(
            super::join_time(micros, nanos).timestamp_nanos_opt(),
            leap.timestamp_nanos_opt()
        );
        let mut set = PendingSet::under("q/");
        let base = DateTime::from_timestamp(1_445_599_887, 5_000).unwrap();
        for (key, nanos, created) in [("q/a", 1, 0), ("q/b", 0, 9), ("q/c", 0, 1), ("q/d", 2, 0)] {
            let mut task = incoming(key, 0, "");
            task.order.time = base + chrono::TimeDelta::nanoseconds(nanos);
            task.order.created = created;
            set.push_line(task);
        }
        set.finish_line();
        assert_eq!(keys(&set), ["q/c", "q/b", "q/a", "q/d"]);
        let first = set.pop_first().unwrap();
        assert_eq!((first.order.time, first.order.created), (base, 1));
        assert_eq!(
            set.take("q/d").unwrap().order.time,
            base + chrono::TimeDelta::nanoseconds(2)
        );
    }

    /// Keys are kept after the prefix they share; one outside it makes the shared part
    /// shrink, and every key is found, compared and read back whole after that.
    #[test]
    fn a_key_outside_the_shared_prefix_is_kept_whole() {
        let mut set = PendingSet::under("q/ü/");
        for (key, time) in [("q/ü/b", 2), ("q/ü/a", 1)] {
            set.push_line(incoming(key, time, ""));
        }
        set.finish_line();
        assert_eq!(set.keys.bytes, "ba");
        set.insert(incoming("q/üx", 1, ""));
        set.insert(incoming("r", 0, ""));
        assert_eq!(set.keys.prefix, "");
        assert_eq!(keys(&set), ["r", "q/ü/a", "q/üx", "q/ü/b"]);
        assert!(["q/ü/a", "q/ü/b", "q/üx", "r"]
            .iter()
            .all(|key| set.contains(key)));
        assert!(!set.contains("q/ü/") && !set.contains("q/"));
        assert_eq!(set.keys_but(|key| key.starts_with("q/ü/")), ["q/üx", "r"]);
        assert_eq!(
            set.take("q/ü/b").unwrap().value.as_deref(),
            Some("q/ü/b".as_bytes())
        );
    }

    /// The line comes out in claim order (ties by key), merged with tasks added later;
    /// a task dropped or taken from anywhere is gone, the others keep their order.
    #[test]
    fn the_line_and_later_arrivals_come_out_merged_in_claim_order() {
        let mut set = PendingSet::default();
        for (key, time) in [("c", 3), ("a", 1), ("b2", 2), ("b1", 2), ("e", 5)] {
            set.push_line(incoming(key, time, ""));
        }
        set.finish_line();
        assert_eq!(keys(&set), ["a", "b1", "b2", "c", "e"]);
        set.insert(incoming("d", 4, ""));
        set.insert(incoming("0", 0, ""));
        assert_eq!(keys(&set), ["0", "a", "b1", "b2", "c", "d", "e"]);
        assert!(set.remove("c"));
        assert!(!set.remove("c"));
        assert_eq!(set.take("d").unwrap().value.as_deref(), Some(&b"d"[..]));
        assert_eq!(set.pop_first().unwrap().key, "0");
        assert_eq!(set.pop_first().unwrap().key, "a");
        assert_eq!(keys(&set), ["b1", "b2", "e"]);
        assert_eq!(set.len(), 3);
        // A key added again replaces its task, in its new place.
        set.insert(incoming("e", 1, ""));
        assert_eq!(keys(&set), ["e", "b1", "b2"]);
        assert_eq!(set.version("e"), Some(TaskVersion(1)));
        assert!(set.contains("b2") && !set.contains("a"));
    }

    /// Through many takes and drops (the key buffer and the line written again to shed
    /// what was dropped), every task left keeps its key, value, group and place.
    #[test]
    fn dropping_most_of_a_large_set_keeps_the_rest_whole() {
        let names: Vec<String> = (0..20_000).map(|n| format!("q/task_{n:05}")).collect();
        let mut set = PendingSet::default();
        for (n, key) in names.iter().enumerate() {
            let group = if n.is_multiple_of(2) { "even" } else { "odd" };
            set.push_line(incoming(key, n as i64, group));
        }
        set.finish_line();
        for key in names.iter().skip(1).step_by(3) {
            set.remove(key);
        }
        for _ in 0..9_000 {
            set.pop_first();
        }
        let left: Vec<String> = names
            .iter()
            .enumerate()
            .filter(|(n, _)| n % 3 != 1)
            .skip(9_000)
            .map(|(_, key)| key.clone())
            .collect();
        assert_eq!(keys(&set), left);
        for (n, out) in set.iter().enumerate() {
            assert_eq!(out.value, Some(out.key.as_bytes()), "{n}");
            let number: usize = out.key["q/task_".len()..].parse().unwrap();
            assert_eq!(
                out.group,
                if number.is_multiple_of(2) {
                    "even"
                } else {
                    "odd"
                }
            );
        }
        assert!(set.has_kind(|kind| kind == "T"));
    }
}
