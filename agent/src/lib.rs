//! `exk8s-agent`, the static binary baked into VM images. It replaces the seed's bash userdata
//! shim and its node scripts with one verifiable program:
//!
//! * [`imds`] — who this VM is, and its two credentials;
//! * [`fetch`] — the bundle, with a fresh nonce, retries, and a size cap;
//! * verification — `exk8s-common` (signature before parsing, then binding);
//! * [`apply`] — files written atomically with exact modes, prerequisites, systemd, waits,
//!   addons, each as a host action that `--root` records instead of performing;
//! * [`report`] — phase reports back to the API, best effort;
//! * [`state`] — the applied serial and file digests, saved only after success;
//! * [`nodekey`], [`node_api`], [`sync`] — day 2: the node's own key, its signed requests,
//!   and `sync`, which applies each newer generation the API has for this node;
//! * [`balancer`] — `balance`, the node-local apiserver load balancer every node runs.

pub mod apply;
pub mod balancer;
pub mod cli;
pub mod clock;
pub mod commands;
pub mod config;
pub mod error;
pub mod etcd_members;
pub mod etcd_probe;
pub mod etcd_restore;
pub mod fetch;
pub mod http;
pub mod imds;
mod log;
pub mod machine;
pub mod node_api;
pub mod nodekey;
pub mod report;
pub mod resume;
pub mod snapshot;
pub mod state;
pub mod statedir;
pub mod sync;
