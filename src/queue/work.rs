//! What the driver works with while it works through one listing ([`Work`]: the backlog,
//! what the leader remembers, the finished runs waiting to be recorded, the handlers' pace
//! and whether claims go one task at a time), and whom it works for ([`Leading`]: the
//! leadership its writes are guarded by, the lease its runs live under, the shutdown).
//! Each is passed whole, so that a step of the driver names the state it changes once.

use tokio_util::sync::CancellationToken;

use super::backlog::Backlog;
use super::finished::Finished;
use super::run::Pace;
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
    /// How fast the handlers run lately: claims take batches while they are fast.
    pub(super) pace: Pace,
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
            pace: Pace::default(),
            single: false,
        }
    }

    /// Whether the next claim may take a batch: handlers are fast, and the coordinator has
    /// not refused a claim as too large.
    pub(super) fn batches(&self) -> bool {
        self.pace.fast() && !self.single
    }
}
