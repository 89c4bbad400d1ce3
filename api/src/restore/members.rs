//! The members of a restore: only those whose VM runs are restored onto ([`live_members`]);
//! the ones left out are replaced after it through the membership machinery ([`rebuild`]);
//! and a cluster founded from another's snapshot starts its restore once its control plane is
//! up ([`start_pending`]), the reconciler catching what no report moved ([`pending_pass`]).

use exk8s_api_types::phase::ClusterPhase;
use exk8s_common::contract::Role;

use super::{Restore, RestoreError, begin};
use crate::db::restores::RestorePhase;
use crate::db::{self, DbError};
use crate::snapshots::Snapshots;

/// Starts the restore of a cluster founded from another's snapshot once its control plane is
/// up (every member healthy) and none was started yet; `None` when it is not time.
pub async fn start_pending(
    ctx: &Snapshots,
    cluster_id: i64,
) -> Result<Option<Restore>, RestoreError> {
    let Some((source, snapshot_id)) = db::restores::source_of(&ctx.db.pool, cluster_id).await?
    else {
        return Ok(None);
    };
    if db::restores::latest(&ctx.db.pool, cluster_id)
        .await?
        .is_some()
    {
        return Ok(None);
    }
    let Some(cluster) = db::clusters::get_by_id(&ctx.db.pool, cluster_id).await? else {
        return Ok(None);
    };
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let members: Vec<_> = nodes
        .iter()
        .filter(|n| n.role == Role::ControlPlane)
        .collect();
    if cluster.phase != ClusterPhase::Founded
        || members.is_empty()
        || members.iter().any(|n| !n.phase.healthy())
    {
        return Ok(None);
    }
    match begin(ctx, &cluster, source, snapshot_id).await {
        Ok(started) => Ok(Some(started)),
        // Another API process started it first.
        Err(RestoreError::Db(DbError::Duplicate(_))) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Starts every restore a cluster was founded for whose control plane came up while no report
/// moved it (a crash, a failed start), and replaces the members finished restores left out:
/// the reconciler's part.
pub async fn pending_pass(ctx: &Snapshots, membership: &crate::membership::Membership) {
    match db::restores::latest_done(&ctx.db.pool).await {
        Ok(clusters) => {
            for cluster_id in clusters {
                if let Err(e) = rebuild(ctx, membership, cluster_id).await {
                    tracing::warn!(cluster_id, error = %crate::error_chain(&e), "reconciler: the members a restore left out cannot be replaced");
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "reconciler: cannot list finished restores");
        }
    }
    let pending = match db::restores::pending_sources(&ctx.db.pool).await {
        Ok(pending) => pending,
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "reconciler: cannot list the restores clusters were founded for");
            return;
        }
    };
    for cluster_id in pending {
        if let Err(e) = start_pending(ctx, cluster_id).await {
            tracing::warn!(cluster_id, error = %crate::error_chain(&e), "reconciler: the restore a cluster was founded for cannot start");
        }
    }
}

/// The control-plane members whose VM runs: a restore restores onto them alone (the others
/// are rebuilt after it, [`rebuild`]). Refused when none runs.
pub(super) async fn live_members<'n>(
    ctx: &Snapshots,
    nodes: &'n [db::nodes::NodeRow],
) -> Result<Vec<&'n db::nodes::NodeRow>, RestoreError> {
    let mut live = Vec::new();
    for node in nodes
        .iter()
        .filter(|n| n.role == Role::ControlPlane && n.removal.is_none())
    {
        let vm = ctx
            .compute
            .get_vm(node.vm_id)
            .await
            .map_err(|e| RestoreError::Compute(crate::error_chain(&e)))?;
        match vm {
            Some(vm) if vm.state == "running" => live.push(node),
            other => tracing::warn!(
                cluster_id = node.cluster_id,
                vm_id = node.vm_id,
                state = other.as_ref().map_or("gone", |vm| vm.state.as_str()),
                "a member's VM does not run: the restore leaves it out, and it is replaced after"
            ),
        }
    }
    if live.is_empty() {
        return Err(RestoreError::Conflict(
            "no control-plane member's VM runs: found a new cluster from the snapshot \
             (POST /clusters with restore_from) instead"
                .into(),
        ));
    }
    Ok(live)
}

/// After a restore that left members out (their VMs did not run), replaces them through the
/// membership machinery, one at a time (each removed from the restored etcd, which does not
/// list it, then a new machine joined as a learner and promoted). A change in progress waits
/// for the next call.
pub async fn rebuild(
    ctx: &Snapshots,
    membership: &crate::membership::Membership,
    cluster_id: i64,
) -> Result<(), RestoreError> {
    let Some(latest) = db::restores::latest(&ctx.db.pool, cluster_id).await? else {
        return Ok(());
    };
    if latest.phase != RestorePhase::Done {
        return Ok(());
    }
    let restored: Vec<i64> = db::restores::members(&ctx.db.pool, latest.id)
        .await?
        .into_iter()
        .map(|m| m.node_id)
        .collect();
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let Some(left_out) = nodes.iter().find(|n| {
        n.role == Role::ControlPlane
            && n.removal.is_none()
            && n.replace_since.is_none()
            && n.created_at <= latest.started_at
            && !restored.contains(&n.id)
    }) else {
        return Ok(());
    };
    let Some(cluster) = db::clusters::get_by_id(&ctx.db.pool, cluster_id).await? else {
        return Ok(());
    };
    match crate::membership::replace(membership, cluster.org_id, cluster_id, left_out.vm_id).await {
        Ok(_) => {
            tracing::info!(
                cluster_id,
                vm_id = left_out.vm_id,
                restore_id = latest.id,
                "a member the restore left out is replaced"
            );
            Ok(())
        }
        Err(crate::membership::MembershipError::Conflict(why)) => {
            tracing::info!(cluster_id, vm_id = left_out.vm_id, %why, "a member the restore left out waits to be replaced");
            Ok(())
        }
        Err(e) => Err(RestoreError::Conflict(crate::error_chain(&e))),
    }
}
