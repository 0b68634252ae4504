//! testkit: what leaderq's tests share and nothing ships. A dev-dependency of leaderq (its
//! integration tests) and a dependency of the lab (`leaderq-lab bench` and `chaos`).
//!
//! - [`harness`]: the one process harness: real servers and replicas as child processes
//!   killed with their group on drop, free ports, bounded waits, one cluster per backend,
//!   and links that cut, blackhole or delay a replica's connections.
//! - [`contract`]: the coordinator contract suite, the seam's header
//!   ([`leaderq::coord`]) as checks every backend passes: the in-memory one
//!   (`tests/contract_memory.rs`) and real servers (`tests/consumer/contract_*.rs`).

pub mod contract;
pub mod harness;
