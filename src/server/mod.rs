pub mod duration;
pub mod state;
