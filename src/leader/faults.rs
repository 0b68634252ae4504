//! Fault injection for the integration tests and `leaderq-lab chaos`: one replica's renewal
//! path stalls while everything else it sends still goes through, as a slow or overloaded
//! path to the coordinator does (the case a lease's deadline exists for). Off unless
//! [`STALL_RENEWALS_ENV`] names a file: while that file exists, each keep-alive this
//! replica would send is held for the renewer's retry interval and fails unsent, as a
//! request that timed out. The coordinator is not touched: it goes on answering claims,
//! and ends the lease when its TTL runs out without a renewal.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use crate::coord::CoordError;

/// Names the file whose existence stalls this replica's renewals (tests and chaos only).
pub const STALL_RENEWALS_ENV: &str = "LEADERQ_TEST_STALL_RENEWALS";

fn stall_file() -> Option<&'static PathBuf> {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| {
        std::env::var_os(STALL_RENEWALS_ENV)
            .filter(|path| !path.is_empty())
            .map(PathBuf::from)
    })
    .as_ref()
}

/// While the stall is on, waits `hold` and answers the error a timed-out keep-alive
/// would; `None` (at once) when it is off.
pub async fn stalled_renewal(hold: Duration) -> Option<CoordError> {
    let file = stall_file()?;
    if !file.exists() {
        return None;
    }
    tokio::time::sleep(hold).await;
    Some(CoordError::Unavailable(format!(
        "renewal stalled: fault injected while {} exists",
        file.display()
    )))
}
