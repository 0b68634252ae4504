//! The term core (`term.rs`) as transcripts: what happened in, what the driver does out,
//! with no runtime and no coordinator. One slot: claims batched and sent ahead of the
//! runs, a failed earlier claim, a slow run sending the rest back, late renewals, a
//! shutdown in a batch. Several slots: groups filling the free slots, a failed run's retry
//! looked for first, runs held by another lease, a lost leadership while runs go on.

use std::time::Duration;

use crate::queue::backlog::{Next, LOOK_INTERVAL};
use crate::queue::term::{Action, Came, Event, Seen, Term};
use crate::queue::LeadEnd;

/// What the driver sees when all is well: a fresh lease with room, the backlog asking for
/// a claim, nothing on its way.
fn seen() -> Seen {
    Seen {
        stop: None,
        headroom: true,
        next: Next::Claim,
        in_line: true,
        read_ready: false,
        answered: false,
        finished: false,
        unsure: false,
        single: false,
        held: false,
    }
}

fn ran(elapsed_ms: u64) -> Event {
    Event::RunEnded {
        succeeded: true,
        elapsed: Duration::from_millis(elapsed_ms),
        end: None,
    }
}

fn failed() -> Event {
    Event::RunEnded {
        succeeded: false,
        elapsed: Duration::from_millis(1),
        end: None,
    }
}

/// Feeds `events` in turn, each with `seen`, and answers the actions of each.
fn transcript(term: &mut Term, events: Vec<Event>, seen: &Seen) -> Vec<Vec<Action>> {
    events
        .into_iter()
        .map(|event| term.step(event, seen))
        .collect()
}

/// One slot, handlers already found fast: the first run of a claim of one task was quick.
fn fast_one_slot() -> Term {
    let mut term = Term::new(1, 8);
    let got = transcript(
        &mut term,
        vec![Event::Go, Event::Claimed(Came::On(1)), Event::Go],
        &seen(),
    );
    assert_eq!(
        got,
        vec![
            vec![Action::Claim { max_tasks: 1 }],
            vec![Action::Start],
            vec![Action::WaitRuns { at_most: None }],
        ],
        "before any run, one task per claim and nothing ahead"
    );
    term
}

#[test]
fn fast_runs_claim_the_next_batch_ahead_and_a_second_when_they_beat_its_answer() {
    let mut term = fast_one_slot();
    let after_first = Seen {
        finished: true,
        ..seen()
    };
    assert_eq!(
        term.step(ran(1), &after_first),
        vec![Action::Claim { max_tasks: 8 }],
        "a fast run: the completion rides the next claim, a batch"
    );
    let got = transcript(
        &mut term,
        vec![
            Event::Claimed(Came::On(3)),
            Event::Sent(Ok(true)),
            Event::Go,
            ran(1),
            Event::Go,
            ran(1),
            Event::Go,
        ],
        &seen(),
    );
    assert_eq!(
        got,
        vec![
            vec![Action::SendClaim { max_tasks: 8 }],
            vec![Action::Start],
            vec![Action::WaitRuns { at_most: None }],
            vec![Action::Start],
            vec![Action::WaitRuns { at_most: None }],
            vec![Action::Start],
            vec![Action::WaitRuns { at_most: None }],
        ],
        "the next claim goes out before the batch's runs, which run one after another"
    );
    // The runs beat the claim's answer: a second goes out, then the first is read; it held,
    // so the second stays on its way and the batch the first took starts.
    let got = transcript(
        &mut term,
        vec![
            ran(1),
            Event::Sent(Ok(true)),
            Event::Answered { held: true },
            Event::Applied(Came::On(2)),
        ],
        &seen(),
    );
    assert_eq!(
        got,
        vec![
            vec![Action::SendClaim { max_tasks: 8 }],
            vec![Action::ReadAnswer],
            vec![Action::ApplyAnswer],
            vec![Action::Start],
        ]
    );
}

#[test]
fn an_answer_in_before_the_runs_end_is_read_and_the_next_claim_goes_out_before_it_is_applied() {
    let mut term = fast_one_slot();
    term.step(ran(1), &seen());
    let got = transcript(
        &mut term,
        vec![
            Event::Claimed(Came::On(1)),
            Event::Sent(Ok(true)),
            Event::Go,
        ],
        &seen(),
    );
    assert_eq!(got[2], vec![Action::WaitRuns { at_most: None }]);
    let answered = Seen {
        answered: true,
        ..seen()
    };
    let got = transcript(
        &mut term,
        vec![
            ran(1),
            Event::Answered { held: true },
            Event::Sent(Ok(true)),
            Event::Applied(Came::On(4)),
        ],
        &answered,
    );
    assert_eq!(
        got,
        vec![
            vec![Action::ReadAnswer],
            vec![Action::SendClaim { max_tasks: 8 }],
            vec![Action::ApplyAnswer],
            vec![Action::Start],
        ]
    );
}

/// One slot, a batch running with a claim ahead of it and a second claim sent after its
/// runs: up to the first answer.
fn two_claims_on_their_way() -> Term {
    let mut term = fast_one_slot();
    term.step(ran(1), &seen());
    let got = transcript(
        &mut term,
        vec![
            Event::Claimed(Came::On(1)),
            Event::Sent(Ok(true)),
            ran(1),
            Event::Sent(Ok(true)),
        ],
        &seen(),
    );
    assert_eq!(got[3], vec![Action::ReadAnswer]);
    term
}

#[test]
fn a_failed_earlier_claim_takes_back_what_the_later_one_claimed_so_that_the_order_holds() {
    let mut term = two_claims_on_their_way();
    let got = transcript(
        &mut term,
        vec![
            Event::Answered { held: false },
            Event::TakenBack(Came::On(0)),
            Event::Applied(Came::On(0)),
        ],
        &seen(),
    );
    assert_eq!(
        got,
        vec![
            vec![Action::TakeBack],
            vec![Action::ApplyAnswer],
            vec![Action::Claim { max_tasks: 8 }],
        ],
        "nothing on its way any more: the next claim is made now, from the tasks read again"
    );
}

#[test]
fn a_failed_earlier_claim_whose_later_one_cannot_be_read_again_lists_again() {
    let mut term = two_claims_on_their_way();
    let got = transcript(
        &mut term,
        vec![
            Event::Answered { held: false },
            Event::TakenBack(Came::Relist),
            Event::Applied(Came::On(0)),
        ],
        &seen(),
    );
    assert_eq!(got[2], vec![Action::Leave(None)]);
}

#[test]
fn a_slow_run_records_at_once_and_sends_the_rest_of_the_batch_back() {
    let mut term = fast_one_slot();
    term.step(ran(1), &seen());
    let got = transcript(
        &mut term,
        vec![
            Event::Claimed(Came::On(3)),
            // Nothing more to claim ahead.
            Event::Sent(Ok(false)),
            Event::Go,
        ],
        &seen(),
    );
    assert_eq!(got[1], vec![Action::Start]);
    let finished = Seen {
        finished: true,
        ..seen()
    };
    assert_eq!(
        term.step(ran(1000), &finished),
        vec![Action::Record, Action::SendBack]
    );
    assert_eq!(
        term.step(Event::SentBack(Came::On(0)), &seen()),
        vec![Action::Claim { max_tasks: 1 }],
        "slow now: one task per claim, nothing ahead"
    );
}

#[test]
fn a_slow_run_sends_back_the_batch_the_claim_ahead_of_it_took() {
    let mut term = fast_one_slot();
    term.step(ran(1), &seen());
    transcript(
        &mut term,
        vec![Event::Claimed(Came::On(1)), Event::Sent(Ok(true))],
        &seen(),
    );
    let answered = Seen {
        answered: true,
        ..seen()
    };
    let got = transcript(
        &mut term,
        vec![
            ran(1000),
            Event::Answered { held: true },
            Event::Applied(Came::On(5)),
            Event::SentBack(Came::On(0)),
        ],
        &answered,
    );
    assert_eq!(
        got,
        vec![
            vec![Action::ReadAnswer],
            vec![Action::ApplyAnswer],
            vec![Action::SendBack],
            vec![Action::Claim { max_tasks: 1 }],
        ]
    );
}

#[test]
fn late_renewals_land_what_is_on_its_way_and_hold_until_the_lease_has_room() {
    let mut term = fast_one_slot();
    term.step(ran(1), &seen());
    transcript(
        &mut term,
        vec![
            Event::Claimed(Came::On(2)),
            Event::Sent(Ok(true)),
            Event::Go,
            ran(1),
            Event::Go,
        ],
        &seen(),
    );
    let late = Seen {
        headroom: false,
        answered: true,
        ..seen()
    };
    // The batch is over: its claim ahead is answered; what it took runs next.
    let got = transcript(
        &mut term,
        vec![
            ran(1),
            Event::Answered { held: true },
            Event::Applied(Came::On(2)),
        ],
        &late,
    );
    assert_eq!(
        got,
        vec![
            vec![Action::ReadAnswer],
            vec![Action::ApplyAnswer],
            vec![Action::Hold],
        ],
        "no claim goes out early without room; then nothing starts, it all goes back"
    );
    assert_eq!(
        term.step(Event::Held(None), &seen()),
        vec![Action::Claim { max_tasks: 8 }],
        "renewed: claims again, from the tasks put back"
    );
    assert_eq!(
        term.step(
            Event::Held(Some(LeadEnd::Shutdown)),
            &Seen {
                headroom: false,
                ..seen()
            }
        ),
        vec![Action::Leave(Some(LeadEnd::Shutdown))]
    );
}

#[test]
fn a_shutdown_in_a_batch_puts_back_what_did_not_start_and_the_batch_claimed_ahead() {
    let mut term = fast_one_slot();
    term.step(ran(1), &seen());
    transcript(
        &mut term,
        vec![
            Event::Claimed(Came::On(3)),
            Event::Sent(Ok(true)),
            Event::Go,
        ],
        &seen(),
    );
    let stopping = Seen {
        stop: Some(LeadEnd::Shutdown),
        answered: true,
        ..seen()
    };
    let got = transcript(
        &mut term,
        vec![
            ran(1),
            Event::Go,
            Event::Answered { held: true },
            Event::Applied(Came::On(4)),
        ],
        &stopping,
    );
    assert_eq!(
        got,
        vec![
            vec![Action::PutBack],
            vec![Action::ReadAnswer],
            vec![Action::ApplyAnswer],
            vec![Action::PutBack, Action::Leave(Some(LeadEnd::Shutdown))],
        ],
        "renew between tasks: nothing starts after the stop, nothing is sent ahead"
    );
}

#[test]
fn a_read_asked_for_is_made_in_line_when_cheap_and_beside_the_claims_when_not() {
    let mut term = Term::new(1, 8);
    let look = Seen {
        next: Next::Look,
        ..seen()
    };
    assert_eq!(term.step(Event::Go, &look), vec![Action::Look]);
    assert_eq!(
        term.step(Event::Read(Came::On(0)), &seen()),
        vec![Action::Claim { max_tasks: 1 }]
    );
    let mut term = Term::new(1, 8);
    let costly = Seen {
        next: Next::Relist,
        in_line: false,
        ..seen()
    };
    assert_eq!(
        term.step(Event::Go, &costly),
        vec![
            Action::StartRead(crate::queue::term::ReadKind::Relist),
            Action::Claim { max_tasks: 1 }
        ]
    );
    let ready = Seen {
        read_ready: true,
        ..seen()
    };
    assert_eq!(
        term.step(Event::Claimed(Came::On(0)), &ready),
        vec![Action::MergeRead],
        "what was read is merged before the next claim: it may come first"
    );
    assert_eq!(
        term.step(Event::Read(Came::Relist), &seen()),
        vec![Action::Leave(None)]
    );
}

#[test]
fn groups_fill_the_free_slots_and_a_failed_runs_retry_is_looked_for_first() {
    let mut term = Term::new(3, 8);
    let got = transcript(
        &mut term,
        vec![
            Event::Go,
            Event::Claimed(Came::On(2)),
            Event::Claimed(Came::NothingFree),
            failed(),
            Event::Read(Came::On(0)),
            Event::Claimed(Came::On(2)),
        ],
        &seen(),
    );
    assert_eq!(
        got,
        vec![
            vec![Action::ClaimFree { free: 3 }],
            vec![Action::ClaimFree { free: 1 }],
            vec![Action::WaitRuns {
                at_most: Some(LOOK_INTERVAL)
            }],
            vec![Action::Look],
            vec![Action::ClaimFree { free: 2 }],
            vec![Action::WaitRuns { at_most: None }],
        ],
        "nothing ahead, every slot filled, a retry read before its group goes on"
    );
}

#[test]
fn several_runs_that_ended_at_once_are_taken_in_before_the_next_decision() {
    let mut term = Term::new(2, 8);
    transcript(
        &mut term,
        vec![Event::Go, Event::Claimed(Came::On(2))],
        &seen(),
    );
    let done = Seen {
        next: Next::Done,
        ..seen()
    };
    // A claim outcome, and two runs that ended while it was made.
    term.absorb(Event::Claimed(Came::On(0)));
    term.absorb(ran(1));
    assert_eq!(term.step(ran(1), &done), vec![Action::Leave(None)]);
}

#[test]
fn a_group_held_by_another_lease_waits_then_lists_again() {
    let mut term = Term::new(2, 8);
    let held = Seen {
        held: true,
        ..seen()
    };
    let got = transcript(
        &mut term,
        vec![Event::Go, Event::Claimed(Came::NothingFree), Event::Waited],
        &held,
    );
    assert_eq!(
        got,
        vec![
            vec![Action::ClaimFree { free: 2 }],
            vec![Action::WaitHeld],
            vec![Action::Leave(None)],
        ]
    );
}

#[test]
fn several_slots_stop_starting_at_late_renewals_and_a_stop_waits_for_the_runs() {
    let mut term = Term::new(3, 8);
    transcript(
        &mut term,
        vec![Event::Go, Event::Claimed(Came::On(2))],
        &seen(),
    );
    let late = Seen {
        headroom: false,
        ..seen()
    };
    assert_eq!(
        term.step(Event::Go, &late),
        vec![Action::WaitRuns {
            at_most: Some(LOOK_INTERVAL)
        }]
    );
    let lost = Seen {
        stop: Some(LeadEnd::StepDown("the lease ended".into())),
        ..seen()
    };
    let got = transcript(&mut term, vec![Event::Waited, ran(1), ran(1)], &lost);
    assert_eq!(
        got,
        vec![
            vec![Action::MarkLost, Action::WaitRuns { at_most: None }],
            vec![Action::MarkLost, Action::WaitRuns { at_most: None }],
            vec![Action::Leave(Some(LeadEnd::StepDown(
                "the lease ended".into()
            )))],
        ],
        "the leadership is gone: the runs going on are stopped and waited for"
    );
}
