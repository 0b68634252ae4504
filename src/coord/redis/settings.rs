//! The `[redis]` section of the settings and its checks at start, beside the backend that
//! reads it. The Redis
//! server's own persistence settings are judged once connected (`durability.rs`).

use std::time::Duration;

use redis::IntoConnectionInfo;
use serde::Deserialize;

use crate::util::duration;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: String,
    /// Overrides the URL's password when not empty (so it can come from the environment).
    pub password: String,
    pub key_prefix: String,
    #[serde(deserialize_with = "duration::deserialize")]
    pub wait: Duration,
    #[serde(deserialize_with = "duration::deserialize")]
    pub request_timeout: Duration,
    /// Run on a Redis that can lose acknowledged writes (no AOF, `appendfsync no`, an
    /// eviction policy, settings that cannot be read) instead of refusing it at start.
    pub accept_data_loss: bool,
}

impl RedisSettings {
    /// The `[redis]` section's own checks, run with every other setting's at start; the
    /// message names the key.
    pub fn check(&self) -> Result<(), String> {
        let redis = self;
        let info = redis
            .url
            .as_str()
            .into_connection_info()
            .map_err(|err| format!("redis.url {:?}: {err}", redis.url))?;
        if !matches!(
            info.addr(),
            redis::ConnectionAddr::Tcp(..) | redis::ConnectionAddr::TcpTls { .. }
        ) {
            return Err(format!(
                "redis.url {:?} is not a TCP address: use redis://host:port/db or rediss://",
                redis.url
            ));
        }
        if redis.key_prefix.is_empty() || redis.key_prefix.contains(char::is_whitespace) {
            return Err(
                "redis.key_prefix must be non-empty and without spaces, such as \"leaderq/\""
                    .into(),
            );
        }
        if redis.request_timeout.is_zero() {
            return Err("redis.request_timeout must be more than 0s".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Backend, Env, Settings};
    use std::time::Duration;

    fn env(pairs: &[(&str, &str)]) -> Env {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// `[coordinator] backend = "redis"` with `[redis]` from the environment; a URL that is
    /// not redis:// or rediss:// and an empty key prefix are refused with the key named.
    #[test]
    fn redis_settings_come_from_the_environment_and_are_checked() {
        let settings = Settings::load(
            None,
            env(&[
                ("LEADERQ__COORDINATOR__BACKEND", "redis"),
                ("LEADERQ__REDIS__URL", "rediss://:pw@redis.example:6380/2"),
                ("LEADERQ__REDIS__PASSWORD", "secret"),
                ("LEADERQ__REDIS__WAIT", "5s"),
            ]),
        )
        .unwrap();
        assert_eq!(settings.coordinator.backend, Backend::Redis);
        assert_eq!(settings.redis.url, "rediss://:pw@redis.example:6380/2");
        assert_eq!(settings.redis.password, "secret");
        assert_eq!(settings.redis.key_prefix, "leaderq/");
        assert_eq!(settings.watch_wait(), Duration::from_secs(5));
        for (name, value, named) in [
            ("LEADERQ__REDIS__URL", "http://127.0.0.1:6379", "redis.url"),
            ("LEADERQ__REDIS__KEY_PREFIX", "", "redis.key_prefix"),
            (
                "LEADERQ__REDIS__REQUEST_TIMEOUT",
                "0s",
                "redis.request_timeout",
            ),
            ("LEADERQ__REDIS__DATABASE", "1", "database"),
        ] {
            let err = Settings::load(None, env(&[(name, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{value:?}: {err}");
        }
    }

    /// `redis.accept_data_loss` is off unless set; it is a boolean, and anything else is
    /// refused at start with the key named.
    #[test]
    fn accepting_data_loss_is_off_by_default_and_a_boolean() {
        let load = |pairs: &[(&str, &str)]| Settings::load(None, env(pairs));
        assert!(!load(&[]).unwrap().redis.accept_data_loss);
        let accepted = load(&[("LEADERQ__REDIS__ACCEPT_DATA_LOSS", "true")]).unwrap();
        assert!(accepted.redis.accept_data_loss);
        let err = load(&[("LEADERQ__REDIS__ACCEPT_DATA_LOSS", "maybe")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("accept_data_loss"), "{err}");
    }
}
