//! Converging one pool: brings its machines to what the pool row says, under the pool's lease
//! (one API process at a time), re-reading the row after every step so a change made meanwhile
//! is followed.
//!
//! Each step, in order: undo journaled VMs that have no node (a creation that failed or
//! crashed — released, never adopted half-made); move removals on (a `draining` worker is
//! `drained` once its drainer applied the generation that drains it, or when the drain
//! deadline passed; a `drained` worker's VM is deleted, then its row, which frees its pod
//! range); make missing workers, a few at a time, each journaled before its compute call and
//! recorded as a node only once it has an address; mark surplus workers, newest first, for
//! draining by a control-plane node's agent. A pool being deleted goes once it has no node.

use std::collections::HashSet;

use tokio::task::JoinSet;

use super::{Pools, rolling};
use crate::db::leases::Leased;
use crate::db::{
    self, DbError, clusters::ClusterRow, nodes::NodeRow, phase::ClusterPhase, phase::Removal,
    pools::PoolRow, resources::Resource,
};
use crate::health::Unhealthy;
use crate::lease;
use crate::machines::{self, MachineError, NewMachine};
use crate::machineset::{self, Member, Placement, Shape};
use crate::trust;
use exk8s_common::contract::Role;

/// Workers made at once.
const PARALLEL: usize = 8;

pub use crate::machineset::ConvergeError;

pub use crate::machineset::Outcome;

pub fn spawn(ctx: Pools, pool_id: i64) {
    machineset::spawn("node pool", pool_id, async move {
        converge(&ctx, pool_id).await
    });
}

/// After a control-plane node reported healthy: the pools whose workers it drains move on.
pub async fn after_report(ctx: &Pools, node_id: i64) {
    match db::removals::pools_drained_by(&ctx.db.pool, node_id).await {
        Ok(pools) => pools.into_iter().for_each(|id| spawn(ctx.clone(), id)),
        Err(e) => {
            tracing::warn!(node_id, error = %crate::error_chain(&e), "cannot look up the drains of a node (the reconciler moves them on)");
        }
    }
}

/// After a worker reported healthy: its pool's replacement, if one runs, moves on — and a
/// remediation waiting for its replacement to come up ends.
pub async fn after_worker_report(ctx: &Pools, pool_id: i64) {
    let moving = async {
        Ok::<bool, DbError>(
            db::pools::needs_work(&ctx.db.pool, pool_id).await?
                || db::remediations::open_in_pool(&ctx.db.pool, pool_id).await?,
        )
    };
    match moving.await {
        Ok(true) => spawn(ctx.clone(), pool_id),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(pool_id, error = %crate::error_chain(&e), "cannot tell whether a pool needs work (the reconciler moves it on)");
        }
    }
}

/// After a control-plane member reported healthy: once every member runs the cluster's
/// release, the pools that follow the control plane take it and their workers are replaced.
pub async fn follow_control_plane(ctx: &Pools, cluster_id: i64) {
    match db::pools::follow_control_planes(&ctx.db.pool, Some(cluster_id), db::now()).await {
        Ok(pools) => pools.into_iter().for_each(|id| {
            tracing::info!(
                cluster_id,
                pool_id = id,
                "node pool follows its control plane's release"
            );
            spawn(ctx.clone(), id);
        }),
        Err(e) => {
            tracing::warn!(cluster_id, error = %crate::error_chain(&e), "cannot move pools to the control plane's release (the reconciler does)");
        }
    }
}

/// Converges the pool now, unless another convergence holds it.
pub async fn converge(ctx: &Pools, pool_id: i64) -> Result<Outcome, ConvergeError> {
    loop {
        let ran = lease::run(&ctx.db, Leased::Pool(pool_id), "converge", async |lease| {
            run(ctx, pool_id, lease).await
        })
        .await?;
        let Some(result) = ran else {
            return Ok(Outcome::Busy);
        };
        // A change made while the lease was held, whose own convergence found it busy.
        if result.as_ref().is_ok_and(|o| *o == Outcome::Converged)
            && db::pools::needs_work(&ctx.db.pool, pool_id).await?
        {
            continue;
        }
        return result;
    }
}

async fn run(ctx: &Pools, pool_id: i64, lease: &lease::Held) -> Result<Outcome, ConvergeError> {
    loop {
        lease.ensure()?;
        let Some(pool) = db::pools::get(&ctx.db.pool, pool_id).await? else {
            return Ok(Outcome::Gone);
        };
        let cluster = db::clusters::get_by_id(&ctx.db.pool, pool.cluster_id).await?;
        // A cluster being deleted releases every machine it journaled, its pools' included.
        let Some(cluster) = cluster.filter(|c| c.phase == ClusterPhase::Founded) else {
            return Ok(Outcome::Gone);
        };
        let nodes = db::removals::pool_nodes(&ctx.db.pool, pool_id).await?;
        let journal = db::resources::live_for_pool(&ctx.db.pool, pool_id).await?;

        let recorded: HashSet<i64> = nodes.iter().map(|n| n.ordinal).collect();
        let orphans: Vec<&Resource> = journal
            .iter()
            .filter(|r| r.ordinal.is_none_or(|o| !recorded.contains(&o)))
            .collect();
        if machineset::release_orphans(&ctx.machines, orphans).await? {
            continue;
        }

        let mut waiting = false;
        let mut removed = false;
        for node in nodes.iter().filter(|n| n.removal.is_some()) {
            if remove(ctx, &cluster, node, &journal).await? {
                removed = true;
            } else {
                waiting = true;
            }
        }
        if removed {
            continue;
        }

        let active: Vec<&NodeRow> = nodes.iter().filter(|n| n.removal.is_none()).collect();
        // An unhealthy worker is replaced as its cluster's health policy allows: one at a
        // time, none while another worker is still leaving.
        if !pool.deleting && !waiting {
            if let Some(sick) = super::remedy::due(ctx, &cluster, &pool, &active).await? {
                start_draining(ctx, &cluster, &[sick.node], Some(&sick)).await?;
                continue;
            }
        }
        let desired = usize::try_from(pool.desired_count).unwrap_or(0);
        let release = pool
            .kubernetes_version
            .as_deref()
            .unwrap_or(&cluster.kubernetes_version);
        let surge = admitted_surge(ctx, &cluster, &nodes, release, pool.max_surge).await?;
        // A pool that never surges makes a worker only once the one going has released its
        // VM: it never holds more VMs than its count.
        if active.len() < desired && !(surge == 0 && waiting) {
            let placement = std::sync::Arc::new(Placement::of(&ctx.machines, &cluster)?);
            let mut tasks = JoinSet::new();
            for _ in 0..(desired - active.len()).min(PARALLEL) {
                let (ctx, cluster, pool) = (ctx.clone(), cluster.clone(), pool.clone());
                let placement = std::sync::Arc::clone(&placement);
                tasks.spawn(async move { add_worker(&ctx, &cluster, &pool, &placement).await });
            }
            let mut first_error = None;
            while let Some(joined) = tasks.join_next().await {
                if let Err(e) = joined.map_err(ConvergeError::from).and_then(|r| r) {
                    first_error.get_or_insert(e);
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
            continue;
        }
        // Another release asked for: replaced, new workers first (`super::rolling`).
        // One replacement at a time: the worker going finishes first.
        if !pool.deleting && !waiting {
            match rolling::step(&active, release, desired, surge) {
                rolling::Step::Done => {}
                rolling::Step::Surge => {
                    let placement = Placement::of(&ctx.machines, &cluster)?;
                    add_worker(ctx, &cluster, &pool, &placement).await?;
                    continue;
                }
                rolling::Step::Wait { booting } => {
                    tracing::debug!(pool_id, booting, "a replacement waits for a new worker");
                    return Ok(Outcome::Waiting);
                }
                rolling::Step::Replace(old) => {
                    start_draining(ctx, &cluster, &[old], None).await?;
                    continue;
                }
            }
        }
        // Beyond the count and what a replacement may make: workers of another release first
        // (oldest first), then the newest (the highest ordinals were made last).
        let keep = desired + rolling::allowance(&active, release, desired, surge);
        if active.len() > keep {
            let mut surplus = active;
            surplus.sort_by_key(|n| {
                let outdated = rolling::outdated(n, release);
                (!outdated, if outdated { n.ordinal } else { -n.ordinal })
            });
            surplus.truncate(surplus.len() - keep);
            start_draining(ctx, &cluster, &surplus, None).await?;
            continue;
        }
        if waiting {
            return Ok(Outcome::Waiting);
        }
        if pool.deleting && nodes.is_empty() {
            db::pools::delete(&ctx.db.pool, pool_id).await?;
            tracing::info!(cluster_id = cluster.id, pool_id, "node pool deleted");
            return Ok(Outcome::Gone);
        }
        if active.iter().all(|n| n.phase.healthy()) {
            // At its size with every worker up: a replaced worker's remediation is over.
            let now = ctx.clock.unix();
            db::remediations::finish(&ctx.db.pool, cluster.id, Some(pool_id), now).await?;
        }
        return Ok(Outcome::Converged);
    }
}

/// The pool's `max_surge`, or 0 while workers of another release are left (going or not) and
/// the org has no room for one VM more under its quota: the pool is then replaced old worker
/// first, never past the quota.
async fn admitted_surge(
    ctx: &Pools,
    cluster: &ClusterRow,
    nodes: &[NodeRow],
    release: &str,
    max_surge: i64,
) -> Result<usize, ConvergeError> {
    let surge = usize::try_from(max_surge).unwrap_or(1);
    if surge == 0 || !nodes.iter().any(|n| rolling::outdated(n, release)) {
        return Ok(surge);
    }
    let one = crate::quotas::Ask {
        vms: 1,
        ..crate::quotas::Ask::default()
    };
    match crate::quotas::admit(&ctx.db, ctx.config.quotas, cluster.org_id, one).await {
        Ok(()) => Ok(surge),
        Err(crate::quotas::QuotaError::Exceeded(quota)) => {
            tracing::info!(cluster_id = cluster.id, reason = %quota, "a pool is replaced without a surge");
            Ok(0)
        }
        Err(crate::quotas::QuotaError::Db(e)) => Err(e.into()),
    }
}

/// Makes one worker: ordinal, journaled VM, address, node row.
async fn add_worker(
    ctx: &Pools,
    cluster: &ClusterRow,
    pool: &PoolRow,
    placement: &Placement,
) -> Result<(), ConvergeError> {
    let ordinal = db::clusters::next_ordinal(&ctx.db.pool, cluster.id).await?;
    let tags = [
        ("exk8s.io/role", "worker".to_owned()),
        ("exk8s.io/cluster", cluster.id.to_string()),
        ("exk8s.io/pool", pool.name.clone()),
        ("exk8s.io/ordinal", ordinal.to_string()),
    ];
    let machine = NewMachine {
        cluster_id: cluster.id,
        ordinal,
        pool_id: Some(pool.id),
        vm: placement.vm(Shape {
            name: format!("{}-{}-{ordinal}", cluster.name, pool.name),
            image_id: pool.image_id,
            instance_type: &pool.instance_type,
            subnet_id: pool.subnet_id,
            tags: &tags,
        }),
    };
    machineset::make(&ctx.machines, machine, async |vm| {
        record_worker(ctx, cluster, pool, ordinal, &vm).await
    })
    .await
}

/// Records the worker `vm` as a node of the pool, with the lowest free pod range.
async fn record_worker(
    ctx: &Pools,
    cluster: &ClusterRow,
    pool: &PoolRow,
    ordinal: i64,
    vm: &crate::compute::Vm,
) -> Result<(), ConvergeError> {
    let name = trust::node_name(cluster.id, &pool.name, vm.id)
        .map_err(|e| ConvergeError::Stopped(format!("node name: {e}")))?;
    let addresses = machines::addresses(vm, name)?;
    if let Some(taken) = db::nodes::find_by_vm(&ctx.db.pool, vm.id).await? {
        return Err(MachineError::Upstream {
            step: "node records",
            message: format!(
                "the compute API returned VM id {} for a new machine, but that id already \
                 belongs to a node of cluster {}",
                vm.id, taken.cluster_id
            ),
        }
        .into());
    }
    // The controller-manager gives each node a block of the pod CIDR: no node past the last
    // block. `count_for_adding` holds the cluster's additions until this transaction ends.
    let mut tx = ctx.db.begin().await?;
    let nodes = db::nodes::count_for_adding(&mut tx, cluster.id).await?;
    let blocks = crate::render::PodCidr::parse(&cluster.pod_cidr)
        .map_err(|e| ConvergeError::Stopped(format!("pod CIDR: {e}")))?
        .blocks();
    if u64::try_from(nodes).unwrap_or(u64::MAX) >= blocks {
        return Err(ConvergeError::Stopped(format!(
            "the pod CIDR {} has no free block for another node",
            cluster.pod_cidr
        )));
    }
    let worker = Member::Worker { pool_id: pool.id };
    machineset::insert_node(
        &mut tx,
        cluster.id,
        (ordinal, vm),
        &addresses,
        worker,
        db::now(),
    )
    .await?;
    tx.commit().await?;
    tracing::info!(
        cluster_id = cluster.id,
        pool_id = pool.id,
        vm_id = vm.id,
        "worker recorded"
    );
    ctx.key_pool.refresh_cluster(&ctx.db.pool, cluster.id).await;
    Ok(())
}

/// The control-plane node whose agent drains workers: the oldest one that finished booting and
/// syncs (has a node key), if any.
async fn drainer(ctx: &Pools, cluster_id: i64) -> Result<Option<NodeRow>, DbError> {
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    Ok(nodes.into_iter().find(|n| {
        n.role == Role::ControlPlane
            && n.removal.is_none()
            && n.node_key.is_some()
            && n.phase.completed()
    }))
}

/// Marks `nodes` draining, all by one drainer at its next generation; a remediation is
/// recorded with it, in the same transaction.
async fn start_draining(
    ctx: &Pools,
    cluster: &ClusterRow,
    nodes: &[&NodeRow],
    remedy: Option<&Unhealthy<'_>>,
) -> Result<(), ConvergeError> {
    let drainer = drainer(ctx, cluster.id).await?;
    let now = ctx.clock.unix();
    let mut tx = ctx.db.begin().await?;
    let drain_by = match &drainer {
        Some(d) => Some((d.id, db::removals::bump_generation(&mut tx, d.id).await?)),
        None => None,
    };
    for node in nodes {
        db::removals::start_draining(&mut tx, node.id, drain_by, now).await?;
    }
    if let Some(sick) = remedy {
        let message = sick.problem.describe();
        let record = db::remediations::NewRemediation {
            cluster_id: cluster.id,
            pool_id: sick.node.pool_id,
            vm_id: sick.node.vm_id,
            node_name: &sick.node.node_name,
            reason: sick.problem.reason(),
            message: &message,
        };
        db::remediations::insert(&mut *tx, record, now).await?;
    }
    tx.commit().await?;
    if let Some(sick) = remedy {
        tracing::warn!(cluster_id = cluster.id, vm_id = sick.node.vm_id, node = %sick.node.node_name, reason = sick.problem.reason(), "remediation: replacing an unhealthy worker: {}", sick.problem.describe());
    }
    for node in nodes {
        tracing::info!(cluster_id = cluster.id, vm_id = node.vm_id, drainer = ?drainer.as_ref().map(|d| d.vm_id), "worker draining");
    }
    Ok(())
}

/// Moves one removal on; true when the node is gone.
async fn remove(
    ctx: &Pools,
    cluster: &ClusterRow,
    node: &NodeRow,
    journal: &[Resource],
) -> Result<bool, ConvergeError> {
    if node.removal == Some(Removal::Draining) && !drained(ctx, cluster, node).await? {
        return Ok(false);
    }
    db::removals::set(&ctx.db.pool, node.id, Removal::Drained).await?;
    let journaled = journal.iter().find(|r| r.ordinal == Some(node.ordinal));
    machineset::release_vm(&ctx.machines, node, journaled).await?;
    let mut tx = ctx.db.begin().await?;
    let how = "removed from its pool, its VM deleted";
    db::removals::delete(&mut tx, node, how, ctx.clock.unix()).await?;
    tx.commit().await?;
    tracing::info!(
        cluster_id = cluster.id,
        vm_id = node.vm_id,
        "worker removed"
    );
    Ok(true)
}

/// Whether a draining worker may go: it never booted (nothing runs on it), its drainer
/// applied the generation that drains it, or the drain deadline passed. A worker whose
/// drainer is gone (or that had none) is given one.
async fn drained(ctx: &Pools, cluster: &ClusterRow, node: &NodeRow) -> Result<bool, ConvergeError> {
    if node.phase == db::phase::NodePhase::Pending {
        return Ok(true);
    }
    let now = ctx.clock.unix();
    let deadline = node.removal_since.unwrap_or(now)
        + i64::try_from(ctx.config.node_drain_timeout.as_secs()).unwrap_or(i64::MAX);
    if now >= deadline {
        tracing::warn!(
            cluster_id = cluster.id,
            vm_id = node.vm_id,
            "worker drain deadline passed; removing it undrained"
        );
        return Ok(true);
    }
    let current = match node.drain_by {
        Some(id) => db::nodes::list(&ctx.db.pool, cluster.id)
            .await?
            .into_iter()
            .find(|n| n.id == id && n.removal.is_none()),
        None => None,
    };
    match (current, node.drain_generation) {
        (Some(drainer), Some(generation)) => Ok(drainer.applied_generation >= generation),
        _ => {
            // No drainer (yet, or any more): ask the current one.
            if drainer(ctx, cluster.id).await?.is_some() {
                start_draining(ctx, cluster, &[node], None).await?;
            }
            Ok(false)
        }
    }
}
