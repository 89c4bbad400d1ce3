//! `CertificatesAvailable`: judged from the certificate inventory — unavailable once anything
//! the cluster runs expired, available but saying so while a leaf nears its end unrenewed.

use super::{Condition, Status};
use crate::certificates::{Entry, Inventory, is_operator_credential};

/// Leaves with fewer days left than this make `CertificatesAvailable` say so.
pub const EXPIRING_SOON_DAYS: i64 = 30;

/// The cluster's `CertificatesAvailable` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Availability {
    /// `None`: nothing issued yet (unknown).
    pub available: Option<bool>,
    pub reason: &'static str,
    pub message: String,
    /// Unix seconds of the last transition: when the first certificate expired, or when the
    /// certificates now in use were issued.
    pub since: i64,
}

fn describe(entry: &Entry) -> String {
    match entry.vm_id {
        Some(vm) => format!("{} of vm {vm}", entry.row.name),
        None => entry.row.name.to_string(),
    }
}

/// Judges the inventory at `now`: unavailable once anything the cluster runs (its CAs and every
/// node's certificates, not an operator's kubeconfig) is expired; available, but saying so, while
/// one has fewer than [`EXPIRING_SOON_DAYS`] left and its renewal has not succeeded.
pub fn availability(inventory: &Inventory, created_at: i64, now: i64) -> Availability {
    let running: Vec<&Entry> = inventory
        .certificates
        .iter()
        .filter(|e| !is_operator_credential(&e.row))
        .collect();
    let Some(soonest) = running.first() else {
        return Availability {
            available: None,
            reason: "NotYetIssued",
            message: "no certificate has been issued yet".into(),
            since: created_at,
        };
    };
    let expired: Vec<&&Entry> = running.iter().filter(|e| e.row.not_after <= now).collect();
    if !expired.is_empty() {
        return Availability {
            available: Some(false),
            reason: "CertificatesExpired",
            message: format!(
                "{} certificate(s) expired, first {}",
                expired.len(),
                describe(soonest)
            ),
            since: soonest.row.not_after,
        };
    }
    let since = running
        .iter()
        .map(|e| e.row.not_before)
        .max()
        .unwrap_or(created_at);
    if soonest.days_left < EXPIRING_SOON_DAYS {
        return Availability {
            available: Some(true),
            reason: "CertificatesExpiringSoon",
            message: format!(
                "{} expires in {} day(s) and its renewal has not succeeded yet",
                describe(soonest),
                soonest.days_left
            ),
            since,
        };
    }
    Availability {
        available: Some(true),
        reason: "CertificatesValid",
        message: format!(
            "the soonest expiry, {}, is {} days away",
            describe(soonest),
            soonest.days_left
        ),
        since,
    }
}

/// The condition `a` describes.
pub fn certificates(a: &Availability) -> Condition {
    Condition {
        type_: "CertificatesAvailable",
        status: match a.available {
            Some(true) => Status::True,
            Some(false) => Status::False,
            None => Status::Unknown,
        },
        reason: a.reason,
        message: a.message.clone(),
        since: a.since,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificates::tests::{entry, inventory};

    #[test]
    fn available_until_something_the_cluster_runs_expires() {
        let day = 86_400;
        let now = 100 * day;
        let empty = availability(&inventory(vec![]), 5, now);
        assert_eq!((empty.available, empty.reason), (None, "NotYetIssued"));

        let valid = availability(
            &inventory(vec![
                entry("apiserver", Some(7), now - day, now + 200 * day, now),
                // An operator's own kubeconfig does not count.
                entry("operator.kubeconfig", None, now - 9 * day, now - day, now),
            ]),
            5,
            now,
        );
        assert_eq!(
            (valid.available, valid.reason),
            (Some(true), "CertificatesValid")
        );
        assert_eq!(valid.since, now - day);

        let soon = availability(
            &inventory(vec![entry(
                "kubelet",
                Some(7),
                now - day,
                now + 10 * day,
                now,
            )]),
            5,
            now,
        );
        assert_eq!(
            (soon.available, soon.reason),
            (Some(true), "CertificatesExpiringSoon")
        );
        assert!(
            soon.message
                .contains("kubelet of vm 7 expires in 10 day(s)"),
            "{}",
            soon.message
        );

        let expired = availability(
            &inventory(vec![
                entry("etcd-peer", Some(8), now - 9 * day, now - 2 * day, now),
                entry("kubelet", Some(7), now - day, now + 10 * day, now),
            ]),
            5,
            now,
        );
        assert_eq!(
            (expired.available, expired.reason),
            (Some(false), "CertificatesExpired")
        );
        assert_eq!(expired.since, now - 2 * day);
        assert!(
            expired.message.contains("etcd-peer of vm 8"),
            "{}",
            expired.message
        );
    }
}
