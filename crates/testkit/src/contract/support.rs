//! What the contract's checks share: error context, a keep-alive loop, leases and
//! leadership at once, tasks read and shown for failure messages.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Subject;
use leaderq::coord::{
    Campaign, CoordError, HolderRecord, Leadership, LeaseId, LeaseSpec, Renewal, StoredTask,
    TaskOp, TaskVersion, Version,
};

/// Adds what was called to a coordinator error.
pub(super) trait Ctx<T> {
    fn ctx(self, call: &str) -> Result<T, String>;
}

impl<T> Ctx<T> for Result<T, CoordError> {
    fn ctx(self, call: &str) -> Result<T, String> {
        self.map_err(|err| format!("{call} failed: {err:?}"))
    }
}

pub(super) fn ensure(holds: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if holds {
        Ok(())
    } else {
        Err(why())
    }
}

/// Keeps a lease alive every quarter TTL until dropped.
pub(super) struct Renewer(JoinHandle<()>);

impl Renewer {
    pub(super) fn start(s: &Subject, lease: &LeaseId) -> Renewer {
        let coord = s.coord.clone();
        let lease = lease.clone();
        let every = s.timing.ttl / 4;
        Renewer(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Ok(Renewal::Gone) = coord.keep_alive(&lease).await {
                    return;
                }
            }
        }))
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(super) fn record(node: &str) -> HolderRecord {
    HolderRecord {
        node: node.to_string(),
        host: "contract".into(),
        pid: std::process::id(),
        session: String::new(),
        since: String::new(),
        floor: None,
    }
}

pub(super) fn spec(
    s: &Subject,
    node: &str,
    takeover_delay: Duration,
    previous: Option<LeaseId>,
) -> LeaseSpec {
    LeaseSpec {
        node_id: node.to_string(),
        ttl: s.timing.ttl,
        takeover_delay,
        previous,
    }
}

pub(super) async fn open(
    s: &Subject,
    node: &str,
    takeover_delay: Duration,
) -> Result<LeaseId, String> {
    let grant = s
        .coord
        .open_lease(&spec(s, node, takeover_delay, None))
        .await
        .ctx("open_lease")?;
    Ok(grant.lease)
}

/// Leadership for `lease`, which must win at once.
pub(super) async fn lead(s: &Subject, lease: &LeaseId, node: &str) -> Result<Leadership, String> {
    match s
        .coord
        .campaign(lease, &record(node))
        .await
        .ctx("campaign")?
    {
        Campaign::Won(leadership) => Ok(leadership),
        other => Err(format!(
            "{node} campaigned for free leadership and heard {other:?}"
        )),
    }
}

/// Waits until `lease` no longer holds leadership, within the expiry bound.
pub(super) async fn wait_until_not_held_by(s: &Subject, lease: &LeaseId) -> Result<(), String> {
    let deadline = Instant::now() + s.timing.expiry;
    let mut version = Version(0);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (holder, moved) = s.coord.observe(version, left).await.ctx("observe")?;
        if holder.lease.as_ref() != Some(lease) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "lease {lease} still leads {:?} after its last keep-alive",
                s.timing.expiry
            ));
        }
        version = moved;
    }
}

pub(super) fn claim(key: &str, version: TaskVersion, value: &[u8]) -> TaskOp {
    TaskOp::Claim {
        key: key.to_string(),
        version,
        value: value.to_vec(),
    }
}

/// Writes a task under the queue prefix; its full key.
pub(super) async fn put(s: &Subject, name: &str, value: &[u8]) -> Result<String, String> {
    let key = format!("{}{name}", s.queue_prefix);
    s.producer.put(&key, value).await.ctx("put")?;
    Ok(key)
}

pub(super) async fn get_one(s: &Subject, key: &str) -> Result<Seen, String> {
    let mut found = get(s, &[key.to_string()]).await?;
    match (found.pop(), found.is_empty()) {
        (Some(task), true) if task.key == key => Ok(task),
        (task, _) => Err(format!("get of {key} gave {task:?} and {found:?}")),
    }
}

pub(super) async fn get(s: &Subject, keys: &[String]) -> Result<Vec<Seen>, String> {
    Ok(seen(s.coord.get(keys).await.ctx("get")?))
}

pub(super) async fn list_now(s: &Subject) -> Result<(Vec<Seen>, Version), String> {
    list(s, &s.queue_prefix).await
}

pub(super) async fn list(s: &Subject, prefix: &str) -> Result<(Vec<Seen>, Version), String> {
    let (tasks, version) = s
        .coord
        .list(prefix, Version(0), Duration::ZERO)
        .await
        .ctx("list")?;
    Ok((seen(tasks), version))
}

/// A task as a check saw it: shown with its value as text, for failure messages.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Seen(StoredTask);

impl std::ops::Deref for Seen {
    type Target = StoredTask;

    fn deref(&self) -> &StoredTask {
        &self.0
    }
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} = {:?} (version {}, created {}, held by {:?})",
            self.key,
            String::from_utf8_lossy(&self.value),
            self.version,
            self.created,
            self.holder.as_ref().map(|lease| lease.0.as_str())
        )
    }
}

pub(super) fn seen(tasks: Vec<StoredTask>) -> Vec<Seen> {
    tasks.into_iter().map(Seen).collect()
}
