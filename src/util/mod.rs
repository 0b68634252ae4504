//! Small pieces every part of leaderq uses and none owns.
//!
//! - `duration`: Go's duration syntax (`15s`, `1m30s`), as Consul reads and writes it.

pub mod duration;
