//! A cluster's control-plane membership changes: the size the operator asked for
//! (`clusters.desired_control_plane_count`), the lease that lets one API process at a time
//! change it, why the last attempt failed, and each node's place in etcd
//! (`cluster_nodes.etcd_membership`).

use sqlx::{Any, Executor, Row};

use super::DbError;
use super::phase::EtcdMembership;

/// The size asked for, when one was.
pub async fn desired<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Option<i64>, DbError> {
    let row = sqlx::query("SELECT desired_control_plane_count AS n FROM clusters WHERE id = $1")
        .bind(cluster_id)
        .fetch_optional(db)
        .await?;
    Ok(row.map(|r| r.try_get("n")).transpose()?.flatten())
}

pub async fn set_desired<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    count: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE clusters SET desired_control_plane_count = $1, membership_error = NULL WHERE id = $2",
    )
    .bind(count)
    .bind(cluster_id)
    .execute(db)
    .await?;
    Ok(())
}

/// Nothing is asked any more (a single member's removal sets its own course).
pub async fn forget_desired<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE clusters SET desired_control_plane_count = NULL, membership_error = NULL WHERE id = $1",
    )
    .bind(cluster_id)
    .execute(db)
    .await?;
    Ok(())
}

/// Ends a change that stopped: nothing more is asked (a replacement neither); `error` says
/// why.
pub async fn abandon(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    error: &str,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE clusters SET desired_control_plane_count = NULL, membership_error = $1 WHERE id = $2",
    )
    .bind(error)
    .bind(cluster_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query("UPDATE cluster_nodes SET replace_since = NULL WHERE cluster_id = $1")
        .bind(cluster_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Records that the operator asked (at `now`) to replace the control-plane node `node_id`.
pub async fn mark_replaced<'c>(
    db: impl Executor<'c, Database = Any>,
    node_id: i64,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query("UPDATE cluster_nodes SET replace_since = $1 WHERE id = $2")
        .bind(now)
        .bind(node_id)
        .execute(db)
        .await?;
    Ok(())
}

/// Why the last membership change stopped (None once one goes on).
pub async fn error<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Option<String>, DbError> {
    let row = sqlx::query("SELECT membership_error AS e FROM clusters WHERE id = $1")
        .bind(cluster_id)
        .fetch_optional(db)
        .await?;
    Ok(row.map(|r| r.try_get("e")).transpose()?.flatten())
}

/// Founded clusters whose membership differs from what was asked (or has a member joining,
/// leaving or to be replaced) and that nobody is changing.
pub async fn needing_work<'c>(
    db: impl Executor<'c, Database = Any>,
    now: i64,
) -> Result<Vec<i64>, DbError> {
    Ok(sqlx::query_scalar::<_, i64>(
        "SELECT c.id FROM clusters c WHERE c.phase = 'founded' \
         AND (c.membership_lease_until IS NULL OR c.membership_lease_until < $1) \
         AND (c.desired_control_plane_count <> (SELECT COUNT(*) FROM cluster_nodes n \
                 WHERE n.cluster_id = c.id AND n.etcd_membership = 'voter') \
              OR EXISTS (SELECT 1 FROM cluster_nodes n WHERE n.cluster_id = c.id \
                 AND (n.etcd_membership IN ('joining', 'leaving') OR n.replace_since IS NOT NULL))) \
         ORDER BY c.id",
    )
    .bind(now)
    .fetch_all(db)
    .await?)
}

pub async fn set<'c>(
    db: impl Executor<'c, Database = Any>,
    node_id: i64,
    membership: EtcdMembership,
) -> Result<(), DbError> {
    sqlx::query("UPDATE cluster_nodes SET etcd_membership = $1 WHERE id = $2")
        .bind(membership.as_str())
        .bind(node_id)
        .execute(db)
        .await?;
    Ok(())
}

/// Marks `node_id` leaving, removed from etcd by the control-plane node `remover` at its
/// generation `generation`.
pub async fn start_leaving(
    tx: &mut sqlx::AnyConnection,
    node_id: i64,
    remover: i64,
    generation: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE cluster_nodes SET etcd_membership = 'leaving', drain_by = $1, drain_generation = $2 \
         WHERE id = $3",
    )
    .bind(remover)
    .bind(generation)
    .bind(node_id)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// When the node that installs the cluster-wide addons has left: the oldest control-plane
/// voter of `cluster_id` takes that role (a cluster renders with exactly one).
pub async fn hand_over_initial(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE cluster_nodes SET is_initial = 1 WHERE id = (SELECT id FROM cluster_nodes \
         WHERE cluster_id = $1 AND etcd_membership = 'voter' ORDER BY ordinal LIMIT 1) \
         AND NOT EXISTS (SELECT 1 FROM cluster_nodes WHERE cluster_id = $1 AND is_initial = 1)",
    )
    .bind(cluster_id)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
