//! The Redis coordinator's reads of tasks (a listing, page by page, a look at the keys, and
//! a get of named keys): plain commands, pipelined, not a script. A script reads each task
//! with a call from Lua, several times the server's time of the same command sent by a
//! client, and a listing reads every task of the backlog (a look every key: a script built
//! a table of each page before answering it).
//!
//! A read needs no snapshot. The counter is read first, then the keys and then each
//! task's fields (one `HMGET` each: a task reads whole), then the PTTL of each lease that
//! holds one. Whatever is written meanwhile moves the counter past the read's version, so
//! a wait from that version returns at once and reads again; a task that is gone by the
//! time its fields are read is left out, and one rewritten meanwhile reads as it is now.

use super::client::Connection;

use super::index::whole;
use super::layout::{encode, holders, number, task_rows, TaskFields, TaskRows, INDEXED};
use super::{bad_answer, unavailable, RedisCoordinator, KEYS_PAGE};
use crate::coord::{CoordError, Names, StoredTask, Version};

/// Tasks read by one round trip of a listing, at first: 256 tasks of 20 KB are a 5 MB
/// answer.
const FIRST_READ: usize = 256;

/// The bytes of values one round trip of a listing reads, about: once the tasks read so
/// far tell their size, as many are read at once as make this, from [`FIRST_READ`] up to
/// a page of keys (a backlog of 200-byte tasks is read 4,096 at a time, one of 20 KB tasks
/// 262 at a time).
const READ_BYTES: usize = 5 << 20;

/// How many tasks the next round trip of a listing reads, `bytes` of values having been
/// read in `tasks` tasks.
fn tasks_per_read(bytes: usize, tasks: usize) -> usize {
    match bytes.checked_div(tasks) {
        Some(each) if tasks > 0 => (READ_BYTES / each.max(1)).clamp(FIRST_READ, KEYS_PAGE),
        _ => FIRST_READ,
    }
}

impl RedisCoordinator {
    /// The tasks under `prefix`: a page of keys at a time, and the tasks of a page as many
    /// at a time as make about [`READ_BYTES`] (a backlog of 20 KB tasks in one answer would
    /// be tens of MB). The next page of keys is read with the last tasks of a page, in one
    /// round trip. The read's version is the lowest of its parts' (each part's is the
    /// counter its page of keys was read with, moved by an ended lease it names).
    /// An index found wanting (`index.rs`) is rebuilt: by a watch (`behind`), on a task of
    /// its own while the listing is answered, the rebuild waking the watch if it added
    /// keys; by a single read, while the listing reads on, read again if keys were added.
    pub(super) async fn read_tasks(
        &self,
        prefix: &str,
        behind: bool,
    ) -> Result<TaskRows, CoordError> {
        let mut connection = self.connection().await?;
        let (page, mark) = self.first_page(&mut connection, prefix, true).await?;
        let mut tasks = Vec::new();
        let mut keep = |task| tasks.push(task);
        let read = if whole(mark) {
            self.read_pages(&mut connection, prefix, page, &mut keep)
                .await
        } else if behind {
            self.rebuild_index_behind();
            self.read_pages(&mut connection, prefix, page, &mut keep)
                .await
        } else {
            let (added, read) = tokio::join!(
                self.rebuild_index(),
                self.read_pages(&mut connection, prefix, page, &mut keep)
            );
            if added == 0 {
                read
            } else {
                tasks.clear();
                let mut keep = |task| tasks.push(task);
                let (page, _) = self.first_page(&mut connection, prefix, false).await?;
                self.read_pages(&mut connection, prefix, page, &mut keep)
                    .await
            }
        };
        Ok(TaskRows { tasks, ..read? })
    }

    /// [`Self::read_tasks`] of a single read, each task handed to `each` as its part
    /// arrives rather than all held together (a leader's listing of a large backlog). An
    /// index found wanting is rebuilt first, then read: a read handed on is never taken
    /// back. The answer holds no tasks.
    pub(super) async fn read_tasks_each(
        &self,
        prefix: &str,
        each: &mut (dyn FnMut(StoredTask) + Send),
    ) -> Result<TaskRows, CoordError> {
        let mut connection = self.connection().await?;
        let (mut page, mark) = self.first_page(&mut connection, prefix, true).await?;
        if !whole(mark) && self.rebuild_index().await > 0 {
            (page, _) = self.first_page(&mut connection, prefix, false).await?;
        }
        self.read_pages(&mut connection, prefix, page, each).await
    }

    /// The keys under `prefix`, a page of [`KEYS_PAGE`] at a time, each packed into the
    /// answer as its page is read (none held as a string of its own); the version is the
    /// lowest counter a page was read with. An index found wanting is rebuilt first, then
    /// read.
    pub(super) async fn keys_under(&self, prefix: &str) -> Result<(Names, Version), CoordError> {
        let mut connection = self.connection().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("ZSCORE").arg(self.key("tasks")).arg(INDEXED);
        self.page_of_keys(&mut pipe, prefix, b"");
        let mut answers = query(&mut connection, &pipe).await?;
        let mark = answers.remove(0);
        let mark: Option<f64> = redis::from_redis_value(mark).map_err(bad_answer)?;
        if !whole(mark) && self.rebuild_index().await > 0 {
            let mut pipe = redis::pipe();
            self.page_of_keys(&mut pipe, prefix, b"");
            answers = query(&mut connection, &pipe).await?;
        }
        let mut keys = Names::under(prefix);
        let mut lowest = u64::MAX;
        loop {
            let page = answers.pop();
            let counter = answers.pop();
            let (Some(page), Some(counter)) = (page, counter) else {
                return Err(bad_answer("a page of keys answered nothing"));
            };
            lowest = lowest.min(counter_in(counter)?);
            let redis::Value::Array(page) = page else {
                return Err(bad_answer("a page of keys is not a list"));
            };
            for key in &page {
                // A key that is not UTF-8 cannot be named: left out (a listing says so).
                match key_in(key)? {
                    Some(key) if key != INDEXED => keys.push(key),
                    _ => {}
                }
            }
            match page.last() {
                Some(redis::Value::BulkString(last)) if page.len() >= KEYS_PAGE => {
                    let mut pipe = redis::pipe();
                    self.page_of_keys(&mut pipe, prefix, last);
                    answers = query(&mut connection, &pipe).await?;
                }
                _ => return Ok((keys, Version(encode(lowest, false)))),
            }
        }
    }

    /// The first page of keys under `prefix`, and (`with_mark`) the index's mark as
    /// `ZSCORE` reads it.
    async fn first_page(
        &self,
        connection: &mut Connection,
        prefix: &str,
        with_mark: bool,
    ) -> Result<(Page, Option<f64>), CoordError> {
        let mut pipe = redis::pipe();
        if with_mark {
            pipe.cmd("ZSCORE").arg(self.key("tasks")).arg(INDEXED);
        }
        self.page_of_keys(&mut pipe, prefix, b"");
        let mut answers: Vec<redis::Value> = pipe
            .query_async(connection)
            .await
            .map_err(|err| unavailable(&err))?;
        let page = page_read(&mut answers)?;
        let mark = answers
            .pop()
            .map(redis::from_redis_value::<Option<f64>>)
            .transpose()
            .map_err(bad_answer)?
            .flatten();
        Ok((page, mark))
    }

    /// [`Self::read_tasks`] from its first `page` of keys on, each task handed to `each`;
    /// the answer holds no tasks.
    async fn read_pages(
        &self,
        connection: &mut Connection,
        prefix: &str,
        mut page: Page,
        each: &mut (dyn FnMut(StoredTask) + Send),
    ) -> Result<TaskRows, CoordError> {
        // The answers to the next page of keys, read with the last tasks of a page.
        let mut next_page: Vec<redis::Value> = Vec::new();
        let mut rows = TaskRows::default();
        let mut version: Option<Version> = None;
        let (mut bytes, mut read) = (0, 0);
        loop {
            let Page {
                counter,
                keys,
                more_after,
            } = page;
            let mut keys = keys.into_iter().peekable();
            if keys.peek().is_none() {
                // Read at `counter` too: the listing's version is no higher.
                let empty = Version(encode(counter, false));
                version = Some(version.map_or(empty, |v| v.min(empty)));
                if let Some(after) = &more_after {
                    // A full page of keys none of which can be named: on to the next.
                    let mut pipe = redis::pipe();
                    self.page_of_keys(&mut pipe, prefix, after);
                    next_page = query(connection, &pipe).await?;
                }
            }
            while keys.peek().is_some() {
                let part: Vec<String> = keys.by_ref().take(tasks_per_read(bytes, read)).collect();
                let next = keys
                    .peek()
                    .is_none()
                    .then_some(more_after.as_ref())
                    .flatten();
                let mut pipe = redis::pipe();
                self.fields_of(&mut pipe, &part);
                if let Some(after) = next {
                    self.page_of_keys(&mut pipe, prefix, after);
                }
                let mut answers = query(connection, &pipe).await?;
                if next.is_some() {
                    next_page = answers.split_off(answers.len().saturating_sub(2));
                }
                let fields = fields_in(answers)?;
                read += part.len();
                let part = self.rows(connection, counter, part, fields).await?;
                bytes += part
                    .tasks
                    .iter()
                    .map(|task| task.value.len())
                    .sum::<usize>();
                version = Some(version.map_or(part.version, |v| v.min(part.version)));
                rows.next_expiry_ms = match (rows.next_expiry_ms, part.next_expiry_ms) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                part.tasks.into_iter().for_each(&mut *each);
            }
            if more_after.is_none() {
                rows.version = version.unwrap_or(Version(encode(counter, false)));
                return Ok(rows);
            }
            page = page_read(&mut next_page)?;
        }
    }

    /// The tasks of `keys` that exist, in the order asked.
    pub(super) async fn read_keys(&self, keys: &[String]) -> Result<Vec<StoredTask>, CoordError> {
        let mut connection = self.connection().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(self.key("version"));
        self.fields_of(&mut pipe, keys);
        let mut answers: Vec<redis::Value> = pipe
            .query_async(&mut connection)
            .await
            .map_err(|err| unavailable(&err))?;
        if answers.is_empty() {
            return Err(bad_answer("a get answered nothing"));
        }
        let fields = fields_in(answers.split_off(1))?;
        let counter = counter_in(answers.remove(0))?;
        Ok(self
            .rows(&mut connection, counter, keys.to_vec(), fields)
            .await?
            .tasks)
    }

    /// `keys` read as `fields` after `counter`, with the PTTL of each lease holding one.
    async fn rows(
        &self,
        connection: &mut Connection,
        counter: u64,
        keys: Vec<String>,
        fields: Vec<TaskFields>,
    ) -> Result<TaskRows, CoordError> {
        let holders = holders(&fields);
        let pttls: Vec<i64> = if holders.is_empty() {
            Vec::new()
        } else {
            let mut pipe = redis::pipe();
            for holder in &holders {
                let mut key = self.key("lease/").into_bytes();
                key.extend_from_slice(holder);
                pipe.cmd("PTTL").arg(key);
            }
            pipe.query_async(connection)
                .await
                .map_err(|err| unavailable(&err))?
        };
        task_rows(counter, keys, fields, &pttls).map_err(bad_answer)
    }

    /// Adds to `pipe` the counter and the first [`KEYS_PAGE`] keys under `prefix` after
    /// `after` (from the first when empty), in key order.
    fn page_of_keys(&self, pipe: &mut redis::Pipeline, prefix: &str, after: &[u8]) {
        let low = if after.is_empty() {
            [b"[", prefix.as_bytes()].concat()
        } else {
            [b"(", after].concat()
        };
        let mut high = format!("({prefix}").into_bytes();
        high.push(0xff);
        pipe.cmd("GET").arg(self.key("version"));
        pipe.cmd("ZRANGEBYLEX")
            .arg(self.key("tasks"))
            .arg(low)
            .arg(high)
            .arg("LIMIT")
            .arg(0)
            .arg(KEYS_PAGE);
    }

    /// Adds to `pipe` one `HMGET` of each task of `keys`.
    fn fields_of(&self, pipe: &mut redis::Pipeline, keys: &[String]) {
        for key in keys {
            pipe.cmd("HMGET")
                .arg(self.key(&format!("task/{key}")))
                .arg("value")
                .arg("version")
                .arg("created")
                .arg("holder");
        }
    }
}

/// A page of keys as read: the counter read with it, the keys that can be named, and the
/// page's last member when the page was full (more may follow it).
struct Page {
    counter: u64,
    keys: Vec<String>,
    more_after: Option<Vec<u8>>,
}

/// The page of keys at the end of `answers`, taken out. The index's mark is no key, and a
/// member that is not UTF-8 cannot be named: both left out, the second with a warning.
fn page_read(answers: &mut Vec<redis::Value>) -> Result<Page, CoordError> {
    let members = answers
        .pop()
        .ok_or_else(|| bad_answer("a page of keys answered nothing"))?;
    let counter = answers
        .pop()
        .ok_or_else(|| bad_answer("a page of keys answered nothing"))?;
    let mut members: Vec<Vec<u8>> = redis::from_redis_value(members).map_err(bad_answer)?;
    let mut keys = Vec::with_capacity(members.len());
    let mut unnamed = Vec::new();
    for member in &members {
        match std::str::from_utf8(member) {
            Ok(key) if key != INDEXED => keys.push(key.to_string()),
            Ok(_) => {}
            Err(_) => unnamed.push(String::from_utf8_lossy(member).into_owned()),
        }
    }
    if !unnamed.is_empty() {
        tracing::warn!(
            keys = ?unnamed,
            "task keys in the index that are not UTF-8 (a producer wrote raw bytes): leaderq cannot name them, so it leaves them where they are; rename or delete them with redis-cli (their hashes are under task/)"
        );
    }
    let more_after = (members.len() >= KEYS_PAGE)
        .then(|| members.pop())
        .flatten();
    Ok(Page {
        counter: counter_in(counter)?,
        keys,
        more_after,
    })
}

/// The answers of `pipe`.
async fn query(
    connection: &mut Connection,
    pipe: &redis::Pipeline,
) -> Result<Vec<redis::Value>, CoordError> {
    pipe.query_async(connection)
        .await
        .map_err(|err| unavailable(&err))
}

/// A key as a page of keys holds it; `None`: not UTF-8, so it cannot be named.
fn key_in(key: &redis::Value) -> Result<Option<&str>, CoordError> {
    match key {
        redis::Value::BulkString(key) => Ok(std::str::from_utf8(key).ok()),
        _ => Err(bad_answer("a key that is not a string")),
    }
}

/// The counter as a `GET` of it answered (none yet: 0).
pub(super) fn counter_in(answer: redis::Value) -> Result<u64, CoordError> {
    let counter: Option<Vec<u8>> = redis::from_redis_value(answer).map_err(bad_answer)?;
    number(&counter.unwrap_or_default()).map_err(bad_answer)
}

/// Tasks' fields as their `HMGET`s answered.
fn fields_in(answers: Vec<redis::Value>) -> Result<Vec<TaskFields>, CoordError> {
    answers
        .into_iter()
        .map(redis::from_redis_value::<TaskFields>)
        .collect::<Result<_, _>>()
        .map_err(bad_answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listing reads FIRST_READ tasks until their size is known, then as many as make
    /// READ_BYTES, never more than a page of keys nor fewer than FIRST_READ.
    #[test]
    fn a_listing_reads_as_many_tasks_at_once_as_their_size_allows() {
        assert_eq!(tasks_per_read(0, 0), FIRST_READ);
        assert_eq!(tasks_per_read(256 * 200, 256), KEYS_PAGE);
        assert_eq!(tasks_per_read(256 * 2_000, 256), READ_BYTES / 2_000);
        assert_eq!(tasks_per_read(256 * 20_000, 256), READ_BYTES / 20_000);
        assert_eq!(tasks_per_read(256 * 40_000, 256), FIRST_READ);
        assert_eq!(tasks_per_read(10 << 20, 1), FIRST_READ);
        assert_eq!(tasks_per_read(0, 256), KEYS_PAGE, "tasks all gone or empty");
    }
}
