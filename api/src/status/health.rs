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
