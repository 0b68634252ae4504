//! The KV table's rules: entries and their indexes, locks and lock-delay, tombstones, and
//! transactions (all or nothing, every failing op named).

use super::*;

impl State {
    // ----- KV primitives (shared by the KV endpoint and txn) -----

    pub(super) fn put_entry(&mut self, key: &str, entry: Entry) {
        let entry = Arc::new(entry);
        let old = self.kv.insert(key.to_string(), entry.clone());
        self.reindex_holder(key, old.as_deref(), Some(&entry));
        if let Some(undo) = &mut self.undo {
            undo.push(Undo::Kv(key.to_string(), old));
        }
        self.changes.kv.insert(key.to_string());
    }

    pub(super) fn remove_entry(&mut self, key: &str) -> Option<Arc<Entry>> {
        let old = self.kv.remove(key)?;
        if let Some(undo) = &mut self.undo {
            undo.push(Undo::Kv(key.to_string(), Some(old.clone())));
        }
        self.reindex_holder(key, Some(&old), None);
        self.changes.kv.insert(key.to_string());
        Some(old)
    }

    pub(super) fn reindex_holder(&mut self, key: &str, old: Option<&Entry>, new: Option<&Entry>) {
        let old_session = old.and_then(|entry| entry.session.as_deref());
        let new_session = new.and_then(|entry| entry.session.as_deref());
        if old_session == new_session {
            return;
        }
        if let Some(session) = old_session {
            if let Some(keys) = self.held.get_mut(session) {
                keys.remove(key);
                if keys.is_empty() {
                    self.held.remove(session);
                }
            }
        }
        if let Some(session) = new_session {
            self.held
                .entry(session.to_string())
                .or_default()
                .insert(key.to_string());
        }
    }

    pub(super) fn put_tombstone(&mut self, key: &str, idx: u64, now: Instant) {
        let old = self.tombstones.insert(key.to_string(), idx);
        if let Some(undo) = &mut self.undo {
            undo.push(Undo::Tombstone(key.to_string(), old));
        }
        self.tombstone_reaps
            .push_back((now + TOMBSTONE_TTL, key.to_string(), idx));
        self.changes.tombstones.insert(key.to_string());
        self.tables.tombstones = idx;
    }

    pub(super) fn touch_kvs(&mut self, idx: u64) {
        self.tables.kvs = idx;
        self.index_used = true;
    }

    /// Consul's `kvsSetTxn`: writes value, flags and lock index from the request, keeps or
    /// replaces the session, and skips a write that would change nothing.
    pub(super) fn kv_write(
        &mut self,
        idx: u64,
        key: &str,
        mut entry: Entry,
        update_session: bool,
    ) -> Entry {
        let existing = self.kv.get(key);
        entry.create_index = existing.map_or(idx, |e| e.create_index);
        if !update_session {
            entry.session = existing.and_then(|e| e.session.clone());
        }
        if let Some(existing) = existing {
            if existing.same_content(&entry) {
                entry.modify_index = existing.modify_index;
                return entry;
            }
        }
        entry.modify_index = idx;
        self.put_entry(key, entry.clone());
        self.touch_kvs(idx);
        entry
    }

    pub(super) fn kv_set(&mut self, idx: u64, key: &str, value: Vec<u8>, flags: u64) -> Entry {
        let entry = Entry {
            value,
            flags,
            session: None,
            lock_index: 0,
            create_index: 0,
            modify_index: 0,
        };
        self.kv_write(idx, key, entry, false)
    }

    /// `None` when the check-and-set lost: index 0 means "only if absent".
    pub(super) fn kv_cas(
        &mut self,
        idx: u64,
        key: &str,
        value: Vec<u8>,
        flags: u64,
        cas: u64,
    ) -> Option<Entry> {
        let existing = self.kv.get(key);
        let matches = match (cas, existing) {
            (0, None) => true,
            (0, Some(_)) | (_, None) => false,
            (cas, Some(entry)) => entry.modify_index == cas,
        };
        matches.then(|| self.kv_set(idx, key, value, flags))
    }

    pub(super) fn validate_session(&self, session: &str) -> Result<(), ApplyError> {
        if session.is_empty() {
            return Err(ApplyError::MissingSession);
        }
        if !self.sessions.contains_key(session) {
            return Err(ApplyError::InvalidSession(session.to_string()));
        }
        Ok(())
    }

    /// `Ok(None)` when another session holds the lock. Lock-delay is the caller's check.
    pub(super) fn kv_lock(
        &mut self,
        idx: u64,
        key: &str,
        value: Vec<u8>,
        flags: u64,
        session: &str,
    ) -> Result<Option<Entry>, ApplyError> {
        self.validate_session(session)?;
        let lock_index = match self.kv.get(key) {
            Some(existing) => match existing.session.as_deref() {
                Some(holder) if holder == session => existing.lock_index,
                Some(_) => return Ok(None),
                None => existing.lock_index + 1,
            },
            None => 1,
        };
        let entry = Entry {
            value,
            flags,
            session: Some(session.to_string()),
            lock_index,
            create_index: 0,
            modify_index: 0,
        };
        Ok(Some(self.kv_write(idx, key, entry, true)))
    }

    /// `Ok(None)` when the key is missing or not held by `session`. Release never sets
    /// lock-delay.
    pub(super) fn kv_unlock(
        &mut self,
        idx: u64,
        key: &str,
        value: Vec<u8>,
        flags: u64,
        session: &str,
    ) -> Result<Option<Entry>, ApplyError> {
        if session.is_empty() {
            return Err(ApplyError::MissingSession);
        }
        let Some(existing) = self.kv.get(key) else {
            return Ok(None);
        };
        if existing.session.as_deref() != Some(session) {
            return Ok(None);
        }
        let entry = Entry {
            value,
            flags,
            session: None,
            lock_index: existing.lock_index,
            create_index: 0,
            modify_index: 0,
        };
        Ok(Some(self.kv_write(idx, key, entry, true)))
    }

    pub(super) fn kv_delete(&mut self, idx: u64, key: &str, now: Instant) -> bool {
        if self.remove_entry(key).is_none() {
            return false;
        }
        self.put_tombstone(key, idx, now);
        self.touch_kvs(idx);
        true
    }

    /// A missing key counts as deleted; a key at another index does not.
    pub(super) fn kv_delete_cas(&mut self, idx: u64, key: &str, cas: u64, now: Instant) -> bool {
        match self.kv.get(key) {
            None => true,
            Some(entry) if entry.modify_index != cas => false,
            Some(_) => self.kv_delete(idx, key, now),
        }
    }

    pub(super) fn kv_delete_tree(&mut self, idx: u64, prefix: &str, now: Instant) {
        let keys: Vec<String> = self.kv_list(prefix).map(|(key, _)| key.clone()).collect();
        if keys.is_empty() {
            return;
        }
        for key in &keys {
            self.remove_entry(key);
        }
        // One tombstone stands for the whole prefix; none for the root, whose readers
        // already see the table index.
        if !prefix.is_empty() {
            self.put_tombstone(prefix, idx, now);
        }
        self.touch_kvs(idx);
    }

    // ----- transactions -----

    pub(super) fn txn(&mut self, idx: u64, ops: &[TxnOp], now: Instant) -> Outcome {
        let tables_before = self.tables;
        self.undo = Some(Vec::new());
        let mut results = Vec::new();
        let mut errors = Vec::new();
        for (op_index, op) in ops.iter().enumerate() {
            match self.txn_op(idx, op, now) {
                Ok(found) => results.extend(found),
                // Consul carries on after a failed op so that every failure is reported.
                Err(what) => errors.push(TxnError { op_index, what }),
            }
        }
        let undo = self.undo.take().unwrap_or_default();
        if errors.is_empty() {
            return Outcome::TxnCommitted(results);
        }
        for record in undo.into_iter().rev() {
            match record {
                Undo::Kv(key, old) => {
                    let current = match old {
                        Some(entry) => self.kv.insert(key.clone(), entry),
                        None => self.kv.remove(&key),
                    };
                    let restored = self.kv.get(&key).cloned();
                    self.reindex_holder(&key, current.as_deref(), restored.as_deref());
                }
                Undo::Tombstone(key, old) => match old {
                    Some(index) => {
                        self.tombstones.insert(key, index);
                    }
                    None => {
                        self.tombstones.remove(&key);
                    }
                },
            }
        }
        self.tables = tables_before;
        self.index_used = false;
        Outcome::TxnFailed(errors)
    }

    pub(super) fn txn_op(
        &mut self,
        idx: u64,
        op: &TxnOp,
        now: Instant,
    ) -> Result<Vec<TxnResult>, String> {
        let key = op.key.as_str();
        let quoted = duration::quote(key);
        let write_result = |entry: Entry| {
            vec![TxnResult {
                key: key.to_string(),
                entry: Entry {
                    value: Vec::new(),
                    ..entry
                },
            }]
        };
        match op.verb.as_str() {
            "set" => Ok(write_result(self.kv_set(
                idx,
                key,
                op.value.clone(),
                op.flags,
            ))),
            "cas" => self
                .kv_cas(idx, key, op.value.clone(), op.flags, op.index)
                .map(write_result)
                .ok_or_else(|| format!("failed to set key {quoted}, index is stale")),
            "lock" => {
                if self.lock_delay_until(key, now).is_some() {
                    return Err(format!("failed to lock key {quoted} due to lock delay"));
                }
                match self.kv_lock(idx, key, op.value.clone(), op.flags, &op.session) {
                    Ok(Some(entry)) => Ok(write_result(entry)),
                    Ok(None) => Err(format!("failed to lock key {quoted}, lock is already held")),
                    Err(err) => Err(err.to_string()),
                }
            }
            "unlock" => match self.kv_unlock(idx, key, op.value.clone(), op.flags, &op.session) {
                Ok(Some(entry)) => Ok(write_result(entry)),
                Ok(None) => Err(format!(
                    "failed to unlock key {quoted}, lock isn't held, or is held by another session"
                )),
                Err(err) => Err(err.to_string()),
            },
            "delete" => {
                self.kv_delete(idx, key, now);
                Ok(Vec::new())
            }
            "delete-cas" => {
                if self.kv_delete_cas(idx, key, op.index, now) {
                    Ok(Vec::new())
                } else {
                    Err(format!("failed to delete key {quoted}, index is stale"))
                }
            }
            "delete-tree" => {
                self.kv_delete_tree(idx, key, now);
                Ok(Vec::new())
            }
            "get" => match self.kv_get(key) {
                Some(entry) => Ok(vec![TxnResult {
                    key: key.to_string(),
                    entry: entry.clone(),
                }]),
                None => Err(format!("key {quoted} doesn't exist")),
            },
            "get-or-empty" => {
                let entry = self.kv_get(key).cloned().unwrap_or(Entry {
                    value: Vec::new(),
                    flags: 0,
                    session: None,
                    lock_index: 0,
                    create_index: 0,
                    modify_index: 0,
                });
                Ok(vec![TxnResult {
                    key: key.to_string(),
                    entry,
                }])
            }
            "get-tree" => Ok(self
                .kv_list(key)
                .map(|(key, entry)| TxnResult {
                    key: key.clone(),
                    entry: entry.clone(),
                })
                .collect()),
            "check-index" => match self.kv_get(key) {
                None => Err(format!("failed to check index, key {quoted} doesn't exist")),
                Some(entry) if entry.modify_index != op.index => Err(format!(
                    "failed index check for key {quoted}, current modify index {} != {}",
                    entry.modify_index, op.index
                )),
                Some(entry) => Ok(write_result(entry.clone())),
            },
            "check-session" => match self.kv_get(key) {
                None => Err(format!(
                    "failed to check session, key {quoted} doesn't exist"
                )),
                Some(entry) if entry.session.as_deref().unwrap_or("") != op.session => {
                    Err(format!(
                        "failed session check for key {quoted}, current session {} != {}",
                        duration::quote(entry.session.as_deref().unwrap_or("")),
                        duration::quote(&op.session)
                    ))
                }
                Some(entry) => Ok(write_result(entry.clone())),
            },
            "check-not-exists" => match self.kv_get(key) {
                Some(_) => Err(format!("key {quoted} exists")),
                None => Ok(Vec::new()),
            },
            other => Err(format!("unknown KV verb {}", duration::quote(other))),
        }
    }
}
