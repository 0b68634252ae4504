//! The commands a user runs, as wiring over the library: `consume` (one replica's service
//! loop), `run` (leader-gate any command), `dev` (server plus replicas for the quick
//! start). Decisions live in `leader`, `queue` and `coord`, the operator's verbs in
//! `operate`; these only put them together. Here too: how a command learns it should
//! stop (SIGTERM or Ctrl-C).

pub mod connect;
pub mod consume;
pub mod dev;
pub mod run;
pub mod shards;
mod term;

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutdown requested");
}

/// A token cancelled on SIGTERM or Ctrl-C, by a task that waits for either. That task is
/// the one not kept by its caller: it ends at the first signal or when the token is
/// cancelled otherwise (the command is over), and holds nothing but the token.
pub fn cancel_on_signal() -> tokio_util::sync::CancellationToken {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        if trigger
            .run_until_cancelled(shutdown_signal())
            .await
            .is_some()
        {
            trigger.cancel();
        }
    });
    shutdown
}
