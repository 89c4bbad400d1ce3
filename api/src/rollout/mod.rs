//! Rollouts: handing a node's next generation out safely. A control-plane node gets its update
//! only while every other control-plane node is healthy at what it applied and none is in the
//! middle of an update — at most one control-plane node is ever unavailable, so a 3-node
//! cluster keeps etcd quorum and the apiserver stays reachable throughout. A node already in
//! flight may always fetch again (its own retry). Workers are not gated here.
//!
//! [`gate`] is the one decision: issuance takes it on loaded rows
//! (cheap, before any certificate is minted) and again on rows read under the cluster's lock
//! when the serial is taken (`db::nodes::lock_cluster`, then `db::nodes::hand_update`).
//! [`start`] bumps every node's desired generation: the operator's "re-issue everything".

use crate::db::Db;
use crate::db::{self, DbError, phase::ClusterPhase};

pub mod gate;

pub use gate::{Hold, SnapshotWait, gate};

/// A started rollout: every node's new desired generation.
#[derive(Debug, Clone)]
pub struct Started {
    pub cluster_id: i64,
    pub nodes: Vec<(i64, i64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("{0}")]
    Restoring(String),
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
    if let Some(why) = db::restores::refusal(&db.pool, cluster_id, "roll out after it").await? {
        return Err(RolloutError::Restoring(why));
    }
    let mut tx = db.begin().await?;
    let nodes = db::nodes::bump_generations(&mut tx, cluster_id).await?;
    tx.commit().await?;
    tracing::info!(cluster_id, nodes = nodes.len(), "rollout started");
    Ok(Started { cluster_id, nodes })
}
