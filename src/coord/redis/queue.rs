//! [`Tasks`] on Redis: the queue is a hash per task and one sorted set of their keys. Reads
//! are plain commands, pipelined (`read.rs`), waits sleep on the changes channel
//! (`wait.rs`), and every write is one script (guard, versions, then all writes, one
//! counter bump, one `PUBLISH` of the prefix its keys share), its arguments and answer in
//! `plan.rs`. A set found without its mark (deleted by hand) is rebuilt from the hashes by
//! the read that finds it (`index.rs`).

use std::time::Duration;

use super::layout::scope;
use super::scripts::PRODUCE;
use super::wait::ReadTasks;
use super::{bad_answer, plan, unavailable, RedisCoordinator};
use crate::coord::{
    CoordError, Edit, Edited, FencingToken, Leadership, LeaseId, Names, StoredTask, TaskOp, Tasks,
    Version, WriteCost, WriteLimits, Written,
};

/// Keys per page of a look, and of a listing: the reply of a page is held in full while it
/// is packed (tens of bytes a key; a listing reads the page's tasks a part at a time).
pub(super) const KEYS_PAGE: usize = 4096;

/// One write: the ops Redis runs in one script, and the bytes of keys and values it
/// carries (a script blocks Redis while it runs: keep each short).
const LIMITS: WriteLimits = WriteLimits {
    max_ops: 128,
    max_bytes: 1024 * 1024,
};

impl RedisCoordinator {
    async fn write_ops(
        &self,
        mode: &str,
        lease: &LeaseId,
        token: FencingToken,
        ops: &[TaskOp],
    ) -> Result<Written, CoordError> {
        crate::coord::admit(self, ops, mode == "guarded")?;
        let token = token.to_string();
        let encoded = plan::op_args(ops);
        let scope = scope(
            ops.iter()
                .flat_map(|op| std::iter::once(op.key()).chain(op.record_key())),
        );
        let mut args: Vec<&[u8]> = vec![
            mode.as_bytes(),
            lease.0.as_bytes(),
            token.as_bytes(),
            scope.as_bytes(),
        ];
        args.extend(encoded.iter().map(Vec::as_slice));
        let reply = self.write_fields(&self.scripts.write, &args).await?;
        let written = plan::written(&reply).map_err(bad_answer)?;
        if let Written::Done { fencing_token, .. } = &written {
            self.saw_token(fencing_token.0);
        }
        Ok(written)
    }

    /// Test support: writes a task with the producers' script ([`PRODUCE`]).
    pub async fn produce(&self, key: &str, value: &[u8]) -> Result<(), CoordError> {
        let mut connection = self.connection().await?;
        redis::cmd("EVAL")
            .arg(PRODUCE)
            .arg(0)
            .arg(&self.settings.layout.prefix)
            .arg(key)
            .arg(value)
            .query_async::<u64>(&mut connection)
            .await
            .map(drop)
            .map_err(|err| unavailable(&err))
    }
}

impl Tasks for RedisCoordinator {
    async fn list(
        &self,
        prefix: &str,
        after: Version,
        wait: Duration,
    ) -> Result<(Vec<StoredTask>, Version), CoordError> {
        // A watch leaves an index rebuild running behind it; a single read waits for it.
        let behind = !wait.is_zero();
        self.wait_for(after, wait, ReadTasks(prefix, behind)).await
    }

    /// A single read (from `Version(0)`, or without a wait) hands each task on as its part
    /// of the listing arrives; a wait reads as [`Tasks::list`] does, since whether a read
    /// is the answer is known only once it is whole (its version), and a read handed on
    /// cannot be taken back.
    async fn list_each(
        &self,
        prefix: &str,
        after: Version,
        wait: Duration,
        each: &mut (dyn FnMut(StoredTask) + Send),
    ) -> Result<Version, CoordError> {
        if after == Version(0) || wait.is_zero() {
            return Ok(self.read_tasks_each(prefix, each).await?.version);
        }
        let (tasks, version) = self.list(prefix, after, wait).await?;
        tasks.into_iter().for_each(each);
        Ok(version)
    }

    async fn keys(&self, prefix: &str) -> Result<(Names, Version), CoordError> {
        self.keys_under(prefix).await
    }

    async fn get(&self, keys: &[String]) -> Result<Vec<StoredTask>, CoordError> {
        self.read_keys(keys).await
    }

    async fn write(&self, leadership: &Leadership, ops: &[TaskOp]) -> Result<Written, CoordError> {
        self.write_ops("guarded", &leadership.lease, leadership.fencing_token, ops)
            .await
    }

    async fn write_own(&self, lease: &LeaseId, ops: &[TaskOp]) -> Result<Written, CoordError> {
        self.write_ops("own", lease, FencingToken(0), ops).await
    }

    async fn edit(&self, ops: &[Edit]) -> Result<Edited, CoordError> {
        let encoded = plan::edit_args(ops);
        let args: Vec<&[u8]> = encoded.iter().map(Vec::as_slice).collect();
        let reply = self.write_fields(&self.scripts.edit, &args).await?;
        plan::edited(&reply).map_err(bad_answer)
    }

    fn limits(&self) -> WriteLimits {
        LIMITS
    }

    fn cost(&self, op: &TaskOp) -> WriteCost {
        plan::cost(op)
    }

    fn guard_cost(&self) -> WriteCost {
        WriteCost { ops: 1, bytes: 0 }
    }
}
