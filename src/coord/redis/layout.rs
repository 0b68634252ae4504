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
//! - `P tasks`: a sorted set of every task key, all at score 0, so a prefix is a lex range;
//! - `P task/<key>`: a task, a hash `{value, version, created, holder}`;
//! - channel `P changes`: every write PUBLISHes the new counter there.
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

/// What a `list` or `get` script answered: the counter, and six fields per task.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskRows {
    pub tasks: Vec<StoredTask>,
    /// The version of the answer: past every task's (`2 * counter + 2`, plus one while a
    /// task listed names an ended lease, so that a lease's death moves it too).
    pub version: Version,
    /// The shortest time (ms) a lease holding a listed task has left: a waiter looks again
    /// then, since that lease's death changes the answer without a write.
    pub next_expiry_ms: Option<u64>,
}

/// Reads a task script's answer: `[counter, (key, value, version, created, holder,
/// holder_pttl)*]`, where `holder_pttl` is Redis's PTTL of the holder's lease (-2: gone).
pub fn task_rows(reply: Vec<Vec<u8>>) -> Result<TaskRows, String> {
    let mut fields = reply.into_iter();
    let counter = number(&fields.next().ok_or("an empty answer")?)?;
    let rest: Vec<Vec<u8>> = fields.collect();
    if !rest.len().is_multiple_of(6) {
        return Err(format!("{} task fields, not a multiple of six", rest.len()));
    }
    let mut rows = TaskRows::default();
    let mut any_gone = false;
    for row in rest.chunks(6) {
        let [key, value, version, created, holder, pttl] = row else {
            unreachable!("chunks of six")
        };
        let holder = text(holder)?;
        let pttl = signed(pttl)?;
        let gone = !holder.is_empty() && pttl == -2;
        any_gone |= gone;
        if !holder.is_empty() && pttl >= 0 {
            let left = pttl.unsigned_abs();
            rows.next_expiry_ms = Some(rows.next_expiry_ms.map_or(left, |ms| ms.min(left)));
        }
        rows.tasks.push(StoredTask {
            key: text(key)?,
            value: value.clone(),
            version: TaskVersion(encode(number(version)?, gone)),
            created: encode(number(created)?, false),
            holder: (!holder.is_empty() && !gone).then_some(LeaseId(holder)),
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

    /// A task whose lease is gone reads as unheld with an odd version, and moves the
    /// answer's version past every task's; a live holder sets when to look again.
    #[test]
    fn a_task_of_an_ended_lease_reads_unheld_and_moves_the_version() {
        let rows = task_rows(row(&[
            "9",
            "q/a",
            "{}",
            "4",
            "3",
            "L1",
            "-2",
            "q/b",
            "{\"x\":1}",
            "9",
            "2",
            "L2",
            "1500",
            "q/c",
            "v",
            "5",
            "5",
            "",
            "-2",
        ]))
        .unwrap();
        let [a, b, c] = rows.tasks.as_slice() else {
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
            (c.holder.clone(), c.version),
            (None, TaskVersion(encode(5, false)))
        );
        assert_eq!(rows.version, Version(encode(9, true)));
        assert!(rows.tasks.iter().all(|t| t.version.0 <= rows.version.0));
        assert_eq!(rows.next_expiry_ms, Some(1500));
        let none = task_rows(row(&["3"])).unwrap();
        assert_eq!((none.version, none.next_expiry_ms), (Version(8), None));
        assert!(task_rows(row(&["3", "q/a"])).is_err());
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
}
