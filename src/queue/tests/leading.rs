//! A lone leader leading the queue in a task of its own, started and shut down the way most
//! of the driver's tests do.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{lead_in_background, lone_leader, queue_on};
use crate::coord::{Coordinator, Leadership};
use crate::handler::Registry;
use crate::observe::Metrics;
use crate::queue::LeadEnd;

/// A lone leader on `coord` leading, in a task of its own, the queue `queue_on` builds.
pub(super) struct Leading {
    pub(super) leadership: Leadership,
    task: tokio::task::JoinHandle<LeadEnd>,
    shutdown: CancellationToken,
    /// Stops the lease's renewals.
    renewals: CancellationToken,
}

impl Leading {
    /// Wins on `coord` and leads with `registry`'s handlers under `settings`.
    pub(super) async fn start(
        coord: &Arc<dyn Coordinator>,
        settings: &crate::config::Settings,
        registry: Registry,
        metrics: Arc<Metrics>,
    ) -> Leading {
        let (leadership, lease, renewals) = lone_leader(coord, &metrics).await;
        let queue = queue_on(coord, settings, registry, metrics);
        let shutdown = CancellationToken::new();
        let task = lead_in_background(queue, &leadership, &lease, &shutdown);
        Leading {
            leadership,
            task,
            shutdown,
            renewals,
        }
    }

    /// Waits for the leading to end of itself, then stops the renewals.
    pub(super) async fn ended(self) -> LeadEnd {
        let end = self.task.await.unwrap();
        self.renewals.cancel();
        end
    }

    /// Shuts the leading down, which ends it as a shutdown, then stops the renewals.
    pub(super) async fn shut_down(self) {
        self.shutdown.cancel();
        assert_eq!(self.task.await.unwrap(), LeadEnd::Shutdown);
        self.renewals.cancel();
    }
}
