//! `exk8s-api` founds Kubernetes control-plane clusters and serves each control-plane VM a
//! bundle rendered and signed for exactly that machine.
//!
//! The API owns truth: which VM belongs to which cluster, and every key and certificate. The
//! modules grow per ARCHITECTURE.md (`http`, `db`, `pki`, `render`, `compute`, `dns`, `sim`,
//! `crypto`); the signed bundle format itself lives in `exk8s-common`.

pub mod pki;
pub mod render;
