//! House rules checked on every test run: every source file opens with a `//!` header
//! saying what it owns, and a file over `LONG_FILE` lines says why at its top (a header
//! line starting `//! Size:`), so size is a decision, not an accident; and no `.unwrap()`
//! outside tests, so that nothing a user, a producer or a server sends can panic a
//! process (an `.expect("...")` is allowed where the message states the invariant that
//! makes it safe, such as "a JSON object serializes"); and module headers and
//! ARCHITECTURE.md name only source files that exist, so a moved file leaves no stale map.
//! The documentation's rules (links, anchors, line width) are in `docs.rs` below.

mod code;
mod docs;

use code::non_test_code;
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

/// The walls: which top-level modules each folder of `src/` may not import (`crate::x`
/// in its non-test code). The layers, from the bottom: `util`; the seam and its backends
/// (`coord`) and the embedded server (`server`), which know nothing of settings files;
/// the task format (`task`), process supervision (`supervise`) and metrics (`observe`);
/// `config`, which composes the backends' own sections; the replica's life (`leader`),
/// handlers, schedules and the queue; the operator's verbs (`operate`); the dashboard
/// (`ui`); the commands' wiring (`service`); `tools` over real processes on top.
#[rustfmt::skip]
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("util", &["coord", "server", "task", "supervise", "observe", "config", "leader", "handler", "schedule", "queue", "operate", "ui", "service", "tools"]),
    ("coord", &["server", "task", "supervise", "observe", "config", "leader", "handler", "schedule", "queue", "operate", "ui", "service", "tools"]),
    ("server", &["coord", "task", "supervise", "observe", "config", "leader", "handler", "schedule", "queue", "operate", "ui", "service", "tools"]),
    ("task", &["server", "supervise", "observe", "config", "leader", "handler", "schedule", "queue", "operate", "ui", "service", "tools"]),
    ("supervise", &["coord", "server", "task", "observe", "config", "leader", "handler", "schedule", "queue", "operate", "ui", "service", "tools"]),
    ("observe", &["server", "task", "supervise", "config", "leader", "handler", "schedule", "queue", "operate", "ui", "service", "tools"]),
    ("config", &["server", "observe", "leader", "handler", "schedule", "queue", "operate", "ui", "service", "tools"]),
    ("leader", &["server", "handler", "schedule", "queue", "operate", "ui", "service", "tools"]),
    ("handler", &["server", "leader", "schedule", "queue", "operate", "ui", "service", "tools"]),
    ("schedule", &["server", "handler", "queue", "operate", "ui", "service", "tools"]),
    ("queue", &["server", "schedule", "operate", "ui", "service", "tools"]),
    ("operate", &["server", "ui", "service", "tools"]),
    ("ui", &["server", "service", "tools"]),
    ("service", &["tools"]),
];

/// The top-level modules a piece of code names as `crate::x` (paths and `use crate::{..}`
/// groups), comments left out.
fn crate_imports(code: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut in_group = false;
    for (n, line) in code.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            if after.starts_with('{') {
                in_group = true;
            } else {
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.push((n + 1, name));
                }
            }
            rest = after;
        }
        if in_group {
            // Inside `use crate::{a::b, c, ...}`: every path's first segment, until `};`.
            let group = code.rsplit("crate::{").next().unwrap_or(code);
            for item in group.split([',', '{', '}', ' ', ';']) {
                let first = item.split("::").next().unwrap_or("").trim();
                if !first.is_empty() && first.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                    found.push((n + 1, first.to_string()));
                }
            }
            if code.contains("};") {
                in_group = false;
            }
        }
    }
    found
}

/// The top-level module a file under `src/` belongs to (`coord/etcd/plan.rs` → `coord`).
fn top_module(name: &str) -> &str {
    let first = name.split('/').next().unwrap_or(name);
    first.strip_suffix(".rs").unwrap_or(first)
}

/// Every `crate::` import across top-level modules, as (from, to, where).
fn module_edges() -> Vec<(String, String, String)> {
    let mut edges = Vec::new();
    for (name, text) in source_texts() {
        let from = top_module(&name);
        if matches!(from, "main" | "lib" | "tidy") {
            continue;
        }
        for (line, to) in crate_imports(&non_test_code(&name, &text)) {
            if to != from && to != "self" && to != "super" {
                edges.push((from.to_string(), to, format!("{name}:{line}")));
            }
        }
    }
    edges
}

/// Nothing imports across a wall: each folder's forbidden `crate::` imports (`FORBIDDEN`)
/// are absent from its non-test code.
#[test]
fn no_module_imports_across_a_wall() {
    let mut problems = Vec::new();
    for (from, to, at) in module_edges() {
        let forbidden = FORBIDDEN
            .iter()
            .find(|(folder, _)| *folder == from)
            .map_or(&[][..], |(_, names)| *names);
        if forbidden.contains(&to.as_str()) {
            problems.push(format!("{at}: {from} imports crate::{to}"));
        }
    }
    assert!(
        problems.is_empty(),
        "imports across a wall:\n{}",
        problems.join("\n")
    );
}

/// The modules' imports form no cycle, directly (`a` ⇄ `b`) or through others.
#[test]
fn no_module_cycles() {
    let edges = module_edges();
    let cycles = cycles_in(
        &edges
            .iter()
            .map(|(a, b, _)| (a.clone(), b.clone()))
            .collect::<Vec<_>>(),
    );
    let described: Vec<String> = cycles
        .iter()
        .map(|cycle| {
            let hops: Vec<String> = cycle
                .windows(2)
                .map(|pair| {
                    let at = edges
                        .iter()
                        .find(|(a, b, _)| *a == pair[0] && *b == pair[1])
                        .map_or("", |(_, _, at)| at.as_str());
                    format!("{} → {} ({at})", pair[0], pair[1])
                })
                .collect();
            hops.join(", ")
        })
        .collect();
    assert!(
        described.is_empty(),
        "module cycles:\n{}",
        described.join("\n")
    );
}

/// Each cycle of the directed graph `edges` once, as the path from its smallest node
/// back to it (`[a, b, a]`).
fn cycles_in(edges: &[(String, String)]) -> Vec<Vec<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().insert(b);
    }
    let mut cycles = Vec::new();
    for start in next.keys() {
        // Depth-first from `start`, through nodes above it only, so each cycle is found
        // once, from its smallest node.
        let mut stack = vec![(
            vec![*start],
            next[start].iter().copied().collect::<Vec<_>>(),
        )];
        while let Some((path, mut todo)) = stack.pop() {
            let Some(node) = todo.pop() else { continue };
            stack.push((path.clone(), todo));
            if node == *start {
                let mut cycle: Vec<String> = path.iter().map(|s| s.to_string()).collect();
                cycle.push(start.to_string());
                cycles.push(cycle);
            } else if node > *start && !path.contains(&node) {
                let mut longer = path.clone();
                longer.push(node);
                let onward = next
                    .get(node)
                    .map_or(Vec::new(), |n| n.iter().copied().collect());
                stack.push((longer, onward));
            }
        }
    }
    cycles
}

/// The cycle finder sees a direct pair and a loop of three, and nothing in a line.
#[test]
fn the_cycle_finder_finds_inserted_cycles() {
    let edge = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert!(cycles_in(&[edge("a", "b"), edge("b", "c")]).is_empty());
    assert_eq!(
        cycles_in(&[edge("a", "b"), edge("b", "a")]),
        vec![vec!["a", "b", "a"]]
    );
    assert_eq!(
        cycles_in(&[edge("c", "a"), edge("a", "b"), edge("b", "c")]),
        vec![vec!["a", "b", "c", "a"]]
    );
    let imports = crate_imports("use crate::config::Settings;\nuse crate::{\n    coord::X,\n    task,\n};\n// crate::ui\nlet x = crate::leader::f();");
    let names: Vec<&str> = imports.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["config", "coord", "task", "leader"]);
}

/// A file whose header has a `//! Pure:` line does no I/O and reads no clock: no
/// `.await`, no `now()`, no spawn, no file or network access, outside its tests.
#[test]
fn pure_files_do_no_io_and_read_no_clock() {
    const IMPURE: &[&str] = &[
        ".await",
        "::now()",
        "spawn(",
        "std::fs",
        "tokio::fs",
        "File::",
        "TcpStream",
        "TcpListener",
        "UdpSocket",
        "tokio::net",
        "thread::sleep",
        "std::env::var",
    ];
    let mut problems = Vec::new();
    for (name, text) in source_texts() {
        let pure = text
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .any(|l| l.starts_with("//! Pure:"));
        if !pure {
            continue;
        }
        for (n, line) in non_test_code(&name, &text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if let Some(word) = IMPURE.iter().find(|w| code.contains(*w)) {
                problems.push(format!(
                    "{name}:{}: `{word}` in a pure file: {}",
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The source-file paths a text names: every word ending in `.rs` made of path characters
/// (`queue/plan.rs`, `src/coord/etcd/plan.rs`, `state.rs`), leaving out templates and globs
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
    let text = "see `queue/plan.rs`, src/coord/etcd/plan.rs and state.rs. Not \
                coord/<backend>/settings.rs, src/**/*.rs, `.rs` files, docs.rs/x or \
                https://example.com/a.rs; but ./x/y.rs and mod.rs's header.";
    assert_eq!(
        named_paths(text),
        [
            "queue/plan.rs",
            "src/coord/etcd/plan.rs",
            "state.rs",
            "x/y.rs",
            "mod.rs"
        ]
    );
}
