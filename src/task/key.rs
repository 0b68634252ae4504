//! Keys: the one check every key leaderq builds from input or from a stored record passes,
//! and [`Key`], a key that passed it and is known to lie under a configured prefix.
//!
//! The rule is Consul's advice for clients (`consul-semantics.md`): keys of `A-Z a-z 0-9 _ .
//! / -` with no leading `/`. leaderq adds what makes a key address exactly itself over
//! HTTP: no empty segment (`//`, a trailing `/`) and no `.` or `..` segment, which URL
//! parsers resolve, so that `oracleTask/x/../../evil` would address `evil`. Control
//! characters are outside the charset, so no key can forge a log line either.
//!
//! The CLI builds every key it writes or reads with [`Key::under`] (a prefix plus a validated
//! name) or accepts it with [`Key::within`] (a whole key, only under the given prefixes);
//! task ids are validated, not escaped, with [`check_id`], so a task's key is always
//! `task_<its id>`. The consumer dead-letters tasks whose keys fail the rule, under a key
//! from [`dead_letter_key`]. Settings check their prefixes and the leader key at start with
//! [`check_prefix`] and [`check`]. Knows nothing of Consul's transport or of tasks' contents.

use std::fmt;

use crate::util::escape::escape;

/// Why a key, a prefix or an id is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("it is empty")]
    Empty,
    #[error("it starts with '/'")]
    LeadingSlash,
    #[error("it has an empty segment ('//' or a trailing '/')")]
    EmptySegment,
    #[error("it has a '{0}' segment")]
    DotSegment(&'static str),
    #[error("it contains '{0}', outside A-Z a-z 0-9 _ . / -")]
    Char(String),
    #[error("it contains '{0}', outside A-Z a-z 0-9 _ . - (an id is one segment of a key)")]
    IdChar(String),
    #[error("it does not lie under {0}")]
    Outside(String),
}

/// A key that satisfies [`check`] and lies strictly under the prefix it was built or
/// accepted with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key(String);

impl Key {
    /// `prefix` followed by `name`, a relative key of one or more segments.
    pub fn under(prefix: &str, name: &str) -> Result<Key, Invalid> {
        check(name)?;
        let key = format!("{prefix}{name}");
        check(&key)?;
        Ok(Key(key))
    }

    /// A whole key, accepted only when it satisfies [`check`] and lies under one of
    /// `prefixes` with a name after it.
    pub fn within(key: &str, prefixes: &[&str]) -> Result<Key, Invalid> {
        check(key)?;
        if prefixes
            .iter()
            .any(|prefix| key.len() > prefix.len() && key.starts_with(prefix))
        {
            return Ok(Key(key.to_string()));
        }
        Err(Invalid::Outside(prefixes.join(" or ")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<Key> for String {
    fn from(key: Key) -> String {
        key.0
    }
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

/// The rule for a whole key: non-empty, only `A-Z a-z 0-9 _ . / -`, no leading `/`, no
/// empty, `.` or `..` segment.
pub fn check(key: &str) -> Result<(), Invalid> {
    if key.is_empty() {
        return Err(Invalid::Empty);
    }
    if let Some(c) = key.chars().find(|c| !allowed(*c)) {
        return Err(Invalid::Char(escape(&c.to_string()).into_owned()));
    }
    if key.starts_with('/') {
        return Err(Invalid::LeadingSlash);
    }
    for segment in key.split('/') {
        match segment {
            "" => return Err(Invalid::EmptySegment),
            "." => return Err(Invalid::DotSegment(".")),
            ".." => return Err(Invalid::DotSegment("..")),
            _ => {}
        }
    }
    Ok(())
}

/// A configured prefix: a key by [`check`], optionally ending in one `/`.
pub fn check_prefix(prefix: &str) -> Result<(), Invalid> {
    check(prefix.strip_suffix('/').unwrap_or(prefix))
}

/// A task id as it goes into its key (`task_<id>`): one segment by [`check`].
pub fn check_id(id: &str) -> Result<(), Invalid> {
    if let Some(c) = id.chars().find(|c| !allowed(*c) || *c == '/') {
        return Err(Invalid::IdChar(escape(&c.to_string()).into_owned()));
    }
    check(id)
}

/// Where the consumer moves a task under `queue_prefix` to: `dead_prefix` plus the task's
/// name when that is a valid key; otherwise the name with every character that is not
/// allowed in a segment replaced by `_`, plus a hash of the whole original key so that
/// different bad keys do not share a dead letter. The original key is kept in the record.
///
/// `dead_prefix` must pass [`check_prefix`] (settings are validated at start); then the
/// result always passes [`check`].
pub fn dead_letter_key(queue_prefix: &str, dead_prefix: &str, task_key: &str) -> Key {
    let name = task_key.strip_prefix(queue_prefix).unwrap_or(task_key);
    if let Ok(key) = Key::under(dead_prefix, name) {
        return key;
    }
    let safe: String = name
        .chars()
        .map(|c| if allowed(c) && c != '/' { c } else { '_' })
        .collect();
    // The hash suffix also means the name is never empty, `.` or `..`.
    let name = format!("{safe}-{:016x}", fnv1a(task_key.as_bytes()));
    Key::under(dead_prefix, &name).unwrap_or(Key(format!("{dead_prefix}{name}")))
}

/// FNV-1a, 64 bits: a stable hash (the same bad key always maps to the same dead letter)
/// with no dependency; collisions only merge two dead letters' keys, never lose a task's
/// original key, which the record keeps.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Node ids go into check ids, session names and URL paths; Consul has no limit, but ids
/// this long are a mistake, not a name.
const NODE_ID_MAX_LEN: usize = 128;

/// `Ok` for ids safe in a check id, a session name, a KV value and a URL path segment:
/// 1 to 128 ASCII letters, digits, '.', '_' or '-'. The error completes "node id X …".
pub fn validate_node_id(id: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if id.is_empty() || id.len() > NODE_ID_MAX_LEN || !id.chars().all(allowed) {
        return Err(format!(
            "is not a valid node id: use 1 to {NODE_ID_MAX_LEN} ASCII letters, digits, '.', '_' or '-'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain keys, nested keys and dots inside segments pass.
    #[test]
    fn ordinary_keys_pass() {
        for key in [
            "oracleTask/task_1",
            "a/b/c",
            "x.y",
            "..x",
            "x..",
            "a-b_c.d",
            "A9",
        ] {
            assert_eq!(check(key), Ok(()), "{key}");
        }
    }

    /// Traversal, empty segments, a leading slash, control characters and anything outside
    /// the charset are refused with the reason.
    #[test]
    fn hostile_keys_are_refused_with_the_reason() {
        assert_eq!(check(""), Err(Invalid::Empty));
        assert_eq!(check("/a"), Err(Invalid::LeadingSlash));
        assert_eq!(check("a//b"), Err(Invalid::EmptySegment));
        assert_eq!(check("a/"), Err(Invalid::EmptySegment));
        assert_eq!(check("x/../../evil"), Err(Invalid::DotSegment("..")));
        assert_eq!(check(".."), Err(Invalid::DotSegment("..")));
        assert_eq!(check("a/./b"), Err(Invalid::DotSegment(".")));
        assert_eq!(check("a\nb"), Err(Invalid::Char("\\n".into())));
        assert_eq!(check("a\u{1b}[31m"), Err(Invalid::Char("\\u{1b}".into())));
        assert_eq!(check("a b"), Err(Invalid::Char(" ".into())));
        assert_eq!(check("a%2F..%2Fb"), Err(Invalid::Char("%".into())));
        assert_eq!(check("a\\..\\b"), Err(Invalid::Char("\\".into())));
        assert_eq!(check("é"), Err(Invalid::Char("é".into())));
        let message = Invalid::Char("\\n".into()).to_string();
        assert!(!message.contains('\n'), "{message}");
    }

    /// `under` proves the key lies under the prefix: a name cannot climb out of it, start
    /// over at the root, or be empty.
    #[test]
    fn under_keeps_names_inside_the_prefix() {
        assert_eq!(
            Key::under("oracleTask/", "task_1").unwrap().as_str(),
            "oracleTask/task_1"
        );
        assert_eq!(
            Key::under("oracleTask/", "a/b").unwrap().as_str(),
            "oracleTask/a/b"
        );
        for name in [
            "../consumerLeader",
            "x/../../evil",
            "/evil",
            "",
            ".",
            "a//b",
        ] {
            assert!(Key::under("oracleTask/", name).is_err(), "{name:?}");
        }
    }

    /// `within` accepts a whole key only under one of the prefixes, with a name after it.
    #[test]
    fn within_accepts_only_keys_under_the_prefixes() {
        let prefixes = ["oracleTask/", "oracleTaskDead/"];
        assert!(Key::within("oracleTask/task_1", &prefixes).is_ok());
        assert!(Key::within("oracleTaskDead/task_1", &prefixes).is_ok());
        assert_eq!(
            Key::within("consumerLeader", &prefixes),
            Err(Invalid::Outside("oracleTask/ or oracleTaskDead/".into()))
        );
        assert!(Key::within("oracleTask/", &prefixes).is_err());
        assert!(Key::within("oracleTask/../consumerLeader", &prefixes).is_err());
        assert!(Key::within("oracleTaskX", &prefixes).is_err());
    }

    /// Prefixes may end in one '/'; ids are one segment.
    #[test]
    fn prefixes_and_ids_have_their_own_shapes() {
        assert_eq!(check_prefix("oracleTask/"), Ok(()));
        assert_eq!(check_prefix("jobs"), Ok(()));
        assert_eq!(check_prefix("a/b/"), Ok(()));
        assert!(check_prefix("/").is_err());
        assert!(check_prefix("a//").is_err());
        assert!(check_prefix("../a/").is_err());
        assert!(check_prefix("").is_err());
        assert_eq!(check_id("1445599887"), Ok(()));
        assert_eq!(check_id("ok-1.2_x"), Ok(()));
        assert_eq!(check_id("a/b"), Err(Invalid::IdChar("/".into())));
        assert_eq!(check_id("x/../../evil"), Err(Invalid::IdChar("/".into())));
        assert_eq!(check_id("a\nb"), Err(Invalid::IdChar("\\n".into())));
        assert_eq!(check_id(".."), Err(Invalid::DotSegment("..")));
        assert!(check_id("").is_err());
    }

    /// A valid task name keeps its name under the dead-letter prefix; a bad one gets a
    /// valid key, stable for the same original key and distinct for different ones.
    #[test]
    fn dead_letter_keys_are_always_valid() {
        let key = |task: &str| dead_letter_key("oracleTask/", "oracleTaskDead/", task);
        assert_eq!(key("oracleTask/task_1").as_str(), "oracleTaskDead/task_1");
        assert_eq!(key("oracleTask/a/b").as_str(), "oracleTaskDead/a/b");
        for bad in [
            "oracleTask/x\ny",
            "oracleTask/../consumerLeader",
            "oracleTask/a//b",
            "oracleTask/..",
            "oracleTask/a b",
            "oracleTask/",
        ] {
            let dead = key(bad);
            assert_eq!(check(dead.as_str()), Ok(()), "{bad:?} -> {dead}");
            assert!(dead.as_str().starts_with("oracleTaskDead/"), "{dead}");
            assert_eq!(dead, key(bad));
        }
        assert_ne!(key("oracleTask/x\ny"), key("oracleTask/x\ty"));
        assert!(key("oracleTask/x\ny")
            .as_str()
            .starts_with("oracleTaskDead/x_y-"));
    }
}
