//! Restoring a cluster's etcd in place from one of its stored snapshots, as etcd's recovery
//! guide asks: a new logical cluster, every member from the same snapshot with a new cluster
//! token and the full initial cluster, its revision bumped and what came before marked
//! compacted (so every watch and informer cache from before ends with "too old resource
//! version" instead of silently going back in time).
//!
//! The API never dials into the cluster: each member's agent learns its next step from its
//! generation check and acknowledges it (`PUT /nodes/{vm}/restores/{id}`). The phases, each
//! journaled (`restores`, `restore_members`) so a restarted API goes on where it was:
//!
//! 1. `stop`: every member puts its control-plane static pods aside and stops etcd;
//! 2. `restore`: once all stopped, every member fetches the snapshot (node-signed, decrypted
//!    by the API), checks its digest, restores it into a fresh data directory (the old one kept
//!    aside) and starts etcd;
//! 3. `start`: once all restored, one member at a time waits for etcd, puts its static pods
//!    back and waits for its apiserver;
//! 4. `done`. A member that cannot do a step fails the restore, saying which and why.
//!
//! Before anything stops, the API reads the whole stored object back, decrypting and hashing
//! it: a changed or truncated snapshot is refused while the cluster still runs.

use exk8s_api_types::phase::{ClusterPhase, EtcdMembership};
use exk8s_common::contract::Role;
use futures_util::StreamExt as _;
use sha2::{Digest as _, Sha256};

mod members;
mod steps;

pub use members::{pending_pass, rebuild, start_pending};
pub use steps::{acknowledge, member_snapshot, task_for};

use crate::db::restores::{MemberRow, NewRestore, RestoreRow};
use crate::db::snapshots::SnapshotState;
use crate::db::{self, DbError};
use crate::snapshots::{self, SnapshotError, Snapshots};

/// Revisions added per second of a snapshot's age, beyond the one it holds: a generous bound
/// on the writes a cluster made since (Kubernetes' own busiest clusters stay far below), so the
/// restored revision is above any a client saw.
const REVISIONS_PER_SECOND: i64 = 10_000;
/// The least bump, and the margin of age added (an hour).
const MIN_BUMP: i64 = 1_000_000;
const AGE_MARGIN_SECS: i64 = 3_600;

/// Why a restore was refused or could not move on.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("not found")]
    NotFound,
    #[error("cluster {id} is {phase}, not founded: it has no etcd to restore")]
    NotFounded { id: i64, phase: ClusterPhase },
    #[error("snapshot {id} is {state}, not stored: it cannot be restored")]
    NotStored { id: i64, state: &'static str },
    /// The stored object does not read back as what the member uploaded.
    #[error(
        "snapshot {id} does not read back as it was stored ({why}); nothing was stopped — \
         restore another snapshot"
    )]
    Damaged { id: i64, why: String },
    /// Another change runs, or this restore's state refuses the call.
    #[error("{0}")]
    Conflict(String),
    /// The compute API could not say which members' VMs run.
    #[error("the compute API: {0}")]
    Compute(String),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// A restore and its members.
#[derive(Debug, Clone)]
pub struct Restore {
    pub row: RestoreRow,
    pub members: Vec<MemberRow>,
}

/// How much a snapshot taken at `taken_at` is bumped by when restored at `now`.
pub fn bump_for(taken_at: i64, now: i64) -> i64 {
    let age = (now - taken_at).max(0);
    age.saturating_add(AGE_MARGIN_SECS)
        .saturating_mul(REVISIONS_PER_SECOND)
        .max(MIN_BUMP)
}

/// Starts restoring `org_id`'s cluster `cluster_id` from its snapshot `snapshot_id` (or from
/// the snapshot it was founded from): refused while another change runs or when the snapshot
/// does not read back intact.
pub async fn start(
    ctx: &Snapshots,
    org_id: i64,
    cluster_id: i64,
    snapshot_id: i64,
) -> Result<Restore, RestoreError> {
    let cluster = db::clusters::get(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(RestoreError::NotFound)?;
    let source = match db::restores::source_of(&ctx.db.pool, cluster_id).await? {
        Some((source, snapshot)) if snapshot == snapshot_id => source,
        _ => cluster_id,
    };
    begin(ctx, &cluster, source, snapshot_id).await
}

/// What `POST /clusters` with `restore_from` names, checked before anything is made: the
/// org's founded cluster `source` (or a deleted one it keeps: [`crate::kept`]), not between
/// service-account keys
/// ([`crate::sa_rotation::not_carried_whole`]), and its stored snapshot `snapshot_id`, read
/// back intact. The source cluster.
pub async fn check_source(
    ctx: &Snapshots,
    org_id: i64,
    source: i64,
    snapshot_id: i64,
) -> Result<db::clusters::ClusterRow, RestoreError> {
    let cluster = db::clusters::get_or_kept(&ctx.db.pool, org_id, source)
        .await?
        .ok_or(RestoreError::NotFound)?;
    if !matches!(cluster.phase, ClusterPhase::Founded | ClusterPhase::Deleted) {
        return Err(RestoreError::NotFounded {
            id: source,
            phase: cluster.phase,
        });
    }
    let rotation = db::sa_rotations::get(&ctx.db.pool, source).await?;
    if let Some(why) = crate::sa_rotation::not_carried_whole(source, rotation.as_ref()) {
        return Err(RestoreError::Conflict(why));
    }
    let stored = stored(ctx, org_id, source, snapshot_id).await?;
    check_intact(ctx, org_id, source, snapshot_id, &stored.0, stored.1).await?;
    Ok(cluster)
}

/// A stored snapshot's digest, size and when it was taken.
pub(super) async fn stored(
    ctx: &Snapshots,
    org_id: i64,
    cluster_id: i64,
    snapshot_id: i64,
) -> Result<(String, i64, i64), RestoreError> {
    let snapshot = snapshots::get(ctx, org_id, cluster_id, snapshot_id)
        .await
        .map_err(|e| match e {
            SnapshotError::NotFound => RestoreError::NotFound,
            e => e.into(),
        })?;
    match (
        snapshot.state,
        snapshot.sha256,
        snapshot.size_bytes,
        snapshot.taken_at,
    ) {
        (SnapshotState::Stored, Some(sha256), Some(size), Some(taken_at)) => {
            Ok((sha256, size, taken_at))
        }
        (state, ..) => Err(RestoreError::NotStored {
            id: snapshot_id,
            state: state.as_str(),
        }),
    }
}

/// Starts restoring founded `cluster` from snapshot `snapshot_id` of cluster `source`.
pub(super) async fn begin(
    ctx: &Snapshots,
    cluster: &db::clusters::ClusterRow,
    source: i64,
    snapshot_id: i64,
) -> Result<Restore, RestoreError> {
    let cluster_id = cluster.id;
    if cluster.phase != ClusterPhase::Founded {
        return Err(RestoreError::NotFounded {
            id: cluster_id,
            phase: cluster.phase,
        });
    }
    let (sha256, size, taken_at) = stored(ctx, cluster.org_id, source, snapshot_id).await?;
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    refuse_other_changes(ctx, cluster, &nodes).await?;
    check_intact(ctx, cluster.org_id, source, snapshot_id, &sha256, size).await?;

    let members = members::live_members(ctx, &nodes).await?;
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|_| {
        RestoreError::Conflict("the operating system's random source failed".into())
    })?;
    let token = format!("exk8s-{cluster_id}-restore-{}", hex::encode(nonce));
    let now = ctx.clock.unix();
    let new = NewRestore {
        cluster_id,
        source_cluster_id: source,
        snapshot_id,
        sha256: &sha256,
        token: &token,
        bump_revision: bump_for(taken_at, now),
        now,
        members: members
            .iter()
            .map(|n| {
                let peer = format!("https://{}:2380", n.private_ipv4);
                (n.id, n.ordinal, n.node_name.as_str(), peer)
            })
            .collect(),
    };
    let mut tx = ctx.db.begin().await?;
    if let Some(running) = db::restores::running(&mut *tx, cluster_id).await? {
        return Err(running_conflict(&running));
    }
    let id = db::restores::insert(&mut tx, &new).await?;
    tx.commit().await?;
    tracing::info!(
        cluster_id,
        restore_id = id,
        source_cluster_id = source,
        snapshot_id,
        members = members.len(),
        "etcd restore started: every member stops first"
    );
    get(ctx, cluster_id, id).await
}

pub(super) fn running_conflict(running: &RestoreRow) -> RestoreError {
    RestoreError::Conflict(format!(
        "restore {} (of snapshot {}) is in its {} phase; wait for it to end",
        running.id, running.snapshot_id, running.phase
    ))
}

/// A restore of `cluster_id` and its members.
async fn get(ctx: &Snapshots, cluster_id: i64, id: i64) -> Result<Restore, RestoreError> {
    let row = db::restores::latest(&ctx.db.pool, cluster_id)
        .await?
        .filter(|r| r.id == id)
        .ok_or(RestoreError::NotFound)?;
    let members = db::restores::members(&ctx.db.pool, id).await?;
    Ok(Restore { row, members })
}

/// The cluster's latest restore, if any.
pub async fn latest(ctx: &Snapshots, cluster_id: i64) -> Result<Option<Restore>, DbError> {
    let Some(row) = db::restores::latest(&ctx.db.pool, cluster_id).await? else {
        return Ok(None);
    };
    let members = db::restores::members(&ctx.db.pool, row.id).await?;
    Ok(Some(Restore { row, members }))
}

/// Refuses while a CA rotation, a membership change, an upgrade or another restore runs.
async fn refuse_other_changes(
    ctx: &Snapshots,
    cluster: &db::clusters::ClusterRow,
    nodes: &[db::nodes::NodeRow],
) -> Result<(), RestoreError> {
    let conflict = |what: String| Err(RestoreError::Conflict(what));
    if let Some(running) = db::restores::running(&ctx.db.pool, cluster.id).await? {
        return Err(running_conflict(&running));
    }
    if let Some(why) = db::rotations::refusal(&ctx.db.pool, cluster.id, "restore after it").await? {
        return conflict(why);
    }
    let control_plane: Vec<_> = nodes
        .iter()
        .filter(|n| n.role == Role::ControlPlane)
        .collect();
    if control_plane.is_empty() {
        return conflict(format!(
            "cluster {} has no control-plane member",
            cluster.id
        ));
    }
    if let Some(changing) = control_plane.iter().find(|n| {
        n.etcd_membership != Some(EtcdMembership::Voter)
            || n.replace_since.is_some()
            || n.removal.is_some()
    }) {
        return conflict(format!(
            "a membership change is in progress ({} is not a settled voter); restore after it",
            changing.node_name
        ));
    }
    if let Some(upgrading) = control_plane
        .iter()
        .find(|n| n.handed_version.as_deref() != Some(cluster.kubernetes_version.as_str()))
    {
        return conflict(format!(
            "an upgrade to {} is in progress ({} was handed {}); restore after it",
            cluster.kubernetes_version,
            upgrading.node_name,
            upgrading.handed_version.as_deref().unwrap_or("nothing yet")
        ));
    }
    Ok(())
}

/// Reads the stored object back whole — decrypted, its digest and size — before anything stops.
async fn check_intact(
    ctx: &Snapshots,
    org_id: i64,
    cluster_id: i64,
    id: i64,
    sha256: &str,
    size: i64,
) -> Result<(), RestoreError> {
    let damaged = |why: String| RestoreError::Damaged { id, why };
    let mut stream = snapshots::content(ctx, org_id, cluster_id, id).await?;
    let mut hasher = Sha256::new();
    let mut read: u64 = 0;
    while let Some(piece) = stream.next().await {
        let piece = piece.map_err(|e| damaged(crate::error_chain(&e)))?;
        read += piece.len() as u64;
        hasher.update(&piece);
    }
    if i64::try_from(read).ok() != Some(size) {
        return Err(damaged(format!("{read} bytes, {size} recorded")));
    }
    let digest = hex::encode(hasher.finalize());
    if digest != sha256 {
        return Err(damaged(format!("SHA-256 {digest}, {sha256} recorded")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bump_grows_with_the_snapshots_age() {
        assert_eq!(bump_for(100, 100), AGE_MARGIN_SECS * REVISIONS_PER_SECOND);
        assert_eq!(
            bump_for(0, 12 * 3600),
            (12 * 3600 + AGE_MARGIN_SECS) * REVISIONS_PER_SECOND
        );
        // A clock behind the snapshot is not a negative age.
        assert_eq!(bump_for(500, 100), bump_for(100, 100));
        assert!(bump_for(0, i64::MAX) > 0);
    }
}
