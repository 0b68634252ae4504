//! Kept output on the in-memory coordinator: a run's output is written with its attempt
//! before the run is settled, cut further when the coordinator refuses it as too large (the
//! run still settles), and deleted with the history record of its task's completion.

use std::sync::Arc;
use std::time::Duration;

use super::leading::Leading;
use super::task;
use crate::coord::memory::{MemoryConfig, MemoryCoordinator};
use crate::coord::{Coordinator, WriteLimits};
use crate::handler::{Handler, HandlerFuture, Registry, RunOutput, TaskContext};
use crate::observe::Metrics;
use crate::queue::output_prefix;
use crate::task::output::OutputRecord;

/// Prints 40 000 bytes and fails on its first run; prints a line and succeeds after.
struct Loud;

impl Handler for Loud {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            if ctx.task_id != "loud" {
                return Ok(());
            }
            if ctx.attempt == 1 {
                ctx.output.keep(RunOutput {
                    stdout: vec![b'a'; 40_000],
                    stderr: b"first".to_vec(),
                    ..RunOutput::default()
                });
                return Err("boom".into());
            }
            ctx.output.keep(RunOutput {
                stdout: b"second\n".to_vec(),
                ..RunOutput::default()
            });
            Ok(())
        })
    }
}

/// Both runs' output is kept, the first cut to fit a coordinator that takes 24 KiB a write
/// (and saying so), and the task completes; once its history record is pruned, its
/// output goes too.
#[tokio::test(start_paused = true)]
async fn output_is_kept_per_attempt_cut_to_fit_and_pruned_with_its_history() {
    let memory = Arc::new(MemoryCoordinator::new(MemoryConfig {
        limits: WriteLimits {
            max_ops: 128,
            max_bytes: 24 * 1024,
        },
        ..MemoryConfig::default()
    }));
    let coord: Arc<dyn Coordinator> = memory.clone();
    let mut settings = super::default_settings();
    settings.queue.history_keep = 1;
    let prefix = settings.queue.prefix.clone();
    memory
        .put(&format!("{prefix}loud"), &task("loud", 1))
        .unwrap();
    let mut registry = Registry::default();
    registry.register("Work", Loud);
    let metrics = Arc::new(Metrics::new(["Work"]));
    let leading = Leading::start(&coord, &settings, registry, metrics).await;

    let kept = output_prefix(&prefix, "loud");
    let read = || async {
        let (stored, _) = coord
            .list(&kept, crate::coord::Version(0), Duration::ZERO)
            .await
            .unwrap();
        stored
            .iter()
            .filter_map(|s| OutputRecord::decode(&s.value))
            .collect::<Vec<_>>()
    };
    let mut records = Vec::new();
    for _ in 0..500 {
        records = read().await;
        let gone = coord.keys(&prefix).await.unwrap().0.is_empty();
        if gone && records.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(records.len(), 2, "{records:?}");
    let (first, second) = (&records[0], &records[1]);
    assert_eq!((first.attempt, first.outcome.as_str()), (1, "failed"));
    assert!(first.stdout.len() <= 16 * 1024, "{}", first.stdout.len());
    assert_eq!(first.stdout.len() as u64 + first.stdout_dropped, 40_000);
    assert_eq!(first.stderr, "first");
    assert!(first.note.as_deref().unwrap_or("").contains("too large"));
    assert_eq!((second.attempt, second.outcome.as_str()), (2, "completed"));
    assert_eq!(second.stdout, "second\n");
    assert_eq!(second.note, None);

    // Another completion, then the next look at the history keeps only its record.
    memory
        .put(&format!("{prefix}quiet"), &task("quiet", 2))
        .unwrap();
    for _ in 0..500 {
        if coord.keys(&prefix).await.unwrap().0.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(coord.keys(&prefix).await.unwrap().0.is_empty());
    tokio::time::sleep(super::super::history::HISTORY_PRUNE_EVERY + Duration::from_secs(2)).await;
    let left = read().await.len();
    assert_eq!(left, 0, "output pruned with its history");
    leading.shut_down().await;
}
