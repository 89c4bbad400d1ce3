//! `exk8s-common` owns the one contract between `exk8s-api` and `exk8s-agent`: the signed
//! bootstrap bundle.
//!
//! * [`payload`] — the v2 bundle payload (identity, freshness, files, artifacts, packages, plan).
//! * [`envelope`] — the DSSE envelope: PAE, signing (feature `sign`) and verification that checks
//!   the ed25519 signature over the exact payload bytes before any JSON parsing.
//! * [`keyring`] — trusted public keys by key id, loaded from `.pub` files.
//! * [`names`] — validated newtypes (paths under the allow-list, modes, digests, names) so that a
//!   value which exists has already been checked.
//! * [`contract`] — headers, roles, bundle kinds and report phases both programs share;
//!   [`node_auth`] — a node's day-2 key and its signed requests.
//! * [`binding`] — the agent-side checks that tie a verified bundle to one machine and one request.
//! * [`error`] — [`BundleError`], whose variants say exactly why a bundle was refused.
//!
//! This crate deliberately has no async runtime, HTTP or database dependency: the static agent
//! links it.

pub mod binding;
pub mod contract;
pub mod envelope;
pub mod error;
pub mod keyring;
pub mod limits;
pub mod names;
pub mod node_auth;
pub mod payload;
mod serde_util;

pub use binding::{Disposition, Expected};
pub use envelope::{BUNDLE_PAYLOAD_TYPE, Envelope, VerifiedBundle, verify};
pub use error::BundleError;
pub use keyring::{KeyId, Keyring, KeyringError};
pub use payload::BundlePayload;

#[cfg(feature = "sign")]
pub use envelope::signer::BundleSigner;

/// An error and its causes on one line, for logs (each `Display` names only its own layer).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}
