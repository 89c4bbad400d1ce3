//! The reconciler: at start and on a timer, finishes compensation for clusters left in
//! `provisioning` (or `compensating`) past the deadline — a process that crashed mid-founding,
//! or a compensation the compute API interrupted — runs certificate renewal
//! ([`crate::renewal::pass`]), moves CA rotations on ([`crate::rotation::advance`]) and
//! converges node pools nobody converges ([`pools`]) and forgets old cluster events and expired
//! request nonces. Claims are atomic in the database, so several API replicas never compensate
//! the same cluster (or converge the same pool) at once.

use std::sync::Arc;
use std::time::Duration;

use crate::db::{self, Db};

/// What the reconciler's passes need: the rows, the clock retention is judged by, the
/// timings, the metrics, the key pool, and each domain it moves on.
#[derive(Debug, Clone)]
pub struct Reconciler {
    pub db: Db,
    pub clock: Arc<dyn crate::clock::Clock>,
    /// A `provisioning` cluster untouched this long is abandoned.
    pub provisioning_deadline: Duration,
    /// How long a pass waits for the next.
    pub interval: Duration,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub key_pool: crate::keypool::KeyPool,
    pub machines: crate::machines::Machines,
    pub renewer: crate::renewal::Renewer,
    pub rotator: crate::rotation::Rotator,
    pub pools: crate::pools::Pools,
    pub membership: crate::membership::Membership,
    pub snapshots: crate::snapshots::Snapshots,
    pub health: crate::health::pass::Checks,
}

/// One pass: compensates every stale cluster; returns how many were finished.
pub async fn pass(ctx: &Reconciler) -> usize {
    let mut finished = 0;
    loop {
        let now = db::now();
        let stale_before =
            now - i64::try_from(ctx.provisioning_deadline.as_secs()).unwrap_or(i64::MAX);
        let claimed = match db::clusters::claim_stale(&ctx.db.pool, stale_before, now).await {
            Ok(Some(id)) => id,
            Ok(None) => return finished,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "reconciler: cannot claim stale clusters");
                return finished;
            }
        };
        match super::release::release_all(&ctx.machines, claimed).await {
            Ok(()) => {
                let reason = "abandoned";
                let message = "founding did not finish (the API stopped mid-way); its resources were released";
                let row = db::clusters::get_by_id(&ctx.db.pool, claimed)
                    .await
                    .ok()
                    .flatten();
                let (reason, message) = match &row {
                    Some(r) if r.error_reason.is_some() => (
                        r.error_reason.clone().unwrap_or_default(),
                        r.error_message.clone().unwrap_or_default(),
                    ),
                    _ => (reason.to_owned(), message.to_owned()),
                };
                if db::clusters::set_error(
                    &ctx.db.pool,
                    claimed,
                    crate::db::phase::ClusterPhase::Failed,
                    &reason,
                    &message,
                    db::now(),
                )
                .await
                .is_ok()
                {
                    ctx.metrics.compensations.inc();
                    finished += 1;
                    tracing::info!(
                        cluster_id = claimed,
                        "reconciler released an abandoned cluster"
                    );
                }
            }
            Err(e) => {
                // Stays `compensating`; the next pass after the deadline tries again.
                tracing::warn!(cluster_id = claimed, error = %crate::error_chain(&e), "reconciler: release failed");
                return finished;
            }
        }
    }
}

/// Moves on every CA rotation whose phase reached every node (a missed report's work).
async fn rotations(ctx: &Reconciler) {
    let clusters = match db::rotations::in_progress(&ctx.db.pool).await {
        Ok(clusters) => clusters,
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "reconciler: cannot list CA rotations");
            return;
        }
    };
    for cluster_id in clusters {
        if let Err(e) = crate::rotation::advance(&ctx.rotator, cluster_id).await {
            tracing::warn!(cluster_id, error = %crate::error_chain(&e), "reconciler: CA rotation could not move on");
        }
    }
}

/// Moves on every service-account key rotation whose phase reached every control-plane node
/// or whose wait is over, and starts the rotations that clusters asked for once their key is
/// past its maximum age.
pub async fn sa_rotations(ctx: &Reconciler) {
    let clusters = match db::sa_rotations::in_progress(&ctx.db.pool).await {
        Ok(clusters) => clusters,
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "reconciler: cannot list service-account key rotations");
            return;
        }
    };
    for cluster_id in clusters {
        if let Err(e) = crate::sa_rotation::advance(&ctx.rotator, cluster_id).await {
            tracing::warn!(cluster_id, error = %crate::error_chain(&e), "reconciler: service-account key rotation could not move on");
        }
    }
    crate::sa_rotation::rotate_due(&ctx.rotator).await;
}

/// Converges every pool whose machines differ from it and that no process converges: a crash
/// mid-way, a failed step, a drain whose deadline passed. Returns how many pools it converged.
pub async fn pools(ctx: &Reconciler) -> usize {
    // Pools that follow a control plane whose upgrade finished take its release (a report that
    // would have moved them may have been lost to a crash).
    if let Err(e) = db::pools::follow_control_planes(&ctx.db.pool, None, db::now()).await {
        tracing::warn!(error = %crate::error_chain(&e), "reconciler: cannot move pools to their control plane's release");
    }
    let ids = match db::pools::needing_work(&ctx.db.pool, db::now()).await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "reconciler: cannot list node pools");
            return 0;
        }
    };
    let mut converged = 0;
    for pool_id in ids {
        match crate::pools::converge::converge(&ctx.pools, pool_id).await {
            Ok(
                crate::pools::converge::Outcome::Converged | crate::pools::converge::Outcome::Gone,
            ) => {
                converged += 1;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(pool_id, error = %crate::error_chain(&e), "reconciler: node pool did not converge");
            }
        }
    }
    converged
}

/// The health pass ([`crate::health::pass`]): each cluster's VM states kept, then each pool
/// with an unhealthy worker converged, which replaces it as the cluster's policy allows, and
/// each control plane with an unhealthy member remediated when its policy and quorum allow.
pub async fn health(ctx: &Reconciler) {
    let found = crate::health::pass::pass(&ctx.health).await;
    for pool_id in found.pools {
        if let Err(e) = crate::pools::converge::converge(&ctx.pools, pool_id).await {
            tracing::warn!(pool_id, error = %crate::error_chain(&e), "reconciler: a pool with an unhealthy worker did not converge");
        }
    }
    for cluster_id in found.control_planes {
        if let Err(e) = crate::membership::remediate(&ctx.membership, cluster_id).await {
            tracing::warn!(cluster_id, error = %crate::error_chain(&e), "reconciler: a control plane's remediation failed");
        }
    }
}

/// Moves on every control-plane change nobody is moving (a crash, a join past its timeout).
pub async fn memberships(ctx: &Reconciler) {
    let ids = match db::membership::needing_work(&ctx.db.pool, db::now()).await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "reconciler: cannot list control-plane changes");
            return;
        }
    };
    for cluster_id in ids {
        if let Err(e) = crate::membership::converge::converge(&ctx.membership, cluster_id).await {
            tracing::warn!(cluster_id, error = %crate::error_chain(&e), "reconciler: control-plane change stopped");
        }
    }
}

/// How long a cluster's changes stay readable by `GET /clusters/{id}/events`.
pub const EVENT_RETENTION_SECS: i64 = 30 * 86_400;

/// How long node reports are kept (each node's latest is kept whatever its age).
pub const REPORT_RETENTION_SECS: i64 = 30 * 86_400;

/// How long an `Idempotency-Key` replays its first answer.
pub const IDEMPOTENCY_RETENTION_SECS: i64 = 86_400;

/// Forgets what no one can use any more, at the reconciler's clock: clusters' changes and node
/// reports past their retention, expired instance-metadata tokens, signed requests' nonces that
/// no accepted timestamp could carry, and idempotency keys past a day. Each table stays bounded
/// by its retention however long the fleet runs (docs/running-the-api.md, "What the database keeps").
pub async fn prune(ctx: &Reconciler) {
    let now = ctx.clock.unix();
    let pool = &ctx.db.pool;
    let outcomes = [
        (
            "cluster events",
            db::events::prune(pool, now - EVENT_RETENTION_SECS).await,
        ),
        (
            "node reports",
            db::issuances::prune_reports(pool, now - REPORT_RETENTION_SECS).await,
        ),
        (
            "instance-metadata tokens",
            db::tokens::prune_imds_tokens(pool, now).await,
        ),
        ("request nonces", db::nonces::prune(pool, now).await),
        (
            "idempotency keys",
            db::idempotency::prune(pool, now - IDEMPOTENCY_RETENTION_SECS).await,
        ),
    ];
    for (what, outcome) in outcomes {
        match outcome {
            Ok(0) => {}
            Ok(n) => tracing::debug!(pruned = n, what, "reconciler: forgot expired rows"),
            Err(e) => {
                tracing::warn!(what, error = %crate::error_chain(&e), "reconciler: cannot prune");
            }
        }
    }
}

/// Runs [`pass`], the deletes left to finish and the purges due ([`crate::kept`]), the
/// certificate renewal pass, CA rotations, pools, control-plane changes, the health pass (each
/// cluster's VM states), scheduled etcd snapshots, the key pool's demand and [`prune`] now and
/// then every `reconcile_interval`, until the process stops.
pub fn spawn(ctx: Reconciler) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            pass(&ctx).await;
            super::delete::finish_all(&ctx.machines).await;
            crate::kept::purge_due(&ctx.snapshots).await;
            if let Err(e) = crate::renewal::pass(&ctx.renewer).await {
                tracing::warn!(error = %crate::error_chain(&e), "reconciler: certificate renewal pass failed");
            }
            rotations(&ctx).await;
            sa_rotations(&ctx).await;
            pools(&ctx).await;
            memberships(&ctx).await;
            health(&ctx).await;
            crate::snapshots::schedule::pass(&ctx.snapshots).await;
            crate::restore::pending_pass(&ctx.snapshots, &ctx.membership).await;
            if let Err(e) = ctx.key_pool.refresh(&ctx.db.pool).await {
                tracing::warn!(error = %crate::error_chain(&e), "reconciler: cannot read the key pool's demand");
            }
            prune(&ctx).await;
            tokio::time::sleep(ctx.interval).await;
        }
    })
}
