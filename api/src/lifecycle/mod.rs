//! A node's lifecycle, decided here and only stored by `db/`: its phase (what it last
//! reported, and whether that is healthy), and its generations and what a report does to them.
//! The rollout gate that reads them from stored rows is `rollout::gate`, above `db/`.
//! `docs/architecture.md` draws the states and who moves them.

pub mod generations;
pub mod phase;

pub use generations::{NodeGenerations, Reported, report};
pub use phase::NodePhase;
