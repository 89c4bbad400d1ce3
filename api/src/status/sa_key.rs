//! The service-account signing key's conditions: `ServiceAccountKeyFresh` (the key in use is
//! younger than the cluster's maximum age for it) and `ServiceAccountKeyRotating` (a rotation
//! runs: its phase and what it waits for).

use super::{Condition, Status};

/// The key and its policy, as the conditions judge them.
#[derive(Debug, Clone, Copy)]
pub struct SaKey<'a> {
    /// When the key in use was made.
    pub made_at: i64,
    pub max_age_days: i64,
    pub auto_rotate: bool,
    pub rotation: Option<SaKeyRotating<'a>>,
}

/// A rotation in progress.
#[derive(Debug, Clone, Copy)]
pub struct SaKeyRotating<'a> {
    pub phase: &'a str,
    pub updated_at: i64,
    /// The control-plane node the phase waits for, and where it is.
    pub waiting_for: Option<&'a str>,
    /// When the old key goes (sign-new, once every node signs with the new one).
    pub drop_old_at: Option<i64>,
}

/// Whole days `made_at` is old at `now`.
pub fn age_days(made_at: i64, now: i64) -> i64 {
    (now - made_at).div_euclid(86_400)
}

/// `ServiceAccountKeyFresh`: False once the key is past its maximum age, saying what to do.
pub fn sa_key_fresh(key: &SaKey<'_>, cluster: &str, now: i64) -> Condition {
    let age = age_days(key.made_at, now);
    let expires = key
        .made_at
        .saturating_add(key.max_age_days.saturating_mul(86_400));
    let (status, reason, message, since) = if now < expires {
        (
            Status::True,
            "KeyWithinMaxAge",
            format!(
                "the service-account signing key is {age} days old (maximum {} days)",
                key.max_age_days
            ),
            key.made_at,
        )
    } else if key.rotation.is_some() {
        (
            Status::False,
            "KeyRotating",
            format!(
                "the service-account signing key is {age} days old (maximum {} days); its rotation is under way",
                key.max_age_days
            ),
            expires,
        )
    } else if key.auto_rotate {
        (
            Status::False,
            "KeyTooOld",
            format!(
                "the service-account signing key is {age} days old (maximum {} days); the API rotates it once no other change of the cluster runs",
                key.max_age_days
            ),
            expires,
        )
    } else {
        (
            Status::False,
            "KeyTooOld",
            format!(
                "the service-account signing key is {age} days old (maximum {} days); rotate it: exk8s rotate-sa-key {cluster}",
                key.max_age_days
            ),
            expires,
        )
    };
    Condition {
        type_: "ServiceAccountKeyFresh",
        status,
        reason,
        message,
        since,
    }
}

/// `ServiceAccountKeyRotating`: True while a rotation runs, saying its phase and what it
/// waits for (a node, or the time the old key is dropped).
pub fn sa_key_rotating(rotation: Option<&SaKeyRotating<'_>>, since: i64) -> Condition {
    let (status, reason, message, since) = match rotation {
        None => (
            Status::False,
            "NoRotation",
            "no service-account key rotation is in progress".to_owned(),
            since,
        ),
        Some(r) => {
            let (reason, waits) = match (r.waiting_for, r.drop_old_at) {
                (Some(node), _) => ("WaitingForNode", format!("it waits for {node}")),
                (None, Some(at)) if r.phase == "sign-new" => (
                    "WaitingForTokenRefresh",
                    format!(
                        "every apiserver signs with the new key; the old one is trusted until {} (unix seconds) while kubelets refresh their tokens",
                        at
                    ),
                ),
                (None, _) => (
                    "PhaseComplete",
                    "every control-plane node applied it; the next phase starts at the reconciler's next pass".to_owned(),
                ),
            };
            (
                Status::True,
                reason,
                format!(
                    "the service-account key's rotation is in phase {}; {waits}",
                    r.phase
                ),
                r.updated_at,
            )
        }
    };
    Condition {
        type_: "ServiceAccountKeyRotating",
        status,
        reason,
        message,
        since,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;

    fn key(rotation: Option<SaKeyRotating<'static>>, auto_rotate: bool) -> SaKey<'static> {
        SaKey {
            made_at: 10 * DAY,
            max_age_days: 30,
            auto_rotate,
            rotation,
        }
    }

    #[test]
    fn a_key_past_its_age_is_not_fresh_and_says_what_to_do() {
        let young = sa_key_fresh(&key(None, false), "prod", 39 * DAY);
        assert_eq!(
            (young.status, young.reason),
            (Status::True, "KeyWithinMaxAge")
        );
        let old = sa_key_fresh(&key(None, false), "prod", 40 * DAY);
        assert_eq!((old.status, old.reason), (Status::False, "KeyTooOld"));
        assert!(old.message.contains("30 days old"), "{}", old.message);
        assert!(
            old.message.contains("exk8s rotate-sa-key prod"),
            "{}",
            old.message
        );
        assert_eq!(old.since, 40 * DAY);
        let auto = sa_key_fresh(&key(None, true), "prod", 41 * DAY);
        assert!(
            auto.message.contains("the API rotates it"),
            "{}",
            auto.message
        );
        let rotating = SaKeyRotating {
            phase: "trust-both",
            updated_at: 41 * DAY,
            waiting_for: None,
            drop_old_at: None,
        };
        let under_way = sa_key_fresh(&key(Some(rotating), false), "prod", 41 * DAY);
        assert_eq!(under_way.reason, "KeyRotating");
    }

    #[test]
    fn a_rotation_says_what_it_waits_for() {
        let none = sa_key_rotating(None, 5);
        assert_eq!(
            (none.status, none.reason, none.since),
            (Status::False, "NoRotation", 5)
        );
        let node = sa_key_rotating(
            Some(&SaKeyRotating {
                phase: "trust-both",
                updated_at: 7,
                waiting_for: Some("cp-1"),
                drop_old_at: None,
            }),
            5,
        );
        assert_eq!(
            (node.status, node.reason, node.since),
            (Status::True, "WaitingForNode", 7)
        );
        let refresh = sa_key_rotating(
            Some(&SaKeyRotating {
                phase: "sign-new",
                updated_at: 7,
                waiting_for: None,
                drop_old_at: Some(99),
            }),
            5,
        );
        assert_eq!(refresh.reason, "WaitingForTokenRefresh");
        assert!(refresh.message.contains("until 99"), "{}", refresh.message);
    }
}
