//! Durability for the embedded server: one redb file in the data dir holds every KV entry,
//! tombstone, session, check, the node and the indexes.
//!
//! `persist` writes what `State::take_changes` reports in one fsync'd commit, so the server
//! can acknowledge a whole batch of writes with one disk flush. `open` loads everything back
//! into a `Snapshot`. Timers and lock-delays are not stored: they restart, as in Consul.
//! This module knows nothing of HTTP; it reads the state only to copy out changed items.
//!
//! Size: one redb table per state table, each loaded and persisted, and the durability
//! tests.

mod catalog;

use std::path::{Path, PathBuf};
use std::time::Duration;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::state::{
    Behavior, Changes, Check, CheckStatus, Entry, Node, ServiceCheck, Session, Snapshot, State,
    TableIndexes,
};

/// The file inside the data dir.
pub const DATA_FILE: &str = "leaderq.redb";
/// Bumped when the on-disk encoding changes, so an old binary refuses a newer file.
const FORMAT_VERSION: u64 = 1;
/// redb caches pages it reads; the server keeps everything in memory already, so a small
/// cache keeps RSS low without slowing commits.
const CACHE_BYTES: usize = 8 * 1024 * 1024;

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const TOMBSTONES: TableDefinition<&str, u64> = TableDefinition::new("tombstones");
const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
const CHECKS: TableDefinition<&str, &[u8]> = TableDefinition::new("checks");
const SERVICES: TableDefinition<&str, &[u8]> = TableDefinition::new("services");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create data dir {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot open data file {path}: {reason}; if it is damaged, move it aside to start empty"
    )]
    Open { path: PathBuf, reason: String },
    #[error(
        "data file {path} is corrupt ({what}); move it aside to start empty, or restore a backup"
    )]
    Corrupt { path: PathBuf, what: String },
    #[error("data file {path} was written by a newer leaderq (format {found}, this build reads {FORMAT_VERSION})")]
    Format { path: PathBuf, found: u64 },
    #[error("cannot write data file {path}: {reason}")]
    Write { path: PathBuf, reason: String },
}

pub struct Store {
    db: Database,
    path: PathBuf,
}

impl Store {
    /// Opens (or creates) the data file and loads what it holds. A file that is not a
    /// readable leaderq database stops the start; it is never silently replaced.
    pub fn open(dir: &Path) -> Result<(Store, Snapshot), StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(DATA_FILE);
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(&path)
            .map_err(|err| StoreError::Open {
                path: path.clone(),
                reason: err.to_string(),
            })?;
        let store = Store { db, path };
        store.init_tables()?;
        let snapshot = store.load()?;
        Ok((store, snapshot))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_err(&self, err: impl std::fmt::Display) -> StoreError {
        StoreError::Write {
            path: self.path.clone(),
            reason: err.to_string(),
        }
    }

    /// Writes `value` under `key`, or removes the key when there is no value any more.
    fn write_or_remove(
        &self,
        table: &mut redb::Table<&str, &[u8]>,
        key: &str,
        value: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        match value {
            Some(value) => table.insert(key, value).map(drop),
            None => table.remove(key).map(drop),
        }
        .map_err(|e| self.write_err(e))
    }

    fn corrupt(&self, what: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            what: what.into(),
        }
    }

    /// Creates the tables and the format marker on a new file; checks the marker otherwise.
    fn init_tables(&self) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.write_err(e))?;
        {
            txn.open_table(KV).map_err(|e| self.write_err(e))?;
            txn.open_table(TOMBSTONES).map_err(|e| self.write_err(e))?;
            txn.open_table(SESSIONS).map_err(|e| self.write_err(e))?;
            txn.open_table(CHECKS).map_err(|e| self.write_err(e))?;
            txn.open_table(SERVICES).map_err(|e| self.write_err(e))?;
            let mut meta = txn.open_table(META).map_err(|e| self.write_err(e))?;
            let found = meta
                .get("format")
                .map_err(|e| self.write_err(e))?
                .map(|v| decode_u64(v.value()));
            match found {
                None => {
                    meta.insert("format", FORMAT_VERSION.to_le_bytes().as_slice())
                        .map_err(|e| self.write_err(e))?;
                }
                Some(Some(FORMAT_VERSION)) => {}
                Some(Some(found)) => {
                    return Err(StoreError::Format {
                        path: self.path.clone(),
                        found,
                    })
                }
                Some(None) => return Err(self.corrupt("format marker")),
            }
        }
        txn.commit().map_err(|e| self.write_err(e))
    }

    fn load(&self) -> Result<Snapshot, StoreError> {
        let read_err = |e: &dyn std::fmt::Display| self.corrupt(e.to_string());
        let txn = self.db.begin_read().map_err(|e| read_err(&e))?;
        let mut snapshot = Snapshot::default();

        let kv = txn.open_table(KV).map_err(|e| read_err(&e))?;
        for item in kv.iter().map_err(|e| read_err(&e))? {
            let (key, value) = item.map_err(|e| read_err(&e))?;
            let entry = decode_entry(value.value())
                .ok_or_else(|| self.corrupt(format!("KV entry {:?}", key.value())))?;
            snapshot.kv.push((key.value().to_string(), entry));
        }
        let tombstones = txn.open_table(TOMBSTONES).map_err(|e| read_err(&e))?;
        for item in tombstones.iter().map_err(|e| read_err(&e))? {
            let (key, index) = item.map_err(|e| read_err(&e))?;
            snapshot
                .tombstones
                .push((key.value().to_string(), index.value()));
        }
        let sessions = txn.open_table(SESSIONS).map_err(|e| read_err(&e))?;
        for item in sessions.iter().map_err(|e| read_err(&e))? {
            let (key, value) = item.map_err(|e| read_err(&e))?;
            let record: SessionRecord = serde_json::from_slice(value.value())
                .map_err(|e| self.corrupt(format!("session {:?}: {e}", key.value())))?;
            snapshot.sessions.push(record.into());
        }
        let checks = txn.open_table(CHECKS).map_err(|e| read_err(&e))?;
        for item in checks.iter().map_err(|e| read_err(&e))? {
            let (key, value) = item.map_err(|e| read_err(&e))?;
            let record: CheckRecord = serde_json::from_slice(value.value())
                .map_err(|e| self.corrupt(format!("check {:?}: {e}", key.value())))?;
            snapshot.checks.push(
                record
                    .try_into()
                    .map_err(|e: String| self.corrupt(format!("check {:?}: {e}", key.value())))?,
            );
        }
        let services = txn.open_table(SERVICES).map_err(|e| read_err(&e))?;
        for item in services.iter().map_err(|e| read_err(&e))? {
            let (key, value) = item.map_err(|e| read_err(&e))?;
            let record: catalog::ServiceRecord = serde_json::from_slice(value.value())
                .map_err(|e| self.corrupt(format!("service {:?}: {e}", key.value())))?;
            snapshot.services.push(record.into());
        }
        let meta = txn.open_table(META).map_err(|e| read_err(&e))?;
        if let Some(value) = meta.get("index").map_err(|e| read_err(&e))? {
            snapshot.index = decode_u64(value.value()).ok_or_else(|| self.corrupt("index"))?;
        }
        if let Some(value) = meta.get("tables").map_err(|e| read_err(&e))? {
            let record: TablesRecord = serde_json::from_slice(value.value())
                .map_err(|e| self.corrupt(format!("table indexes: {e}")))?;
            snapshot.tables = record.into();
        }
        if let Some(value) = meta.get("node").map_err(|e| read_err(&e))? {
            let record: NodeRecord = serde_json::from_slice(value.value())
                .map_err(|e| self.corrupt(format!("node: {e}")))?;
            snapshot.node = Some(record.into());
        }
        Ok(snapshot)
    }

    /// Writes the current value of every changed item in one durable commit; returns once
    /// the data is on disk.
    pub fn persist(&self, state: &State, changes: &Changes) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        let txn = self.db.begin_write().map_err(|e| self.write_err(e))?;
        {
            let mut kv = txn.open_table(KV).map_err(|e| self.write_err(e))?;
            let mut buf = Vec::new();
            for key in &changes.kv {
                let value = state.kv_get(key).map(|entry| {
                    encode_entry(entry, &mut buf);
                    buf.as_slice()
                });
                self.write_or_remove(&mut kv, key, value)?;
            }
            let mut tombstones = txn.open_table(TOMBSTONES).map_err(|e| self.write_err(e))?;
            for key in &changes.tombstones {
                match state.tombstone(key) {
                    Some(index) => tombstones.insert(key.as_str(), index).map(drop),
                    None => tombstones.remove(key.as_str()).map(drop),
                }
                .map_err(|e| self.write_err(e))?;
            }
            let mut sessions = txn.open_table(SESSIONS).map_err(|e| self.write_err(e))?;
            for id in &changes.sessions {
                let record = state.session(id).map(|s| to_json(&SessionRecord::from(s)));
                self.write_or_remove(&mut sessions, id, record.as_deref())?;
            }
            let mut checks = txn.open_table(CHECKS).map_err(|e| self.write_err(e))?;
            for id in &changes.checks {
                let record = state.check(id).map(|c| to_json(&CheckRecord::from(c)));
                self.write_or_remove(&mut checks, id, record.as_deref())?;
            }
            let mut services = txn.open_table(SERVICES).map_err(|e| self.write_err(e))?;
            for id in &changes.services {
                let record = state
                    .service(id)
                    .map(|s| to_json(&catalog::ServiceRecord::from(s)));
                self.write_or_remove(&mut services, id, record.as_deref())?;
            }
            let mut meta = txn.open_table(META).map_err(|e| self.write_err(e))?;
            if changes.meta || changes.node {
                meta.insert("index", state.index().to_le_bytes().as_slice())
                    .map_err(|e| self.write_err(e))?;
                let tables = to_json(&TablesRecord::from(state.tables()));
                meta.insert("tables", tables.as_slice())
                    .map_err(|e| self.write_err(e))?;
            }
            if changes.node {
                if let Some(node) = state.node() {
                    let bytes = to_json(&NodeRecord::from(node));
                    meta.insert("node", bytes.as_slice())
                        .map_err(|e| self.write_err(e))?;
                }
            }
        }
        txn.commit().map_err(|e| self.write_err(e))
    }
}

fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("records serialize")
}

fn decode_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// KV entries are the bulk of the file, so they get a compact fixed layout:
/// flags, lock, create and modify index (u64 LE each), session length (u32 LE, with
/// u32::MAX for none), the session, then the value to the end.
fn encode_entry(entry: &Entry, buf: &mut Vec<u8>) {
    buf.clear();
    for n in [
        entry.flags,
        entry.lock_index,
        entry.create_index,
        entry.modify_index,
    ] {
        buf.extend_from_slice(&n.to_le_bytes());
    }
    match &entry.session {
        Some(session) => {
            buf.extend_from_slice(&(session.len() as u32).to_le_bytes());
            buf.extend_from_slice(session.as_bytes());
        }
        None => buf.extend_from_slice(&u32::MAX.to_le_bytes()),
    }
    buf.extend_from_slice(&entry.value);
}

fn decode_entry(bytes: &[u8]) -> Option<Entry> {
    let u64_at = |at: usize| decode_u64(bytes.get(at..at + 8)?);
    let session_len = u32::from_le_bytes(bytes.get(32..36)?.try_into().ok()?);
    let (session, value_at) = if session_len == u32::MAX {
        (None, 36)
    } else {
        let end = 36 + session_len as usize;
        let session = std::str::from_utf8(bytes.get(36..end)?).ok()?.to_string();
        (Some(session), end)
    };
    Some(Entry {
        flags: u64_at(0)?,
        lock_index: u64_at(8)?,
        create_index: u64_at(16)?,
        modify_index: u64_at(24)?,
        session,
        value: bytes.get(value_at..)?.to_vec(),
    })
}

#[derive(Serialize, Deserialize)]
struct SessionRecord {
    id: String,
    name: String,
    node: String,
    lock_delay_ns: u64,
    behavior: String,
    ttl: String,
    node_checks: Vec<String>,
    service_checks: Option<Vec<(String, String)>>,
    checks: Vec<String>,
    create_index: u64,
    modify_index: u64,
}

impl From<&Session> for SessionRecord {
    fn from(s: &Session) -> Self {
        SessionRecord {
            id: s.id.clone(),
            name: s.name.clone(),
            node: s.node.clone(),
            lock_delay_ns: s.lock_delay.as_nanos() as u64,
            behavior: s.behavior.as_str().to_string(),
            ttl: s.ttl.clone(),
            node_checks: s.node_checks.clone(),
            service_checks: s.service_checks.as_ref().map(|checks| {
                checks
                    .iter()
                    .map(|c| (c.id.clone(), c.namespace.clone()))
                    .collect()
            }),
            checks: s.checks.clone(),
            create_index: s.create_index,
            modify_index: s.modify_index,
        }
    }
}

impl From<SessionRecord> for Session {
    fn from(r: SessionRecord) -> Self {
        Session {
            id: r.id,
            name: r.name,
            node: r.node,
            lock_delay: Duration::from_nanos(r.lock_delay_ns),
            behavior: if r.behavior == "delete" {
                Behavior::Delete
            } else {
                Behavior::Release
            },
            ttl: r.ttl,
            node_checks: r.node_checks,
            service_checks: r.service_checks.map(|checks| {
                checks
                    .into_iter()
                    .map(|(id, namespace)| ServiceCheck { id, namespace })
                    .collect()
            }),
            checks: r.checks,
            create_index: r.create_index,
            modify_index: r.modify_index,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct CheckRecord {
    id: String,
    name: String,
    status: String,
    notes: String,
    output: String,
    service_id: String,
    ttl_ns: Option<u64>,
    create_index: u64,
    modify_index: u64,
}

impl From<&Check> for CheckRecord {
    fn from(c: &Check) -> Self {
        CheckRecord {
            id: c.id.clone(),
            name: c.name.clone(),
            status: c.status.as_str().to_string(),
            notes: c.notes.clone(),
            output: c.output.clone(),
            service_id: c.service_id.clone(),
            ttl_ns: c.ttl.map(|ttl| ttl.as_nanos() as u64),
            create_index: c.create_index,
            modify_index: c.modify_index,
        }
    }
}

impl TryFrom<CheckRecord> for Check {
    type Error = String;
    fn try_from(r: CheckRecord) -> Result<Self, String> {
        Ok(Check {
            status: CheckStatus::parse(&r.status)
                .ok_or_else(|| format!("unknown status {:?}", r.status))?,
            id: r.id,
            name: r.name,
            notes: r.notes,
            output: r.output,
            service_id: r.service_id,
            ttl: r.ttl_ns.map(Duration::from_nanos),
            create_index: r.create_index,
            modify_index: r.modify_index,
        })
    }
}

#[derive(Serialize, Deserialize)]
struct NodeRecord {
    name: String,
    id: String,
    address: String,
    create_index: u64,
    modify_index: u64,
}

impl From<&Node> for NodeRecord {
    fn from(n: &Node) -> Self {
        NodeRecord {
            name: n.name.clone(),
            id: n.id.clone(),
            address: n.address.clone(),
            create_index: n.create_index,
            modify_index: n.modify_index,
        }
    }
}

impl From<NodeRecord> for Node {
    fn from(r: NodeRecord) -> Self {
        Node {
            name: r.name,
            id: r.id,
            address: r.address,
            create_index: r.create_index,
            modify_index: r.modify_index,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct TablesRecord {
    kvs: u64,
    tombstones: u64,
    sessions: u64,
    nodes: u64,
    checks: u64,
    /// Absent in files written before services were stored.
    #[serde(default)]
    services: u64,
}

impl From<TableIndexes> for TablesRecord {
    fn from(t: TableIndexes) -> Self {
        TablesRecord {
            kvs: t.kvs,
            tombstones: t.tombstones,
            sessions: t.sessions,
            nodes: t.nodes,
            checks: t.checks,
            services: t.services,
        }
    }
}

impl From<TablesRecord> for TableIndexes {
    fn from(r: TablesRecord) -> Self {
        TableIndexes {
            kvs: r.kvs,
            tombstones: r.tombstones,
            sessions: r.sessions,
            nodes: r.nodes,
            checks: r.checks,
            services: r.services,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::state::{Command, Config, SessionSpec, DEFAULT_LOCK_DELAY};
    use std::time::Instant;

    /// Entries survive the binary codec, with and without a session and a value.
    #[test]
    fn entry_codec_round_trips() {
        let mut buf = Vec::new();
        for entry in [
            Entry {
                value: b"hello".to_vec(),
                flags: u64::MAX,
                session: Some("s-1".into()),
                lock_index: 3,
                create_index: 4,
                modify_index: 5,
            },
            Entry {
                value: Vec::new(),
                flags: 0,
                session: None,
                lock_index: 0,
                create_index: 1,
                modify_index: 1,
            },
        ] {
            encode_entry(&entry, &mut buf);
            assert_eq!(decode_entry(&buf), Some(entry));
        }
        assert_eq!(decode_entry(&[1, 2, 3]), None);
    }

    /// What was persisted is what a reopened store loads, indexes included.
    #[test]
    fn persisted_state_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let (store, snapshot) = Store::open(dir.path()).unwrap();
        let now = Instant::now();
        let mut state = State::restore(Config::default(), snapshot, now);
        let commands = vec![
            Command::RegisterNode {
                name: "n".into(),
                id: "id".into(),
                address: "127.0.0.1".into(),
            },
            Command::SessionCreate(SessionSpec {
                id: "s".into(),
                name: "x".into(),
                node: "n".into(),
                lock_delay: DEFAULT_LOCK_DELAY,
                behavior: "delete".into(),
                ttl: "30s".into(),
                node_checks: vec!["serfHealth".into()],
                service_checks: None,
                checks: Vec::new(),
            }),
            Command::KvLock {
                key: "a".into(),
                value: b"1".to_vec(),
                flags: 7,
                session: "s".into(),
            },
            Command::KvSet {
                key: "b".into(),
                value: b"2".to_vec(),
                flags: 0,
            },
            Command::KvDelete { key: "b".into() },
        ];
        for command in commands {
            state.apply(command, now).unwrap();
            let changes = state.take_changes();
            store.persist(&state, &changes).unwrap();
        }
        drop(store);
        let (_store, snapshot) = Store::open(dir.path()).unwrap();
        let reloaded = State::restore(Config::default(), snapshot, now);
        assert_eq!(reloaded.index(), state.index());
        assert_eq!(reloaded.tables(), state.tables());
        assert_eq!(reloaded.kv_get("a"), state.kv_get("a"));
        assert_eq!(reloaded.kv_get("b"), None);
        assert_eq!(reloaded.tombstone("b"), state.tombstone("b"));
        assert_eq!(reloaded.session("s"), state.session("s"));
        assert_eq!(reloaded.node(), state.node());
        assert_eq!(reloaded.checks().count(), 1);
    }

    /// A file that is not a database stops the open with a message naming the file.
    #[test]
    fn corrupt_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DATA_FILE), b"this is not a database at all").unwrap();
        let err = Store::open(dir.path())
            .err()
            .expect("must fail")
            .to_string();
        assert!(err.contains(DATA_FILE), "{err}");
    }
}
