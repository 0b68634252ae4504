//! Measuring and breaking leaderq with real processes: `bench` (`leaderq bench`) and
//! `chaos` (`leaderq chaos`, failure injection with an audit), and `harness`, the process
//! harness they and the integration tests share.

pub mod bench;
pub mod chaos;
pub mod harness;
