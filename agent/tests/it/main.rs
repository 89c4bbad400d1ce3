//! `exk8s-agent` integration tests: the real binary against fixture bundles and a fake
//! IMDS/API server with injected faults.

#![allow(
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a failure should stop the test loudly"
)]

mod apply;
mod artifacts;
mod helpers;
mod host;
mod run;
mod server;
mod sync;
