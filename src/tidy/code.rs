//! What the house rules read of a source file: its code without its tests. Each item
//! marked `#[cfg(test)]` is left out on its own (a test module, or a helper above the real
//! code), so nothing below an early test-only item escapes the rules; the rules themselves
//! are in `tidy.rs`.

use super::crate_imports;

/// The code of `text` with what only tests compile blanked out: each item marked
/// `#[cfg(test)]` (a `mod tests { .. }` to its closing brace, a `mod tests;`, a helper fn,
/// impl or use) from the attribute to its end, the rest kept, so that code below an early
/// test-only item is still read. Blanked text keeps its newlines, so every line keeps its
/// number for a report. A file of tests alone gives nothing.
pub(super) fn non_test_code(name: &str, text: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    if name.ends_with("tests.rs")
        || name.contains("/tests/")
        || (name == "tidy.rs" || name.starts_with("tidy/"))
    {
        return String::new();
    }
    let mut code = text.as_bytes().to_vec();
    let mut from = 0;
    while let Some(at) = text[from..].find(MARK).map(|at| from + at) {
        let line_start = text[..at].rfind('\n').map_or(0, |n| n + 1);
        // An attribute starts its line; the words in a comment or a string do not mark
        // anything, and reading on past them only checks more.
        if !text[line_start..at].trim().is_empty() {
            from = at + MARK.len();
            continue;
        }
        let end = item_end(text, at + MARK.len());
        for byte in &mut code[at..end] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
        from = end;
    }
    // Only whole characters were blanked (both ends are at ASCII tokens), so the text is
    // still UTF-8.
    String::from_utf8(code).expect("blanking whole characters keeps UTF-8")
}

/// The functions in `code` (as `non_test_code` gives it): for each, the line its `fn` is
/// on, its name, and how many lines it spans, from that line to its closing brace (or
/// its `;`, for a declaration without a body).
pub(super) fn function_lengths(code: &str) -> Vec<(usize, String, usize)> {
    const QUALIFIERS: &[&str] = &[
        "pub(super) ",
        "pub(crate) ",
        "pub ",
        "async ",
        "const ",
        "unsafe ",
    ];
    let mut found = Vec::new();
    let mut offset = 0;
    for (n, line) in code.split_inclusive('\n').enumerate() {
        let start = offset + (line.len() - line.trim_start().len());
        offset += line.len();
        let mut rest = line.trim_start();
        while let Some(after) = QUALIFIERS.iter().find_map(|q| rest.strip_prefix(q)) {
            rest = after;
        }
        let Some(after) = rest.strip_prefix("fn ") else {
            continue;
        };
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let end = item_end(code, start);
        let lines = code[start..end].matches('\n').count() + 1;
        found.push((n + 1, name, lines));
    }
    found
}

/// Where the item that starts at `from` ends: past its `;` or its body's closing brace at
/// the item's own depth, or, for a field, a variant or a match arm (no item keyword), past
/// its `,` or just before the bracket that closes its list. Comments, strings and
/// character literals are skipped, so a brace inside them counts for nothing.
fn item_end(text: &str, from: usize) -> usize {
    const ITEM_WORDS: &[&str] = &[
        "pub",
        "fn",
        "impl",
        "mod",
        "use",
        "struct",
        "enum",
        "trait",
        "const",
        "static",
        "type",
        "async",
        "unsafe",
        "extern",
        "macro_rules",
        "let",
    ];
    let bytes = text.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut depth = 0usize;
    let mut is_item = None;
    let mut i = from;
    while i < bytes.len() {
        let b = bytes[i];
        let next = bytes.get(i + 1).copied();
        match b {
            b'/' if next == Some(b'/') => {
                i = text[i..].find('\n').map_or(bytes.len(), |n| i + n);
                continue;
            }
            b'/' if next == Some(b'*') => {
                let mut nested = 0usize;
                while i < bytes.len() {
                    if text[i..].starts_with("/*") {
                        nested += 1;
                        i += 2;
                    } else if text[i..].starts_with("*/") {
                        nested -= 1;
                        i += 2;
                        if nested == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                continue;
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'r' if (i == 0 || !ident(bytes[i - 1]) || bytes[i - 1] == b'b')
                && matches!(next, Some(b'#' | b'"')) =>
            {
                let hashes = text[i + 1..].bytes().take_while(|&c| c == b'#').count();
                if bytes.get(i + 1 + hashes) == Some(&b'"') {
                    let close = format!("\"{}", "#".repeat(hashes));
                    let body = i + 2 + hashes;
                    i = text[body..]
                        .find(&close)
                        .map_or(bytes.len(), |n| body + n + close.len());
                    continue;
                }
            }
            b'\'' => {
                // A character literal ('x', '\n', '\u{..}'); a lifetime ('a) has no
                // closing quote right after its first character.
                if next == Some(b'\\') {
                    i = text[i + 3..].find('\'').map_or(bytes.len(), |n| i + 3 + n);
                } else if let Some(c) = text[i + 1..].chars().next() {
                    if text[i + 1 + c.len_utf8()..].starts_with('\'') {
                        i += c.len_utf8() + 1;
                    }
                }
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                if depth == 0 {
                    return i;
                }
                depth -= 1;
                if depth == 0 && b == b'}' {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            b',' if depth == 0 && is_item == Some(false) => return i + 1,
            _ if depth == 0 && is_item.is_none() && ident(b) => {
                let word: String = text[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                is_item = Some(ITEM_WORDS.contains(&word.as_str()));
                i += word.len();
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    bytes.len()
}

/// Code below an earlier test-only item is still read: only test modules and the single
/// items marked `#[cfg(test)]` are left out, and every line keeps its number.
#[test]
fn code_below_an_earlier_test_item_is_still_read() {
    let text = r#"//! A module.
#[cfg(test)]
mod scripted;
#[cfg(test)]
fn helper() -> u8 {
    Some(1).unwrap()
}
use crate::server::Store;
fn real() -> u8 {
    Some(2).unwrap()
}
#[cfg(test)]
#[path = "x_tests.rs"]
mod tests {
    use crate::ui::View;
    fn braces() -> (char, &'static str) {
        ('}', "}")
    }
}
use crate::task::Task;
"#;
    let code = non_test_code("queue/x.rs", text);
    let imports = crate_imports(&code);
    assert_eq!(
        imports,
        [(8, "server".to_string()), (20, "task".to_string())]
    );
    let unwraps: Vec<usize> = code
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains(".unwrap()"))
        .map(|(n, _)| n + 1)
        .collect();
    assert_eq!(unwraps, [10]);
}

/// A function is measured from its `fn` line to its own closing brace: braces in strings,
/// characters and comments, and the blocks inside it, do not end it early.
#[test]
fn function_lengths_are_measured_to_the_closing_brace() {
    let text = r#"//! A module.
pub(super) async fn long(x: u8) -> u8 {
    let brace = '}';
    // a comment with a } in it
    let text = "}}";
    if x > 1 {
        return 2;
    }
    x
}
fn short() {}
trait T {
    fn declared(&self);
}
"#;
    let lengths: Vec<(usize, String, usize)> = function_lengths(text);
    assert_eq!(
        lengths,
        [
            (2, "long".to_string(), 9),
            (11, "short".to_string(), 1),
            (13, "declared".to_string(), 1)
        ]
    );
}
