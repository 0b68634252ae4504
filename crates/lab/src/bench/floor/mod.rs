//! The protocol's floor: the same backlog drained by a minimal native client of each
//! coordinator, beside `leaderq consume`'s drain on the same server, so the backlog
//! section can say how far leaderq is from what the coordinator itself allows.
//!
//! The minimal protocol, the same on every backend: the client holds leadership as a real
//! leader does (a lease or session, and a leader key held by it), lists the backlog once,
//! then per task compares and marks it taken, then compares and deletes it, 32 tasks per
//! transaction, each transaction guarded by the leadership still being held. A batch's
//! deletes ride in the next batch's transaction, as leaderq's completions do, so a
//! transaction carries 32 marks and 32 deletes. Nothing else: no history, no retries, no
//! orphans, no watch, no claim order beyond the listing's.
//!
//! Also here: what a drain costs each server, read from the server's own counters
//! ([`counters`]), so leaderq's reads and writes per task can be set beside the floor's.
//! One file per backend: `consul.rs` (`leaderq server`'s HTTP API), `etcd.rs` (its JSON
//! gateway), `redis.rs`, `zookeeper.rs`.

mod consul;
mod etcd;
mod redis;
mod zookeeper;

use std::time::Instant;

use anyhow::bail;

use super::consumer::Target;

/// Tasks per guarded transaction: the issue's minimal protocol.
const BATCH: usize = 32;
/// The floor client's leader key: its own, so it never meets a replica's leadership.
const LEADER_KEY: &str = "floorLeader";
/// The queue the bench enqueues into.
const PREFIX: &str = "oracleTask/";
/// The floor client's lease TTL: longer than its longest drain (100k tasks on etcd take
/// over 15 s), so that it never renews. A renewal every few seconds would cost the server
/// nothing a drain shows; ZooKeeper caps the session's timeout at its own maximum, and its
/// client keeps the session alive by itself.
const LEASE_TTL_SECS: u64 = 600;

/// One drain by the floor client.
#[derive(Clone, Copy, Debug)]
pub(super) struct Floor {
    pub drained: usize,
    pub seconds: f64,
}

impl Floor {
    pub fn rate(&self) -> f64 {
        self.drained as f64 / self.seconds.max(1e-9)
    }
}

/// Drains the backlog under `oracleTask/` on `target` with the minimal client of
/// `backend`, timed from its first listing to its last transaction.
pub(super) async fn drain(target: &Target, backend: &str) -> anyhow::Result<Floor> {
    let env = |key: &str| {
        target
            .env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    let missing = |key: &str| anyhow::anyhow!("the {backend} cluster does not name {key}");
    match backend {
        "consul" => {
            let addr = env("CONSUL_HTTP_ADDR").ok_or_else(|| missing("CONSUL_HTTP_ADDR"))?;
            consul::drain(&addr).await
        }
        "etcd" => {
            let endpoints =
                env("LEADERQ__ETCD__ENDPOINTS").ok_or_else(|| missing("its endpoints"))?;
            let first = endpoints.split(',').next().unwrap_or_default().to_string();
            etcd::drain(&first).await
        }
        "redis" => {
            let url = env("LEADERQ__REDIS__URL").ok_or_else(|| missing("its URL"))?;
            let prefix = env("LEADERQ__REDIS__KEY_PREFIX").unwrap_or_default();
            redis::drain(&url, &prefix).await
        }
        "zookeeper" => {
            let connect =
                env("LEADERQ__ZOOKEEPER__CONNECT").ok_or_else(|| missing("its connect string"))?;
            zookeeper::drain(&connect).await
        }
        other => bail!("no floor client for backend {other:?}"),
    }
}

/// A task listed by a floor client: its key, the version a write is conditioned on, and
/// its value as it will be written back, marked taken.
struct Listed<V> {
    key: String,
    version: V,
    marked: Vec<u8>,
}

/// The value with `taskTaken` set, as a claim writes it (the bench's tasks are objects).
fn marked(value: &[u8]) -> Vec<u8> {
    match serde_json::from_slice::<serde_json::Value>(value) {
        Ok(serde_json::Value::Object(mut task)) => {
            task.insert("taskTaken".into(), serde_json::Value::Bool(true));
            serde_json::to_vec(&task).unwrap_or_else(|_| value.to_vec())
        }
        _ => value.to_vec(),
    }
}

/// Times a drain: `run` lists and drains, answering how many tasks it deleted.
async fn timed(
    run: impl std::future::Future<Output = anyhow::Result<usize>>,
) -> anyhow::Result<Floor> {
    let started = Instant::now();
    let drained = run.await?;
    Ok(Floor {
        drained,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// What a server has done so far, by its own counters: reads and writes as it counts
/// them, and its CPU time where it says.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Counters {
    pub reads: f64,
    pub writes: f64,
    pub cpu_seconds: Option<f64>,
}

impl Counters {
    /// What was done between `before` and `self`.
    pub fn since(self, before: Counters) -> Counters {
        Counters {
            reads: (self.reads - before.reads).max(0.0),
            writes: (self.writes - before.writes).max(0.0),
            cpu_seconds: self
                .cpu_seconds
                .zip(before.cpu_seconds)
                .map(|(a, b)| (a - b).max(0.0)),
        }
    }

    pub fn add(self, other: Counters) -> Counters {
        Counters {
            reads: self.reads + other.reads,
            writes: self.writes + other.writes,
            cpu_seconds: self.cpu_seconds.zip(other.cpu_seconds).map(|(a, b)| a + b),
        }
    }

    /// `self` less `times` × `each`, never below zero.
    pub fn less(self, each: Counters, times: f64) -> Counters {
        Counters {
            reads: (self.reads - each.reads * times).max(0.0),
            writes: (self.writes - each.writes * times).max(0.0),
            cpu_seconds: self
                .cpu_seconds
                .zip(each.cpu_seconds)
                .map(|(a, b)| (a - b * times).max(0.0)),
        }
    }

    pub fn scaled(self, by: f64) -> Counters {
        Counters {
            reads: self.reads * by,
            writes: self.writes * by,
            cpu_seconds: self.cpu_seconds.map(|c| c * by),
        }
    }
}

/// What each server counts, in words, for the report.
pub(super) fn counted(backend: &str) -> &'static str {
    match backend {
        "consul" => "HTTP requests: reads = all but /v1/txn, writes = /v1/txn; CPU of the server",
        "etcd" => "mvcc ranges over all members; puts + deletes of one member; CPU of all",
        "redis" => "commandstats calls, scripts' own calls included; CPU of the server",
        "zookeeper" => "mntr read and update requests over all members",
        _ => "",
    }
}

/// The server's counters now, `None` where it exposes none (or they cannot be read).
pub(super) async fn counters(target: &Target, backend: &str) -> Option<Counters> {
    let env = |key: &str| {
        target
            .env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    match backend {
        "consul" => consul::counters(&env("CONSUL_HTTP_ADDR")?).await,
        "etcd" => etcd::counters(&env("LEADERQ__ETCD__ENDPOINTS")?).await,
        "redis" => redis::counters(&env("LEADERQ__REDIS__URL")?).await,
        "zookeeper" => zookeeper::counters(&env("LEADERQ__ZOOKEEPER__CONNECT")?).await,
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A marked value keeps every field and its order, with taskTaken now true.
    #[test]
    fn marking_sets_task_taken_only() {
        let value = br#"{"taskId":"a","taskTaken":false,"taskType":"Bench"}"#;
        assert_eq!(
            marked(value),
            br#"{"taskId":"a","taskTaken":true,"taskType":"Bench"}"#.to_vec()
        );
        assert_eq!(marked(b"not json"), b"not json".to_vec());
    }

    /// A polling cost taken out never leaves a count below zero.
    #[test]
    fn counters_subtract_without_going_negative() {
        let total = Counters {
            reads: 10.0,
            writes: 4.0,
            cpu_seconds: Some(1.0),
        };
        let each = Counters {
            reads: 2.0,
            writes: 0.0,
            cpu_seconds: Some(0.1),
        };
        let left = total.less(each, 6.0);
        assert_eq!(left.reads, 0.0);
        assert_eq!(left.writes, 4.0);
        assert!((left.cpu_seconds.unwrap() - 0.4).abs() < 1e-9);
    }
}
