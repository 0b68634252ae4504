//! The commands a user runs, as wiring over the library: `consume` (one replica's service
//! loop), `run` (leader-gate any command), `dev` (server plus replicas for the quick
//! start), `admin` (`enqueue`, `status`, `tasks`), `ops` (history, timeline, replicas, cancel, delete, retry all: what the CLI and the dashboard both call), `schedules` (apply, list, pause, resume, delete schedules). Decisions live in `leader`, `queue` and `coord`; these only put them together.

pub mod admin;
pub mod connect;
pub mod consume;
pub mod dev;
pub mod ops;
pub mod run;
pub mod schedules;
