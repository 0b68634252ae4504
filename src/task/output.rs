//! Kept output: what an exec handler's run printed, the last `[queue] output_limit` bytes of
//! its stdout and of its stderr, kept as one record per attempt (where: `queue/output.rs`,
//! which also writes it; deleted with the history record of the task's completion,
//! `queue/history.rs`).
//!
//! Text: each stream's kept bytes are stored as lossy UTF-8 text ([`text`]): the cut may
//! fall inside a character, whose remaining bytes are dropped, and bytes that are not
//! UTF-8 become U+FFFD. Programs that print binary should not rely on kept output.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use serde::{Deserialize, Serialize};

use crate::coord::FencingToken;

/// The largest `[queue] output_limit`: two streams this long, escaped in JSON, still fit
/// the smallest value a backend takes (Consul's 512 KiB).
pub const MAX_OUTPUT_LIMIT: usize = 128 * 1024;

/// What one run printed, as kept.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputRecord {
    /// The run's number (1 for the first).
    pub attempt: u32,
    /// How the run ended (`task::attempts`' words: completed, failed, interrupted,
    /// cancelled).
    pub outcome: String,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339.
    pub finished_at: String,
    #[serde(default)]
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<FencingToken>,
    /// The end of the run's stdout, as text ([`text`]).
    #[serde(default)]
    pub stdout: String,
    /// Bytes of stdout printed before the kept end.
    #[serde(default)]
    pub stdout_dropped: u64,
    #[serde(default)]
    pub stderr: String,
    #[serde(default)]
    pub stderr_dropped: u64,
    /// Why the record was cut further than `output_limit` (the coordinator refused it as
    /// too large), if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl OutputRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an output record serializes")
    }

    /// A record as stored; `None` for a value that is not one.
    pub fn decode(value: &[u8]) -> Option<OutputRecord> {
        serde_json::from_slice(value).ok()
    }

    /// Whether the run printed nothing at all (then no record is written).
    pub fn is_empty(&self) -> bool {
        self.stdout.is_empty()
            && self.stderr.is_empty()
            && self.stdout_dropped == 0
            && self.stderr_dropped == 0
    }

    /// Cuts each stream to its last `keep` bytes (on a character boundary), counting what
    /// goes as dropped, and says why in the note: for a record the coordinator refused.
    pub fn shorten(&mut self, keep: usize, why: &str) {
        for (stream, dropped) in [
            (&mut self.stdout, &mut self.stdout_dropped),
            (&mut self.stderr, &mut self.stderr_dropped),
        ] {
            let tail = tail_on_boundary(stream, keep);
            *dropped += (stream.len() - tail.len()) as u64;
            *stream = tail.to_string();
        }
        self.note = Some(format!(
            "cut to the last {keep} bytes of each stream: {why}"
        ));
    }
}

/// The kept end of a stream as text: lossy UTF-8, starting after any bytes of a character
/// the cut fell inside (at most three continuation bytes).
pub fn text(bytes: &[u8]) -> String {
    let skip = bytes
        .iter()
        .take(3)
        .take_while(|b| (0x80..0xC0).contains(*b))
        .count();
    String::from_utf8_lossy(&bytes[skip..]).into_owned()
}

/// The last `keep` bytes of `text`, or fewer, to start on a character boundary.
fn tail_on_boundary(text: &str, keep: usize) -> &str {
    let mut start = text.len().saturating_sub(keep);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cut inside a character drops what is left of it; other bad bytes become U+FFFD.
    #[test]
    fn kept_bytes_become_lossy_text_from_a_character_boundary() {
        let euro = "€".as_bytes();
        assert_eq!(text(&[&euro[1..], b"ok".as_slice()].concat()), "ok");
        assert_eq!(text(b"a\xffb"), "a\u{fffd}b");
        assert_eq!(text("é€".as_bytes()), "é€");
        assert_eq!(text(b""), "");
    }

    /// Shortening keeps the end of each stream on a character boundary and counts the rest.
    #[test]
    fn shortening_keeps_each_streams_end_and_counts_what_goes() {
        let mut record = OutputRecord {
            stdout: "abcdef".into(),
            stdout_dropped: 10,
            stderr: "x€".into(),
            ..OutputRecord::default()
        };
        record.shorten(2, "too large");
        assert_eq!(record.stdout, "ef");
        assert_eq!(record.stdout_dropped, 14);
        assert_eq!(record.stderr, "");
        assert_eq!(record.stderr_dropped, 4);
        assert!(record.note.unwrap().contains("too large"));
        assert!(OutputRecord::default().is_empty());
    }
}
