//! Binding a verified bundle to one machine and one request (SECURITY.md 10–12): the payload's
//! vm, cluster and org must be the caller's, its kind the one asked for, the nonce must be the one just sent, the bundle
//! must be within its validity window, and its serial must not go backwards.
//!
//! # Clock skew
//!
//! A VM's clock may be off at first boot, before time sync. Both ends of the validity window are
//! therefore judged with [`DEFAULT_CLOCK_SKEW_SECS`] (five minutes) of allowance: a bundle is
//! accepted while `issued_at - skew <= now <= expires_at + skew`, with `now` the agent's start
//! time.

use crate::envelope::VerifiedBundle;
use crate::error::BundleError;
use crate::names::Nonce;

/// Default allowance for clock differences between API and VM, in seconds.
pub const DEFAULT_CLOCK_SKEW_SECS: i64 = 300;

/// What the caller expects of the bundle it asked for.
#[derive(Debug, Clone)]
pub struct Expected<'a> {
    /// This machine's VM id from instance metadata.
    pub vm_id: u64,
    /// The nonce sent with the request; `None` for a local file with no request (`apply`).
    pub nonce: Option<&'a Nonce>,
    pub cluster_id: Option<u64>,
    pub org_id: Option<u64>,
    /// The kind asked for (`None` for a local file, which may be either).
    pub kind: Option<crate::contract::BundleKind>,
    /// Unix seconds, the agent's start time.
    pub now: i64,
    pub clock_skew_secs: i64,
    /// The highest serial already applied, from the agent's state.
    pub applied_serial: Option<u64>,
}

/// What to do with a bundle that passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// A newer serial than anything applied: apply it.
    Apply,
    /// The same serial as the last applied bundle: nothing to do.
    AlreadyApplied,
}

impl VerifiedBundle {
    /// Checks identity, nonce, freshness and rollback, in that order.
    pub fn check_binding(&self, expected: &Expected<'_>) -> Result<Disposition, BundleError> {
        let identity = &self.payload().identity;
        let freshness = &self.payload().freshness;
        if identity.vm_id != expected.vm_id {
            return Err(BundleError::WrongVm {
                expected: expected.vm_id,
                found: identity.vm_id,
            });
        }
        if let Some(cluster_id) = expected.cluster_id.filter(|id| *id != identity.cluster_id) {
            return Err(BundleError::WrongCluster {
                expected: cluster_id,
                found: identity.cluster_id,
            });
        }
        if let Some(org_id) = expected.org_id.filter(|id| *id != identity.org_id) {
            return Err(BundleError::WrongOrg {
                expected: org_id,
                found: identity.org_id,
            });
        }
        if let Some(kind) = expected.kind.filter(|kind| *kind != identity.kind) {
            return Err(BundleError::WrongKind {
                expected: kind,
                found: identity.kind,
            });
        }
        if expected
            .nonce
            .is_some_and(|nonce| *nonce != freshness.nonce)
        {
            return Err(BundleError::NonceMismatch);
        }
        let skew = expected.clock_skew_secs;
        if expected.now > freshness.expires_at.saturating_add(skew) {
            return Err(BundleError::Expired {
                expires_at: freshness.expires_at,
                now: expected.now,
                skew_secs: skew,
            });
        }
        if freshness.issued_at.saturating_sub(skew) > expected.now {
            return Err(BundleError::NotYetValid {
                issued_at: freshness.issued_at,
                now: expected.now,
                skew_secs: skew,
            });
        }
        match expected.applied_serial {
            Some(applied) if freshness.serial < applied => Err(BundleError::Rollback {
                found: freshness.serial,
                applied,
            }),
            Some(applied) if freshness.serial == applied => Ok(Disposition::AlreadyApplied),
            _ => Ok(Disposition::Apply),
        }
    }
}
