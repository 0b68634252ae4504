//! The queue's one clock: tokio's `Instant`, mapped to wall time (`DateTime<Utc>`) from one
//! anchor taken when the queue first reads it. Every time the queue's shell reads (a
//! listing's cost, a look's spacing, a notBefore, a backoff, an orphan's fence, the `now`
//! it hands the pure decisions, the timestamps it writes) comes from here, so a test that
//! pauses tokio's clock pauses all of them. The wall time is the anchor plus tokio's
//! elapsed time: real wall time on a running clock, scripted time on a paused one.

use chrono::{DateTime, Utc};
use tokio::time::Instant;

/// Tokio's clock with the wall time it stood for at one anchor.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// The wall time at `anchor`: read before it, so that the clock never runs ahead of
    /// the wall (a producer's runAt is never taken as due early).
    wall: DateTime<Utc>,
    anchor: Instant,
}

impl Clock {
    /// Anchors a clock at the current wall time.
    pub fn start() -> Clock {
        let wall = Utc::now();
        Clock {
            wall,
            anchor: Instant::now(),
        }
    }

    /// The current instant on tokio's clock.
    pub fn instant(&self) -> Instant {
        Instant::now()
    }

    /// How long since `earlier` on tokio's clock.
    pub fn since(&self, earlier: Instant) -> std::time::Duration {
        Instant::now().saturating_duration_since(earlier)
    }

    /// The current wall time.
    pub fn now(&self) -> DateTime<Utc> {
        self.wall_at(Instant::now())
    }

    /// The wall time at `at` (the anchor's, for an instant before it).
    pub fn wall_at(&self, at: Instant) -> DateTime<Utc> {
        let elapsed = at.saturating_duration_since(self.anchor);
        self.wall + chrono::Duration::from_std(elapsed).unwrap_or(chrono::Duration::MAX)
    }

    /// The instant at wall time `at` (the anchor, for a time before it).
    pub fn instant_at(&self, at: DateTime<Utc>) -> Instant {
        let ahead = (at - self.wall).to_std().unwrap_or_default();
        self.anchor.checked_add(ahead).unwrap_or(self.anchor)
    }

    /// Resolves at wall time `at` (never, for `None`), timed on tokio's clock.
    pub async fn until(&self, at: Option<DateTime<Utc>>) {
        match at {
            Some(at) => tokio::time::sleep_until(self.instant_at(at)).await,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::Clock;

    /// On a paused clock, wall time moves exactly as tokio's time does.
    #[tokio::test(start_paused = true)]
    async fn wall_time_follows_a_paused_tokio_clock() {
        let clock = Clock::start();
        let before = clock.now();
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(clock.now() - before, chrono::Duration::seconds(90));
    }

    /// Waiting until a wall time ends then, and a wall time already past ends at once.
    #[tokio::test(start_paused = true)]
    async fn waiting_until_a_wall_time_ends_at_that_time() {
        let clock = Clock::start();
        let due = clock.now() + chrono::Duration::milliseconds(1_500);
        clock.until(Some(due)).await;
        assert!(clock.now() >= due);
        let started = clock.instant();
        clock.until(Some(due - chrono::Duration::seconds(5))).await;
        assert_eq!(clock.since(started), Duration::ZERO);
    }

    /// Wall time and instants map back and forth from the anchor.
    #[test]
    fn wall_times_and_instants_map_back_and_forth() {
        let clock = Clock {
            wall: crate::queue::scripted::at(0),
            anchor: Instant::now(),
        };
        let later = clock.anchor + Duration::from_millis(250);
        assert_eq!(clock.wall_at(later), crate::queue::scripted::at(250));
        assert_eq!(clock.instant_at(crate::queue::scripted::at(250)), later);
        assert_eq!(
            clock.instant_at(crate::queue::scripted::at(-5)),
            clock.anchor
        );
    }
}
