//! Sessions: create, renew, destroy, info.

use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};

use super::{escape_key, status_error, Client, Error};

/// The body of `PUT /v1/session/create`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct SessionRequest {
    pub name: String,
    #[serde(rename = "TTL")]
    pub ttl: String,
    /// A Go duration string, as Consul's api client sends it.
    pub lock_delay: String,
    pub behavior: String,
    pub node_checks: Vec<String>,
}

/// What the consumer reads back about a session.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SessionInfo {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "TTL")]
    pub ttl: String,
    /// The checks whose failure invalidates the session (null when none).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub node_checks: Vec<String>,
    /// The same, in the field older Consul versions used.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub checks: Vec<String>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(deserializer)?.unwrap_or_default())
}

#[derive(Deserialize)]
struct Created {
    #[serde(rename = "ID")]
    id: String,
}

impl Client {
    pub async fn session_create(&self, request: &SessionRequest) -> Result<String, Error> {
        let body = serde_json::to_vec(request).map_err(|e| Error::Decode(e.to_string()))?;
        let response = self
            .send(
                Method::PUT,
                "/v1/session/create",
                Some(body),
                self.request_timeout,
            )
            .await?;
        if response.status() != StatusCode::OK {
            return Err(status_error(response).await);
        }
        let created: Created = response
            .json()
            .await
            .map_err(|e| Error::Decode(e.to_string()))?;
        Ok(created.id)
    }

    /// Renews a session; `None` when Consul no longer knows it (404).
    pub async fn session_renew(&self, id: &str) -> Result<Option<SessionInfo>, Error> {
        let path = format!("/v1/session/renew/{}", escape_key(id));
        let response = self
            .send(Method::PUT, &path, None, self.request_timeout)
            .await?;
        match response.status() {
            StatusCode::NOT_FOUND => Ok(None),
            StatusCode::OK => {
                let sessions: Vec<SessionInfo> = response
                    .json()
                    .await
                    .map_err(|e| Error::Decode(e.to_string()))?;
                Ok(sessions.into_iter().next())
            }
            _ => Err(status_error(response).await),
        }
    }

    pub async fn session_info(&self, id: &str) -> Result<Option<SessionInfo>, Error> {
        let path = format!("/v1/session/info/{}", escape_key(id));
        let response = self
            .send(Method::GET, &path, None, self.request_timeout)
            .await?;
        if response.status() != StatusCode::OK {
            return Err(status_error(response).await);
        }
        let sessions: Option<Vec<SessionInfo>> = response
            .json()
            .await
            .map_err(|e| Error::Decode(e.to_string()))?;
        Ok(sessions.unwrap_or_default().into_iter().next())
    }

    pub async fn session_destroy(&self, id: &str) -> Result<(), Error> {
        let path = format!("/v1/session/destroy/{}", escape_key(id));
        self.send_expecting_ok(Method::PUT, &path, None).await
    }
}
