//! The health pass (run by the reconciler): asks the compute API, once per founded cluster,
//! for the VMs tagged with the cluster, and keeps on each node's row what it says of that
//! node's VM ([`VmSeen`]) and since when it is down. Everything else the checks read (the
//! heartbeat, the components) the agents' own requests keep current.

use std::sync::Arc;

use crate::compute::{Compute, ComputeError};
use crate::db::{self, Db, DbError};

use super::judge::VmSeen;

/// The tag every VM of a cluster carries (founding, membership changes and pools set it).
pub const CLUSTER_TAG: &str = "exk8s.io/cluster";

/// What the pass needs.
#[derive(Debug, Clone)]
pub struct Checks {
    pub db: Db,
    pub compute: Arc<dyn Compute>,
    pub clock: Arc<dyn crate::clock::Clock>,
}

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error(transparent)]
    Db(#[from] DbError),
    /// The stored states stay as they were: an unreachable compute API says nothing of a VM.
    #[error("cannot list the cluster's VMs")]
    Compute(#[from] ComputeError),
}

/// One cluster's VMs: stores each node's change of VM state. Returns how many changed.
pub async fn observe(ctx: &Checks, cluster_id: i64) -> Result<usize, PassError> {
    // The nodes first: each one's VM was made before its row, so before this listing, and a
    // VM missing from it is truly gone (listing first would call a worker made in between
    // gone).
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let vms = ctx
        .compute
        .vms_tagged(CLUSTER_TAG, &cluster_id.to_string())
        .await?;
    let now = ctx.clock.unix();
    let mut changed = 0;
    for node in &nodes {
        let seen = VmSeen::of(vms.iter().find(|vm| vm.id == node.vm_id));
        if seen.stored() == node.vm_state.as_deref() {
            continue;
        }
        db::nodes::set_vm_state(&ctx.db.pool, node.id, seen.stored(), now).await?;
        changed += 1;
        match &seen {
            VmSeen::Up => {
                tracing::info!(cluster_id, vm_id = node.vm_id, node = %node.node_name, "health: the node's VM runs again")
            }
            VmSeen::Down(state) => {
                tracing::warn!(cluster_id, vm_id = node.vm_id, node = %node.node_name, state = %state, "health: the node's VM is not running")
            }
            VmSeen::Gone => {
                tracing::warn!(cluster_id, vm_id = node.vm_id, node = %node.node_name, "health: the compute API no longer knows the node's VM")
            }
        }
    }
    Ok(changed)
}

/// The pools of `cluster_id` with a worker unhealthy now, when its policy remediates (their
/// convergence decides whether the policy lets one go, [`super::allowed`]).
pub async fn pools_to_remediate(ctx: &Checks, cluster_id: i64) -> Result<Vec<i64>, DbError> {
    let Some(cluster) = db::clusters::get_by_id(&ctx.db.pool, cluster_id).await? else {
        return Ok(Vec::new());
    };
    let policy = crate::health::policy::of(&cluster);
    if !policy.remediation {
        return Ok(Vec::new());
    }
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let components = db::components::for_cluster(&ctx.db.pool, cluster_id).await?;
    let workers = nodes.iter().filter(|n| n.pool_id.is_some());
    let mut pools: Vec<i64> = super::unhealthy(&policy, workers, &components, ctx.clock.unix())
        .iter()
        .filter_map(|u| u.node.pool_id)
        .collect();
    pools.sort_unstable();
    pools.dedup();
    Ok(pools)
}

/// Every founded cluster, one compute call each; returns the pools that have a worker to
/// remediate. A cluster whose listing fails keeps what the last pass saw, and the others go on.
pub async fn pass(ctx: &Checks) -> Vec<i64> {
    let clusters = match db::clusters::founded(&ctx.db.pool).await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "health: cannot list clusters");
            return Vec::new();
        }
    };
    let mut pools = Vec::new();
    for cluster_id in clusters {
        if let Err(e) = observe(ctx, cluster_id).await {
            tracing::warn!(cluster_id, error = %crate::error_chain(&e), "health: cannot read the cluster's VMs");
        }
        match pools_to_remediate(ctx, cluster_id).await {
            Ok(found) => pools.extend(found),
            Err(e) => {
                tracing::warn!(cluster_id, error = %crate::error_chain(&e), "health: cannot judge the cluster's workers");
            }
        }
    }
    pools
}
