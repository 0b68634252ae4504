//! The local agent's TTL checks: list, register, pass, deregister.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::{escape_key, status_error, Client, Error};
use crate::util::duration;

/// What the consumer reads back about one of the agent's checks.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AgentCheck {
    #[serde(default)]
    pub name: String,
    /// "passing", "warning" or "critical".
    #[serde(default)]
    pub status: String,
}

impl Client {
    /// The agent's checks by id (`GET /v1/agent/checks`).
    pub async fn agent_checks(&self) -> Result<BTreeMap<String, AgentCheck>, Error> {
        let response = self
            .send(Method::GET, "/v1/agent/checks", None, self.request_timeout)
            .await?;
        if response.status() != StatusCode::OK {
            return Err(status_error(response).await);
        }
        response
            .json()
            .await
            .map_err(|e| Error::Decode(e.to_string()))
    }

    /// Registers a TTL check that starts passing, so a session can be bound to it at once.
    pub async fn check_register(
        &self,
        id: &str,
        name: &str,
        ttl: Duration,
        notes: &str,
    ) -> Result<(), Error> {
        let body = json!({
            "ID": id,
            "Name": name,
            "TTL": duration::format(ttl),
            "Status": "passing",
            "Notes": notes,
        });
        self.send_expecting_ok(
            Method::PUT,
            "/v1/agent/check/register",
            Some(body.to_string().into_bytes()),
        )
        .await
    }

    pub async fn check_pass(&self, id: &str) -> Result<(), Error> {
        let path = format!("/v1/agent/check/pass/{}", escape_key(id));
        self.send_expecting_ok(Method::PUT, &path, None).await
    }

    pub async fn check_deregister(&self, id: &str) -> Result<(), Error> {
        let path = format!("/v1/agent/check/deregister/{}", escape_key(id));
        let response = self
            .send(Method::PUT, &path, None, self.request_timeout)
            .await?;
        if response.status() != StatusCode::OK && response.status() != StatusCode::NOT_FOUND {
            return Err(status_error(response).await);
        }
        Ok(())
    }
}
