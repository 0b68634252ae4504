//! Pure: what the term core (`term.rs`) does with one slot once a batch's runs are
//! over and the claim sent ahead of them is answered: start the batch that claim took,
//! send it back to be read again (a slow run means the rest should not wait behind it),
//! or put it back untouched and leave the listing (a stop, or a listing gone stale).
//! Tested as transcripts below: what happened in, what the driver does out.

use super::LeadEnd;

/// How the runs of a claimed batch ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Ran {
    /// Every task ran, or a slow run sent the rest back and they were read again.
    Done,
    /// What a slow run sent back could not be read again: list again.
    Relist,
    End(LeadEnd),
}

/// What becomes of the batch the claim sent ahead took, once its answer is applied.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Then {
    /// It runs next.
    Start,
    /// A slow run ended the batches: it goes back and is read again, so that it takes its
    /// place behind an earlier task that arrived or fell due meanwhile.
    SendBack,
    /// It goes back untouched, and the driver leaves the listing: why the leading ends, if
    /// it does (`None`: list again).
    PutBack(Option<LeadEnd>),
}

/// The batch claimed ahead, after the runs before it: `stopping` is why the leading ends
/// if a claim sent meanwhile said so, `relist` whether what a failed earlier claim's
/// later claim took could not be read again, `fast` whether handlers are still fast.
pub(super) fn after_batch(stopping: Option<LeadEnd>, relist: bool, ran: Ran, fast: bool) -> Then {
    if let Some(stop) = stopping {
        return Then::PutBack(Some(stop));
    }
    if relist {
        return Then::PutBack(None);
    }
    match ran {
        Ran::Done if !fast => Then::SendBack,
        Ran::Done => Then::Start,
        Ran::Relist => Then::PutBack(None),
        Ran::End(stop) => Then::PutBack(Some(stop)),
    }
}

/// Whether a second claim goes out before the first is answered: the runs went faster
/// than the coordinator answers, so it always has one to work on.
pub(super) fn send_second(ran: &Ran, first_answered: bool) -> bool {
    matches!(ran, Ran::Done) && !first_answered
}

/// Whether the claim after this one goes out before this answer is applied, so that the
/// coordinator works on it while the leader applies the answer and runs the batch: only
/// when nothing is on its way already, nothing stops, the claim held and the runs before
/// it all ran.
pub(super) fn send_next_early(in_flight: bool, stopping: bool, held: bool, ran: &Ran) -> bool {
    !in_flight && !stopping && held && matches!(ran, Ran::Done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stop() -> LeadEnd {
        LeadEnd::StepDown("lost leadership at claim".into())
    }

    #[test]
    fn fast_runs_start_the_batch_claimed_ahead() {
        assert_eq!(after_batch(None, false, Ran::Done, true), Then::Start);
    }

    #[test]
    fn a_slow_run_sends_the_batch_claimed_ahead_back_to_be_read_again() {
        assert_eq!(after_batch(None, false, Ran::Done, false), Then::SendBack);
    }

    #[test]
    fn a_stop_met_while_claiming_ahead_puts_the_batch_back_and_ends() {
        assert_eq!(
            after_batch(Some(stop()), false, Ran::Done, true),
            Then::PutBack(Some(stop()))
        );
        // Whatever the runs said.
        assert_eq!(
            after_batch(Some(stop()), true, Ran::Relist, false),
            Then::PutBack(Some(stop()))
        );
    }

    #[test]
    fn a_failed_earlier_claim_whose_later_one_could_not_be_read_again_lists_again() {
        assert_eq!(
            after_batch(None, true, Ran::Done, true),
            Then::PutBack(None)
        );
    }

    #[test]
    fn runs_that_ended_the_leading_or_the_listing_put_the_batch_back() {
        assert_eq!(
            after_batch(None, false, Ran::End(LeadEnd::Shutdown), true),
            Then::PutBack(Some(LeadEnd::Shutdown))
        );
        assert_eq!(
            after_batch(None, false, Ran::Relist, true),
            Then::PutBack(None)
        );
    }

    #[test]
    fn a_second_claim_goes_out_only_when_the_runs_beat_the_first_answer() {
        assert!(send_second(&Ran::Done, false));
        assert!(!send_second(&Ran::Done, true));
        assert!(!send_second(&Ran::Relist, false));
        assert!(!send_second(&Ran::End(LeadEnd::Shutdown), false));
    }

    #[test]
    fn the_next_claim_goes_out_early_only_after_a_claim_that_held_and_runs_that_all_ran() {
        assert!(send_next_early(false, false, true, &Ran::Done));
        assert!(!send_next_early(true, false, true, &Ran::Done));
        assert!(!send_next_early(false, true, true, &Ran::Done));
        assert!(!send_next_early(false, false, false, &Ran::Done));
        assert!(!send_next_early(false, false, true, &Ran::Relist));
    }
}
