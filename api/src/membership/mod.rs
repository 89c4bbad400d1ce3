//! Changing a running control plane's size (`PATCH /clusters/{id}`): the size asked for is
//! recorded, then [`converge`] adds members one at a time — a new VM, its serving
//! certificates, a node that joins etcd as a learner through the voters and is promoted by its
//! own agent — each only when every member is healthy and up to date, so quorum and the
//! apiserver hold throughout. After each promotion every control-plane node gets a new
//! generation (the apiservers' `--etcd-servers` follow), rolled one node at a time.
//!
//! Scaling down removes the newest member first, one at a time: the oldest voter's agent drains
//! it and removes it from etcd (leadership moved off it first); once that agent reports the
//! generation applied, the VM is deleted and every member follows. Replacing a member
//! ([`replace`]) combines the two: the new member joins first and the old one leaves after it
//! — or, when the old one is down (etcd refuses new members while a voter is unreachable), it
//! leaves first and its replacement joins after.

pub mod converge;
mod remedy;
mod replace;

pub use remedy::{Remedy, remediate};
pub use replace::replace;

use std::sync::Arc;

use crate::config::ApiConfig;
use crate::db::{self, Db, phase::EtcdMembership};
use crate::field::{FieldError, Validate};
pub use exk8s_api_types::ClusterPatch;
use exk8s_common::contract::Role;

/// The sizes a control plane may have: an odd number of etcd members.
pub const COUNTS: [i64; 4] = [1, 3, 5, 7];

/// What changing a control plane needs: the rows, the clock joins are timed by, the settings
/// (quotas, the join deadline), opened trust, the KEKs and the CPU pool (a new member's serving
/// certificates), the key pool (told of the cluster's new size), and the machines with their
/// DNS name.
#[derive(Debug, Clone)]
pub struct Membership {
    pub db: Db,
    pub clock: Arc<dyn crate::clock::Clock>,
    pub config: Arc<ApiConfig>,
    pub keks: Arc<crate::crypto::Keyring>,
    pub issuers: Arc<crate::records::issuers::IssuerCache>,
    pub cpu: crate::cpu::CpuPool,
    pub key_pool: crate::keypool::KeyPool,
    pub machines: crate::machines::Machines,
}

/// Why a membership change was refused.
pub type MembershipError = crate::machineset::ChangeError;

/// Where a change stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scaling {
    pub desired: i64,
    pub voters: i64,
}

impl Validate for &ClusterPatch {
    type Valid = i64;

    fn validate(self) -> Result<i64, FieldError> {
        let field = "control_plane_count";
        let count = self
            .control_plane_count
            .ok_or_else(|| FieldError::new(field, "control_plane_count is required"))?;
        if !COUNTS.contains(&count) {
            return Err(FieldError::new(
                field,
                format!(
                    "control_plane_count must be 1, 3, 5 or 7 (an odd number of etcd members keeps a majority), not {count}"
                ),
            ));
        }
        Ok(count)
    }
}

/// Who removes `leaving` from etcd: the oldest other voter whose agent last reported healthy
/// and whose VM the last health pass saw running (its bundle carries the removal; a dead member
/// could not perform it).
pub(crate) fn remover<'a>(
    control_plane: impl IntoIterator<Item = &'a db::nodes::NodeRow>,
    leaving: &db::nodes::NodeRow,
) -> Option<&'a db::nodes::NodeRow> {
    control_plane
        .into_iter()
        .filter(|n| {
            n.id != leaving.id
                && n.role == Role::ControlPlane
                && n.etcd_membership == Some(EtcdMembership::Voter)
                && n.phase.healthy()
                && n.vm_state.is_none()
        })
        .min_by_key(|n| n.ordinal)
}

/// Refuses while a member is joining, leaving or being replaced: one change at a time.
fn no_change_in_progress(control_plane: &[&db::nodes::NodeRow]) -> Result<(), MembershipError> {
    if let Some(replaced) = control_plane.iter().find(|n| n.replace_since.is_some()) {
        return Err(MembershipError::Conflict(format!(
            "a membership change is in progress: {} is being replaced",
            replaced.node_name
        )));
    }
    match control_plane
        .iter()
        .find(|n| n.etcd_membership != Some(EtcdMembership::Voter))
    {
        Some(changing) => Err(MembershipError::Conflict(format!(
            "a membership change is in progress: {} is {}",
            changing.node_name,
            changing
                .etcd_membership
                .map_or("without membership", EtcdMembership::as_str)
        ))),
        None => Ok(()),
    }
}

/// Records the size asked for and starts the change; refused unless the cluster is founded,
/// healthy, up to date and not changing already.
pub async fn scale(
    ctx: &Membership,
    org_id: i64,
    cluster_id: i64,
    count: i64,
) -> Result<Scaling, MembershipError> {
    crate::machineset::founded_cluster(&ctx.db, org_id, cluster_id).await?;
    if let Some(why) = db::restores::refusal(
        &ctx.db.pool,
        cluster_id,
        "change the control plane after it",
    )
    .await?
    {
        return Err(MembershipError::Conflict(why));
    }
    if let Some(why) = db::rotations::refusal(
        &ctx.db.pool,
        cluster_id,
        "change the control plane after it",
    )
    .await?
    {
        return Err(MembershipError::Conflict(why));
    }
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let control_plane: Vec<_> = nodes
        .iter()
        .filter(|n| n.role == Role::ControlPlane)
        .collect();
    no_change_in_progress(&control_plane)?;
    let voters = i64::try_from(control_plane.len()).unwrap_or(i64::MAX);
    if let Some(asked) = db::membership::desired(&ctx.db.pool, cluster_id).await? {
        if asked != voters && asked != count {
            return Err(MembershipError::Conflict(format!(
                "a change to {asked} members is in progress ({voters} now)"
            )));
        }
    }
    if let Some(unhealthy) = control_plane
        .iter()
        .find(|n| !n.phase.healthy() || !n.up_to_date())
    {
        return Err(MembershipError::Conflict(format!(
            "the control plane is not healthy and up to date: {} is {} at generation {} of {}",
            unhealthy.node_name,
            unhealthy.phase,
            unhealthy.applied_generation,
            unhealthy.desired_generation
        )));
    }
    let ask = crate::quotas::Ask {
        vms: count - voters,
        ..crate::quotas::Ask::default()
    };
    crate::quotas::admit(&ctx.db, ctx.config.quotas, org_id, ask).await?;
    db::membership::set_desired(&ctx.db.pool, cluster_id, count).await?;
    if count != voters {
        tracing::info!(
            cluster_id,
            from = voters,
            to = count,
            "control plane changing size"
        );
        converge::spawn(ctx.clone(), cluster_id);
    }
    Ok(Scaling {
        desired: count,
        voters,
    })
}

/// Removes one control-plane member (`DELETE /clusters/{id}/nodes/{vm_id}`) — a healthy one, or
/// a dead one — through the oldest other member's agent, as scaling down does. Refused when it
/// is the only member, when the change could not reach a majority of the members now, or when
/// the members left would not have a majority of their own healthy.
pub async fn remove(
    ctx: &Membership,
    org_id: i64,
    cluster_id: i64,
    vm_id: i64,
) -> Result<Scaling, MembershipError> {
    let nodes = member_of(ctx, org_id, cluster_id, vm_id).await?;
    let target = target_of(&nodes, vm_id)?;
    if let Some(why) =
        db::restores::refusal(&ctx.db.pool, cluster_id, "remove a member after it").await?
    {
        return Err(MembershipError::Conflict(why));
    }
    let control_plane: Vec<_> = nodes
        .iter()
        .filter(|n| n.role == Role::ControlPlane)
        .collect();
    let voters = control_plane.len();
    if voters == 1 {
        return Err(MembershipError::Conflict(format!(
            "VM {vm_id} is the cluster's only control-plane member; a cluster cannot be left without one"
        )));
    }
    majority_without(&control_plane, target, "the removal")?;
    let Some(remover) = remover(control_plane.iter().copied(), target) else {
        return Err(MembershipError::Conflict(
            "no other healthy member to remove it".into(),
        ));
    };
    let mut tx = ctx.db.begin().await?;
    let generation = db::removals::bump_generation(&mut tx, remover.id).await?;
    db::membership::start_leaving(&mut tx, target.id, remover.id, generation).await?;
    db::membership::forget_desired(&mut *tx, cluster_id).await?;
    tx.commit().await?;
    tracing::info!(
        cluster_id,
        vm_id,
        remover = remover.vm_id,
        "control-plane member removal started"
    );
    converge::spawn(ctx.clone(), cluster_id);
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    Ok(Scaling {
        desired: count(voters - 1),
        voters: count(voters),
    })
}

/// The nodes of `cluster_id` — founded, with no CA rotation and no membership change in
/// progress — for a change to the member `vm_id`.
async fn member_of(
    ctx: &Membership,
    org_id: i64,
    cluster_id: i64,
    vm_id: i64,
) -> Result<Vec<db::nodes::NodeRow>, MembershipError> {
    crate::machineset::founded_cluster(&ctx.db, org_id, cluster_id).await?;
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    target_of(&nodes, vm_id)?;
    if let Some(why) = db::rotations::refusal(
        &ctx.db.pool,
        cluster_id,
        "change the control plane after it",
    )
    .await?
    {
        return Err(MembershipError::Conflict(why));
    }
    let control_plane: Vec<_> = nodes
        .iter()
        .filter(|n| n.role == Role::ControlPlane)
        .collect();
    no_change_in_progress(&control_plane)?;
    Ok(nodes)
}

/// The control-plane member `vm_id` among `nodes`.
fn target_of(
    nodes: &[db::nodes::NodeRow],
    vm_id: i64,
) -> Result<&db::nodes::NodeRow, MembershipError> {
    let target = nodes
        .iter()
        .find(|n| n.vm_id == vm_id)
        .ok_or(MembershipError::NotFound)?;
    if target.role != Role::ControlPlane {
        return Err(MembershipError::Conflict(format!(
            "VM {vm_id} is a worker: change its pool's count instead"
        )));
    }
    Ok(target)
}

/// Refuses `what` (removing `target`) unless a majority of the members is healthy now and the
/// members left would have a healthy majority of their own.
fn majority_without(
    control_plane: &[&db::nodes::NodeRow],
    target: &db::nodes::NodeRow,
    what: &str,
) -> Result<(), MembershipError> {
    let voters = control_plane.len();
    let healthy_others = control_plane
        .iter()
        .filter(|n| n.id != target.id && n.phase.healthy())
        .count();
    let healthy_now = healthy_others + usize::from(target.phase.healthy());
    if healthy_now <= voters / 2 {
        return Err(MembershipError::Conflict(format!(
            "only {healthy_now} of {voters} members are healthy: etcd cannot change its membership without a majority"
        )));
    }
    if healthy_others <= voters.saturating_sub(1) / 2 {
        return Err(MembershipError::Conflict(format!(
            "after {what} {healthy_others} of {} members would be healthy: no majority",
            voters.saturating_sub(1)
        )));
    }
    Ok(())
}
