//! When the replica's keep-alives go out: a pure schedule of what the renewer saw and
//! `now`. The renewer (`Election::renew_until` in `mod.rs`) sends them, each on a task of
//! its own, and tells the schedule what became of each.
//!
//! The schedule keeps time whatever the latency. A keep-alive goes out every TTL/3 after
//! the one before, whether or not that one has been answered. The lease's deadline counts
//! from the send of the latest one acknowledged (`lease.rs`), so with every answer `L` late
//! the lease is at most TTL/3 + `L` old when the next answer comes: it keeps
//! 2/3 × TTL − `L`. A run is stopped once that is less than its kill sequence (`kill_grace`
//! plus the supervisor's margin of TTL/10), so latency below 2/3 × TTL − kill_grace −
//! TTL/10 stops nothing: the bound `config/default.toml` and `docs/handlers.md` state. A
//! renewer that waited for each answer before the next send let the lease age by twice the
//! latency before its next answer, and stopped runs at about half that bound.
//!
//! - One keep-alive is waited for at most a TTL ([`Schedule::patience`]): an answer later
//!   than that acknowledges a send whose deadline has passed, and cannot keep the lease.
//! - So at most a TTL's worth of sends, plus one, are on their way at once
//!   ([`IN_FLIGHT_MAX`]); while that many are, nothing more is sent (a coordinator that
//!   takes a request and never answers costs no more than that).
//! - A failed keep-alive brings the next one forward, to [`retry`] after the failure, and
//!   never puts it back: a coordinator that refused one (a restart) gets another soon.
//! - An answer that the lease is gone marks it lost at once, whatever the keep-alives still
//!   on their way say later (`mod.rs`): this file only says when to send.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::time::Duration;

use tokio::time::Instant;

/// Keep-alives per TTL: with answers on time a lease never has less than 2/3 of a TTL
/// left, which the start's check of `kill_grace` (`kill_grace + TTL/10 < 2/3 × TTL`)
/// relies on.
const PER_TTL: u32 = 3;

/// The most keep-alives on their way at once: those of one TTL (each is waited for a TTL
/// at most), plus the one sent as the oldest times out.
pub const IN_FLIGHT_MAX: usize = PER_TTL as usize + 1;

/// After a failed keep-alive, try again this soon rather than a full TTL/3 later: at most
/// a second, and a tenth of the TTL for short ones, so that one failed keep-alive (a
/// coordinator restart) is made up before the handlers' kill schedule, which starts
/// kill_grace plus a tenth of the TTL before the lease's deadline, gives up on the lease.
const RETRY_MAX: Duration = Duration::from_secs(1);

/// How soon a failed keep-alive is followed by another (also how often a renewer between
/// leases looks for the next one).
pub fn retry(ttl: Duration) -> Duration {
    (ttl / 10).min(RETRY_MAX)
}

/// When the next keep-alive is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    ttl: Duration,
    period: Duration,
    retry: Duration,
    next: Instant,
}

impl Schedule {
    /// The schedule of a lease with `ttl`, opened (or last renewed) at `now`: the first
    /// keep-alive is due a period later.
    pub fn new(ttl: Duration, now: Instant) -> Schedule {
        let period = ttl / PER_TTL;
        Schedule {
            ttl,
            period,
            retry: retry(ttl),
            next: now + period,
        }
    }

    /// How long after the one before a keep-alive goes out: TTL/3.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// How soon a failure is followed by another keep-alive.
    pub fn retry(&self) -> Duration {
        self.retry
    }

    /// How long one keep-alive is waited for: a TTL, past which its answer cannot keep the
    /// lease.
    pub fn patience(&self) -> Duration {
        self.ttl
    }

    /// When the next keep-alive is due, with `in_flight` still on their way; `None` while
    /// that many are on their way that no other may go out before one ends.
    pub fn due(&self, in_flight: usize) -> Option<Instant> {
        (in_flight < IN_FLIGHT_MAX).then_some(self.next)
    }

    /// A keep-alive was sent at `now`: the next is due a period later, answered or not.
    pub fn sent(&mut self, now: Instant) {
        self.next = now + self.period;
    }

    /// A keep-alive failed at `now`: the next is due within the retry interval.
    pub fn failed(&mut self, now: Instant) {
        self.next = self.next.min(now + self.retry);
    }

    /// There was no lease to keep alive at `now` (between leases): look again within the
    /// retry interval, for the one the replica opens next.
    pub fn no_lease(&mut self, now: Instant) {
        self.next = now + self.retry;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(9);

    fn at(start: Instant, millis: u64) -> Instant {
        start + Duration::from_millis(millis)
    }

    /// Keep-alives go out every TTL/3 after the one before, however many are still on
    /// their way, up to the limit.
    #[test]
    fn keep_alives_go_out_every_period_whether_or_not_answered() {
        let start = Instant::now();
        let mut schedule = Schedule::new(TTL, start);
        assert_eq!(schedule.period(), Duration::from_secs(3));
        assert_eq!(schedule.due(0), Some(at(start, 3_000)));
        // Sent late (a busy runtime): the next counts from the send.
        schedule.sent(at(start, 3_010));
        assert_eq!(schedule.due(1), Some(at(start, 6_010)));
        schedule.sent(at(start, 6_010));
        assert_eq!(schedule.due(2), Some(at(start, 9_010)));
        schedule.sent(at(start, 9_010));
        assert_eq!(schedule.due(IN_FLIGHT_MAX - 1), Some(at(start, 12_010)));
    }

    /// While as many keep-alives as a TTL holds, plus one, are on their way, none is due.
    #[test]
    fn no_keep_alive_goes_out_while_the_most_are_on_their_way() {
        let start = Instant::now();
        let schedule = Schedule::new(TTL, start);
        assert_eq!(IN_FLIGHT_MAX, 4);
        assert_eq!(schedule.due(IN_FLIGHT_MAX), None);
        assert_eq!(schedule.due(IN_FLIGHT_MAX + 1), None);
        assert_eq!(schedule.patience(), TTL);
    }

    /// A failure brings the next keep-alive forward to the retry interval, never puts it
    /// back; between leases the renewer looks again at that interval.
    #[test]
    fn a_failure_brings_the_next_keep_alive_forward_never_back() {
        let start = Instant::now();
        let mut schedule = Schedule::new(TTL, start);
        schedule.sent(start);
        schedule.failed(at(start, 500));
        assert_eq!(schedule.due(0), Some(at(start, 1_400)));
        schedule.sent(at(start, 1_400));
        schedule.failed(at(start, 4_000));
        assert_eq!(schedule.due(0), Some(at(start, 4_400)), "put back");
        schedule.no_lease(at(start, 5_000));
        assert_eq!(schedule.due(0), Some(at(start, 5_900)));
    }

    /// The retry interval is a tenth of the TTL, at most a second.
    #[test]
    fn the_retry_is_a_tenth_of_the_ttl_at_most_a_second() {
        assert_eq!(retry(Duration::from_secs(3)), Duration::from_millis(300));
        assert_eq!(retry(Duration::from_secs(10)), Duration::from_secs(1));
        assert_eq!(retry(Duration::from_secs(60)), Duration::from_secs(1));
    }
}
