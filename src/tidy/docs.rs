//! The documentation's house rules, checked on every test run: in README.md,
//! ARCHITECTURE.md and every `docs/*.md`, each relative link names a file that exists,
//! each `#anchor` (in the same page or another) names a heading of that page as GitHub
//! slugs it, and no prose line is wider than `WIDTH` characters. Code blocks and table
//! rows may be wider (a command or a row cannot always be cut); so may a line with no space
//! to break at (a long URL). Snippets themselves are run by `.ci/run` and by the tests that
//! read them (`coord/redis/scripts.rs`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// Prose lines wrap at this many characters.
const WIDTH: usize = 100;

/// The pages checked: README.md, ARCHITECTURE.md and every .md under docs/, as paths
/// relative to the crate root.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md"), PathBuf::from("ARCHITECTURE.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .map(|dir| {
            dir.filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|path| path.extension().is_some_and(|e| e == "md"))
                .filter_map(|path| path.strip_prefix(root).ok().map(Path::to_path_buf))
                .collect()
        })
        .unwrap_or_default();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The lines of `text` outside fenced code blocks, as (line number, line).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m && trimmed.trim_end() == m => fence = None,
            (None, None) => out.push((n + 1, line)),
            _ => {}
        }
    }
    out
}

/// `line` with its inline code spans blanked out, so a link written as code is not a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(c);
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// The targets of the inline links and images on `line` (`[text](target)`), and of a
/// reference definition (`[name]: target`).
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    if let Some(rest) = line.trim_start().strip_prefix('[') {
        if let Some((_, target)) = rest.split_once("]: ") {
            targets.push(target.split_whitespace().next().unwrap_or("").to_string());
        }
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 0usize;
        let end = after
            .char_indices()
            .find(|&(_, c)| match c {
                '(' => {
                    depth += 1;
                    false
                }
                ')' if depth == 0 => true,
                ')' => {
                    depth -= 1;
                    false
                }
                _ => false,
            })
            .map_or(after.len(), |(i, _)| i);
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
        rest = &after[end..];
    }
    targets
}

/// A heading's anchor as GitHub makes it: the text lowercased, links reduced to their
/// text, every character but letters, digits, spaces, `-` and `_` dropped, spaces made `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // `[text](target)` reads as `text`.
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|i| open + i) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|i| close + i) else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page: one per heading (a repeated heading gets `-1`, `-2`, as on
/// GitHub), plus any `<a id="...">` or `<a name="...">`.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(line[hashes..].trim().trim_end_matches('#'));
            let count = seen.entry(base.clone()).or_insert(0);
            anchors.insert(match *count {
                0 => base.clone(),
                n => format!("{base}-{n}"),
            });
            *count += 1;
        }
        for attr in ["<a id=\"", "<a name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attr) {
                let after = &rest[at + attr.len()..];
                if let Some(end) = after.find('"') {
                    anchors.insert(after[..end].to_string());
                }
                rest = after;
            }
        }
    }
    anchors
}

/// What is wrong with the pages (`files` maps each page's path from the crate root to its
/// text); `exists` says whether a path relative to the crate root names a file or folder.
fn problems(files: &HashMap<PathBuf, String>, exists: impl Fn(&Path) -> bool) -> Vec<String> {
    let mut problems = Vec::new();
    let mut names: Vec<&PathBuf> = files.keys().collect();
    names.sort();
    for name in names {
        let text = &files[name];
        let folder = name.parent().unwrap_or(Path::new(""));
        for (n, line) in prose_lines(text) {
            let at = format!("{}:{n}", name.display());
            let width = line.chars().count();
            let table_row = line.trim_start().starts_with('|');
            if width > WIDTH && !table_row && line.trim().contains(' ') {
                problems.push(format!("{at}: {width} characters, over {WIDTH}"));
            }
            for target in link_targets(line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    name.clone()
                } else {
                    normalize(&folder.join(path))
                };
                if !path.is_empty() && !exists(&file) {
                    problems.push(format!(
                        "{at}: link to {target}: no file {}",
                        file.display()
                    ));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if file.extension().is_none_or(|e| e != "md") {
                    continue;
                }
                let Some(target_text) = files.get(&file) else {
                    problems.push(format!(
                        "{at}: link to {target}: {} is not a checked page",
                        file.display()
                    ));
                    continue;
                };
                if !anchors(target_text).contains(anchor) {
                    problems.push(format!(
                        "{at}: link to {target}: no heading #{anchor} in {}",
                        file.display()
                    ));
                }
            }
        }
    }
    problems
}

/// `path` with its `.` and `..` segments resolved (it may not climb above the root).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Every relative link and anchor in the README, ARCHITECTURE.md and docs/ resolves, and
/// prose wraps at `WIDTH`.
#[test]
fn doc_links_resolve_and_prose_wraps_at_100() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files: HashMap<PathBuf, String> = pages(root)
        .into_iter()
        .map(|page| {
            let text = std::fs::read_to_string(root.join(&page)).expect("read a page");
            (page, text)
        })
        .collect();
    let found = problems(&files, |path| root.join(path).exists());
    assert!(
        found.is_empty(),
        "documentation problems:\n{}",
        found.join("\n")
    );
}

/// The checker finds a missing file, a missing anchor in another page and in the same
/// page, and a wide line; and leaves alone code, URLs, tables and anchors that exist.
#[test]
fn the_doc_checker_finds_broken_links_and_wide_lines() {
    let readme = [
        "# leaderq",
        "",
        "## Quick start: `dev`",
        "",
        "See [etcd](docs/etcd.md#settings) and [gone](docs/gone.md),",
        "[x](docs/etcd.md#nope), [up](#quick-start-dev), [bad](#quick-start).",
        "```sh",
        "[not a link](nowhere.md) .....................................................................",
        "```",
        "`[code](nowhere.md)` [web](https://example.com/x#y)",
        "| a wide table row ................................................................................ |",
    ]
    .join("\n");
    let wide = format!("{}\n", "word ".repeat(21));
    let etcd = format!("# etcd\n\n## Settings\n\n[back](../README.md#leaderq)\n{wide}");
    let files = HashMap::from([
        (PathBuf::from("README.md"), readme),
        (PathBuf::from("docs/etcd.md"), etcd),
    ]);
    let exists = |path: &Path| files.contains_key(path);
    assert_eq!(
        problems(&files, exists),
        [
            "README.md:5: link to docs/gone.md: no file docs/gone.md",
            "README.md:6: link to docs/etcd.md#nope: no heading #nope in docs/etcd.md",
            "README.md:6: link to #quick-start: no heading #quick-start in README.md",
            "docs/etcd.md:6: 105 characters, over 100",
        ]
    );
}

/// Anchors are made as GitHub makes them.
#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug("`leaderq run`: leader-gate any command"),
        "leaderq-run-leader-gate-any-command"
    );
    assert_eq!(
        slug("What Redis must be configured with, and where"),
        "what-redis-must-be-configured-with-and-where"
    );
    assert_eq!(slug("Settings ([reference](x.md))"), "settings-reference");
    assert_eq!(
        slug("queue.kill_grace & the lease"),
        "queuekill_grace--the-lease"
    );
    let page = "# A\n## Failures\n## Failures\n<a id=\"custom\"></a>\n";
    let found = anchors(page);
    for anchor in ["a", "failures", "failures-1", "custom"] {
        assert!(found.contains(anchor), "{anchor} in {found:?}");
    }
}
