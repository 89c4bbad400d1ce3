//! `POST /clusters/{id}/nodes/{vm_id}/replace`: a control-plane member is swapped for a new
//! one. The request is recorded on the member (`replace_since`) with the cluster's current size
//! as the size asked for; [`super::converge`] does the rest, one step at a time:
//!
//! * the member is healthy: a new member joins first (a surge of one, as Cluster API's
//!   KubeadmControlPlane rolls out), then the old one leaves — quorum never rests on fewer
//!   members than before;
//! * the member is down (its agent reported etcd unhealthy, or it failed): it leaves first,
//!   removed by the oldest healthy voter — etcd refuses to add even a learner while a voter is
//!   unreachable — and its replacement joins after.

use super::Membership;
use super::{MembershipError, Scaling, majority_without, member_of, remover, target_of};
use crate::db;
use exk8s_common::contract::Role;

/// Records the replacement of `vm_id` and starts it. Refused while another change is in
/// progress, when the cluster is not founded or rotating its CAs, and — for a member that is
/// down — when the members left would not have a healthy majority.
pub async fn replace(
    ctx: &Membership,
    org_id: i64,
    cluster_id: i64,
    vm_id: i64,
) -> Result<Scaling, MembershipError> {
    let nodes = member_of(ctx, org_id, cluster_id, vm_id).await?;
    let target = target_of(&nodes, vm_id)?;
    if let Some(why) =
        db::restores::refusal(&ctx.db.pool, cluster_id, "replace a member after it").await?
    {
        return Err(MembershipError::Conflict(why));
    }
    let control_plane: Vec<_> = nodes
        .iter()
        .filter(|n| n.role == Role::ControlPlane)
        .collect();
    let voters = i64::try_from(control_plane.len()).unwrap_or(i64::MAX);
    if let Some(asked) = db::membership::desired(&ctx.db.pool, cluster_id).await? {
        if asked != voters {
            return Err(MembershipError::Conflict(format!(
                "a change to {asked} members is in progress ({voters} now)"
            )));
        }
    }
    if target.phase.healthy() {
        // A surge: every member must be healthy and current before a new one joins.
        if let Some(unhealthy) = control_plane
            .iter()
            .find(|n| !n.phase.healthy() || !n.up_to_date())
        {
            return Err(MembershipError::Conflict(format!(
                "the control plane is not healthy and up to date: {} is {} at generation {} of {}; \
                 replace that member first",
                unhealthy.node_name,
                unhealthy.phase,
                unhealthy.applied_generation,
                unhealthy.desired_generation
            )));
        }
    } else {
        if control_plane.len() == 1 {
            return Err(MembershipError::Conflict(format!(
                "VM {vm_id} is the cluster's only control-plane member and it is {}: with no \
                 other member there is no quorum to replace it through",
                target.phase
            )));
        }
        majority_without(&control_plane, target, "removing it first")?;
        if remover(control_plane.iter().copied(), target).is_none() {
            return Err(MembershipError::Conflict(
                "no other healthy member to remove it".into(),
            ));
        }
    }
    let mut tx = ctx.db.begin().await?;
    db::membership::set_desired(&mut *tx, cluster_id, voters).await?;
    db::membership::mark_replaced(&mut *tx, target.id, ctx.clock.unix()).await?;
    tx.commit().await?;
    tracing::info!(
        cluster_id,
        vm_id,
        healthy = target.phase.healthy(),
        "control-plane member replacement started"
    );
    super::converge::spawn(ctx.clone(), cluster_id);
    Ok(Scaling {
        desired: voters,
        voters,
    })
}
