//! Worker node pools: a pool is a desired state — placement, registration (labels, taints)
//! and a count — recorded first; its machines are then made or removed by [`converge`], in
//! the background after each change and by the reconciler after a crash, until the pool's
//! nodes match it. Removing a worker drains it first, through a control-plane node's agent.

pub mod converge;
mod remedy;
pub mod request;
pub mod rolling;

use std::sync::Arc;

use crate::config::ApiConfig;
use crate::db::{self, Db, DbError, pools::PoolRow};
use crate::field::FieldError;
use request::{PoolSpec, PoolUpdate};

/// What converging pools needs: the rows, the clock drains are timed by, the settings (quotas,
/// the drain deadline), the key pool (told of the cluster's new size) and the machines.
#[derive(Debug, Clone)]
pub struct Pools {
    pub db: Db,
    pub clock: Arc<dyn crate::clock::Clock>,
    pub config: Arc<ApiConfig>,
    pub key_pool: crate::keypool::KeyPool,
    pub machines: crate::machines::Machines,
}

/// Why a pool request was refused.
pub type PoolError = crate::machineset::ChangeError;

/// A pool with its nodes, oldest first.
#[derive(Debug, Clone)]
pub struct Pool {
    pub row: PoolRow,
    pub nodes: Vec<db::nodes::NodeRow>,
    /// The release its workers are made of: its own, or its control plane's when it follows it.
    pub release: String,
}

/// The release `row`'s workers are made of in `cluster`.
fn workers_release(row: &PoolRow, cluster: &db::clusters::ClusterRow) -> String {
    row.kubernetes_version
        .clone()
        .unwrap_or_else(|| cluster.kubernetes_version.clone())
}

/// Refuses a count that would give the cluster more nodes than its pod CIDR has blocks for
/// (one per node): `asked` for `pool` (None: a new pool), the other pools and the control
/// plane as they stand.
async fn check_room(
    ctx: &Pools,
    cluster: &db::clusters::ClusterRow,
    pool: Option<i64>,
    asked: i64,
) -> Result<(), PoolError> {
    let cidr = crate::render::PodCidr::parse(&cluster.pod_cidr)
        .map_err(|e| PoolError::Conflict(format!("the cluster's pod CIDR is unusable: {e}")))?;
    let control_plane = db::nodes::list(&ctx.db.pool, cluster.id)
        .await?
        .iter()
        .filter(|n| n.pool_id.is_none())
        .count();
    let others: i64 = db::pools::list(&ctx.db.pool, cluster.id)
        .await?
        .iter()
        .filter(|p| Some(p.id) != pool)
        .map(|p| p.desired_count)
        .sum();
    let wanted = u64::try_from(others + asked).unwrap_or(0) + control_plane as u64;
    if wanted > cidr.blocks() {
        return Err(FieldError::new(
            "count",
            format!(
                "the cluster's pod CIDR {} has room for {} nodes (a block each); this would make {wanted}",
                cluster.pod_cidr,
                cidr.blocks()
            ),
        )
        .into());
    }
    Ok(())
}

/// Records the pool and starts making its machines; answers at once.
pub async fn create(
    ctx: &Pools,
    org_id: i64,
    cluster_id: i64,
    spec: &PoolSpec,
) -> Result<Pool, PoolError> {
    let cluster = crate::machineset::founded_cluster(&ctx.db, org_id, cluster_id).await?;
    check_room(ctx, &cluster, None, spec.count).await?;
    let ask = crate::quotas::Ask {
        clusters: 0,
        vms: spec.count,
        pools: 1,
    };
    crate::quotas::admit(&ctx.db, ctx.config.quotas, org_id, ask).await?;
    let subnet = ctx
        .machines
        .compute
        .get_subnet(spec.subnet_id)
        .await
        .map_err(|e| PoolError::Upstream(format!("subnet lookup failed: {e}")))?;
    if subnet.is_none() {
        return Err(FieldError::new(
            "subnet_id",
            format!("subnet {} does not exist", spec.subnet_id),
        )
        .into());
    }
    // A new pool's kubelets run what the oldest apiserver runs (never newer, by the skew
    // policy), also while the control plane is being upgraded.
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let version = crate::upgrade::state::oldest(
        cluster
            .kubernetes_version
            .parse()
            .map_err(|e: crate::upgrade::skew::NotARelease| PoolError::Conflict(e.to_string()))?,
        &nodes,
    )
    .to_string();
    let mut tx = ctx.db.begin().await?;
    let inserted = db::pools::insert(
        &mut tx,
        &db::pools::NewPool {
            cluster_id,
            name: &spec.name,
            instance_type: &spec.instance_type,
            image_id: spec.image_id,
            subnet_id: spec.subnet_id,
            labels_json: &spec.registration.labels_json,
            taints_json: &spec.registration.taints_json,
            desired_count: spec.count,
            kubernetes_version: &version,
            max_surge: spec.max_surge,
        },
        db::now(),
    )
    .await;
    let id = match inserted {
        Err(DbError::Duplicate(_)) => {
            return Err(PoolError::Conflict(format!(
                "cluster {cluster_id} already has a pool named `{}`",
                spec.name
            )));
        }
        other => other?,
    };
    // The answer is read before the commit: once the pool exists, nothing may fail the request
    // (a retry would find the name taken). It has no workers yet: converging makes them.
    let row = db::pools::get(&mut *tx, id)
        .await?
        .ok_or(PoolError::NotFound)?;
    tx.commit().await?;
    tracing::info!(cluster_id, pool_id = id, name = %spec.name, count = spec.count, "node pool created");
    converge::spawn(ctx.clone(), id);
    let release = workers_release(&row, &cluster);
    Ok(Pool {
        row,
        nodes: Vec::new(),
        release,
    })
}

/// The cluster's pools.
pub async fn list(ctx: &Pools, org_id: i64, cluster_id: i64) -> Result<Vec<Pool>, PoolError> {
    let cluster = db::clusters::get(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(PoolError::NotFound)?;
    let mut pools = Vec::new();
    for row in db::pools::list(&ctx.db.pool, cluster_id).await? {
        let nodes = db::removals::pool_nodes(&ctx.db.pool, row.id).await?;
        let release = workers_release(&row, &cluster);
        pools.push(Pool {
            row,
            nodes,
            release,
        });
    }
    Ok(pools)
}

/// One pool of the org's cluster; another org's is not found.
pub async fn get(
    ctx: &Pools,
    org_id: i64,
    cluster_id: i64,
    pool_id: i64,
) -> Result<Pool, PoolError> {
    let cluster = db::clusters::get(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(PoolError::NotFound)?;
    let row = db::pools::get(&ctx.db.pool, pool_id)
        .await?
        .filter(|p| p.cluster_id == cluster_id)
        .ok_or(PoolError::NotFound)?;
    let nodes = db::removals::pool_nodes(&ctx.db.pool, row.id).await?;
    let release = workers_release(&row, &cluster);
    Ok(Pool {
        row,
        nodes,
        release,
    })
}

/// Changes the pool's count, labels or taints and starts converging it.
pub async fn update(
    ctx: &Pools,
    org_id: i64,
    cluster_id: i64,
    pool_id: i64,
    change: &PoolUpdate,
) -> Result<Pool, PoolError> {
    let cluster = crate::machineset::founded_cluster(&ctx.db, org_id, cluster_id).await?;
    let pool = get(ctx, org_id, cluster_id, pool_id).await?;
    match (change.kubernetes_version, change.follow_control_plane) {
        (Some(to), follow) => release(ctx, &cluster, &pool.row, to, follow).await?,
        (None, Some(follow)) => {
            // Following: the control plane's release; pinned: where it is now.
            let to = if follow {
                &cluster.kubernetes_version
            } else {
                pool.row
                    .kubernetes_version
                    .as_ref()
                    .unwrap_or(&cluster.kubernetes_version)
            };
            let to = to.parse().map_err(|e: crate::upgrade::skew::NotARelease| {
                PoolError::Conflict(e.to_string())
            })?;
            release(ctx, &cluster, &pool.row, to, Some(follow)).await?;
        }
        (None, None) => {}
    }
    if let Some(count) = change.count {
        check_room(ctx, &cluster, Some(pool.row.id), count).await?;
        let ask = crate::quotas::Ask {
            vms: count - pool.row.desired_count,
            ..crate::quotas::Ask::default()
        };
        crate::quotas::admit(&ctx.db, ctx.config.quotas, org_id, ask).await?;
    }
    let updated = db::pools::update(
        &ctx.db.pool,
        pool.row.id,
        &db::pools::PoolChange {
            desired_count: change.count,
            labels_json: change.labels_json.as_deref(),
            taints_json: change.taints_json.as_deref(),
            max_surge: change.max_surge,
        },
        db::now(),
    )
    .await?;
    if !updated {
        return Err(PoolError::Conflict(format!(
            "pool {pool_id} is being deleted"
        )));
    }
    tracing::info!(cluster_id, pool_id, count = ?change.count, max_surge = ?change.max_surge, release = ?change.kubernetes_version.map(|r| r.to_string()), "node pool changed");
    converge::spawn(ctx.clone(), pool_id);
    get(ctx, org_id, cluster_id, pool_id).await
}

/// Moves `pool` to release `to`: offered, never newer than the oldest apiserver nor more than
/// three minors older (the skew policy). Unless `follow` says otherwise, the control plane's own
/// target unpins the pool (it follows the control plane again) and any other release pins it;
/// a pool cannot follow the control plane at another release than its.
async fn release(
    ctx: &Pools,
    cluster: &db::clusters::ClusterRow,
    pool: &PoolRow,
    to: crate::upgrade::skew::Release,
    follow: Option<bool>,
) -> Result<(), PoolError> {
    use crate::upgrade::skew::{self, Release};
    let offered = ctx
        .config
        .kubernetes_versions
        .iter()
        .any(|v| *v == to.to_string());
    if !offered {
        return Err(FieldError::new(
            "kubernetes_version",
            format!(
                "{to} is not offered by this API (offered: {})",
                ctx.config.kubernetes_versions.join(", ")
            ),
        )
        .into());
    }
    let target: Release = cluster
        .kubernetes_version
        .parse()
        .map_err(|e: skew::NotARelease| PoolError::Conflict(e.to_string()))?;
    let follow = match follow {
        Some(true) if to != target => {
            return Err(FieldError::new(
                "follow_control_plane",
                format!(
                    "a pool that follows the control plane runs its release, {target}, not {to}"
                ),
            )
            .into());
        }
        Some(follow) => follow,
        None => to == target,
    };
    let nodes = db::nodes::list(&ctx.db.pool, cluster.id).await?;
    let oldest = crate::upgrade::state::oldest(target, &nodes);
    skew::pool(&pool.name, to, oldest).map_err(|e| PoolError::Conflict(e.to_string()))?;
    if !db::pools::set_version(&ctx.db.pool, pool.id, &to.to_string(), follow, db::now()).await? {
        return Err(PoolError::Conflict(format!(
            "pool {} is being deleted",
            pool.id
        )));
    }
    Ok(())
}

/// Marks the pool deleted: its workers are drained and released, then the pool goes.
pub async fn delete(
    ctx: &Pools,
    org_id: i64,
    cluster_id: i64,
    pool_id: i64,
) -> Result<Pool, PoolError> {
    let pool = get(ctx, org_id, cluster_id, pool_id).await?;
    db::pools::set_deleting(&ctx.db.pool, pool.row.id, db::now()).await?;
    tracing::info!(cluster_id, pool_id, "node pool deletion started");
    converge::spawn(ctx.clone(), pool_id);
    match get(ctx, org_id, cluster_id, pool_id).await {
        // Converged already (an empty pool goes at once).
        Err(PoolError::NotFound) => Ok(Pool {
            row: PoolRow {
                deleting: true,
                desired_count: 0,
                ..pool.row
            },
            nodes: Vec::new(),
            release: pool.release,
        }),
        other => other,
    }
}
