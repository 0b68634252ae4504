//! Where the `leaderq` binary the lab runs is: the one `--leaderq` or `LEADERQ_BIN` names,
//! else the one cargo built beside `leaderq-lab` (the same target dir and profile). The
//! lab never builds it: a missing binary is an error that says how to build it.

use std::path::PathBuf;

use anyhow::{bail, Context};

/// The environment variable naming the leaderq binary (`--leaderq` sets it).
pub const ENV: &str = "LEADERQ_BIN";

/// The leaderq binary to run: [`ENV`]'s, or `leaderq` beside this executable.
pub fn leaderq() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(ENV).filter(|path| !path.is_empty()) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("{ENV} names {}, which is not a file", path.display());
        }
        return Ok(path);
    }
    let lab = std::env::current_exe().context("cannot find the leaderq-lab binary")?;
    let beside = lab.with_file_name("leaderq");
    if !beside.is_file() {
        bail!(
            "no leaderq binary beside {}: build both with `cargo build --release --workspace` \
             (or name one with --leaderq PATH)",
            lab.display()
        );
    }
    Ok(beside)
}
