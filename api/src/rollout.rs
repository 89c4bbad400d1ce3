//! Rollouts: handing a node's next generation out safely. A control-plane node gets its update
//! only while every other control-plane node is healthy at what it applied and none is in the
//! middle of an update — at most one control-plane node is ever unavailable, so a 3-node
//! cluster keeps etcd quorum and the apiserver stays reachable throughout. A node already in
//! flight may always fetch again (its own retry). Workers are not gated here.
//!
//! [`gate`] is the one decision: issuance takes it on loaded rows (cheap, before any certificate
//! is minted) and again on rows read under the cluster's lock when the serial is taken
//! (`db::nodes::lock_cluster`, then `db::nodes::hand_update`).
//! [`start`] bumps every node's desired generation: the operator's "re-issue everything".

use exk8s_common::contract::Role;

use crate::db::Db;
use crate::db::{self, DbError, nodes::NodeRow, phase::ClusterPhase};

/// Why a node must wait for its update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Another control-plane node is applying its update.
    AnotherNodeUpdating,
    /// Another control-plane node is not healthy at the generation it applied.
    AnotherNodeUnhealthy { vm_id: i64, phase: String },
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AnotherNodeUpdating => {
                f.write_str("another control-plane node is applying its update")
            }
            Self::AnotherNodeUnhealthy { vm_id, phase } => write!(
                f,
                "control-plane node {vm_id} is not healthy (last report: {phase})"
            ),
        }
    }
}

/// May `node` take its next generation now, given every node of its cluster?
pub fn gate(node: &NodeRow, cluster_nodes: &[NodeRow]) -> Result<(), Hold> {
    if node.role != Role::ControlPlane || node.handed_generation >= node.desired_generation {
        return Ok(());
    }
    // A member being removed holds nobody: it may be dead, and its removal is the update.
    let others = cluster_nodes.iter().filter(|n| {
        n.id != node.id
            && n.role == Role::ControlPlane
            && n.etcd_membership != Some(crate::db::phase::EtcdMembership::Leaving)
    });
    for other in others {
        if other.in_flight() {
            return Err(Hold::AnotherNodeUpdating);
        }
        if !other.phase.healthy() {
            return Err(Hold::AnotherNodeUnhealthy {
                vm_id: other.vm_id,
                phase: other.phase.to_string(),
            });
        }
    }
    Ok(())
}

/// A started rollout: every node's new desired generation.
#[derive(Debug, Clone)]
pub struct Started {
    pub cluster_id: i64,
    pub nodes: Vec<(i64, i64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("cluster not found")]
    NotFound,
    #[error("cluster {id} is {phase}; only a founded cluster can roll out")]
    NotFounded { id: i64, phase: ClusterPhase },
    #[error(transparent)]
    Db(#[from] DbError),
}

/// Gives every node of `org_id`'s cluster `cluster_id` a new generation (re-minted per-bundle
/// certificates, same CAs); nodes fetch it through `exk8s-agent sync`, one control-plane node
/// at a time.
pub async fn start(db: &Db, org_id: i64, cluster_id: i64) -> Result<Started, RolloutError> {
    let cluster = db::clusters::get(&db.pool, org_id, cluster_id)
        .await?
        .ok_or(RolloutError::NotFound)?;
    if cluster.phase != ClusterPhase::Founded {
        return Err(RolloutError::NotFounded {
            id: cluster_id,
            phase: cluster.phase,
        });
    }
    let mut tx = db.begin().await?;
    let nodes = db::nodes::bump_generations(&mut tx, cluster_id).await?;
    tx.commit().await?;
    tracing::info!(cluster_id, nodes = nodes.len(), "rollout started");
    Ok(Started { cluster_id, nodes })
}

#[cfg(test)]
mod tests {
    use exk8s_common::contract::{BootPhase, ReportState};

    use super::*;
    use crate::db::phase::NodePhase;

    fn node(id: i64, handed: i64, applied: i64, desired: i64, phase: NodePhase) -> NodeRow {
        NodeRow {
            id,
            cluster_id: 1,
            ordinal: id,
            vm_id: 100 + id,
            node_name: format!("cp-{id}"),
            private_ipv4: "10.0.0.1".into(),
            private_ipv6: None,
            public_ipv4: None,
            is_initial: id == 1,
            serial: 1,
            issuance_allowed: false,
            role: Role::ControlPlane,
            phase,
            desired_generation: desired,
            handed_generation: handed,
            applied_generation: applied,
            node_key: None,
            pool_id: None,
            removal: None,
            removal_since: None,
            drain_by: None,
            drain_generation: None,
            etcd_membership: Some(crate::db::phase::EtcdMembership::Voter),
            replace_since: None,
            created_at: 0,
        }
    }

    const HEALTHY: NodePhase = NodePhase::Reported {
        phase: BootPhase::Complete,
        state: ReportState::Succeeded,
    };
    const SYNC_FAILED: NodePhase = NodePhase::Reported {
        phase: BootPhase::Sync,
        state: ReportState::Failed,
    };

    #[test]
    fn one_control_plane_node_at_a_time_and_only_beside_healthy_ones() {
        let all = [
            node(1, 1, 1, 2, HEALTHY),
            node(2, 1, 1, 2, HEALTHY),
            node(3, 1, 1, 2, HEALTHY),
        ];
        assert_eq!(gate(&all[0], &all), Ok(()));
        // Node 1 took generation 2 and has not applied it: the others wait.
        let all = [
            node(1, 2, 1, 2, HEALTHY),
            node(2, 1, 1, 2, HEALTHY),
            node(3, 1, 1, 2, HEALTHY),
        ];
        assert_eq!(gate(&all[1], &all), Err(Hold::AnotherNodeUpdating));
        assert_eq!(
            gate(&all[0], &all),
            Ok(()),
            "the node in flight may fetch again"
        );
        // Node 1 failed its sync and restored: the rollout holds until it is healthy.
        let all = [node(1, 2, 1, 2, SYNC_FAILED), node(2, 1, 1, 2, HEALTHY)];
        assert_eq!(gate(&all[1], &all), Err(Hold::AnotherNodeUpdating));
        let all = [node(1, 1, 1, 2, SYNC_FAILED), node(2, 1, 1, 2, HEALTHY)];
        assert!(matches!(
            gate(&all[1], &all),
            Err(Hold::AnotherNodeUnhealthy { vm_id: 101, .. })
        ));
        // Workers are not held by the control plane's rollout.
        let mut worker = node(4, 1, 1, 2, HEALTHY);
        worker.role = Role::Worker;
        assert_eq!(gate(&worker, &all), Ok(()));
    }
}
