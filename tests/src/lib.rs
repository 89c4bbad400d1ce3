//! `exk8s-tests` holds what tests need across crates: the dev stack as a child process
//! ([`dev`]), a cluster
//! founded on it and booted by the real agent ([`cluster`]), etcd's own clients
//! ([`etcd`]), machines that boot the node image under systemd ([`machine`]) and the site they boot on
//! ([`site`]: the mirror, the registry they pull from ([`registry`]), the baked image, the
//! stack), finding and running the workspace's binaries ([`procs`]), a TLS endpoint serving a rendered certificate
//! ([`tls`]), a private PostgreSQL server tests may stop ([`postgres`]), a real S3 server
//! ([`s3`]), a long test's phases shown as they happen ([`timeline`]), a small real filesystem to fill ([`tmpfs`]), a worker pool as the API shows it
//! ([`workers`]), the README's quick starts as shells ([`readme`]), and a management cluster for
//! Cluster API ([`management`]) in a network namespace of the test's own ([`netns`]). The end-to-end test lives in `tests/`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: a failure should stop the test loudly"
)]

pub mod bins;
pub mod cluster;
pub mod console;
pub mod dev;
pub mod etcd;
pub mod machine;
pub mod management;
pub mod mirror;
pub mod netns;
pub mod postgres;
pub mod procs;
pub mod readme;
pub mod registry;
pub mod s3;
pub mod site;
pub mod timeline;
pub mod tls;
pub mod tmpfs;
pub mod workers;
