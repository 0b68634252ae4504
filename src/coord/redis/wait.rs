//! The Redis coordinator's waits (`observe`, `list`): read, and until the answer's
//! version differs from the one asked about (passes it, or falls below it when the counter
//! started over), look again on every message on the changes channel that may concern the
//! read (a write of tasks under other prefixes does not),
//! when a lease the read saw would end (its death changes the answer without any write), and
//! every [`POLL`] if the counter moved (a message lost to a reconnect). The holder is read
//! again every [`HOLDER_POLL`] whatever the counter says: an operator's `DEL` of the leader
//! key or of a lease publishes nothing and moves no counter, and a leader watching its own
//! record must see it within that bound, not at its next renewal.

use std::time::Duration;

use tokio::time::Instant;

use super::layout::{concerns, Change};
use super::read::counter_in;
use super::{unavailable, RedisCoordinator};
use crate::coord::{CoordError, CoordFuture, Holder, StoredTask, Version};

/// The longest a blocking `observe` or `list` waits, whatever it asks.
const MAX_WAIT: Duration = Duration::from_secs(600);

/// A waiter looks again at least this often: a publish lost to a reconnect delays a
/// wake-up by no more than this.
const POLL: Duration = Duration::from_secs(1);

/// How often a waiter on the holder reads it again: the bound on how late a leader sees
/// its record deleted by hand, for one small script call per waiter per period.
const HOLDER_POLL: Duration = Duration::from_millis(250);

/// A waiter that expects a lease to end looks this long after its PTTL, so that Redis has
/// ended it by then.
const EXPIRY_SLACK: Duration = Duration::from_millis(5);

impl RedisCoordinator {
    /// The counter alone: what a poll looks at before reading everything again.
    async fn counter(&self) -> Result<u64, CoordError> {
        let mut connection = self.connection().await?;
        let value = redis::cmd("GET")
            .arg(self.key("version"))
            .query_async(&mut connection)
            .await
            .map_err(|err| unavailable(&err))?;
        counter_in(value)
    }

    /// `read` once its version is past `after`, or below it (at once for `Version(0)`), or
    /// when `wait` is over. Looks again on every message on the channel, when a lease `read`
    /// saw would end, and every [`POLL`] if the counter moved.
    pub(super) async fn wait_for<T>(
        &self,
        after: Version,
        wait: Duration,
        read: impl Reread<T>,
    ) -> Result<(T, Version), CoordError> {
        let end = Instant::now() + wait.min(MAX_WAIT);
        let mut changes = self.changes.subscribe();
        loop {
            // What was heard before this read, the read sees.
            changes = changes.resubscribe();
            let counter = self.counter().await?;
            let read_at = Instant::now();
            let (answer, version, expiry) = read.read(self).await?;
            // A version below `after` is a change too: the counter started over (deleted
            // by hand, or lost with Redis's data), and would make the wait last until it
            // climbed back. The caller waits from the lower version next.
            if after == Version(0) || version != after || Instant::now() >= end {
                return Ok((answer, version));
            }
            let expires = expiry.map(|ms| read_at + Duration::from_millis(ms) + EXPIRY_SLACK);
            let wake = expires.map_or(end, |at| at.min(end));
            let mut poll = Instant::now() + read.poll();
            loop {
                tokio::select! {
                    change = changes.recv() => match change {
                        Ok(change) if !read.concerns(&change) => {}
                        // It concerns this read, or messages were missed.
                        _ => break,
                    },
                    _ = tokio::time::sleep_until(wake) => break,
                    _ = tokio::time::sleep_until(poll) => {
                        if read.poll_reads_again() || self.counter().await? != counter {
                            break;
                        }
                        poll = Instant::now() + read.poll();
                    }
                }
            }
        }
    }
}

/// One read a waiter repeats: the answer, its version and when a lease it saw would end
/// (ms from the read).
pub(super) trait Reread<T>: Send + Sync {
    fn read<'a>(
        &'a self,
        coord: &'a RedisCoordinator,
    ) -> CoordFuture<'a, (T, Version, Option<u64>)>;

    /// Whether a write `change` announces may change what this reads.
    fn concerns(&self, change: &Change) -> bool;

    /// How often a waiter looks again without a message.
    fn poll(&self) -> Duration {
        POLL
    }

    /// Whether each poll reads again whatever the counter says (a read cheap enough, of
    /// something that can change without a write of leaderq's).
    fn poll_reads_again(&self) -> bool {
        false
    }
}

pub(super) struct ReadHolder;

impl Reread<Holder> for ReadHolder {
    fn read<'a>(
        &'a self,
        coord: &'a RedisCoordinator,
    ) -> CoordFuture<'a, (Holder, Version, Option<u64>)> {
        Box::pin(async move {
            let row = coord.read_holder().await?;
            Ok((row.holder, row.version, row.expiry_ms))
        })
    }

    fn concerns(&self, change: &Change) -> bool {
        concerns(change, None)
    }

    fn poll(&self) -> Duration {
        HOLDER_POLL
    }

    fn poll_reads_again(&self) -> bool {
        true
    }
}

/// The tasks under a prefix; `true`: a watch's read, which leaves an index rebuild running
/// behind it (`index.rs`).
pub(super) struct ReadTasks<'p>(pub(super) &'p str, pub(super) bool);

impl Reread<Vec<StoredTask>> for ReadTasks<'_> {
    fn read<'a>(
        &'a self,
        coord: &'a RedisCoordinator,
    ) -> CoordFuture<'a, (Vec<StoredTask>, Version, Option<u64>)> {
        Box::pin(async move {
            let rows = coord.read_tasks(self.0, self.1).await?;
            Ok((rows.tasks, rows.version, rows.next_expiry_ms))
        })
    }

    fn concerns(&self, change: &Change) -> bool {
        concerns(change, Some(self.0))
    }
}
