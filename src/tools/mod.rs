//! Measuring and breaking leaderq with real processes: `bench` (`leaderq bench`) and
//! `chaos` (`leaderq chaos`, failure injection with an audit). The process harness they
//! share (server, replicas, signals) is `chaos::procs`.

pub mod bench;
pub mod chaos;
