//! [`BundleError`]: every reason a bundle is refused, one variant each, so callers (the agent's
//! exit code, the API's tests, an operator reading a log) can tell them apart.

use crate::keyring::KeyId;

/// Why a bundle was refused.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    // --- envelope -------------------------------------------------------------------------
    #[error("envelope is {size} bytes, over the {limit}-byte limit")]
    EnvelopeTooLarge { size: u64, limit: u64 },
    #[error("envelope is not a DSSE envelope (at `{at}`: {reason})")]
    MalformedEnvelope { at: String, reason: String },
    #[error("envelope payload is not valid standard base64")]
    PayloadEncoding,
    #[error("envelope carries no signature")]
    Unsigned,
    // --- signature ------------------------------------------------------------------------
    #[error("no signature is by a trusted key (key ids in the envelope: {key_ids})")]
    UnknownKeyId { key_ids: String },
    #[error("the signature by trusted key {key_id} does not verify")]
    BadSignature { key_id: KeyId },
    // --- payload --------------------------------------------------------------------------
    #[error("payload type is `{found}`, expected `{expected}`")]
    WrongPayloadType {
        found: String,
        expected: &'static str,
    },
    #[error("payload is not a valid v2 bundle (at `{at}`: {reason})")]
    MalformedPayload { at: String, reason: String },
    #[error("path `{path}` appears more than once")]
    DuplicatePath { path: String },
    #[error("content of `{path}` does not match its sha256")]
    DigestMismatch { path: String },
    #[error("a plan step names `{path}`, which is not one of the bundle's files")]
    PlanFileMissing { path: String },
    #[error("bundle validity window is empty (expires_at is not after issued_at)")]
    EmptyValidity,
    #[error("bundle generation is 0; generations start at 1")]
    ZeroGeneration,
    // --- binding to this machine and request ---------------------------------------------
    #[error("bundle is for vm {found}, this machine is vm {expected}")]
    WrongVm { expected: u64, found: u64 },
    #[error("bundle is for cluster {found}, expected cluster {expected}")]
    WrongCluster { expected: u64, found: u64 },
    #[error("bundle is for org {found}, expected org {expected}")]
    WrongOrg { expected: u64, found: u64 },
    #[error("bundle is of kind {found} where kind {expected} was asked for")]
    WrongKind {
        expected: crate::contract::BundleKind,
        found: crate::contract::BundleKind,
    },
    #[error("bundle does not echo this request's nonce")]
    NonceMismatch,
    #[error("bundle expired at {expires_at} (now {now}, skew allowance {skew_secs}s)")]
    Expired {
        expires_at: i64,
        now: i64,
        skew_secs: i64,
    },
    #[error(
        "bundle is issued in the future at {issued_at} (now {now}, skew allowance {skew_secs}s)"
    )]
    NotYetValid {
        issued_at: i64,
        now: i64,
        skew_secs: i64,
    },
    #[error("bundle serial {found} is older than the applied serial {applied} (rollback)")]
    Rollback { found: u64, applied: u64 },
}

impl BundleError {
    /// A stable, short name for the refusal (used by fixtures, metrics and logs).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::EnvelopeTooLarge { .. } => "envelope-too-large",
            Self::MalformedEnvelope { .. } => "malformed-envelope",
            Self::PayloadEncoding => "payload-encoding",
            Self::Unsigned => "unsigned",
            Self::UnknownKeyId { .. } => "unknown-keyid",
            Self::BadSignature { .. } => "bad-signature",
            Self::WrongPayloadType { .. } => "wrong-payload-type",
            Self::MalformedPayload { .. } => "malformed-payload",
            Self::DuplicatePath { .. } => "duplicate-path",
            Self::DigestMismatch { .. } => "digest-mismatch",
            Self::PlanFileMissing { .. } => "plan-file-missing",
            Self::EmptyValidity => "empty-validity",
            Self::ZeroGeneration => "zero-generation",
            Self::WrongKind { .. } => "wrong-kind",
            Self::WrongVm { .. } => "wrong-vm",
            Self::WrongCluster { .. } => "wrong-cluster",
            Self::WrongOrg { .. } => "wrong-org",
            Self::NonceMismatch => "nonce-mismatch",
            Self::Expired { .. } => "expired",
            Self::NotYetValid { .. } => "not-yet-valid",
            Self::Rollback { .. } => "rollback",
        }
    }

    /// True for refusals decided before the signature was known good: nothing in the payload
    /// was looked at.
    pub fn is_pre_signature(&self) -> bool {
        matches!(
            self,
            Self::EnvelopeTooLarge { .. }
                | Self::MalformedEnvelope { .. }
                | Self::PayloadEncoding
                | Self::Unsigned
                | Self::UnknownKeyId { .. }
                | Self::BadSignature { .. }
        )
    }
}
