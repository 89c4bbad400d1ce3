//! Conditions read from the components' health that agents report (`node_components`): per
//! node `EtcdMemberHealthy`, `APIServerPodHealthy`, `ControllerManagerPodHealthy`,
//! `SchedulerPodHealthy` and `KubeletHealthy` (a worker has only the last); per cluster
//! `EtcdClusterHealthy` (every etcd member healthy), `ControlPlaneComponentsHealthy` (every
//! control-plane node's apiserver, controller-manager and scheduler healthy) and `Available`
//! (founded, etcd has quorum and at least one apiserver is healthy — not "every node ready").

use std::collections::BTreeMap;

use exk8s_common::contract::{Component, Role};

use super::{Condition, Status};
use crate::db::components::ComponentRow;
use crate::db::nodes::NodeRow;
use crate::db::phase::EtcdMembership;

/// What a node's agent last reported of each component.
pub struct Health<'a> {
    nodes: &'a [NodeRow],
    reported: BTreeMap<(i64, Component), &'a ComponentRow>,
}

fn condition_type(c: Component) -> &'static str {
    match c {
        Component::Etcd => "EtcdMemberHealthy",
        Component::Apiserver => "APIServerPodHealthy",
        Component::ControllerManager => "ControllerManagerPodHealthy",
        Component::Scheduler => "SchedulerPodHealthy",
        Component::Kubelet => "KubeletHealthy",
    }
}

/// The components a node of `role` runs.
fn components(role: Role) -> &'static [Component] {
    match role {
        Role::ControlPlane => &Component::ALL,
        Role::Worker => &[Component::Kubelet],
    }
}

fn condition(
    type_: &'static str,
    status: Status,
    reason: &'static str,
    message: String,
    since: i64,
) -> Condition {
    Condition {
        type_,
        status,
        reason,
        message,
        since,
    }
}

/// At most five names, then how many more.
fn listed(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(5).map(String::as_str).collect();
    match names.len().saturating_sub(shown.len()) {
        0 => shown.join("; "),
        more => format!("{} and {more} more", shown.join("; ")),
    }
}

impl<'a> Health<'a> {
    pub fn new(nodes: &'a [NodeRow], rows: &'a [ComponentRow]) -> Self {
        Self {
            nodes,
            reported: rows.iter().map(|r| ((r.node_id, r.component), r)).collect(),
        }
    }

    fn of(&self, node: &NodeRow, c: Component) -> Option<&'a ComponentRow> {
        self.reported.get(&(node.id, c)).copied()
    }

    /// The node's component conditions.
    pub fn node(&self, node: &NodeRow) -> Vec<Condition> {
        components(node.role)
            .iter()
            .map(|&c| match self.of(node, c) {
                Some(r) if r.healthy => condition(
                    condition_type(c),
                    Status::True,
                    "Healthy",
                    format!("{c} is healthy"),
                    r.changed_at,
                ),
                Some(r) => condition(
                    condition_type(c),
                    Status::False,
                    "Unhealthy",
                    r.message.clone(),
                    r.changed_at,
                ),
                None => condition(
                    condition_type(c),
                    Status::Unknown,
                    "NotReported",
                    format!("the node's agent has not reported {c} yet"),
                    node.created_at,
                ),
            })
            .collect()
    }

    /// Control-plane nodes not on their way out of the cluster.
    fn control_plane(&self) -> impl Iterator<Item = &'a NodeRow> {
        self.nodes
            .iter()
            .filter(|n| n.role == Role::ControlPlane && n.removal.is_none())
    }

    /// Members with a vote in etcd (leaving ones until etcd drops them).
    fn etcd_members(&self) -> Vec<&'a NodeRow> {
        self.nodes
            .iter()
            .filter(|n| {
                matches!(
                    n.etcd_membership,
                    Some(EtcdMembership::Voter | EtcdMembership::Leaving)
                )
            })
            .collect()
    }

    fn latest(&self, rows: impl Iterator<Item = &'a ComponentRow>, since: i64) -> i64 {
        rows.map(|r| r.changed_at).max().unwrap_or(since)
    }

    /// `EtcdClusterHealthy`, `ControlPlaneComponentsHealthy` and `Available`; `founded` says
    /// whether the cluster's founding finished, `since` is when it was made.
    pub fn cluster(&self, founded: bool, since: i64) -> [Condition; 3] {
        let members = self.etcd_members();
        let quorum = members.len() / 2 + 1;
        let etcd: Vec<Option<&ComponentRow>> = members
            .iter()
            .map(|n| self.of(n, Component::Etcd))
            .collect();
        let healthy_etcd = etcd.iter().flatten().filter(|r| r.healthy).count();
        let sick_etcd: Vec<String> = members
            .iter()
            .zip(&etcd)
            .filter_map(|(n, r)| match r {
                Some(r) if !r.healthy => Some(format!("{}: {}", n.node_name, r.message)),
                None => Some(format!("{}: not reported", n.node_name)),
                Some(_) => None,
            })
            .collect();
        let etcd_at = self.latest(etcd.iter().flatten().copied(), since);
        let etcd_condition = if etcd.iter().all(Option::is_none) {
            condition(
                "EtcdClusterHealthy",
                Status::Unknown,
                "NotReported",
                "no etcd member has reported its health yet".into(),
                since,
            )
        } else if sick_etcd.is_empty() {
            condition(
                "EtcdClusterHealthy",
                Status::True,
                "Healthy",
                format!("all {} etcd members are healthy", members.len()),
                etcd_at,
            )
        } else {
            let reason = if healthy_etcd >= quorum {
                "MembersUnhealthy"
            } else {
                "QuorumLost"
            };
            condition(
                "EtcdClusterHealthy",
                Status::False,
                reason,
                format!(
                    "{healthy_etcd} of {} etcd members are healthy (quorum {quorum}): {}",
                    members.len(),
                    listed(&sick_etcd)
                ),
                etcd_at,
            )
        };

        let pods = [
            Component::Apiserver,
            Component::ControllerManager,
            Component::Scheduler,
        ];
        let (mut sick, mut unknown, mut rows) = (Vec::new(), Vec::new(), Vec::new());
        for node in self.control_plane() {
            for c in pods {
                match self.of(node, c) {
                    Some(r) => {
                        rows.push(r);
                        if !r.healthy {
                            sick.push(format!("{c} on {}: {}", node.node_name, r.message));
                        }
                    }
                    None => unknown.push(format!("{c} on {}", node.node_name)),
                }
            }
        }
        let pods_at = self.latest(rows.iter().copied(), since);
        let pods_condition = if !sick.is_empty() {
            condition(
                "ControlPlaneComponentsHealthy",
                Status::False,
                "Unhealthy",
                listed(&sick),
                pods_at,
            )
        } else if !unknown.is_empty() || rows.is_empty() {
            condition(
                "ControlPlaneComponentsHealthy",
                Status::Unknown,
                "NotReported",
                format!("not reported yet: {}", listed(&unknown)),
                pods_at,
            )
        } else {
            condition(
                "ControlPlaneComponentsHealthy",
                Status::True,
                "Healthy",
                "every control-plane component is healthy".into(),
                pods_at,
            )
        };

        let apiservers = self
            .control_plane()
            .filter(|n| self.of(n, Component::Apiserver).is_some_and(|r| r.healthy))
            .count();
        let (status, reason, message) = if !founded {
            (
                Status::False,
                "NotFounded",
                "the cluster is not founded".to_owned(),
            )
        } else if members.is_empty() || healthy_etcd < quorum {
            (
                Status::False,
                "EtcdQuorumLost",
                format!(
                    "{healthy_etcd} of {} etcd members are healthy; quorum is {quorum}",
                    members.len()
                ),
            )
        } else if apiservers == 0 {
            (
                Status::False,
                "NoHealthyAPIServer",
                "no kube-apiserver is healthy".to_owned(),
            )
        } else {
            (
                Status::True,
                "Available",
                format!(
                    "etcd has quorum ({healthy_etcd} of {} members healthy) and {apiservers} \
                     kube-apiserver(s) are healthy",
                    members.len()
                ),
            )
        };
        let available = condition("Available", status, reason, message, etcd_at.max(pods_at));
        [available, etcd_condition, pods_condition]
    }
}
