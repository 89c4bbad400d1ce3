//! Bringing a control plane to the size asked for, one member at a time, under the cluster's
//! membership lease, re-reading everything after each step:
//!
//! 1. a control-plane VM journaled without a node (a crash mid-way) is released;
//! 2. a joining member that reported healthy has been promoted by its agent: the shared DNS
//!    record lists it, then it becomes a voter and every node gets a new generation (the
//!    apiservers' `--etcd-servers` follow); one that failed, or did not finish within the join
//!    timeout, is released and the change ends with its reason;
//! 3. while any member is unhealthy, in flight or behind its generation, nothing starts;
//! 4. otherwise one member is added (VM, address, serving certificates, node row `joining`) or
//!    the newest one leaves: the oldest voter's next generation drains it and removes it from
//!    etcd (the leaving member's apiserver still serves, through the voters' etcd, while the
//!    remover's own components roll); once that generation is applied the shared DNS name
//!    stops listing it, then its VM goes (a cloud's delete shuts the machine down, so its
//!    apiserver fails `/readyz` before its listener closes), then its row, and every node but
//!    the remover follows.

use std::collections::HashSet;
use std::sync::Arc;

use super::Membership;
use crate::db::leases::Leased;
use crate::db::{
    self, DbError, clusters::ClusterRow, nodes::NodeRow, phase::ClusterPhase, phase::EtcdMembership,
};
use crate::lease;
use crate::machines::{self, NewMachine};
use crate::machineset::{self, Member, Placement, Shape};
use crate::pki::NodeServingCerts;
use crate::trust;
use exk8s_common::contract::{ReportState, Role};

pub use crate::machineset::ConvergeError;

pub use crate::machineset::Outcome;

pub fn spawn(ctx: Membership, cluster_id: i64) {
    machineset::spawn("control-plane change", cluster_id, async move {
        converge(&ctx, cluster_id).await
    });
}

/// After a control-plane node reported: a change in progress may move on.
pub async fn after_report(ctx: &Membership, cluster_id: i64) {
    let changing = async {
        let asked = db::membership::desired(&ctx.db.pool, cluster_id).await?;
        let moving = db::nodes::list(&ctx.db.pool, cluster_id)
            .await?
            .iter()
            .any(|n| {
                matches!(
                    n.etcd_membership,
                    Some(EtcdMembership::Joining | EtcdMembership::Leaving)
                )
            });
        Ok::<bool, DbError>(asked.is_some() || moving)
    };
    if changing.await.unwrap_or(true) {
        spawn(ctx.clone(), cluster_id);
    }
}

pub async fn converge(ctx: &Membership, cluster_id: i64) -> Result<Outcome, ConvergeError> {
    let ran = lease::run(
        &ctx.db,
        Leased::Membership(cluster_id),
        "converge",
        async |lease| run(ctx, cluster_id, lease).await,
    )
    .await?;
    let outcome = ran.unwrap_or(Ok(Outcome::Busy))?;
    if outcome == Outcome::Converged {
        // Every member healthy and current at the size asked: a replaced member's
        // remediation is over.
        db::remediations::finish(&ctx.db.pool, cluster_id, None, ctx.clock.unix()).await?;
    }
    Ok(outcome)
}

async fn run(
    ctx: &Membership,
    cluster_id: i64,
    lease: &lease::Held,
) -> Result<Outcome, ConvergeError> {
    loop {
        lease.ensure()?;
        let Some(cluster) = db::clusters::get_by_id(&ctx.db.pool, cluster_id)
            .await?
            .filter(|c| c.phase == ClusterPhase::Founded)
        else {
            return Ok(Outcome::Gone);
        };
        let control_plane: Vec<NodeRow> = db::nodes::list(&ctx.db.pool, cluster_id)
            .await?
            .into_iter()
            .filter(|n| n.role == Role::ControlPlane)
            .collect();

        let recorded: HashSet<i64> = control_plane.iter().map(|n| n.ordinal).collect();
        let journal = db::resources::list_for_cluster(&ctx.db.pool, cluster_id).await?;
        let orphans: Vec<_> = journal
            .iter()
            .filter(|r| {
                r.kind == db::resources::Kind::Vm
                    && r.pool_id.is_none()
                    && r.state != "deleted"
                    && r.ordinal.is_none_or(|o| !recorded.contains(&o))
            })
            .collect();
        if machineset::release_orphans(&ctx.machines, orphans).await? {
            continue;
        }

        if let Some(leaving) = control_plane
            .iter()
            .find(|n| n.etcd_membership == Some(EtcdMembership::Leaving))
        {
            let remover = control_plane
                .iter()
                .find(|n| Some(n.id) == leaving.drain_by);
            let removed = match (remover, leaving.drain_generation) {
                (Some(r), Some(generation)) => r.applied_generation >= generation,
                _ => false,
            };
            if !removed {
                // A remover that is gone, or whose last report failed, hands the removal to
                // another healthy voter. One busy applying (its report `started`) is working
                // on it: re-picking then would hand the removal to a node nobody syncs yet.
                if remover.is_none_or(|r| r.phase.failed()) {
                    if let Some(other) = super::remover(&control_plane, leaving) {
                        if remover.is_none_or(|r| r.id != other.id) {
                            start_leaving(ctx, &cluster, &control_plane, leaving).await?;
                            continue;
                        }
                    }
                }
                return Ok(Outcome::Waiting);
            }
            left(ctx, &cluster, leaving, &journal).await?;
            continue;
        }
        if let Some(joining) = control_plane
            .iter()
            .find(|n| n.etcd_membership == Some(EtcdMembership::Joining))
        {
            if joining.phase.healthy() {
                promoted(ctx, &cluster, joining).await?;
                continue;
            }
            let failed = matches!(
                joining.phase,
                db::phase::NodePhase::Reported {
                    state: ReportState::Failed,
                    ..
                }
            );
            let timeout =
                i64::try_from(ctx.config.member_join_timeout.as_secs()).unwrap_or(i64::MAX);
            let late = ctx.clock.unix() >= joining_since(joining) + timeout;
            if failed || late {
                let why = if failed {
                    format!("its agent reported {}", joining.phase)
                } else {
                    format!("it did not finish within {timeout}s")
                };
                let voters = control_plane.len() - 1;
                let reason = format!(
                    "the join of {} was abandoned ({why}); the control plane stays at {voters}",
                    joining.node_name
                );
                withdraw(ctx, &cluster, &control_plane, joining, &journal, &reason).await?;
                return Err(ConvergeError::Stopped(reason));
            }
            return Ok(Outcome::Waiting);
        }
        let desired = db::membership::desired(&ctx.db.pool, cluster_id).await?;
        let voters = i64::try_from(control_plane.len()).unwrap_or(i64::MAX);
        if let Some(old) = control_plane.iter().find(|n| n.replace_since.is_some()) {
            // Replacing: the others healthy and current, then a surge, or the old one first.
            if control_plane
                .iter()
                .any(|n| n.id != old.id && (!n.phase.healthy() || n.in_flight() || !n.up_to_date()))
            {
                return Ok(Outcome::Waiting);
            }
            if voters > desired.unwrap_or(voters) || !old.phase.healthy() {
                start_leaving(ctx, &cluster, &control_plane, old).await?;
            } else if old.in_flight() || !old.up_to_date() {
                return Ok(Outcome::Waiting);
            } else {
                add_member(ctx, &cluster).await?;
            }
            continue;
        }
        if control_plane
            .iter()
            .any(|n| !n.phase.healthy() || n.in_flight() || !n.up_to_date())
        {
            return Ok(Outcome::Waiting);
        }
        // A member removed by `DELETE` leaves whatever size was asked; nothing more is.
        let Some(desired) = desired else {
            return Ok(Outcome::Converged);
        };
        if voters < desired {
            add_member(ctx, &cluster).await?;
            continue;
        }
        if voters > desired {
            // The newest member leaves.
            if let Some(leaving) = control_plane.iter().max_by_key(|n| n.ordinal) {
                start_leaving(ctx, &cluster, &control_plane, leaving).await?;
            }
            continue;
        }
        return Ok(Outcome::Converged);
    }
}

/// When a joining node was recorded (by the injected clock).
fn joining_since(node: &NodeRow) -> i64 {
    node.created_at
}

/// A joined member votes: the shared name lists it, then every node follows. The name comes
/// first: when a member restarts its apiserver to follow, every balancer already knows the new
/// one, ready since its boot completed.
async fn promoted(
    ctx: &Membership,
    cluster: &ClusterRow,
    node: &NodeRow,
) -> Result<(), ConvergeError> {
    update_dns(ctx, cluster, None).await?;
    let mut tx = ctx.db.begin().await?;
    db::membership::set(&mut *tx, node.id, EtcdMembership::Voter).await?;
    db::nodes::bump_generations(&mut tx, cluster.id).await?;
    tx.commit().await?;
    tracing::info!(
        cluster_id = cluster.id,
        vm_id = node.vm_id,
        "control-plane member joined"
    );
    Ok(())
}

/// `leaving` leaves: the oldest healthy other voter gets a generation whose bundle removes it.
async fn start_leaving(
    ctx: &Membership,
    cluster: &ClusterRow,
    control_plane: &[NodeRow],
    leaving: &NodeRow,
) -> Result<(), ConvergeError> {
    let Some(remover) = super::remover(control_plane, leaving) else {
        return Err(ConvergeError::Stopped(format!(
            "no healthy member is left to remove {} from etcd",
            leaving.node_name
        )));
    };
    let mut tx = ctx.db.begin().await?;
    let generation = db::removals::bump_generation(&mut tx, remover.id).await?;
    db::membership::start_leaving(&mut tx, leaving.id, remover.id, generation).await?;
    tx.commit().await?;
    tracing::info!(
        cluster_id = cluster.id,
        vm_id = leaving.vm_id,
        remover = remover.vm_id,
        "control-plane member leaving"
    );
    Ok(())
}

/// A member etcd no longer lists: the shared name stops listing it, its VM goes, then its
/// row, and every other node follows. The name goes first: a client that resolves it while the
/// machine shuts down never meets an address that is about to stop answering.
async fn left(
    ctx: &Membership,
    cluster: &ClusterRow,
    node: &NodeRow,
    journal: &[db::resources::Resource],
) -> Result<(), ConvergeError> {
    update_dns(ctx, cluster, Some(node.id)).await?;
    release_vm(ctx, node, journal).await?;
    let mut tx = ctx.db.begin().await?;
    let how = "removed from etcd, its VM deleted";
    db::removals::delete(&mut tx, node, how, ctx.clock.unix()).await?;
    db::membership::hand_over_initial(&mut tx, cluster.id).await?;
    // The remover's own generation, the one that removed the member, already rendered it gone
    // from its `--etcd-servers` and its plan's voters: rolling it again for the row's deletion
    // would restart its components for nothing — with no other member left, an outage. (When
    // the member was the initial one, another takes that over: everyone follows.)
    match node.drain_by.filter(|_| !node.is_initial) {
        Some(remover) => {
            db::nodes::bump_generations_except(&mut tx, cluster.id, remover).await?;
        }
        None => {
            db::nodes::bump_generations(&mut tx, cluster.id).await?;
        }
    }
    tx.commit().await?;
    tracing::info!(
        cluster_id = cluster.id,
        vm_id = node.vm_id,
        "control-plane member removed"
    );
    update_dns(ctx, cluster, None).await
}

async fn release_vm(
    ctx: &Membership,
    node: &NodeRow,
    journal: &[db::resources::Resource],
) -> Result<(), ConvergeError> {
    let journaled = journal
        .iter()
        .find(|r| r.ordinal == Some(node.ordinal) && r.pool_id.is_none());
    Ok(machineset::release_vm(&ctx.machines, node, journaled).await?)
}

/// The shared name lists the control plane's members, but `leaving` (a node id) when given.
async fn update_dns(
    ctx: &Membership,
    cluster: &ClusterRow,
    leaving: Option<i64>,
) -> Result<(), ConvergeError> {
    let (Some(dns), true) = (&ctx.machines.dns, cluster.dns_configured) else {
        return Ok(());
    };
    let nodes = db::nodes::list(&ctx.db.pool, cluster.id).await?;
    let ips: Vec<String> = nodes
        .iter()
        .filter(|n| n.role == Role::ControlPlane && Some(n.id) != leaving)
        .map(|n| {
            n.public_ipv4
                .clone()
                .unwrap_or_else(|| n.private_ipv4.clone())
        })
        .collect();
    if let Err(e) = dns.upsert_a(&cluster.control_plane_dns_name, &ips).await {
        tracing::warn!(cluster_id = cluster.id, error = %e, "the shared DNS record does not follow the members yet");
    }
    Ok(())
}

/// Abandons a join that failed, saying why: the joining member leaves like any other — a
/// healthy voter's agent removes its learner if etcd lists one (its own agent may have died
/// before withdrawing it), and only then does its VM go. With no healthy voter to do that the
/// VM goes at once.
async fn withdraw(
    ctx: &Membership,
    cluster: &ClusterRow,
    control_plane: &[NodeRow],
    node: &NodeRow,
    journal: &[db::resources::Resource],
    reason: &str,
) -> Result<(), ConvergeError> {
    let mut tx = ctx.db.begin().await?;
    db::membership::abandon(&mut tx, cluster.id, reason).await?;
    match super::remover(control_plane, node) {
        Some(remover) => {
            let generation = db::removals::bump_generation(&mut tx, remover.id).await?;
            db::membership::start_leaving(&mut tx, node.id, remover.id, generation).await?;
            tx.commit().await?;
        }
        None => {
            tx.commit().await?;
            release_vm(ctx, node, journal).await?;
            let mut tx = ctx.db.begin().await?;
            let how = "its join abandoned, its VM deleted";
            db::removals::delete(&mut tx, node, how, ctx.clock.unix()).await?;
            tx.commit().await?;
        }
    }
    tracing::warn!(
        cluster_id = cluster.id,
        vm_id = node.vm_id,
        "a control-plane join was abandoned; its learner and VM are being released"
    );
    Ok(())
}

/// One new member: VM, address, serving certificates, and its node row, `joining`.
async fn add_member(ctx: &Membership, cluster: &ClusterRow) -> Result<(), ConvergeError> {
    let placement = Placement::of(&ctx.machines, cluster)?;
    let ordinal = db::clusters::next_ordinal(&ctx.db.pool, cluster.id).await?;
    let tags = [
        ("exk8s.io/role", "control-plane".to_owned()),
        ("exk8s.io/cluster", cluster.id.to_string()),
        ("exk8s.io/ordinal", ordinal.to_string()),
    ];
    let spec = &placement.spec;
    let machine = NewMachine {
        cluster_id: cluster.id,
        ordinal,
        pool_id: None,
        vm: placement.vm(Shape {
            name: format!("{}-cp-{ordinal}", cluster.name),
            image_id: spec.control_plane.image_id,
            instance_type: &spec.control_plane.instance_type,
            subnet_id: spec.placement.subnet_id,
            tags: &tags,
        }),
    };
    machineset::make(&ctx.machines, machine, async |vm| {
        record_member(ctx, cluster, ordinal, &vm).await
    })
    .await
}

async fn record_member(
    ctx: &Membership,
    cluster: &ClusterRow,
    ordinal: i64,
    vm: &crate::compute::Vm,
) -> Result<(), ConvergeError> {
    let name = trust::node_name(cluster.id, trust::CONTROL_PLANE_GROUP, vm.id)
        .map_err(|e| ConvergeError::Stopped(format!("node name: {e}")))?;
    let addresses = machines::addresses(vm, name)?;
    let opened = crate::records::load::cluster(&ctx.keks, &ctx.issuers, cluster)
        .map_err(|e| ConvergeError::Stopped(format!("opening the cluster's PKI: {e}")))?;
    let (pki, network) = (Arc::clone(&opened.pki), opened.spec.network.clone());
    let now = ctx.clock.now();
    let for_certs = addresses.clone();
    let serving = ctx
        .cpu
        .run(move || NodeServingCerts::generate(&pki, &for_certs, &network, now))
        .await
        .map_err(|e| ConvergeError::Stopped(format!("minting serving certificates: {e}")))?
        .map_err(|e| ConvergeError::Stopped(format!("minting serving certificates: {e}")))?;
    let seal = |column, cert| {
        trust::seal_node_key(&ctx.keks, cluster.id, vm.id, column, cert)
            .map_err(|e| ConvergeError::Stopped(format!("sealing: {e}")))
    };
    let etcd_server = seal(trust::NodeKeyColumn::EtcdServer, &serving.etcd_server)?;
    let etcd_peer = seal(trust::NodeKeyColumn::EtcdPeer, &serving.etcd_peer)?;
    let apiserver = seal(trust::NodeKeyColumn::Apiserver, &serving.apiserver)?;
    let mut tx = ctx.db.begin().await?;
    let node_id = machineset::insert_node(
        &mut tx,
        cluster.id,
        (ordinal, vm),
        &addresses,
        Member::ControlPlane(EtcdMembership::Joining),
        ctx.clock.unix(),
    )
    .await?;
    db::nodes::insert_etcd_member(
        &mut tx,
        node_id,
        (&serving.etcd_server.cert_pem, &etcd_server),
        (&serving.etcd_peer.cert_pem, &etcd_peer),
    )
    .await?;
    db::nodes::insert_apiserver_node(&mut tx, node_id, &serving.apiserver.cert_pem, &apiserver)
        .await?;
    tx.commit().await?;
    tracing::info!(
        cluster_id = cluster.id,
        vm_id = vm.id,
        "control-plane member joining"
    );
    ctx.key_pool.refresh_cluster(&ctx.db.pool, cluster.id).await;
    Ok(())
}
