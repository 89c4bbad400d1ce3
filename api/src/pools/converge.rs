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

use super::Pools;
use crate::compute::CreateVm;
use crate::db::leases::Leased;
use crate::db::{
    self, DbError, clusters::ClusterRow, nodes::NodeRow, phase::ClusterPhase, phase::Removal,
    pools::PoolRow, resources::Resource,
};
use crate::founding::{request::ClusterSpecRequest, trust};
use crate::lease;
use crate::machines::{self, MachineError, NewMachine};
use exk8s_common::contract::Role;

/// Workers made at once.
const PARALLEL: usize = 8;

/// Why a convergence stopped short; recorded on the pool, retried by the reconciler.
#[derive(Debug, thiserror::Error)]
pub enum ConvergeError {
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error(transparent)]
    Db(#[from] DbError),
    /// The cluster's stored facts cannot be used (its spec, a node name).
    #[error("{0}")]
    Corrupt(String),
    /// The cluster's pod CIDR has no block left for another node.
    #[error("{0}")]
    NoRoom(String),
    #[error("a worker task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Lease(#[from] lease::LeaseLost),
}

/// How a convergence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The pool's nodes match it.
    Converged,
    /// Workers are draining; the drainer's report (or the deadline) moves them on.
    Waiting,
    /// Another convergence holds the pool.
    Busy,
    /// The pool (or its cluster) is gone or going.
    Gone,
}

/// Converges the pool in the background; failures are logged and recorded on the pool.
pub fn spawn(ctx: Pools, pool_id: i64) {
    tokio::spawn(async move {
        if let Err(e) = converge(&ctx, pool_id).await {
            tracing::warn!(pool_id, error = %crate::error_chain(&e), "node pool did not converge (the reconciler retries)");
        }
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

/// Converges the pool now, unless another convergence holds it.
pub async fn converge(ctx: &Pools, pool_id: i64) -> Result<Outcome, ConvergeError> {
    loop {
        let Some(lease) = lease::claim(&ctx.db, Leased::Pool(pool_id)).await? else {
            return Ok(Outcome::Busy);
        };
        let result = run(ctx, pool_id, &lease).await;
        if matches!(result, Err(ConvergeError::Lease(_))) {
            // Another process converges the pool now; its lease is not ours to release.
            return result;
        }
        let error = result.as_ref().err().map(|e| crate::error_chain(e));
        lease.release(error.as_deref()).await?;
        // A change made while the lease was held, whose own convergence found it busy.
        if result.as_ref().is_ok_and(|o| *o == Outcome::Converged)
            && db::pools::needs_work(&ctx.db.pool, pool_id).await?
        {
            continue;
        }
        return result;
    }
}

/// Where a pool's workers go, from the cluster's founding request.
struct Placement {
    spec: ClusterSpecRequest,
    security_groups: Vec<i64>,
    userdata: String,
}

impl Placement {
    fn of(ctx: &Pools, cluster: &ClusterRow) -> Result<Self, ConvergeError> {
        let spec: ClusterSpecRequest = serde_json::from_str(&cluster.spec_json)
            .map_err(|e| ConvergeError::Corrupt(format!("cluster {} spec: {e}", cluster.id)))?;
        let mut security_groups = spec.security_group_ids.clone();
        security_groups.extend(cluster.security_group_id);
        let userdata = ctx
            .machines
            .userdata()
            .map_err(|e| ConvergeError::Corrupt(format!("userdata: {e}")))?;
        Ok(Self {
            spec,
            security_groups,
            userdata,
        })
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
        if !orphans.is_empty() {
            for resource in orphans {
                tracing::info!(pool_id, token = %resource.client_token, "releasing a worker VM whose creation did not finish");
                machines::release(&ctx.machines, resource).await?;
            }
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
        let desired = usize::try_from(pool.desired_count).unwrap_or(0);
        if active.len() < desired {
            let placement = std::sync::Arc::new(Placement::of(ctx, &cluster)?);
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
        if active.len() > desired {
            // Newest first: the highest ordinals were made last.
            let mut surplus = active;
            surplus.sort_by_key(|n| std::cmp::Reverse(n.ordinal));
            surplus.truncate(surplus.len() - desired);
            start_draining(ctx, &cluster, &surplus).await?;
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
        return Ok(Outcome::Converged);
    }
}

/// Makes one worker: ordinal, journaled VM, address, node row. A failure after the journal
/// entry releases the VM at once (and, if that fails too, the next convergence does).
async fn add_worker(
    ctx: &Pools,
    cluster: &ClusterRow,
    pool: &PoolRow,
    placement: &Placement,
) -> Result<(), ConvergeError> {
    let ordinal = db::clusters::next_ordinal(&ctx.db.pool, cluster.id).await?;
    let spec = &placement.spec;
    let machine = NewMachine {
        cluster_id: cluster.id,
        ordinal,
        pool_id: Some(pool.id),
        vm: CreateVm {
            name: format!("{}-{}-{ordinal}", cluster.name, pool.name),
            image_id: pool.image_id,
            instance_type: pool.instance_type.clone(),
            zone_id: spec.zone_id,
            subnet_id: pool.subnet_id,
            security_group_ids: placement.security_groups.clone(),
            allocate_public_ipv4: spec.allocate_public_ipv4,
            ssh_pubkey: spec.ssh_pubkey.clone(),
            root_volume_size_gib: spec.root_volume_size_gib,
            userdata: placement.userdata.clone(),
            tags: [
                ("exk8s.io/role", "worker".to_owned()),
                ("exk8s.io/cluster", cluster.id.to_string()),
                ("exk8s.io/pool", pool.name.clone()),
                ("exk8s.io/ordinal", ordinal.to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
            client_token: String::new(),
        },
    };
    let made = async {
        let vm = machines::create(&ctx.machines, machine).await?;
        let vm = machines::wait_for_address(&ctx.machines, vm.id).await?;
        record_worker(ctx, cluster, pool, ordinal, &vm).await
    }
    .await;
    if let Err(e) = made {
        let token = machines::client_token(cluster.id, ordinal);
        if let Ok(Some(resource)) = db::resources::find_by_token(&ctx.db.pool, &token).await {
            if let Err(release) = machines::release(&ctx.machines, &resource).await {
                tracing::warn!(pool_id = pool.id, error = %crate::error_chain(&release), "could not release a worker VM (the next convergence does)");
            }
        }
        return Err(e);
    }
    Ok(())
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
        .map_err(|e| ConvergeError::Corrupt(format!("node name: {e}")))?;
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
    let (v4, v6, public) = (
        addresses.private_ipv4.to_string(),
        addresses.private_ipv6.map(|a| a.to_string()),
        addresses.public_ipv4.map(|a| a.to_string()),
    );
    // The controller-manager gives each node a block of the pod CIDR: no node past the last
    // block. `count_for_adding` holds the cluster's additions until this transaction ends.
    let mut tx = ctx.db.begin().await?;
    let nodes = db::nodes::count_for_adding(&mut tx, cluster.id).await?;
    let blocks = crate::render::PodCidr::parse(&cluster.pod_cidr)
        .map_err(|e| ConvergeError::Corrupt(format!("pod CIDR: {e}")))?
        .blocks();
    if u64::try_from(nodes).unwrap_or(u64::MAX) >= blocks {
        return Err(ConvergeError::NoRoom(format!(
            "the pod CIDR {} has no free block for another node",
            cluster.pod_cidr
        )));
    }
    db::nodes::insert(
        &mut tx,
        &db::nodes::NewNode {
            cluster_id: cluster.id,
            ordinal,
            vm_id: vm.id,
            node_name: addresses.name.as_str(),
            private_ipv4: &v4,
            private_ipv6: v6.as_deref(),
            public_ipv4: public.as_deref(),
            is_initial: false,
            role: Role::Worker,
            pool_id: Some(pool.id),
            etcd_membership: None,
        },
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

/// Marks `nodes` draining, all by one drainer at its next generation.
async fn start_draining(
    ctx: &Pools,
    cluster: &ClusterRow,
    nodes: &[&NodeRow],
) -> Result<(), ConvergeError> {
    let drainer = drainer(ctx, cluster.id).await?;
    let mut tx = ctx.db.begin().await?;
    let drain_by = match &drainer {
        Some(d) => Some((d.id, db::removals::bump_generation(&mut tx, d.id).await?)),
        None => None,
    };
    for node in nodes {
        db::removals::start_draining(&mut tx, node.id, drain_by, ctx.clock.unix()).await?;
    }
    tx.commit().await?;
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
    match journal.iter().find(|r| r.ordinal == Some(node.ordinal)) {
        Some(resource) => machines::release(&ctx.machines, resource).await?,
        // Released before a crash; deleting again is a no-op.
        None => ctx
            .machines
            .compute
            .delete_vm(node.vm_id)
            .await
            .map_err(|source| MachineError::Compute {
                step: "VM deletion",
                source,
            })?,
    }
    db::removals::delete(&ctx.db.pool, node.id).await?;
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
                start_draining(ctx, cluster, &[node]).await?;
            }
            Ok(false)
        }
    }
}
