//! What operators see of a replica: Prometheus metrics and the `/metrics`, `/health`,
//! `/ready` and `/leader` endpoints served on `[observe] listen`.
//!
//! The consumer's components record into `Metrics`; this module owns the names, the label
//! sets (bounded: task types outside the configured ones count as "other") and the HTTP
//! endpoints. It decides nothing about the queue or the election.

pub mod logging;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use serde_json::json;

use crate::coord::{Coordinator, FencingToken, Version};

/// The label of task types that are not configured, so label count stays bounded.
const OTHER_TASK_TYPE: &str = "other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabels {
    pub task_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    pub shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardStateLabels {
    pub shard: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

/// A replica's metrics.
pub struct Metrics {
    registry: Registry,
    known_types: HashSet<String>,
    pub leader: Gauge,
    pub fencing_token: Gauge,
    seconds_since_renewal: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Unix milliseconds of the last successful renewal; 0 = never.
    last_renewal_ms: AtomicI64,
    pub renewal_seconds: Histogram,
    claimed: Family<TaskLabels, Counter>,
    completed: Family<TaskLabels, Counter>,
    failed: Family<TaskLabels, Counter>,
    dead_lettered: Family<TaskLabels, Counter>,
    handler_seconds: Family<TaskLabels, Histogram>,
    pub claim_conflicts: Counter,
    queue_depth: Family<StateLabels, Gauge>,
    /// A split queue's: per shard, its leader's fencing token here (0: another leads it).
    shard_fencing_token: Family<ShardLabels, Gauge>,
    /// A split queue's: tasks by shard and state at its leader's last listing.
    shard_queue_depth: Family<ShardStateLabels, Gauge>,
    coordinator_errors: Family<KindLabels, Counter>,
    pub blocking_restarts: Counter,
    leadership_losses: Counter,
}

impl Metrics {
    pub fn new<'a>(task_types: impl IntoIterator<Item = &'a str>) -> Metrics {
        let mut registry = Registry::with_prefix("leaderq");
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader key",
            leader.clone(),
        );
        let fencing_token = Gauge::default();
        registry.register(
            "fencing_token",
            "Fencing token of this replica's leadership, rising strictly across leaders; 0 when not leading",
            fencing_token.clone(),
        );
        let seconds_since_renewal = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "seconds_since_renewal",
            "Seconds since this replica's lease was last renewed",
            seconds_since_renewal.clone(),
        );
        let renewal_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register(
            "session_renewal_seconds",
            "Latency of lease renewals",
            renewal_seconds.clone(),
        );
        let claimed = Family::<TaskLabels, Counter>::default();
        registry.register(
            "tasks_claimed",
            "Tasks claimed by taskType",
            claimed.clone(),
        );
        let completed = Family::<TaskLabels, Counter>::default();
        registry.register(
            "tasks_completed",
            "Tasks completed and deleted by taskType",
            completed.clone(),
        );
        let failed = Family::<TaskLabels, Counter>::default();
        registry.register(
            "tasks_failed",
            "Handler runs that failed, by taskType",
            failed.clone(),
        );
        let dead_lettered = Family::<TaskLabels, Counter>::default();
        registry.register(
            "tasks_dead_lettered",
            "Tasks moved to the dead-letter prefix, by taskType",
            dead_lettered.clone(),
        );
        let handler_seconds = Family::<TaskLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 20))
        });
        registry.register(
            "handler_duration_seconds",
            "Handler run time by taskType",
            handler_seconds.clone(),
        );
        let claim_conflicts = Counter::default();
        registry.register(
            "claim_conflicts",
            "Claims refused because the task changed since it was listed",
            claim_conflicts.clone(),
        );
        let queue_depth = Family::<StateLabels, Gauge>::default();
        registry.register(
            "queue_depth",
            "Tasks by state at the leader's last listing (pending, in_flight, delayed, scheduled, dead)",
            queue_depth.clone(),
        );
        let shard_fencing_token = Family::<ShardLabels, Gauge>::default();
        registry.register(
            "shard_fencing_token",
            "A split queue's shards this replica leads, with their fencing tokens (0: not led here)",
            shard_fencing_token.clone(),
        );
        let shard_queue_depth = Family::<ShardStateLabels, Gauge>::default();
        registry.register(
            "shard_queue_depth",
            "A split queue's tasks by shard and state at the shard leader's last listing",
            shard_queue_depth.clone(),
        );
        let coordinator_errors = Family::<KindLabels, Counter>::default();
        registry.register(
            "coordinator_request_errors",
            "Failed coordinator requests by kind",
            coordinator_errors.clone(),
        );
        // The name it had when Consul was the only backend, kept for the alerts and
        // dashboards that read it: the same counter.
        registry.register(
            "consul_request_errors",
            "Failed coordinator requests by kind (the old name of coordinator_request_errors)",
            coordinator_errors.clone(),
        );
        let blocking_restarts = Counter::default();
        registry.register(
            "blocking_query_restarts",
            "Blocking queries restarted from index 0 (errors or an index that went backwards)",
            blocking_restarts.clone(),
        );
        let leadership_losses = Counter::default();
        registry.register(
            "leadership_lost",
            "Terms ended because the leadership record was lost at the coordinator (deleted, rewritten, taken, or its lease revoked)",
            leadership_losses.clone(),
        );
        Metrics {
            registry,
            known_types: task_types.into_iter().map(str::to_string).collect(),
            leader,
            fencing_token,
            seconds_since_renewal,
            last_renewal_ms: AtomicI64::new(0),
            renewal_seconds,
            claimed,
            completed,
            failed,
            dead_lettered,
            handler_seconds,
            claim_conflicts,
            queue_depth,
            shard_fencing_token,
            shard_queue_depth,
            coordinator_errors,
            blocking_restarts,
            leadership_losses,
        }
    }

    /// A term ended because its leadership was seen lost at the coordinator.
    pub fn leadership_lost(&self) {
        self.leadership_losses.inc();
    }

    fn labels(&self, task_type: &str) -> TaskLabels {
        let task_type = if self.known_types.contains(task_type) {
            task_type
        } else {
            OTHER_TASK_TYPE
        };
        TaskLabels {
            task_type: task_type.to_string(),
        }
    }

    pub fn claimed(&self, task_type: &str) {
        self.claimed.get_or_create(&self.labels(task_type)).inc();
    }

    pub fn completed(&self, task_type: &str, elapsed: Duration) {
        let labels = self.labels(task_type);
        self.completed.get_or_create(&labels).inc();
        self.handler_seconds
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    pub fn failed(&self, task_type: &str, elapsed: Duration) {
        let labels = self.labels(task_type);
        self.failed.get_or_create(&labels).inc();
        self.handler_seconds
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    pub fn dead_lettered(&self, task_type: &str) {
        self.dead_lettered
            .get_or_create(&self.labels(task_type))
            .inc();
    }

    /// `delayed`: waiting for a retry's backoff (or a lock-delay); `scheduled`: for the
    /// time their producer set (runAt).
    /// The depths at a listing of the queue, or of one shard of a split queue.
    pub fn queue_depth(
        &self,
        shard: Option<u32>,
        [pending, in_flight, delayed, scheduled]: [usize; 4],
    ) {
        for (state, value) in [
            ("pending", pending),
            ("in_flight", in_flight),
            ("delayed", delayed),
            ("scheduled", scheduled),
        ] {
            let gauge = match shard {
                None => self.queue_depth.get_or_create(&StateLabels {
                    state: state.into(),
                }),
                Some(shard) => self.shard_queue_depth.get_or_create(&ShardStateLabels {
                    shard: shard.to_string(),
                    state: state.into(),
                }),
            };
            gauge.set(value as i64);
        }
    }

    pub fn dead_depth(&self, dead: usize) {
        self.queue_depth
            .get_or_create(&StateLabels {
                state: "dead".into(),
            })
            .set(dead as i64);
    }

    /// A coordinator call that did not answer, by kind (`unavailable`, `refused`).
    pub fn coordinator_error(&self, error: &crate::coord::CoordError) {
        let kind = match error {
            crate::coord::CoordError::Unavailable(_) => "unavailable",
            crate::coord::CoordError::Refused(_) => "refused",
        };
        self.coordinator_errors
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    pub fn renewed(&self, latency: Duration) {
        self.renewal_seconds.observe(latency.as_secs_f64());
        self.last_renewal_ms
            .store(chrono::Utc::now().timestamp_millis(), Ordering::Relaxed);
    }

    /// Whether this replica leads `shard` of a split queue, and under which token.
    pub fn shard_leading(&self, shard: u32, fencing_token: Option<FencingToken>) {
        self.shard_fencing_token
            .get_or_create(&ShardLabels {
                shard: shard.to_string(),
            })
            .set(fencing_token.map_or(0, |token| token.0) as i64);
    }

    pub fn leading(&self, fencing_token: Option<FencingToken>) {
        self.leader.set(fencing_token.is_some() as i64);
        self.fencing_token
            .set(fencing_token.map_or(0, |token| token.0) as i64);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let last = self.last_renewal_ms.load(Ordering::Relaxed);
        if last > 0 {
            let since = (chrono::Utc::now().timestamp_millis() - last).max(0) as f64 / 1000.0;
            self.seconds_since_renewal.set(since);
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// What the endpoints need of the replica's lease (`leader/lease.rs` keeps it): whether it
/// was renewed within its TTL, and which lease it is. A trait, so that this module knows
/// nothing of how the lease is kept.
pub trait LeaseView: Send + Sync {
    /// Renewed within its TTL and not deposed.
    fn is_fresh(&self) -> bool;
    /// The lease held now, if any.
    fn id(&self) -> Option<crate::coord::LeaseId>;
}

/// What the endpoints read.
pub struct Observed {
    pub metrics: Arc<Metrics>,
    pub lease: Arc<dyn LeaseView>,
    pub coord: Arc<dyn Coordinator>,
    /// Cleared when the consumer loop has ended.
    pub alive: AtomicBool,
    /// A split queue's shards, in order: each one's election and this replica's lease in it
    /// (empty: the queue is whole).
    pub shards: Vec<(Arc<dyn Coordinator>, Arc<dyn LeaseView>)>,
}

pub fn router(observed: Arc<Observed>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/leader", get(leader))
        .with_state(observed)
}

async fn metrics(State(observed): State<Arc<Observed>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        observed.metrics.encode(),
    )
        .into_response()
}

async fn health(State(observed): State<Arc<Observed>>) -> Response {
    if observed.alive.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the consumer loop has stopped\n",
        )
            .into_response()
    }
}

/// Ready when the lease is known alive: renewed within its TTL, which also shows the
/// coordinator was reachable. A standby is ready too.
async fn ready(State(observed): State<Arc<Observed>>) -> Response {
    if observed.lease.is_fresh() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no lease renewed within its TTL (is the coordinator reachable?)\n",
        )
            .into_response()
    }
}

/// The current holder of leadership, as the coordinator has it now; a split queue's, of
/// every shard (`shards`, each with its shard number, `null` fields while it has none),
/// shard 0's at the top.
async fn leader(State(observed): State<Arc<Observed>>) -> Response {
    if !observed.shards.is_empty() {
        let mut shards = Vec::new();
        for (shard, (coord, lease)) in observed.shards.iter().enumerate() {
            match coord.observe(Version(0), Duration::ZERO).await {
                Ok((holder, _)) => shards.push(holder_json(&holder, lease.as_ref(), Some(shard))),
                Err(err) => {
                    return (
                        StatusCode::BAD_GATEWAY,
                        format!("cannot read shard {shard}'s leader key: {err}\n"),
                    )
                        .into_response()
                }
            }
        }
        let mut body = shards[0].clone();
        body["shards"] = serde_json::Value::Array(shards);
        return (
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
    }
    match observed.coord.observe(Version(0), Duration::ZERO).await {
        Ok((holder, _)) if holder.lease.is_some() => {
            let record = holder.record.as_ref();
            let this_replica = observed.lease.id().is_some() && observed.lease.id() == holder.lease;
            let body = json!({
                "node": record.map(|r| r.node.as_str()),
                // `session` is kept for the scripts that read it; `lease` is its name now.
                "lease": holder.lease.as_ref().map(|lease| lease.0.as_str()),
                "session": holder.lease.as_ref().map(|lease| lease.0.as_str()),
                "fencing_token": holder.token,
                "since": record.map(|r| r.since.as_str()),
                "this_replica": this_replica,
            });
            (
                [(header::CONTENT_TYPE, "application/json")],
                body.to_string(),
            )
                .into_response()
        }
        Ok(_) => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "application/json")],
            json!({"node": null, "error": "no leader"}).to_string(),
        )
            .into_response(),
        Err(err) => (
            StatusCode::BAD_GATEWAY,
            format!("cannot read the leader key: {err}\n"),
        )
            .into_response(),
    }
}

/// A holder as `/leader` shows it (`shard`: a split queue's shard number).
fn holder_json(
    holder: &crate::coord::Holder,
    lease: &dyn LeaseView,
    shard: Option<usize>,
) -> serde_json::Value {
    let held = holder.lease.is_some();
    let record = holder.record.as_ref().filter(|_| held);
    let mut body = json!({
        "node": record.map(|r| r.node.as_str()),
        "lease": holder.lease.as_ref().map(|lease| lease.0.as_str()),
        "session": holder.lease.as_ref().map(|lease| lease.0.as_str()),
        "fencing_token": held.then_some(holder.token),
        "since": record.map(|r| r.since.as_str()),
        "this_replica": held && lease.id() == holder.lease,
    });
    if let Some(shard) = shard {
        body["shard"] = json!(shard);
    }
    body
}

/// Binds the observe address, naming the setting when it cannot.
pub async fn bind(listen: SocketAddr) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        format!(
            "cannot listen on {listen} for the observe endpoints (observe.listen): {e}; set observe.listen (LEADERQ__OBSERVE__LISTEN) to a free address, or observe.enabled = false"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unknown task types share one label, so label count stays bounded.
    #[test]
    fn unknown_task_types_share_one_label() {
        let metrics = Metrics::new(["CreateTableSpace"]);
        metrics.claimed("CreateTableSpace");
        for n in 0..50 {
            metrics.claimed(&format!("random-{n}"));
        }
        let text = metrics.encode();
        assert!(
            text.contains(r#"leaderq_tasks_claimed_total{task_type="CreateTableSpace"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"leaderq_tasks_claimed_total{task_type="other"} 50"#),
            "{text}"
        );
        assert!(!text.contains("random-"));
    }
}
