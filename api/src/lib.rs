//! `exk8s-api` founds Kubernetes control-plane clusters and serves each control-plane VM a
//! bundle rendered and signed for exactly that machine.
//!
//! The API owns truth: which VM belongs to which cluster, and every key and certificate.
//!
//! * [`http`] — routes, handlers, errors, extractors, and the server that wires router, state and
//!   background workers; [`app`] — the state;
//! * [`founding`] — `POST /clusters`, compensation, the reconciler;
//! * [`issuance`] — who a VM is, and its node row → its signed bundle; [`rollout`] — handing
//!   out new generations one control-plane node at a time;
//! * [`db`] — sqlx queries per table (SQLite and PostgreSQL); [`crypto`] — keys sealed at rest;
//! * [`pki`] — every certificate, minted on the [`cpu`] pool; [`render`] — the bundle for one node;
//! * [`compute`], [`dns`] — the services exk8s drives; [`sim`] — their SIMULATORS;
//! * [`keyfiles`] — the KEK and signing-key files; [`cli`] — the `exk8s-api` command.

pub mod app;
pub mod cert_cache;
pub mod certificates;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod compute;
pub mod config;
pub mod cpu;
pub mod credentials;
pub mod crypto;
pub mod db;
pub mod dns;
pub mod feed;
pub mod field;
pub mod founding;
pub mod health;
pub mod http;
pub mod issuance;
pub mod kept;
pub mod keyfiles;
pub mod keypool;
pub mod labels;
pub mod lease;
pub mod lifecycle;
pub mod machines;
pub mod machineset;
pub mod membership;
pub mod metrics;
pub mod pki;
pub mod pools;
pub mod quotas;
pub mod ratelimit;
pub mod records;
pub mod render;
pub mod renewal;
pub mod restore;
pub mod rollout;
pub mod rotation;
pub mod sa_rotation;
pub mod sim;
pub mod snapshot_store;
pub mod snapshots;
pub mod standby;
pub mod status;
pub mod tokens;
pub mod trust;
pub mod upgrade;

pub use exk8s_common::error_chain;
/// The server, for the composition roots (the CLI and tests).
pub use http::server::Application;
