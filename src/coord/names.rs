//! Keys as a look reads them: every key under a prefix, packed into one buffer.
//!
//! A look at a large backlog reads every key of the queue while the leader holds the
//! backlog itself. As a `Vec<String>`, 100k keys of 25 bytes took 56 bytes each in string
//! headers and allocations, and a backend that had them as bytes first (a reply, a page)
//! held both for a while; packed, they take their bytes and one offset each.

use std::fmt;

/// Keys under a prefix, in the order the coordinator gave them, packed: their bytes one
/// after another and where each ends.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Names {
    text: String,
    ends: Vec<usize>,
}

impl Names {
    /// No keys.
    pub fn new() -> Names {
        Names::default()
    }

    /// Room for `count` keys of `bytes` bytes in all.
    pub fn with_capacity(count: usize, bytes: usize) -> Names {
        Names {
            text: String::with_capacity(bytes),
            ends: Vec::with_capacity(count),
        }
    }

    /// Adds `name` after the others.
    pub fn push(&mut self, name: &str) {
        self.text.push_str(name);
        self.ends.push(self.text.len());
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The keys, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + Clone + '_ {
        (0..self.ends.len()).map(|i| {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            &self.text[start..self.ends[i]]
        })
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

impl fmt::Debug for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<S: AsRef<str>> PartialEq<[S]> for Names {
    fn eq(&self, other: &[S]) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| a == b.as_ref())
    }
}

impl<S: AsRef<str>> PartialEq<Vec<S>> for Names {
    fn eq(&self, other: &Vec<S>) -> bool {
        *self == other[..]
    }
}

impl<S: AsRef<str>, const N: usize> PartialEq<[S; N]> for Names {
    fn eq(&self, other: &[S; N]) -> bool {
        *self == other[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_back_as_pushed_in_order() {
        let mut names = Names::with_capacity(3, 8);
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
}
