//! [`AgentError`]: everything that stops the agent, grouped by the exit code it maps to.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success (or nothing to do) |
//! | 2 | usage or configuration error |
//! | 3 | network exhausted: a deadline passed before IMDS or the API answered usefully |
//! | 4 | bundle refused: signature, identity, freshness, rollback or content |
//! | 5 | applying files or installing prerequisites failed |
//! | 6 | a plan step failed (systemd, a wait, an addon) |

use std::path::PathBuf;

use exk8s_common::BundleError;

/// Exit codes, documented in `--help`.
pub mod exit {
    pub const OK: u8 = 0;
    pub const USAGE: u8 = 2;
    pub const NETWORK: u8 = 3;
    pub const REFUSED: u8 = 4;
    pub const APPLY: u8 = 5;
    pub const STEP: u8 = 6;
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("reading {path}")]
    ReadInput {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: gave up after {attempts} attempts over {elapsed_secs}s: {last}")]
    NetworkExhausted {
        what: &'static str,
        attempts: u32,
        elapsed_secs: u64,
        last: String,
    },
    #[error("{what}: the server refused the request with HTTP {status}: {body}")]
    Rejected {
        what: &'static str,
        status: u16,
        body: String,
    },
    #[error("bundle refused")]
    Refused(#[from] BundleError),
    #[error("bundle refused: {0}")]
    RefusedOnDisk(String),
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing to write through {path}: {reason}")]
    UnsafePath { path: PathBuf, reason: &'static str },
    #[error("artifact {name}: {reason}")]
    Artifact { name: String, reason: String },
    #[error("installing packages: {0}")]
    Packages(String),
    #[error("state file {path}")]
    State {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("plan step {step}: {reason}")]
    Step { step: String, reason: String },
    /// Work given up because a step beside it failed; that failure is the one reported.
    #[error("{what}: abandoned because a step beside it failed")]
    Abandoned { what: String },
}

impl AgentError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) | Self::ReadInput { .. } => exit::USAGE,
            Self::NetworkExhausted { .. } | Self::Rejected { .. } => exit::NETWORK,
            Self::Refused(_) | Self::RefusedOnDisk(_) => exit::REFUSED,
            Self::Write { .. }
            | Self::UnsafePath { .. }
            | Self::Artifact { .. }
            | Self::Packages(_)
            | Self::State { .. } => exit::APPLY,
            Self::Step { .. } | Self::Abandoned { .. } => exit::STEP,
        }
    }
}

pub use exk8s_common::error_chain as chain;
