//! The Redis coordinator's pure parts: where each thing lives under the key prefix, how a
//! version the seam hands out is made from Redis's counter and whether a lease still
//! exists, and how the scripts' answers read back as the seam's values. No I/O: the
//! scripts (`scripts.rs`) and the async shell (`mod.rs`) use these.
//!
//! Keys, all under the configured prefix `P` (one Redis database may hold several
//! deployments under different prefixes):
//! - `P version`: the one counter every write INCRs, the source of every version;
//! - `P lease/<id>`: a lease, a hash `{node, ttl}` with a PX TTL, renewed by script;
//! - `P leader/<name>`: the leader key, the holding lease's id, whose PX TTL follows the lease;
//! - `P holder/<name>`: the last holder's record `{lease, token, record, version}`, kept
//!   after it let go; `P fencing/<name>`: the last fencing token handed out (the next is
//!   above it, Redis's clock in milliseconds and the floor the campaigner passes: see
//!   `scripts.rs`, CAMPAIGN);
//! - `P tasks`: a sorted set of every task key, all at score 0, so a prefix is a lex range,
//!   and the mark [`INDEXED`], at 0 once a rebuild made the set whole: a set without the
//!   mark at 0 was deleted by hand (a producer's write makes it again, unmarked), never
//!   rebuilt, or is being rebuilt, and the next reader rebuilds it (`index.rs`);
//! - `P task/<key>`: a task, a hash `{value, version, created, holder}`;
//! - channel `P changes`: every write PUBLISHes there: a claim or completion of leaderq's
//!   `tasks:<scope>`, the longest prefix common to the keys it wrote ([`scope`]), anything
//!   else (the new counter) when it may concern every reader (a producer's write, a lease,
//!   the leadership, an edit).
//!
//! A lease ends by expiring, with no script run at that moment, so a task it claimed still
//! names it: such a task reads as unheld, and its version must move. A version is therefore
//! `2 * counter + 2 + gone`, with `gone` set when the lease named has ended ([`encode`]): a
//! lease's death moves every version it touched without a write, and a write conditioned on
//! a version checks both halves (`decode`).
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use crate::coord::{FencingToken, Holder, HolderRecord, LeaseId, StoredTask, TaskVersion, Version};

/// The highest fencing token handed out: 2^53 - 1, the largest integer a JSON number (a
/// double) holds exactly, so the token reads the same in every language. Tokens start
/// near Redis's clock in milliseconds (about 1.8e12 in 2026): far below it.
pub const TOKEN_MAX: u64 = (1 << 53) - 1;

/// The member of `P tasks` that marks it, at score 0, as listing every task hash: no
/// task's key (keys are never empty), and first in key order, where a listing skips it.
pub const INDEXED: &str = "";

/// `text` with the glob characters of Redis's `SCAN … MATCH` escaped: a pattern that
/// matches it alone (a key prefix may hold `*`, `?`, `[`, `]` or a backslash).
pub fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Where the coordinator's keys live under the prefix, for one leader name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Prefixed to every key and the channel (`[redis] key_prefix`).
    pub prefix: String,
    /// The election's name (`election.leader_key`): one Redis prefix may hold several.
    pub leader: String,
}

impl Layout {
    /// The pub/sub channel every write publishes on.
    pub fn channel(&self) -> String {
        format!("{}changes", self.prefix)
    }
}

/// What a message on the changes channel says was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Tasks only, every key written starting with this.
    Tasks(std::sync::Arc<str>),
    /// Anything: every reader looks again.
    Any,
}

/// The message a write of tasks only publishes: `tasks:` and [`scope`] of its keys.
pub const TASKS_CHANGED: &str = "tasks:";

/// The longest prefix common to `keys` (empty for none): the scope of a write of those
/// tasks, which only readers of a prefix that starts with it, or that it starts with, read.
pub fn scope<'a>(mut keys: impl Iterator<Item = &'a str>) -> &'a str {
    let Some(first) = keys.next() else {
        return "";
    };
    let mut common = first.len();
    for key in keys {
        common = first
            .bytes()
            .zip(key.bytes())
            .take(common)
            .take_while(|(a, b)| a == b)
            .count();
    }
    // Keys are ASCII (checked before they are written), so any byte is a boundary; a
    // stored key that is not stays whole up to the last boundary.
    while !first.is_char_boundary(common) {
        common -= 1;
    }
    &first[..common]
}

/// A message heard on the changes channel, read.
pub fn change_of(message: &[u8]) -> Change {
    match message.strip_prefix(TASKS_CHANGED.as_bytes()) {
        Some(scope) => match std::str::from_utf8(scope) {
            Ok(scope) => Change::Tasks(scope.into()),
            Err(_) => Change::Any,
        },
        None => Change::Any,
    }
}

/// Whether `change` may change what a reader of the tasks under `prefix` reads (`None`: a
/// reader of the leadership, which writes of tasks never change).
pub fn concerns(change: &Change, prefix: Option<&str>) -> bool {
    match (change, prefix) {
        (Change::Any, _) => true,
        (Change::Tasks(_), None) => false,
        (Change::Tasks(scope), Some(prefix)) => {
            scope.starts_with(prefix) || prefix.starts_with(&**scope)
        }
    }
}

/// The seam's version for a stored counter value: even while the lease it names (if any)
/// lives, odd once it has ended; never 0 ("do not wait").
pub fn encode(counter: u64, gone: bool) -> u64 {
    counter
        .saturating_mul(2)
        .saturating_add(2)
        .saturating_add(u64::from(gone))
}

/// The counter value and the `gone` flag a version was made of; `None` for a number no
/// read handed out (below 2), which no stored task can match.
pub fn decode(version: u64) -> Option<(u64, bool)> {
    let rest = version.checked_sub(2)?;
    Some((rest / 2, rest % 2 == 1))
}

/// What a listing or a get read: the tasks, the version of the read and when a lease
/// holding one of them would end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskRows {
    pub tasks: Vec<StoredTask>,
    /// The version of the read: the counter read before the tasks (`2 * counter + 2`, plus
    /// one while a task read names an ended lease, so that a lease's death moves it too). A
    /// task written after the counter was read carries a later version, and a wait from this
    /// one returns at once: nothing written meanwhile is missed.
    pub version: Version,
    /// The shortest time (ms) a lease holding a task read has left: a waiter looks again
    /// then, since that lease's death changes the answer without a write.
    pub next_expiry_ms: Option<u64>,
}

/// A task's fields as `HMGET value version created holder` reads them; no version: the
/// task is gone.
pub type TaskFields = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
);

/// The leases that hold tasks among `fields`, each once, in the order first named: the
/// PTTL of each is read next (a task whose lease is gone reads as unheld).
pub fn holders(fields: &[TaskFields]) -> Vec<&[u8]> {
    let mut holders: Vec<&[u8]> = Vec::new();
    for (_, version, _, holder) in fields {
        match (version, holder) {
            (Some(_), Some(holder)) if !holder.is_empty() && !holders.contains(&&holder[..]) => {
                holders.push(holder)
            }
            _ => {}
        }
    }
    holders
}

/// Reads tasks: `counter` (read before them), each of `keys` with its `fields` (a task that
/// is gone is left out), and `pttls`, the PTTL of each of [`holders`]'s leases in that
/// order (-2: gone).
pub fn task_rows(
    counter: u64,
    keys: Vec<String>,
    fields: Vec<TaskFields>,
    pttls: &[i64],
) -> Result<TaskRows, String> {
    if keys.len() != fields.len() {
        return Err(format!(
            "{} keys read as {} tasks",
            keys.len(),
            fields.len()
        ));
    }
    let holders: Vec<Vec<u8>> = holders(&fields).into_iter().map(<[u8]>::to_vec).collect();
    if holders.len() != pttls.len() {
        return Err(format!("{} holders, {} PTTLs", holders.len(), pttls.len()));
    }
    let mut rows = TaskRows::default();
    let mut any_gone = false;
    for (key, (value, version, created, holder)) in keys.into_iter().zip(fields) {
        let Some(version) = version else { continue };
        let holder = holder.unwrap_or_default();
        let pttl = holders
            .iter()
            .position(|h| *h == holder)
            .map_or(-2, |at| pttls[at]);
        let gone = !holder.is_empty() && pttl == -2;
        any_gone |= gone;
        if !holder.is_empty() && pttl >= 0 {
            let left = pttl.unsigned_abs();
            rows.next_expiry_ms = Some(rows.next_expiry_ms.map_or(left, |ms| ms.min(left)));
        }
        let version = number(&version)?;
        rows.tasks.push(StoredTask {
            key,
            value: value.unwrap_or_default(),
            version: TaskVersion(encode(version, gone)),
            created: encode(created.as_deref().map_or(Ok(version), number)?, false),
            holder: (!holder.is_empty() && !gone)
                .then(|| text(&holder))
                .transpose()?
                .map(LeaseId),
        });
    }
    rows.version = Version(encode(counter, any_gone));
    Ok(rows)
}

/// The leadership as the `observe` script answered it: `[leader, leader_pttl, lease,
/// token, record, version]` (the last four from the holder's record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderRow {
    pub holder: Holder,
    pub version: Version,
    /// How long (ms) the leader key has left, when one is held: a waiter looks again then.
    pub expiry_ms: Option<u64>,
}

pub fn holder_row(reply: Vec<Vec<u8>>) -> Result<HolderRow, String> {
    let [leader, pttl, _lease, token, record, version] = <[Vec<u8>; 6]>::try_from(reply)
        .map_err(|reply| format!("{} fields, not six", reply.len()))?;
    let leader = text(&leader)?;
    let pttl = signed(&pttl)?;
    let free = leader.is_empty();
    Ok(HolderRow {
        holder: Holder {
            lease: (!free).then_some(LeaseId(leader)),
            record: HolderRecord::decode(&record),
            token: FencingToken(number(&token)?),
        },
        version: Version(encode(number(&version)?, free)),
        expiry_ms: (!free && pttl >= 0).then(|| pttl.unsigned_abs()),
    })
}

/// A number the scripts send as text (Redis integers and counters); empty reads as 0.
pub fn number(field: &[u8]) -> Result<u64, String> {
    if field.is_empty() {
        return Ok(0);
    }
    text(field)?
        .parse()
        .map_err(|_| format!("{:?} is not a count", String::from_utf8_lossy(field)))
}

fn signed(field: &[u8]) -> Result<i64, String> {
    text(field)?
        .parse()
        .map_err(|_| format!("{:?} is not a number", String::from_utf8_lossy(field)))
}

/// A field read as text.
pub fn text(field: &[u8]) -> Result<String, String> {
    text_in(field).map(str::to_string)
}

/// A field read as text, borrowed.
pub fn text_in(field: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(field).map_err(|_| "a key or id that is not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(fields: &[&str]) -> Vec<Vec<u8>> {
        fields.iter().map(|f| f.as_bytes().to_vec()).collect()
    }

    /// A version is never 0, rises with the counter, differs once the lease died, and
    /// decodes back; numbers below 2 match nothing.
    #[test]
    fn versions_carry_the_counter_and_the_lease_death() {
        assert_eq!(encode(0, false), 2);
        assert!(encode(5, true) > encode(5, false));
        assert!(encode(6, false) > encode(5, true));
        for (counter, gone) in [
            (0, false),
            (0, true),
            (7, false),
            (7, true),
            (1 << 40, true),
        ] {
            assert_eq!(decode(encode(counter, gone)), Some((counter, gone)));
        }
        assert_eq!(decode(0), None);
        assert_eq!(decode(1), None);
    }

    fn fields(value: &str, version: &str, created: &str, holder: &str) -> TaskFields {
        let some = |f: &str| Some(f.as_bytes().to_vec());
        (some(value), some(version), some(created), some(holder))
    }

    /// A task whose lease is gone reads as unheld with an odd version, and moves the
    /// read's version; a live holder sets when to look again; a task gone between the
    /// listing of its key and the read of its fields is left out.
    #[test]
    fn a_task_of_an_ended_lease_reads_unheld_and_moves_the_version() {
        let read = vec![
            fields("{}", "4", "3", "L1"),
            fields("{\"x\":1}", "9", "2", "L2"),
            (None, None, None, None),
            fields("v", "5", "5", ""),
            fields("w", "6", "6", "L1"),
        ];
        assert_eq!(holders(&read), vec![&b"L1"[..], &b"L2"[..]]);
        let keys = ["q/a", "q/b", "q/gone", "q/c", "q/d"]
            .map(String::from)
            .to_vec();
        let rows = task_rows(9, keys, read, &[-2, 1500]).unwrap();
        let [a, b, c, d] = rows.tasks.as_slice() else {
            panic!("{rows:?}")
        };
        assert_eq!(
            (a.holder.clone(), a.version),
            (None, TaskVersion(encode(4, true)))
        );
        assert_eq!(
            (b.holder.clone(), b.version, b.created),
            (
                Some(LeaseId("L2".into())),
                TaskVersion(encode(9, false)),
                encode(2, false)
            )
        );
        assert_eq!(
            (c.key.as_str(), c.holder.clone(), c.version),
            ("q/c", None, TaskVersion(encode(5, false)))
        );
        assert_eq!(
            (d.holder.clone(), d.version),
            (None, TaskVersion(encode(6, true)))
        );
        assert_eq!(rows.version, Version(encode(9, true)));
        assert_eq!(rows.next_expiry_ms, Some(1500));
        let none = task_rows(3, Vec::new(), Vec::new(), &[]).unwrap();
        assert_eq!((none.version, none.next_expiry_ms), (Version(8), None));
        assert!(task_rows(3, vec!["q/a".into()], Vec::new(), &[]).is_err());
        assert!(task_rows(
            3,
            vec!["q/a".into()],
            vec![fields("v", "1", "1", "L1")],
            &[]
        )
        .is_err());
    }

    /// A write's scope is its keys' common prefix; a reader of a prefix wakes for a write
    /// within it or around it, a reader of the leadership for no write of tasks, and every
    /// reader for any other message (a producer's, a lease's, an older replica's).
    #[test]
    fn a_write_wakes_the_readers_of_its_keys_only() {
        let keys = ["q/task_10", "q/task_1", "q/task_2"];
        assert_eq!(scope(keys.into_iter()), "q/task_");
        assert_eq!(scope(["q/a", "qDead/a"].into_iter()), "q");
        assert_eq!(scope(["q/a"].into_iter()), "q/a");
        assert_eq!(scope(["q/a", "x/a"].into_iter()), "");
        assert_eq!(scope(std::iter::empty()), "");
        let change = change_of(b"tasks:q/task_");
        assert_eq!(change, Change::Tasks("q/task_".into()));
        assert!(concerns(&change, Some("q/")));
        assert!(concerns(&change, Some("q/task_1")));
        assert!(!concerns(&change, Some("leaderq/schedules/q/")));
        assert!(!concerns(&change, Some("qDead/")));
        assert!(!concerns(&change, None));
        assert!(concerns(&change_of(b"tasks:"), Some("anything/")));
        for any in [&b"1234"[..], b"", b"tasks", b"tasks:\xff"] {
            let change = change_of(any);
            assert!(
                concerns(&change, None) && concerns(&change, Some("q/")),
                "{any:?}"
            );
        }
        assert_eq!(change_of(b"tasks:\xff"), Change::Any);
    }

    /// The holder reads as free (odd version) once the leader key is gone, keeping the last
    /// record and token.
    #[test]
    fn a_free_leadership_keeps_the_last_record() {
        let record = HolderRecord {
            node: "n1".into(),
            ..HolderRecord::default()
        };
        let encoded = String::from_utf8(record.encode()).unwrap();
        let held = holder_row(row(&["L1", "900", "L1", "4", &encoded, "12"])).unwrap();
        assert_eq!(held.holder.lease, Some(LeaseId("L1".into())));
        assert_eq!(held.version, Version(encode(12, false)));
        assert_eq!(held.expiry_ms, Some(900));
        let free = holder_row(row(&["", "-2", "L1", "4", &encoded, "12"])).unwrap();
        assert_eq!(free.holder.lease, None);
        assert_eq!(free.holder.record, Some(record));
        assert_eq!(free.holder.token, FencingToken(4));
        assert!(free.version > held.version);
        let never = holder_row(row(&["", "-2", "", "0", "", "0"])).unwrap();
        assert_eq!(
            (never.version, never.holder.token),
            (Version(3), FencingToken(0))
        );
    }

    /// A key prefix's glob characters match only themselves in a rebuild's `SCAN … MATCH`.
    #[test]
    fn glob_escape_leaves_a_prefix_that_matches_only_itself() {
        assert_eq!(glob_escape("leaderq/task/"), "leaderq/task/");
        assert_eq!(glob_escape(r"a*b?c[d]e\f"), r"a\*b\?c\[d\]e\\f");
        assert_eq!(glob_escape("ünï-^"), "ünï-^");
    }
}
