//! What one guarded write takes (pure: no I/O, no clock): the tasks a claim write takes in
//! claim order, up to a count and within the coordinator's write limits (in its own costs),
//! plus completions of finished tasks; which task is too large to claim at all
//! ([`plan_claim`]); and how ops that cannot share one write are split ([`chunks`]).
//! `claim.rs` and `run.rs` write what it plans.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::ops::Range;

use crate::coord::{WriteCost, WriteLimits};

/// What one claim write takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimPlan {
    /// The first `finished` completions and the first `tasks` claims (at least one).
    Take { finished: usize, tasks: usize },
    /// The first candidate cannot be claimed even alone: its claim write would cost `cost`.
    TooLarge { cost: WriteCost },
}

/// Plans one claim write, in the coordinator's own costs: `guard` is the leadership guard
/// every write carries, `finished` one completion per finished task, `claims` one claim per
/// candidate in claim order, of which at most `max_tasks` are taken. Completions ride along
/// only as far as they leave room for the first claim; the rest wait for the next write.
pub fn plan_claim(
    guard: WriteCost,
    finished: &[WriteCost],
    claims: &[WriteCost],
    max_tasks: usize,
    limits: WriteLimits,
) -> ClaimPlan {
    let Some(&first) = claims.first() else {
        return ClaimPlan::Take {
            finished: 0,
            tasks: 0,
        };
    };
    if !limits.admits(guard + first) {
        return ClaimPlan::TooLarge {
            cost: guard + first,
        };
    }
    let mut total = guard;
    let mut taken_finished = 0;
    for &completion in finished {
        if !limits.admits(total + completion + first) {
            break;
        }
        total = total + completion;
        taken_finished += 1;
    }
    let mut tasks = 0;
    for &claim in claims.iter().take(max_tasks.max(1)) {
        if !limits.admits(total + claim) {
            break;
        }
        total = total + claim;
        tasks += 1;
    }
    ClaimPlan::Take {
        finished: taken_finished,
        tasks,
    }
}

/// Splits ops (`costs[i]` each) into writes within `limits`, each carrying the `guard`
/// when one is given. An op too large for any write still gets one of its own (the
/// coordinator then refuses it; the caller says so).
pub fn chunks(
    guard: Option<WriteCost>,
    costs: &[WriteCost],
    limits: WriteLimits,
) -> Vec<Range<usize>> {
    let base = guard.unwrap_or_default();
    let mut out = Vec::new();
    let mut start = 0;
    let mut total = base;
    for (i, &cost) in costs.iter().enumerate() {
        if !limits.admits(total + cost) && i > start {
            out.push(start..i);
            start = i;
            total = base;
        }
        total = total + cost;
    }
    if start < costs.len() {
        out.push(start..costs.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{chunks, plan_claim, ClaimPlan};
    use crate::coord::{WriteCost, WriteLimits};

    const LIMITS: WriteLimits = WriteLimits {
        max_ops: 64,
        max_bytes: 1000,
    };
    /// A guard as Consul's costs it: two ops (check-session, check-index).
    const GUARD: WriteCost = WriteCost { ops: 2, bytes: 20 };

    /// A claim (Consul: check-index and lock, two ops) of `bytes`.
    fn claims(bytes: usize, n: usize) -> Vec<WriteCost> {
        vec![WriteCost { ops: 2, bytes }; n]
    }

    /// A completion (one op) of `bytes`.
    fn completions(bytes: usize, n: usize) -> Vec<WriteCost> {
        vec![WriteCost { ops: 1, bytes }; n]
    }

    /// Claims are taken in order up to the count, the operations or the bytes, whichever
    /// comes first.
    #[test]
    fn a_claim_stops_at_the_count_the_operations_or_the_bytes() {
        let small = claims(10, 40);
        let roomy = WriteLimits {
            max_ops: 128,
            max_bytes: 100_000,
        };
        assert_eq!(
            plan_claim(GUARD, &[], &small, 32, roomy),
            ClaimPlan::Take {
                finished: 0,
                tasks: 32
            }
        );
        // 64 ops: the guard's 2 and 31 claims of 2 ops.
        assert_eq!(
            plan_claim(GUARD, &[], &small, 32, LIMITS),
            ClaimPlan::Take {
                finished: 0,
                tasks: 31
            }
        );
        // 2 guard + 32 completions leave 30 ops: 15 claims of 2 ops.
        let many_bytes = WriteLimits {
            max_ops: 64,
            max_bytes: 100_000,
        };
        assert_eq!(
            plan_claim(GUARD, &completions(5, 32), &small, 32, many_bytes),
            ClaimPlan::Take {
                finished: 32,
                tasks: 15
            }
        );
        // Bytes: 20, then 100 per claim: 9 claims make 920.
        assert_eq!(
            plan_claim(GUARD, &[], &claims(100, 20), 32, LIMITS),
            ClaimPlan::Take {
                finished: 0,
                tasks: 9
            }
        );
        assert_eq!(
            plan_claim(GUARD, &[], &small, 1, LIMITS),
            ClaimPlan::Take {
                finished: 0,
                tasks: 1
            }
        );
    }

    /// A task whose claim cannot fit even alone is reported with its cost; completions of
    /// finished tasks never crowd out the first claim.
    #[test]
    fn a_task_too_large_for_any_claim_is_reported_and_completions_yield() {
        assert_eq!(
            plan_claim(GUARD, &[], &claims(981, 1), 32, LIMITS),
            ClaimPlan::TooLarge {
                cost: WriteCost {
                    ops: 4,
                    bytes: 1001
                }
            }
        );
        let mut two = claims(980, 1);
        two.extend(claims(1, 1));
        assert_eq!(
            plan_claim(GUARD, &[], &two, 32, LIMITS),
            ClaimPlan::Take {
                finished: 0,
                tasks: 1
            }
        );
        // 20 + 100 + 800 fits, a second completion would leave no room for the first claim.
        let mut mixed = claims(800, 1);
        mixed.extend(claims(10, 1));
        assert_eq!(
            plan_claim(GUARD, &completions(100, 5), &mixed, 32, LIMITS),
            ClaimPlan::Take {
                finished: 1,
                tasks: 2
            }
        );
        let mut mixed = claims(800, 1);
        mixed.extend(claims(100, 1));
        assert_eq!(
            plan_claim(GUARD, &completions(100, 5), &mixed, 32, LIMITS),
            ClaimPlan::Take {
                finished: 1,
                tasks: 1
            }
        );
        // The guard's 2 and a claim's 2 leave room for 2 completions, none for a claim.
        let few_ops = WriteLimits {
            max_ops: 6,
            max_bytes: 100_000,
        };
        assert_eq!(
            plan_claim(GUARD, &completions(1, 10), &claims(1, 10), 32, few_ops),
            ClaimPlan::Take {
                finished: 2,
                tasks: 1
            }
        );
        assert_eq!(
            plan_claim(GUARD, &[], &[], 32, LIMITS),
            ClaimPlan::Take {
                finished: 0,
                tasks: 0
            }
        );
    }

    /// Ops split into writes within both limits; an op too large alone gets its own write.
    #[test]
    fn ops_split_into_writes_within_the_limits() {
        assert_eq!(
            chunks(None, &claims(100, 25), LIMITS),
            [0..10, 10..20, 20..25]
        );
        let few_ops = WriteLimits {
            max_ops: 5,
            max_bytes: 100_000,
        };
        let guard = WriteCost { ops: 1, bytes: 10 };
        assert_eq!(
            chunks(Some(guard), &completions(1, 9), few_ops),
            [0..4, 4..8, 8..9]
        );
        let mut uneven = claims(10, 1);
        uneven.extend(claims(5000, 1));
        uneven.extend(claims(10, 1));
        assert_eq!(chunks(None, &uneven, LIMITS), [0..1, 1..2, 2..3]);
        assert!(chunks(None, &[], LIMITS).is_empty());
    }
}
