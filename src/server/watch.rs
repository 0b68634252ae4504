//! Blocking queries: a read that waits until its result index passes the client's `index`,
//! or until its wait time (plus Consul's jitter) runs out.
//!
//! The writer publishes the global index after every durable commit; a blocked read wakes,
//! recomputes its result under the read lock and returns only if its own index moved, as
//! Consul's blocking loop does. This module owns the waiting, not the rules of any endpoint.

use std::time::Duration;

use tokio::time::Instant;

use super::Core;
use crate::server::state::State;

/// Consul's `default_query_time`: the wait when a client sends `index` without `wait`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// Consul's `max_query_time`: longer waits are clamped to this.
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// Consul adds up to wait/16 of random jitter (structs.JitterFraction).
const JITTER_FRACTION: u32 = 16;

/// A client's `?index` and `?wait`, when `index` asks to block.
#[derive(Clone, Copy, Debug)]
pub struct Blocking {
    pub min_index: u64,
    pub wait: Duration,
}

impl Blocking {
    /// `index` absent or 0 means no blocking; `wait` defaults to 5m and is capped at 10m.
    pub fn new(min_index: u64, wait: Option<Duration>) -> Option<Blocking> {
        if min_index == 0 {
            return None;
        }
        let wait = match wait {
            None => DEFAULT_WAIT,
            Some(wait) if wait.is_zero() => DEFAULT_WAIT,
            Some(wait) => wait.min(MAX_WAIT),
        };
        Some(Blocking { min_index, wait })
    }

    fn deadline(&self) -> Instant {
        let jitter_max = self.wait / JITTER_FRACTION;
        let jitter = Duration::from_nanos(fastrand::u64(0..=jitter_max.as_nanos() as u64));
        Instant::now() + self.wait + jitter
    }
}

/// Runs `read` (which returns the result's index and the result) and, when `blocking` asks
/// for it, repeats it after every commit until the index passes `min_index` or time is up.
/// On time-out the latest result is returned, whatever its index, as Consul does.
pub async fn query<T>(
    core: &Core,
    blocking: Option<Blocking>,
    read: impl Fn(&State) -> (u64, T),
) -> (u64, T) {
    let mut changes = core.changed.subscribe();
    let deadline = blocking.map(|b| b.deadline());
    loop {
        changes.borrow_and_update();
        let (index, result) = {
            let state = core.state.read().await;
            read(&state)
        };
        let (Some(blocking), Some(deadline)) = (blocking, deadline) else {
            return (index, result);
        };
        if index > blocking.min_index || core.is_closing() {
            return (index, result);
        }
        let woke = {
            // Counted while waiting, also when the client goes away and the wait is dropped.
            let _waiting = Waiting::new(&core.metrics.blocked_queries);
            tokio::select! {
                changed = changes.changed() => changed.is_ok(),
                _ = tokio::time::sleep_until(deadline) => false,
            }
        };
        if !woke {
            return (index, result);
        }
    }
}

struct Waiting<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl<'a> Waiting<'a> {
    fn new(gauge: &'a prometheus_client::metrics::gauge::Gauge) -> Waiting<'a> {
        gauge.inc();
        Waiting(gauge)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}
