//! The local agent's service registrations: register (with TTL checks) and deregister.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::{escape_key, status_error, Client, Error};
use crate::util::duration;

/// A service instance as this replica registers it with its agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRegistration {
    pub id: String,
    pub name: String,
    pub tags: Vec<String>,
    /// Empty: the agent's node address.
    pub address: String,
    pub port: u16,
    pub meta: Vec<(String, String)>,
    pub checks: Vec<ServiceCheck>,
}

/// A TTL check registered with the service, so that it counts for the service's health.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceCheck {
    pub id: String,
    pub name: String,
    pub ttl: Duration,
    pub notes: String,
}

impl ServiceRegistration {
    /// The body of `PUT /v1/agent/service/register`. Checks start passing; an existing
    /// check keeps the status it has, as the agent restores it on a re-registration.
    pub fn body(&self) -> Value {
        let checks: Vec<Value> = self
            .checks
            .iter()
            .map(|check| {
                json!({
                    "CheckID": check.id,
                    "Name": check.name,
                    "TTL": duration::format(check.ttl),
                    "Status": "passing",
                    "Notes": check.notes,
                })
            })
            .collect();
        let meta: serde_json::Map<String, Value> = self
            .meta
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        json!({
            "ID": self.id,
            "Name": self.name,
            "Tags": self.tags,
            "Address": self.address,
            "Port": self.port,
            "Meta": meta,
            "Checks": checks,
        })
    }
}

impl Client {
    /// Registers (or updates) a service with the agent.
    pub async fn service_register(&self, registration: &ServiceRegistration) -> Result<(), Error> {
        self.send_expecting_ok(
            Method::PUT,
            "/v1/agent/service/register",
            Some(registration.body().to_string().into_bytes()),
        )
        .await
    }

    /// Deregisters a service and its checks; one the agent does not know is gone already.
    pub async fn service_deregister(&self, id: &str) -> Result<(), Error> {
        let path = format!("/v1/agent/service/deregister/{}", escape_key(id));
        let response = self
            .send(Method::PUT, &path, None, self.request_timeout)
            .await?;
        if response.status() != StatusCode::OK && response.status() != StatusCode::NOT_FOUND {
            return Err(status_error(response).await);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body uses Consul's field names, Go's duration syntax and a passing start.
    #[test]
    fn registration_body_is_consuls() {
        let registration = ServiceRegistration {
            id: "r1".into(),
            name: "leaderq".into(),
            tags: vec!["leader".into()],
            address: "10.0.0.2".into(),
            port: 9464,
            meta: vec![("node".into(), "r1".into())],
            checks: vec![ServiceCheck {
                id: "leaderq:r1".into(),
                name: "leaderq r1".into(),
                ttl: Duration::from_secs(15),
                notes: "n".into(),
            }],
        };
        assert_eq!(
            registration.body(),
            json!({
                "ID": "r1", "Name": "leaderq", "Tags": ["leader"], "Address": "10.0.0.2",
                "Port": 9464, "Meta": {"node": "r1"},
                "Checks": [{"CheckID": "leaderq:r1", "Name": "leaderq r1", "TTL": "15s", "Status": "passing", "Notes": "n"}]
            })
        );
    }
}
