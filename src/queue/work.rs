//! What the driver works with while it works through one listing ([`Work`]: the backlog,
//! what the leader remembers, the finished runs waiting to be recorded, the handlers' pace
//! and whether claims go one task at a time), and whom it works for ([`Leading`]: the
//! leadership its writes are guarded by, the lease its runs live under, the shutdown).
//! Each is passed whole, so that a step of the driver names the state it changes once.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::backlog::Backlog;
use super::finished::Finished;
use super::sort::Memory;
use crate::coord::Leadership;
use crate::leader::Lease;

/// Whom the driver works for: what every claim, run and settlement of a term is under.
#[derive(Clone, Copy)]
pub(super) struct Leading<'a> {
    pub(super) leadership: &'a Leadership,
    pub(super) lease: &'a Lease,
    pub(super) shutdown: &'a CancellationToken,
}

/// The driver's state while it works through one listing.
pub(super) struct Work<'m> {
    /// What the leader knows of the queue, and what it does next between claims.
    pub(super) backlog: Backlog,
    /// What the leader remembers across listings while it leads.
    pub(super) memory: &'m mut Memory,
    /// Runs that succeeded, whose completions are still to be written (they ride the next
    /// claim's write, or are written on their own).
    pub(super) finished: Vec<Finished>,
    /// After the coordinator refused a claim as too large (a Consul whose limits are below
    /// leaderq's), one task per write, alone in it, until the next listing.
    pub(super) single: bool,
}

impl<'m> Work<'m> {
    /// The work of a listing just sorted out: nothing finished yet, no pace known.
    pub(super) fn new(backlog: Backlog, memory: &'m mut Memory) -> Work<'m> {
        Work {
            backlog,
            memory,
            finished: Vec::new(),
            single: false,
        }
    }
}

/// While handler runs take less than this, on average lately, claims take batches.
pub(super) const FAST_HANDLER: Duration = Duration::from_millis(5);

/// Whether handler runs are fast, from the last run and a moving average in which each
/// run counts for a quarter. A run under [`FAST_HANDLER`] is fast. A run over it but
/// under four times it is fast while the average stays under it: one run slowed by the
/// machine (a fork that waited for a core) does not end a stream's batches, a handler
/// that stays that slow does within a few runs. A longer run is slow at once. Pure.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Pace {
    last: Option<Duration>,
    average: Duration,
}

impl Pace {
    /// Counts a run that took `elapsed`.
    pub(super) fn record(&mut self, elapsed: Duration) {
        self.average = match self.last {
            None => elapsed,
            Some(_) => self.average * 3 / 4 + elapsed / 4,
        };
        self.last = Some(elapsed);
    }

    /// Runs are fast: the next claim may take a batch. Before any run, they are not.
    pub(super) fn fast(&self) -> bool {
        match self.last {
            None => false,
            Some(last) if last < FAST_HANDLER => true,
            Some(last) => last < FAST_HANDLER * 4 && self.average < FAST_HANDLER,
        }
    }
}

#[cfg(test)]
mod pace_tests {
    use super::{Pace, FAST_HANDLER};
    use std::time::Duration;

    fn after(runs_ms: &[u64]) -> Pace {
        let mut pace = Pace::default();
        for &ms in runs_ms {
            pace.record(Duration::from_millis(ms));
        }
        pace
    }

    #[test]
    fn no_run_yet_is_not_fast_and_the_first_run_decides() {
        assert!(!Pace::default().fast());
        assert!(after(&[1]).fast());
        assert!(!after(&[FAST_HANDLER.as_millis() as u64]).fast());
    }

    #[test]
    fn one_run_slowed_by_the_machine_keeps_the_batches() {
        assert!(after(&[1, 1, 1, 8]).fast());
        assert!(after(&[1, 1, 1, 8, 1, 9]).fast());
    }

    #[test]
    fn a_really_slow_run_ends_them_at_once_and_a_steady_slowish_one_soon() {
        assert!(!after(&[1, 1, 1, 21]).fast());
        assert!(!after(&[1, 1, 1, 1000]).fast());
        assert!(after(&[1, 7, 7, 7]).fast());
        assert!(!after(&[1, 7, 7, 7, 7]).fast());
    }

    #[test]
    fn fast_runs_bring_the_batches_back() {
        assert!(!after(&[1000]).fast());
        assert!(after(&[1000, 1]).fast());
        assert!(after(&[1, 7, 7, 7, 7, 4]).fast());
    }
}
