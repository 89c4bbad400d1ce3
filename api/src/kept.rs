//! Deleted clusters kept for recovery. A delete keeps what founding a cluster from it needs
//! (`restore_from`): its sealed trust — the CAs, the service-account keys, the
//! secrets-encryption key, the CA standby — and its stored snapshots, for its org's
//! `exk8s-api orgs set --keep-deleted-days` or else the API's `--keep-deleted-days`
//! ([`crate::db::kept`], [`kept_until`]). An operator purges one early, naming it to confirm; the reconciler
//! purges those whose time is up ([`purge_due`]). A purge deletes the snapshots' objects from
//! the store first, then the rows: one that fails part-way is retried whole, and a cluster being
//! restored from a kept one keeps it until its restore is done.

use std::time::Duration;

use crate::db::kept::KeptRow;
use crate::db::{self, DbError};
use crate::snapshots::{Snapshots, StoreError};

/// Why a purge was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum PurgeError {
    #[error("not found")]
    NotFound,
    #[error("purging deleted cluster {id} cannot be undone: confirm by naming it (confirm={name})")]
    Unconfirmed { id: i64, name: String },
    #[error(
        "cluster {restoring} is being restored from deleted cluster {id}; purge it once that \
         restore is done"
    )]
    InUse { id: i64, restoring: i64 },
    #[error("deleting its snapshots from the store: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// Until when cluster `cluster_id`, deleted at `now`, is kept: its org's days, or else `default`.
pub async fn kept_until(
    db: &sqlx::AnyPool,
    cluster_id: i64,
    default: Duration,
    now: i64,
) -> Result<i64, DbError> {
    let keep = match db::orgs::keep_deleted_days_of_cluster(db, cluster_id).await? {
        Some(days) => Duration::from_secs(u64::from(days) * 86_400),
        None => default,
    };
    Ok(now.saturating_add(i64::try_from(keep.as_secs()).unwrap_or(i64::MAX)))
}

/// The org's kept clusters, the soonest purged first.
pub async fn list(ctx: &Snapshots, org_id: i64) -> Result<Vec<KeptRow>, DbError> {
    db::kept::list(&ctx.db.pool, org_id).await
}

/// The org's kept cluster `id`.
pub async fn get(ctx: &Snapshots, org_id: i64, id: i64) -> Result<KeptRow, PurgeError> {
    db::kept::get(&ctx.db.pool, org_id, id)
        .await?
        .ok_or(PurgeError::NotFound)
}

/// Purges the org's kept cluster `id` now; `confirm` must be its name.
pub async fn purge(
    ctx: &Snapshots,
    org_id: i64,
    id: i64,
    confirm: Option<&str>,
) -> Result<(), PurgeError> {
    let kept = get(ctx, org_id, id).await?;
    if confirm != Some(kept.name.as_str()) {
        return Err(PurgeError::Unconfirmed {
            id,
            name: kept.name,
        });
    }
    purge_one(ctx, id).await?;
    tracing::info!(cluster_id = id, "deleted cluster purged by an operator");
    Ok(())
}

/// Purges every kept cluster whose time is up at the reconciler's clock; returns how many.
pub async fn purge_due(ctx: &Snapshots) -> usize {
    let due = match db::kept::due(&ctx.db.pool, ctx.clock.unix()).await {
        Ok(due) => due,
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "reconciler: cannot list deleted clusters due for their purge");
            return 0;
        }
    };
    let mut purged = 0;
    for id in due {
        match purge_one(ctx, id).await {
            Ok(()) => {
                purged += 1;
                tracing::info!(
                    cluster_id = id,
                    "deleted cluster purged: its time to be kept is up"
                );
            }
            Err(PurgeError::InUse { restoring, .. }) => {
                tracing::info!(
                    cluster_id = id,
                    restoring,
                    "deleted cluster kept past its time: a cluster is being restored from it"
                );
            }
            Err(e) => {
                tracing::warn!(cluster_id = id, error = %crate::error_chain(&e), "reconciler: a purge did not finish (retried at the next pass)");
            }
        }
    }
    purged
}

/// The snapshots' objects, then the rows; refused while a cluster is restored from it.
async fn purge_one(ctx: &Snapshots, id: i64) -> Result<(), PurgeError> {
    if let Some(restoring) = db::kept::restoring_from(&ctx.db.pool, id).await? {
        return Err(PurgeError::InUse { id, restoring });
    }
    for key in db::kept::object_keys(&ctx.db.pool, id).await? {
        ctx.store.delete(&key).await?;
    }
    db::kept::purge(&ctx.db.pool, id).await?;
    Ok(())
}
