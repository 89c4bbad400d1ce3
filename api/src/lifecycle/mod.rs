//! A node's lifecycle, decided here and only stored by `db/`: its phase (what it last
//! reported, and whether that is healthy), its generations and what a report does to them, and
//! the rollout gate that hands a control-plane node its next generation only while every other
//! one is healthy and settled. `docs/architecture.md` draws the states and who moves them.

pub mod gate;
pub mod generations;
pub mod phase;

pub use gate::{Hold, gate};
pub use generations::{NodeGenerations, Reported, report};
pub use phase::NodePhase;
