//! The Redis coordinator's reads of tasks (a listing, page by page, and a get of named
//! keys): plain commands, pipelined, not a script. A script reads each task with a call
//! from Lua, several times the server's time of the same command sent by a client, and a
//! listing reads every task of the backlog.
//!
//! A read needs no snapshot. The counter is read first, then the keys and then each
//! task's fields (one `HMGET` each: a task reads whole), then the PTTL of each lease that
//! holds one. Whatever is written meanwhile moves the counter past the read's version, so
//! a wait from that version returns at once and reads again; a task that is gone by the
//! time its fields are read is left out, and one rewritten meanwhile reads as it is now.

use redis::aio::ConnectionManager;

use super::layout::{holders, number, task_rows, text, TaskFields, TaskRows};
use super::{bad_answer, unavailable, RedisCoordinator};
use crate::coord::{CoordError, StoredTask};

/// Tasks per page of a listing: 256 tasks of 20 KB are a 5 MB answer.
const LIST_PAGE: usize = 256;

impl RedisCoordinator {
    /// The tasks under `prefix`, `LIST_PAGE` at a time (a backlog of 20 KB tasks in one
    /// answer would be tens of MB). Each page's fields are read with the next page's keys,
    /// in one round trip. The read's version is the lowest a page saw.
    pub(super) async fn read_tasks(&self, prefix: &str) -> Result<TaskRows, CoordError> {
        let mut connection = self.connection().await?;
        let mut pipe = redis::pipe();
        self.page_of_keys(&mut pipe, prefix, "");
        let (counter, keys): (Option<Vec<u8>>, Vec<Vec<u8>>) = pipe
            .query_async(&mut connection)
            .await
            .map_err(|err| unavailable(&err))?;
        let (mut counter, mut keys) = (
            number(&counter.unwrap_or_default()).map_err(bad_answer)?,
            keys,
        );
        let mut rows = TaskRows::default();
        let mut first = true;
        loop {
            let full = keys.len() >= LIST_PAGE;
            let keys_now: Vec<String> = keys
                .iter()
                .map(|key| text(key))
                .collect::<Result<_, _>>()
                .map_err(bad_answer)?;
            let mut pipe = redis::pipe();
            self.fields_of(&mut pipe, &keys_now);
            if full {
                self.page_of_keys(&mut pipe, prefix, &keys_now[keys_now.len() - 1]);
            }
            let mut answers: Vec<redis::Value> = if pipe.is_empty() {
                Vec::new()
            } else {
                pipe.query_async(&mut connection)
                    .await
                    .map_err(|err| unavailable(&err))?
            };
            let next = if full {
                let keys = answers
                    .pop()
                    .ok_or_else(|| bad_answer("a page answered nothing"))?;
                let counter = answers
                    .pop()
                    .ok_or_else(|| bad_answer("a page answered nothing"))?;
                Some((counter, keys))
            } else {
                None
            };
            let fields = answers
                .into_iter()
                .map(redis::from_redis_value::<TaskFields>)
                .collect::<Result<Vec<_>, _>>()
                .map_err(bad_answer)?;
            let page = self
                .rows(&mut connection, counter, keys_now, fields)
                .await?;
            rows.version = if first {
                page.version
            } else {
                rows.version.min(page.version)
            };
            first = false;
            rows.next_expiry_ms = match (rows.next_expiry_ms, page.next_expiry_ms) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            rows.tasks.extend(page.tasks);
            let Some((next_counter, next_keys)) = next else {
                return Ok(rows);
            };
            let next_counter: Option<Vec<u8>> =
                redis::from_redis_value(next_counter).map_err(bad_answer)?;
            counter = number(&next_counter.unwrap_or_default()).map_err(bad_answer)?;
            keys = redis::from_redis_value(next_keys).map_err(bad_answer)?;
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
        let fields = answers
            .split_off(1)
            .into_iter()
            .map(redis::from_redis_value::<TaskFields>)
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad_answer)?;
        let counter: Option<Vec<u8>> =
            redis::from_redis_value(answers.remove(0)).map_err(bad_answer)?;
        let counter = number(&counter.unwrap_or_default()).map_err(bad_answer)?;
        Ok(self
            .rows(&mut connection, counter, keys.to_vec(), fields)
            .await?
            .tasks)
    }

    /// `keys` read as `fields` after `counter`, with the PTTL of each lease holding one.
    async fn rows(
        &self,
        connection: &mut ConnectionManager,
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

    /// Adds to `pipe` the counter and the first `LIST_PAGE` keys under `prefix` after
    /// `after` (from the first when empty), in key order.
    fn page_of_keys(&self, pipe: &mut redis::Pipeline, prefix: &str, after: &str) {
        let low = if after.is_empty() {
            format!("[{prefix}")
        } else {
            format!("({after}")
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
            .arg(LIST_PAGE);
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

    /// `name` under the key prefix.
    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.settings.layout.prefix)
    }
}
