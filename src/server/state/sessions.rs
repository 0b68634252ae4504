//! Sessions, health checks and the node: creation with Consul's defaults, renewal,
//! destruction (releasing or deleting what a session held), check status changes that
//! invalidate the sessions bound to them.

use super::*;

impl State {
    // ----- sessions -----

    pub(super) fn session_create(
        &mut self,
        idx: u64,
        spec: SessionSpec,
        now: Instant,
    ) -> Result<Outcome, ApplyError> {
        let behavior = match spec.behavior.as_str() {
            "" | "release" => Behavior::Release,
            "delete" => Behavior::Delete,
            other => return Err(ApplyError::InvalidBehavior(other.to_string())),
        };
        let mut ttl_duration = None;
        if !spec.ttl.is_empty() {
            let ttl = duration::parse(&spec.ttl).map_err(|reason| ApplyError::TtlSyntax {
                ttl: spec.ttl.clone(),
                reason,
            })?;
            if !ttl.is_zero() {
                if ttl < self.config.session_ttl_min || ttl > SESSION_TTL_MAX {
                    return Err(ApplyError::TtlRange {
                        nanos: ttl.as_nanos(),
                        min: duration::format(self.config.session_ttl_min),
                        max: duration::format(SESSION_TTL_MAX),
                    });
                }
                ttl_duration = Some(ttl);
            }
        }
        if self.node.as_ref().map(|node| node.name.as_str()) != Some(spec.node.as_str()) {
            return Err(ApplyError::MissingNode);
        }
        let session = Session {
            id: spec.id,
            name: spec.name,
            node: spec.node,
            lock_delay: spec.lock_delay,
            behavior,
            ttl: spec.ttl,
            node_checks: spec.node_checks,
            service_checks: spec.service_checks,
            checks: spec.checks,
            create_index: idx,
            modify_index: idx,
        };
        for check_id in session.bound_checks() {
            match self.checks.get(check_id) {
                None => return Err(ApplyError::MissingCheck(check_id.to_string())),
                Some(check) if check.status == CheckStatus::Critical => {
                    return Err(ApplyError::CriticalCheck(check_id.to_string()))
                }
                Some(_) => {}
            }
        }
        if let Some(ttl) = ttl_duration {
            self.session_deadlines
                .insert(session.id.clone(), now + ttl * SESSION_TTL_MULTIPLIER);
        }
        let id = session.id.clone();
        self.changes.sessions.insert(id.clone());
        self.sessions.insert(id.clone(), session);
        self.tables.sessions = idx;
        self.index_used = true;
        Ok(Outcome::SessionCreated(id))
    }

    /// Invalidates a session: its locks are released or deleted per its behavior, each
    /// with lock-delay, and the session is gone. Unknown ids are a no-op.
    pub(super) fn session_destroy(&mut self, idx: u64, id: &str, now: Instant) {
        self.session_deadlines.remove(id);
        let Some(session) = self.sessions.remove(id) else {
            return;
        };
        self.changes.sessions.insert(id.to_string());
        self.tables.sessions = idx;
        self.index_used = true;
        let delay = session.lock_delay.min(MAX_LOCK_DELAY);
        let keys = self.held.remove(id).unwrap_or_default();
        for key in keys {
            match session.behavior {
                Behavior::Release => {
                    if let Some(mut entry) = self.kv_get(&key).cloned() {
                        entry.session = None;
                        entry.modify_index = idx;
                        self.put_entry(&key, entry);
                        self.touch_kvs(idx);
                    }
                }
                Behavior::Delete => {
                    self.kv_delete(idx, &key, now);
                }
            }
            if !delay.is_zero() {
                self.lock_delays.insert(key, now + delay);
            }
        }
    }

    /// Renewing only resets the timer: no index, nothing to persist.
    pub(super) fn session_renew(&mut self, id: &str, now: Instant) -> Option<Session> {
        let session = self.sessions.get(id)?.clone();
        if let Some(ttl) = session.ttl_duration() {
            self.session_deadlines
                .insert(id.to_string(), now + ttl * SESSION_TTL_MULTIPLIER);
        }
        Some(session)
    }

    // ----- checks and the node -----

    pub(super) fn check_register(&mut self, idx: u64, spec: CheckSpec, now: Instant) {
        let create_index = self.checks.get(&spec.id).map_or(idx, |c| c.create_index);
        let check = Check {
            id: spec.id.clone(),
            name: spec.name,
            status: spec.status,
            notes: spec.notes,
            output: spec.output,
            service_id: spec.service_id,
            ttl: Some(spec.ttl),
            create_index,
            modify_index: idx,
        };
        self.check_deadlines.insert(spec.id.clone(), now + spec.ttl);
        self.checks.insert(spec.id.clone(), check);
        self.changes.checks.insert(spec.id.clone());
        self.tables.checks = idx;
        self.index_used = true;
        if spec.status == CheckStatus::Critical {
            self.invalidate_sessions_bound_to(idx, &spec.id, now);
        }
    }

    pub(super) fn check_update(
        &mut self,
        idx: u64,
        id: &str,
        status: CheckStatus,
        output: String,
        now: Instant,
    ) -> Result<(), ApplyError> {
        let check = self
            .checks
            .get(id)
            .filter(|_| id != SERF_CHECK_ID)
            .ok_or_else(|| ApplyError::UnknownCheck(id.to_string()))?;
        let Some(ttl) = check.ttl else {
            return Err(ApplyError::NotTtlCheck(id.to_string()));
        };
        self.check_deadlines.insert(id.to_string(), now + ttl);
        self.set_check_status(idx, id, status, output, now);
        Ok(())
    }

    /// A status change is a catalog write; an output-only change is kept (and persisted)
    /// without a new index, as the agent defers such syncs; nothing changed means nothing to
    /// write. Going critical invalidates every session bound to the check.
    pub(super) fn set_check_status(
        &mut self,
        idx: u64,
        id: &str,
        status: CheckStatus,
        output: String,
        now: Instant,
    ) {
        let Some(check) = self.checks.get_mut(id) else {
            return;
        };
        if check.status == status {
            if check.output != output {
                check.output = output;
                self.changes.checks.insert(id.to_string());
            }
            return;
        }
        check.status = status;
        check.output = output;
        check.modify_index = idx;
        self.changes.checks.insert(id.to_string());
        self.tables.checks = idx;
        self.index_used = true;
        if status == CheckStatus::Critical {
            self.invalidate_sessions_bound_to(idx, id, now);
        }
    }

    pub(super) fn check_deregister(
        &mut self,
        idx: u64,
        id: &str,
        now: Instant,
    ) -> Result<(), ApplyError> {
        if id == SERF_CHECK_ID || !self.checks.contains_key(id) {
            return Err(ApplyError::UnknownCheck(id.to_string()));
        }
        self.checks.remove(id);
        self.check_deadlines.remove(id);
        self.changes.checks.insert(id.to_string());
        self.tables.checks = idx;
        self.index_used = true;
        self.invalidate_sessions_bound_to(idx, id, now);
        Ok(())
    }

    pub(super) fn invalidate_sessions_bound_to(&mut self, idx: u64, check_id: &str, now: Instant) {
        let bound: Vec<String> = self
            .sessions
            .values()
            .filter(|session| session.bound_checks().any(|id| id == check_id))
            .map(|session| session.id.clone())
            .collect();
        for id in bound {
            self.session_destroy(idx, &id, now);
        }
    }

    pub(super) fn register_node(
        &mut self,
        idx: u64,
        name: String,
        id: String,
        address: String,
        now: Instant,
    ) {
        if let Some(node) = &self.node {
            if node.name == name && node.id == id && node.address == address {
                return;
            }
            if node.name != name {
                // Deregistering a node invalidates its sessions and removes its checks.
                let sessions: Vec<String> = self.sessions.keys().cloned().collect();
                for session in sessions {
                    self.session_destroy(idx, &session, now);
                }
                let checks: Vec<String> = self.checks.keys().cloned().collect();
                for check in checks {
                    self.checks.remove(&check);
                    self.check_deadlines.remove(&check);
                    self.changes.checks.insert(check);
                }
                self.tables.checks = idx;
            }
        }
        let create_index = match &self.node {
            Some(node) if node.name == name => node.create_index,
            _ => idx,
        };
        self.node = Some(Node {
            name,
            id,
            address,
            create_index,
            modify_index: idx,
        });
        self.changes.node = true;
        self.tables.nodes = idx;
        if !self.checks.contains_key(SERF_CHECK_ID) {
            self.checks.insert(
                SERF_CHECK_ID.to_string(),
                Check {
                    id: SERF_CHECK_ID.to_string(),
                    name: "Serf Health Status".to_string(),
                    status: CheckStatus::Passing,
                    notes: String::new(),
                    output: "Agent alive and reachable".to_string(),
                    service_id: String::new(),
                    ttl: None,
                    create_index: idx,
                    modify_index: idx,
                },
            );
            self.changes.checks.insert(SERF_CHECK_ID.to_string());
            self.tables.checks = idx;
        }
        self.index_used = true;
    }
}
