//! `handlers.lock` in the replica's data dir: every supervisor holds it shared (and passes
//! it on to its handler) while the handler's processes live; a replica starting on the data
//! dir takes it exclusive once, so it never starts work while handlers of a previous
//! process on the same dir are still running.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often a starting replica tries the lock again while old handlers still hold it.
const RETRY: Duration = Duration::from_millis(50);

/// The lock file in a data dir.
pub fn lock_file(data_dir: &Path) -> PathBuf {
    data_dir.join("handlers.lock")
}

/// Waits until no handler started by an earlier process holds `path`, at most `bound`.
pub async fn wait_for_previous_handlers(path: &Path, bound: Duration) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create the data dir {}: {e}", dir.display()))?;
    }
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let started = tokio::time::Instant::now();
    let mut logged = false;
    loop {
        match file.try_lock() {
            Ok(()) => {
                if logged {
                    tracing::info!(lock = %path.display(), waited_ms = started.elapsed().as_millis() as u64, "the previous process's handlers are gone");
                }
                // Dropping the file releases the lock: from now on only this process's
                // own supervisors take it, shared.
                return Ok(());
            }
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(err)) => {
                return Err(format!("cannot lock {}: {err}", path.display()))
            }
        }
        if !logged {
            logged = true;
            tracing::warn!(lock = %path.display(), "waiting for the handlers of a previous leaderq process on this data dir to end");
        }
        if started.elapsed() >= bound {
            return Err(format!(
                "handlers started by a previous leaderq process on this data dir still run after {}; stop them (`fuser -v {}` lists them) and start again",
                crate::util::duration::format(bound),
                path.display()
            ));
        }
        tokio::time::sleep(RETRY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared holder makes the starting replica wait, and give up after the bound; once
    /// the holder is gone the wait ends at once.
    #[tokio::test]
    async fn start_waits_for_shared_holders() {
        let dir = tempfile::tempdir().unwrap();
        let path = lock_file(&dir.path().join("data"));
        wait_for_previous_handlers(&path, Duration::ZERO)
            .await
            .unwrap();
        let holder = File::options().write(true).open(&path).unwrap();
        holder.lock_shared().unwrap();
        let err = wait_for_previous_handlers(&path, Duration::from_millis(120))
            .await
            .unwrap_err();
        assert!(
            err.contains("still run after") && err.contains("fuser"),
            "{err}"
        );
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(holder);
        });
        wait_for_previous_handlers(&path, Duration::from_secs(5))
            .await
            .unwrap();
        release.await.unwrap();
    }
}
