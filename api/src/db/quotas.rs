//! What an org uses against its quotas: its clusters, its pools and its VMs, read from the
//! clusters, the pools and the resource journal.

use sqlx::{Any, Executor, Row as _};

use super::DbError;

/// An org's use of what quotas bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Clusters that are not `failed` (a failed one holds no VM); a deleted one counts while it
    /// is kept ([`super::kept`]).
    pub clusters: i64,
    pub pools: i64,
    /// For each cluster and pool, the larger of the VMs it asked for and those it has (journaled
    /// and not deleted): a change still making its VMs counts in full.
    pub vms: i64,
}

/// Org `org_id`'s usage.
pub async fn usage(db: &sqlx::AnyPool, org_id: i64) -> Result<Usage, DbError> {
    let clusters = sqlx::query(
        "SELECT c.id, c.phase, c.last_ordinal, c.desired_control_plane_count, \
         (SELECT COUNT(*) FROM cluster_resources r WHERE r.cluster_id = c.id AND r.kind = 'vm' \
            AND r.pool_id IS NULL AND r.state <> 'deleted') AS live \
         FROM clusters c WHERE c.org_id = $1 AND c.phase <> 'failed'",
    )
    .bind(org_id)
    .fetch_all(db)
    .await?;
    let pools = pools_of(db, org_id).await?;
    let mut usage = Usage {
        clusters: i64::try_from(clusters.len()).unwrap_or(i64::MAX),
        pools: i64::try_from(pools.len()).unwrap_or(i64::MAX),
        vms: pools
            .iter()
            .map(|(desired, live)| (*desired).max(*live))
            .sum(),
    };
    for row in &clusters {
        let phase: String = row.try_get("phase")?;
        let founding: i64 = if matches!(phase.as_str(), "provisioning" | "compensating") {
            row.try_get("last_ordinal")?
        } else {
            0
        };
        let desired: Option<i64> = row.try_get("desired_control_plane_count")?;
        let live: i64 = row.try_get("live")?;
        usage.vms += live.max(desired.unwrap_or(0)).max(founding);
    }
    Ok(usage)
}

/// (desired count, live VMs) of each of the org's pools.
async fn pools_of<'c>(
    db: impl Executor<'c, Database = Any>,
    org_id: i64,
) -> Result<Vec<(i64, i64)>, DbError> {
    let rows = sqlx::query(
        "SELECT p.desired_count, \
         (SELECT COUNT(*) FROM cluster_resources r WHERE r.pool_id = p.id AND r.kind = 'vm' \
            AND r.state <> 'deleted') AS live \
         FROM node_pools p JOIN clusters c ON c.id = p.cluster_id WHERE c.org_id = $1",
    )
    .bind(org_id)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("desired_count")?, r.try_get("live")?)))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(DbError::from)
}
