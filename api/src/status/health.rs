//! `HealthCheckSucceeded` per machine (Cluster API's MachineHealthCheck condition): the
//! machine's [`Verdict`] against its cluster's health policy, with the problem and how long it
//! has lasted.

use super::{Condition, Status};
use crate::db::nodes::NodeRow;
use crate::health::Verdict;

/// Whole minutes in `secs`, for a message.
fn minutes(secs: i64) -> String {
    match secs.max(0) / 60 {
        1 => "1 minute".to_owned(),
        m => format!("{m} minutes"),
    }
}

/// The machine's `HealthCheckSucceeded`.
pub fn health_check(node: &NodeRow, verdict: &Verdict, now: i64) -> Condition {
    let condition = |status, reason, message, since| Condition {
        type_: "HealthCheckSucceeded",
        status,
        reason,
        message,
        since,
    };
    match verdict {
        Verdict::Healthy => condition(
            Status::True,
            "Healthy",
            "its VM runs, its agent keeps asking for updates and its components report healthy"
                .to_owned(),
            node.created_at,
        ),
        Verdict::Suspect {
            problem,
            since,
            unhealthy_at,
        } => condition(
            Status::True,
            "Watching",
            format!(
                "{} ({} so far); unhealthy in {} if it stays so",
                problem.describe(),
                minutes(now - since),
                minutes(unhealthy_at - now)
            ),
            *since,
        ),
        Verdict::Unhealthy { problem, since } => condition(
            Status::False,
            problem.reason(),
            format!("{} ({})", problem.describe(), minutes(now - since)),
            *since,
        ),
        Verdict::Leaving => condition(
            Status::Unknown,
            "Leaving",
            "the machine is being removed".to_owned(),
            node.removal_since.unwrap_or(node.created_at),
        ),
    }
}

/// The stored reason of a refusal, as a condition's static reason (a word this build does not
/// know reads as `Blocked`).
fn blocked_reason(stored: &str) -> &'static str {
    [
        "RemediationOff",
        "TooManyUnhealthy",
        "QuorumAtRisk",
        "RetriesExhausted",
        "ChangeInProgress",
    ]
    .into_iter()
    .find(|r| *r == stored)
    .unwrap_or("Blocked")
}

/// The cluster's `RemediationAllowed` (Cluster API's MachineHealthCheck condition): False when
/// its policy turns remediation off, or while the health pass leaves an unhealthy
/// control-plane member alone (`stored`, [`crate::health::blocked`]) or a pool an unhealthy
/// worker (named) — saying why.
pub fn remediation_allowed(
    policy: &crate::health::HealthPolicy,
    stored: Option<&str>,
    pools: &[crate::db::pools::PoolRow],
    since: i64,
) -> Condition {
    let condition = |status, reason, message, since| Condition {
        type_: "RemediationAllowed",
        status,
        reason,
        message,
        since,
    };
    if !policy.remediation {
        return condition(
            Status::False,
            "RemediationOff",
            crate::health::Blocked::Off.describe(),
            since,
        );
    }
    // The control plane's refusal first, then each pool's, named.
    let held: Vec<crate::health::blocked::Held> = crate::health::blocked::read(stored)
        .into_iter()
        .chain(pools.iter().filter_map(|p| {
            crate::health::blocked::read(p.remediation_blocked.as_deref()).map(|held| {
                crate::health::blocked::Held {
                    message: format!("pool {}: {}", p.name, held.message),
                    ..held
                }
            })
        }))
        .collect();
    match held.first() {
        Some(first) => condition(
            Status::False,
            blocked_reason(&first.reason),
            held.iter()
                .map(|h| h.message.as_str())
                .collect::<Vec<_>>()
                .join("; "),
            held.iter().map(|h| h.since).min().unwrap_or(first.since),
        ),
        None => condition(
            Status::True,
            "Allowed",
            "a machine unhealthy past its policy's timeout is replaced, one at a time".to_owned(),
            since,
        ),
    }
}
