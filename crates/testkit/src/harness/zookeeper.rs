//! A real ZooKeeper ensemble on loopback for tests, bench and chaos: N `QuorumPeerMain`
//! JVMs (Debian's `zookeeper` package), each with its own data dir and ports under one
//! temporary directory, removed when the ensemble is dropped.
//!
//! `tickTime` is 500 ms, so sessions from 1 s are granted and a member's loss is noticed
//! within a second or two; `maxSessionTimeout` is raised to 60 s so that leaderq's default
//! `lease_ttl` (10 s) and longer ones work on it too, as on a production ensemble. A member is ready when it answers the four-letter word
//! `srvr` with its `Mode:` (leader, follower or standalone). Producers write as ZooKeeper
//! users do, with `zkCli.sh create`.
//!
//! [`Ensemble::start_tls`] also serves a secure client port on each member (Netty, the
//! test [`Pki`]'s server certificate in PEM, `ssl.clientAuth=need`: every client presents
//! a certificate its CA signed); the connect string the replicas get names those ports,
//! while the harness's own zkCli and four-letter words keep the plain one.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::pki::Pki;
use super::{external, free_port, wait_for, Cluster, Proc};

/// A member's TLS lines: the secure client port on Netty, its certificate and key in one
/// PEM file, the CA it trusts, and a client certificate required.
fn secure_config(pki: &Pki, dir: &Path, port: u16) -> Result<String, String> {
    let read = |path: &Path| std::fs::read_to_string(path).map_err(|e| e.to_string());
    let bundle = dir.join("server-bundle.pem");
    let pem = format!("{}\n{}", read(&pki.server_cert)?, read(&pki.server_key)?);
    std::fs::write(&bundle, pem).map_err(|e| e.to_string())?;
    Ok(format!(
        "secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n\
         serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
         ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
         ssl.trustStore.location={}\nssl.trustStore.type=PEM\nssl.clientAuth=need\n",
        bundle.display(),
        pki.ca.display()
    ))
}

/// The server's classes; the package's example config dir comes first for log4j.properties.
const JAR: &str = "/usr/share/java/zookeeper.jar";
/// Netty's codec and resolver too: the jar's manifest leaves them out, and the Netty
/// connection factory a secure client port needs fails on its first client without them.
const CLASSPATH: &str = "/etc/zookeeper/conf_example:/usr/share/java/zookeeper.jar:\
                         /usr/share/java/netty-codec.jar:/usr/share/java/netty-resolver.jar";
const ZKCLI: &str = "/usr/share/zookeeper/bin/zkCli.sh";
const INSTALL: &str = "the zookeeper package (apt-get install zookeeper)";

/// How long the members may take to start and elect a leader: a JVM start costs a second or
/// two per member on a loaded machine, the election a few ticks.
const START_LIMIT: Duration = Duration::from_secs(90);

/// JVM flags for a small, fast-starting test server.
const JVM_FLAGS: &[&str] = &[
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Dzookeeper.root.logger=INFO,CONSOLE",
    "-Dzookeeper.admin.enableServer=false",
];

struct Member {
    id: usize,
    client_port: u16,
    /// The TLS client port, on an ensemble started with TLS.
    secure_port: Option<u16>,
    dir: PathBuf,
    proc: Option<Proc>,
}

/// A running ensemble; every member is killed and the directory removed when dropped.
pub struct Ensemble {
    root: PathBuf,
    members: Vec<Member>,
    java: PathBuf,
    /// The chroot every `env()` connect string and `produce` use ("" for none).
    chroot: String,
}

impl Ensemble {
    /// Starts `size` members and waits until each serves; `None` (after one line saying what
    /// to install) when ZooKeeper or Java is missing.
    pub fn start(size: usize) -> Option<Result<Ensemble, String>> {
        let java = external(&["java"], INSTALL)?;
        external(&[JAR], INSTALL)?;
        // Its ports are picked free, then bound by the JVM a moment later: another test may
        // take one in between, and the member never serves. A second try, on new ports,
        // tells that race from a ZooKeeper that cannot start.
        Some(
            Ensemble::start_with(java.clone(), size, None).or_else(|first| {
                Ensemble::start_with(java, size, None)
                    .map_err(|second| format!("{second} (and on a first try: {first})"))
            }),
        )
    }

    /// The same, each member also serving TLS clients on a secure port with `pki`'s server
    /// certificate and asking every client for one its CA signed; the replicas' connect
    /// string names the secure ports (their settings must give the certificates).
    pub fn start_tls(size: usize, pki: &Pki) -> Option<Result<Ensemble, String>> {
        let java = external(&["java"], INSTALL)?;
        external(&[JAR], INSTALL)?;
        Some(
            Ensemble::start_with(java.clone(), size, Some(pki)).or_else(|first| {
                Ensemble::start_with(java, size, Some(pki))
                    .map_err(|second| format!("{second} (and on a first try: {first})"))
            }),
        )
    }

    fn start_with(java: PathBuf, size: usize, tls: Option<&Pki>) -> Result<Ensemble, String> {
        let root = std::env::temp_dir().join(format!(
            "leaderq-zk-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let ports: Vec<(u16, u16, u16)> = (0..size)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let servers: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer, election))| {
                format!("server.{}=127.0.0.1:{peer}:{election}\n", i + 1)
            })
            .collect();
        let mut members = Vec::new();
        for (i, (client_port, _, _)) in ports.iter().enumerate() {
            let id = i + 1;
            let dir = root.join(format!("member-{id}"));
            std::fs::create_dir_all(dir.join("data")).map_err(|e| e.to_string())?;
            std::fs::write(dir.join("data/myid"), format!("{id}\n")).map_err(|e| e.to_string())?;
            let mut config = format!(
                "tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={client_port}\n\
                 clientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=*\n\
                 maxClientCnxns=0\nmaxSessionTimeout=60000\n{servers}",
                dir.join("data").display()
            );
            let secure_port = match tls {
                Some(pki) => {
                    let port = free_port();
                    config.push_str(&secure_config(pki, &dir, port)?);
                    Some(port)
                }
                None => None,
            };
            std::fs::write(dir.join("zoo.cfg"), config).map_err(|e| e.to_string())?;
            members.push(Member {
                id,
                client_port: *client_port,
                secure_port,
                dir,
                proc: None,
            });
        }
        let mut ensemble = Ensemble {
            root,
            members,
            java,
            chroot: String::new(),
        };
        for i in 0..size {
            ensemble.spawn(i)?;
        }
        for i in 0..size {
            ensemble.wait_serving(i)?;
        }
        Ok(ensemble)
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let member = &mut self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(member.dir.join("server.log"))
            .map_err(|e| e.to_string())?;
        let mut command = Command::new(&self.java);
        command
            .args(JVM_FLAGS)
            .arg(format!("-Dzookeeper.log.dir={}", member.dir.display()))
            .args([
                "-cp",
                CLASSPATH,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            ])
            .arg(member.dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        member.proc = Some(Proc::spawn(
            &format!("zookeeper member {}", member.id),
            command,
        )?);
        Ok(())
    }

    fn wait_serving(&self, i: usize) -> Result<(), String> {
        let port = self.members[i].client_port;
        wait_for(
            START_LIMIT,
            &format!("zookeeper member {} serving", i + 1),
            || four_letter(port, "srvr").is_some_and(|answer| answer.contains("Mode: ")),
        )
        .map_err(|why| format!("{why}; its log: {}", self.log_tail(i)))
    }

    fn log_tail(&self, i: usize) -> String {
        let log =
            std::fs::read_to_string(self.members[i].dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The same ensemble, with every connect string under `chroot` (e.g. "/test-a"), which
    /// is created here as a ZooKeeper user would.
    pub fn with_chroot(mut self, chroot: &str) -> Result<Ensemble, String> {
        self.chroot = String::new();
        self.zkcli(&["create", chroot]).or_else(|why| {
            if why.contains("already exists") {
                Ok(String::new())
            } else {
                Err(why)
            }
        })?;
        self.chroot = chroot.to_string();
        Ok(self)
    }

    /// The connect string of every member (with the chroot, if one was set).
    pub fn connect(&self) -> String {
        format!("{}{}", self.client_addrs().join(","), self.chroot)
    }

    /// The connect string with `chroot` instead of the ensemble's own.
    pub fn connect_under(&self, chroot: &str) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        format!("{}{chroot}", hosts.join(","))
    }

    /// The index of the member the ensemble elected leader, if one answers so.
    pub fn leader(&self) -> Option<usize> {
        self.members.iter().position(|m| {
            four_letter(m.client_port, "srvr").is_some_and(|a| a.contains("Mode: leader"))
        })
    }

    /// Runs `zkCli.sh` against the first serving member, with paths under the chroot; its
    /// output, or why it failed.
    pub fn zkcli(&self, args: &[&str]) -> Result<String, String> {
        let member = self
            .members
            .iter()
            .find(|m| four_letter(m.client_port, "ruok").is_some())
            .ok_or("no zookeeper member serves")?;
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        if let Some(path) = args.get_mut(1) {
            if path.starts_with('/') {
                *path = format!("{}{path}", self.chroot);
                if path.len() > 1 && path.ends_with('/') {
                    path.pop();
                }
            }
        }
        let output = Command::new(ZKCLI)
            .arg("-server")
            .arg(format!("127.0.0.1:{}", member.client_port))
            .args(&args)
            .env("JVMFLAGS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {ZKCLI}: {e}"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let failed = [
            "Node already exists",
            "Node does not exist",
            "Exception",
            "KeeperErrorCode",
        ]
        .iter()
        .find(|needle| text.contains(*needle));
        match failed {
            Some(why) if why.starts_with("Node already") => {
                Err(format!("already exists: {}", args.join(" ")))
            }
            Some(_) => Err(format!("zkCli.sh {}: {text}", args.join(" "))),
            None if output.status.success() => Ok(text),
            None => Err(format!("zkCli.sh {} failed: {text}", args.join(" "))),
        }
    }

    /// The root of the members' directories (logs are `member-N/server.log`).
    pub fn dir(&self) -> &Path {
        &self.root
    }
}

/// Sends a four-letter word and reads the answer; `None` if the member does not answer.
pub fn four_letter(port: u16, word: &str) -> Option<String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(word.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    (!answer.is_empty()).then_some(answer)
}

impl Cluster for Ensemble {
    fn backend(&self) -> &'static str {
        "zookeeper"
    }

    fn delete_leader_record(&self, leader_key: &str) -> Result<(), String> {
        let listing = self.zkcli(&["ls", &format!("/{leader_key}")])?;
        // The leader is the latch with the lowest sequence (its name's last 10 digits).
        let latch = listing
            .lines()
            .filter(|line| line.starts_with('['))
            .flat_map(|line| line.trim_matches(|c| c == '[' || c == ']').split(", "))
            .filter(|name| name.starts_with("latch-"))
            .min_by_key(|name| name.rsplit('-').next().unwrap_or_default().to_string())
            .ok_or_else(|| format!("no latch under /{leader_key}: {listing}"))?
            .to_string();
        self.zkcli(&["delete", &format!("/{leader_key}/{latch}")])
            .map(drop)
    }

    fn revoke_leader_lease(&self, _leader_key: &str) -> Result<bool, String> {
        Ok(false)
    }

    fn client_addrs(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.secure_port.unwrap_or(m.client_port)))
            .collect()
    }

    fn env_at(&self, addrs: &[String]) -> Vec<(String, String)> {
        vec![
            ("LEADERQ__COORDINATOR__BACKEND".into(), "zookeeper".into()),
            (
                "LEADERQ__ZOOKEEPER__CONNECT".into(),
                format!("{}{}", addrs.join(","), self.chroot),
            ),
        ]
    }

    fn members(&self) -> usize {
        self.members.len()
    }

    fn kill_member(&mut self, i: usize) -> Result<(), String> {
        if let Some(mut proc) = self.members.get_mut(i).ok_or("no such member")?.proc.take() {
            proc.kill();
        }
        Ok(())
    }

    fn restart_member(&mut self, i: usize) -> Result<(), String> {
        self.kill_member(i)?;
        self.spawn(i)?;
        self.wait_serving(i)
    }

    /// Every member's data dir emptied but for its `myid`; the members elect a leader anew,
    /// and zxids start again from the first epoch.
    fn restart_empty(&mut self) -> Result<(), String> {
        for i in 0..self.members.len() {
            self.kill_member(i)?;
            let member = &self.members[i];
            let data = member.dir.join("data");
            std::fs::remove_dir_all(&data)
                .and_then(|()| std::fs::create_dir_all(&data))
                .and_then(|()| std::fs::write(data.join("myid"), format!("{}\n", member.id)))
                .map_err(|e| format!("cannot empty {}: {e}", data.display()))?;
        }
        for i in 0..self.members.len() {
            self.spawn(i)?;
        }
        for i in 0..self.members.len() {
            self.wait_serving(i)?;
        }
        Ok(())
    }

    /// `zkCli.sh create` (the parent must exist, as for any ZooKeeper producer), or `set`
    /// when the task is there already.
    fn produce(&self, key: &str, value: &[u8]) -> Result<(), String> {
        let path = format!("/{key}");
        let value = String::from_utf8_lossy(value);
        match self.zkcli(&["create", &path, &value]) {
            Ok(_) => Ok(()),
            Err(why) if why.starts_with("already exists") => {
                self.zkcli(&["set", &path, &value]).map(drop)
            }
            Err(why) => Err(why),
        }
    }
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        for member in &mut self.members {
            member.proc.take();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
