//! Keys as a look reads them: every key under a prefix, packed into one buffer.
//!
//! A look at a large backlog reads every key of the queue while the leader holds the
//! backlog itself. As a `Vec<String>`, 100k keys of 25 bytes took 56 bytes each in string
//! headers and allocations, and a backend that had them as bytes first (a reply, a page)
//! held both for a while. Packed, they take the bytes after the prefix they share (kept
//! once) and four bytes each for where they end: a million keys of `oracleTask/` and seven
//! characters take 11 MB, not 26.

use std::fmt;
use std::hash::BuildHasher;

use hashbrown::HashTable;

/// Keys in the order the coordinator gave them, packed: the prefix they all share, once,
/// then the rest of each, one after another, and where each ends.
#[derive(Clone, Default)]
pub struct Names {
    prefix: String,
    text: String,
    ends: Vec<u32>,
}

impl Names {
    /// No keys.
    pub fn new() -> Names {
        Names::default()
    }

    /// No keys yet; those to come are under `prefix` (kept once). A key that is not is
    /// still kept whole: the shared prefix shrinks to fit it.
    pub fn under(prefix: &str) -> Names {
        Names {
            prefix: prefix.to_string(),
            ..Names::default()
        }
    }

    /// [`Names::under`], with room for `count` keys of `bytes` bytes in all.
    pub fn with_capacity(prefix: &str, count: usize, bytes: usize) -> Names {
        let rest = bytes.saturating_sub(count.saturating_mul(prefix.len()));
        Names {
            prefix: prefix.to_string(),
            text: String::with_capacity(rest),
            ends: Vec::with_capacity(count),
        }
    }

    /// Adds `name` after the others.
    pub fn push(&mut self, name: &str) {
        if !name.starts_with(&self.prefix) {
            self.share_less(name);
        }
        self.text.push_str(&name[self.prefix.len()..]);
        let end = u32::try_from(self.text.len()).expect("the keys of one look under 4 GiB");
        self.ends.push(end);
    }

    /// Shrinks the shared prefix to what it shares with `name`, putting the rest of it
    /// back in front of every key held (once per character given back, at most).
    fn share_less(&mut self, name: &str) {
        let given_back = self.prefix.split_off(shared_len(&self.prefix, name));
        let old = std::mem::take(self);
        let mut names = Names {
            prefix: old.prefix.clone(),
            text: String::with_capacity(old.text.len() + old.ends.len() * given_back.len()),
            ends: Vec::with_capacity(old.ends.capacity()),
        };
        for (start, end) in old.spans() {
            names.text.push_str(&given_back);
            names.text.push_str(&old.text[start..end]);
            let end = u32::try_from(names.text.len()).expect("the keys of one look under 4 GiB");
            names.ends.push(end);
        }
        *self = names;
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Where each key's rest is in the text.
    fn spans(&self) -> impl ExactSizeIterator<Item = (usize, usize)> + Clone + '_ {
        (0..self.ends.len()).map(|i| {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            (start as usize, self.ends[i] as usize)
        })
    }

    /// Hands each key, whole, to `each`, in order, without making a string of each: the
    /// leader's comparison of a look with its backlog.
    pub fn each(&self, mut each: impl FnMut(&str)) {
        let mut key = self.prefix.clone();
        for (start, end) in self.spans() {
            key.truncate(self.prefix.len());
            key.push_str(&self.text[start..end]);
            each(&key);
        }
    }

    /// The keys, whole, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = String> + Clone + '_ {
        self.spans()
            .map(|(start, end)| format!("{}{}", self.prefix, &self.text[start..end]))
    }

    /// The keys as a set, to ask whether a key is among them (a look's comparison with a
    /// large backlog): four bytes and a control byte a key, beside them.
    pub fn set(&self) -> NameSet<'_> {
        let hash = NameHash::default();
        let mut table = HashTable::with_capacity(self.len());
        for (n, (start, end)) in self.spans().enumerate() {
            let rest = &self.text[start..end];
            let n = u32::try_from(n).expect("under 4 billion keys");
            table.insert_unique(hash.hash_one(rest), n, |&m| hash.hash_one(self.rest(m)));
        }
        NameSet {
            names: self,
            table,
            hash,
        }
    }

    /// The rest of key `n`, after the shared prefix.
    fn rest(&self, n: u32) -> &str {
        let n = n as usize;
        let start = if n == 0 { 0 } else { self.ends[n - 1] as usize };
        &self.text[start..self.ends[n] as usize]
    }

    /// Whether every key is one of `others`, in the same order.
    fn same_as<S: AsRef<str>>(&self, others: &[S]) -> bool {
        self.len() == others.len()
            && self.spans().zip(others).all(|((start, end), other)| {
                other
                    .as_ref()
                    .strip_prefix(self.prefix.as_str())
                    .is_some_and(|rest| rest == &self.text[start..end])
            })
    }
}

/// How much of `prefix` starts `key` too, cut to whole characters: what a shared prefix
/// shrinks to for a key outside it (here, and the pending set's keys).
pub fn shared_len(prefix: &str, key: &str) -> usize {
    let mut keep = prefix
        .bytes()
        .zip(key.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    while !key.is_char_boundary(keep) {
        keep -= 1;
    }
    keep
}

/// The hash of a [`NameSet`]: seeded per process, fast on short keys.
type NameHash = foldhash::fast::RandomState;

/// A look's keys as a set ([`Names::set`]).
pub struct NameSet<'a> {
    names: &'a Names,
    /// Key numbers, hashed by their rest.
    table: HashTable<u32>,
    hash: NameHash,
}

impl NameSet<'_> {
    /// Whether `key` is one of the keys.
    pub fn contains(&self, key: &str) -> bool {
        let Some(rest) = key.strip_prefix(self.names.prefix.as_str()) else {
            return false;
        };
        self.table
            .find(self.hash.hash_one(rest), |&n| self.names.rest(n) == rest)
            .is_some()
    }
}

impl<S: AsRef<str>> FromIterator<S> for Names {
    fn from_iter<I: IntoIterator<Item = S>>(names: I) -> Names {
        let mut packed = Names::new();
        packed.extend(names);
        packed
    }
}

impl<S: AsRef<str>> Extend<S> for Names {
    fn extend<I: IntoIterator<Item = S>>(&mut self, names: I) {
        for name in names {
            self.push(name.as_ref());
        }
    }
}

/// The same keys in the same order, however much of them each shares once.
impl PartialEq for Names {
    fn eq(&self, other: &Names) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Names {}

impl fmt::Debug for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<S: AsRef<str>> PartialEq<[S]> for Names {
    fn eq(&self, other: &[S]) -> bool {
        self.same_as(other)
    }
}

impl<S: AsRef<str>> PartialEq<Vec<S>> for Names {
    fn eq(&self, other: &Vec<S>) -> bool {
        self.same_as(other)
    }
}

impl<S: AsRef<str>, const N: usize> PartialEq<[S; N]> for Names {
    fn eq(&self, other: &[S; N]) -> bool {
        self.same_as(other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_back_as_pushed_in_order() {
        let mut names = Names::with_capacity("", 3, 8);
        for name in ["q/a", "", "q/ü-long"] {
            names.push(name);
        }
        assert_eq!(names.len(), 3);
        assert_eq!(names.iter().collect::<Vec<_>>(), ["q/a", "", "q/ü-long"]);
        assert_eq!(names, ["q/a", "", "q/ü-long"]);
        assert_ne!(names, ["q/a", "", "q/ü-lon"]);
        assert_ne!(names, ["q/a", ""]);
        assert_eq!(format!("{names:?}"), r#"["q/a", "", "q/ü-long"]"#);
    }

    #[test]
    fn none_is_empty() {
        let names = Names::new();
        assert!(names.is_empty());
        assert_eq!(names.iter().count(), 0);
        assert_eq!(names, Vec::<String>::new());
        assert_eq!(["a", "b"].into_iter().collect::<Names>(), ["a", "b"]);
    }

    /// Keys under the prefix keep only their rest; one that is not under it is kept whole,
    /// the shared part shrinking (never inside a character), and every key reads the same.
    #[test]
    fn the_prefix_is_kept_once_and_shrinks_for_a_key_outside_it() {
        let mut names = Names::under("q/ü/");
        names.extend(["q/ü/a", "q/ü/bb"]);
        assert_eq!(names.text, "abb");
        names.push("q/ü");
        names.push("q/üx/c");
        names.push("r");
        let keys = ["q/ü/a", "q/ü/bb", "q/ü", "q/üx/c", "r"];
        assert_eq!(names, keys);
        assert_eq!(names.prefix, "");
        let mut each = Vec::new();
        names.each(|key| each.push(key.to_string()));
        assert_eq!(each, keys);
        assert_eq!(names, keys.into_iter().collect::<Names>());
        let set = names.set();
        assert!(keys.iter().all(|key| set.contains(key)));
        assert!(!set.contains("q/ü/") && !set.contains("q/üx/cc") && !set.contains(""));
        let mut cut = Names::under("q/é");
        cut.push("q/è");
        assert_eq!((cut.prefix.as_str(), cut.text.as_str()), ("q/", "è"));
    }
}
