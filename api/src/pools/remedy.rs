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
    let now = ctx.clock.unix();
    let components = db::components::for_cluster(&ctx.db.pool, cluster.id).await?;
    let mut sick = health::unhealthy(&policy, active.iter().copied(), &components, now);
    if sick.is_empty() || !policy.remediation {
        held(ctx, pool, None, now).await?;
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
        Ok(()) => {
            held(ctx, pool, None, now).await?;
            Ok(Some(sick.swap_remove(0)))
        }
        Err(blocked) => {
            held(ctx, pool, Some(&blocked), now).await?;
            Ok(None)
        }
    }
}

/// Keeps why the pool's remediation waits (`None`: it does not) on its row, for the cluster's
/// `RemediationAllowed`, writing only a change.
pub(crate) async fn held(
    ctx: &Pools,
    pool: &PoolRow,
    blocked: Option<&health::Blocked>,
    now: i64,
) -> Result<(), DbError> {
    let stored = pool.remediation_blocked.as_deref();
    let Some(blocked) = blocked else {
        if stored.is_some() {
            db::pools::set_remediation_blocked(&ctx.db.pool, pool.id, None).await?;
        }
        return Ok(());
    };
    if let Some(text) = health::blocked::next(stored, blocked, now) {
        tracing::info!(
            cluster_id = pool.cluster_id,
            pool_id = pool.id,
            reason = blocked.reason(),
            "pool remediation waits: {}",
            blocked.describe()
        );
        db::pools::set_remediation_blocked(&ctx.db.pool, pool.id, Some(&text)).await?;
    }
    Ok(())
}
