//! The queue's pauses as the leader sees them: the queue's own flag (`leaderq pause`),
//! read before a listing is worked through and waited out when set, and the task types
//! paused on their own (`leaderq pause --type T`), read at most every `PAUSE_POLL`, whose
//! tasks are set aside until resumed.

use std::collections::HashSet;

use tokio_util::sync::CancellationToken;

use super::sort::Memory;
use super::{pause_key, paused_type_names, paused_types_prefix, LeadEnd, Queue, PAUSE_POLL};
use crate::coord::Leadership;
use crate::leader::Lease;

impl Queue {
    /// Whether the queue's pause flag is set. A flag that cannot be read is taken as not
    /// set: the listing that follows meets the same coordinator and backs off itself.
    pub(super) async fn paused(&self) -> bool {
        let key = [pause_key(&self.settings.prefix)];
        self.coord
            .get(&key)
            .await
            .is_ok_and(|found| !found.is_empty())
    }

    /// The task types paused on their own (`leaderq pause --type T`); `None` when they
    /// cannot be read (the leader keeps what it knew: the listing beside meets the same
    /// coordinator and backs off itself).
    pub(super) async fn paused_types(&self) -> Option<std::collections::HashSet<String>> {
        let prefix = paused_types_prefix(&self.settings.prefix);
        let (names, _) = self.coord.keys(&prefix).await.ok()?;
        Some(paused_type_names(&prefix, names.iter()).collect())
    }

    /// Whether the claims of this listing stop at a look: the queue is paused, or the set
    /// of paused types changed (a type paused is claimed no more; one resumed has its
    /// tasks listed again).
    pub(super) async fn stops_for_a_pause(&self, memory: &mut Memory) -> bool {
        if self.paused().await {
            return true;
        }
        self.refresh_paused_types(memory).await
    }

    /// Reads the paused types again into `memory`, unless they were read less than
    /// `PAUSE_POLL` ago: off the dispatch path, a task type is paused within a second, at
    /// the cost of one read a second at most. Answers whether they changed.
    pub(super) async fn refresh_paused_types(&self, memory: &mut Memory) -> bool {
        let clock = self.clock();
        if memory
            .types_read
            .is_some_and(|at| clock.since(at) < PAUSE_POLL)
        {
            return false;
        }
        let Some(types) = self.paused_types().await else {
            return false;
        };
        memory.types_read = Some(clock.instant());
        let changed = types != memory.paused_types;
        memory.paused_types = types;
        changed
    }

    /// Resolves once the paused types differ from those the last listing sorted by (read
    /// every `PAUSE_POLL`): a type resumed changes nothing in the queue, so the listing's
    /// wait would not end for it.
    pub(super) async fn until_types_change(&self, paused: Option<&HashSet<String>>) {
        let Some(paused) = paused else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(PAUSE_POLL).await;
            if self
                .paused_types()
                .await
                .is_some_and(|types| types != *paused)
            {
                return;
            }
        }
    }

    /// Waits, reading only the pause flag, until it is cleared (`None`: list again), the
    /// term ends by time (`None`: the loop rotates), or the leading must end.
    pub(super) async fn wait_while_paused(
        &self,
        leadership: &Leadership,
        lease: &Lease,
        shutdown: &CancellationToken,
    ) -> Option<LeadEnd> {
        tracing::info!(
            fencing_token = leadership.fencing_token.0,
            "queue paused: claiming nothing until `leaderq resume`"
        );
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Some(LeadEnd::Shutdown),
                _ = lease.expired() => return Some(LeadEnd::StepDown(lease.why_not_fresh())),
                _ = self.term_over() => return None,
                _ = tokio::time::sleep(PAUSE_POLL) => {}
            }
            if !self.paused().await {
                tracing::info!(fencing_token = leadership.fencing_token.0, "queue resumed");
                return None;
            }
        }
    }
}
