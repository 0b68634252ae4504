//! What one listed entry of the queue is, and so what the leader does with it (pure: no
//! I/O, no clock read, no spawn; `now` and what the leader remembers come in): pending,
//! waiting for a time (a retry's notBefore, a producer's runAt, a deferral), a run in
//! progress under a live lease, an orphan still fenced or due to be requeued, a run of
//! this very lease cut short by a restart, another program's, or something to dead-letter
//! and why (a key that breaks the key rule, a value that is not a task, a runAt too far
//! ahead, a taskType with no handler). `sort.rs` performs what [`classify`] answers.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::coord::{LeaseId, StoredTask, TaskVersion};
use crate::task::key::Key;
use crate::task::{Status, Task};

/// What a listed entry is, for the leader.
#[derive(Debug)]
pub enum Entry {
    /// Ready to claim. `ignored_not_before` is a notBefore further ahead than any backoff
    /// leaderq writes (a clock that jumped, a crafted value), disbelieved: worth a warning.
    Pending {
        task: Task,
        ignored_not_before: Option<DateTime<Utc>>,
    },
    /// Not eligible before `at`: a retry's notBefore, a producer's runAt, or a deferral.
    Waiting { at: DateTime<Utc>, task: Task },
    /// Claimed by another live lease: a run in progress, left alone (with concurrency
    /// groups, its group waits for it).
    Held { task: Task },
    /// Claimed by a lease that ended, first seen at `seen`: left alone until `until`, when
    /// the ended lease's runs are provably over (its group waits meanwhile).
    Fenced {
        task: Task,
        seen: DateTime<Utc>,
        until: DateTime<Utc>,
    },
    /// Put back in the queue as a failed attempt, for `reason`: an orphan whose fence
    /// has passed, or a claim of this very lease that nothing here runs (a restart took
    /// the lease up again).
    Requeue { task: Task, reason: &'static str },
    /// Held by this very lease with exactly the value of a claim whose write's answer never
    /// came back: that write was applied, and nothing ran the task (the leader listed
    /// again instead). Put back with `value`, the task as it was before, costing no attempt.
    Unanswered { task: Task, value: Vec<u8> },
    /// Moved to dead-letter as stored, with `reason`. If the move does not happen (the
    /// entry changed meanwhile), the key stays known only when `known_if_kept`.
    DeadLetter {
        entry: StoredTask,
        reason: String,
        known_if_kept: bool,
    },
    /// Marked taken by a program other than leaderq: left alone, with a warning.
    Foreign { task: Task },
    /// Claimed by a live lease but not a task leaderq can read: that run's business, left
    /// alone and known.
    HeldUnreadable { key: String },
    /// Claimed by a live lease under a key that breaks the key rule: left alone, and not
    /// known (it cannot be addressed safely).
    HeldUnaddressable,
}

/// What the leader's settings and lease say about entries.
#[derive(Clone, Copy, Debug)]
pub struct EntryRules<'a> {
    /// The queue's prefix: a task key must lie under it.
    pub prefix: &'a str,
    /// How far ahead a notBefore is believed ([`eligibility`]).
    pub horizon: chrono::Duration,
    /// How far ahead a producer's runAt may be.
    pub run_at_max_ahead: Duration,
    /// How long after it is first seen an orphan is requeued.
    pub orphan_fence: Duration,
    /// The leader's own lease.
    pub own: &'a LeaseId,
}

/// What the leader remembers of keys across listings, as far as sorting an entry goes.
#[derive(Clone, Copy, Debug)]
pub struct Remembered<'a> {
    /// Keys whose claims are refused for a while (a dead lease's takeover delay), and until when.
    pub deferred: &'a HashMap<String, DateTime<Utc>>,
    /// Orphans and when this term first saw each.
    pub orphans_seen: &'a HashMap<String, DateTime<Utc>>,
    /// The claim this term wrote for the entry's key and never had an answer to, if any.
    pub unanswered: Option<&'a UnansweredClaim>,
}

/// A claim this term sent whose answer never came (an error or a timeout after the write
/// left): it may or may not have been applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnansweredClaim {
    /// The value the claim wrote.
    pub claimed: Vec<u8>,
    /// The task's value before the claim, to put back.
    pub before: Vec<u8>,
}

/// What `entry` is at `now`, under `rules`, given what the leader `remembers` and whether
/// a handler is registered for a task type (`has_handler`).
pub fn classify(
    entry: StoredTask,
    rules: &EntryRules,
    remembered: Remembered,
    has_handler: impl Fn(&str) -> bool,
    now: DateTime<Utc>,
) -> Entry {
    let task = match read(entry, rules) {
        Ok(task) => task,
        Err(entry) => return *entry,
    };
    let deferred = remembered.deferred.get(&task.key).copied();
    let status = eligibility(&task, now, rules.horizon, deferred);
    if let (Status::Scheduled(_), Err(invalid)) =
        (&status, task.check_run_at(now, rules.run_at_max_ahead))
    {
        // Scheduled further ahead than the queue allows: the producer's mistake, said in a
        // dead letter rather than kept out of sight for years.
        return Entry::DeadLetter {
            entry: pair_of(&task, task.value().to_vec(), task.version),
            reason: invalid.to_string(),
            known_if_kept: false,
        };
    }
    match status {
        Status::Pending if !has_handler(&task.task_type) => Entry::DeadLetter {
            entry: pair_of(&task, task.value().to_vec(), task.version),
            reason: format!("no handler for taskType {:?}", task.task_type),
            known_if_kept: false,
        },
        Status::Pending => {
            let ignored_not_before = match task.status(now) {
                Status::Delayed(at) => Some(at),
                _ => None,
            };
            Entry::Pending {
                task,
                ignored_not_before,
            }
        }
        Status::Delayed(at) | Status::Scheduled(at) => Entry::Waiting { at, task },
        Status::InFlight if task.holder.as_ref() == Some(rules.own) => {
            own_in_flight(task, remembered.unanswered)
        }
        Status::InFlight => Entry::Held { task },
        Status::Orphan => orphan(task, rules, remembered.orphans_seen, now),
        Status::Foreign => Entry::Foreign { task },
    }
}

/// The task an entry holds; or, when it cannot be read or addressed, what the entry is.
fn read(entry: StoredTask, rules: &EntryRules) -> Result<Task, Box<Entry>> {
    // A key that breaks the key rule could not be addressed safely (a `..` segment
    // resolves elsewhere in a URL): such a task is not run but dead-lettered.
    if let Err(invalid) = Key::within(&entry.key, &[rules.prefix]) {
        if entry.holder.is_some() {
            return Err(Box::new(Entry::HeldUnaddressable));
        }
        return Err(Box::new(Entry::DeadLetter {
            reason: format!("the key is not a valid task key: {invalid}"),
            entry,
            known_if_kept: false,
        }));
    }
    match Task::parse_owned(entry) {
        Ok(task) => Ok(task),
        // A locked entry is someone's run in progress: left alone until it ends.
        Err((_, entry)) if entry.holder.is_some() => {
            Err(Box::new(Entry::HeldUnreadable { key: entry.key }))
        }
        Err((invalid, entry)) => Err(Box::new(Entry::DeadLetter {
            reason: invalid.to_string(),
            entry,
            known_if_kept: true,
        })),
    }
}

/// A task held by this leader's own lease. The claim's value names the time it was
/// written, so only that very write leaves it: its answer was lost, and this term ran
/// nothing of it. Anything else is a run of an earlier process on this lease.
fn own_in_flight(task: Task, unanswered: Option<&UnansweredClaim>) -> Entry {
    match unanswered {
        Some(lost) if lost.claimed == task.value() => Entry::Unanswered {
            value: lost.before.clone(),
            task,
        },
        _ => Entry::Requeue {
            task,
            reason: "the replica restarted while running the task",
        },
    }
}

/// An orphan: its lease may have been revoked while its run went on, so that run is
/// provably over only once the earlier holder's own view of its lease has run out, one
/// orphan fence after this leader first saw it.
fn orphan(
    task: Task,
    rules: &EntryRules,
    orphans_seen: &HashMap<String, DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Entry {
    let seen = orphans_seen.get(&task.key).copied().unwrap_or(now);
    let until = seen + chrono::Duration::from_std(rules.orphan_fence).unwrap_or_default();
    if now < until {
        Entry::Fenced { task, seen, until }
    } else {
        Entry::Requeue {
            task,
            reason: "the replica running the task died",
        }
    }
}

/// A task as stored again, with `value` and at `version`, to move it to dead-letter.
pub fn pair_of(task: &Task, value: Vec<u8>, version: TaskVersion) -> StoredTask {
    StoredTask {
        key: task.key.clone(),
        value,
        version,
        created: task.created,
        holder: None,
    }
}

/// The status the leader acts on. A `notBefore` further ahead than `horizon` (the longest
/// backoff leaderq writes, plus slack for clocks) was not written by a leader with a sane
/// clock under these settings, or was crafted: it is ignored and the task is due now (or at
/// its `runAt`), so that a clock that jumped ahead cannot park tasks for years. A `runAt` is
/// the producer's word and is not subject to the horizon (how far ahead it may be is checked
/// when the task is read, `Task::check_run_at`). A pending task whose key is `deferred`
/// (refused for a while) until a later time waits until then.
pub fn eligibility(
    task: &Task,
    now: DateTime<Utc>,
    horizon: chrono::Duration,
    deferred: Option<DateTime<Utc>>,
) -> Status {
    let status = match task.status(now) {
        Status::Delayed(at) if now.checked_add_signed(horizon).is_some_and(|h| at > h) => {
            match task.run_at {
                Some(run_at) if run_at > now => Status::Scheduled(run_at),
                _ => Status::Pending,
            }
        }
        status => status,
    };
    match (status, deferred) {
        (Status::Pending, Some(until)) if until > now => Status::Delayed(until),
        (status, _) => status,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use chrono::{DateTime, Utc};

    use super::{classify, eligibility, pair_of, Entry, EntryRules, Remembered, UnansweredClaim};
    use crate::coord::{LeaseId, StoredTask, TaskVersion};
    use crate::queue::scripted::{at, scheduled, task};
    use crate::task::Status;

    const OWN: &str = "own-lease";

    fn rules<'a>(own: &'a LeaseId) -> EntryRules<'a> {
        EntryRules {
            prefix: "q/",
            horizon: chrono::Duration::seconds(360),
            run_at_max_ahead: Duration::from_secs(7 * 86_400),
            orphan_fence: Duration::from_secs(10),
            own,
        }
    }

    /// An entry as a listing returns it: `value` under `key`, held by `holder` if any.
    fn stored(key: &str, value: serde_json::Value, holder: Option<&str>) -> StoredTask {
        StoredTask {
            key: key.into(),
            value: value.to_string().into_bytes(),
            version: TaskVersion(3),
            created: 1,
            holder: holder.map(|h| LeaseId(h.into())),
        }
    }

    /// A task value as a leader's claim leaves it: taken by the lease `by`.
    fn taken(by: &str) -> serde_json::Value {
        serde_json::json!({
            "taskType": "x",
            "taskTime": 1,
            "taskTaken": true,
            "takenBy": {"session": by, "node": "n"},
        })
    }

    fn sort(entry: StoredTask, seen: &HashMap<String, DateTime<Utc>>, now: DateTime<Utc>) -> Entry {
        sort_after(entry, seen, None, now)
    }

    /// [`sort`] with the claim of the entry's key this term had no answer to, if any.
    fn sort_after(
        entry: StoredTask,
        seen: &HashMap<String, DateTime<Utc>>,
        unanswered: Option<&UnansweredClaim>,
        now: DateTime<Utc>,
    ) -> Entry {
        let own = LeaseId(OWN.into());
        let deferred = HashMap::new();
        let remembered = Remembered {
            deferred: &deferred,
            orphans_seen: seen,
            unanswered,
        };
        classify(entry, &rules(&own), remembered, |t| t == "x", now)
    }

    /// A task of this lease's whose value is exactly what a claim without an answer wrote
    /// is put back as it was, without an attempt; any other value (a later write, a run of
    /// a previous process) is requeued as a failed attempt.
    #[test]
    fn only_the_very_value_of_an_unanswered_claim_is_put_back_without_an_attempt() {
        let before = serde_json::json!({"taskType": "x", "taskTime": 1}).to_string();
        let claimed = taken(OWN).to_string().into_bytes();
        let lost = UnansweredClaim {
            claimed: claimed.clone(),
            before: before.clone().into_bytes(),
        };
        let held = || stored("q/d", taken(OWN), Some(OWN));
        match sort_after(held(), &HashMap::new(), Some(&lost), at(0)) {
            Entry::Unanswered { task, value } => {
                assert_eq!(task.key, "q/d");
                assert_eq!(value, before.as_bytes());
            }
            other => panic!("{other:?}"),
        }
        let other_value = UnansweredClaim {
            claimed: [&claimed[..claimed.len() - 1], b",\"x\":1}"].concat(),
            ..lost.clone()
        };
        assert!(matches!(
            sort_after(held(), &HashMap::new(), Some(&other_value), at(0)),
            Entry::Requeue { reason, .. } if reason.contains("restarted")
        ));
        // Held by another lease: that lease's run, whatever this term wrote.
        assert!(matches!(
            sort_after(
                stored("q/d", taken("other"), Some("other")),
                &HashMap::new(),
                Some(&UnansweredClaim {
                    claimed: taken("other").to_string().into_bytes(),
                    ..lost
                }),
                at(0)
            ),
            Entry::Held { .. }
        ));
    }

    /// A free task with a handler is pending; one whose notBefore lies ahead waits for it.
    #[test]
    fn a_free_task_is_pending_or_waits_for_its_not_before() {
        let due = stored(
            "q/a",
            serde_json::json!({"taskType": "x", "taskTime": 1}),
            None,
        );
        assert!(matches!(
            sort(due, &HashMap::new(), at(0)),
            Entry::Pending {
                ignored_not_before: None,
                ..
            }
        ));
        let later = stored(
            "q/b",
            serde_json::json!({"taskType": "x", "taskTime": 1, "notBefore": crate::task::rfc3339(at(5_000))}),
            None,
        );
        assert!(matches!(
            sort(later, &HashMap::new(), at(0)),
            Entry::Waiting { at: when, .. } if when == at(5_000)
        ));
    }

    /// What cannot run is dead-lettered with a reason that says why: a key outside the
    /// rule, a value that is not a task, a taskType with no handler.
    #[test]
    fn what_cannot_run_is_dead_lettered_with_its_reason() {
        let bad_key = stored("q/../x", serde_json::json!({"taskType": "x"}), None);
        assert!(matches!(
            sort(bad_key, &HashMap::new(), at(0)),
            Entry::DeadLetter { reason, known_if_kept: false, .. } if reason.starts_with("the key is not a valid task key")
        ));
        let not_json = StoredTask {
            value: b"nope".to_vec(),
            ..stored("q/a", serde_json::json!({}), None)
        };
        assert!(matches!(
            sort(not_json, &HashMap::new(), at(0)),
            Entry::DeadLetter {
                known_if_kept: true,
                ..
            }
        ));
        let unknown = stored(
            "q/b",
            serde_json::json!({"taskType": "y", "taskTime": 1}),
            None,
        );
        assert!(matches!(
            sort(unknown, &HashMap::new(), at(0)),
            Entry::DeadLetter { reason, .. } if reason == "no handler for taskType \"y\""
        ));
    }

    /// A runAt further ahead than the queue allows is dead-lettered; one within it waits.
    #[test]
    fn a_run_at_too_far_ahead_is_dead_lettered() {
        let far = scheduled("q/a", 1, at(30 * 86_400_000), None);
        let far = pair_of(&far, far.value().to_vec(), TaskVersion(1));
        assert!(matches!(
            sort(far, &HashMap::new(), at(0)),
            Entry::DeadLetter {
                known_if_kept: false,
                ..
            }
        ));
        let soon = scheduled("q/b", 1, at(60_000), None);
        let soon = pair_of(&soon, soon.value().to_vec(), TaskVersion(1));
        assert!(matches!(
            sort(soon, &HashMap::new(), at(0)),
            Entry::Waiting { at: when, .. } if when == at(60_000)
        ));
    }

    /// Held entries are left alone: another live lease's run, one unreadable, one under a
    /// key that breaks the rule; this very lease's claim, which nothing here runs, is
    /// requeued.
    #[test]
    fn held_entries_are_left_alone_but_this_leases_own_is_requeued() {
        assert!(matches!(
            sort(
                stored("q/a", taken("other"), Some("other")),
                &HashMap::new(),
                at(0)
            ),
            Entry::Held { .. }
        ));
        let unreadable = StoredTask {
            value: b"nope".to_vec(),
            ..stored("q/b", serde_json::json!({}), Some("other"))
        };
        assert!(matches!(
            sort(unreadable, &HashMap::new(), at(0)),
            Entry::HeldUnreadable { key } if key == "q/b"
        ));
        assert!(matches!(
            sort(
                stored("q/../c", taken("other"), Some("other")),
                &HashMap::new(),
                at(0)
            ),
            Entry::HeldUnaddressable
        ));
        assert!(matches!(
            sort(stored("q/d", taken(OWN), Some(OWN)), &HashMap::new(), at(0)),
            Entry::Requeue { reason, .. } if reason.contains("restarted")
        ));
    }

    /// An orphan is fenced for one orphan_fence from when this term first saw it, then
    /// requeued; a task marked taken by another program is foreign.
    #[test]
    fn an_orphan_is_fenced_then_requeued_and_a_foreign_task_left_alone() {
        let orphan = || stored("q/a", taken("gone"), None);
        match sort(orphan(), &HashMap::new(), at(0)) {
            Entry::Fenced { seen, until, .. } => {
                assert_eq!((seen, until), (at(0), at(10_000)));
            }
            other => panic!("{other:?}"),
        }
        let seen = HashMap::from([("q/a".to_string(), at(0))]);
        assert!(matches!(
            sort(orphan(), &seen, at(9_999)),
            Entry::Fenced { until, .. } if until == at(10_000)
        ));
        assert!(matches!(
            sort(orphan(), &seen, at(10_000)),
            Entry::Requeue { reason, .. } if reason.contains("died")
        ));
        let foreign = stored(
            "q/b",
            serde_json::json!({"taskType": "x", "taskTime": 1, "taskTaken": true}),
            None,
        );
        assert!(matches!(
            sort(foreign, &HashMap::new(), at(0)),
            Entry::Foreign { .. }
        ));
    }

    /// notBefore is believed up to the horizon; beyond it (a clock that jumped, a crafted
    /// value) the task is due now.
    #[test]
    fn not_before_beyond_the_horizon_is_ignored() {
        let horizon = chrono::Duration::seconds(360);
        let soon = task("q/a", 1, Some(at(300_000)));
        assert_eq!(
            eligibility(&soon, at(0), horizon, None),
            Status::Delayed(at(300_000))
        );
        let far = task("q/b", 1, Some(at(361_000)));
        assert_eq!(eligibility(&far, at(0), horizon, None), Status::Pending);
        let year_9999 = task(
            "q/c",
            1,
            DateTime::parse_from_rfc3339("9999-12-31T23:59:59Z")
                .ok()
                .map(|t| t.to_utc()),
        );
        assert_eq!(
            eligibility(&year_9999, at(0), horizon, None),
            Status::Pending
        );
        assert!(
            matches!(
                eligibility(&year_9999, at(0), chrono::Duration::MAX, None),
                Status::Delayed(_)
            ),
            "a horizon past the end of time believes every notBefore, without a panic"
        );
        let pending = task("q/d", 1, None);
        assert_eq!(
            eligibility(&pending, at(0), horizon, Some(at(1_000))),
            Status::Delayed(at(1_000)),
            "deferred: refused for a while"
        );
        assert_eq!(
            eligibility(&pending, at(1_000), horizon, Some(at(1_000))),
            Status::Pending
        );
    }

    /// A runAt is believed however far ahead it is (the notBefore horizon is a clock
    /// safety for leaderq's own backoff, not for a producer's schedule); a notBefore beyond
    /// the horizon is still ignored, leaving the task due at its runAt.
    #[test]
    fn run_at_is_believed_beyond_the_not_before_horizon() {
        let horizon = chrono::Duration::seconds(360);
        let a_day = at(86_400_000);
        assert_eq!(
            eligibility(&scheduled("q/a", 1, a_day, None), at(0), horizon, None),
            Status::Scheduled(a_day)
        );
        assert_eq!(
            eligibility(
                &scheduled("q/b", 1, at(60_000), Some(a_day)),
                at(0),
                horizon,
                None
            ),
            Status::Scheduled(at(60_000)),
            "the notBefore beyond the horizon is ignored, the runAt is not"
        );
        assert_eq!(
            eligibility(
                &scheduled("q/c", 1, at(60_000), Some(at(120_000))),
                at(0),
                horizon,
                None
            ),
            Status::Delayed(at(120_000)),
            "due at the later of the two"
        );
        assert_eq!(
            eligibility(
                &scheduled("q/d", 1, at(60_000), None),
                at(60_000),
                horizon,
                None
            ),
            Status::Pending,
            "due at its runAt exactly"
        );
    }
}
