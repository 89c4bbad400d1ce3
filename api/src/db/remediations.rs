//! `remediations`: each machine replaced because it was unhealthy — what the policy's retry
//! limit counts, per machine set (a pool, or the control plane), within its period.

use sqlx::{Any, Executor, Row as _};

use super::DbError;

/// One remediation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemediationRow {
    pub id: i64,
    pub cluster_id: i64,
    /// None: a control-plane member.
    pub pool_id: Option<i64>,
    pub vm_id: i64,
    pub node_name: String,
    /// Cluster API's reason (`MachineDeleted`, `NodeUnreachable`, ...).
    pub reason: String,
    pub message: String,
    pub created_at: i64,
}

/// What a remediation records.
#[derive(Debug, Clone, Copy)]
pub struct NewRemediation<'a> {
    pub cluster_id: i64,
    pub pool_id: Option<i64>,
    pub vm_id: i64,
    pub node_name: &'a str,
    pub reason: &'a str,
    pub message: &'a str,
}

pub async fn insert<'c>(
    db: impl Executor<'c, Database = Any>,
    new: NewRemediation<'_>,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO remediations (cluster_id, pool_id, vm_id, node_name, reason, message, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(new.cluster_id)
    .bind(new.pool_id)
    .bind(new.vm_id)
    .bind(new.node_name)
    .bind(new.reason)
    .bind(new.message)
    .bind(now)
    .execute(db)
    .await?;
    Ok(())
}

/// The cluster's remediations since `since`, newest first.
pub async fn since<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    since: i64,
) -> Result<Vec<RemediationRow>, DbError> {
    let rows = sqlx::query(
        "SELECT id, cluster_id, pool_id, vm_id, node_name, reason, message, created_at \
         FROM remediations WHERE cluster_id = $1 AND created_at >= $2 ORDER BY id DESC",
    )
    .bind(cluster_id)
    .bind(since)
    .fetch_all(db)
    .await?;
    Ok(rows
        .iter()
        .map(|r| {
            Ok(RemediationRow {
                id: r.try_get("id")?,
                cluster_id: r.try_get("cluster_id")?,
                pool_id: r.try_get("pool_id")?,
                vm_id: r.try_get("vm_id")?,
                node_name: r.try_get("node_name")?,
                reason: r.try_get("reason")?,
                message: r.try_get("message")?,
                created_at: r.try_get("created_at")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?)
}

/// Marks finished, at `now`, the remediations of a machine set — the control plane (`pool_id`
/// None) or a pool — whose machine is gone, once the caller found the set back at its size with
/// every node up. Each one ends once (its `remediation` event says so).
pub async fn finish<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    pool_id: Option<i64>,
    now: i64,
) -> Result<u64, DbError> {
    let set = match pool_id {
        None => "pool_id IS NULL",
        Some(_) => "pool_id = $3",
    };
    let sql = format!(
        "UPDATE remediations SET finished_at = $1 \
         WHERE cluster_id = $2 AND {set} AND finished_at IS NULL \
           AND NOT EXISTS (SELECT 1 FROM cluster_nodes n \
                           WHERE n.cluster_id = remediations.cluster_id \
                             AND n.vm_id = remediations.vm_id)"
    );
    let done = sqlx::query(&sql).bind(now).bind(cluster_id);
    let done = match pool_id {
        None => done,
        Some(pool) => done.bind(pool),
    };
    Ok(done.execute(db).await?.rows_affected())
}

/// Whether a remediation of pool `pool_id` has not finished yet.
pub async fn open_in_pool<'c>(
    db: impl Executor<'c, Database = Any>,
    pool_id: i64,
) -> Result<bool, DbError> {
    let row = sqlx::query(
        "SELECT id FROM remediations WHERE pool_id = $1 AND finished_at IS NULL LIMIT 1",
    )
    .bind(pool_id)
    .fetch_optional(db)
    .await?;
    Ok(row.is_some())
}
