//! The end of a stream: the last `keep` bytes of everything pushed, in memory that never
//! grows past `keep` plus one read, however much a handler prints; and how many bytes
//! came before them.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::collections::VecDeque;

/// The last bytes of a stream.
#[derive(Clone, Debug, Default)]
pub struct Tail {
    keep: usize,
    bytes: VecDeque<u8>,
    dropped: u64,
}

impl Tail {
    /// Keeps the last `keep` bytes (0: none, only counting).
    pub fn new(keep: usize) -> Tail {
        Tail {
            keep,
            bytes: VecDeque::new(),
            dropped: 0,
        }
    }

    /// Adds what was read; drops from the front what is past `keep`.
    pub fn push(&mut self, read: &[u8]) {
        let read = match read.len().checked_sub(self.keep) {
            // More than is kept in one read: only its end stays, and nothing before it.
            Some(over) => {
                self.dropped += (self.bytes.len() + over) as u64;
                self.bytes.clear();
                &read[over..]
            }
            None => read,
        };
        self.bytes.extend(read);
        if let Some(over) = self.bytes.len().checked_sub(self.keep) {
            self.bytes.drain(..over);
            self.dropped += over as u64;
        }
    }

    /// The kept end, and how many bytes came before it.
    pub fn into_parts(self) -> (Vec<u8>, u64) {
        (self.bytes.into(), self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever the reads, the last `keep` bytes stay and the rest is counted.
    #[test]
    fn keeps_the_last_bytes_and_counts_the_rest() {
        let mut tail = Tail::new(4);
        tail.push(b"ab");
        tail.push(b"cde");
        assert_eq!(tail.clone().into_parts(), (b"bcde".to_vec(), 1));
        tail.push(b"0123456789");
        assert_eq!(tail.clone().into_parts(), (b"6789".to_vec(), 11));
        tail.push(b"");
        tail.push(b"x");
        assert_eq!(tail.into_parts(), (b"789x".to_vec(), 12));
        let mut none = Tail::new(0);
        none.push(b"abc");
        assert_eq!(none.into_parts(), (Vec::new(), 3));
    }

    /// A stream far longer than the cap never holds more than the cap.
    #[test]
    fn memory_stays_at_the_cap_however_much_is_printed() {
        let mut tail = Tail::new(1000);
        let chunk = [b'x'; 4096];
        for _ in 0..2_000 {
            tail.push(&chunk);
            assert!(tail.bytes.len() <= 1000);
        }
        let (kept, dropped) = tail.into_parts();
        assert_eq!(kept.len(), 1000);
        assert_eq!(dropped, 4096 * 2_000 - 1000);
    }
}
