//! One replica's life, written once for `consume` and `run`: keep the lease renewed,
//! campaign, lead a term (the caller's [`Work`]), then resign, stand back, step down or
//! leave as [`after_term`] decides, and on the way out leave (give leadership up, end the
//! lease) before the renewer stops.
//!
//! What happens inside a term is the caller's: `consume` drains the queue, `run` runs its
//! command. What happens between terms is this file's: the coordinator's refusals end the
//! life with the reason, a lost lease is dropped and opened anew, other errors are retried
//! with a back-off, and every term is recorded in the leadership timeline
//! (`timeline.rs`) before leadership is given up, so that the next leader reads it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::config::ElectionSettings;
use crate::coord::{CoordError, Coordinator, Leadership, LeaseId};
use crate::leader::{Election, ElectionError};
use crate::observe::Metrics;

/// Back-off while the coordinator cannot be reached: doubles from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_LAST: Duration = Duration::from_secs(10);

/// How a term ended, as the work that led it says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TermEnd {
    /// Asked to shut down: the replica leaves, ending with `code`.
    Shutdown { code: i32 },
    /// Leadership was lost at the coordinator, or the work cannot go on under it: resign and
    /// end the lease, so that whatever it holds goes back. `stop`: the replica then ends
    /// with that code instead of campaigning again.
    StepDown { reason: String, stop: Option<i32> },
    /// Leadership was seen lost and the work stopped: end the lease without resigning
    /// (nothing is held any more). `stop` as for `StepDown`.
    Lost { stop: Option<i32> },
    /// The work is done for this term: give leadership up and campaign again, standing
    /// back first when `stand_back` (so that another replica leads).
    Done { stand_back: bool },
    /// The work is over for good: leave, ending with `code`.
    Finished { code: i32 },
}

/// What the replica does once a term ended: a pure function of how it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterTerm {
    /// Give leadership up, keep the lease, campaign again.
    Resign,
    /// Give leadership up and stand back until another replica leads (or a TTL passes).
    StandBack,
    /// Resign, end the lease, open a new one and campaign again.
    StepDown,
    /// End the lease without resigning, open a new one and campaign again.
    DropLease,
    /// Leave with this exit code, after `first` (`None`: leaving gives everything up).
    Leave { code: i32, first: Option<Release> },
}

/// How leadership and the lease are given up before the replica leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Resign, then end the lease.
    StepDown,
    /// End the lease without resigning.
    DropLease,
}

/// The step after a term that ended as `end`.
pub fn after_term(end: &TermEnd) -> AfterTerm {
    match end {
        TermEnd::Shutdown { code } | TermEnd::Finished { code } => AfterTerm::Leave {
            code: *code,
            first: None,
        },
        TermEnd::StepDown { stop: None, .. } => AfterTerm::StepDown,
        TermEnd::Lost { stop: None } => AfterTerm::DropLease,
        TermEnd::StepDown {
            stop: Some(code), ..
        } => AfterTerm::Leave {
            code: *code,
            first: Some(Release::StepDown),
        },
        TermEnd::Lost { stop: Some(code) } => AfterTerm::Leave {
            code: *code,
            first: Some(Release::DropLease),
        },
        TermEnd::Done { stand_back: true } => AfterTerm::StandBack,
        TermEnd::Done { stand_back: false } => AfterTerm::Resign,
    }
}

/// What a replica does while it leads; `consume` and `run` each have one.
pub trait Work {
    /// Called when the lease was taken up from a previous process of this replica (a
    /// restart), before it campaigns: undo what that process left under the lease.
    fn taken_up(&mut self, lease: &LeaseId) -> impl Future<Output = ()> + Send {
        let _ = lease;
        async {}
    }

    /// Called before each campaign: waits until this replica may contend (`Ok(None)`: it
    /// is shutting down; `Err`: the coordinator refuses it, and the life ends with the
    /// reason), and answers what ends a campaign it should no longer pursue (a token
    /// cancelled on shutdown, or sooner). By default it contends at once, until shutdown.
    fn may_contend(
        &mut self,
        shutdown: &CancellationToken,
    ) -> impl Future<Output = Result<Option<CancellationToken>, String>> + Send {
        let until = (!shutdown.is_cancelled()).then(|| shutdown.clone());
        async { Ok(until) }
    }

    /// Called once leadership is won, before the term is recorded in the timeline: `Some`
    /// ends the term at once (leadership lost during a pause, a shutdown).
    fn before_term(
        &mut self,
        leadership: &Leadership,
    ) -> impl Future<Output = Option<TermEnd>> + Send {
        let _ = leadership;
        async { None }
    }

    /// Leads one term under `leadership` until it ends; by the time this returns, no run
    /// the term started is still going. Also says how the timeline should describe the
    /// term's end.
    fn lead(&mut self, leadership: &Leadership) -> impl Future<Output = (TermEnd, String)> + Send;
}

/// One replica: its coordinator, its election and what it reports.
pub struct Replica {
    pub coord: Arc<dyn Coordinator>,
    pub election: Election,
    pub metrics: Arc<Metrics>,
    /// How long one watch of the coordinator may wait.
    pub wait: Duration,
    /// The leader key, whose timeline records each term.
    pub leader_key: String,
}

impl Replica {
    /// The replica `node_id` on `coord`, its lease kept in `data_dir`, electing under
    /// `settings`; nothing is asked of the coordinator yet.
    pub fn new(
        coord: Arc<dyn Coordinator>,
        settings: &ElectionSettings,
        node_id: &str,
        data_dir: &std::path::Path,
        metrics: Arc<Metrics>,
        wait: Duration,
    ) -> Replica {
        Replica {
            coord: coord.clone(),
            election: Election::new(
                coord,
                settings.clone(),
                node_id.to_string(),
                data_dir.to_path_buf(),
            ),
            metrics,
            wait,
            leader_key: settings.leader_key.clone(),
        }
    }

    /// Keeps the lease renewed every TTL/3 on `tracker` until `stop`. Cancel `stop` only
    /// after [`Replica::live`] returned: it leaves before the lease stops being renewed.
    pub fn renew(&self, ttl: Duration, tracker: &TaskTracker, stop: CancellationToken) {
        tracker.spawn(
            Election::renew_until(
                self.coord.clone(),
                self.election.lease(),
                ttl,
                self.metrics.clone(),
                stop,
            )
            .in_current_span(),
        );
    }

    /// Campaigns and leads terms with `work` until `shutdown`, a term that ends the life,
    /// or a refusal from the coordinator (`Err`, with its reason); then leaves. The exit
    /// code the work ended with, 0 on shutdown between terms.
    pub async fn live<W: Work>(
        &mut self,
        work: &mut W,
        shutdown: &CancellationToken,
    ) -> Result<i32, String> {
        let node_id = self.election.node_id().to_string();
        let mut backoff = BACKOFF_FIRST;
        let mut ended = Ok(0);
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            // A lease taken up from before a restart may still hold what the previous
            // process left: the work undoes it before this replica stands by.
            // A coordinator that refuses this replica (its certificates, its TTL) ends the
            // life here with the reason, before the work asks anything of it.
            match self.election.ensure_lease().await {
                Ok(_) => {
                    if let Some(lease) = self.election.take_reused() {
                        work.taken_up(&lease).await;
                    }
                }
                Err(ElectionError::Coord(CoordError::Refused(reason))) => {
                    ended = Err(reason);
                    break;
                }
                Err(_) => {}
            }
            let until = match work.may_contend(shutdown).await {
                Ok(Some(until)) => until,
                Ok(None) => break,
                Err(reason) => {
                    ended = Err(reason);
                    break;
                }
            };
            let leadership = match self.election.campaign(self.wait, &until).await {
                Ok(None) if shutdown.is_cancelled() => break,
                // No longer worth contending for: withdraw (a candidacy left in line, a
                // ZooKeeper latch node, would become leadership no one exercises), then ask
                // again.
                Ok(None) => {
                    if let Some(lease) = self.election.lease().id() {
                        if let Err(err) = self.coord.resign(&lease).await {
                            tracing::warn!(error = %err, "cannot withdraw from the election");
                        }
                    }
                    continue;
                }
                Ok(Some(leadership)) => leadership,
                Err(ElectionError::Coord(CoordError::Refused(reason))) => {
                    ended = Err(reason);
                    break;
                }
                Err(ElectionError::LeaseLost(lease)) => {
                    tracing::warn!(%lease, "lease lost; opening a new one");
                    self.election.drop_lease().await;
                    continue;
                }
                Err(ElectionError::Coord(err)) => {
                    self.metrics.coordinator_error(&err);
                    tracing::warn!(error = %err, retry_in = ?backoff, "coordinator request failed; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(BACKOFF_LAST);
                    continue;
                }
            };
            backoff = BACKOFF_FIRST;
            tracing::info!(node = %node_id, lease = %leadership.lease, fencing_token = leadership.fencing_token.0, "became leader");
            let end = match work.before_term(&leadership).await {
                Some(end) => end,
                None => {
                    let coord = self.coord.as_ref();
                    // The term is recorded while the work starts: the timeline is for
                    // operators, and its reads and write would hold up the first claim.
                    let (term, (end, said)) = tokio::join!(
                        crate::leader::timeline::start_logged(
                            coord,
                            &self.leader_key,
                            &node_id,
                            leadership.fencing_token,
                        ),
                        work.lead(&leadership)
                    );
                    // Said before leadership is given up, so that the next leader reads it.
                    crate::leader::timeline::end_logged(coord, &self.leader_key, term, said).await;
                    end
                }
            };
            match after_term(&end) {
                AfterTerm::Resign => {
                    if let Err(err) = self.coord.resign(&leadership.lease).await {
                        tracing::warn!(error = %err, "cannot release the leader key");
                    }
                }
                AfterTerm::StandBack => {
                    tracing::info!(node = %node_id, fencing_token = leadership.fencing_token.0, "giving leadership up and standing back");
                    self.election.rotate(&leadership, shutdown).await;
                }
                AfterTerm::StepDown => {
                    if let TermEnd::StepDown { reason, .. } = &end {
                        tracing::warn!(node = %node_id, fencing_token = leadership.fencing_token.0, %reason, "stepping down");
                    }
                    // Resign first (no lock-delay), then end the lease so that every task
                    // it still holds goes back to the queue.
                    self.election.step_down(&leadership).await;
                }
                AfterTerm::DropLease => self.election.drop_lease().await,
                AfterTerm::Leave { code, first } => {
                    match first {
                        Some(Release::StepDown) => self.election.step_down(&leadership).await,
                        Some(Release::DropLease) => self.election.drop_lease().await,
                        None => {}
                    }
                    ended = Ok(code);
                    break;
                }
            }
        }
        tracing::info!(node = %node_id, "leaving: giving leadership and the lease up");
        self.election.leave().await;
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shutdown or a finished work leaves with its code and keeps the lease for `leave`.
    #[test]
    fn a_shutdown_or_a_finished_work_leaves_with_its_code() {
        for end in [TermEnd::Shutdown { code: 0 }, TermEnd::Finished { code: 3 }] {
            let code = match end {
                TermEnd::Shutdown { code } | TermEnd::Finished { code } => code,
                _ => unreachable!(),
            };
            assert_eq!(after_term(&end), AfterTerm::Leave { code, first: None });
        }
    }

    /// A step-down resigns and ends the lease; a loss only ends it; either stops the life
    /// when the work says so, and the lease ends first.
    #[test]
    fn losses_end_the_lease_and_stop_only_when_asked() {
        let step_down = |stop| TermEnd::StepDown {
            reason: "lost".into(),
            stop,
        };
        assert_eq!(after_term(&step_down(None)), AfterTerm::StepDown);
        assert_eq!(
            after_term(&TermEnd::Lost { stop: None }),
            AfterTerm::DropLease
        );
        assert_eq!(
            after_term(&step_down(Some(75))),
            AfterTerm::Leave {
                code: 75,
                first: Some(Release::StepDown)
            }
        );
        assert_eq!(
            after_term(&TermEnd::Lost { stop: Some(75) }),
            AfterTerm::Leave {
                code: 75,
                first: Some(Release::DropLease)
            }
        );
    }

    /// A term done gives leadership up; standing back only when asked.
    #[test]
    fn a_done_term_resigns_or_stands_back() {
        assert_eq!(
            after_term(&TermEnd::Done { stand_back: false }),
            AfterTerm::Resign
        );
        assert_eq!(
            after_term(&TermEnd::Done { stand_back: true }),
            AfterTerm::StandBack
        );
    }
}
