//! The in-memory coordinator's producer and operator edits (`Coordinator::edit`):
//! create-only writes, deletes and replaces at a version and puts of whatever is there, all
//! or nothing.

use std::collections::BTreeMap;

use super::{fail, State, Task};
use crate::coord::{Edit, Edited};

impl State {
    /// Applies a producer's or operator's batch all or nothing: each op sees the ops
    /// before it; every op that fails is named.
    pub(super) fn edit(&mut self, ops: &[Edit]) -> Edited {
        let index = self.index + 1;
        let mut staged: BTreeMap<String, bool> = BTreeMap::new();
        let mut failed = Vec::new();
        for op in ops {
            let key = op.key();
            let exists = match staged.get(key) {
                Some(present) => *present,
                None => self.tasks.contains_key(key),
            };
            let ok = match op {
                Edit::Create { .. } => !exists,
                Edit::Put { .. } => true,
                Edit::Delete { version, .. } | Edit::Replace { version, .. } => {
                    exists
                        && !staged.contains_key(key)
                        && self.tasks.get(key).is_some_and(|t| t.version == version.0)
                }
            };
            if !ok {
                fail(&mut failed, key);
                continue;
            }
            staged.insert(key.to_string(), !matches!(op, Edit::Delete { .. }));
        }
        if !failed.is_empty() {
            return Edited::Conflict(failed);
        }
        if ops.is_empty() {
            return Edited::Done;
        }
        self.index = index;
        self.tasks_version = index;
        for op in ops {
            match op {
                Edit::Create { key, value } => {
                    self.tasks.insert(
                        key.clone(),
                        Task {
                            value: value.clone(),
                            version: index,
                            created: index,
                            holder: None,
                        },
                    );
                }
                Edit::Delete { key, .. } => {
                    self.tasks.remove(key);
                }
                Edit::Put { key, value } | Edit::Replace { key, value, .. } => {
                    let created = self.tasks.get(key).map_or(index, |task| task.created);
                    self.tasks.insert(
                        key.clone(),
                        Task {
                            value: value.clone(),
                            version: index,
                            created,
                            holder: None,
                        },
                    );
                }
            }
        }
        Edited::Done
    }
}
