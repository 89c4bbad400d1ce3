//! `node_pools`: groups of worker VMs alike — placement, and the labels and taints their
//! kubelets register with (stored as JSON, checked again when read) — their desired count,
//! whether they are being deleted, and the lease that lets one API process at a time
//! converge a pool.

use sqlx::{Any, Executor, Row};

use super::DbError;

/// One pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRow {
    pub id: i64,
    pub cluster_id: i64,
    pub name: String,
    pub instance_type: String,
    pub image_id: i64,
    pub subnet_id: i64,
    /// `{"key": "value", …}`.
    pub labels_json: String,
    /// `[{"key", "value", "effect"}, …]`.
    pub taints_json: String,
    pub desired_count: i64,
    /// `DELETE` was asked: the pool goes to zero nodes, then its row goes.
    pub deleting: bool,
    /// Why the last convergence failed (cleared by one that succeeds).
    pub last_error: Option<String>,
    /// The Kubernetes version its workers render (None only on rows no code writes: the
    /// cluster's).
    pub kubernetes_version: Option<String>,
    /// It takes the control plane's release once every member runs it (unless pinned).
    pub follow_control_plane: bool,
    /// Workers made beyond `desired_count` while workers of another release are replaced.
    pub max_surge: i64,
    pub created_at: i64,
    pub updated_at: i64,
    /// The pool's own health policy (JSON, [`crate::health::policy`]); None: its cluster's.
    pub health_policy: Option<String>,
    /// Why its last convergence left an unhealthy worker alone (JSON,
    /// [`crate::health::blocked`]); None: nothing is held back.
    pub remediation_blocked: Option<String>,
}

/// A pool to make.
#[derive(Debug, Clone)]
pub struct NewPool<'a> {
    pub cluster_id: i64,
    pub name: &'a str,
    pub instance_type: &'a str,
    pub image_id: i64,
    pub subnet_id: i64,
    pub labels_json: &'a str,
    pub taints_json: &'a str,
    pub desired_count: i64,
    pub kubernetes_version: &'a str,
    pub max_surge: i64,
}

pub async fn insert(
    tx: &mut sqlx::AnyConnection,
    pool: &NewPool<'_>,
    now: i64,
) -> Result<i64, DbError> {
    let row = sqlx::query(
        "INSERT INTO node_pools (cluster_id, name, instance_type, image_id, subnet_id, labels_json, \
         taints_json, desired_count, kubernetes_version, max_surge, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11) RETURNING id",
    )
    .bind(pool.cluster_id)
    .bind(pool.name)
    .bind(pool.instance_type)
    .bind(pool.image_id)
    .bind(pool.subnet_id)
    .bind(pool.labels_json)
    .bind(pool.taints_json)
    .bind(pool.desired_count)
    .bind(pool.kubernetes_version)
    .bind(pool.max_surge)
    .bind(now)
    .fetch_one(&mut *tx)
    .await?;
    Ok(row.try_get("id")?)
}

pub(super) const COLUMNS: &str = "id, cluster_id, name, instance_type, image_id, subnet_id, labels_json, \
    taints_json, desired_count, deleting, last_error, kubernetes_version, follow_control_plane, \
    max_surge, created_at, updated_at, health_policy, remediation_blocked";

pub(super) fn from_row(r: &sqlx::any::AnyRow) -> Result<PoolRow, sqlx::Error> {
    Ok(PoolRow {
        id: r.try_get("id")?,
        cluster_id: r.try_get("cluster_id")?,
        name: r.try_get("name")?,
        instance_type: r.try_get("instance_type")?,
        image_id: r.try_get("image_id")?,
        subnet_id: r.try_get("subnet_id")?,
        labels_json: r.try_get("labels_json")?,
        taints_json: r.try_get("taints_json")?,
        desired_count: r.try_get("desired_count")?,
        deleting: r.try_get::<i64, _>("deleting")? != 0,
        last_error: r.try_get("last_error")?,
        kubernetes_version: r.try_get("kubernetes_version")?,
        follow_control_plane: r.try_get::<i64, _>("follow_control_plane")? != 0,
        max_surge: r.try_get("max_surge")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
        health_policy: r.try_get("health_policy")?,
        remediation_blocked: r.try_get("remediation_blocked")?,
    })
}

pub async fn get<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
) -> Result<Option<PoolRow>, DbError> {
    let row = sqlx::query(&format!("SELECT {COLUMNS} FROM node_pools WHERE id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await?;
    Ok(row.as_ref().map(from_row).transpose()?)
}

/// The cluster's pools, oldest first.
pub async fn list<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Vec<PoolRow>, DbError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM node_pools WHERE cluster_id = $1 ORDER BY id"
    ))
    .bind(cluster_id)
    .fetch_all(db)
    .await?;
    Ok(rows.iter().map(from_row).collect::<Result<_, _>>()?)
}

/// What `PATCH` changes; `None` keeps the stored value.
#[derive(Debug, Clone, Default)]
pub struct PoolChange<'a> {
    pub desired_count: Option<i64>,
    pub labels_json: Option<&'a str>,
    pub taints_json: Option<&'a str>,
    pub max_surge: Option<i64>,
}

/// Applies `change` to a pool that is not being deleted; false when there is no such pool.
pub async fn update<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    change: &PoolChange<'_>,
    now: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE node_pools SET desired_count = COALESCE($1, desired_count), \
         labels_json = COALESCE($2, labels_json), taints_json = COALESCE($3, taints_json), \
         max_surge = COALESCE($6, max_surge), updated_at = $4 WHERE id = $5 AND deleting = 0",
    )
    .bind(change.desired_count)
    .bind(change.labels_json)
    .bind(change.taints_json)
    .bind(now)
    .bind(id)
    .bind(change.max_surge)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Marks the pool deleted: its nodes go, then its row.
pub async fn set_deleting<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE node_pools SET deleting = 1, desired_count = 0, updated_at = $1 WHERE id = $2",
    )
    .bind(now)
    .bind(id)
    .execute(db)
    .await?;
    Ok(())
}

pub async fn delete<'c>(db: impl Executor<'c, Database = Any>, id: i64) -> Result<(), DbError> {
    sqlx::query("DELETE FROM node_pools WHERE id = $1")
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}

/// What makes a pool need work: being deleted, a node count other than the desired one, a
/// node on its way out, or a journaled VM without a node (a crashed creation).
const NEEDS_WORK: &str = "(p.deleting = 1 \
     OR p.desired_count <> (SELECT COUNT(*) FROM cluster_nodes n \
                            WHERE n.pool_id = p.id AND n.removal IS NULL) \
     OR EXISTS (SELECT 1 FROM cluster_nodes n WHERE n.pool_id = p.id AND n.removal IS NOT NULL) \
     OR (SELECT COUNT(*) FROM cluster_resources r \
         WHERE r.pool_id = p.id AND r.kind = 'vm' AND r.state <> 'deleted') \
        <> (SELECT COUNT(*) FROM cluster_nodes n WHERE n.pool_id = p.id) \
     OR EXISTS (SELECT 1 FROM cluster_nodes n WHERE n.pool_id = p.id AND n.removal IS NULL \
                AND n.handed_version <> p.kubernetes_version))";

/// Pools that need work and that nobody converges.
pub async fn needing_work<'c>(
    db: impl Executor<'c, Database = Any>,
    now: i64,
) -> Result<Vec<i64>, DbError> {
    Ok(sqlx::query_scalar::<_, i64>(&format!(
        "SELECT p.id FROM node_pools p WHERE (p.lease_until IS NULL OR p.lease_until < $1) \
         AND {NEEDS_WORK} ORDER BY p.id"
    ))
    .bind(now)
    .fetch_all(db)
    .await?)
}

/// Whether the pool needs work.
pub async fn needs_work<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
) -> Result<bool, DbError> {
    let row = sqlx::query(&format!(
        "SELECT p.id FROM node_pools p WHERE p.id = $1 AND {NEEDS_WORK}"
    ))
    .bind(id)
    .fetch_optional(db)
    .await?;
    Ok(row.is_some())
}

/// Pins (`follow` false) or unpins the pool's release; its workers are replaced to match.
pub async fn set_version<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    version: &str,
    follow: bool,
    now: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE node_pools SET kubernetes_version = $1, follow_control_plane = $2, updated_at = $3 \
         WHERE id = $4 AND deleting = 0",
    )
    .bind(version)
    .bind(i64::from(follow))
    .bind(now)
    .bind(id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The pools of `cluster_id` (every cluster when None) that follow their control plane and run
/// another release than it, now that every member runs its target: each moves to that target.
/// The pools moved.
pub async fn follow_control_planes<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: Option<i64>,
    now: i64,
) -> Result<Vec<i64>, DbError> {
    Ok(sqlx::query_scalar::<_, i64>(
        "UPDATE node_pools SET updated_at = $1, kubernetes_version = \
           (SELECT c.kubernetes_version FROM clusters c WHERE c.id = node_pools.cluster_id) \
         WHERE follow_control_plane = 1 AND deleting = 0 \
           AND ($2 = 0 OR cluster_id = $2) \
           AND EXISTS (SELECT 1 FROM clusters c WHERE c.id = node_pools.cluster_id \
             AND c.phase = 'founded' AND c.kubernetes_version <> node_pools.kubernetes_version \
             AND NOT EXISTS (SELECT 1 FROM cluster_nodes n WHERE n.cluster_id = c.id \
               AND n.role = 'control-plane' \
               AND (n.etcd_membership IS NULL OR n.etcd_membership <> 'leaving') \
               AND (n.kubernetes_version IS NULL OR n.kubernetes_version <> c.kubernetes_version))) \
         RETURNING id",
    )
    .bind(now)
    .bind(cluster_id.unwrap_or(0))
    .fetch_all(db)
    .await?)
}

/// Stores the pool's own health policy (None: it follows its cluster's again).
pub async fn set_health_policy<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    policy: Option<&str>,
) -> Result<(), DbError> {
    sqlx::query("UPDATE node_pools SET health_policy = $1 WHERE id = $2")
        .bind(policy)
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}

/// Stores why the pool's remediation waits (None: it does not).
pub async fn set_remediation_blocked<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    blocked: Option<&str>,
) -> Result<(), DbError> {
    sqlx::query("UPDATE node_pools SET remediation_blocked = $1 WHERE id = $2")
        .bind(blocked)
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}
