//! House rules checked on every test run: every source file opens with a `//!` header
//! saying what it owns, and a file over `LONG_FILE` lines says why at its top (a header
//! line starting `//! Size:`), so size is a decision, not an accident; and no `.unwrap()`
//! outside tests, so that nothing a user, a producer or a server sends can panic a
//! process (an `.expect("...")` is allowed where the message states the invariant that
//! makes it safe, such as "a JSON object serializes"); and module headers and
//! ARCHITECTURE.md name only source files that exist, so a moved file leaves no stale map.

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

/// The source-file paths a text names: every word ending in `.rs` made of path characters
/// (`queue/plan.rs`, `src/coord/etcd/txn.rs`, `state.rs`), leaving out templates and globs
/// (`coord/<backend>/settings.rs`, `src/**/*.rs`) and words that are not files (`docs.rs/`).
fn named_paths(text: &str) -> Vec<&str> {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/');
    let mut found = Vec::new();
    for (at, _) in text.match_indices(".rs") {
        let end = at + ".rs".len();
        if text[end..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '/'))
        {
            continue; // `.rsx`, `docs.rs/…`: not the end of a file name
        }
        let start = text[..at]
            .char_indices()
            .rev()
            .take_while(|&(_, c)| is_path_char(c))
            .last()
            .map_or(at, |(i, _)| i);
        if text[..start]
            .chars()
            .next_back()
            .is_some_and(|c| matches!(c, '<' | '>' | '*' | '{' | '}' | '$' | ':'))
        {
            continue; // a template, a glob or a URL, not one file
        }
        let path = text[start..end].trim_start_matches("./");
        let file = path.rsplit('/').next().unwrap_or(path);
        if file.len() > ".rs".len() && !path.starts_with('/') && !path.contains("//") {
            found.push(path);
        }
    }
    found
}

/// Whether `path`, named in a file in `folder`, exists: below that folder or one of its
/// parents up to src/, or below the crate root when it starts there (`src/`, `tests/`,
/// `examples/`). A file `x.rs` also names its own folder `x/` for paths of its children.
fn path_exists(root: &Path, folder: &Path, own_dir: Option<&Path>, path: &str) -> bool {
    let src = root.join("src");
    if ["src/", "tests/", "examples/", "benches/"]
        .iter()
        .any(|top| path.starts_with(top))
    {
        return root.join(path).is_file();
    }
    if own_dir.is_some_and(|dir| dir.join(path).is_file()) {
        return true;
    }
    let mut dir = Some(folder);
    while let Some(d) = dir {
        if d.join(path).is_file() {
            return true;
        }
        if d == src || !d.starts_with(&src) {
            break;
        }
        dir = d.parent();
    }
    src.join(path).is_file()
}

/// The stale names in `text` (a file in `folder`), as `line: name` for a report.
fn stale_names(
    root: &Path,
    folder: &Path,
    own_dir: Option<&Path>,
    lines: impl Iterator<Item = (usize, String)>,
) -> Vec<String> {
    let mut stale = Vec::new();
    for (n, line) in lines {
        for path in named_paths(&line) {
            if !path_exists(root, folder, own_dir, path) {
                stale.push(format!("{n}: `{path}`"));
            }
        }
    }
    stale
}

/// Module headers and ARCHITECTURE.md name only source files that exist, so a file moved
/// or renamed cannot leave a map pointing at nothing.
#[test]
fn headers_and_the_architecture_name_only_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut problems = Vec::new();
    for (name, text) in source_texts() {
        let file = src.join(&name);
        let folder = file.parent().unwrap_or(&src);
        let own_dir = (!name.ends_with("mod.rs") && name != "lib.rs" && name != "main.rs")
            .then(|| file.with_extension(""));
        let headers = text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.trim_start().starts_with("//!"))
            .map(|(n, l)| (n + 1, l.to_string()));
        for stale in stale_names(root, folder, own_dir.as_deref(), headers) {
            problems.push(format!("src/{name}:{stale}"));
        }
    }
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let lines = map.lines().enumerate().map(|(n, l)| (n + 1, l.to_string()));
    for stale in stale_names(root, root, None, lines) {
        problems.push(format!("ARCHITECTURE.md:{stale}"));
    }
    assert!(
        problems.is_empty(),
        "named files that do not exist under src/ (fix the name, or name the folder):\n{}",
        problems.join("\n")
    );
}

/// The path finder takes file names in prose and code spans, and leaves out templates,
/// globs and URLs.
#[test]
fn named_paths_finds_file_names_and_skips_templates() {
    let text = "see `queue/plan.rs`, src/coord/etcd/txn.rs and state.rs. Not \
                coord/<backend>/settings.rs, src/**/*.rs, `.rs` files, docs.rs/x or \
                https://example.com/a.rs; but ./x/y.rs and mod.rs's header.";
    assert_eq!(
        named_paths(text),
        [
            "queue/plan.rs",
            "src/coord/etcd/txn.rs",
            "state.rs",
            "x/y.rs",
            "mod.rs"
        ]
    );
}
