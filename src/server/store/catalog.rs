//! The on-disk record of a service (one JSON value per service id in the `services` table),
//! kept apart from the state's type so that the file format changes only on purpose.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::server::state::{Service, Weights};

#[derive(Serialize, Deserialize)]
pub(super) struct ServiceRecord {
    id: String,
    name: String,
    tags: Vec<String>,
    address: String,
    port: u16,
    meta: BTreeMap<String, String>,
    tagged_addresses: BTreeMap<String, (String, u16)>,
    weights: (u32, u32),
    enable_tag_override: bool,
    create_index: u64,
    modify_index: u64,
}

impl From<&Service> for ServiceRecord {
    fn from(s: &Service) -> Self {
        ServiceRecord {
            id: s.id.clone(),
            name: s.name.clone(),
            tags: s.tags.clone(),
            address: s.address.clone(),
            port: s.port,
            meta: s.meta.clone(),
            tagged_addresses: s.tagged_addresses.clone(),
            weights: (s.weights.passing, s.weights.warning),
            enable_tag_override: s.enable_tag_override,
            create_index: s.create_index,
            modify_index: s.modify_index,
        }
    }
}

impl From<ServiceRecord> for Service {
    fn from(r: ServiceRecord) -> Self {
        Service {
            id: r.id,
            name: r.name,
            tags: r.tags,
            address: r.address,
            port: r.port,
            meta: r.meta,
            tagged_addresses: r.tagged_addresses,
            weights: Weights {
                passing: r.weights.0,
                warning: r.weights.1,
            },
            enable_tag_override: r.enable_tag_override,
            create_index: r.create_index,
            modify_index: r.modify_index,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::server::state::{
        CheckStatus, Command, Config, ServiceCheckSpec, ServiceSpec, State,
    };
    use crate::server::store::Store;

    use super::*;

    /// A registered service and its check survive a reopen; a deregistered one stays gone.
    #[test]
    fn services_are_durable() {
        let dir = tempfile::tempdir().unwrap();
        let (store, snapshot) = Store::open(dir.path()).unwrap();
        let now = Instant::now();
        let mut state = State::restore(Config::default(), snapshot, now);
        let service = |id: &str| Service {
            id: id.into(),
            name: "leaderq".into(),
            tags: vec!["leader".into()],
            address: "127.0.0.1".into(),
            port: 9464,
            meta: BTreeMap::from([("k".into(), "v".into())]),
            tagged_addresses: BTreeMap::from([("lan_ipv4".into(), ("127.0.0.1".into(), 9464))]),
            weights: Weights {
                passing: 3,
                warning: 1,
            },
            enable_tag_override: true,
            create_index: 0,
            modify_index: 0,
        };
        let commands = vec![
            Command::RegisterNode {
                name: "n".into(),
                id: "id".into(),
                address: "127.0.0.1".into(),
            },
            Command::ServiceRegister(ServiceSpec {
                service: service("a"),
                checks: vec![ServiceCheckSpec {
                    id: String::new(),
                    name: String::new(),
                    status: Some(CheckStatus::Passing),
                    notes: String::new(),
                    ttl: Duration::from_secs(15),
                }],
                replace_existing_checks: false,
            }),
            Command::ServiceRegister(ServiceSpec {
                service: service("b"),
                checks: Vec::new(),
                replace_existing_checks: false,
            }),
            Command::ServiceDeregister { id: "b".into() },
        ];
        for command in commands {
            state.apply(command, now).unwrap();
            let changes = state.take_changes();
            store.persist(&state, &changes).unwrap();
        }
        drop(store);
        let (_store, snapshot) = Store::open(dir.path()).unwrap();
        let reloaded = State::restore(Config::default(), snapshot, now);
        assert_eq!(reloaded.service("a"), state.service("a"));
        assert!(reloaded.service("b").is_none());
        assert_eq!(reloaded.check("service:a"), state.check("service:a"));
        assert_eq!(reloaded.tables(), state.tables());
    }
}
