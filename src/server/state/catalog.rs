//! The agent's services and their checks, and maintenance mode, as rules of the state
//! machine: register (with TTL checks, which keep their status across a re-registration as
//! Consul's agent restores them), deregister (with the service's checks, which invalidates
//! the sessions bound to them), node and service maintenance (a critical check of type
//! `maintenance`, as Consul adds one).
//!
//! Services live in `State::services`, checks in the shared check table, so sessions, TTLs
//! and the health endpoints see one set of checks. What is durable goes through
//! `take_changes()` like every other table. Reads that serve `/v1/catalog/*` and
//! `/v1/health/*` are the `pub fn`s here; HTTP shapes are the HTTP layer's.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{ApplyError, Check, CheckStatus, Outcome, State, SERF_CHECK_ID};

/// Consul's node maintenance check (structs.NodeMaint).
pub const NODE_MAINT_CHECK_ID: &str = "_node_maintenance";
/// Prefix of a service's maintenance check id (structs.ServiceMaintPrefix).
pub const SERVICE_MAINT_PREFIX: &str = "_service_maintenance:";
/// Notes of a node maintenance check enabled without a reason (agent.go).
pub const DEFAULT_NODE_MAINT_REASON: &str =
    "Maintenance mode is enabled for this node, but no reason was provided. This is a default message.";
/// Notes of a service maintenance check enabled without a reason (agent.go).
pub const DEFAULT_SERVICE_MAINT_REASON: &str =
    "Maintenance mode is enabled for this service, but no reason was provided. This is a default message.";

/// One registered service instance of this agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub id: String,
    pub name: String,
    pub tags: Vec<String>,
    pub address: String,
    pub port: u16,
    pub meta: BTreeMap<String, String>,
    /// `lan_ipv4` and the like: address and port, as Consul's `ServiceAddress`.
    pub tagged_addresses: BTreeMap<String, (String, u16)>,
    pub weights: Weights,
    pub enable_tag_override: bool,
    pub create_index: u64,
    pub modify_index: u64,
}

impl Service {
    /// Everything but the indexes: a re-registration that changes none of it is no write.
    fn same_content(&self, other: &Service) -> bool {
        Service {
            create_index: 0,
            modify_index: 0,
            ..self.clone()
        } == Service {
            create_index: 0,
            modify_index: 0,
            ..other.clone()
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Weights {
    pub passing: u32,
    pub warning: u32,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            passing: 1,
            warning: 1,
        }
    }
}

/// A TTL check declared with a service (`Check` / `Checks` of a registration).
#[derive(Clone, Debug)]
pub struct ServiceCheckSpec {
    /// Empty: `service:<service id>`, with `:<n>` appended when there are several.
    pub id: String,
    /// Empty: `Service '<name>' check`.
    pub name: String,
    /// `None`: critical, as Consul starts a check.
    pub status: Option<CheckStatus>,
    pub notes: String,
    pub ttl: Duration,
}

/// A registration as the HTTP layer decoded and validated it.
#[derive(Clone, Debug)]
pub struct ServiceSpec {
    pub service: Service,
    pub checks: Vec<ServiceCheckSpec>,
    /// `?replace-existing-checks`: checks of the service not in `checks` are removed.
    pub replace_existing_checks: bool,
}

/// The check ids Consul gives a service's checks that do not name one.
pub fn default_check_ids(service_id: &str, count: usize) -> Vec<String> {
    (1..=count)
        .map(|n| match count {
            1 => format!("service:{service_id}"),
            _ => format!("service:{service_id}:{n}"),
        })
        .collect()
}

/// The id of a service's maintenance check.
pub fn service_maint_check_id(service_id: &str) -> String {
    format!("{SERVICE_MAINT_PREFIX}{service_id}")
}

/// Whether a check is a maintenance check (Consul's type `maintenance`).
pub fn is_maintenance_check(id: &str) -> bool {
    id == NODE_MAINT_CHECK_ID || id.starts_with(SERVICE_MAINT_PREFIX)
}

impl State {
    // ----- reads -----

    pub fn service(&self, id: &str) -> Option<&Service> {
        self.services.get(id)
    }

    /// Service instances in id order, as Consul's memdb iterates them on one node.
    pub fn services(&self) -> impl Iterator<Item = &Service> {
        self.services.values()
    }

    /// The checks that decide a service instance's health, as Consul lists them in a
    /// `CheckServiceNode`: the node's checks first, then the instance's own, each in id order.
    pub fn checks_of_service<'a>(&'a self, service_id: &'a str) -> impl Iterator<Item = &'a Check> {
        let node = self.checks.values().filter(|c| c.service_id.is_empty());
        let own = self
            .checks
            .values()
            .filter(move |c| c.service_id == service_id);
        node.chain(own)
    }

    // ----- writes (called from `apply`) -----

    /// Registers or replaces a service and its TTL checks. A check that already exists keeps
    /// its status and output and has its TTL timer restarted, as Consul's agent does; a
    /// re-registration that changes nothing writes nothing.
    pub(super) fn service_register(
        &mut self,
        idx: u64,
        spec: ServiceSpec,
        now: Instant,
    ) -> Outcome {
        let ServiceSpec {
            mut service,
            checks,
            replace_existing_checks,
        } = spec;
        match self.services.get(&service.id) {
            Some(existing) if existing.same_content(&service) => {}
            existing => {
                service.create_index = existing.map_or(idx, |s| s.create_index);
                service.modify_index = idx;
                self.changes.services.insert(service.id.clone());
                self.services.insert(service.id.clone(), service.clone());
                self.tables.services = idx;
                self.index_used = true;
            }
        }
        let ids = default_check_ids(&service.id, checks.len());
        let mut kept = Vec::new();
        for (spec, default_id) in checks.into_iter().zip(ids) {
            let id = if spec.id.is_empty() {
                default_id
            } else {
                spec.id.clone()
            };
            let existing = self.checks.get(&id);
            let check = Check {
                id: id.clone(),
                name: if spec.name.is_empty() {
                    format!("Service '{}' check", service.name)
                } else {
                    spec.name
                },
                status: existing
                    .map(|c| c.status)
                    .or(spec.status)
                    .unwrap_or(CheckStatus::Critical),
                notes: spec.notes,
                output: existing.map(|c| c.output.clone()).unwrap_or_default(),
                service_id: service.id.clone(),
                ttl: Some(spec.ttl),
                create_index: existing.map_or(idx, |c| c.create_index),
                modify_index: idx,
            };
            self.check_deadlines.insert(id.clone(), now + spec.ttl);
            self.put_check(idx, check, now);
            kept.push(id);
        }
        if replace_existing_checks {
            let stale: Vec<String> = self
                .checks
                .values()
                .filter(|c| c.service_id == service.id && !kept.contains(&c.id))
                .filter(|c| !is_maintenance_check(&c.id))
                .map(|c| c.id.clone())
                .collect();
            for id in stale {
                let _ = self.check_deregister(idx, &id, now);
            }
        }
        Outcome::Done
    }

    /// Removes a service and every check of it (which invalidates the sessions bound to
    /// them, as removing any check does).
    pub(super) fn service_deregister(
        &mut self,
        idx: u64,
        id: &str,
        now: Instant,
    ) -> Result<Outcome, ApplyError> {
        if self.services.remove(id).is_none() {
            return Err(ApplyError::UnknownService(id.to_string()));
        }
        self.changes.services.insert(id.to_string());
        self.tables.services = idx;
        self.index_used = true;
        let checks: Vec<String> = self
            .checks
            .values()
            .filter(|c| c.service_id == id)
            .map(|c| c.id.clone())
            .collect();
        for check in checks {
            let _ = self.check_deregister(idx, &check, now);
        }
        Ok(Outcome::Done)
    }

    /// Puts the node (`service: None`) or one service into maintenance mode or takes it
    /// out. Enabling twice keeps the first reason, as Consul does.
    pub(super) fn maintenance(
        &mut self,
        idx: u64,
        service: Option<&str>,
        enable: bool,
        reason: String,
        now: Instant,
    ) -> Result<Outcome, ApplyError> {
        let (id, name, default_reason) = match service {
            None => (
                NODE_MAINT_CHECK_ID.to_string(),
                "Node Maintenance Mode",
                DEFAULT_NODE_MAINT_REASON,
            ),
            Some(service) => {
                if !self.services.contains_key(service) {
                    return Err(ApplyError::UnknownService(service.to_string()));
                }
                (
                    service_maint_check_id(service),
                    "Service Maintenance Mode",
                    DEFAULT_SERVICE_MAINT_REASON,
                )
            }
        };
        let present = self.checks.contains_key(&id);
        if enable && !present {
            let check = Check {
                id: id.clone(),
                name: name.to_string(),
                status: CheckStatus::Critical,
                notes: if reason.is_empty() {
                    default_reason.to_string()
                } else {
                    reason
                },
                output: String::new(),
                service_id: service.unwrap_or("").to_string(),
                ttl: None,
                create_index: idx,
                modify_index: idx,
            };
            self.put_check(idx, check, now);
        } else if !enable && present {
            let _ = self.check_deregister(idx, &id, now);
        }
        Ok(Outcome::Done)
    }

    /// Stores a check unless it is unchanged; a critical one invalidates its sessions.
    fn put_check(&mut self, idx: u64, check: Check, now: Instant) {
        if let Some(existing) = self.checks.get(&check.id) {
            let unchanged = Check {
                create_index: existing.create_index,
                modify_index: existing.modify_index,
                ..check.clone()
            };
            if *existing == unchanged {
                return;
            }
        }
        let id = check.id.clone();
        let critical = check.status == CheckStatus::Critical;
        self.checks.insert(id.clone(), check);
        self.changes.checks.insert(id.clone());
        self.tables.checks = idx;
        self.index_used = true;
        if critical && id != SERF_CHECK_ID {
            self.invalidate_sessions_bound_to(idx, &id, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Command, Config, SessionSpec, DEFAULT_LOCK_DELAY};
    use super::*;

    const NODE: &str = "node-1";

    fn state() -> (State, Instant) {
        let mut state = State::new(
            Config {
                session_ttl_min: Duration::from_secs(1),
            },
            Instant::now(),
        );
        let t0 = Instant::now();
        state
            .apply(
                Command::RegisterNode {
                    name: NODE.into(),
                    id: "id".into(),
                    address: "127.0.0.1".into(),
                },
                t0,
            )
            .unwrap();
        (state, t0)
    }

    fn web(id: &str, tags: &[&str], checks: Vec<ServiceCheckSpec>) -> Command {
        Command::ServiceRegister(ServiceSpec {
            service: Service {
                id: id.into(),
                name: "web".into(),
                tags: tags.iter().map(|t| t.to_string()).collect(),
                address: "10.0.0.1".into(),
                port: 80,
                meta: BTreeMap::new(),
                tagged_addresses: BTreeMap::new(),
                weights: Weights::default(),
                enable_tag_override: false,
                create_index: 0,
                modify_index: 0,
            },
            checks,
            replace_existing_checks: false,
        })
    }

    fn ttl_check(id: &str, status: Option<CheckStatus>) -> ServiceCheckSpec {
        ServiceCheckSpec {
            id: id.into(),
            name: String::new(),
            status,
            notes: String::new(),
            ttl: Duration::from_secs(10),
        }
    }

    /// A service's checks without ids are named `service:<id>` (`:<n>` when several), named
    /// after the service, start critical unless a status is given, and belong to it.
    #[test]
    fn registration_names_and_starts_checks_as_consul() {
        let (mut state, t0) = state();
        let one = vec![ttl_check("", None)];
        state.apply(web("w1", &["a"], one), t0).unwrap();
        let check = state.check("service:w1").unwrap();
        assert_eq!(check.status, CheckStatus::Critical);
        assert_eq!(check.name, "Service 'web' check");
        assert_eq!(check.service_id, "w1");
        let two = vec![
            ttl_check("", Some(CheckStatus::Passing)),
            ttl_check("", None),
        ];
        state.apply(web("w2", &[], two), t0).unwrap();
        assert_eq!(
            state.check("service:w2:1").unwrap().status,
            CheckStatus::Passing
        );
        assert!(state.check("service:w2:2").is_some());
        assert_eq!(state.services().count(), 2);
        assert_eq!(state.tables().services, state.index());
    }

    /// Re-registering keeps a check's status and output (Consul restores them), and one
    /// that changes nothing uses no index; a tag change is a write.
    #[test]
    fn reregistration_keeps_check_state_and_skips_no_ops() {
        let (mut state, t0) = state();
        let passing = || vec![ttl_check("c", Some(CheckStatus::Passing))];
        state.apply(web("w1", &["standby"], passing()), t0).unwrap();
        state
            .apply(
                Command::CheckUpdate {
                    id: "c".into(),
                    status: CheckStatus::Warning,
                    output: "slow".into(),
                },
                t0,
            )
            .unwrap();
        let before = state.index();
        state.take_changes();
        state.apply(web("w1", &["standby"], passing()), t0).unwrap();
        assert_eq!(state.index(), before, "a no-op registration used an index");
        assert!(state.take_changes().is_empty());
        let check = state.check("c").unwrap();
        assert_eq!(check.status, CheckStatus::Warning);
        assert_eq!(check.output, "slow");
        state.apply(web("w1", &["leader"], passing()), t0).unwrap();
        assert_eq!(state.index(), before + 1);
        assert_eq!(state.service("w1").unwrap().tags, vec!["leader"]);
        assert_eq!(state.service("w1").unwrap().modify_index, before + 1);
    }

    /// Deregistering a service removes its checks, which invalidates the sessions bound to
    /// them; an unknown id is an error the HTTP layer answers with 404.
    #[test]
    fn deregistration_removes_checks_and_their_sessions() {
        let (mut state, t0) = state();
        state
            .apply(
                web("w1", &[], vec![ttl_check("c", Some(CheckStatus::Passing))]),
                t0,
            )
            .unwrap();
        state
            .apply(
                Command::SessionCreate(SessionSpec {
                    id: "s".into(),
                    name: String::new(),
                    node: NODE.into(),
                    lock_delay: DEFAULT_LOCK_DELAY,
                    behavior: "release".into(),
                    ttl: String::new(),
                    node_checks: vec![SERF_CHECK_ID.into(), "c".into()],
                    service_checks: None,
                    checks: Vec::new(),
                }),
                t0,
            )
            .unwrap();
        state
            .apply(Command::ServiceDeregister { id: "w1".into() }, t0)
            .unwrap();
        assert!(state.service("w1").is_none());
        assert!(state.check("c").is_none());
        assert!(state.session("s").is_none());
        assert_eq!(
            state.apply(Command::ServiceDeregister { id: "w1".into() }, t0),
            Err(ApplyError::UnknownService("w1".into()))
        );
    }

    /// Maintenance adds a critical check of Consul's ids, names and default reasons once,
    /// and removes it; a service's needs the service.
    #[test]
    fn maintenance_is_a_critical_check() {
        let (mut state, t0) = state();
        let node = |enable: bool, reason: &str| Command::Maintenance {
            service: None,
            enable,
            reason: reason.into(),
        };
        state.apply(node(true, ""), t0).unwrap();
        let check = state.check(NODE_MAINT_CHECK_ID).unwrap();
        assert_eq!(check.status, CheckStatus::Critical);
        assert_eq!(check.notes, DEFAULT_NODE_MAINT_REASON);
        assert_eq!(check.name, "Node Maintenance Mode");
        state.apply(node(true, "second"), t0).unwrap();
        assert_eq!(
            state.check(NODE_MAINT_CHECK_ID).unwrap().notes,
            DEFAULT_NODE_MAINT_REASON
        );
        state.apply(node(false, ""), t0).unwrap();
        assert!(state.check(NODE_MAINT_CHECK_ID).is_none());

        let service = |enable: bool| Command::Maintenance {
            service: Some("w1".into()),
            enable,
            reason: "deploy".into(),
        };
        assert_eq!(
            state.apply(service(true), t0),
            Err(ApplyError::UnknownService("w1".into()))
        );
        state.apply(web("w1", &[], Vec::new()), t0).unwrap();
        state.apply(service(true), t0).unwrap();
        let check = state.check("_service_maintenance:w1").unwrap();
        assert_eq!(
            (check.notes.as_str(), check.service_id.as_str()),
            ("deploy", "w1")
        );
        assert_eq!(
            state
                .checks_of_service("w1")
                .map(|c| c.id.as_str())
                .collect::<Vec<_>>(),
            vec!["serfHealth", "_service_maintenance:w1"]
        );
    }

    /// A service's TTL check goes critical when its TTL passes without an update, and a
    /// re-registration restarts its timer.
    #[test]
    fn service_checks_expire_and_registration_restarts_the_timer() {
        let (mut state, t0) = state();
        let passing = || vec![ttl_check("c", Some(CheckStatus::Passing))];
        state.apply(web("w1", &[], passing()), t0).unwrap();
        let t8 = t0 + Duration::from_secs(8);
        state.apply(web("w1", &[], passing()), t8).unwrap();
        state.expire(t0 + Duration::from_secs(12));
        assert_eq!(state.check("c").unwrap().status, CheckStatus::Passing);
        state.expire(t8 + Duration::from_secs(10));
        assert_eq!(state.check("c").unwrap().status, CheckStatus::Critical);
    }

    /// With `replace-existing-checks`, checks of the service left out are removed.
    #[test]
    fn replace_existing_checks_drops_the_others() {
        let (mut state, t0) = state();
        let two = vec![ttl_check("a", None), ttl_check("b", None)];
        state.apply(web("w1", &[], two), t0).unwrap();
        let Command::ServiceRegister(mut spec) = web("w1", &[], vec![ttl_check("a", None)]) else {
            unreachable!()
        };
        spec.replace_existing_checks = true;
        state.apply(Command::ServiceRegister(spec), t0).unwrap();
        assert!(state.check("a").is_some());
        assert!(state.check("b").is_none());
    }
}
