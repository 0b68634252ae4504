//! Rotation (`election.mode = "rotate"`, Curator's LeaderSelector with auto-requeue): a
//! leader gives leadership up after `rotate_after` or `rotate_after_tasks`, whichever
//! comes first, and stands back until another replica leads (or `stand_back` passes, when
//! it is alone), so leadership passes fairly among the replicas. The default, `latch`
//! (Curator's LeaderLatch), keeps it until the leader leaves or loses its lease.
//!
//! Pure: the decisions take what was observed and the time led, and return what to do;
//! `queue` asks [`Rotation::due`] between claims, `Election::rotate` performs the rest.

use std::time::Duration;

use crate::config::{ElectionMode, ElectionSettings};
use crate::coord::{Holder, LeaseId};

/// When a leader in rotate mode gives leadership up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rotation {
    /// After leading this long (`None`: no time limit).
    pub after: Option<Duration>,
    /// After completing this many tasks (`None`: no count limit).
    pub after_tasks: Option<u64>,
}

impl Rotation {
    /// The rotation the settings ask for; `None` in latch mode.
    pub fn from_settings(settings: &ElectionSettings) -> Option<Rotation> {
        (settings.mode == ElectionMode::Rotate).then(|| Rotation {
            after: (!settings.rotate_after.is_zero()).then_some(settings.rotate_after),
            after_tasks: (settings.rotate_after_tasks > 0).then_some(settings.rotate_after_tasks),
        })
    }

    /// Whether a leader that has led for `led_for` and completed `tasks` tasks gives up now.
    pub fn due(&self, led_for: Duration, tasks: u64) -> bool {
        self.after.is_some_and(|after| led_for >= after)
            || self.after_tasks.is_some_and(|after| tasks >= after)
    }

    /// How much longer a leader may lead before time alone makes it rotate.
    pub fn time_left(&self, led_for: Duration) -> Option<Duration> {
        self.after.map(|after| after.saturating_sub(led_for))
    }
}

/// Whether a replica that rotated out stops standing back: another lease leads now, or it
/// has stood back for `limit` (it may be the only replica).
pub fn stand_back_over(holder: &Holder, mine: &LeaseId, stood: Duration, limit: Duration) -> bool {
    holder.lease.as_ref().is_some_and(|lease| lease != mine) || stood >= limit
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn rotation_is_due_at_the_first_limit_reached() {
        let both = Rotation {
            after: Some(secs(60)),
            after_tasks: Some(100),
        };
        assert!(!both.due(secs(59), 99));
        assert!(both.due(secs(60), 0));
        assert!(both.due(secs(1), 100));
        let tasks_only = Rotation {
            after: None,
            after_tasks: Some(3),
        };
        assert!(!tasks_only.due(secs(86_400), 2));
        assert!(tasks_only.due(Duration::ZERO, 3));
        assert_eq!(tasks_only.time_left(secs(5)), None);
        assert_eq!(both.time_left(secs(45)), Some(secs(15)));
        assert_eq!(both.time_left(secs(75)), Some(Duration::ZERO));
    }

    #[test]
    fn a_rotated_leader_stands_back_until_another_leads_or_the_limit() {
        let mine = LeaseId("mine".into());
        let free = Holder::default();
        let held_by = |lease: &str| Holder {
            lease: Some(LeaseId(lease.into())),
            ..Holder::default()
        };
        assert!(!stand_back_over(&free, &mine, secs(1), secs(10)));
        assert!(!stand_back_over(&held_by("mine"), &mine, secs(1), secs(10)));
        assert!(stand_back_over(&held_by("other"), &mine, secs(1), secs(10)));
        assert!(stand_back_over(&free, &mine, secs(10), secs(10)));
    }
}
