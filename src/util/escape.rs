//! Escaping of stored text for logs and terminals: keys, task ids and error texts come
//! from producers and handlers and may hold a newline, a carriage return or an ANSI escape
//! sequence that would forge a log line or rewrite the operator's terminal.

use std::borrow::Cow;
use std::fmt::{self, Write as _};

/// A `fmt::Write` that escapes what [`escape`] escapes while it streams.
pub struct Escaping<'a, W: fmt::Write>(pub &'a mut W);

impl<W: fmt::Write> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut rest = text;
        while let Some(at) = rest.find(needs_escape) {
            self.0.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().expect("found a char there");
            write_escaped(self.0, c)?;
            rest = &rest[at + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

/// Whether a character could break a line or move, recolor or reorder what a terminal or a
/// log viewer shows: control characters (C0, DEL, C1: newlines, ANSI escapes), Unicode's
/// line and paragraph separators, and the bidirectional formatting characters.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'
                ..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

fn write_escaped(out: &mut impl fmt::Write, c: char) -> fmt::Result {
    match c {
        '\n' => out.write_str("\\n"),
        '\r' => out.write_str("\\r"),
        '\t' => out.write_str("\\t"),
        c => write!(out, "\\u{{{:x}}}", c as u32),
    }
}

/// `text` with every character that could forge a line or a terminal sequence written as an
/// escape (`\n`, `\r`, `\t`, `\u{1b}`); other text, backslashes included, is unchanged.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.contains(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    Escaping(&mut out)
        .write_str(text)
        .expect("writing to a String does not fail");
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `escape` rewrites only what could forge a line or a terminal sequence.
    #[test]
    fn escape_rewrites_only_dangerous_characters() {
        assert!(matches!(escape("oracleTask/a-b_c.d é"), Cow::Borrowed(_)));
        assert_eq!(escape("a\nb\rc\td"), r"a\nb\rc\td");
        assert_eq!(escape("\u{1b}[2J\u{7f}\u{9b}"), r"\u{1b}[2J\u{7f}\u{9b}");
        assert_eq!(escape("x\u{202e}y\u{2029}"), r"x\u{202e}y\u{2029}");
        assert_eq!(escape(r"C:\path"), r"C:\path");
    }
}
