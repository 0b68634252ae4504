//! A real `redis-server` on a free loopback port, in a directory of its own (removed on
//! drop), with the append-only file on: what the Redis tests, bench and chaos run against.
//! [`RedisServer::start_with`]`("off")` starts one without persistence, which loses
//! everything on a restart: for the tests of what leaderq refuses, and accepts.
//! `produce` writes with the producers' documented command (`redis-cli EVAL` of
//! [`leaderq::coord::redis::PRODUCE`]). Missing binaries skip or fail by [`super::external`].
//! [`RedisServer::start_tls`] serves TLS alone (`--port 0 --tls-port`), asking every client
//! for a certificate its CA signed; the harness's own `redis-cli` then presents the client's.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::pki::Pki;
use super::{external, free_port, wait_for, Cluster, Proc};

/// How long a started or restarted Redis may take to answer PING (it replays its AOF).
const READY_LIMIT: Duration = Duration::from_secs(20);

/// The key prefix the harness's replicas and producer use.
pub const PREFIX: &str = "leaderq/";

/// One `redis-server`, killed when dropped.
pub struct RedisServer {
    binary: PathBuf,
    cli: PathBuf,
    dir: PathBuf,
    port: u16,
    appendfsync: String,
    /// More arguments to redis-server (`--replicaof host port`), after the harness's own.
    extra: Vec<String>,
    /// TLS alone on `port`, clients asked for a certificate (`--tls-auth-clients yes`).
    tls: Option<Pki>,
    proc: Option<Proc>,
}

impl RedisServer {
    /// A Redis with `appendfsync always` (every acknowledged write is on disk), or `None`
    /// when redis-server or redis-cli is not installed (see [`external`]).
    pub fn start() -> Option<RedisServer> {
        RedisServer::start_with("always")
    }

    /// A Redis with the given `appendfsync` policy ("always", "everysec" or "no"), or
    /// with no persistence at all ("off": to measure what it loses).
    pub fn start_with(appendfsync: &str) -> Option<RedisServer> {
        RedisServer::start_args(appendfsync, &[])
    }

    /// A Redis as [`RedisServer::start_with`] starts one, given `extra` arguments as well
    /// (`["--replicaof", "127.0.0.1", "6379"]`: a replica of another).
    pub fn start_args(appendfsync: &str, extra: &[&str]) -> Option<RedisServer> {
        RedisServer::start_full(appendfsync, extra, None)
    }

    /// A Redis serving TLS alone on its port with `pki`'s server certificate, asking every
    /// client for one `pki.ca` signed (`--tls-auth-clients yes`).
    pub fn start_tls(pki: &Pki) -> Option<RedisServer> {
        RedisServer::start_full("always", &[], Some(pki.clone()))
    }

    /// A Redis serving TLS alone as [`RedisServer::start_tls`] starts one, given `extra`
    /// arguments as well (`--replicaof`, `--tls-replication yes`).
    pub fn start_tls_args(pki: &Pki, extra: &[&str]) -> Option<RedisServer> {
        RedisServer::start_full("always", extra, Some(pki.clone()))
    }

    fn start_full(appendfsync: &str, extra: &[&str], tls: Option<Pki>) -> Option<RedisServer> {
        let binary = external(&["redis-server"], "redis-server (apt install redis-server)")?;
        let cli = external(&["redis-cli"], "redis-tools (apt install redis-tools)")?;
        let dir = std::env::temp_dir().join(format!(
            "leaderq-redis-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).expect("create the redis directory");
        let mut server = RedisServer {
            binary,
            cli,
            dir,
            port: free_port(),
            appendfsync: appendfsync.to_string(),
            extra: extra.iter().map(|arg| arg.to_string()).collect(),
            tls,
            proc: None,
        };
        if let Err(why) = server.spawn() {
            panic!("{why}");
        }
        Some(server)
    }

    /// `redis://127.0.0.1:<port>/0` (`rediss://` with TLS).
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}/0", self.scheme(), self.port)
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        }
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's pid (0 while it is down).
    pub fn pid(&self) -> u32 {
        self.proc.as_ref().map_or(0, Proc::pid)
    }

    /// Sends `signal` ("STOP", "CONT", …) to the server.
    pub fn signal(&self, signal: &str) {
        if let Some(proc) = &self.proc {
            proc.signal(signal);
        }
    }

    fn spawn(&mut self) -> Result<(), String> {
        let mut command = Command::new(&self.binary);
        match &self.tls {
            None => command.args(["--port", &self.port.to_string()]),
            Some(pki) => command
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .arg("--tls-cert-file")
                .arg(&pki.server_cert)
                .arg("--tls-key-file")
                .arg(&pki.server_key)
                .arg("--tls-ca-cert-file")
                .arg(&pki.ca)
                .args(["--tls-auth-clients", "yes"]),
        };
        command
            .args(["--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args(match self.appendfsync.as_str() {
                "off" => ["--appendonly", "no", "--appendfsync", "no"],
                policy => ["--appendonly", "yes", "--appendfsync", policy],
            })
            .args(["--save", "", "--daemonize", "no", "--logfile", "redis.log"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.proc = Some(Proc::spawn("redis-server", command)?);
        let port = self.port;
        let answers = || match self.tls {
            None => ping(port),
            Some(_) => self.cli(&[b"PING"]).is_ok_and(|answer| answer == "PONG"),
        };
        wait_for(READY_LIMIT, "redis-server answers PING", answers).map_err(|why| {
            let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
            format!("{why}; its log:\n{log}")
        })
    }

    /// Runs `redis-cli` against the server with `args`; its standard output.
    pub fn cli(&self, args: &[&[u8]]) -> Result<String, String> {
        use std::os::unix::ffi::OsStrExt as _;
        let mut command = cli_command(&self.cli, self.port, self.tls.as_ref());
        let output = command
            .args(args.iter().map(|a| std::ffi::OsStr::from_bytes(a)))
            .output()
            .map_err(|e| format!("cannot run redis-cli: {e}"))?;
        let out = String::from_utf8_lossy(&output.stdout).trim().to_string();
        if !output.status.success() || out.starts_with("ERR") || out.starts_with("(error)") {
            return Err(format!(
                "redis-cli {}: {out} {}",
                String::from_utf8_lossy(args.first().copied().unwrap_or_default()),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(out)
    }
}

/// `redis-cli` against 127.0.0.1:`port`, over TLS with the client's certificate from `pki`
/// if given.
pub(super) fn cli_command(cli: &std::path::Path, port: u16, pki: Option<&Pki>) -> Command {
    let mut command = Command::new(cli);
    command.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(pki) = pki {
        command
            .arg("--tls")
            .arg("--cacert")
            .arg(&pki.ca)
            .arg("--cert")
            .arg(&pki.client_cert)
            .arg("--key")
            .arg(&pki.client_key);
    }
    command
}

/// Whether a Redis on `port` answers PING with PONG (it answers LOADING errors while it
/// replays its AOF).
fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let mut answer = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut answer).is_ok()
        && &answer == b"+PONG\r\n"
}

impl Cluster for RedisServer {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn delete_leader_record(&self, leader_key: &str) -> Result<(), String> {
        self.cli(&[b"DEL", format!("{PREFIX}leader/{leader_key}").as_bytes()])
            .map(drop)
    }

    fn revoke_leader_lease(&self, leader_key: &str) -> Result<bool, String> {
        let lease = self.cli(&[b"GET", format!("{PREFIX}leader/{leader_key}").as_bytes()])?;
        if lease.is_empty() {
            return Err("the leader key is not held".into());
        }
        self.cli(&[b"DEL", format!("{PREFIX}lease/{lease}").as_bytes()])?;
        Ok(true)
    }

    fn client_addrs(&self) -> Vec<String> {
        vec![format!("127.0.0.1:{}", self.port)]
    }

    fn env_at(&self, addrs: &[String]) -> Vec<(String, String)> {
        let addr = addrs.first().map_or("", String::as_str);
        vec![
            ("LEADERQ__COORDINATOR__BACKEND".into(), "redis".into()),
            (
                "LEADERQ__REDIS__URL".into(),
                format!("{}://{addr}/0", self.scheme()),
            ),
            ("LEADERQ__REDIS__KEY_PREFIX".into(), PREFIX.into()),
        ]
    }

    fn members(&self) -> usize {
        1
    }

    fn kill_member(&mut self, _i: usize) -> Result<(), String> {
        if let Some(mut proc) = self.proc.take() {
            proc.kill();
        }
        Ok(())
    }

    fn restart_member(&mut self, i: usize) -> Result<(), String> {
        self.kill_member(i)?;
        self.spawn()
    }

    /// Its directory (AOF and all) emptied before it starts again, whatever its persistence.
    fn restart_empty(&mut self) -> Result<(), String> {
        self.kill_member(0)?;
        std::fs::remove_dir_all(&self.dir)
            .and_then(|()| std::fs::create_dir_all(&self.dir))
            .map_err(|e| format!("cannot empty {}: {e}", self.dir.display()))?;
        self.spawn()
    }

    fn produce(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.cli(&[
            b"EVAL",
            leaderq::coord::redis::PRODUCE.as_bytes(),
            b"0",
            PREFIX.as_bytes(),
            key.as_bytes(),
            value,
        ])
        .map(drop)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut proc) = self.proc.take() {
            proc.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
