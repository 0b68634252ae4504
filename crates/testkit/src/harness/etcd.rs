//! A real etcd cluster on loopback for tests, bench and chaos: N members (`etcd` from
//! Debian's `etcd-server`) on free ports, each with its data under one temporary directory
//! that is removed when the cluster is dropped. Members run with a 50 ms heartbeat and a
//! 500 ms election timeout, which lowers etcd's minimum lease TTL to 1 s and makes an etcd
//! leader election take about a second. Producers write with `etcdctl put` (`etcd-client`).
//!
//! [`EtcdCluster::start_tls`] serves clients over https with a test [`Pki`]'s server
//! certificate and `--client-cert-auth` (every client presents a certificate signed by its
//! CA); [`EtcdCluster::enable_auth`] turns on etcd's users with a `root` whose password is
//! kept in a file the replicas read (`etcd.password_file`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::pki::Pki;
use super::{external, free_port, wait_for, Cluster, Proc};

/// How long a member may take to serve after it is started.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// etcd's raft tick and election timeout in milliseconds (see the module header).
const HEARTBEAT_MS: u32 = 50;
const ELECTION_MS: u32 = 500;
/// `produce` tries this often (each within etcdctl's 5 s command time-out).
const PRODUCE_ATTEMPTS: usize = 3;

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    proc: Option<Proc>,
    tls: bool,
}

impl Member {
    fn client_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

/// A running etcd cluster; dropping it kills every member and removes its data.
pub struct EtcdCluster {
    etcd: PathBuf,
    etcdctl: PathBuf,
    dir: PathBuf,
    token: String,
    members: Vec<Member>,
    tls: Option<Pki>,
    /// The root user's password file, once auth is on.
    password_file: Option<PathBuf>,
}

impl EtcdCluster {
    /// Starts a cluster of `size` members and waits until every one serves. `Ok(None)`
    /// (after one line on stderr) when etcd is not installed, unless servers are required.
    pub fn start(size: usize) -> Result<Option<EtcdCluster>, String> {
        EtcdCluster::start_with(size, None)
    }

    /// The same, serving clients over https with `pki`'s server certificate and asking
    /// every client for a certificate signed by its CA (`--client-cert-auth`).
    pub fn start_tls(size: usize, pki: &Pki) -> Result<Option<EtcdCluster>, String> {
        EtcdCluster::start_with(size, Some(pki.clone()))
    }

    fn start_with(size: usize, tls: Option<Pki>) -> Result<Option<EtcdCluster>, String> {
        let Some(etcd) = external(&["etcd"], "etcd-server (apt-get install etcd-server)") else {
            return Ok(None);
        };
        let Some(etcdctl) = external(&["etcdctl"], "etcd-client (apt-get install etcd-client)")
        else {
            return Ok(None);
        };
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let unique = format!(
            "leaderq-etcd-{}-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        );
        let dir = std::env::temp_dir().join(&unique);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let members = (0..size)
            .map(|i| Member {
                name: format!("e{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                proc: None,
                tls: tls.is_some(),
            })
            .collect();
        let mut cluster = EtcdCluster {
            etcd,
            etcdctl,
            dir,
            token: unique,
            members,
            tls,
            password_file: None,
        };
        for i in 0..size {
            cluster.spawn(i)?;
        }
        for i in 0..size {
            cluster.wait_serving(i)?;
        }
        Ok(Some(cluster))
    }

    /// The client URLs of every member, in order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// The client URLs of the members not killed.
    pub fn live_endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.proc.is_some())
            .map(Member::client_url)
            .collect()
    }

    /// The member etcd's raft elected leader, as the live members say.
    pub fn leader_member(&self) -> Option<usize> {
        let output = self
            .etcdctl(&self.live_endpoints().join(","))
            .args(["endpoint", "status", "-w", "json"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let statuses: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        let statuses = statuses.as_array()?;
        let leader = statuses
            .iter()
            .find_map(|s| s["Status"]["leader"].as_u64().filter(|l| *l != 0))?;
        let endpoint = statuses.iter().find_map(|s| {
            (s["Status"]["header"]["member_id"].as_u64() == Some(leader))
                .then(|| s["Endpoint"].as_str().map(str::to_string))
                .flatten()
        })?;
        self.members.iter().position(|m| m.client_url() == endpoint)
    }

    /// Runs `etcdctl` with `args` against the live members; its stdout, or why it failed.
    pub fn ctl(&self, args: &[&str]) -> Result<String, String> {
        let output = self
            .etcdctl(&self.live_endpoints().join(","))
            .args(args)
            .output()
            .map_err(|e| format!("cannot run etcdctl: {e}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "etcdctl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// Sends `signal` ("STOP", "CONT", …) to member `i`.
    pub fn signal_member(&self, i: usize, signal: &str) {
        if let Some(proc) = &self.members[i].proc {
            proc.signal(signal);
        }
    }

    /// The data directory of everything this cluster runs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Turns on etcd's authentication with a `root` user whose password is `password`,
    /// kept in a file that [`Cluster::env`] names as `etcd.password_file`.
    pub fn enable_auth(&mut self, password: &str) -> Result<(), String> {
        self.ctl(&["user", "add", &format!("root:{password}")])?;
        self.ctl(&["auth", "enable"])?;
        let file = self.dir.join("root-password");
        std::fs::write(&file, format!("{password}\n"))
            .map_err(|e| format!("{}: {e}", file.display()))?;
        self.password_file = Some(file);
        Ok(())
    }

    /// Changes root's password in etcd (so the old one is refused from now on), then
    /// rewrites the password file.
    pub fn change_password(&self, password: &str) -> Result<(), String> {
        let file = self.password_file.as_ref().ok_or("auth is not enabled")?;
        let mut child = self
            .etcdctl(&self.live_endpoints().join(","))
            .args(["user", "passwd", "root", "--interactive=false"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run etcdctl: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write as _;
            stdin
                .write_all(format!("{password}\n").as_bytes())
                .map_err(|e| e.to_string())?;
        }
        let output = child.wait_with_output().map_err(|e| e.to_string())?;
        if !output.status.success() {
            return Err(format!(
                "etcdctl user passwd failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        std::fs::write(file, format!("{password}\n"))
            .map_err(|e| format!("{}: {e}", file.display()))
    }

    /// Whether `password` is root's password now, as etcd says.
    pub fn password_accepted(&self, password: &str) -> bool {
        let mut command = self.etcdctl_bare(&self.live_endpoints().join(","));
        command
            .arg(format!("--user=root:{password}"))
            .args(["get", "nothing"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command.status().is_ok_and(|s| s.success())
    }

    fn etcdctl(&self, endpoints: &str) -> Command {
        let mut command = self.etcdctl_bare(endpoints);
        if let Some(file) = &self.password_file {
            let password = std::fs::read_to_string(file).unwrap_or_default();
            command.arg(format!("--user=root:{}", password.trim()));
        }
        command
    }

    /// etcdctl on `endpoints`, with the client certificate on a TLS cluster, no user.
    fn etcdctl_bare(&self, endpoints: &str) -> Command {
        let mut command = Command::new(&self.etcdctl);
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .arg("--dial-timeout=2s")
            .arg("--command-timeout=5s");
        if let Some(pki) = &self.tls {
            command
                .arg(format!("--cacert={}", pki.ca.display()))
                .arg(format!("--cert={}", pki.client_cert.display()))
                .arg(format!("--key={}", pki.client_key.display()));
        }
        command
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect();
        let member = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", member.name)))
            .map_err(|e| format!("cannot open the log of {}: {e}", member.name))?;
        let log_err = log
            .try_clone()
            .map_err(|e| format!("cannot open the log of {}: {e}", member.name))?;
        let mut command = Command::new(&self.etcd);
        command
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(self.dir.join(&member.name))
            .arg("--listen-client-urls")
            .arg(member.client_url())
            .arg("--advertise-client-urls")
            .arg(member.client_url())
            .arg("--listen-peer-urls")
            .arg(member.peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(member.peer_url())
            .arg("--initial-cluster")
            .arg(initial.join(","))
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg(&self.token)
            .arg("--heartbeat-interval")
            .arg(HEARTBEAT_MS.to_string())
            .arg("--election-timeout")
            .arg(ELECTION_MS.to_string());
        if let Some(pki) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&pki.server_cert)
                .arg("--key-file")
                .arg(&pki.server_key)
                .arg("--trusted-ca-file")
                .arg(&pki.ca)
                .arg("--client-cert-auth");
        }
        command.stdin(Stdio::null()).stdout(log).stderr(log_err);
        let proc = Proc::spawn(&format!("etcd member {}", member.name), command)?;
        self.members[i].proc = Some(proc);
        Ok(())
    }

    fn wait_serving(&mut self, i: usize) -> Result<(), String> {
        let url = self.members[i].client_url();
        let name = self.members[i].name.clone();
        let mut health = || {
            self.etcdctl(&url)
                .args(["endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        wait_for(
            READY_WITHIN,
            &format!("etcd member {name} serving"),
            &mut health,
        )
        .map_err(|why| {
            let log =
                std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
            let tail: String = log.lines().rev().take(10).collect::<Vec<_>>().join("\n");
            format!("{why}; its log ends with:\n{tail}")
        })
    }
}

impl Cluster for EtcdCluster {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    fn delete_leader_record(&self, leader_key: &str) -> Result<(), String> {
        self.ctl(&["del", "--prefix", &format!("{leader_key}/")])
            .map(drop)
    }

    fn revoke_leader_lease(&self, leader_key: &str) -> Result<bool, String> {
        let out = self.ctl(&["get", "--prefix", &format!("{leader_key}/"), "-w", "json"])?;
        let read: serde_json::Value =
            serde_json::from_str(&out).map_err(|e| format!("{out}: {e}"))?;
        let lease = read["kvs"]
            .as_array()
            .and_then(|kvs| {
                kvs.iter()
                    .min_by_key(|kv| kv["create_revision"].as_u64().unwrap_or(u64::MAX))
            })
            .and_then(|kv| kv["lease"].as_u64())
            .ok_or_else(|| format!("no campaign key holds a lease: {out}"))?;
        self.ctl(&["lease", "revoke", &format!("{lease:x}")])?;
        Ok(true)
    }

    fn client_addrs(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    fn env_at(&self, addrs: &[String]) -> Vec<(String, String)> {
        let mut env = vec![("LEADERQ__COORDINATOR__BACKEND".into(), "etcd".into())];
        if let Some(pki) = &self.tls {
            // etcdctl's own variables, as it reads them.
            let endpoints: Vec<String> =
                addrs.iter().map(|addr| format!("https://{addr}")).collect();
            let path = |p: &Path| p.display().to_string();
            env.extend([
                ("ETCDCTL_ENDPOINTS".into(), endpoints.join(",")),
                ("ETCDCTL_CACERT".into(), path(&pki.ca)),
                ("ETCDCTL_CERT".into(), path(&pki.client_cert)),
                ("ETCDCTL_KEY".into(), path(&pki.client_key)),
            ]);
        } else {
            let endpoints: Vec<String> =
                addrs.iter().map(|addr| format!("http://{addr}")).collect();
            env.push(("LEADERQ__ETCD__ENDPOINTS".into(), endpoints.join(",")));
        }
        if let Some(file) = &self.password_file {
            env.push(("LEADERQ__ETCD__USER".into(), "root".into()));
            env.push((
                "LEADERQ__ETCD__PASSWORD_FILE".into(),
                file.display().to_string(),
            ));
        }
        env
    }

    fn members(&self) -> usize {
        self.members.len()
    }

    fn kill_member(&mut self, i: usize) -> Result<(), String> {
        let member = self
            .members
            .get_mut(i)
            .ok_or_else(|| format!("no etcd member {i}"))?;
        if let Some(mut proc) = member.proc.take() {
            proc.kill();
        }
        Ok(())
    }

    fn restart_member(&mut self, i: usize) -> Result<(), String> {
        if i >= self.members.len() {
            return Err(format!("no etcd member {i}"));
        }
        if self.members[i].proc.is_none() {
            self.spawn(i)?;
        }
        self.wait_serving(i)
    }

    /// Every member started anew as the same initial cluster (`--initial-cluster-state
    /// new`, the same token), which a cluster of any size forms again from empty data dirs.
    fn restart_empty(&mut self) -> Result<(), String> {
        for i in 0..self.members.len() {
            self.kill_member(i)?;
            let data = self.dir.join(&self.members[i].name);
            if data.exists() {
                std::fs::remove_dir_all(&data)
                    .map_err(|e| format!("cannot remove {}: {e}", data.display()))?;
            }
        }
        for i in 0..self.members.len() {
            self.spawn(i)?;
        }
        for i in 0..self.members.len() {
            self.wait_serving(i)?;
        }
        Ok(())
    }

    fn produce(&self, key: &str, value: &[u8]) -> Result<(), String> {
        // Only live members: etcdctl 3.4's balancer may keep trying a dead endpoint until
        // its deadline. A put during an etcd leader election may time out: try again.
        let mut failure = String::new();
        for _ in 0..PRODUCE_ATTEMPTS {
            let output = self
                .etcdctl(&self.live_endpoints().join(","))
                .args(["put", "--", key])
                .arg(String::from_utf8_lossy(value).as_ref())
                .output()
                .map_err(|e| format!("cannot run etcdctl: {e}"))?;
            if output.status.success() {
                return Ok(());
            }
            failure = String::from_utf8_lossy(&output.stderr).trim().to_string();
        }
        Err(format!("etcdctl put {key} failed: {failure}"))
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut proc) = member.proc.take() {
                // A frozen member must be thawed for its SIGKILL to be reaped promptly.
                proc.signal("CONT");
                proc.kill();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
