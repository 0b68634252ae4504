//! Where the etcd backend keeps things, and how etcd's numbers become the seam's: pure.
//!
//! With `election.leader_key = "consumerLeader"`:
//! - `consumerLeader/<lease-hex>`: a campaigner's key, attached to its lease and holding
//!   its [`HolderRecord`]; the one created first (lowest `create_revision`) leads, as in
//!   etcd's `concurrency.Election`, so `etcdctl elect -l consumerLeader` shows the leader;
//! - `consumerLeader`: the last leader's record and token, without a lease, kept for
//!   standbys (`prefer_previous_leader`) and `leaderq status` after it let go;
//! - `consumerLeader.owner/<lease-hex>`: the node id that opened the lease, attached to
//!   it, so a restart takes up only its own lease;
//! - `consumerLeader.held/<lease-hex>/<id>`: a claim record, attached to the claiming
//!   lease, naming the tasks one write claimed (`{"claimed":[…]}`), or a release record
//!   naming the tasks one write let go (`{"released":[…]}`). Records are never rewritten;
//!   see [`Holders`] for how they say who holds a task, and [`garbage`] for when one goes;
//! - `consumerLeader.claims/<task key>`: a task's claim key, attached to the claiming lease,
//!   as every claim was made before claim records (and still is while a replica that knows
//!   only those runs beside: [`Owner`]). Honoured the same way: it dies with its lease, and
//!   the task is seen unheld (an orphan).
//!
//! `.` sorts before `/`, so the owner, record and claim keys lie outside the campaigners'
//! prefix.
//!
//! A task's version is `4 × mod_revision`, plus 0 when a claim record holds it, 1 when
//! nothing does, 2 when a claim key does: a claim that dies with its lease writes nothing
//! to the task, yet its version must move (the seam's "versions" rule), and a write
//! conditioned on it must know how it was held. Queue and leader positions ([`Version`])
//! are `4 × revision + 3`, so that a listing's position is at or above every version it
//! shows.
//!
//! Size: who holds a task ([`Holders`]) and which records may go ([`garbage`]) are one
//! rule read two ways, kept beside each other and their tests.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::coord::etcd::client::{Event, Kv};
use crate::coord::{HolderRecord, LeaseId, TaskVersion, Version};

/// The keys of one election and its claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    leader_key: String,
}

impl Layout {
    pub fn new(leader_key: &str) -> Layout {
        Layout {
            leader_key: leader_key.to_string(),
        }
    }

    /// The prefix every campaigner's key lies under.
    pub fn candidates(&self) -> String {
        format!("{}/", self.leader_key)
    }

    pub fn candidate(&self, lease: i64) -> String {
        format!("{}/{lease:x}", self.leader_key)
    }

    /// The last leader's record.
    pub fn last(&self) -> &str {
        &self.leader_key
    }

    pub fn owner(&self, lease: i64) -> String {
        format!("{}owner/{lease:x}", self.dotted())
    }

    /// The prefix every lease's owner key lies under.
    pub fn owners(&self) -> String {
        format!("{}owner/", self.dotted())
    }

    /// The prefix every claim and release record lies under.
    pub fn records(&self) -> String {
        format!("{}held/", self.dotted())
    }

    /// A record of `lease`'s, named `id` (random: two writes never pick the same one, and
    /// the write that creates it checks it does not exist).
    pub fn record(&self, lease: i64, id: u64) -> String {
        format!("{}held/{lease:x}/{id:016x}", self.dotted())
    }

    fn dotted(&self) -> String {
        format!("{}.", self.leader_key)
    }

    pub fn claims(&self) -> String {
        format!("{}.claims/", self.leader_key)
    }

    pub fn claim(&self, task_key: &str) -> String {
        format!("{}{task_key}", self.claims())
    }
}

/// The seam's lease id for an etcd lease: its hex form, as `etcdctl` prints it.
pub fn lease_id(lease: i64) -> LeaseId {
    LeaseId(format!("{lease:x}"))
}

/// The etcd lease of a seam lease id; `None` for one that is not an etcd lease's.
pub fn lease_number(lease: &LeaseId) -> Option<i64> {
    i64::from_str_radix(lease.0.trim(), 16)
        .ok()
        .filter(|n| *n > 0)
}

/// How a task is held, as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// By nothing: free to claim, or an orphan to requeue.
    Free,
    /// By a claim record naming it.
    Record,
    /// By a claim key of its own.
    Key,
}

/// A task's version from its `mod_revision` and how it is held.
pub fn task_version(mod_revision: i64, hold: Hold) -> TaskVersion {
    let code = match hold {
        Hold::Record => 0,
        Hold::Free => 1,
        Hold::Key => 2,
    };
    TaskVersion(4 * mod_revision.max(0) as u64 + code)
}

/// The `mod_revision` a task version was read at, and how the task was held then (a code
/// no read hands out reads as free: a write at it compares what a free task's does).
pub fn read_version(version: TaskVersion) -> (i64, Hold) {
    let hold = match version.0 % 4 {
        0 => Hold::Record,
        2 => Hold::Key,
        _ => Hold::Free,
    };
    ((version.0 / 4) as i64, hold)
}

/// The position of a read at `revision`.
pub fn position(revision: i64) -> Version {
    Version(4 * revision.max(0) as u64 + 3)
}

/// The revision a position was read at (0 for `Version(0)`, "now").
pub fn revision_of(version: Version) -> i64 {
    (version.0 / 4) as i64
}

/// What a lease's owner key holds: the node that opened it, and that the replica knows
/// claim records. A replica from before records wrote its node id bare; while one of
/// those has a lease, no claim record is written (it would take a record-held task for an
/// orphan and run it again).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub node: String,
    #[serde(default)]
    pub claims: String,
}

/// [`Owner::claims`] of a replica that writes and reads claim records.
pub const CLAIM_RECORDS: &str = "records";

impl Owner {
    pub fn encode(node: &str) -> Vec<u8> {
        let owner = Owner {
            node: node.to_string(),
            claims: CLAIM_RECORDS.to_string(),
        };
        serde_json::to_vec(&owner).unwrap_or_default()
    }

    /// The owner in a stored value: JSON, or a bare node id from a replica before records.
    pub fn decode(value: &[u8]) -> Owner {
        serde_json::from_slice(value).unwrap_or_else(|_| Owner {
            node: String::from_utf8_lossy(value).into_owned(),
            claims: String::new(),
        })
    }

    pub fn knows_records(&self) -> bool {
        self.claims == CLAIM_RECORDS
    }
}

/// What a record says: the tasks one write claimed, or those it let go.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claimed: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released: Vec<String>,
}

impl Record {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A record as written: one kind, at least one task. Anything else (another program's
    /// value) is no record.
    pub fn decode(value: &[u8]) -> Option<Record> {
        let record: Record = serde_json::from_slice(value).ok()?;
        (record.claimed.is_empty() != record.released.is_empty()).then_some(record)
    }

    /// Whether a change to a record (a claim, a completion's garbage, a lease's end) may
    /// move the hold of a task under `prefix`: the record names one, before or after the
    /// change, or a value involved is not one this can read (or was not sent).
    pub fn change_concerns(event: &Event, prefix: &str) -> bool {
        let names = |value: &[u8]| {
            Record::decode(value)
                .is_none_or(|record| record.keys().iter().any(|key| key.starts_with(prefix)))
        };
        let before = event.prev_kv.as_ref().map(|kv| &kv.value[..]);
        if event.deleted() {
            before.is_none_or(names)
        } else {
            names(&event.kv.value) || before.is_some_and(names)
        }
    }

    fn claims(&self) -> bool {
        !self.claimed.is_empty()
    }

    fn keys(&self) -> &[String] {
        if self.claims() {
            &self.claimed
        } else {
            &self.released
        }
    }
}

/// A record as read: its key, when it was made (records are never rewritten), its lease.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Read {
    key: String,
    revision: i64,
    lease: i64,
    record: Record,
}

fn read_records(records: &[Kv]) -> Vec<Read> {
    records
        .iter()
        .filter_map(|kv| {
            Some(Read {
                key: String::from_utf8(kv.key.clone()).ok()?,
                revision: kv.create_revision,
                lease: kv.lease,
                record: Record::decode(&kv.value)?,
            })
        })
        .collect()
}

/// Who holds each task, from the claim keys and the records read with it.
///
/// A task is held by a claim key of its own if one exists. Otherwise the latest record
/// naming it decides: a claim record holds it, for that record's lease, unless the task
/// was created after it (a task completed and made again under the same key is a new
/// one); a release record, or none, leaves it free. A claim is only ever written for a
/// free task and always with a write of the task, and a release only for a held one, so
/// the records naming a task alternate and the latest is the one that counts. A record
/// dies with its lease, and its tasks are free (orphans) from that revision on.
#[derive(Debug, Default)]
pub struct Holders {
    keys: HashMap<Vec<u8>, i64>,
    /// Per task: the latest record naming it (revision, lease, whether it claims, name).
    latest: HashMap<String, (i64, i64, bool, String)>,
}

impl Holders {
    /// From the claim keys (under `claims_prefix`) and the records read at one revision.
    pub fn new(claims_prefix: &str, claims: &[Kv], records: &[Kv]) -> Holders {
        let keys = claims
            .iter()
            .filter_map(|claim| {
                claim
                    .key
                    .strip_prefix(claims_prefix.as_bytes())
                    .map(|task| (task.to_vec(), claim.lease))
            })
            .collect();
        let mut latest: HashMap<String, (i64, i64, bool, String)> = HashMap::new();
        for read in read_records(records) {
            for task in read.record.keys() {
                let entry = (
                    read.revision,
                    read.lease,
                    read.record.claims(),
                    read.key.clone(),
                );
                match latest.get(task) {
                    Some((revision, ..)) if *revision >= read.revision => {}
                    _ => {
                        latest.insert(task.clone(), entry);
                    }
                }
            }
        }
        Holders { keys, latest }
    }

    /// How the task at `key`, created at `created`, is held, and by which lease (0: a
    /// claim not attached to any, someone's by hand).
    pub fn hold(&self, key: &[u8], created: i64) -> (Hold, i64) {
        if let Some(lease) = self.keys.get(key) {
            return (Hold::Key, *lease);
        }
        let latest = std::str::from_utf8(key)
            .ok()
            .and_then(|key| self.latest.get(key));
        match latest {
            Some((revision, lease, true, _)) if *revision >= created => (Hold::Record, *lease),
            _ => (Hold::Free, 0),
        }
    }

    /// The claim record holding the task at `key`, created at `created`, if one does.
    pub fn record(&self, key: &str, created: i64) -> Option<&str> {
        match self.latest.get(key) {
            Some((revision, _, true, name))
                if *revision >= created && !self.keys.contains_key(key.as_bytes()) =>
            {
                Some(name)
            }
            _ => None,
        }
    }
}

/// The records that say nothing any more, given every task under `prefix` as read at the
/// same revision (key and `create_revision`): deleting them all at once changes no task's
/// holder, now or later. Only records whose every task lies under `prefix` are judged.
///
/// A task is past a record if it is gone or was created after it (neither ever turns
/// back). A claim record goes once each of its tasks is past it or named by a later
/// record. A release record goes once each of its tasks is past it, named by a later
/// record, or named by no earlier claim record that stays. (A release left latest with no
/// claim before it leaves its task free, as no record does.)
///
/// `tasks` are gone through once, and only those a record names are kept: a listing of a
/// large queue is not copied for a few records.
pub fn garbage<'t>(
    records: &[Kv],
    prefix: &str,
    tasks: impl IntoIterator<Item = (&'t str, i64)>,
) -> Vec<String> {
    let reads = read_records(records);
    if reads.is_empty() {
        return Vec::new();
    }
    let judged = |read: &Read| read.record.keys().iter().all(|k| k.starts_with(prefix));
    let mut naming: HashMap<&str, Vec<(i64, bool, usize)>> = HashMap::new();
    for (at, read) in reads.iter().enumerate() {
        for task in read.record.keys() {
            naming
                .entry(task)
                .or_default()
                .push((read.revision, read.record.claims(), at));
        }
    }
    let tasks: HashMap<&str, i64> = tasks
        .into_iter()
        .filter(|(key, _)| naming.contains_key(key))
        .collect();
    let past =
        |task: &str, revision: i64| tasks.get(task).is_none_or(|created| *created > revision);
    let later = |task: &str, revision: i64| {
        naming
            .get(task)
            .is_some_and(|all| all.iter().any(|(other, ..)| *other > revision))
    };
    let mut gone = vec![false; reads.len()];
    for (at, read) in reads.iter().enumerate() {
        gone[at] = read.record.claims()
            && judged(read)
            && read
                .record
                .keys()
                .iter()
                .all(|task| past(task, read.revision) || later(task, read.revision));
    }
    let mut found = Vec::new();
    for (at, read) in reads.iter().enumerate() {
        let release_gone = !read.record.claims()
            && judged(read)
            && read.record.keys().iter().all(|task| {
                past(task, read.revision)
                    || later(task, read.revision)
                    || naming.get(task.as_str()).is_none_or(|all| {
                        all.iter().all(|(other, claims, which)| {
                            *other > read.revision || !claims || gone[*which]
                        })
                    })
            });
        if gone[at] || release_gone {
            found.push(read.key.clone());
        }
    }
    found
}

/// What the last-leader key holds: the record, and the token it led with.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastLeader {
    #[serde(flatten)]
    pub record: HolderRecord,
    #[serde(default)]
    pub token: u64,
}

impl LastLeader {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(value: &[u8]) -> Option<LastLeader> {
        serde_json::from_slice(value).ok()
    }
}

/// Seconds of an etcd lease for a TTL: whole seconds, rounded up (etcd counts in seconds
/// and raises a TTL below its minimum itself), at least 1.
pub fn ttl_seconds(ttl: std::time::Duration) -> i64 {
    let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    seconds.max(1) as i64
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Campaigners sit under `<leader_key>/` by lease hex; owners and claims sort outside
    /// that prefix.
    #[test]
    fn keys_follow_the_leader_key() {
        let layout = Layout::new("consumerLeader");
        assert_eq!(layout.candidate(255), "consumerLeader/ff");
        assert_eq!(layout.owner(255), "consumerLeader.owner/ff");
        assert_eq!(
            layout.claim("oracleTask/t1"),
            "consumerLeader.claims/oracleTask/t1"
        );
        let prefix = layout.candidates();
        let end = crate::coord::etcd::client::prefix_end(prefix.as_bytes());
        for outside in [
            layout.owner(1),
            layout.claim("q/a"),
            layout.last().to_string(),
        ] {
            assert!(
                !(outside.as_bytes() >= prefix.as_bytes() && outside.as_bytes() < &end[..]),
                "{outside} lies among the candidates"
            );
        }
    }

    /// A claim's death moves the version; versions and positions read back.
    #[test]
    fn versions_move_when_a_claim_dies_and_read_back() {
        let held = task_version(7, Hold::Key);
        let recorded = task_version(7, Hold::Record);
        let orphan = task_version(7, Hold::Free);
        assert_ne!(held, orphan);
        assert_ne!(recorded, orphan);
        assert_ne!(recorded, held);
        assert_eq!(read_version(held), (7, Hold::Key));
        assert_eq!(read_version(recorded), (7, Hold::Record));
        assert_eq!(read_version(orphan), (7, Hold::Free));
        assert!(position(7).0 >= held.0);
        assert!(position(7).0 >= orphan.0 && position(7) > position(6));
        assert_eq!(revision_of(position(7)), 7);
        assert_eq!(revision_of(Version(0)), 0);
    }

    /// Lease ids are hex both ways; anything else is no etcd lease.
    #[test]
    fn lease_ids_are_hex() {
        assert_eq!(lease_id(0x694d8a).0, "694d8a");
        assert_eq!(lease_number(&LeaseId("694d8a".into())), Some(0x694d8a));
        assert_eq!(lease_number(&LeaseId("not-hex".into())), None);
        assert_eq!(lease_number(&LeaseId("0".into())), None);
    }

    /// TTLs round up to whole seconds.
    #[test]
    fn ttls_round_up_to_seconds() {
        assert_eq!(ttl_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(ttl_seconds(Duration::from_secs(15)), 15);
        assert_eq!(ttl_seconds(Duration::from_millis(10)), 1);
    }

    /// The last leader's record reads as a plain holder record too.
    #[test]
    fn the_last_leader_is_a_holder_record_with_a_token() {
        let last = LastLeader {
            record: HolderRecord {
                node: "n1".into(),
                ..HolderRecord::default()
            },
            token: 42,
        };
        let value = last.encode();
        assert_eq!(LastLeader::decode(&value), Some(last.clone()));
        assert_eq!(HolderRecord::decode(&value), Some(last.record));
    }
    fn record(name: &str, revision: i64, lease: i64, record: Record) -> Kv {
        Kv {
            key: name.as_bytes().to_vec(),
            create_revision: revision,
            mod_revision: revision,
            version: 1,
            value: record.encode(),
            lease,
        }
    }

    fn claimed(keys: &[&str]) -> Record {
        Record {
            claimed: keys.iter().map(|k| k.to_string()).collect(),
            ..Record::default()
        }
    }

    fn released(keys: &[&str]) -> Record {
        Record {
            released: keys.iter().map(|k| k.to_string()).collect(),
            ..Record::default()
        }
    }

    /// The latest record naming a task decides, across leases; a task created after a
    /// claim record is not its; a claim key of its own comes first.
    #[test]
    fn the_latest_record_naming_a_task_decides() {
        let records = [
            record("L.held/a/1", 10, 0xa, claimed(&["q/t", "q/u"])),
            record("L.held/a/2", 20, 0, released(&["q/t"])),
            record("L.held/b/1", 30, 0xb, claimed(&["q/t"])),
            record("L.held/b/2", 5, 0xb, claimed(&["q/v"])),
            record("L.held/x", 40, 0xc, Record::default()),
        ];
        let claims = [Kv {
            key: b"L.claims/q/w".to_vec(),
            lease: 0xd,
            ..Kv::default()
        }];
        let holders = Holders::new("L.claims/", &claims, &records);
        assert_eq!(holders.hold(b"q/t", 3), (Hold::Record, 0xb));
        assert_eq!(holders.hold(b"q/u", 3), (Hold::Record, 0xa));
        // Created again after the record that claimed the task under that key.
        assert_eq!(holders.hold(b"q/v", 6), (Hold::Free, 0));
        assert_eq!(holders.hold(b"q/w", 1), (Hold::Key, 0xd));
        assert_eq!(holders.hold(b"q/z", 1), (Hold::Free, 0));
        let released_last = [
            record("L.held/a/1", 10, 0xa, claimed(&["q/t"])),
            record("L.held/a/2", 20, 0, released(&["q/t"])),
        ];
        let holders = Holders::new("L.claims/", &[], &released_last);
        assert_eq!(holders.hold(b"q/t", 3), (Hold::Free, 0));
    }

    /// A record's change concerns a prefix's listing when the record names a task under
    /// it, before or after; a value that cannot be read, or was not sent, may.
    #[test]
    fn a_record_change_concerns_the_prefixes_it_names() {
        let kv = |record: &[u8]| Kv {
            key: b"l.held/1/2".to_vec(),
            value: record.to_vec(),
            ..Kv::default()
        };
        let queue = claimed(&["q/a", "q/b"]).encode();
        let put = |value: &[u8], before: Option<&[u8]>| Event {
            kind: String::new(),
            kv: kv(value),
            prev_kv: before.map(kv),
        };
        let delete = |before: Option<&[u8]>| Event {
            kind: "DELETE".into(),
            kv: kv(b""),
            prev_kv: before.map(kv),
        };
        for event in [put(&queue, None), delete(Some(&queue))] {
            assert!(Record::change_concerns(&event, "q/"), "{event:?}");
            assert!(!Record::change_concerns(&event, "schedules/"), "{event:?}");
            assert!(Record::change_concerns(&event, ""), "{event:?}");
        }
        let release = released(&["s/x"]).encode();
        assert!(Record::change_concerns(&put(&release, None), "s/"));
        // An operator's rewrite of a record away from the prefix moves its task.
        assert!(Record::change_concerns(&put(&release, Some(&queue)), "q/"));
        assert!(Record::change_concerns(&delete(None), "schedules/"));
        assert!(Record::change_concerns(
            &put(b"not json", None),
            "schedules/"
        ));
        assert!(Record::change_concerns(&delete(Some(b"{}")), "schedules/"));
    }

    /// A record is of one kind and names a task; anything else is no record.
    #[test]
    fn records_read_back_and_others_are_none() {
        let record = claimed(&["q/a"]);
        assert_eq!(Record::decode(&record.encode()), Some(record));
        assert_eq!(Record::decode(b"{}"), None);
        assert_eq!(
            Record::decode(br#"{"claimed":["a"],"released":["b"]}"#),
            None
        );
        assert_eq!(Record::decode(b"not json"), None);
    }

    /// An owner key written now knows records; a bare node id is a replica's from before.
    #[test]
    fn owners_say_whether_they_know_records() {
        let now = Owner::decode(&Owner::encode("n1"));
        assert_eq!(now.node, "n1");
        assert!(now.knows_records());
        let before = Owner::decode(b"n1");
        assert_eq!(before.node, "n1");
        assert!(!before.knows_records());
    }

    /// Garbage: claim records whose tasks are all gone, created again, or named by a later
    /// record; release records whose tasks no remaining claim record names before them.
    /// Deleting it all changes no task's holder.
    #[test]
    fn garbage_is_what_no_holder_depends_on() {
        let records = [
            // t done; u released and pending: the claim record is garbage, the release
            // record answers nothing that stays.
            record("L.held/a/1", 10, 0xa, claimed(&["q/t", "q/u"])),
            record("L.held/a/2", 20, 0, released(&["q/u"])),
            // v released, then claimed again and running.
            record("L.held/a/3", 11, 0xa, claimed(&["q/v"])),
            record("L.held/a/4", 21, 0, released(&["q/v"])),
            record("L.held/a/5", 31, 0xa, claimed(&["q/v"])),
            // w running; x released while w runs: the release record must stay while
            // the claim record naming x does.
            record("L.held/a/6", 12, 0xa, claimed(&["q/w", "q/x"])),
            record("L.held/a/7", 22, 0, released(&["q/x"])),
            // y created again after its claim record.
            record("L.held/a/8", 13, 0xa, claimed(&["q/y"])),
            // Another queue's task: not judged.
            record("L.held/a/9", 14, 0xa, claimed(&["other/z"])),
        ];
        let tasks: HashMap<&str, i64> =
            [("q/u", 1), ("q/v", 1), ("q/w", 1), ("q/x", 1), ("q/y", 50)]
                .into_iter()
                .collect();
        let mut found = garbage(&records, "q/", tasks.iter().map(|(k, c)| (*k, *c)));
        found.sort();
        assert_eq!(
            found,
            [
                "L.held/a/1",
                "L.held/a/2",
                "L.held/a/3",
                "L.held/a/4",
                "L.held/a/8"
            ]
        );
        let holders = |records: &[Kv]| {
            let holders = Holders::new("L.claims/", &[], records);
            ["q/u", "q/v", "q/w", "q/x", "q/y"]
                .map(|task| holders.hold(task.as_bytes(), tasks[task]))
        };
        let kept: Vec<Kv> = records
            .iter()
            .filter(|kv| {
                !found
                    .iter()
                    .any(|name| name.as_bytes() == kv.key.as_slice())
            })
            .cloned()
            .collect();
        assert_eq!(holders(&records), holders(&kept));
        assert_eq!(holders(&kept)[2], (Hold::Record, 0xa));
        assert_eq!(holders(&kept)[3], (Hold::Free, 0));
    }
}
