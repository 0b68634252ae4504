//! Values built from files an operator rewrites in place, without a restart: an ACL token
//! or a password kept in a file (`consul.token_file`, `etcd.password_file`), a client's
//! certificates. [`Reloading::get`] looks at the files' modification times and lengths on
//! every call, reads them again when those changed or a second has passed since the last
//! read (a rewrite in the same instant with the same length), and builds the value anew only
//! when their bytes changed. A file that cannot be read or built from keeps the last good
//! value, with a warning: a rewrite caught half-way is read again on the next call. The
//! coordinators' HTTP clients are built here too ([`http_client`]), from their TLS files.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use super::tls::TlsFiles;

/// The longest a changed file can go unread when its time and length did not move.
const REREAD_AFTER: Duration = Duration::from_secs(1);
/// How long the coordinators' HTTP clients keep an idle connection: under the servers' idle
/// time-outs (Consul's and `leaderq server`'s 2 minutes), so the client closes it first.
const HTTP_POOL_IDLE: Duration = Duration::from_secs(60);

type Build<T> = Box<dyn Fn() -> Result<T, String> + Send + Sync>;

/// A value built from files, rebuilt when they change.
pub struct Reloading<T> {
    files: Vec<String>,
    build: Build<T>,
    state: Mutex<Loaded<T>>,
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

struct Loaded<T> {
    value: T,
    stamps: Vec<Option<(SystemTime, u64)>>,
    bytes: Vec<Option<Vec<u8>>>,
    read_at: Instant,
}

impl<T: Clone> Reloading<T> {
    /// Builds the value now (an error is the caller's start-up refusal) from `files`, which
    /// `build` reads.
    pub fn new(
        files: Vec<String>,
        build: impl Fn() -> Result<T, String> + Send + Sync + 'static,
    ) -> Result<Reloading<T>, String> {
        let stamps = stamps(&files);
        let bytes = contents(&files);
        let value = build()?;
        Ok(Reloading {
            files,
            build: Box::new(build),
            state: Mutex::new(Loaded {
                value,
                stamps,
                bytes,
                read_at: Instant::now(),
            }),
        })
    }

    /// The value, built again first if its files changed since the last look.
    pub fn get(&self) -> T {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let stamps = stamps(&self.files);
        if stamps != state.stamps || state.read_at.elapsed() >= REREAD_AFTER {
            let bytes = contents(&self.files);
            state.read_at = Instant::now();
            state.stamps = stamps;
            if bytes != state.bytes {
                match (self.build)() {
                    Ok(value) => {
                        tracing::info!(files = ?self.files, "files changed: read again");
                        state.value = value;
                        state.bytes = bytes;
                    }
                    Err(reason) => {
                        tracing::warn!(%reason, "files changed but cannot be used; keeping what was read before");
                    }
                }
            }
        }
        state.value.clone()
    }
}

fn stamps(files: &[String]) -> Vec<Option<(SystemTime, u64)>> {
    files.iter().map(|f| super::tls::file_stamp(f)).collect()
}

fn contents(files: &[String]) -> Vec<Option<Vec<u8>>> {
    files.iter().map(|f| std::fs::read(f).ok()).collect()
}

/// An HTTP client for a coordinator's section (`section`: `consul`, `etcd`) with its TLS
/// `files`, built again when they change so that rotated certificates are used by the next
/// connections: reqwest's own TLS set-up when none is given, else our rustls configuration
/// (client certificate, server name; `util/tls.rs`).
pub fn http_client(files: &TlsFiles, section: &str) -> Result<Reloading<reqwest::Client>, String> {
    let paths = files.paths();
    let (files, section) = (files.clone(), section.to_string());
    Reloading::new(paths, move || {
        let builder = reqwest::Client::builder()
            .pool_idle_timeout(HTTP_POOL_IDLE)
            .tcp_nodelay(true);
        let builder = if files.is_set() {
            let material = files.load(&section)?;
            builder.use_preconfigured_tls(material.client_config(&section)?)
        } else {
            builder
        };
        builder
            .build()
            .map_err(|e| format!("cannot set up the HTTP client: {e}"))
    })
}

/// A secret read from `path` for `setting`: the file's text without surrounding white space
/// (a trailing newline), which must not be empty.
pub fn read_secret(setting: &str, path: &str) -> Result<String, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("{setting}: cannot read {path}: {e}"))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(format!(
            "{setting}: {path} is empty: write the secret into it"
        ));
    }
    Ok(secret.to_string())
}

/// A secret kept in a file, read again after a rewrite.
pub fn secret_file(setting: &str, path: &str) -> Result<Reloading<String>, String> {
    let (setting, file) = (setting.to_string(), path.to_string());
    Reloading::new(vec![path.to_string()], move || read_secret(&setting, &file))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rewritten secret is what the next call returns; an emptied one keeps the last.
    #[test]
    fn a_rewritten_file_is_read_again() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("token");
        let path_text = path.to_string_lossy().into_owned();
        std::fs::write(&path, "first\n").expect("write");
        let secret = secret_file("consul.token_file", &path_text).expect("readable");
        assert_eq!(secret.get(), "first");
        std::fs::write(&path, "second-longer\n").expect("rewrite");
        assert_eq!(secret.get(), "second-longer");
        std::fs::write(&path, "").expect("empty it");
        assert_eq!(
            secret.get(),
            "second-longer",
            "an empty file keeps the last secret"
        );
        std::fs::write(&path, "third-longer!\n").expect("rewrite");
        assert_eq!(secret.get(), "third-longer!");
    }

    /// A missing or empty file is refused at start, naming the setting and the file.
    #[test]
    fn missing_or_empty_files_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "  \n").expect("write");
        for path in [dir.path().join("missing"), empty] {
            let path = path.to_string_lossy().into_owned();
            let error = secret_file("etcd.password_file", &path).expect_err("refused");
            assert!(error.starts_with("etcd.password_file: "), "{error}");
            assert!(error.contains(&path), "{error}");
        }
    }
}
