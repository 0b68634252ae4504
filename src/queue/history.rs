//! The leader's upkeep of the history of finished tasks: a task of its own for the whole
//! term, beside the claims (never on their path, whatever the backlog), deletes now and
//! then (every [`HISTORY_PRUNE_EVERY`], or [`HISTORY_PRUNE_AGAIN`] while a large backlog of
//! records is being worked off) the records that `[queue] history_keep` and
//! `history_max_age` no longer keep, at the versions it read (a key of several records on
//! both sides of the count is cut to its newest, not deleted).
//! The records themselves are written by the completions (`run.rs`); what they hold and
//! which to drop is `task::history`'s business. A completion's record takes the task's
//! kept output (`output.rs`) with it: once the record is deleted, the output records of
//! its runs that finished by then are deleted too, at the versions read.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::AbortOnDropHandle;

use super::clock::Clock;
use super::output::{forget_prefixes, output_key, output_prefix};
use super::Queue;
use crate::coord::{Coordinator, Edit, Edited, StoredTask};
use crate::observe::Metrics;
use crate::task::history::{cut_to_newest, to_prune, HistoryRecord, Prune, Retention};
use crate::task::output::OutputRecord;

/// How often the leader looks at the history's size.
pub(super) const HISTORY_PRUNE_EVERY: Duration = Duration::from_secs(30);
/// At most this many records are deleted in one look (twenty writes), so that pruning a
/// large history delays the next claim by a few writes only; the rest is deleted in the
/// looks that follow, [`HISTORY_PRUNE_AGAIN`] apart.
const PRUNE_PER_LOOK: usize = 1280;
/// How soon the leader looks again after a look that left records to prune.
pub(super) const HISTORY_PRUNE_AGAIN: Duration = Duration::from_millis(500);
/// Records deleted per edit: Consul's 64 operations per transaction, and etcd's 128 at two
/// per delete.
const PRUNE_BATCH: usize = 64;

impl Queue {
    /// Starts the history's upkeep for this term: it prunes HISTORY_PRUNE_AGAIN into the
    /// term (once the first claims are on their way), then every HISTORY_PRUNE_EVERY
    /// (HISTORY_PRUNE_AGAIN while records are left to prune). Its
    /// deletes are conditioned on the versions read, so a pruner of an earlier term that
    /// still runs is harmless; dropped, the handle stops it.
    pub(super) fn keep_history(&self) -> AbortOnDropHandle<()> {
        let pruner = Pruner {
            coord: self.coord.clone(),
            prefix: self.settings.done_prefix.clone(),
            queue_prefix: self.settings.prefix.clone(),
            retention: Retention {
                keep: self.settings.history_keep,
                max_age: self.settings.history_max_age,
            },
            metrics: self.metrics.clone(),
            clock: self.clock(),
        };
        AbortOnDropHandle::new(tokio::spawn(async move {
            tokio::time::sleep(HISTORY_PRUNE_AGAIN).await;
            loop {
                let next = if pruner.prune().await {
                    HISTORY_PRUNE_AGAIN
                } else {
                    HISTORY_PRUNE_EVERY
                };
                tokio::time::sleep(next).await;
            }
        }))
    }
}

/// What pruning the history needs, owned by its task.
struct Pruner {
    coord: Arc<dyn Coordinator>,
    prefix: String,
    queue_prefix: String,
    retention: Retention,
    metrics: Arc<Metrics>,
    clock: Clock,
}

impl Pruner {
    /// Deletes the history records retention drops, at most PRUNE_PER_LOOK of them;
    /// answers whether more are left. Errors are logged and left for the next time:
    /// pruning never costs the leadership.
    async fn prune(&self) -> bool {
        let started = self.clock.instant();
        let prefix = &self.prefix;
        let keys = match self.coord.keys(prefix).await {
            Ok((keys, _)) => keys,
            Err(err) => {
                self.metrics.coordinator_error(&err);
                tracing::debug!(error = %err, "cannot read the history's keys; pruning later");
                return false;
            }
        };
        let drop = to_prune(keys.iter(), prefix, self.retention, self.clock.now());
        let more = drop.len() > PRUNE_PER_LOOK;
        let mut pruned = 0;
        for chunk in drop[..drop.len().min(PRUNE_PER_LOOK)].chunks(PRUNE_BATCH) {
            let keys: Vec<String> = chunk.iter().map(|prune| prune.key.clone()).collect();
            let found = match self.coord.get(&keys).await {
                Ok(found) => found,
                Err(err) => {
                    self.metrics.coordinator_error(&err);
                    break;
                }
            };
            let ops = prune_ops(&found, chunk);
            match self.coord.edit(&ops).await {
                Ok(Edited::Done) => {
                    pruned += ops.len();
                    self.prune_output(&dropped_records(&found, chunk)).await;
                }
                // Another pruner (a leader before this one) got there first.
                Ok(Edited::Conflict(_)) => {}
                Err(err) => {
                    self.metrics.coordinator_error(&err);
                    break;
                }
            }
        }
        if pruned > 0 {
            let elapsed_ms = self.clock.since(started).as_millis() as u64;
            tracing::info!(
                pruned,
                left = keys.len() - pruned,
                elapsed_ms,
                "history pruned"
            );
        }
        more
    }
}

impl Pruner {
    /// Deletes the kept output of the runs the pruned history `records` stand for: each
    /// record's attempts that finished by the time it did (a task key used again since
    /// keeps its new runs' output). Errors and conflicts are left: the output of a task
    /// whose record is gone is only looked for again if its key finishes again.
    async fn prune_output(&self, records: &[HistoryRecord]) {
        let wanted: Vec<(String, &HistoryRecord)> = records
            .iter()
            .flat_map(|record| {
                let keys = output_keys_of(&self.queue_prefix, record);
                keys.into_iter().map(move |key| (key, record))
            })
            .collect();
        for chunk in wanted.chunks(PRUNE_BATCH) {
            let keys: Vec<String> = chunk.iter().map(|(key, _)| key.clone()).collect();
            let found = match self.coord.get(&keys).await {
                Ok(found) => found,
                Err(err) => {
                    self.metrics.coordinator_error(&err);
                    return;
                }
            };
            let ops: Vec<Edit> = found
                .iter()
                .filter(|stored| {
                    let record = chunk.iter().find(|(key, _)| *key == stored.key);
                    let output = OutputRecord::decode(&stored.value);
                    matches!((output, record), (Some(output), Some((_, record))) if finished_by(&output, record))
                })
                .map(|stored| Edit::Delete {
                    key: stored.key.clone(),
                    version: stored.version,
                })
                .collect();
            if ops.is_empty() {
                continue;
            }
            if let Err(err) = self.coord.edit(&ops).await {
                self.metrics.coordinator_error(&err);
                return;
            }
        }
        let mut prefixes: Vec<String> = records
            .iter()
            .filter_map(|record| record.key.strip_prefix(&self.queue_prefix))
            .map(|name| output_prefix(&self.queue_prefix, name))
            .collect();
        prefixes.dedup();
        forget_prefixes(self.coord.as_ref(), &prefixes).await;
    }
}

/// The edits that prune the history keys `found`, as `chunk` says: a key of several records
/// that straddles the count keeps its newest ones, the others go.
fn prune_ops(found: &[StoredTask], chunk: &[Prune]) -> Vec<Edit> {
    found
        .iter()
        .filter_map(|stored| {
            let keep = kept_of(chunk, &stored.key);
            if keep == 0 {
                return Some(Edit::Delete {
                    key: stored.key.clone(),
                    version: stored.version,
                });
            }
            Some(Edit::Replace {
                key: stored.key.clone(),
                version: stored.version,
                value: cut_to_newest(&stored.value, keep)?,
            })
        })
        .collect()
}

/// How many records the key keeps (0: none).
fn kept_of(chunk: &[Prune], key: &str) -> usize {
    chunk
        .iter()
        .find(|prune| prune.key == key)
        .map_or(0, |prune| prune.keep)
}

/// The history records [`prune_ops`] drops: of each key, all but the newest it keeps.
fn dropped_records(found: &[StoredTask], chunk: &[Prune]) -> Vec<HistoryRecord> {
    found
        .iter()
        .flat_map(|stored| {
            let mut records = HistoryRecord::decode_all(&stored.key, &stored.value);
            let keep = kept_of(chunk, &stored.key);
            records.truncate(records.len().saturating_sub(keep));
            records
        })
        .collect()
}

/// The most attempts of one task whose output a pruned record deletes: its latest runs.
const OUTPUT_ATTEMPTS_PRUNED: u32 = 100;

/// The keys of the output records of the runs `record` (a completion's) stands for.
fn output_keys_of(queue_prefix: &str, record: &HistoryRecord) -> Vec<String> {
    let first = record
        .attempts
        .saturating_sub(OUTPUT_ATTEMPTS_PRUNED - 1)
        .max(1);
    (first..=record.attempts)
        .filter_map(|attempt| output_key(queue_prefix, &record.key, attempt))
        .collect()
}

/// Whether `output` is of a run of `record`'s task that finished by the time the record's
/// did: a run of that completion, not of a task enqueued under its key since.
fn finished_by(output: &OutputRecord, record: &HistoryRecord) -> bool {
    let parse = |at: &str| chrono::DateTime::parse_from_rfc3339(at).ok();
    matches!(
        (parse(&output.finished_at), parse(&record.finished_at)),
        (Some(output), Some(record)) if output <= record
    )
}
