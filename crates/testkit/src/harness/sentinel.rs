//! Redis behind Sentinel on free loopback ports: a primary and two replicas
//! (`--replicaof`, each with the AOF on, `appendfsync always`) watched by three sentinels
//! (`redis-sentinel`, each with a writable config file of its own, quorum 2, a node taken
//! for down after [`DOWN_AFTER_MS`]), so that a SIGKILL of the primary is followed by a
//! replica's promotion within seconds. Replicas of leaderq are pointed at the sentinels
//! (`redis.sentinels`, `redis.master_name`) and wait for one replica's acknowledgement of
//! every write (`redis.wait_replicas = 1`) unless a test says otherwise. Member `i` is data
//! node `i`; node 0 is the first primary. [`RedisSentinels::start_tls`] runs the data nodes
//! on TLS alone (replicating over TLS, asking every client for a certificate), the sentinels
//! reaching them with the client's certificate, and the sentinels themselves on TLS alone
//! too if asked.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::pki::Pki;
use super::redis::{cli_command, RedisServer, PREFIX};
use super::{external, free_port, wait_for, Cluster, Proc};

/// The name the sentinels monitor the primary under.
pub const MASTER_NAME: &str = "mymaster";

/// How long a node may stay silent before a sentinel takes it for down: short, so that a
/// failover takes seconds.
pub const DOWN_AFTER_MS: u64 = 1000;

/// How long the sentinels may take to know each other and both replicas, and to promote
/// a replica after the primary died.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// Three data nodes and three sentinels, all killed when dropped.
pub struct RedisSentinels {
    nodes: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
    cli: PathBuf,
    /// The certificates of TLS data nodes, and whether the sentinels serve TLS too.
    tls: Option<(Pki, bool)>,
}

struct Sentinel {
    port: u16,
    dir: PathBuf,
    proc: Proc,
}

impl RedisSentinels {
    /// The cluster once every sentinel knows the primary, both replicas and the two other
    /// sentinels; `None` when redis-server, redis-cli or redis-sentinel is not installed
    /// (see [`external`]).
    pub fn start() -> Option<RedisSentinels> {
        RedisSentinels::start_with(None)
    }

    /// The same with the data nodes on TLS alone with `pki`'s certificates (replicating
    /// over TLS, `--tls-auth-clients yes`), and the sentinels on TLS alone too when
    /// `sentinels_tls`.
    pub fn start_tls(pki: &Pki, sentinels_tls: bool) -> Option<RedisSentinels> {
        RedisSentinels::start_with(Some((pki.clone(), sentinels_tls)))
    }

    fn start_with(tls: Option<(Pki, bool)>) -> Option<RedisSentinels> {
        let sentinel_binary = external(
            &["redis-sentinel"],
            "redis-sentinel (apt install redis-sentinel)",
        )?;
        let cli = external(&["redis-cli"], "redis-tools (apt install redis-tools)")?;
        let node = |extra: &[&str]| match &tls {
            None => RedisServer::start_args("always", extra),
            Some((pki, _)) => {
                let extra: Vec<&str> = extra
                    .iter()
                    .copied()
                    .chain(["--tls-replication", "yes"])
                    .collect();
                RedisServer::start_tls_args(pki, &extra)
            }
        };
        let primary = node(&[])?;
        let port = primary.port().to_string();
        let mut nodes = vec![primary];
        for _ in 0..2 {
            nodes.push(node(&["--replicaof", "127.0.0.1", &port])?);
        }
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let dir = std::env::temp_dir().join(format!(
                "leaderq-sentinel-{}-{}",
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::create_dir_all(&dir).expect("create the sentinel's directory");
            let sentinel_port = free_port();
            let conf = dir.join("sentinel.conf");
            let listen = match &tls {
                Some((pki, sentinels_tls)) => {
                    // TLS to the data nodes (and between sentinels serving TLS), with the
                    // client's certificate.
                    let ports = if *sentinels_tls {
                        format!("port 0\ntls-port {sentinel_port}\n")
                    } else {
                        format!("port {sentinel_port}\n")
                    };
                    format!(
                        "{ports}tls-replication yes\ntls-auth-clients yes\n\
                         tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n",
                        pki.server_cert.display(),
                        pki.server_key.display(),
                        pki.ca.display()
                    )
                }
                None => format!("port {sentinel_port}\n"),
            };
            std::fs::write(
                &conf,
                format!(
                    "{listen}bind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                     logfile sentinel.log\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {port} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                     sentinel failover-timeout {MASTER_NAME} 5000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = dir.display()
                ),
            )
            .expect("write the sentinel's config");
            let mut command = Command::new(&sentinel_binary);
            command
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let proc = Proc::spawn("redis-sentinel", command).unwrap_or_else(|why| panic!("{why}"));
            sentinels.push(Sentinel {
                port: sentinel_port,
                dir,
                proc,
            });
        }
        let cluster = RedisSentinels {
            nodes,
            sentinels,
            cli,
            tls,
        };
        let settled = wait_for(SETTLE_LIMIT, "the sentinels know every node", || {
            cluster.sentinels.iter().all(|sentinel| {
                let master =
                    cluster.sentinel_cli(sentinel.port, &["SENTINEL", "MASTER", MASTER_NAME]);
                master.is_ok_and(|text| {
                    field(&text, "num-slaves") == Some("2")
                        && field(&text, "num-other-sentinels") == Some("2")
                })
            }) && cluster.nodes[1..].iter().all(|node| {
                node.cli(&[b"INFO", b"replication"])
                    .is_ok_and(|text| text.contains("master_link_status:up"))
            })
        });
        if let Err(why) = settled {
            panic!("{why}\n{}", cluster.sentinel_logs());
        }
        Some(cluster)
    }

    /// Runs `redis-cli` against the sentinel on `port`; its standard output.
    fn sentinel_cli(&self, port: u16, args: &[&str]) -> Result<String, String> {
        let pki = match &self.tls {
            Some((pki, true)) => Some(pki),
            _ => None,
        };
        let output = cli_command(&self.cli, port, pki)
            .args(args)
            .output()
            .map_err(|e| format!("cannot run redis-cli: {e}"))?;
        let out = String::from_utf8_lossy(&output.stdout).trim().to_string();
        if !output.status.success() || out.starts_with("ERR") {
            return Err(format!("redis-cli {args:?}: {out}"));
        }
        Ok(out)
    }

    /// The data node the sentinels name as the primary now (`None` while none answers).
    pub fn primary(&self) -> Option<usize> {
        let answer = self.sentinels.iter().find_map(|sentinel| {
            self.sentinel_cli(
                sentinel.port,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
            )
            .ok()
        })?;
        let port: u16 = answer.lines().nth(1)?.trim().parse().ok()?;
        self.nodes.iter().position(|node| node.port() == port)
    }

    /// `redis://127.0.0.1:<port>/0` of the primary the sentinels name now.
    pub fn primary_url(&self) -> Result<String, String> {
        self.primary_node().map(RedisServer::url)
    }

    /// Waits until the sentinels name a primary other than node `old`, and that node says
    /// it is one; its index.
    pub fn promoted_other_than(&self, old: usize) -> Result<usize, String> {
        let mut found = None;
        wait_for(SETTLE_LIMIT, "a replica promoted", || {
            found = self.primary().filter(|&i| {
                i != old
                    && self.nodes[i]
                        .cli(&[b"ROLE"])
                        .is_ok_and(|role| role.starts_with("master"))
            });
            found.is_some()
        })
        .map_err(|why| format!("{why}\n{}", self.sentinel_logs()))?;
        found.ok_or_else(|| "no primary".to_string())
    }

    /// Sends `signal` ("STOP", "CONT", …) to data node `i`.
    pub fn signal_member(&self, i: usize, signal: &str) {
        self.nodes[i].signal(signal);
    }

    /// Runs `redis-cli` against data node `i`; its standard output.
    pub fn cli_of(&self, i: usize, args: &[&[u8]]) -> Result<String, String> {
        self.nodes[i].cli(args)
    }

    /// Asks a sentinel for a failover with the primary alive (`SENTINEL FAILOVER`): a
    /// replica is promoted, and the old primary demoted, its clients disconnected.
    pub fn failover(&self) -> Result<(), String> {
        let sentinel = self.sentinels.first().ok_or("no sentinel")?;
        self.sentinel_cli(sentinel.port, &["SENTINEL", "FAILOVER", MASTER_NAME])
            .map(drop)
    }

    /// Waits until every data node but `down` replicates from node `primary` with its link
    /// up, and every sentinel knows that many replicas of it.
    pub fn replicating(&self, primary: usize, down: usize) -> Result<(), String> {
        let port = format!("master_port:{}", self.nodes[primary].port());
        wait_for(SETTLE_LIMIT, "the replicas follow the primary", || {
            self.nodes.iter().enumerate().all(|(i, node)| {
                i == primary
                    || i == down
                    || node.cli(&[b"INFO", b"replication"]).is_ok_and(|text| {
                        text.contains(&port) && text.contains("master_link_status:up")
                    })
            })
        })
        .map_err(|why| format!("{why}\n{}", self.sentinel_logs()))
    }

    /// Every sentinel's log, for a failure's message.
    pub fn sentinel_logs(&self) -> String {
        self.sentinels
            .iter()
            .map(|s| {
                let log = std::fs::read_to_string(s.dir.join("sentinel.log")).unwrap_or_default();
                format!("---- sentinel {}\n{log}", s.port)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn primary_node(&self) -> Result<&RedisServer, String> {
        let i = self.primary().ok_or("the sentinels name no primary")?;
        Ok(&self.nodes[i])
    }
}

/// The value of `name` in a `SENTINEL MASTER` answer as redis-cli prints it: one line
/// per name, then one per value.
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let mut lines = text.lines().map(str::trim);
    lines.find(|line| *line == name)?;
    lines.next()
}

impl Cluster for RedisSentinels {
    fn backend(&self) -> &'static str {
        "redis"
    }

    /// The sentinels' addresses: what leaderq is given.
    fn client_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect()
    }

    fn env_at(&self, addrs: &[String]) -> Vec<(String, String)> {
        let mut env = vec![
            ("LEADERQ__COORDINATOR__BACKEND".into(), "redis".into()),
            ("LEADERQ__REDIS__SENTINELS".into(), addrs.join(",")),
            ("LEADERQ__REDIS__MASTER_NAME".into(), MASTER_NAME.into()),
            ("LEADERQ__REDIS__KEY_PREFIX".into(), PREFIX.into()),
            ("LEADERQ__REDIS__WAIT_REPLICAS".into(), "1".into()),
            ("LEADERQ__REDIS__WAIT_REPLICAS_TIMEOUT".into(), "2s".into()),
        ];
        if let Some((pki, sentinels_tls)) = &self.tls {
            for (key, file) in [
                ("CA_FILE", &pki.ca),
                ("CERT_FILE", &pki.client_cert),
                ("KEY_FILE", &pki.client_key),
            ] {
                env.push((format!("LEADERQ__REDIS__{key}"), file.display().to_string()));
            }
            env.push((
                "LEADERQ__REDIS__SENTINEL_TLS".into(),
                sentinels_tls.to_string(),
            ));
        }
        env
    }

    fn members(&self) -> usize {
        self.nodes.len()
    }

    fn kill_member(&mut self, i: usize) -> Result<(), String> {
        self.nodes[i].kill_member(0)
    }

    fn restart_member(&mut self, i: usize) -> Result<(), String> {
        self.nodes[i].restart_member(0)
    }

    fn restart_empty(&mut self) -> Result<(), String> {
        Err("a Sentinel cluster is not restarted empty: its replicas would copy nothing".into())
    }

    /// The documented Redis command on the primary now, with no replica's acknowledgement.
    fn produce(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.primary_node()?.produce(key, value)
    }

    fn delete_leader_record(&self, leader_key: &str) -> Result<(), String> {
        self.primary_node()?.delete_leader_record(leader_key)
    }

    fn revoke_leader_lease(&self, leader_key: &str) -> Result<bool, String> {
        self.primary_node()?.revoke_leader_lease(leader_key)
    }
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for sentinel in &mut self.sentinels {
            sentinel.proc.kill();
            let _ = std::fs::remove_dir_all(&sentinel.dir);
        }
    }
}
