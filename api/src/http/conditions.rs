//! The cluster's conditions, in Cluster API v1beta2's shape: `CertificatesAvailable` (from the
//! certificate inventory) and `MachinesReady` (every machine — control-plane nodes and pool
//! workers not on their way out — finished booting and last reported healthy) and
//! `ScalingUp`/`ScalingDown` (the control plane is changing to the size asked for).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::db::nodes::NodeRow;

/// One condition, as Cluster API v1beta2 writes it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    pub message: String,
    /// RFC 3339.
    #[serde(rename = "lastTransitionTime")]
    pub last_transition_time: String,
}

fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

pub(super) fn certificates(a: &crate::certificates::Availability) -> Condition {
    let status = match a.available {
        Some(true) => "True",
        Some(false) => "False",
        None => "Unknown",
    };
    Condition {
        type_: "CertificatesAvailable".into(),
        status: status.into(),
        reason: a.reason.into(),
        message: a.message.clone(),
        last_transition_time: rfc3339(a.since),
    }
}

/// `MachinesReady`; `since` is when a machine last reported (or the cluster was made).
pub(super) fn machines(nodes: &[NodeRow], since: i64) -> Condition {
    let machines: Vec<&NodeRow> = nodes.iter().filter(|n| n.removal.is_none()).collect();
    let not_ready: Vec<&str> = machines
        .iter()
        .filter(|n| !n.phase.healthy())
        .map(|n| n.node_name.as_str())
        .collect();
    let (status, reason, message) = if machines.is_empty() {
        (
            "Unknown",
            "NoMachines",
            "the cluster has no machine".to_owned(),
        )
    } else if not_ready.is_empty() {
        (
            "True",
            "Ready",
            format!("all {} machines are ready", machines.len()),
        )
    } else {
        let shown: Vec<&str> = not_ready.iter().take(5).copied().collect();
        let more = not_ready.len().saturating_sub(shown.len());
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        (
            "False",
            "NotReady",
            format!(
                "{} of {} machines are not ready: {}{tail}",
                not_ready.len(),
                machines.len(),
                shown.join(", ")
            ),
        )
    };
    Condition {
        type_: "MachinesReady".into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: rfc3339(since),
    }
}

/// `ScalingUp` and `ScalingDown`: True while the control plane grows or shrinks to the size
/// asked for, with the step in progress.
pub(super) fn scaling(
    nodes: &[NodeRow],
    desired: Option<i64>,
    error: Option<&str>,
    since: i64,
) -> [Condition; 2] {
    use crate::db::phase::EtcdMembership;
    let control_plane = || {
        nodes
            .iter()
            .filter(|n| n.role == exk8s_common::contract::Role::ControlPlane)
    };
    let with = |m: EtcdMembership| control_plane().find(move |n| n.etcd_membership == Some(m));
    let voters = control_plane()
        .filter(|n| n.etcd_membership == Some(EtcdMembership::Voter))
        .count();
    let voters = i64::try_from(voters).unwrap_or(i64::MAX);
    let settled = || match error {
        Some(e) => ("False", "ChangeStopped", e.to_owned()),
        None => ("False", "AtDesiredSize", format!("{voters} voting members")),
    };
    let up = match (desired, with(EtcdMembership::Joining)) {
        (_, Some(node)) => (
            "True",
            "MemberJoining",
            format!(
                "{} is joining etcd ({}); {voters} voting",
                node.node_name, node.phase
            ),
        ),
        (_, None) if control_plane().any(|n| n.replace_since.is_some()) => (
            "True",
            "ReplacementPending",
            format!(
                "{} is to be replaced: its replacement joins (or, when it is down, follows its removal) once every other member is healthy and up to date",
                control_plane()
                    .find(|n| n.replace_since.is_some())
                    .map_or("a member", |n| n.node_name.as_str())
            ),
        ),
        (Some(asked), None) if asked > voters => (
            "True",
            "WaitingForRollout",
            format!("{voters} of {asked} members; the next joins once every member is up to date"),
        ),
        _ => settled(),
    };
    let down = match (desired, with(EtcdMembership::Leaving)) {
        (_, Some(node)) => (
            "True",
            "MemberLeaving",
            format!(
                "{} is being drained and removed from etcd by {}",
                node.node_name,
                control_plane()
                    .find(|n| Some(n.id) == node.drain_by)
                    .map_or("another member", |n| n.node_name.as_str())
            ),
        ),
        (Some(asked), None) if asked < voters => (
            "True",
            "WaitingForRollout",
            format!(
                "{voters} members, {asked} asked; the next leaves once every member is up to date"
            ),
        ),
        _ => settled(),
    };
    let condition = |type_: &str, (status, reason, message): (&str, &str, String)| Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: rfc3339(since),
    };
    [condition("ScalingUp", up), condition("ScalingDown", down)]
}
