//! One term of `consume` on the queue, for a whole queue (`consume.rs`) or one shard of a
//! split one (`shards.rs`): the queue led while the leadership record is watched and the
//! schedules tick, and how the term's end reads for the lifecycle and the timeline.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::coord::Leadership;
use crate::leader::lifecycle::TermEnd;
use crate::queue::{LeadEnd, Queue};

/// How a term of `consume` ended, as the leadership timeline says it.
fn term_ended(end: &LeadEnd) -> String {
    match end {
        LeadEnd::Shutdown => "resigned (shut down)".to_string(),
        LeadEnd::Rotate => "rotated".to_string(),
        LeadEnd::StepDown(reason) => format!("stepped down: {reason}"),
    }
}

/// How a term of `consume` ended, for the lifecycle and the timeline.
pub(super) fn term_end(end: LeadEnd) -> (TermEnd, String) {
    let said = term_ended(&end);
    let end = match end {
        LeadEnd::Shutdown => TermEnd::Shutdown { code: 0 },
        LeadEnd::Rotate => TermEnd::Done { stand_back: true },
        LeadEnd::StepDown(reason) => TermEnd::StepDown { reason, stop: None },
    };
    (end, said)
}

/// Leads one term while watching the leadership record and ticking the queue's schedules:
/// a loss seen at the coordinator deposes the lease at once, which stops the runs
/// (SIGTERM, then SIGKILL after the kill grace) and ends the term, instead of waiting for
/// the next renewal to fail. The ticker stops with the term; a split queue's schedules
/// tick on shard 0's leader.
pub(super) async fn lead_watched(
    queue: &Queue,
    coord: &dyn crate::coord::Coordinator,
    leadership: &Leadership,
    lease: &crate::leader::Lease,
    wait: Duration,
    shutdown: &CancellationToken,
) -> LeadEnd {
    lease.begin_term();
    let lead = queue.lead(leadership, lease, shutdown);
    let watch = crate::leader::watch::until_lost(coord, leadership, wait);
    let ticker = crate::schedule::ticker::tick_while_leading(
        coord,
        leadership,
        lease,
        &queue.settings.prefix,
        &queue.node_id,
        wait,
    );
    tokio::pin!(lead, watch, ticker);
    let (mut watching, mut ticking) = (true, queue.sharding.leads_the_common_work());
    loop {
        tokio::select! {
            end = &mut lead => return end,
            () = &mut ticker, if ticking => ticking = false,
            reason = &mut watch, if watching => {
                watching = false;
                tracing::warn!(fencing_token = leadership.fencing_token.0, %reason, "stopping every run and stepping down");
                queue.metrics.leadership_lost();
                lease.depose(&reason);
            }
        }
    }
}
