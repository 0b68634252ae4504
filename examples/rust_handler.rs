//! A consumer with a handler written in Rust, as a library user runs leaderq.
//!
//! Run it against `leaderq server` (or a real Consul agent):
//!
//! ```sh
//! cargo run --release -- server &
//! cargo run --example rust_handler
//! curl -X PUT http://127.0.0.1:8500/v1/kv/oracleTask/task_1 \
//!   -d '{"taskId":"1","taskTime":"1445599887","taskTaken":false,"taskType":"CreateTableSpace","taskPara":{"name":"users","size":"10G"}}'
//! ```
//!
//! Settings come from the same places as `leaderq consume`'s (defaults, LEADERQ__… and
//! CONSUL_HTTP_ADDR); handlers configured there are kept, and this one is added.

use leaderq::config::Settings;
use leaderq::handler::{
    CancellationToken, Handler, HandlerError, HandlerFuture, Registry, TaskContext,
};
use serde::Deserialize;

/// What a CreateTableSpace task carries in its `taskPara`.
#[derive(Deserialize)]
struct TableSpace {
    name: String,
}

/// Creates a tablespace from `taskPara`. Handlers should be idempotent: a task can run
/// again if its replica dies mid-run. The fencing token lets a handler refuse work from a
/// deposed leader (a token lower than one it has already seen).
struct CreateTableSpace;

impl Handler for CreateTableSpace {
    fn handle<'a>(&'a self, ctx: &'a TaskContext) -> HandlerFuture<'a> {
        Box::pin(async move {
            let TableSpace { name } = ctx.para()?;
            tokio::select! {
                // Stand-in for the real work.
                _ = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
                // Stop promptly when this replica stops leading or shuts down.
                _ = ctx.cancel.cancelled() => return Err(HandlerError::new("cancelled")),
            }
            println!(
                "created tablespace {name} (task {}, attempt {}, fencing token {})",
                ctx.task_id, ctx.attempt, ctx.fencing_token
            );
            Ok(())
        })
    }
}

fn main() -> anyhow::Result<()> {
    // Exec handlers from the settings run under a supervisor, which is this very program
    // started with a hidden argument: let it do that job before anything else.
    leaderq::supervise::run_if_supervisor();
    tokio::runtime::Runtime::new()?.block_on(consume())
}

async fn consume() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let settings = Settings::load(None, std::env::vars().collect())?;
    let mut registry = Registry::from_settings(&settings);
    registry.register("CreateTableSpace", CreateTableSpace);

    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        trigger.cancel();
    });
    leaderq::service::consume::run(settings, registry, shutdown).await?;
    Ok(())
}
