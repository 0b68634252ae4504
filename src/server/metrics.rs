//! The embedded server's Prometheus metrics, served on `/metrics` beside the Consul API:
//! requests by endpoint and status, write batch sizes, commit latency, blocked queries,
//! wake-ups of blocked queries, sessions and keys, and the process's CPU time. Recording
//! only; the server's behaviour does not depend on them.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The route, not the path, so keys never become labels.
    pub endpoint: String,
    pub status: u16,
}

pub struct ServerMetrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub batch_size: Histogram,
    pub commit_seconds: Histogram,
    pub blocked_queries: Gauge,
    pub blocked_query_wakeups: Counter,
    pub sessions: Gauge,
    pub keys: Gauge,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("leaderq_server");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by endpoint and status",
            requests.clone(),
        );
        let batch_size = Histogram::new(exponential_buckets(1.0, 2.0, 11));
        registry.register(
            "write_batch_size",
            "Writes committed together in one fsync",
            batch_size.clone(),
        );
        let commit_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register(
            "commit_seconds",
            "Time to persist one batch (fsync included)",
            commit_seconds.clone(),
        );
        let blocked_queries = Gauge::default();
        registry.register(
            "blocked_queries",
            "Blocking queries waiting now",
            blocked_queries.clone(),
        );
        let blocked_query_wakeups = Counter::default();
        registry.register(
            "blocked_query_wakeups",
            "Times a commit woke a blocked query to run its read again",
            blocked_query_wakeups.clone(),
        );
        let sessions = Gauge::default();
        registry.register("sessions", "Live sessions", sessions.clone());
        let keys = Gauge::default();
        registry.register("kv_keys", "KV entries", keys.clone());
        ServerMetrics {
            registry,
            requests,
            batch_size,
            commit_seconds,
            blocked_queries,
            blocked_query_wakeups,
            sessions,
            keys,
        }
    }
}

impl ServerMetrics {
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        // The process's CPU time, under the name every Prometheus client library gives it,
        // before the exposition's end marker.
        let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        let seconds = cpu.tv_sec as f64 + cpu.tv_nsec as f64 / 1e9;
        let end = text.rfind("# EOF").unwrap_or(text.len());
        text.insert_str(
            end,
            &format!(
                "# HELP process_cpu_seconds Total user and system CPU time spent in seconds.\n\
                 # TYPE process_cpu_seconds counter\n\
                 process_cpu_seconds_total {seconds:.6}\n"
            ),
        );
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's CPU time is exposed under its usual name, inside the exposition.
    #[test]
    fn the_process_cpu_time_is_exposed() {
        let text = ServerMetrics::default().encode();
        let cpu = text
            .lines()
            .find_map(|line| line.strip_prefix("process_cpu_seconds_total "))
            .expect("process_cpu_seconds_total is exposed");
        assert!(cpu.parse::<f64>().unwrap() > 0.0);
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }
}
