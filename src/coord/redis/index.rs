//! The Redis coordinator's index of task keys, `P tasks`, rebuilt from the task hashes
//! when a read finds it wanting. The hashes are the truth; the index is what listings
//! read, and it carries a mark ([`INDEXED`]) at 0 once a rebuild has made it whole. An
//! index without the mark was deleted by hand (a producer's next write makes it again,
//! unmarked) or never rebuilt; one with the mark above 0 is being rebuilt, or a rebuild was
//! cut short. Either way the next read rebuilds it.
//!
//! A rebuild puts the mark in at a number of its own, walks the task hashes with `SCAN`
//! steps, each one script that adds the keys the index lacks and wakes the waiters if it
//! added any, and sets the mark to 0 last, only if it still holds that number (`scripts.rs`,
//! REINDEX). An index deleted during the rebuild (whether or not another rebuild has begun
//! since), or a process stopped halfway, leaves the mark missing or above 0: nothing is
//! marked whole that was not walked whole since its last deletion. One rebuild at a time
//! per process; one started behind a watch runs on a task the coordinator owns
//! ([`Rebuilding`]), aborted when the coordinator is dropped, which leaves the mark as a
//! process's end does.

use std::sync::Arc;

use super::client::Connection;
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio_util::task::AbortOnDropHandle;

use super::layout::{glob_escape, Layout, INDEXED};
use super::scripts::invoke;
use super::{unavailable, RedisCoordinator};
use crate::coord::CoordError;

/// Keys a `SCAN` step of a rebuild looks at (Redis's `COUNT`): one script each, so Redis
/// is held for well under a millisecond at a time.
const SCAN_COUNT: usize = 1000;

/// Whether the index's mark, as `ZSCORE` read it, says the index is whole: there, at 0.
pub(super) fn whole(mark: Option<f64>) -> bool {
    mark == Some(0.0)
}

/// The coordinator's rebuilds: one at a time, and the one started behind a watch, whose
/// task is aborted with this (nothing of the coordinator runs detached).
#[derive(Default)]
pub(super) struct Rebuilding {
    /// Held while the index is rebuilt.
    one_at_a_time: Arc<Mutex<()>>,
    /// The last rebuild started behind a watch (finished, unless it holds the lock).
    behind: std::sync::Mutex<Option<AbortOnDropHandle<u64>>>,
}

/// What a rebuild needs, owned, so that it can run on a task of its own.
struct Rebuild {
    connection: Connection,
    layout: Layout,
    script: redis::Script,
}

impl RedisCoordinator {
    /// Rebuilds the index if it is still wanting once no other rebuild of this process
    /// runs; how many keys it added. A failure is logged: the read goes on with the index
    /// as it is, and a later read tries again.
    pub(super) async fn rebuild_index(&self) -> u64 {
        let one_at_a_time = self.rebuilding.one_at_a_time.clone().lock_owned().await;
        match self.connection().await {
            Ok(connection) => self.rebuild(connection).run(one_at_a_time).await,
            Err(err) => failed(&self.settings.layout, &err),
        }
    }

    /// Starts a rebuild on a task of its own, unless one of this process runs: a watch
    /// answers at once with the index as it is, and the rebuild's write wakes it if it
    /// added keys. A rebuild cut short by the process's end leaves the mark above 0.
    pub(super) fn rebuild_index_behind(&self) {
        let Ok(one_at_a_time) = self.rebuilding.one_at_a_time.clone().try_lock_owned() else {
            return;
        };
        if let Some(connection) = self.current_connection() {
            let rebuild = self.rebuild(connection).run(one_at_a_time);
            let task = AbortOnDropHandle::new(tokio::spawn(rebuild));
            // The one it replaces is done: it let go of the lock just taken.
            let behind = self.rebuilding.behind.lock();
            *behind.unwrap_or_else(std::sync::PoisonError::into_inner) = Some(task);
        }
    }

    fn rebuild(&self, connection: Connection) -> Rebuild {
        Rebuild {
            connection,
            layout: self.settings.layout.clone(),
            script: self.scripts.reindex.clone(),
        }
    }
}

impl Rebuild {
    /// The rebuild, `_one_at_a_time` held throughout; how many keys it added (logged).
    async fn run(mut self, _one_at_a_time: OwnedMutexGuard<()>) -> u64 {
        match self.keys_added().await {
            Ok(None) => 0,
            Ok(Some(0)) => {
                tracing::debug!("the Redis task index lists every task");
                0
            }
            Ok(Some(added)) => {
                tracing::warn!(
                    added,
                    "the Redis task index {}tasks was missing {added} task(s) (deleted by \
                     hand?): rebuilt from the task hashes",
                    self.layout.prefix
                );
                added
            }
            Err(err) => failed(&self.layout, &err),
        }
    }

    /// How many keys the walk added; `None` when the index was whole by then (another
    /// rebuild of this process made it so meanwhile).
    async fn keys_added(&mut self) -> Result<Option<u64>, CoordError> {
        let mark: Option<f64> = redis::cmd("ZSCORE")
            .arg(format!("{}tasks", self.layout.prefix))
            .arg(INDEXED)
            .query_async(&mut self.connection)
            .await
            .map_err(|err| unavailable(&err))?;
        if whole(mark) {
            return Ok(None);
        }
        // This rebuild's own mark: one begun after a deletion during this one is not
        // taken for it.
        let run = (u64::from(uuid::Uuid::new_v4().as_u128() as u32) + 1).to_string();
        self.step(&[b"start", run.as_bytes()]).await?;
        let pattern = format!("{}*", glob_escape(&format!("{}task/", self.layout.prefix)));
        let count = SCAN_COUNT.to_string();
        let (mut cursor, mut added) = (0u64, 0);
        loop {
            let at = cursor.to_string();
            let (next, more) = self
                .step(&[b"scan", at.as_bytes(), pattern.as_bytes(), count.as_bytes()])
                .await?;
            added += more;
            if next == 0 {
                self.step(&[b"done", run.as_bytes()]).await?;
                return Ok(Some(added));
            }
            cursor = next;
        }
    }

    /// One call of the REINDEX script: the next cursor and the keys added.
    async fn step(&mut self, args: &[&[u8]]) -> Result<(u64, u64), CoordError> {
        invoke(&mut self.connection, &self.layout, &self.script, args).await
    }
}

/// Logs a rebuild that failed: the index stays as it is until a later read rebuilds it.
fn failed(layout: &Layout, err: &CoordError) -> u64 {
    tracing::warn!(
        "cannot rebuild the Redis task index {}tasks, found wanting: {err}; tasks missing \
         from it are not seen until a later read rebuilds it",
        layout.prefix
    );
    0
}
