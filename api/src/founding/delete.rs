//! Deleting a cluster, so that deleting wins over every convergence: the cluster is fenced
//! (`deleting`: no membership or pool convergence starts another step), then the deleter takes the
//! membership lease and every pool's lease, waiting for the convergences holding them to stop (each
//! checks the phase between steps; a dead holder's lease runs out within [`crate::lease::TTL`]),
//! so no VM is being made while it releases everything the journal knows — the VMs made after
//! the delete began included — and only then are the rows deleted, but for what recovery needs:
//! the cluster ends `deleted`, its trust and stored snapshots kept until [`crate::kept`] purges
//! them. A delete that cannot finish now (a convergence still in its step, the compute API
//! failing) leaves the cluster `deleting`, and the reconciler finishes it ([`finish_all`]),
//! after a crash too.

use std::time::{Duration, Instant};

use super::release::{self, ReleaseError};
use crate::db::{self, DbError, leases::Leased, phase::ClusterPhase};
use crate::lease;
use crate::machines::Machines;

#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("{0} (the cluster stays `deleting`; the reconciler retries)")]
    Release(#[from] ReleaseError),
}

/// How a delete ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// Everything released, the rows gone but what is kept (the cluster `deleted`).
    Done,
    /// A convergence still holds a lease: the cluster is `deleting`, the reconciler finishes.
    Pending,
}

/// How often a waiting delete tries the leases again.
const RETRY: Duration = Duration::from_millis(100);

/// Deletes cluster `cluster_id`, waiting at most `wait` for convergences to stop.
pub async fn delete(
    machines: &Machines,
    cluster_id: i64,
    wait: Duration,
) -> Result<Deleted, DeleteError> {
    db::clusters::set_phase(
        &machines.db.pool,
        cluster_id,
        ClusterPhase::Deleting,
        db::now(),
    )
    .await?;
    let deadline = Instant::now() + wait;
    let mut wanted = vec![Leased::Membership(cluster_id)];
    wanted.extend(
        db::pools::list(&machines.db.pool, cluster_id)
            .await?
            .iter()
            .map(|p| Leased::Pool(p.id)),
    );
    let mut held = Vec::with_capacity(wanted.len());
    for what in wanted {
        loop {
            if let Some(lease) = lease::claim(&machines.db, what).await? {
                held.push(lease);
                break;
            }
            if Instant::now() >= deadline {
                tracing::info!(cluster_id, lease = ?what, "delete waits for a convergence to stop (the reconciler finishes it)");
                give_back(held).await;
                return Ok(Deleted::Pending);
            }
            tokio::time::sleep(RETRY).await;
        }
    }
    if let Err(e) = release::release_all(machines, cluster_id).await {
        give_back(held).await;
        return Err(e.into());
    }
    db::resources::delete_for_cluster(&machines.db.pool, cluster_id).await?;
    let now = db::now();
    let kept_until = crate::kept::kept_until(
        &machines.db.pool,
        cluster_id,
        machines.config.keep_deleted,
        now,
    )
    .await?;
    db::kept::keep(&machines.db, cluster_id, now, kept_until).await?;
    // The rows the leases were on are gone: nothing to give back.
    drop(held);
    tracing::info!(
        cluster_id,
        kept_until,
        "cluster deleted: its trust and stored snapshots are kept until the purge"
    );
    Ok(Deleted::Done)
}

async fn give_back(held: Vec<lease::Held>) {
    for lease in held {
        if let Err(e) = lease.release(None).await {
            tracing::warn!(error = %crate::error_chain(&e), "cannot give a lease back (it runs out)");
        }
    }
}

/// Finishes every cluster left `deleting`; returns how many were deleted.
pub async fn finish_all(machines: &Machines) -> usize {
    let ids = match db::clusters::deleting(&machines.db.pool).await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "reconciler: cannot list clusters being deleted");
            return 0;
        }
    };
    let mut done = 0;
    for cluster_id in ids {
        match delete(machines, cluster_id, Duration::from_secs(1)).await {
            Ok(Deleted::Done) => done += 1,
            Ok(Deleted::Pending) => {}
            Err(e) => {
                tracing::warn!(cluster_id, error = %crate::error_chain(&e), "reconciler: a delete did not finish");
            }
        }
    }
    done
}
