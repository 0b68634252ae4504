//! [`Tasks`] on ZooKeeper: a prefix's znode and its children, read with their stats,
//! waited on with one persistent recursive watch, and written in `multi`s planned by
//! `plan.rs` from a read just before or from what `known.rs` kept.
//!
//! Size: the leader's writes, a lease's own and an operator's edits share the reads and
//! the `multi` of this file; why each read before a leader's write is needed is argued
//! beside it.

use std::collections::HashMap;
use std::time::Duration;

use zookeeper_client as zk;

use super::client::{commit, timed, unavailable};
use super::plan::{self, Seen, Unsent, Writer, ZkOp};
use super::{election, layout, ZkCoordinator, LIMITS, LONGEST_LATCH};
use crate::coord::{
    admit, conflict_on_all, CoordError, Edit, Edited, Effect, Expected, FencingToken, Holding,
    Leadership, LeaseId, Names, StoredTask, TaskOp, Tasks, Version, WriteCost, WriteLimits,
    Written,
};

/// Reads of tasks in flight at once: enough to keep the server busy, while the requests and
/// answers of a whole large queue (100k of them) are never held at once.
const READ_WINDOW: usize = 1024;

/// Tasks per `multiRead` (a read of each and of its claim marker): one request instead of two
/// or three per task, which is most of what a drained task costs ZooKeeper. The answer holds
/// every value read, so it is bounded by ZooKeeper's own per-node limit times this.
const READ_BATCH: usize = 64;

/// A task as read with its claim marker, in one `multiRead` with the tasks beside it.
struct Read {
    key: String,
    value: Vec<u8>,
    stat: zk::Stat,
    /// The marker's stat, if a marker holds the task.
    claim: Option<zk::Stat>,
}

/// The tasks at `keys` that exist, each with its claim marker and as `each` makes it of
/// them, after one `sync` (so that they include every write acknowledged before, whichever
/// session made it). Read `READ_BATCH` tasks to a `multiRead`, `READ_WINDOW` tasks in flight
/// at once (every request of a window is sent before its first answer is awaited); a task
/// and its marker are read in the same request, so at the same point of ZooKeeper's order.
async fn read_with_claims<'k, T>(
    client: &zk::Client,
    keys: impl Iterator<Item = &'k str>,
    mut each: impl FnMut(Read) -> T,
) -> Result<Vec<T>, CoordError> {
    let mut synced = Some(timed(client.sync("/")));
    let mut found = Vec::with_capacity(keys.size_hint().0);
    let mut keys = keys.peekable();
    while keys.peek().is_some() {
        let mut batches = Vec::new();
        for _ in 0..READ_WINDOW / READ_BATCH {
            let batch: Vec<&str> = keys.by_ref().take(READ_BATCH).collect();
            if batch.is_empty() {
                break;
            }
            let mut reader = client.new_multi_reader();
            for key in &batch {
                reader
                    .add_get_data(&layout::path_of(key))
                    .map_err(unavailable)?;
                reader
                    .add_get_data(&layout::claim_path(key))
                    .map_err(unavailable)?;
            }
            batches.push((batch, timed(reader.commit())));
        }
        if let Some(synced) = synced.take() {
            synced.await.map_err(unavailable)?;
        }
        for (batch, read) in batches {
            let results = read.await.map_err(unavailable)?;
            if results.len() != 2 * batch.len() {
                return Err(CoordError::Unavailable(format!(
                    "ZooKeeper answered {} reads of {} asked",
                    results.len(),
                    2 * batch.len()
                )));
            }
            let mut results = results.into_iter();
            for key in batch {
                let (task, marker) = (results.next(), results.next());
                let (value, stat) = match task {
                    Some(zk::MultiReadResult::Data { data, stat }) => (data, stat),
                    Some(zk::MultiReadResult::Error {
                        err: zk::Error::NoNode,
                    }) => continue,
                    Some(zk::MultiReadResult::Error { err }) => return Err(unavailable(err)),
                    _ => return Err(CoordError::Unavailable(unexpected_read(key))),
                };
                let claim = match marker {
                    Some(zk::MultiReadResult::Data { stat, .. }) => Some(stat),
                    Some(zk::MultiReadResult::Error {
                        err: zk::Error::NoNode,
                    }) => None,
                    Some(zk::MultiReadResult::Error { err }) => return Err(unavailable(err)),
                    _ => return Err(CoordError::Unavailable(unexpected_read(key))),
                };
                found.push(each(Read {
                    key: key.to_string(),
                    value,
                    stat,
                    claim,
                }));
            }
        }
    }
    Ok(found)
}

fn unexpected_read(key: &str) -> String {
    format!("ZooKeeper answered a read of {key} with something other than data")
}

/// The tasks at `keys` that exist, with their holders.
async fn read_tasks<'k>(
    client: &zk::Client,
    keys: impl Iterator<Item = &'k str>,
) -> Result<Vec<StoredTask>, CoordError> {
    read_with_claims(client, keys, |read| StoredTask {
        holder: read
            .claim
            .filter(|marker| marker.ephemeral_owner != 0)
            .map(|marker| layout::lease_of(marker.ephemeral_owner)),
        version: layout::task_version(read.stat.mzxid, read.stat.pzxid),
        created: read.stat.czxid.max(0) as u64,
        key: read.key,
        value: read.value,
    })
    .await
}

/// What a write's plan needs of `keys`: each one's data version, domain version and claim.
async fn read_seen(
    client: &zk::Client,
    keys: &[String],
) -> Result<HashMap<String, Seen>, CoordError> {
    let read = read_with_claims(client, keys.iter().map(String::as_str), |read| {
        let seen = Seen {
            data_version: read.stat.version,
            version: layout::task_version(read.stat.mzxid, read.stat.pzxid),
            claim: read.claim.map(|marker| plan::Claim {
                owner: marker.ephemeral_owner,
                data_version: marker.version,
            }),
        };
        (read.key, seen)
    });
    Ok(read.await?.into_iter().collect())
}

/// Adds `op` to `multi`.
fn add(
    multi: &mut zk::MultiWriter<'_>,
    op: &ZkOp,
    acls: zk::Acls<'static>,
) -> Result<(), zk::Error> {
    match op {
        ZkOp::Check { path, version } => multi.add_check_version(path, *version),
        ZkOp::Create {
            path,
            data,
            ephemeral,
        } => {
            let mode = if *ephemeral {
                zk::CreateMode::Ephemeral
            } else {
                zk::CreateMode::Persistent
            };
            multi.add_create(path, data, &mode.with_acls(acls))
        }
        ZkOp::SetData {
            path,
            data,
            version,
        } => multi.add_set_data(path, data, *version),
        ZkOp::Delete { path, version } => multi.add_delete(path, Some(*version)),
    }
}

/// How a `multi` ended.
enum Committed {
    /// Applied: the new stat of each op that wrote data, by position.
    Done(Vec<Option<zk::Stat>>),
    /// Op `index` failed (a check, a version, a node that exists or went): nothing applied.
    Failed(usize),
    /// The session sending it has ended.
    SessionGone,
}

async fn send(
    client: &zk::Client,
    ops: &[ZkOp],
    acls: zk::Acls<'static>,
) -> Result<Committed, CoordError> {
    if ops.is_empty() {
        return Ok(Committed::Done(Vec::new()));
    }
    let mut multi = client.new_multi_writer();
    for op in ops {
        add(&mut multi, op, acls).map_err(unavailable)?;
    }
    match commit(&mut multi).await {
        Ok(results) => Ok(Committed::Done(
            results
                .into_iter()
                .map(|result| match result {
                    zk::MultiWriteResult::SetData { stat } => Some(stat),
                    _ => None,
                })
                .collect(),
        )),
        Err(zk::MultiWriteError::OperationFailed { index, source }) => match source {
            zk::Error::NoNode
            | zk::Error::NodeExists
            | zk::Error::BadVersion
            | zk::Error::NotEmpty => Ok(Committed::Failed(index)),
            zk::Error::SessionExpired | zk::Error::ClientClosed => Ok(Committed::SessionGone),
            other => Err(unavailable(other)),
        },
        Err(zk::MultiWriteError::RequestFailed { source }) => match source {
            zk::Error::SessionExpired | zk::Error::ClientClosed => Ok(Committed::SessionGone),
            other => Err(unavailable(other)),
        },
    }
}

/// The keys a batch reads before it is planned: each task, and each dead letter it writes.
fn keys_of(ops: &[TaskOp]) -> Vec<String> {
    let mut keys: Vec<String> = ops.iter().map(|op| op.key().to_string()).collect();
    keys.extend(
        ops.iter()
            .filter_map(TaskOp::record_key)
            .map(str::to_string),
    );
    keys
}

impl Tasks for ZkCoordinator {
    /// Lists the queue; past `after`, first waits (a persistent recursive watch on the
    /// prefix's znode: a task created, rewritten or deleted, a claim made or ended) until
    /// the version moves or `wait` passes.
    async fn list(
        &self,
        prefix: &str,
        after: Version,
        wait: Duration,
    ) -> Result<(Vec<StoredTask>, Version), CoordError> {
        let main = self.main().await?;
        let (dir, _) = layout::prefix_dir(prefix);
        self.make_dir(&main, &dir).await?;
        if after == Version(0) || wait.is_zero() {
            return self.read_list(&main, prefix).await;
        }
        // The watch first, so nothing written between the read and the wait is missed.
        let mut watcher = timed(main.watch(&dir, zk::AddWatchMode::PersistentRecursive))
            .await
            .map_err(unavailable)?;
        let listed = self.read_list(&main, prefix).await?;
        if listed.1 > after {
            return Ok(listed);
        }
        let _ = tokio::time::timeout(wait, watcher.changed()).await;
        drop(watcher);
        self.read_list(&main, prefix).await
    }

    async fn keys(&self, prefix: &str) -> Result<(Names, Version), CoordError> {
        let main = self.main().await?;
        self.read_keys(&main, prefix).await
    }

    async fn get(&self, keys: &[String]) -> Result<Vec<StoredTask>, CoordError> {
        let main = self.main().await?;
        read_tasks(&main, keys.iter().map(String::as_str)).await
    }

    async fn write(&self, leadership: &Leadership, ops: &[TaskOp]) -> Result<Written, CoordError> {
        admit(self, ops, true)?;
        let (Some(client), Some(session)) = (
            self.lease_client(&leadership.lease),
            layout::session_of(&leadership.lease),
        ) else {
            return Ok(Written::NotLeader);
        };
        // Curator's SUSPENDED: the session may live on, but nothing is claimed or written
        // until the connection is back (or the session is found expired: LOST).
        if client.state() == zk::SessionState::Disconnected {
            return Err(CoordError::Unavailable(
                "the leader's ZooKeeper connection is suspended: no writes until it is back".into(),
            ));
        }
        // What must be read before the multi, and why (see the module header of `mod.rs`
        // for the guarantees): only what the multi's own checks cannot stand for.
        // - The guard (the latch's name, the marker's version) is known from this
        //   leadership's win: the multi checks the latch still exists and the marker is
        //   at that version, so a lost session, a latch deleted by an operator or by
        //   expiry, or a later win (which rewrites the marker) fails it whole. No `sync`,
        //   children or marker read is needed for it. A leadership this process did not
        //   see win (or an older one of the same lease) reads them, as before.
        // - A task this process claimed is known as its claim's multi left it (its data
        //   version, its marker owned by this session at version 0), recorded under the
        //   version that write handed out: while the task is at that version nothing
        //   changed it, and if anything did (a data write, the marker's end with the
        //   session or by hand, the task deleted), the completion's conditioned deletes
        //   fail the multi. Its history record or dead letter is created, not read first:
        //   if one exists the multi fails as a conflict and the next try reads.
        // - Every other task (a claim from the listing, an orphan, a retry) is read, behind
        //   a `sync`: the plan needs its data version, which the seam's version does not
        //   carry, and whether a marker holds it.
        let known_guard = self.known_guard(leadership);
        let mut seen: HashMap<String, Seen> = HashMap::new();
        let mut to_read = Vec::new();
        {
            let claimed = self.claimed();
            for op in ops {
                // An op that ends this lease's claim on a task at its version: a delete
                // (not a finish, which may find its task gone, so it is read) or a release.
                let at_version = matches!(op.requires().task, Expected::Version(_));
                let own = at_version
                    && matches!(
                        op.effect(),
                        Effect::Delete { .. }
                            | Effect::Put {
                                holding: Holding::Nobody,
                                ..
                            }
                    );
                match claimed.get(op.key()) {
                    Some(task) if own && task.version == op.version() => {
                        seen.insert(op.key().to_string(), task.clone());
                    }
                    _ => {
                        to_read.push(op.key().to_string());
                        // A dead letter's key is read, to overwrite one that is there; a
                        // history record is created, and a finish that finds one conflicts.
                        if let (Some(to), true) = (op.record_key(), at_version) {
                            to_read.push(to.to_string());
                        }
                    }
                }
            }
        }
        let read = async {
            if to_read.is_empty() {
                Ok(HashMap::new())
            } else {
                read_seen(&client, &to_read).await
            }
        };
        let guard = match known_guard {
            Some(guard) => {
                seen.extend(read.await?);
                guard
            }
            None => {
                let dir = layout::path_of(&self.settings.leader_key);
                let marker_path = format!("{dir}/{}", layout::MARKER);
                let synced = timed(client.sync("/"));
                let children = timed(client.list_children(&dir));
                let marker = timed(client.get_data(&marker_path));
                let lost = |err: zk::Error| match err {
                    zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::NoNode => {
                        Ok(Written::NotLeader)
                    }
                    other => Err(unavailable(other)),
                };
                if let Err(err) = synced.await {
                    return lost(err);
                }
                let children = match children.await {
                    Ok(children) => children,
                    Err(err) => return lost(err),
                };
                let (marker_data, marker) = match marker.await {
                    Ok(marker) => marker,
                    Err(err) => return lost(err),
                };
                seen.extend(read.await?);
                let Some(latch) = layout::latches(&children)
                    .into_iter()
                    .find(|latch| latch.session == session)
                else {
                    return Ok(Written::NotLeader);
                };
                if election::token_of(&marker_data, marker.mzxid) != leadership.fencing_token {
                    return Ok(Written::NotLeader);
                }
                // The latch's data is written once, at creation.
                self.remember_guard(leadership, &latch.name, 0, marker.version);
                election::guard(&self.settings.leader_key, &latch.name, 0, marker.version)
            }
        };
        let guard_len = guard.len();
        let planned = match plan::plan(guard, ops, &seen, Writer::Leader { session }) {
            Ok(planned) => planned,
            Err(Unsent::Conflict(keys)) => {
                self.forget_claimed(ops);
                return Ok(Written::Conflict(keys));
            }
            Err(Unsent::NotOwn) => return Ok(Written::NotLeader),
        };
        // Dead letters and created keys may be the first under their parents.
        let new_keys: Vec<&str> = ops
            .iter()
            .filter_map(|op| match op.requires().task {
                Expected::Absent => Some(op.key()),
                _ => op.record_key(),
            })
            .collect();
        self.make_parents(&client, &new_keys).await?;
        let committed = send(&client, &planned.ops, self.acls()).await;
        if !matches!(committed, Ok(Committed::Done(_))) {
            self.forget_claimed(ops);
        }
        match committed? {
            Committed::Done(stats) => {
                let (written, answer) = plan::committed(&planned, stats, leadership.fencing_token);
                self.remember_claimed(session, ops, &seen, &written);
                Ok(answer)
            }
            Committed::Failed(index) => {
                if index < guard_len {
                    self.forget_guard(leadership);
                }
                Ok(self.forget_made(plan::failed(&planned, index)))
            }
            Committed::SessionGone => Ok(Written::NotLeader),
        }
    }

    /// Writes tasks `lease` holds itself, all or nothing; a batch with any other task, or
    /// one that moved, is left alone.
    async fn write_own(&self, lease: &LeaseId, ops: &[TaskOp]) -> Result<Written, CoordError> {
        admit(self, ops, false)?;
        let (Some(client), Some(session)) = (self.lease_client(lease), layout::session_of(lease))
        else {
            // Its claims ended with its session.
            return Ok(conflict_on_all(ops));
        };
        let seen = read_seen(&client, &keys_of(ops)).await?;
        let Ok(planned) = plan::plan(Vec::new(), ops, &seen, Writer::Own { session }) else {
            return Ok(conflict_on_all(ops));
        };
        let dead: Vec<&str> = ops.iter().filter_map(TaskOp::record_key).collect();
        self.make_parents(&client, &dead).await?;
        match send(&client, &planned.ops, self.acls()).await? {
            // `write_own`'s callers read only whether it applied: no versions are kept.
            Committed::Done(_) => Ok(Written::Done {
                versions: Vec::new(),
                fencing_token: FencingToken(0),
            }),
            Committed::Failed(_) => {
                self.made().clear();
                Ok(conflict_on_all(ops))
            }
            Committed::SessionGone => Ok(conflict_on_all(ops)),
        }
    }

    /// A producer's or operator's edit, all or nothing: creates only keys that do not
    /// exist, deletes and replaces only at the version read.
    async fn edit(&self, ops: &[Edit]) -> Result<Edited, CoordError> {
        if ops.is_empty() {
            return Ok(Edited::Done);
        }
        let main = self.main().await?;
        let keys: Vec<String> = ops.iter().map(|op| op.key().to_string()).collect();
        let seen = read_seen(&main, &keys).await?;
        let mut conflicts = Vec::new();
        let mut planned: Vec<(ZkOp, String)> = Vec::new();
        for op in ops {
            match op {
                Edit::Create { key, value } => {
                    if seen.contains_key(key) {
                        conflicts.push(key.clone());
                        continue;
                    }
                    let op = ZkOp::Create {
                        path: layout::path_of(key),
                        data: value.clone(),
                        ephemeral: false,
                    };
                    planned.push((op, key.clone()));
                }
                Edit::Put { key, value } => {
                    // Another writer creating or deleting it meanwhile fails the multi,
                    // answered as a conflict on it: the caller puts again.
                    let op = if seen.contains_key(key) {
                        ZkOp::SetData {
                            path: layout::path_of(key),
                            data: value.clone(),
                            version: None,
                        }
                    } else {
                        ZkOp::Create {
                            path: layout::path_of(key),
                            data: value.clone(),
                            ephemeral: false,
                        }
                    };
                    planned.push((op, key.clone()));
                }
                Edit::Delete { key, version } | Edit::Replace { key, version, .. } => {
                    let Some(task) = seen.get(key).filter(|task| task.version == *version) else {
                        conflicts.push(key.clone());
                        continue;
                    };
                    if let Some(claim) = task.claim {
                        let op = ZkOp::Delete {
                            path: layout::claim_path(key),
                            version: claim.data_version,
                        };
                        planned.push((op, key.clone()));
                    }
                    let path = layout::path_of(key);
                    let op = match op {
                        Edit::Replace { value, .. } => ZkOp::SetData {
                            path,
                            data: value.clone(),
                            version: Some(task.data_version),
                        },
                        _ => ZkOp::Delete {
                            path,
                            version: task.data_version,
                        },
                    };
                    planned.push((op, key.clone()));
                }
            }
        }
        if !conflicts.is_empty() {
            return Ok(Edited::Conflict(conflicts));
        }
        let created: Vec<&str> = ops
            .iter()
            .filter_map(|op| match op {
                Edit::Create { key, .. } | Edit::Put { key, .. } => Some(key.as_str()),
                Edit::Delete { .. } | Edit::Replace { .. } => None,
            })
            .collect();
        self.make_parents(&main, &created).await?;
        let (zk_ops, zk_keys): (Vec<ZkOp>, Vec<String>) = planned.into_iter().unzip();
        match send(&main, &zk_ops, self.acls()).await? {
            Committed::Done(_) => Ok(Edited::Done),
            Committed::Failed(index) => Ok(Edited::Conflict(
                self.forget_made(zk_keys.get(index))
                    .cloned()
                    .into_iter()
                    .collect(),
            )),
            Committed::SessionGone => Err(CoordError::Unavailable(
                "the ZooKeeper session ended during the edit; try again".into(),
            )),
        }
    }

    fn limits(&self) -> WriteLimits {
        LIMITS
    }

    fn cost(&self, op: &TaskOp) -> WriteCost {
        plan::cost(op, self.root_len())
    }

    fn guard_cost(&self) -> WriteCost {
        let guard = election::guard(&self.settings.leader_key, LONGEST_LATCH, 0, 0);
        WriteCost {
            ops: guard.len(),
            bytes: guard.iter().map(|op| op.encoded_len(self.root_len())).sum(),
        }
    }
}

impl ZkCoordinator {
    /// After a failed `multi`: forgets which znodes were made, in case an operator deleted a
    /// parent (a dead letter's create then fails until it is made again). Passes `key` on.
    fn forget_made<T>(&self, key: T) -> T {
        self.made().clear();
        key
    }

    /// Makes the parents of the dead letters in `ops` exist, so their creation in a `multi`
    /// cannot fail for a missing parent.
    async fn make_parents(&self, client: &zk::Client, keys: &[&str]) -> Result<(), CoordError> {
        for key in keys {
            if let Some(parent) = layout::parent(&layout::path_of(key)) {
                self.make_dir(client, parent).await?;
            }
        }
        Ok(())
    }

    /// The tasks under `prefix` and the queue's version: the latest of the prefix znode's
    /// `pzxid` (tasks created or deleted) and every task's version.
    async fn read_list(
        &self,
        client: &zk::Client,
        prefix: &str,
    ) -> Result<(Vec<StoredTask>, Version), CoordError> {
        let (keys, dir_version) = self.read_keys(client, prefix).await?;
        let keys: Vec<String> = keys.iter().collect();
        let tasks = read_tasks(client, keys.iter().map(String::as_str)).await?;
        let newest = tasks.iter().map(|t| t.version.0).max().unwrap_or(0);
        Ok((tasks, Version(dir_version.0.max(newest))))
    }

    async fn read_keys(
        &self,
        client: &zk::Client,
        prefix: &str,
    ) -> Result<(Names, Version), CoordError> {
        let (dir, start) = layout::prefix_dir(prefix);
        let synced = timed(client.sync("/"));
        let children = timed(client.get_children(&dir));
        synced.await.map_err(unavailable)?;
        let (mut names, stat) = match children.await {
            Ok(found) => found,
            Err(zk::Error::NoNode) => return Ok((Names::new(), Version(0))),
            Err(err) => return Err(unavailable(err)),
        };
        // ZooKeeper's own subtree is left out when the prefix lists the root. The keys
        // share the directory's path, so sorting the names sorts them.
        names.retain(|name| name.starts_with(&start) && !(dir == "/" && name == "zookeeper"));
        names.sort_unstable();
        let base = layout::child_key(&dir, "").len();
        let bytes = names.iter().map(|name| base + name.len()).sum();
        let mut keys = Names::with_capacity(prefix, names.len(), bytes);
        for name in &names {
            keys.push(&layout::child_key(&dir, name));
        }
        Ok((keys, Version(stat.pzxid.max(0) as u64)))
    }
}
