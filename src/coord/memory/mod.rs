//! The in-memory coordinator: every [`Coordinator`](super::Coordinator) guarantee inside
//! one process, for fast deterministic tests of whatever sits on the seam. It copies
//! Consul's rules as `leaderq server` implements them, in the seam's words, at the earliest
//! the seam allows (a lease ends exactly a TTL after its last keep-alive, where Consul waits
//! twice that), so a consumer that is safe here is safe on Consul. It implements
//! [`Leases`], [`Elections`] and [`Tasks`] below, each call one `Op` on the state.
//!
//! The rules live in `state.rs`, a pure state machine driven with `now` (the operators' edits
//! in `state/edit.rs`); this file is the thin async shell around it: one mutex, the clock
//! (`tokio::time::Instant`, so tests can pause it), and the wake-ups of blocking
//! `observe`/`list` calls. Leases end lazily: every call first ends the leases whose TTL ran
//! out (each at its own deadline), and a blocked waiter sleeps no longer than the next
//! deadline, so a death is seen on time without any background task.
//!
//! How it keeps each guarantee of [`crate::coord`]:
//! - **One leader.** Leadership is one field under one mutex; `campaign` takes it only when
//!   free (or already this lease's). A lease that dies holding it (expiry, revoke,
//!   `expire_lease`) leaves it `Delayed` for its lock-delay (capped at 60 s), counted from
//!   the death; `resign` leaves none.
//! - **Fencing.** One counter that only rises; every acquisition takes the next value, a
//!   re-campaign by the holder too, and an operator's deletion of the leader record leaves
//!   it as it is.
//! - **Guarded writes.** A batch is checked against the limits (128 operations counting the
//!   guard, 512 KiB of keys and values: over them `Refused`, whoever asks), then against
//!   leadership (held by the lease under this very token, as Consul's `check-session` and
//!   `check-index`), then op by op on a staged copy; every failing op is named in `Conflict`,
//!   and only a batch with none is applied. `write_own` skips the guard, and every task it
//!   writes must be held by the lease.
//! - **Versions.** One global version from 1 (0 means "do not wait"), raised by one per
//!   visible change: a batch, a producer's write, a campaign won, a resignation, a lease's
//!   death. A task's version is the one of its last write.
//! - **No loss.** A lease's death clears the holder of every task it claimed, keeps their
//!   values and moves their versions; they cannot be claimed during its lock-delay (Consul
//!   sets it on every key a dying session held) but can be requeued.
//!
//! Test hooks stand in for producers, operators and faults: `put` (a producer's write, also
//! the contract suite's `Producer`), `delete_leader_record` (an operator's `DELETE`: the holder
//! loses leadership at once, no lock-delay, the counter stays), `expire_lease` (a hung
//! replica: its lease ends now, lock-delay applies), `set_unavailable` (every call, a blocked
//! waiter too, answers `Unavailable`).

mod state;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

pub use self::state::{MemoryConfig, DEFAULT_MAX_BYTES, DEFAULT_MAX_OPS, DEFAULT_TTL_MIN};
use self::state::{Op, Outcome, State};
use super::{
    Campaign, CoordError, Edit, Edited, Elections, Grant, Holder, HolderRecord, Leadership,
    LeaseId, LeaseSpec, Leases, Names, Renewal, StoredTask, TaskOp, Tasks, Version, WriteCost,
    WriteLimits, Written,
};

/// The longest a blocking `observe` or `list` waits, whatever it asks (Consul's cap); it
/// also keeps `now + wait` from overflowing.
const MAX_WAIT: Duration = Duration::from_secs(600);

/// A coordinator held in this process's memory. Share it (`Arc`) between the replicas of
/// one test; it runs nothing in the background.
#[derive(Debug)]
pub struct MemoryCoordinator {
    state: Mutex<State>,
    /// The global version after every change, so blocked waiters look again.
    changed: watch::Sender<u64>,
    /// Set by a test: every call answers `CoordError::Unavailable`.
    unavailable: AtomicBool,
}

impl Default for MemoryCoordinator {
    fn default() -> Self {
        MemoryCoordinator::new(MemoryConfig::default())
    }
}

impl MemoryCoordinator {
    /// An empty coordinator: no lease, no leader, no task.
    pub fn new(config: MemoryConfig) -> MemoryCoordinator {
        let core = State::new(config);
        let (changed, _) = watch::channel(core.index());
        MemoryCoordinator {
            state: Mutex::new(core),
            changed,
            unavailable: AtomicBool::new(false),
        }
    }

    /// Test support: writes a task as a producer does (no guard; a claim on it is kept).
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), CoordError> {
        self.apply(Op::Put {
            key: key.to_string(),
            value: value.to_vec(),
        })
        .map(drop)
    }

    /// Test support: deletes the leader record as an operator would (Consul's `DELETE` of
    /// the leader key): its holder loses leadership at once, without lock-delay, and the
    /// next leader's token is still above every one before.
    pub fn delete_leader_record(&self) -> Result<(), CoordError> {
        self.apply(Op::DeleteLeaderRecord).map(drop)
    }

    /// Test support: ends `lease` now as if its TTL had run out (a replica that hung or
    /// lost the network): lock-delay applies to what it held.
    pub fn expire_lease(&self, lease: &LeaseId) -> Result<(), CoordError> {
        self.apply(Op::Expire(lease.clone())).map(drop)
    }

    /// Test support: while set, every call answers `CoordError::Unavailable` (a waiter
    /// blocked in `observe` or `list` too). Time goes on meanwhile: leases not kept alive
    /// end on schedule.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.unavailable.store(unavailable, Ordering::SeqCst);
        // Wakes the waiters so they answer (or resume waiting) at once.
        self.changed.send_modify(|_| {});
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is left consistent between calls, so a panic elsewhere does not spoil it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn available(&self) -> Result<(), CoordError> {
        if self.unavailable.load(Ordering::SeqCst) {
            return Err(CoordError::Unavailable(
                "the in-memory coordinator is set unavailable by the test: try again later".into(),
            ));
        }
        Ok(())
    }

    /// Runs `f` on the state at the current instant, after ending the leases that ran out,
    /// and wakes the waiters if anything they could see changed.
    fn with_state<T>(&self, f: impl FnOnce(&mut State, Instant) -> T) -> Result<T, CoordError> {
        self.available()?;
        let mut core = self.lock();
        let now = Instant::now();
        let before = core.index();
        core.expire(now);
        let answer = f(&mut core, now);
        if core.index() != before {
            self.changed.send_replace(core.index());
        }
        Ok(answer)
    }

    fn apply(&self, op: Op) -> Result<Outcome, CoordError> {
        self.with_state(|core, now| core.apply(op, now))?
    }

    /// `read` once its version is past `after` (at once for `Version(0)`), or when `wait`
    /// (at most [`MAX_WAIT`]) is over. Wakes on every change and at every lease deadline, to end that lease.
    async fn wait_for<T>(
        &self,
        after: Version,
        wait: Duration,
        read: impl Fn(&State) -> (T, Version),
    ) -> Result<(T, Version), CoordError> {
        let end = Instant::now() + wait.min(MAX_WAIT);
        loop {
            let (mut changed, wake) = {
                let (answer, next_deadline, changed) = self.with_state(|core, now| {
                    let (value, version) = read(core);
                    let ready = after == Version(0) || version > after || now >= end;
                    // Subscribed under the lock: no change can slip in before the wait.
                    (
                        ready.then_some((value, version)),
                        core.next_deadline(),
                        self.changed.subscribe(),
                    )
                })?;
                if let Some(answer) = answer {
                    return Ok(answer);
                }
                (changed, next_deadline.map_or(end, |at| at.min(end)))
            };
            tokio::select! {
                _ = changed.changed() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

/// Picks the expected answer out of an [`Outcome`]; another one is a bug in this module.
fn expect<T>(outcome: Outcome, pick: impl FnOnce(Outcome) -> Option<T>) -> Result<T, CoordError> {
    let shown = format!("{outcome:?}");
    pick(outcome).ok_or_else(|| {
        CoordError::Unavailable(format!(
            "the in-memory coordinator answered {shown} out of turn: report this bug"
        ))
    })
}

impl Leases for MemoryCoordinator {
    fn describe(&self) -> String {
        "in-memory coordinator".into()
    }

    async fn open_lease(&self, spec: &LeaseSpec) -> Result<Grant, CoordError> {
        expect(self.apply(Op::OpenLease(spec.clone()))?, |o| match o {
            Outcome::Granted(grant) => Some(grant),
            _ => None,
        })
    }

    async fn keep_alive(&self, lease: &LeaseId) -> Result<Renewal, CoordError> {
        expect(self.apply(Op::KeepAlive(lease.clone()))?, |o| match o {
            Outcome::Renewed(renewal) => Some(renewal),
            _ => None,
        })
    }

    async fn revoke(&self, lease: &LeaseId) -> Result<(), CoordError> {
        self.apply(Op::Revoke(lease.clone())).map(drop)
    }

    /// Nothing else is tied to a node here: closing is revoking. Without a lease it still
    /// answers as every call does, so a test that set it unavailable sees that.
    async fn close(&self, lease: Option<&LeaseId>) -> Result<(), CoordError> {
        match lease {
            Some(lease) => self.apply(Op::Revoke(lease.clone())).map(drop),
            None => self.available(),
        }
    }
}

impl Elections for MemoryCoordinator {
    async fn observe(
        &self,
        after: Version,
        wait: Duration,
    ) -> Result<(Holder, Version), CoordError> {
        self.wait_for(after, wait, State::holder).await
    }

    async fn campaign(
        &self,
        lease: &LeaseId,
        record: &HolderRecord,
    ) -> Result<Campaign, CoordError> {
        let op = Op::Campaign {
            lease: lease.clone(),
            record: record.clone(),
        };
        expect(self.apply(op)?, |o| match o {
            Outcome::Campaigned(campaign) => Some(campaign),
            _ => None,
        })
    }

    async fn resign(&self, lease: &LeaseId) -> Result<(), CoordError> {
        self.apply(Op::Resign(lease.clone())).map(drop)
    }
}

impl Tasks for MemoryCoordinator {
    async fn list(
        &self,
        prefix: &str,
        after: Version,
        wait: Duration,
    ) -> Result<(Vec<StoredTask>, Version), CoordError> {
        self.wait_for(after, wait, move |core| core.list(prefix))
            .await
    }

    async fn keys(&self, prefix: &str) -> Result<(Names, Version), CoordError> {
        self.with_state(|core, _| core.keys(prefix))
    }

    async fn get(&self, keys: &[String]) -> Result<Vec<StoredTask>, CoordError> {
        self.with_state(|core, _| core.get(keys))
    }

    async fn write(&self, leadership: &Leadership, ops: &[TaskOp]) -> Result<Written, CoordError> {
        let op = Op::Write {
            leadership: leadership.clone(),
            ops: ops.to_vec(),
        };
        expect(self.apply(op)?, |o| match o {
            Outcome::Written(written) => Some(written),
            _ => None,
        })
    }

    async fn write_own(&self, lease: &LeaseId, ops: &[TaskOp]) -> Result<Written, CoordError> {
        let op = Op::WriteOwn {
            lease: lease.clone(),
            ops: ops.to_vec(),
        };
        expect(self.apply(op)?, |o| match o {
            Outcome::Written(written) => Some(written),
            _ => None,
        })
    }

    async fn edit(&self, ops: &[Edit]) -> Result<Edited, CoordError> {
        expect(self.apply(Op::Edit(ops.to_vec()))?, |o| match o {
            Outcome::Edited(edited) => Some(edited),
            _ => None,
        })
    }

    fn cost(&self, op: &TaskOp) -> WriteCost {
        WriteCost {
            ops: 1,
            bytes: state::op_bytes(op),
        }
    }

    fn guard_cost(&self) -> WriteCost {
        WriteCost { ops: 1, bytes: 0 }
    }

    fn limits(&self) -> WriteLimits {
        self.lock().limits()
    }
}
