//! House rules checked on every test run: every source file opens with a `//!` header
//! saying what it owns, and a file over `LONG_FILE` lines says why at its top (a header
//! line starting `//! Size:`), so size is a decision, not an accident; and no `.unwrap()`
//! outside tests, so that nothing a user, a producer or a server sends can panic a
//! process (an `.expect("...")` is allowed where the message states the invariant that
//! makes it safe, such as "a JSON object serializes"); and the walls between modules
//! (`operate` and `ui` import nothing above them).

use std::path::{Path, PathBuf};

/// Past this many lines a file must say why it is that long.
const LONG_FILE: usize = 600;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every source file under src/ as (its path below src/, its text).
fn source_texts() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file).expect("read source");
            let name = file
                .strip_prefix(&root)
                .unwrap_or(&file)
                .display()
                .to_string();
            (name, text)
        })
        .collect()
}

/// Every module opens with a doc comment, and every long file gives its reason.
#[test]
fn every_module_has_a_header_and_long_files_say_why() {
    let mut problems = Vec::new();
    for (name, text) in source_texts() {
        if !text.starts_with("//!") {
            problems.push(format!("{name}: no //! header saying what it owns"));
        }
        let lines = text.lines().count();
        let header: Vec<&str> = text.lines().take_while(|l| l.starts_with("//!")).collect();
        if lines > LONG_FILE && !header.iter().any(|l| l.starts_with("//! Size:")) {
            problems.push(format!(
                "{name}: {lines} lines, over {LONG_FILE}, with no `//! Size:` line saying why"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The code of `text` before its first `#[cfg(test)]`, unless the whole file is tests.
fn non_test_code<'a>(name: &str, text: &'a str) -> &'a str {
    if name.ends_with("tests.rs") || name.contains("/tests/") || name == "tidy.rs" {
        return "";
    }
    text.find("#[cfg(test)]").map_or(text, |at| &text[..at])
}

/// No `.unwrap()` outside tests: errors are handled or refused with a message, and an
/// invariant that cannot break is an `.expect` that says which.
#[test]
fn no_unwrap_outside_tests() {
    let mut problems = Vec::new();
    for (name, text) in source_texts() {
        for (n, line) in non_test_code(&name, &text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains(".unwrap()") {
                problems.push(format!("{name}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "`.unwrap()` outside tests (handle the error, or `.expect(\"the invariant\")`):\n{}",
        problems.join("\n")
    );
}

/// The walls between modules that keep them free of cycles: the operator's verbs
/// (`operate`) stand below the dashboard, the services, the tools and the server, and the
/// dashboard calls `operate`, never `service` (which starts the dashboard).
#[test]
fn operate_and_ui_stay_inside_their_walls() {
    let walls: [(&str, &[&str]); 2] = [
        (
            "operate/",
            &[
                "crate::ui",
                "crate::service",
                "crate::tools",
                "crate::server",
            ],
        ),
        ("ui/", &["crate::service"]),
    ];
    let mut problems = Vec::new();
    for (name, text) in source_texts() {
        for (dir, forbidden) in walls {
            if !name.starts_with(dir) {
                continue;
            }
            for (n, line) in text.lines().enumerate() {
                if let Some(path) = forbidden.iter().find(|path| line.contains(*path)) {
                    problems.push(format!("{name}:{}: uses {path}", n + 1));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
