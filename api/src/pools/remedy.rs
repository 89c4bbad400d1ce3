//! A pool's unhealthy workers replaced without an operator (Cluster API's MachineHealthCheck
//! remediation): the longest-unhealthy worker is drained (if its node answers; a dead one's
//! drain ends at the drain deadline) and released, and the pool makes its replacement as for
//! any missing worker. One at a time — the converge loop waits while a removal runs — and only
//! as the pool's health policy (its own, else its cluster's) allows ([`crate::health::allowed`]).

use crate::db::{self, DbError, clusters::ClusterRow, nodes::NodeRow, pools::PoolRow};
use crate::health::{self, SetHealth, Unhealthy};

use super::Pools;

/// The worker of `active` the pool replaces now, if any.
pub(super) async fn due<'a>(
    ctx: &Pools,
    cluster: &ClusterRow,
    pool: &PoolRow,
    active: &[&'a NodeRow],
) -> Result<Option<Unhealthy<'a>>, DbError> {
    let pool_id = pool.id;
    let policy = crate::health::policy::for_pool(cluster, Some(pool));
    if !policy.remediation {
        return Ok(None);
    }
    let now = ctx.clock.unix();
    let components = db::components::for_cluster(&ctx.db.pool, cluster.id).await?;
    let mut sick = health::unhealthy(&policy, active.iter().copied(), &components, now);
    if sick.is_empty() {
        return Ok(None);
    }
    let period = i64::from(policy.retry_period_secs);
    let recent = db::remediations::since(&ctx.db.pool, cluster.id, now - period).await?;
    let recent = recent.iter().filter(|r| r.pool_id == Some(pool_id)).count();
    let set = SetHealth {
        machines: active.len(),
        unhealthy: sick.len(),
        recent_remediations: u32::try_from(recent).unwrap_or(u32::MAX),
        voters: None,
    };
    match health::allowed(&policy, set) {
        Ok(()) => Ok(Some(sick.swap_remove(0))),
        Err(blocked) => {
            tracing::info!(
                cluster_id = cluster.id,
                pool_id,
                reason = blocked.reason(),
                unhealthy = sick.len(),
                "pool remediation waits: {}",
                blocked.describe()
            );
            Ok(None)
        }
    }
}
