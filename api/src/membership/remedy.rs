//! Control-plane remediation (Cluster API's KubeadmControlPlane remediation): the health pass
//! finds a member unhealthy past its policy's timeout; under the cluster's membership lease —
//! so never beside another membership change — and only when nothing else changes the cluster
//! (an upgrade, a restore, a CA or service-account key rotation), the policy allows it and the
//! healthy members keep a quorum of the ones left ([`crate::health::control_plane`]), the member
//! is removed first — a dead member would make etcd refuse even a learner — by the oldest
//! healthy voter's agent, and the size stays asked for, so [`super::converge`] adds its
//! replacement once the others are current again. The remediation is recorded in the same
//! transaction as the removal.

use crate::db::leases::Leased;
use crate::db::{self, DbError, clusters::ClusterRow, nodes::NodeRow, phase::ClusterPhase};
use crate::health::{self, Blocked, Verdict};
use crate::lease;
use exk8s_common::contract::Role;

use super::Membership;
use super::converge::ConvergeError;

/// What one remediation attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remedy {
    /// No member is unhealthy (or the cluster is not founded).
    Healthy,
    /// Another process holds the membership lease, or a remediation of this one waits for its
    /// turn at it: the next pass looks again.
    Busy,
    /// A member is unhealthy and stays: why.
    Blocked(Blocked),
    /// The member leaves first; its replacement follows.
    Started {
        vm_id: i64,
        node: String,
        reason: &'static str,
    },
}

/// Remediates one unhealthy control-plane member of `cluster_id`, when allowed.
pub async fn remediate(ctx: &Membership, cluster_id: i64) -> Result<Remedy, ConvergeError> {
    let ran = lease::run(
        &ctx.db,
        Leased::Membership(cluster_id),
        "remedy",
        async |lease| {
            lease.ensure()?;
            attempt(ctx, cluster_id).await
        },
    )
    .await?;
    let remedy = ran.unwrap_or(Ok(Remedy::Busy))?;
    if matches!(remedy, Remedy::Started { .. }) {
        super::converge::spawn(ctx.clone(), cluster_id);
    }
    Ok(remedy)
}

async fn attempt(ctx: &Membership, cluster_id: i64) -> Result<Remedy, ConvergeError> {
    let Some(cluster) = db::clusters::get_by_id(&ctx.db.pool, cluster_id)
        .await?
        .filter(|c| c.phase == ClusterPhase::Founded)
    else {
        return Ok(Remedy::Healthy);
    };
    let policy = health::policy::of(&cluster);
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let members: Vec<&NodeRow> = nodes
        .iter()
        .filter(|n| n.role == Role::ControlPlane)
        .collect();
    let components = db::components::for_cluster(&ctx.db.pool, cluster_id).await?;
    let now = ctx.clock.unix();
    let period = i64::from(policy.retry_period_secs);
    let recent = db::remediations::since(&ctx.db.pool, cluster_id, now - period)
        .await?
        .iter()
        .filter(|r| r.pool_id.is_none())
        .count();
    let change = change_in_progress(ctx, &cluster, &members).await?;
    let recent = u32::try_from(recent).unwrap_or(u32::MAX);
    let decided = health::control_plane(&policy, &members, &components, now, recent, change);
    let target = match decided {
        Ok(None) => return held(ctx, &cluster, None, now).await,
        Ok(Some(target)) => target,
        Err(blocked) => return held(ctx, &cluster, Some(blocked), now).await,
    };
    // The remover's agent must be alive to remove the member: judged healthy, not only last
    // reported so.
    let judged_healthy = members.iter().copied().filter(|node| {
        health::judge(
            &policy,
            health::Facts {
                node,
                components: &components,
            },
            now,
        ) == Verdict::Healthy
    });
    let Some(remover) = super::remover(judged_healthy, target.node) else {
        let blocked = Blocked::QuorumAtRisk {
            healthy: 0,
            members: members.len(),
        };
        return held(ctx, &cluster, Some(blocked), now).await;
    };
    let voters = i64::try_from(members.len()).unwrap_or(i64::MAX);
    let reason = target.problem.reason();
    let message = target.problem.describe();
    let mut tx = ctx.db.begin().await?;
    db::membership::set_desired(&mut *tx, cluster_id, voters).await?;
    db::clusters::set_remediation_blocked(&mut *tx, cluster_id, None).await?;
    let generation = db::removals::bump_generation(&mut tx, remover.id).await?;
    db::membership::start_leaving(&mut tx, target.node.id, remover.id, generation).await?;
    db::remediations::insert(
        &mut *tx,
        db::remediations::NewRemediation {
            cluster_id,
            pool_id: None,
            vm_id: target.node.vm_id,
            node_name: &target.node.node_name,
            reason,
            message: &message,
        },
        now,
    )
    .await?;
    tx.commit().await?;
    tracing::warn!(
        cluster_id,
        vm_id = target.node.vm_id,
        node = %target.node.node_name,
        remover = remover.vm_id,
        reason,
        "remediating an unhealthy control-plane member: {message}; it leaves etcd first, its replacement joins after"
    );
    Ok(Remedy::Started {
        vm_id: target.node.vm_id,
        node: target.node.node_name.clone(),
        reason,
    })
}

/// Keeps why remediation waits (`None`: it does not) on the cluster row, for its
/// `RemediationAllowed` condition, writing only a change.
async fn held(
    ctx: &Membership,
    cluster: &ClusterRow,
    blocked: Option<Blocked>,
    now: i64,
) -> Result<Remedy, ConvergeError> {
    let stored = cluster.remediation_blocked.as_deref();
    let Some(blocked) = blocked else {
        if stored.is_some() {
            db::clusters::set_remediation_blocked(&ctx.db.pool, cluster.id, None).await?;
        }
        return Ok(Remedy::Healthy);
    };
    if let Some(text) = health::blocked::next(stored, &blocked, now) {
        tracing::info!(
            cluster_id = cluster.id,
            reason = blocked.reason(),
            "control-plane remediation waits: {}",
            blocked.describe()
        );
        db::clusters::set_remediation_blocked(&ctx.db.pool, cluster.id, Some(&text)).await?;
    }
    Ok(Remedy::Blocked(blocked))
}

/// Another change the control plane is in, named; `None` when there is none.
async fn change_in_progress(
    ctx: &Membership,
    cluster: &ClusterRow,
    members: &[&NodeRow],
) -> Result<Option<String>, DbError> {
    let then = "remediation waits for it";
    if let Some(why) = db::restores::refusal(&ctx.db.pool, cluster.id, then).await? {
        return Ok(Some(why));
    }
    if let Some(why) = db::rotations::refusal(&ctx.db.pool, cluster.id, then).await? {
        return Ok(Some(why));
    }
    if let Err(e) = super::no_change_in_progress(members) {
        return Ok(Some(e.to_string()));
    }
    let voters = i64::try_from(members.len()).unwrap_or(i64::MAX);
    if let Some(asked) = db::membership::desired(&ctx.db.pool, cluster.id).await? {
        if asked != voters {
            return Ok(Some(format!(
                "a change to {asked} control-plane members ({voters} now)"
            )));
        }
    }
    if let Ok(target) = cluster.kubernetes_version.parse() {
        let nodes: Vec<NodeRow> = members.iter().map(|n| (*n).clone()).collect();
        let state = crate::upgrade::state::ControlPlane::read(target, &nodes);
        if state.changing(&nodes) {
            return Ok(Some(format!(
                "the control plane's move to {} (its oldest member runs {})",
                state.target, state.oldest
            )));
        }
    }
    Ok(None)
}
