//! Snapshots on a schedule, and how many are kept: each founded cluster has an interval
//! (default 12 hours, as k3s; 0 turns it off) and a retention (default the newest 14 stored).
//! The reconciler's pass asks for every snapshot that is due — none being taken, none failed
//! in the last [`RETRY_SECS`], the last stored (or the founding) at least an interval old — and
//! deletes the stored snapshots beyond the retention (their objects first), and as many old
//! failed ones. `SnapshotsUpToDate` ([`crate::status::snapshots`]) says when one is missed.

use super::{SnapshotError, Snapshots, request_of};
use crate::db::snapshots::{SnapshotState, Trigger};
use crate::db::{self};

/// How long after a failed snapshot the schedule tries again.
pub const RETRY_SECS: i64 = 30 * 60;
/// The default interval.
pub const DEFAULT_EVERY_SECS: i64 = 12 * 3600;
/// The default retention.
pub const DEFAULT_RETAIN: i64 = 14;
/// The bounds a schedule is checked against.
pub const EVERY_HOURS: std::ops::RangeInclusive<i64> = 0..=24 * 31;
pub const RETAIN: std::ops::RangeInclusive<i64> = 1..=1000;

/// A cluster's schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub every_secs: i64,
    pub retain: i64,
}

/// Sets `org_id`'s cluster's schedule (`every_hours` 0: only when asked).
pub async fn set(
    ctx: &Snapshots,
    org_id: i64,
    cluster_id: i64,
    every_hours: i64,
    retain: i64,
) -> Result<Schedule, SnapshotError> {
    if !EVERY_HOURS.contains(&every_hours) {
        return Err(SnapshotError::BadSchedule(format!(
            "every_hours must be between {} and {} (0: only when asked), not {every_hours}",
            EVERY_HOURS.start(),
            EVERY_HOURS.end()
        )));
    }
    if !RETAIN.contains(&retain) {
        return Err(SnapshotError::BadSchedule(format!(
            "retain must be between {} and {}, not {retain}",
            RETAIN.start(),
            RETAIN.end()
        )));
    }
    db::clusters::get(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(SnapshotError::NotFound)?;
    let schedule = Schedule {
        every_secs: every_hours * 3600,
        retain,
    };
    db::snapshots::set_schedule(&ctx.db.pool, cluster_id, schedule.every_secs, retain).await?;
    tracing::info!(
        cluster_id,
        every_hours,
        retain,
        "etcd snapshot schedule set"
    );
    Ok(schedule)
}

/// `org_id`'s cluster's schedule.
pub async fn get(ctx: &Snapshots, org_id: i64, cluster_id: i64) -> Result<Schedule, SnapshotError> {
    let cluster = db::clusters::get(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(SnapshotError::NotFound)?;
    Ok(Schedule {
        every_secs: cluster.snapshot_every_secs,
        retain: cluster.snapshot_retain,
    })
}

/// One pass: asks for the snapshots due, then prunes beyond each cluster's retention; how
/// many were asked for.
pub async fn pass(ctx: &Snapshots) -> usize {
    let now = ctx.clock.unix();
    let mut asked = 0;
    if let Err(e) = db::snapshots::expire_all(&ctx.db.pool, now).await {
        tracing::warn!(error = %crate::error_chain(&e), "cannot fail the snapshots past their deadline");
    }
    match db::snapshots::due(&ctx.db.pool, now, now - RETRY_SECS).await {
        Ok(due) => {
            for cluster_id in due {
                match request_of(ctx, cluster_id, Trigger::Schedule).await {
                    Ok(_) => asked += 1,
                    // No healthy voter, or one being taken: the condition says so; the next
                    // pass tries again.
                    Err(e) => {
                        tracing::warn!(cluster_id, error = %crate::error_chain(&e), "scheduled etcd snapshot not asked");
                    }
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "cannot list the snapshots due");
        }
    }
    match db::snapshots::over_retention(&ctx.db.pool).await {
        Ok(clusters) => {
            for cluster_id in clusters {
                if let Err(e) = prune(ctx, cluster_id).await {
                    tracing::warn!(cluster_id, error = %crate::error_chain(&e), "cannot prune old etcd snapshots (the next pass tries again)");
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "cannot list clusters over their snapshot retention");
        }
    }
    asked
}

/// Deletes the cluster's stored snapshots beyond its retention (object first, then row), and
/// its failed ones beyond as many.
async fn prune(ctx: &Snapshots, cluster_id: i64) -> Result<(), SnapshotError> {
    let Some(cluster) = db::clusters::get_by_id(&ctx.db.pool, cluster_id).await? else {
        return Ok(());
    };
    let keep = usize::try_from(cluster.snapshot_retain).unwrap_or(usize::MAX);
    let all = db::snapshots::list(&ctx.db.pool, cluster_id).await?;
    for state in [SnapshotState::Stored, SnapshotState::Failed] {
        for old in all.iter().filter(|s| s.state == state).skip(keep) {
            if let Some(key) = &old.object_key {
                ctx.store.delete(key).await?;
            }
            db::snapshots::delete(&ctx.db.pool, old.id).await?;
            tracing::info!(
                cluster_id,
                snapshot_id = old.id,
                state = state.as_str(),
                "etcd snapshot beyond the retention deleted"
            );
        }
    }
    Ok(())
}
