//! The queue as a whole: `leaderq status` (leader, fencing token, queue depth by state, dead
//! letters, the replicas with their last heartbeat) and its text, and `leaderq
//! pause|resume` (the queue's pause flag, a key of its own in the coordinator). The
//! dashboard's overview builds the same [`StatusReport`] from its own reads
//! ([`status_of`]). Who led before is `leadership.rs`'s.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};

use super::waits::Limits;
use super::{list_now, OperateError};
use crate::config::{ElectionSettings, QueueSettings};
use crate::coord::{Coordinator, Edit, Edited, FencingToken, Holder, StoredTask, Version};
use crate::leader::replicas::ReplicaView;
use crate::task::{Status, Task};
use crate::util::duration::format_age;
use crate::util::escape::escape;

#[derive(Clone, Debug, Default, Serialize)]
pub struct StatusReport {
    pub leader: Option<Value>,
    pub fencing_token: Option<FencingToken>,
    pub pending: usize,
    /// Waiting for a retry's backoff (`notBefore`).
    pub delayed: usize,
    /// Waiting for the time their producer set (`runAt`).
    pub scheduled: usize,
    /// When the first scheduled task is due (RFC 3339).
    pub next_due: Option<String>,
    pub in_flight: usize,
    /// Marked taken by leaderq, but no session holds them: requeued by the next leader.
    pub orphaned: usize,
    pub foreign: usize,
    pub malformed: usize,
    pub dead: usize,
    /// `leaderq pause` is in effect: the leader claims nothing.
    pub paused: bool,
    /// Task types paused on their own (`leaderq pause --type T`): none of their tasks
    /// starts, the others' do.
    pub paused_types: Vec<String>,
    /// How many queued tasks wait for what (`waits.rs`): capped, group busy, paused, …
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub waiting: BTreeMap<String, usize>,
    /// Every replica's record: the leader, standbys with their last heartbeat, the gone.
    pub replicas: Vec<ReplicaView>,
    /// A split queue's shards (`election.shards`), each with its leader and backlog.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardView>,
}

/// One shard of a split queue, as `status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardView {
    pub shard: u32,
    /// The node leading it, as the live replicas' records say; `None`: no leader now.
    pub leader: Option<String>,
    pub fencing_token: Option<FencingToken>,
    /// Its tasks waiting to run now.
    pub pending: usize,
    /// Its tasks running.
    pub in_flight: usize,
}

/// The `shards` shards of a queue holding `tasks`, led as the live `replicas` say.
pub fn shard_views(
    shards: u32,
    replicas: &[ReplicaView],
    tasks: &[StoredTask],
    now: DateTime<Utc>,
) -> Vec<ShardView> {
    let mut views: Vec<ShardView> = (0..shards)
        .map(|shard| ShardView {
            shard,
            ..ShardView::default()
        })
        .collect();
    for replica in replicas.iter().filter(|replica| replica.status != "gone") {
        for led in &replica.record.led_shards {
            if let Some(view) = views.get_mut(led.shard as usize) {
                view.leader = Some(replica.record.node.clone());
                view.fencing_token = Some(led.fencing_token);
            }
        }
    }
    for stored in tasks {
        let Ok(task) = Task::parse(stored) else {
            continue;
        };
        let shard = crate::task::shard::shard_of(&stored.key, task.group(), shards);
        let Some(view) = views.get_mut(shard as usize) else {
            continue;
        };
        match task.status(now) {
            Status::Pending => view.pending += 1,
            Status::InFlight => view.in_flight += 1,
            _ => {}
        }
    }
    views
}

/// Every replica's record, as of now: the leader first, then standbys, then those gone
/// (no heartbeat for `replicas::GONE_AFTER` periods).
pub async fn replicas(
    coord: &dyn Coordinator,
    election: &ElectionSettings,
) -> Result<Vec<ReplicaView>, OperateError> {
    use crate::leader::replicas;
    let stored = list_now(coord, &replicas::prefix(&election.leader_key)).await?;
    Ok(replicas::view(&stored, Utc::now()))
}

/// `leaderq status`: the holder, the queue, the dead letters, the pause flag and the
/// replicas, read now.
pub async fn status(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    election: &ElectionSettings,
) -> Result<StatusReport, OperateError> {
    status_under(coord, queue, election, &Limits::default()).await
}

/// [`status`], with how many queued tasks wait for what under `limits` (`waits.rs`).
pub async fn status_under(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    election: &ElectionSettings,
    limits: &Limits,
) -> Result<StatusReport, OperateError> {
    let (holder, _) = coord.observe(Version(0), std::time::Duration::ZERO).await?;
    let tasks = list_now(coord, &queue.prefix).await?;
    let dead = list_now(coord, &queue.dead_prefix).await?.len();
    let paused = paused(coord, queue).await?;
    let now = Utc::now();
    let mut report = status_of(&holder, &tasks, dead, paused, now);
    report.replicas = replicas(coord, election).await?;
    if election.shards > 1 {
        report.shards = shard_views(election.shards, &report.replicas, &tasks, now);
    }
    report.paused_types = paused_types(coord, queue).await?;
    let mut rows = super::tasks::task_rows(tasks, Vec::new(), now);
    let mut limits = limits.clone();
    limits.read_rates(coord, &queue.prefix, now).await;
    super::waits::explain(&mut rows, &limits, paused, &report.paused_types);
    report.waiting = super::waits::counts(&rows);
    Ok(report)
}

/// The status from what was read: the holder, the queue, the number of dead letters and
/// the pause flag (the dashboard builds it from its own reads).
pub fn status_of(
    holder: &Holder,
    tasks: &[StoredTask],
    dead: usize,
    paused: bool,
    now: DateTime<Utc>,
) -> StatusReport {
    let mut report = StatusReport::default();
    if let Some(lease) = &holder.lease {
        report.leader = Some(match &holder.record {
            Some(record) => serde_json::to_value(record).unwrap_or_default(),
            None => json!({ "session": lease.0 }),
        });
        report.fencing_token = Some(holder.token);
    }
    let mut next_due: Option<DateTime<Utc>> = None;
    for stored in tasks {
        match Task::parse(stored).map(|task| task.status(now)) {
            Ok(Status::Pending) => report.pending += 1,
            Ok(Status::Delayed(_)) => report.delayed += 1,
            Ok(Status::Scheduled(at)) => {
                report.scheduled += 1;
                next_due = Some(next_due.map_or(at, |due| due.min(at)));
            }
            Ok(Status::InFlight) => report.in_flight += 1,
            Ok(Status::Orphan) => report.orphaned += 1,
            Ok(Status::Foreign) => report.foreign += 1,
            Err(_) => report.malformed += 1,
        }
    }
    report.next_due = next_due.map(crate::task::rfc3339);
    report.dead = dead;
    report.paused = paused;
    report
}

/// What `leaderq status` prints: one line per count, then the replicas.
pub fn render(report: &StatusReport, now: DateTime<Utc>) -> String {
    let mut lines = Vec::new();
    // The holder value is written by whoever holds the key: shown escaped.
    let field =
        |leader: &Value, name: &str| escape(leader[name].as_str().unwrap_or("?")).into_owned();
    lines.push(match &report.leader {
        Some(leader) => format!(
            "leader:        {} (session {}, since {})",
            field(leader, "node"),
            field(leader, "session"),
            field(leader, "since")
        ),
        None => "leader:        none".to_string(),
    });
    if let Some(token) = report.fencing_token {
        lines.push(format!("fencing token: {token}"));
    }
    lines.push(format!("pending:       {}", report.pending));
    lines.push(format!("delayed:       {}", report.delayed));
    lines.push(match &report.next_due {
        Some(due) => {
            let due_in = DateTime::parse_from_rfc3339(due)
                .map(|at| format_age((now - at.to_utc()).num_seconds()))
                .unwrap_or_default();
            format!(
                "scheduled:     {} (next due {due}, {due_in})",
                report.scheduled
            )
        }
        None => format!("scheduled:     {}", report.scheduled),
    });
    lines.push(format!("in flight:     {}", report.in_flight));
    lines.push(format!("orphaned:      {}", report.orphaned));
    lines.push(format!("foreign:       {}", report.foreign));
    lines.push(format!("malformed:     {}", report.malformed));
    lines.push(format!("dead letters:  {}", report.dead));
    if report.paused {
        lines.push("paused:        yes (leaderq resume)".to_string());
    }
    if !report.paused_types.is_empty() {
        let types: Vec<String> = report
            .paused_types
            .iter()
            .map(|t| escape(t).into_owned())
            .collect();
        lines.push(format!(
            "paused types:  {} (leaderq resume --type T)",
            types.join(", ")
        ));
    }
    if !report.waiting.is_empty() {
        let waiting: Vec<String> = report
            .waiting
            .iter()
            .map(|(why, n)| format!("{n} {why}"))
            .collect();
        lines.push(format!("waiting for:   {}", waiting.join(", ")));
    }
    if !report.shards.is_empty() {
        lines.push(format!("shards:        {}", report.shards.len()));
        for shard in &report.shards {
            let leader = match (&shard.leader, shard.fencing_token) {
                (Some(node), Some(token)) => format!("{} (fencing token {token})", escape(node)),
                _ => "no leader".to_string(),
            };
            lines.push(format!(
                "  {:>3}  {leader}, {} pending, {} running",
                shard.shard, shard.pending, shard.in_flight
            ));
        }
    }
    if !report.replicas.is_empty() {
        lines.push("replicas:".to_string());
        for replica in &report.replicas {
            let token = replica
                .record
                .fencing_token
                .map(|t| format!(", fencing token {t}"))
                .unwrap_or_default();
            let led: Vec<String> = replica
                .record
                .led_shards
                .iter()
                .map(|led| led.shard.to_string())
                .collect();
            let token = if led.is_empty() {
                token
            } else {
                format!(", shards {}", led.join(","))
            };
            lines.push(format!(
                "  {:<8} {} (pid {} on {}{token}), last heartbeat {}s ago",
                replica.status,
                escape(&replica.record.node),
                replica.record.pid,
                escape(&replica.record.host),
                replica.last_seen_seconds
            ));
        }
    }
    lines.join("\n")
}

/// `leaderq pause`: sets the queue's pause flag (a key of its own in the coordinator, so it
/// outlives a failover). The leader finishes the run in progress and claims nothing more
/// until `resume`. Answers whether it was already paused.
pub async fn pause(coord: &dyn Coordinator, queue: &QueueSettings) -> Result<bool, OperateError> {
    set_flag(coord, crate::queue::pause_key(&queue.prefix)).await
}

/// `leaderq resume`: clears the pause flag. Answers whether the queue was paused.
pub async fn resume(coord: &dyn Coordinator, queue: &QueueSettings) -> Result<bool, OperateError> {
    clear_flag(coord, crate::queue::pause_key(&queue.prefix)).await
}

/// The key of `task_type`'s pause flag, or why that type cannot be paused alone.
fn type_key(queue: &QueueSettings, task_type: &str) -> Result<String, OperateError> {
    crate::queue::paused_type_key(&queue.prefix, task_type).map_err(|reason| {
        OperateError::InvalidId {
            what: "--type".into(),
            value: task_type.to_string(),
            reason,
        }
    })
}

/// `leaderq pause --type T`: sets `task_type`'s pause flag, kept in the coordinator like
/// the queue's. Its runs in progress finish; none of its tasks starts until `resume --type`,
/// while the other types' do. Answers whether it was paused already.
pub async fn pause_type(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    task_type: &str,
) -> Result<bool, OperateError> {
    set_flag(coord, type_key(queue, task_type)?).await
}

/// `leaderq resume --type T`: clears `task_type`'s pause flag. Answers whether it was
/// paused.
pub async fn resume_type(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
    task_type: &str,
) -> Result<bool, OperateError> {
    clear_flag(coord, type_key(queue, task_type)?).await
}

/// Whether the queue is paused (`leaderq pause`).
pub async fn paused(coord: &dyn Coordinator, queue: &QueueSettings) -> Result<bool, OperateError> {
    let flag = coord.get(&[crate::queue::pause_key(&queue.prefix)]).await?;
    Ok(!flag.is_empty())
}

/// The task types paused on their own, by name.
pub async fn paused_types(
    coord: &dyn Coordinator,
    queue: &QueueSettings,
) -> Result<Vec<String>, OperateError> {
    let prefix = crate::queue::paused_types_prefix(&queue.prefix);
    let (names, _) = coord.keys(&prefix).await?;
    let mut types: Vec<String> = crate::queue::paused_type_names(&prefix, names.iter()).collect();
    types.sort();
    Ok(types)
}

/// Creates a pause flag at `key`, saying when and from where. Answers whether it was set
/// already.
async fn set_flag(coord: &dyn Coordinator, key: String) -> Result<bool, OperateError> {
    let value = serde_json::to_vec(&json!({
        "pausedAt": crate::task::rfc3339(Utc::now()),
        "by": crate::util::hostname(),
    }))
    .expect("a JSON object serializes");
    match coord.edit(&[Edit::Create { key, value }]).await? {
        Edited::Done => Ok(false),
        Edited::Conflict(_) => Ok(true),
    }
}

/// Deletes the pause flag at `key`. Answers whether it was set.
async fn clear_flag(coord: &dyn Coordinator, key: String) -> Result<bool, OperateError> {
    for _ in 0..5 {
        let Some(flag) = coord.get(std::slice::from_ref(&key)).await?.pop() else {
            return Ok(false);
        };
        let delete = [Edit::Delete {
            key: flag.key,
            version: flag.version,
        }];
        if coord.edit(&delete).await? == Edited::Done {
            return Ok(true);
        }
    }
    Err(OperateError::Conflict {
        key,
        reason: "the pause flag kept changing while resuming; try again".into(),
    })
}

/// What `leaderq pause` prints, from whether the queue under `prefix` was paused already.
pub fn render_paused(prefix: &str, already: bool) -> String {
    format!(
        "{} {}: the leader finishes the run in progress and claims nothing more until `leaderq resume`",
        escape(prefix),
        if already { "was paused already" } else { "paused" }
    )
}

/// What `leaderq resume` prints, from whether the queue under `prefix` was paused.
pub fn render_resumed(prefix: &str, was_paused: bool) -> String {
    format!(
        "{} {}",
        escape(prefix),
        if was_paused {
            "resumed"
        } else {
            "was not paused"
        }
    )
}

/// What `leaderq pause --type T` prints, from whether `task_type` was paused already.
pub fn render_type_paused(task_type: &str, already: bool) -> String {
    format!(
        "type {} {}: its runs in progress finish, and none of its tasks starts until `leaderq resume --type`; other types go on",
        escape(task_type),
        if already { "was paused already" } else { "paused" }
    )
}

/// What `leaderq resume --type T` prints, from whether `task_type` was paused.
pub fn render_type_resumed(task_type: &str, was_paused: bool) -> String {
    format!(
        "type {} {}",
        escape(task_type),
        if was_paused {
            "resumed"
        } else {
            "was not paused"
        }
    )
}
