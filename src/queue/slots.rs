//! Pure: whether a task may take a free slot when several run at once (`driver.rs`): no
//! task of its group is running, chosen for the same claim, or held by another lease (a
//! previous leader's run); and its type is under its cap (`[handlers.T] concurrency`),
//! counting the type's runs going on, those chosen for the same claim and those another
//! lease still holds; and its type's rate allows one more start, counting those chosen for
//! the same claim. Tested as transcripts below: what is taken in, admitted or not out.

use std::collections::{HashMap, HashSet};

/// What is taken now, outside the claim being chosen: groups and types running here, and
/// those another lease holds.
pub(super) struct Taken<'a> {
    pub(super) running_groups: &'a HashSet<String>,
    pub(super) running_kinds: &'a HashMap<String, usize>,
    pub(super) held_groups: &'a HashSet<String>,
    pub(super) held_kinds: &'a HashMap<String, usize>,
    /// How many more starts each type with a rate may have now (`rates.rs`); a type not
    /// named has no rate.
    pub(super) room: &'a HashMap<String, usize>,
}

/// The tasks chosen so far for one claim, by group and by type.
#[derive(Default)]
pub(super) struct Chosen {
    groups: HashSet<String>,
    kinds: HashMap<String, usize>,
}

impl Chosen {
    /// Counts a task of `group` and `kind` chosen.
    pub(super) fn add(&mut self, group: &str, kind: &str) {
        self.groups.insert(group.to_string());
        *self.kinds.entry(kind.to_string()).or_default() += 1;
    }
}

/// Whether a task of `group` and `kind`, whose type is capped at `cap`, may be chosen.
pub(super) fn may_start(
    group: &str,
    kind: &str,
    cap: Option<usize>,
    taken: &Taken,
    chosen: &Chosen,
) -> bool {
    let count = |of: &HashMap<String, usize>| of.get(kind).copied().unwrap_or(0);
    let kind_taken = count(taken.running_kinds) + count(&chosen.kinds) + count(taken.held_kinds);
    let rated = taken
        .room
        .get(kind)
        .is_none_or(|&room| count(&chosen.kinds) < room);
    rated
        && cap.is_none_or(|cap| kind_taken < cap)
        && !taken.running_groups.contains(group)
        && !chosen.groups.contains(group)
        && !taken.held_groups.contains(group)
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::{may_start, Chosen, Taken};

    fn set(names: &[&str]) -> HashSet<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    fn counts(pairs: &[(&str, usize)]) -> HashMap<String, usize> {
        pairs
            .iter()
            .map(|(name, n)| (name.to_string(), *n))
            .collect()
    }

    #[test]
    fn a_group_with_a_run_here_there_or_in_the_same_claim_waits() {
        let (running, held, none) = (set(&["a"]), set(&["b"]), HashMap::new());
        let taken = Taken {
            running_groups: &running,
            running_kinds: &none,
            held_groups: &held,
            held_kinds: &none,
            room: &none,
        };
        let mut chosen = Chosen::default();
        assert!(!may_start("a", "T", None, &taken, &chosen), "running here");
        assert!(
            !may_start("b", "T", None, &taken, &chosen),
            "held by another lease"
        );
        assert!(may_start("c", "T", None, &taken, &chosen));
        chosen.add("c", "T");
        assert!(
            !may_start("c", "T", None, &taken, &chosen),
            "chosen for the claim"
        );
    }

    #[test]
    fn a_type_at_its_cap_waits_counting_runs_held_and_chosen_and_others_go_on() {
        let no_groups = HashSet::new();
        let (running, held) = (counts(&[("Index", 1)]), counts(&[("Index", 1)]));
        let taken = Taken {
            running_groups: &no_groups,
            running_kinds: &running,
            held_groups: &no_groups,
            held_kinds: &held,
            room: &HashMap::new(),
        };
        let mut chosen = Chosen::default();
        // One running here and one held by another lease: a cap of 3 admits one more.
        assert!(may_start("g1", "Index", Some(3), &taken, &chosen));
        chosen.add("g1", "Index");
        assert!(
            !may_start("g2", "Index", Some(3), &taken, &chosen),
            "at its cap"
        );
        assert!(!may_start("g2", "Index", Some(2), &taken, &chosen));
        // Another type, capped or not, is not held back.
        assert!(may_start("g2", "Work", None, &taken, &chosen));
        assert!(may_start("g2", "Work", Some(1), &taken, &chosen));
    }

    #[test]
    fn a_rated_type_takes_no_more_starts_than_its_room_and_others_go_on() {
        let (none, room) = (HashMap::new(), counts(&[("Drop", 2), ("Full", 0)]));
        let no_groups = HashSet::new();
        let taken = Taken {
            running_groups: &no_groups,
            running_kinds: &none,
            held_groups: &no_groups,
            held_kinds: &none,
            room: &room,
        };
        let mut chosen = Chosen::default();
        assert!(!may_start("g1", "Full", None, &taken, &chosen), "no room");
        assert!(may_start("g1", "Drop", None, &taken, &chosen));
        chosen.add("g1", "Drop");
        assert!(may_start("g2", "Drop", None, &taken, &chosen));
        chosen.add("g2", "Drop");
        assert!(
            !may_start("g3", "Drop", None, &taken, &chosen),
            "its room is used"
        );
        assert!(may_start("g3", "Work", None, &taken, &chosen), "no rate");
    }
}
