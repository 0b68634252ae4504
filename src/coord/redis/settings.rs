//! The `[redis]` section of the settings and its checks at start, beside the backend that
//! reads it: one Redis by `url`, or the primary that `sentinels` name under `master_name`
//! (never both: `config.rs` sees which the user gave), and the replicas each write waits for
//! (`wait_replicas`). The Redis server's own persistence settings, and whether a failover
//! can lose acknowledged writes, are judged once connected (`durability.rs`). TLS files
//! (`ca_file`, `cert_file`, `key_file`) and `server_name` are for the data nodes, with
//! `rediss://` or behind Sentinel.

use std::io::Read as _;
use std::path::Path;
use std::time::Duration;

use redis::IntoConnectionInfo;
use serde::Deserialize;

use crate::util::duration;
use crate::util::tls::TlsFiles;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: String,
    /// Overrides the URL's password when not empty (so it can come from the environment);
    /// the data nodes' password behind Sentinel.
    pub password: String,
    /// A file holding the password (one line), read again whenever a connection is made
    /// again, so a rotated password is used without a restart; instead of `password`.
    pub password_file: String,
    /// Sentinels' `host:port`: when any is given, the primary is the one they name
    /// `master_name`, found again after every failover, and `url` is not used.
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the primary under (`sentinel monitor <name> …`).
    pub master_name: String,
    /// The sentinels' own password (`requirepass` in their config), if they need one.
    pub sentinel_password: String,
    /// Reach the sentinels over TLS (sentinels serving `tls-port`), with the same CA and
    /// client certificate as the data nodes; off: plain TCP to the sentinels.
    pub sentinel_tls: bool,
    /// Replicas that must have each of leaderq's writes (`WAIT`) before it counts as
    /// acknowledged; 0 waits for none.
    pub wait_replicas: u32,
    /// How long one `WAIT` may take; fewer replicas by then make the write unanswered.
    #[serde(deserialize_with = "duration::deserialize")]
    pub wait_replicas_timeout: Duration,
    pub key_prefix: String,
    #[serde(deserialize_with = "duration::deserialize")]
    pub wait: Duration,
    #[serde(deserialize_with = "duration::deserialize")]
    pub request_timeout: Duration,
    /// Run on a Redis that can lose acknowledged writes (no AOF, `appendfsync no`, an
    /// eviction policy, settings that cannot be read) instead of refusing it at start.
    pub accept_data_loss: bool,
    /// TLS to the data nodes: the CA that signed their certificates, and the client's own
    /// certificate and key (`tls-auth-clients yes`). Any set needs `rediss://` (or
    /// sentinels).
    pub ca_file: String,
    pub cert_file: String,
    pub key_file: String,
    /// The name the data nodes' certificates are checked against (and sent as SNI), when
    /// not the host connected to.
    pub server_name: String,
}

/// The longest password file read: a password is a line, and a larger file is not one.
const PASSWORD_FILE_MAX: u64 = 4096;

/// The password in `path`: its first line, without the line's end. A missing, unreadable,
/// oversized or empty file is refused with what to do.
pub fn read_password_file(path: &Path) -> Result<String, String> {
    let named = |why: String| format!("redis.password_file {}: {why}", path.display());
    let file = std::fs::File::open(path).map_err(|err| {
        named(format!(
            "{err}: write the password in it, readable by this user"
        ))
    })?;
    let mut text = String::new();
    file.take(PASSWORD_FILE_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|err| named(format!("{err}: it must hold the password as text")))?;
    if text.len() as u64 > PASSWORD_FILE_MAX {
        return Err(named(format!(
            "over {PASSWORD_FILE_MAX} bytes: it must hold the password alone, on one line"
        )));
    }
    let password = text.lines().next().unwrap_or_default();
    if password.is_empty() {
        return Err(named(
            "it is empty: write the password on its first line".into(),
        ));
    }
    Ok(password.to_string())
}

impl RedisSettings {
    /// The `[redis]` section's own checks, run with every other setting's at start; the
    /// message names the key.
    pub fn check(&self) -> Result<(), String> {
        let redis = self;
        if !redis.password_file.is_empty() {
            if !redis.password.is_empty() {
                return Err("redis.password and redis.password_file are both set: keep one".into());
            }
            read_password_file(Path::new(&redis.password_file))?;
        }
        if redis.sentinels.is_empty() {
            redis.check_url()?;
        } else {
            redis.check_sentinels()?;
        }
        redis.check_tls()?;
        if redis.wait_replicas > 0
            && (redis.wait_replicas_timeout.is_zero()
                || redis.wait_replicas_timeout >= redis.request_timeout)
        {
            return Err(format!(
                "redis.wait_replicas_timeout must be more than 0s and less than redis.request_timeout ({:?}) when redis.wait_replicas is set",
                redis.request_timeout
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

    /// The section's TLS files; any set means TLS to the data nodes with them.
    pub fn tls(&self) -> TlsFiles {
        TlsFiles::new(
            &self.ca_file,
            &self.cert_file,
            &self.key_file,
            &self.server_name,
        )
    }

    fn check_tls(&self) -> Result<(), String> {
        let tls = self.tls();
        if !tls.is_set() {
            return Ok(());
        }
        if self.sentinels.is_empty() && !self.url.trim_start().starts_with("rediss://") {
            return Err(format!(
                "redis.ca_file, cert_file, key_file and server_name are for TLS, but redis.url {:?} is not rediss://: write rediss://host:port/db (Redis's tls-port), or remove the TLS files",
                self.url
            ));
        }
        tls.check("redis")
    }

    /// The sentinels as addresses to connect to.
    pub fn sentinel_addrs(&self) -> Result<Vec<(String, u16)>, String> {
        self.sentinels
            .iter()
            .map(|entry| {
                let bad = || {
                    format!(
                        "redis.sentinels entry {entry:?} is not host:port, such as \"10.0.0.5:26379\""
                    )
                };
                let (host, port) = entry.trim().rsplit_once(':').ok_or_else(bad)?;
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let port: u16 = port.parse().map_err(|_| bad())?;
                if host.is_empty() || port == 0 {
                    return Err(bad());
                }
                Ok((host.to_string(), port))
            })
            .collect()
    }

    fn check_sentinels(&self) -> Result<(), String> {
        self.sentinel_addrs()?;
        if self.master_name.trim().is_empty() || self.master_name.contains(char::is_whitespace) {
            return Err(
                "redis.master_name must name the primary the sentinels monitor (the <name> of their `sentinel monitor <name> <ip> <port> <quorum>`) when redis.sentinels is set"
                    .into(),
            );
        }
        Ok(())
    }

    fn check_url(&self) -> Result<(), String> {
        let redis = self;
        if !redis.master_name.is_empty()
            || !redis.sentinel_password.is_empty()
            || redis.sentinel_tls
        {
            return Err(
                "redis.master_name, redis.sentinel_password and redis.sentinel_tls need redis.sentinels (the sentinels' host:port): set it, or remove them to use redis.url"
                    .into(),
            );
        }
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

    /// Behind Sentinel: the sentinels (a list, also from the environment) and a master name
    /// are read and checked; a URL given as well is refused with both settings named, as are
    /// a missing master name, an entry that is not host:port, and a replica wait without a
    /// timeout below the request timeout.
    #[test]
    fn sentinels_replace_the_url_and_are_checked() {
        let load = |pairs: &[(&str, &str)]| Settings::load(None, env(pairs));
        let settings = load(&[
            (
                "LEADERQ__REDIS__SENTINELS",
                "10.0.0.5:26379,sentinel-b:26380",
            ),
            ("LEADERQ__REDIS__MASTER_NAME", "mymaster"),
            ("LEADERQ__REDIS__WAIT_REPLICAS", "1"),
        ])
        .unwrap();
        assert_eq!(
            settings.redis.sentinel_addrs().unwrap(),
            vec![
                ("10.0.0.5".to_string(), 26379),
                ("sentinel-b".to_string(), 26380)
            ]
        );
        assert_eq!(settings.redis.wait_replicas, 1);
        let empty = load(&[("LEADERQ__REDIS__SENTINELS", "")]).unwrap();
        assert!(
            empty.redis.sentinels.is_empty(),
            "{:?}",
            empty.redis.sentinels
        );
        assert_eq!(settings.redis.wait_replicas_timeout, Duration::from_secs(1));
        let sentinels = ("LEADERQ__REDIS__SENTINELS", "127.0.0.1:26379");
        let named = ("LEADERQ__REDIS__MASTER_NAME", "mymaster");
        for (pairs, wanted) in [
            (
                vec![
                    sentinels,
                    named,
                    ("LEADERQ__REDIS__URL", "redis://r:6379/0"),
                ],
                "redis.url and redis.sentinels",
            ),
            (vec![sentinels], "redis.master_name"),
            (
                vec![("LEADERQ__REDIS__SENTINELS", "127.0.0.1"), named],
                "redis.sentinels entry",
            ),
            (vec![named], "need redis.sentinels"),
            (
                vec![
                    ("LEADERQ__REDIS__WAIT_REPLICAS", "1"),
                    ("LEADERQ__REDIS__WAIT_REPLICAS_TIMEOUT", "0s"),
                ],
                "redis.wait_replicas_timeout",
            ),
            (
                vec![
                    ("LEADERQ__REDIS__WAIT_REPLICAS", "1"),
                    ("LEADERQ__REDIS__WAIT_REPLICAS_TIMEOUT", "10s"),
                ],
                "less than redis.request_timeout",
            ),
        ] {
            let err = load(&pairs).unwrap_err().to_string();
            assert!(err.contains(wanted), "{pairs:?}: {err}");
        }
    }

    /// TLS files and a server name need `rediss://` (or sentinels): with a `redis://` URL
    /// they are refused, naming the way out; a certificate without its key is refused
    /// naming both.
    #[test]
    fn tls_files_and_a_server_name_need_rediss() {
        let load = |pairs: &[(&str, &str)]| Settings::load(None, env(pairs));
        let ca = ("LEADERQ__REDIS__CA_FILE", "/etc/leaderq/ca.pem");
        let tls_url = ("LEADERQ__REDIS__URL", "rediss://redis.example:6380/0");
        let settings = load(&[ca, tls_url]).unwrap();
        assert!(settings.redis.tls().is_set());
        let sentinels = ("LEADERQ__REDIS__SENTINELS", "127.0.0.1:26379");
        let named = ("LEADERQ__REDIS__MASTER_NAME", "mymaster");
        load(&[ca, sentinels, named]).unwrap();
        let name = ("LEADERQ__REDIS__SERVER_NAME", "redis.internal.example");
        let renamed = load(&[tls_url, name]).unwrap();
        assert_eq!(renamed.redis.tls().server_name, "redis.internal.example");
        for (pairs, wanted) in [
            (vec![ca], "is not rediss://: write rediss://"),
            (
                vec![("LEADERQ__REDIS__SERVER_NAME", "redis.example")],
                "is not rediss://: write rediss://",
            ),
            (
                vec![tls_url, ("LEADERQ__REDIS__CERT_FILE", "/c.pem")],
                "redis.key_file",
            ),
        ] {
            let err = load(&pairs).unwrap_err().to_string();
            assert!(err.contains(wanted), "{pairs:?}: {err}");
        }
    }

    /// `redis.password_file` is read at start: a missing or empty file, or one beside
    /// `redis.password`, is refused with the setting named; its first line is the password.
    #[test]
    fn a_password_file_is_checked_at_start_and_gives_its_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        assert_eq!(super::read_password_file(&file).unwrap(), "s3cret");
        let path = file.display().to_string();
        let load = |pairs: &[(&str, &str)]| Settings::load(None, env(pairs));
        load(&[("LEADERQ__REDIS__PASSWORD_FILE", &path)]).unwrap();
        let both = load(&[
            ("LEADERQ__REDIS__PASSWORD_FILE", &path),
            ("LEADERQ__REDIS__PASSWORD", "x"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            both.contains("redis.password and redis.password_file"),
            "{both}"
        );
        let missing = dir.path().join("none").display().to_string();
        let err = load(&[("LEADERQ__REDIS__PASSWORD_FILE", &missing)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("redis.password_file"), "{err}");
        std::fs::write(&file, "\n").unwrap();
        let err = load(&[("LEADERQ__REDIS__PASSWORD_FILE", &path)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("empty"), "{err}");
        std::fs::write(&file, "x".repeat(5000)).unwrap();
        let err = load(&[("LEADERQ__REDIS__PASSWORD_FILE", &path)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("over 4096 bytes"), "{err}");
    }
}
