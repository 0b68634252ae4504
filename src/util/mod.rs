//! Small pieces every part of leaderq uses and none owns.
//!
//! - `duration`: Go's duration syntax (`15s`, `1m30s`), as Consul reads and writes it.
//! - [`escape`]: stored text made safe for one log line or a terminal.
//! - [`reload`]: values built from files an operator rewrites in place (tokens, passwords).
//! - [`tls`]: the TLS files a coordinator's section names, checked and loaded.
//! - [`hostname`]: this machine's name, for node ids and holder records.

pub mod duration;
pub mod escape;
pub mod rate;
pub mod reload;
pub mod tls;

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "leaderq".to_string())
}
