//! House rules checked on every test run, over every source file of the workspace (the
//! product's src/ and each tooling crate's under crates/): every file opens with a `//!`
//! header saying what it owns, and a file over `LONG_FILE` lines says why at its top (a header
//! line starting `//! Size:`), so size is a decision, not an accident; and no `.unwrap()`
//! outside tests, so that nothing a user, a producer or a server sends can panic a
//! process (an `.expect("...")` is allowed where the message states the invariant that
//! makes it safe, such as "a JSON object serializes"); and module headers and
//! ARCHITECTURE.md name only source files that exist, so a moved file leaves no stale map;
//! and no module cycle within a crate (the walls between the product's folders are here,
//! those between crates are Cargo's).
//! The documentation's rules (links, anchors, line width) are in `docs.rs` below.
//!
//! Size: one test per house rule, side by side, so that the rules read as one list; how a
//! file is read (its code without tests, its functions) is in `code.rs`.

mod code;
mod docs;

use code::{function_lengths, non_test_code};
use std::path::{Path, PathBuf};

/// Past this many lines a file must say why it is that long.
const LONG_FILE: usize = 600;

/// Past this many lines a function of the engine room (`src/queue/`, where the leader
/// decides what to claim, run and settle) is cut into steps that each say what they do.
const LONG_FUNCTION: usize = 80;

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

/// The workspace root, which is this crate's root: the product sits at the top.
fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The crates whose sources the rules read, as (name, root folder): the product at the
/// top, then each crate of the workspace under `crates/` (the test kit, the lab).
fn crate_roots() -> Vec<(String, PathBuf)> {
    let root = workspace_root();
    let mut others: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("read crates/")
        .map(|entry| entry.expect("dir entry").path())
        .filter(|dir| dir.join("src").is_dir())
        .collect();
    others.sort();
    let mut roots = vec![("leaderq".to_string(), root.to_path_buf())];
    for dir in others {
        let name = dir
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned());
        roots.push((name, dir));
    }
    roots
}

/// One source file of the workspace.
struct Source {
    /// Its crate's name (`leaderq`, `testkit`, `lab`).
    krate: String,
    /// Its crate's root folder.
    root: PathBuf,
    /// Its path below its crate's `src/` (`coord/etcd/txn.rs`).
    name: String,
    text: String,
}

impl Source {
    /// Its path from the workspace root, for a report (`crates/lab/src/chaos/mod.rs`).
    fn path(&self) -> String {
        let file = self.root.join("src").join(&self.name);
        file.strip_prefix(workspace_root())
            .unwrap_or(&file)
            .display()
            .to_string()
    }

    /// Its node in the module graph: the top-level module, named within its crate
    /// (`coord`, `lab::bench`), so that the crates' graphs stay apart.
    fn module(&self) -> String {
        let top = top_module(&self.name);
        if self.krate == "leaderq" {
            top.to_string()
        } else {
            format!("{}::{top}", self.krate)
        }
    }
}

/// Every source file under the product's src/ and each crate's under crates/.
fn source_texts() -> Vec<Source> {
    let mut out = Vec::new();
    for (krate, root) in crate_roots() {
        let src = root.join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("read source");
            let name = file
                .strip_prefix(&src)
                .unwrap_or(&file)
                .display()
                .to_string();
            out.push(Source {
                krate: krate.clone(),
                root: root.clone(),
                name,
                text,
            });
        }
    }
    out
}

/// The rules read the tooling crates too, not only the product's src/.
#[test]
fn the_rules_read_every_crate_of_the_workspace() {
    let krates: Vec<String> = source_texts().into_iter().map(|s| s.krate).collect();
    for krate in ["leaderq", "testkit", "lab"] {
        assert!(
            krates.iter().any(|k| k == krate),
            "no source of {krate} read"
        );
    }
}

/// No function of the engine room is longer than `LONG_FUNCTION` lines: its loops are
/// cut into named steps, and its decisions are pure functions beside them.
#[test]
fn no_long_functions_in_the_engine_room() {
    let mut problems = Vec::new();
    for Source {
        krate, name, text, ..
    } in source_texts()
    {
        if krate != "leaderq" || !name.starts_with("queue/") {
            continue;
        }
        let code = non_test_code(&name, &text);
        for (line, function, lines) in function_lengths(&code) {
            if lines > LONG_FUNCTION {
                problems.push(format!(
                    "src/{name}:{line}: fn {function} is {lines} lines, over {LONG_FUNCTION}: cut it in named steps"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every module opens with a doc comment, and every long file gives its reason.
#[test]
fn every_module_has_a_header_and_long_files_say_why() {
    let mut problems = Vec::new();
    for source in source_texts() {
        let (name, text) = (source.path(), &source.text);
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
    for source in source_texts() {
        for (n, line) in non_test_code(&source.name, &source.text)
            .lines()
            .enumerate()
        {
            let code = line.split("//").next().unwrap_or("");
            if code.contains(".unwrap()") {
                problems.push(format!("{}:{}: {}", source.path(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "`.unwrap()` outside tests (handle the error, or `.expect(\"the invariant\")`):\n{}",
        problems.join("\n")
    );
}

/// The files whose non-test code may call `tokio::spawn`, each with what it spawns and who
/// owns it. Everywhere else a task goes on a `TaskTracker` or a `JoinSet` that its owner
/// closes and waits for on shutdown: nothing runs detached (ARCHITECTURE.md, Layers). A
/// folder (ending in `/`) allows its whole tree.
#[rustfmt::skip]
const OWN_THEIR_SPAWNS: &[(&str, &str)] = &[
    ("coord/redis/index.rs", "a rebuild behind a watch: its handle aborts on drop, kept by the coordinator"),
    ("coord/zookeeper/lease.rs", "a lease's watchdog: its handle, kept in the lease's entry, aborts it on drop"),
    ("queue/history.rs", "the history pruning: an AbortOnDropHandle the queue keeps"),
    ("queue/sort.rs", "a read ahead of the sort: an AbortOnDropHandle the queue keeps"),
    ("queue/flights.rs", "a claim's write: its handle awaited by `answer`; one dropped unread ends at the coordinator's request timeout"),
    ("service/dev.rs", "the embedded server and the dashboard: AbortOnDropHandles awaited at the end"),
    ("service/mod.rs", "the signal listener: it ends at the first signal or when its token is cancelled"),
];

/// No bare `tokio::spawn(` outside the files that own their tasks (`OWN_THEIR_SPAWNS`).
#[test]
fn nothing_is_spawned_detached() {
    let owns = |name: &str| {
        OWN_THEIR_SPAWNS
            .iter()
            .any(|(owner, _)| match owner.strip_suffix('/') {
                Some(folder) => name.starts_with(&format!("{folder}/")),
                None => name == *owner,
            })
    };
    let spawns =
        |code: &str| code.contains("tokio::spawn(") || code.contains("tokio::task::spawn(");
    // The product's: the tooling crates (bench, chaos, the harness) keep their own handles.
    let texts: Vec<(String, String)> = source_texts()
        .into_iter()
        .filter(|source| source.krate == "leaderq")
        .map(|source| (source.name, source.text))
        .collect();
    let mut problems = Vec::new();
    for (name, text) in &texts {
        let code = non_test_code(name, text);
        let lines = code
            .lines()
            .map(|line| line.split("//").next().unwrap_or(""));
        if owns(name) {
            continue;
        }
        for (n, line) in lines.enumerate().filter(|(_, line)| spawns(line)) {
            problems.push(format!("{name}:{}: {}", n + 1, line.trim()));
        }
    }
    // A file listed that spawns nothing (or is gone) is a stale entry.
    for (owner, _) in OWN_THEIR_SPAWNS
        .iter()
        .filter(|(owner, _)| !owner.ends_with('/'))
    {
        let listed = texts.iter().find(|(name, _)| name == owner);
        if !listed.is_some_and(|(name, text)| non_test_code(name, text).lines().any(spawns)) {
            problems.push(format!("{owner}: in OWN_THEIR_SPAWNS, but spawns nothing"));
        }
    }
    assert!(
        problems.is_empty(),
        "a task spawned detached (spawn it on the owner's TaskTracker or JoinSet, or keep \
         its handle and add the file to OWN_THEIR_SPAWNS with who owns it):\n{}",
        problems.join("\n")
    );
}

/// The product names no tooling crate, not even in a unit test: testkit is a
/// dev-dependency, and a unit test's `crate::` types are not those of the leaderq that
/// testkit links (its tests that need testkit are integration tests under `tests/`).
#[test]
fn the_product_names_no_tooling_crate() {
    let mut problems = Vec::new();
    for source in source_texts() {
        if source.krate != "leaderq" || top_module(&source.name) == "tidy" {
            continue;
        }
        for (n, line) in source.text.lines().enumerate() {
            if ["testkit::", "lab::"]
                .iter()
                .any(|name| line.contains(name))
            {
                problems.push(format!("{}:{}: {}", source.path(), n + 1, line.trim()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The walls: which top-level modules each folder of `src/` may not import (`crate::x`
/// in its non-test code). The layers, from the bottom: `util`; the seam and its backends
/// (`coord`) and the embedded server (`server`), which know nothing of settings files;
/// the task format (`task`), process supervision (`supervise`) and metrics (`observe`);
/// `config`, which composes the backends' own sections; the replica's life (`leader`),
/// handlers, schedules and the queue; the operator's verbs (`operate`); the dashboard
/// (`ui`); the producers' front door (`gateway`); the commands' wiring (`service`) on top.
/// The tooling (harness, contract, bench, chaos) is in crates of its own, which the product
/// names nowhere.
#[rustfmt::skip]
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("util", &["coord", "server", "task", "supervise", "observe", "config", "leader", "handler", "schedule", "queue", "operate", "ui", "gateway", "service"]),
    ("coord", &["server", "task", "supervise", "observe", "config", "leader", "handler", "schedule", "queue", "operate", "ui", "gateway", "service"]),
    ("server", &["coord", "task", "supervise", "observe", "config", "leader", "handler", "schedule", "queue", "operate", "ui", "gateway", "service"]),
    ("task", &["server", "supervise", "observe", "config", "leader", "handler", "schedule", "queue", "operate", "ui", "gateway", "service"]),
    ("supervise", &["coord", "server", "task", "observe", "config", "leader", "handler", "schedule", "queue", "operate", "ui", "gateway", "service"]),
    ("observe", &["server", "task", "supervise", "config", "leader", "handler", "schedule", "queue", "operate", "ui", "gateway", "service"]),
    ("config", &["server", "observe", "leader", "handler", "schedule", "queue", "operate", "ui", "gateway", "service"]),
    ("leader", &["server", "handler", "schedule", "queue", "operate", "ui", "gateway", "service"]),
    ("handler", &["server", "leader", "schedule", "queue", "operate", "ui", "gateway", "service"]),
    ("schedule", &["server", "handler", "queue", "operate", "ui", "gateway", "service"]),
    ("queue", &["server", "schedule", "operate", "ui", "gateway", "service"]),
    ("operate", &["server", "ui", "gateway", "service"]),
    ("ui", &["server", "gateway", "service"]),
    ("gateway", &["server", "service"]),
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

/// Every `crate::` import across top-level modules within a crate, as (from, to, where);
/// the tooling crates' modules are named with their crate (`lab::bench`).
fn module_edges() -> Vec<(String, String, String)> {
    let mut edges = Vec::new();
    for source in source_texts() {
        if matches!(top_module(&source.name), "main" | "lib" | "tidy") {
            continue;
        }
        let from = source.module();
        let prefix = from.strip_suffix(top_module(&source.name)).unwrap_or("");
        for (line, to) in crate_imports(&non_test_code(&source.name, &source.text)) {
            if to != top_module(&source.name) && to != "self" && to != "super" {
                let at = format!("{}:{line}", source.path());
                edges.push((from.clone(), format!("{prefix}{to}"), at));
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
    for source in source_texts() {
        let (name, text) = (source.path(), &source.text);
        let pure = text
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .any(|l| l.starts_with("//! Pure:"));
        if !pure {
            continue;
        }
        for (n, line) in non_test_code(&source.name, text).lines().enumerate() {
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

/// Whether `path`, named in a file in `folder` of the crate rooted at `krate`, exists:
/// below that folder or one of its parents up to the crate's src/; below the crate's root
/// or the workspace's when it starts there (`src/`, `tests/`, `examples/`, `crates/`); or
/// below any crate's src/ (the map names the tooling's files as `harness/link.rs`). A file
/// `x.rs` also names its own folder `x/` for paths of its children.
fn path_exists(krate: &Path, folder: &Path, own_dir: Option<&Path>, path: &str) -> bool {
    let src = krate.join("src");
    if ["src/", "tests/", "examples/", "benches/", "crates/"]
        .iter()
        .any(|top| path.starts_with(top))
    {
        return krate.join(path).is_file() || workspace_root().join(path).is_file();
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
    crate_roots()
        .iter()
        .any(|(_, root)| root.join("src").join(path).is_file())
}

/// The stale names in `text` (a file in `folder`), as `line: name` for a report.
fn stale_names(
    krate: &Path,
    folder: &Path,
    own_dir: Option<&Path>,
    lines: impl Iterator<Item = (usize, String)>,
) -> Vec<String> {
    let mut stale = Vec::new();
    for (n, line) in lines {
        for path in named_paths(&line) {
            if !path_exists(krate, folder, own_dir, path) {
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
    let root = workspace_root();
    let mut problems = Vec::new();
    for source in source_texts() {
        let (name, src) = (&source.name, source.root.join("src"));
        let file = src.join(name);
        let folder = file.parent().unwrap_or(&src);
        let own_dir = (!name.ends_with("mod.rs") && name != "lib.rs" && name != "main.rs")
            .then(|| file.with_extension(""));
        let headers = source
            .text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.trim_start().starts_with("//!"))
            .map(|(n, l)| (n + 1, l.to_string()));
        for stale in stale_names(&source.root, folder, own_dir.as_deref(), headers) {
            problems.push(format!("{}:{stale}", source.path()));
        }
    }
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let lines = map.lines().enumerate().map(|(n, l)| (n + 1, l.to_string()));
    for stale in stale_names(root, root, None, lines) {
        problems.push(format!("ARCHITECTURE.md:{stale}"));
    }
    assert!(
        problems.is_empty(),
        "named files that do not exist in any crate (fix the name, or name the folder):\n{}",
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
