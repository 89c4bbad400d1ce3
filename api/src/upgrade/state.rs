//! Where a control plane's Kubernetes version stands, judged from its node rows alone: the
//! version each member runs (its last healthy bundle's), the one it is to run (the cluster's
//! target), and so whether an upgrade — or its rollback — is under way and at which step.
//! Members being removed from etcd are not counted: they leave at whatever version they run.

use exk8s_common::contract::Role;

use super::skew::Release;
use crate::db::nodes::NodeRow;
use crate::db::phase::EtcdMembership;

/// The control-plane members an upgrade moves.
fn members(nodes: &[NodeRow]) -> impl Iterator<Item = &NodeRow> {
    nodes.iter().filter(|n| {
        n.role == Role::ControlPlane && n.etcd_membership != Some(EtcdMembership::Leaving)
    })
}

/// The version `node` runs, if it reported any bundle healthy.
pub fn running(node: &NodeRow) -> Option<Release> {
    node.kubernetes_version.as_deref()?.parse().ok()
}

/// The oldest version a control-plane member runs — Cluster API's `status.version`, the one
/// every kubelet must not be newer than — or `target` when no member has reported one yet.
pub fn oldest(target: Release, nodes: &[NodeRow]) -> Release {
    members(nodes).filter_map(running).min().unwrap_or(target)
}

/// The control plane's versions, as an upgrade sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlane {
    /// The cluster's target: what every member's next bundle renders.
    pub target: Release,
    /// The oldest version a member runs (`target` before any reported).
    pub oldest: Release,
    /// Members that run the target.
    pub done: usize,
    pub members: usize,
    pub step: Step,
}

/// What the upgrade waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Every member runs the target, healthy and up to date: nothing is under way.
    Steady,
    /// `node` was handed the target and has not reported it healthy yet.
    Applying { node: String },
    /// `node` reported its new bundle unhealthy: the rollout holds every other member (and
    /// the agent put back what it ran), until it recovers or the upgrade is rolled back.
    Stopped { node: String, phase: String },
    /// The next member's turn (issuance hands it the target when it asks).
    Next { node: String },
}

impl ControlPlane {
    /// Reads `nodes` against the cluster's `target`.
    pub fn read(target: Release, nodes: &[NodeRow]) -> Self {
        let members: Vec<&NodeRow> = members(nodes).collect();
        let at_target = |n: &&NodeRow| running(n) == Some(target);
        let done = members
            .iter()
            .filter(|n| at_target(n) && n.up_to_date())
            .count();
        let step = if let Some(stopped) = members.iter().find(|n| n.in_flight() && n.phase.failed())
        {
            Step::Stopped {
                node: stopped.node_name.clone(),
                phase: stopped.phase.to_string(),
            }
        } else if let Some(applying) = members.iter().find(|n| n.in_flight()) {
            Step::Applying {
                node: applying.node_name.clone(),
            }
        } else if let Some(next) = members
            .iter()
            .filter(|n| !(at_target(n) && n.up_to_date()))
            .min_by_key(|n| n.ordinal)
        {
            Step::Next {
                node: next.node_name.clone(),
            }
        } else {
            Step::Steady
        };
        Self {
            target,
            oldest: oldest(target, nodes),
            done,
            members: members.len(),
            step,
        }
    }

    /// Some member does not run the target yet.
    pub fn mixed(&self) -> bool {
        self.done < self.members
    }

    /// Some member runs a version other than the target: an upgrade (or its rollback) has
    /// started and not finished.
    pub fn changing(&self, nodes: &[NodeRow]) -> bool {
        members(nodes).any(|n| running(n).is_some_and(|v| v != self.target))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use exk8s_common::contract::{BootPhase, ReportState};

    use super::*;
    use crate::lifecycle::NodePhase;

    pub(crate) fn r(text: &str) -> Release {
        text.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    /// A healthy voter `cp-<ordinal>` running `runs`, at generations handed, applied, desired.
    pub(crate) fn node(ordinal: i64, runs: &str, [handed, applied, desired]: [i64; 3]) -> NodeRow {
        NodeRow {
            id: ordinal,
            cluster_id: 1,
            ordinal,
            vm_id: 100 + ordinal,
            node_name: format!("cp-{ordinal}"),
            private_ipv4: "10.0.0.1".into(),
            private_ipv6: None,
            public_ipv4: None,
            is_initial: ordinal == 0,
            serial: 1,
            issuance_allowed: false,
            role: Role::ControlPlane,
            phase: HEALTHY,
            desired_generation: desired,
            handed_generation: handed,
            applied_generation: applied,
            node_key: None,
            pool_id: None,
            removal: None,
            removal_since: None,
            drain_by: None,
            drain_generation: None,
            etcd_membership: Some(EtcdMembership::Voter),
            replace_since: None,
            handed_version: Some(runs.into()),
            kubernetes_version: Some(runs.into()),
            last_seen_at: None,
            agent_version: None,
            vm_state: None,
            vm_down_since: None,
            silence_counts_from: None,
            created_at: 0,
        }
    }

    const HEALTHY: NodePhase = NodePhase::Reported {
        phase: BootPhase::Sync,
        state: ReportState::Succeeded,
    };

    #[test]
    fn a_steady_control_plane_runs_its_target_everywhere() {
        let nodes = [node(0, "v1.35.3", [1, 1, 1]), node(1, "v1.35.3", [1, 1, 1])];
        let cp = ControlPlane::read(r("v1.35.3"), &nodes);
        assert_eq!((cp.step.clone(), cp.done, cp.members), (Step::Steady, 2, 2));
        assert!(!cp.mixed() && !cp.changing(&nodes));
        assert_eq!(cp.oldest, r("v1.35.3"));
    }

    #[test]
    fn an_upgrade_goes_member_by_member_and_the_oldest_version_is_the_clusters() {
        let target = r("v1.36.3");
        // Started: every member's generation bumped, none handed yet.
        let mut nodes = [
            node(0, "v1.35.3", [1, 1, 2]),
            node(1, "v1.35.3", [1, 1, 2]),
            node(2, "v1.35.3", [1, 1, 2]),
        ];
        let cp = ControlPlane::read(target, &nodes);
        assert_eq!(
            cp.step,
            Step::Next {
                node: "cp-0".into()
            }
        );
        assert!(
            cp.mixed() && cp.changing(&nodes),
            "every member runs another release"
        );
        // cp-0 took it.
        nodes[0].handed_generation = 2;
        nodes[0].handed_version = Some("v1.36.3".into());
        let cp = ControlPlane::read(target, &nodes);
        assert_eq!(
            cp.step,
            Step::Applying {
                node: "cp-0".into()
            }
        );
        // cp-0 reported it healthy.
        nodes[0].applied_generation = 2;
        nodes[0].kubernetes_version = Some("v1.36.3".into());
        let cp = ControlPlane::read(target, &nodes);
        assert_eq!(
            cp.step,
            Step::Next {
                node: "cp-1".into()
            }
        );
        assert_eq!((cp.done, cp.oldest), (1, r("v1.35.3")));
        assert!(cp.changing(&nodes));
        for n in &mut nodes[1..] {
            n.handed_generation = 2;
            n.applied_generation = 2;
            n.kubernetes_version = Some("v1.36.3".into());
        }
        let cp = ControlPlane::read(target, &nodes);
        assert_eq!(
            (cp.step.clone(), cp.done, cp.oldest),
            (Step::Steady, 3, target)
        );
    }

    #[test]
    fn a_member_that_failed_its_new_bundle_stops_the_upgrade_and_is_named() {
        let mut nodes = [node(0, "v1.35.3", [2, 1, 2]), node(1, "v1.35.3", [1, 1, 2])];
        nodes[0].phase = NodePhase::Reported {
            phase: BootPhase::Sync,
            state: ReportState::Failed,
        };
        let cp = ControlPlane::read(r("v1.36.3"), &nodes);
        assert_eq!(
            cp.step,
            Step::Stopped {
                node: "cp-0".into(),
                phase: "sync:failed".into()
            }
        );
    }

    #[test]
    fn leaving_members_and_workers_do_not_count() {
        let mut nodes = [
            node(0, "v1.36.3", [1, 1, 1]),
            node(1, "v1.35.3", [1, 1, 1]),
            node(2, "v1.34.1", [1, 1, 1]),
        ];
        nodes[1].etcd_membership = Some(EtcdMembership::Leaving);
        nodes[2].role = Role::Worker;
        nodes[2].etcd_membership = None;
        assert_eq!(oldest(r("v1.36.3"), &nodes), r("v1.36.3"));
        let cp = ControlPlane::read(r("v1.36.3"), &nodes);
        assert_eq!((cp.members, cp.done), (1, 1));
    }
}
