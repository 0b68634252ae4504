//! Pure: the pending tasks of the leader's backlog, in claim order, held compactly so that a
//! backlog of a million waiting tasks fits in a small leader (`backlog.rs` uses it).
//!
//! A pending task is held as its place in claim order (priority, `taskTime`, creation: a
//! [`Place`] of 32 bytes in one vector), and beside it a [`Slot`] of 32 bytes (its version,
//! its type and group as small numbers, where its place is); its key is kept once, in one
//! buffer of keys ([`Arena`]), and found again through a table of slot numbers hashed by
//! key; its value, while it is held (a large backlog holds its front's), in a map by slot.
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
    pub key: &'a str,
    pub order: Order,
    pub version: TaskVersion,
    /// Its value, when held (a large backlog holds only its front's).
    pub value: Option<&'a [u8]>,
    pub kind: &'a str,
    pub group: &'a str,
}

/// A place in the line: the order and the slot it points to (`u32::MAX`: left empty).
#[derive(Clone, Copy, Debug)]
struct Place {
    order: Order,
    slot: u32,
}

const EMPTY: u32 = u32::MAX;

/// What is kept of a pending task beside its place.
#[derive(Debug)]
struct Slot {
    key: Span,
    version: TaskVersion,
    kind: u32,
    group: u32,
    /// Where its place is: in the line (at this index), or among the later arrivals.
    at: At,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    Line(u32),
    Later,
    /// A slot free for reuse.
    Free,
}

/// A key in the arena: its offset and length.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u32,
    len: u32,
}

/// Every held key, one after another in one buffer; keys of dropped tasks stay as garbage
/// until it is more than the live keys, then the buffer is written again.
#[derive(Debug, Default)]
struct Arena {
    bytes: String,
    garbage: usize,
}

impl Arena {
    fn push(&mut self, key: &str) -> Span {
        let start = u32::try_from(self.bytes.len()).expect("keys under 4 GiB");
        self.bytes.push_str(key);
        Span {
            start,
            len: u32::try_from(key.len()).expect("a key under 4 GiB"),
        }
    }

    fn get(&self, span: Span) -> &str {
        &self.bytes[span.start as usize..(span.start + span.len) as usize]
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
    live: usize,
    /// The values held, by slot: a large backlog holds only its front's.
    values: HashMap<u32, Box<[u8]>, KeyHash>,
    /// Tasks held without their value (read again before they are claimed).
    unfilled: usize,
}

impl PendingSet {
    /// Adds a task of a listing to the line (a task of its key already there is replaced);
    /// [`PendingSet::finish_line`] sorts the line once they are all in.
    pub fn push_line(&mut self, task: Incoming<'_>) {
        self.remove(task.key);
        let order = task.order;
        let slot = self.new_slot(task, At::Line(0));
        self.line.push(Place { order, slot });
    }

    /// Sorts the line pushed, in place: the listing's tasks in claim order.
    pub fn finish_line(&mut self) {
        self.line.retain(|place| place.slot != EMPTY);
        self.sort_line();
    }

    /// Sorts the line (every place in it: built, not yet consumed) and points the slots at
    /// their places.
    fn sort_line(&mut self) {
        let (slots, keys) = (&self.slots, &self.keys);
        self.line.sort_unstable_by(|a, b| {
            a.order.cmp(&b.order).then_with(|| {
                keys.get(slots[a.slot as usize].key)
                    .cmp(keys.get(slots[b.slot as usize].key))
            })
        });
        self.line.shrink_to_fit();
        for (n, place) in self.line.iter().enumerate() {
            self.slots[place.slot as usize].at = At::Line(n as u32);
        }
        // Grown by doubling while the listing came: the room left is given back.
        self.slots.shrink_to_fit();
        self.keys.bytes.shrink_to_fit();
        let (slots, keys, hash) = (&self.slots, &self.keys, &self.hash);
        self.index
            .shrink_to_fit(|&n| hash.hash_one(keys.get(slots[n as usize].key)));
    }

    fn new_slot(&mut self, task: Incoming<'_>, at: At) -> u32 {
        let slot = Slot {
            key: self.keys.push(task.key),
            version: task.version,
            kind: self.kinds.number(task.kind, &self.hash),
            group: self.groups.number(task.group, &self.hash),
            at,
        };
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
        self.index.insert_unique(hash.hash_one(task.key), n, |&n| {
            hash.hash_one(keys.get(slots[n as usize].key))
        });
        match task.value {
            Some(value) => {
                self.values.insert(n, value);
            }
            None => self.unfilled += 1,
        }
        self.live += 1;
        n
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
        self.find(key).map(|n| self.slots[n as usize].version)
    }

    fn find(&self, key: &str) -> Option<u32> {
        let (slots, keys) = (&self.slots, &self.keys);
        self.index
            .find(self.hash.hash_one(key), |&n| {
                keys.get(slots[n as usize].key) == key
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
        let key_hash = self.hash.hash_one(self.keys.get(slot.key));
        match slot.at {
            At::Line(at) => self.line[at as usize].slot = EMPTY,
            At::Later => {
                let key: Box<str> = self.keys.get(slot.key).into();
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
        slot.at = At::Free;
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
            let mut bytes = String::with_capacity(self.keys.bytes.len() - self.keys.garbage);
            for slot in self.slots.iter_mut().filter(|s| s.at != At::Free) {
                let start = bytes.len() as u32;
                bytes.push_str(self.keys.get(slot.key));
                slot.key.start = start;
            }
            self.keys = Arena { bytes, garbage: 0 };
        }
        if self.head > 4096 && self.head > self.line.len() / 2 {
            self.line.drain(..self.head);
            self.head = 0;
            self.line.shrink_to_fit();
            for (n, place) in self.line.iter().enumerate() {
                if place.slot != EMPTY {
                    self.slots[place.slot as usize].at = At::Line(n as u32);
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
            key: self.keys.get(slot.key),
            order,
            version: slot.version,
            value: self.values.get(&n).map(|value| &**value),
            kind: self.kinds.name(slot.kind),
            group: self.groups.name(slot.group),
        }
    }

    /// The pending tasks, front (next to claim) first.
    pub fn iter(&self) -> impl Iterator<Item = Out<'_>> + '_ {
        let mut line = self.head;
        let mut later = self.later.iter().peekable();
        std::iter::from_fn(move || {
            let next_line = self.line_from(line);
            let take_line = match (next_line, later.peek()) {
                (None, None) => return None,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((_, place)), Some(((order, key), _))) => {
                    let line_key = self.keys.get(self.slots[place.slot as usize].key);
                    (place.order, line_key).cmp(&(*order, &**key)) == Ordering::Less
                }
            };
            if take_line {
                let (at, place) = next_line?;
                line = at + 1;
                Some(self.out(place.order, place.slot))
            } else {
                let ((order, _), &n) = later.next()?;
                Some(self.out(*order, n))
            }
        })
    }

    /// The first pending task, out of the set: its key, order, version and value.
    pub fn pop_first(&mut self) -> Option<Popped> {
        let first = self.iter().next().map(|out| out.key.to_string())?;
        self.take(&first)
    }

    /// The pending task of `key`, out of the set.
    pub fn take(&mut self, key: &str) -> Option<Popped> {
        let n = self.find(key)?;
        let slot = &self.slots[n as usize];
        let order = match slot.at {
            At::Line(at) => self.line[at as usize].order,
            At::Later => *self.later_orders.get(&n)?,
            At::Free => return None,
        };
        let (version, at) = (slot.version, slot.at);
        let kind = self.kinds.name(slot.kind).to_string();
        let group = self.groups.name(slot.group).to_string();
        if let At::Line(at) = at {
            if at as usize == self.head {
                self.head += 1;
            }
        }
        let popped = Popped {
            key: key.to_string(),
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
        self.iter()
            .take(n)
            .filter(|out| out.value.is_none())
            .map(|out| out.key.to_string())
            .collect()
    }

    /// Gives the pending task of `key` its value, if it is still at `version` (else the
    /// answer is false: the task is another now, or gone).
    pub fn fill(&mut self, key: &str, version: TaskVersion, value: Box<[u8]>) -> bool {
        match self.find(key) {
            Some(n) if self.slots[n as usize].version == version => {
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
                .any(|slot| slot.at != At::Free && wanted.contains(&slot.kind))
    }

    /// The pending tasks, taken out in claim order.
    pub fn into_pending(mut self) -> impl Iterator<Item = Popped> {
        std::iter::from_fn(move || self.pop_first())
    }

    /// Every pending task's key.
    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.slots
            .iter()
            .filter(|slot| slot.at != At::Free)
            .map(|slot| self.keys.get(slot.key))
    }
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
        set.iter().map(|out| out.key.to_string()).collect()
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
