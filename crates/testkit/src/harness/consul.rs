//! `leaderq server` as a test, bench or chaos cluster: one member, the Consul backend.
//! Started on a given (or free) loopback address with its own data dir; its stderr goes to
//! `<data dir>.log`, so a server that fails to start can say why. Started with
//! [`LeaderqServer::start_tls`], it serves HTTPS with a test [`Pki`]'s certificates, and its
//! clients (curl, the replicas' environment) present the client certificate.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::pki::Pki;
use super::{Cluster, Proc};

/// A running `leaderq server`; killed when dropped.
pub struct LeaderqServer {
    proc: Proc,
    exe: PathBuf,
    /// `host:port` it serves Consul's HTTP API on.
    pub addr: String,
    pub data_dir: PathBuf,
    extra: Vec<String>,
    pub tls: Option<ServerTls>,
}

/// How a server serves HTTPS: the certificates, and whether it asks clients for theirs.
#[derive(Clone, Debug)]
pub struct ServerTls {
    pub pki: Pki,
    pub verify_incoming: bool,
}

impl LeaderqServer {
    /// An operator's `curl -X METHOD` of `path` on the server; the body, or why it failed.
    pub fn curl(&self, method: &str, path: &str) -> Result<String, String> {
        self.curl_with(method, path, None)
    }

    /// The server's URL of `path`: https when it serves TLS.
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.addr)
    }

    /// `curl -X METHOD` of `path` with `body`, presenting the client certificate to a TLS
    /// server.
    fn curl_with(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<String, String> {
        let mut command = Command::new("curl");
        command.args(["-sf", "-X", method, &self.url(path)]);
        if let Some(tls) = &self.tls {
            command
                .arg("--cacert")
                .arg(&tls.pki.ca)
                .arg("--cert")
                .arg(&tls.pki.client_cert)
                .arg("--key")
                .arg(&tls.pki.client_key);
        }
        if let Some(body) = body {
            command
                .arg("--data-binary")
                .arg(String::from_utf8_lossy(body).as_ref());
        }
        let output = command
            .output()
            .map_err(|e| format!("cannot run curl: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "curl -X {method} {path} failed ({})",
                output.status
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Starts `exe server` on `listen` ("127.0.0.1:0" picks a port) and `data_dir`, with a
    /// session TTL minimum of 1 s unless `extra` gives its own `--session-ttl-min`. `Err`
    /// holds what the server wrote to stderr if it exits instead of listening.
    pub fn start(
        exe: &Path,
        listen: &str,
        data_dir: &Path,
        extra: &[&str],
    ) -> Result<LeaderqServer, String> {
        LeaderqServer::start_with(exe, listen, data_dir, extra, None)
    }

    /// The same, serving HTTPS with `tls`'s server certificate (`--cert-file`, `--key-file`,
    /// `--ca-file`, and `--verify-incoming` if asked).
    pub fn start_tls(
        exe: &Path,
        listen: &str,
        data_dir: &Path,
        extra: &[&str],
        tls: ServerTls,
    ) -> Result<LeaderqServer, String> {
        LeaderqServer::start_with(exe, listen, data_dir, extra, Some(tls))
    }

    fn start_with(
        exe: &Path,
        listen: &str,
        data_dir: &Path,
        extra: &[&str],
        tls: Option<ServerTls>,
    ) -> Result<LeaderqServer, String> {
        let ttl_min: &[&str] = if extra.contains(&"--session-ttl-min") {
            &[]
        } else {
            &["--session-ttl-min", "1s"]
        };
        if let Some(parent) = data_dir.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        let log_path = data_dir.with_extension("log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let mut command = Command::new(exe);
        command
            .args(["server", "--listen", listen, "--node-name", "test-node"])
            .args(ttl_min)
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(log);
        if let Some(tls) = &tls {
            command
                .arg("--cert-file")
                .arg(&tls.pki.server_cert)
                .arg("--key-file")
                .arg(&tls.pki.server_key)
                .arg("--ca-file")
                .arg(&tls.pki.ca);
            if tls.verify_incoming {
                command.arg("--verify-incoming");
            }
        }
        let mut proc = Proc::spawn("leaderq server", command)?;
        let mut line = String::new();
        if let Some(stdout) = proc.child().stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut line);
        }
        let line = line.trim();
        let Some(addr) = line
            .strip_prefix("leaderq server listening on http://")
            .or_else(|| line.strip_prefix("leaderq server listening on https://"))
        else {
            let _ = proc.child().wait();
            let mut stderr = String::new();
            if let Ok(mut file) = std::fs::File::open(&log_path) {
                let _ = file.read_to_string(&mut stderr);
            }
            return Err(stderr);
        };
        Ok(LeaderqServer {
            addr: addr.to_string(),
            proc,
            exe: exe.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            tls,
        })
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// SIGTERM, then waits up to `limit` for the exit (SIGKILL after); the exit status if
    /// it exited by itself.
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        self.proc.terminate(limit)
    }
}

impl Cluster for LeaderqServer {
    fn backend(&self) -> &'static str {
        "consul"
    }

    fn client_addrs(&self) -> Vec<String> {
        vec![self.addr.clone()]
    }

    fn env_at(&self, addrs: &[String]) -> Vec<(String, String)> {
        let addr = addrs.first().cloned().unwrap_or_default();
        let Some(tls) = &self.tls else {
            return vec![
                ("LEADERQ__COORDINATOR__BACKEND".into(), "consul".into()),
                ("CONSUL_HTTP_ADDR".into(), addr),
            ];
        };
        // Consul's own variables, as its CLI reads them.
        let path = |p: &Path| p.display().to_string();
        vec![
            ("LEADERQ__COORDINATOR__BACKEND".into(), "consul".into()),
            ("CONSUL_HTTP_ADDR".into(), format!("https://{addr}")),
            ("CONSUL_CACERT".into(), path(&tls.pki.ca)),
            ("CONSUL_CLIENT_CERT".into(), path(&tls.pki.client_cert)),
            ("CONSUL_CLIENT_KEY".into(), path(&tls.pki.client_key)),
        ]
    }

    fn members(&self) -> usize {
        1
    }

    fn kill_member(&mut self, _: usize) -> Result<(), String> {
        self.kill();
        Ok(())
    }

    fn restart_member(&mut self, _: usize) -> Result<(), String> {
        self.kill();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        *self = LeaderqServer::start_with(
            &self.exe,
            &self.addr,
            &self.data_dir,
            &extra,
            self.tls.clone(),
        )?;
        Ok(())
    }

    fn restart_empty(&mut self) -> Result<(), String> {
        self.kill();
        std::fs::remove_dir_all(&self.data_dir)
            .map_err(|e| format!("cannot remove {}: {e}", self.data_dir.display()))?;
        self.restart_member(0)
    }

    fn delete_leader_record(&self, leader_key: &str) -> Result<(), String> {
        self.curl("DELETE", &format!("/v1/kv/{leader_key}"))
            .map(drop)
    }

    fn revoke_leader_lease(&self, leader_key: &str) -> Result<bool, String> {
        let body = self.curl("GET", &format!("/v1/kv/{leader_key}"))?;
        let entries: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("{body}: {e}"))?;
        let session = entries[0]["Session"]
            .as_str()
            .ok_or_else(|| format!("the leader key is not held: {body}"))?;
        self.curl("PUT", &format!("/v1/session/destroy/{session}"))?;
        Ok(true)
    }

    /// A producer's plain `PUT /v1/kv/<key>`, over a bare HTTP/1.1 connection.
    fn produce(&self, key: &str, value: &[u8]) -> Result<(), String> {
        if self.tls.is_some() {
            let answer = self.curl_with("PUT", &format!("/v1/kv/{key}"), Some(value))?;
            return match answer.trim() {
                "true" => Ok(()),
                other => Err(format!("PUT {key} answered {other}")),
            };
        }
        let mut stream = std::net::TcpStream::connect(&self.addr)
            .map_err(|e| format!("cannot reach {}: {e}", self.addr))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let head = format!(
            "PUT /v1/kv/{key} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.addr,
            value.len()
        );
        stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(value))
            .map_err(|e| format!("PUT {key}: {e}"))?;
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        if answer.starts_with("HTTP/1.1 200") && answer.trim_end().ends_with("true") {
            Ok(())
        } else {
            Err(format!(
                "PUT {key} answered {}",
                answer.lines().next().unwrap_or("nothing")
            ))
        }
    }
}
