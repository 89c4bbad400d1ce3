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
    /// Seconds without a pass after which the next one resumes the watch
    /// ([`db::health_watch`]): past the agents' poll interval, and past two passes.
    pub gap_secs: i64,
}

/// How often a healthy agent asks for its generation at least (its sync timer's interval,
/// before the jitter).
pub const POLL_SECS: i64 = 5 * 60;

impl Checks {
    /// The gap for passes every `interval`.
    pub fn gap_for(interval: std::time::Duration) -> i64 {
        POLL_SECS.max(i64::try_from(interval.as_secs().saturating_mul(2)).unwrap_or(i64::MAX))
    }
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

/// What a pass found to remediate, once each cluster's policy allows it: the pools with an
/// unhealthy worker (their convergence decides whether one may go, [`super::allowed`]) and the
/// clusters with an unhealthy control-plane member ([`crate::membership::remediate`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToRemediate {
    pub pools: Vec<i64>,
    pub control_planes: Vec<i64>,
}

/// What of `cluster_id` is unhealthy now, where its policy (the cluster's for the control
/// plane, each pool's own or else the cluster's for its workers) remediates.
pub async fn to_remediate(ctx: &Checks, cluster_id: i64) -> Result<ToRemediate, DbError> {
    let mut found = ToRemediate::default();
    let Some(cluster) = db::clusters::get_by_id(&ctx.db.pool, cluster_id).await? else {
        return Ok(found);
    };
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let pools = db::pools::list(&ctx.db.pool, cluster_id).await?;
    let components = db::components::for_cluster(&ctx.db.pool, cluster_id).await?;
    let now = ctx.clock.unix();
    let sick = |policy: &super::HealthPolicy, pool_id: Option<i64>| {
        policy.remediation
            && !super::unhealthy(
                policy,
                nodes.iter().filter(|n| n.pool_id == pool_id),
                &components,
                now,
            )
            .is_empty()
    };
    if sick(&crate::health::policy::of(&cluster), None) {
        found.control_planes.push(cluster_id);
    } else if cluster.remediation_blocked.is_some() {
        // No member waits for remediation any more: nothing is held back.
        db::clusters::set_remediation_blocked(&ctx.db.pool, cluster_id, None).await?;
    }
    for pool in &pools {
        if sick(
            &crate::health::policy::for_pool(&cluster, Some(pool)),
            Some(pool.id),
        ) {
            found.pools.push(pool.id);
        } else if pool.remediation_blocked.is_some() {
            // No worker waits for remediation any more: nothing is held back.
            db::pools::set_remediation_blocked(&ctx.db.pool, pool.id, None).await?;
        }
    }
    Ok(found)
}

/// Every founded cluster, one compute call each; returns what to remediate. A cluster whose
/// listing fails keeps what the last pass saw, and the others go on.
pub async fn pass(ctx: &Checks) -> ToRemediate {
    let mut found = ToRemediate::default();
    match db::health_watch::pass_at(&ctx.db, ctx.clock.unix(), ctx.gap_secs).await {
        Ok(true) => tracing::info!(
            gap_secs = ctx.gap_secs,
            "health: the passes resume after a gap; every node's silence counts from now"
        ),
        Ok(false) => {}
        Err(e) => {
            // Judging silence without knowing whether the API was there to hear it could
            // replace healthy machines: no pass.
            tracing::warn!(error = %crate::error_chain(&e), "health: cannot record the pass");
            return found;
        }
    }
    let clusters = match db::clusters::founded(&ctx.db.pool).await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "health: cannot list clusters");
            return found;
        }
    };
    for cluster_id in clusters {
        if let Err(e) = observe(ctx, cluster_id).await {
            tracing::warn!(cluster_id, error = %crate::error_chain(&e), "health: cannot read the cluster's VMs");
        }
        match to_remediate(ctx, cluster_id).await {
            Ok(more) => {
                found.pools.extend(more.pools);
                found.control_planes.extend(more.control_planes);
            }
            Err(e) => {
                tracing::warn!(cluster_id, error = %crate::error_chain(&e), "health: cannot judge the cluster's machines");
            }
        }
    }
    if let Err(e) = db::health_watch::ran_at(&ctx.db, ctx.clock.unix()).await {
        tracing::warn!(error = %crate::error_chain(&e), "health: cannot record the pass's end");
    }
    found
}
