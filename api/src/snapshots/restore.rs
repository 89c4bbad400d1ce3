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
use exk8s_common::contract::{RestoreStep, RestoreTask, Role};
use futures_util::StreamExt as _;
use sha2::{Digest as _, Sha256};

use super::{SnapshotError, Snapshots};
use crate::db::restores::{MemberRow, NewRestore, RestorePhase, RestoreRow};
use crate::db::snapshots::SnapshotState;
use crate::db::{self, DbError};

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
/// org's founded cluster `source` and its stored snapshot `snapshot_id`, read back intact.
/// The source cluster.
pub async fn check_source(
    ctx: &Snapshots,
    org_id: i64,
    source: i64,
    snapshot_id: i64,
) -> Result<db::clusters::ClusterRow, RestoreError> {
    let cluster = db::clusters::get(&ctx.db.pool, org_id, source)
        .await?
        .ok_or(RestoreError::NotFound)?;
    if cluster.phase != ClusterPhase::Founded {
        return Err(RestoreError::NotFounded {
            id: source,
            phase: cluster.phase,
        });
    }
    let stored = stored(ctx, org_id, source, snapshot_id).await?;
    check_intact(ctx, org_id, source, snapshot_id, &stored.0, stored.1).await?;
    Ok(cluster)
}

/// Starts the restore of a cluster founded from another's snapshot once its control plane is
/// up (every member healthy) and none was started yet; `None` when it is not time.
pub async fn start_pending(
    ctx: &Snapshots,
    cluster_id: i64,
) -> Result<Option<Restore>, RestoreError> {
    let Some((source, snapshot_id)) = db::restores::source_of(&ctx.db.pool, cluster_id).await?
    else {
        return Ok(None);
    };
    if db::restores::latest(&ctx.db.pool, cluster_id)
        .await?
        .is_some()
    {
        return Ok(None);
    }
    let Some(cluster) = db::clusters::get_by_id(&ctx.db.pool, cluster_id).await? else {
        return Ok(None);
    };
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let members: Vec<_> = nodes
        .iter()
        .filter(|n| n.role == Role::ControlPlane)
        .collect();
    if cluster.phase != ClusterPhase::Founded
        || members.is_empty()
        || members.iter().any(|n| !n.phase.healthy())
    {
        return Ok(None);
    }
    match begin(ctx, &cluster, source, snapshot_id).await {
        Ok(started) => Ok(Some(started)),
        // Another API process started it first.
        Err(RestoreError::Db(DbError::Duplicate(_))) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Starts every restore a cluster was founded for whose control plane came up while no report
/// moved it (a crash, a failed start), and replaces the members finished restores left out:
/// the reconciler's part.
pub async fn pending_pass(ctx: &Snapshots, membership: &crate::membership::Membership) {
    match db::restores::latest_done(&ctx.db.pool).await {
        Ok(clusters) => {
            for cluster_id in clusters {
                if let Err(e) = rebuild(ctx, membership, cluster_id).await {
                    tracing::warn!(cluster_id, error = %crate::error_chain(&e), "reconciler: the members a restore left out cannot be replaced");
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "reconciler: cannot list finished restores");
        }
    }
    let pending = match db::restores::pending_sources(&ctx.db.pool).await {
        Ok(pending) => pending,
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "reconciler: cannot list the restores clusters were founded for");
            return;
        }
    };
    for cluster_id in pending {
        if let Err(e) = start_pending(ctx, cluster_id).await {
            tracing::warn!(cluster_id, error = %crate::error_chain(&e), "reconciler: the restore a cluster was founded for cannot start");
        }
    }
}

/// A stored snapshot's digest, size and when it was taken.
async fn stored(
    ctx: &Snapshots,
    org_id: i64,
    cluster_id: i64,
    snapshot_id: i64,
) -> Result<(String, i64, i64), RestoreError> {
    let snapshot = super::get(ctx, org_id, cluster_id, snapshot_id)
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
async fn begin(
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

    let members = live_members(ctx, &nodes).await?;
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

/// The control-plane members whose VM runs: a restore restores onto them alone (the others
/// are rebuilt after it, [`rebuild`]). Refused when none runs.
async fn live_members<'n>(
    ctx: &Snapshots,
    nodes: &'n [db::nodes::NodeRow],
) -> Result<Vec<&'n db::nodes::NodeRow>, RestoreError> {
    let mut live = Vec::new();
    for node in nodes
        .iter()
        .filter(|n| n.role == Role::ControlPlane && n.removal.is_none())
    {
        let vm = ctx
            .compute
            .get_vm(node.vm_id)
            .await
            .map_err(|e| RestoreError::Compute(crate::error_chain(&e)))?;
        match vm {
            Some(vm) if vm.state == "running" => live.push(node),
            other => tracing::warn!(
                cluster_id = node.cluster_id,
                vm_id = node.vm_id,
                state = other.as_ref().map_or("gone", |vm| vm.state.as_str()),
                "a member's VM does not run: the restore leaves it out, and it is replaced after"
            ),
        }
    }
    if live.is_empty() {
        return Err(RestoreError::Conflict(
            "no control-plane member's VM runs: found a new cluster from the snapshot \
             (POST /clusters with restore_from) instead"
                .into(),
        ));
    }
    Ok(live)
}

/// After a restore that left members out (their VMs did not run), replaces them through the
/// membership machinery, one at a time (each removed from the restored etcd, which does not
/// list it, then a new machine joined as a learner and promoted). A change in progress waits
/// for the next call.
pub async fn rebuild(
    ctx: &Snapshots,
    membership: &crate::membership::Membership,
    cluster_id: i64,
) -> Result<(), RestoreError> {
    let Some(latest) = db::restores::latest(&ctx.db.pool, cluster_id).await? else {
        return Ok(());
    };
    if latest.phase != RestorePhase::Done {
        return Ok(());
    }
    let restored: Vec<i64> = db::restores::members(&ctx.db.pool, latest.id)
        .await?
        .into_iter()
        .map(|m| m.node_id)
        .collect();
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let Some(left_out) = nodes.iter().find(|n| {
        n.role == Role::ControlPlane
            && n.removal.is_none()
            && n.replace_since.is_none()
            && n.created_at <= latest.started_at
            && !restored.contains(&n.id)
    }) else {
        return Ok(());
    };
    let Some(cluster) = db::clusters::get_by_id(&ctx.db.pool, cluster_id).await? else {
        return Ok(());
    };
    match crate::membership::replace(membership, cluster.org_id, cluster_id, left_out.vm_id).await {
        Ok(_) => {
            tracing::info!(
                cluster_id,
                vm_id = left_out.vm_id,
                restore_id = latest.id,
                "a member the restore left out is replaced"
            );
            Ok(())
        }
        Err(crate::membership::MembershipError::Conflict(why)) => {
            tracing::info!(cluster_id, vm_id = left_out.vm_id, %why, "a member the restore left out waits to be replaced");
            Ok(())
        }
        Err(e) => Err(RestoreError::Conflict(crate::error_chain(&e))),
    }
}

/// The snapshot member `node_id` of `cluster_id` is asked to restore now, as etcd wrote it:
/// `None` unless a running restore of `snapshot_id` asks it to.
pub async fn member_snapshot(
    ctx: &Snapshots,
    cluster: &db::clusters::ClusterRow,
    node_id: i64,
    snapshot_id: i64,
) -> Result<
    Option<futures_util::stream::BoxStream<'static, Result<bytes::Bytes, SnapshotError>>>,
    RestoreError,
> {
    let asked = task_for(ctx, cluster.id, node_id)
        .await?
        .filter(|t| t.step == RestoreStep::Restore && t.snapshot_id == snapshot_id);
    let Some(task) = asked else {
        return Ok(None);
    };
    let Some(row) = db::restores::running(&ctx.db.pool, cluster.id).await? else {
        return Ok(None);
    };
    tracing::info!(
        cluster_id = cluster.id,
        restore_id = task.id,
        snapshot_id,
        "etcd snapshot sent to a member to restore"
    );
    Ok(Some(
        super::content(ctx, cluster.org_id, row.source_cluster_id, snapshot_id).await?,
    ))
}

fn running_conflict(running: &RestoreRow) -> RestoreError {
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
    if let Some(rotation) = db::rotations::get(&ctx.db.pool, cluster.id).await? {
        return conflict(format!(
            "a rotation of the {} CA is in progress; restore after it",
            db::rotations::ca_name(rotation.ca)
        ));
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
    let mut stream = super::content(ctx, org_id, cluster_id, id).await?;
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

/// The step of a running restore that node `node_id` of `cluster_id` is to do now, if any.
pub async fn task_for(
    ctx: &Snapshots,
    cluster_id: i64,
    node_id: i64,
) -> Result<Option<RestoreTask>, DbError> {
    let Some(row) = db::restores::running(&ctx.db.pool, cluster_id).await? else {
        return Ok(None);
    };
    let members = db::restores::members(&ctx.db.pool, row.id).await?;
    let Some(member) = members.iter().find(|m| m.node_id == node_id) else {
        return Ok(None);
    };
    let step = match row.phase {
        RestorePhase::Stop if member.done < 1 => RestoreStep::Stop,
        RestorePhase::Restore if member.done < 2 => RestoreStep::Restore,
        // One member at a time: the first (by ordinal) not started yet.
        RestorePhase::Start
            if members.iter().find(|m| m.done < 3).map(|m| m.node_id) == Some(node_id) =>
        {
            RestoreStep::Start
        }
        _ => return Ok(None),
    };
    let paths = &crate::render::paths::PATHS;
    Ok(Some(RestoreTask {
        id: row.id,
        step,
        snapshot_id: row.snapshot_id,
        sha256: row.sha256.clone(),
        member_name: member.member_name.clone(),
        peer_url: member.peer_url.clone(),
        initial_cluster: members
            .iter()
            .map(|m| format!("{}={}", m.member_name, m.peer_url))
            .collect::<Vec<_>>()
            .join(","),
        initial_cluster_token: row.token.clone(),
        bump_revision: u64::try_from(row.bump_revision).unwrap_or(u64::MAX),
        data_dir: paths.etcd_data_dir.to_owned(),
        etcdutl: crate::render::plan::ETCDUTL.to_owned(),
        manifests: paths.control_plane_manifests().map(str::to_owned).to_vec(),
    }))
}

/// Node `node_id` of `cluster_id` did (or could not do: `failure`) step `step` of restore
/// `id`. A step already acknowledged is acknowledged again without effect; a step the restore
/// is not at is a conflict. The last member to finish a phase moves the restore on.
pub async fn acknowledge(
    ctx: &Snapshots,
    cluster_id: i64,
    node_id: i64,
    id: i64,
    step: RestoreStep,
    failure: &str,
) -> Result<RestorePhase, RestoreError> {
    let Some(row) = db::restores::latest(&ctx.db.pool, cluster_id)
        .await?
        .filter(|r| r.id == id)
    else {
        return Err(RestoreError::NotFound);
    };
    let members = db::restores::members(&ctx.db.pool, id).await?;
    let member = members
        .iter()
        .find(|m| m.node_id == node_id)
        .ok_or(RestoreError::NotFound)?;
    let phase = phase_of(step);
    if member.done >= phase.level() {
        return Ok(row.phase);
    }
    if row.phase != phase {
        return Err(RestoreError::Conflict(format!(
            "restore {id} is {}, not at its {} step",
            row.phase,
            step.as_str()
        )));
    }
    let now = ctx.clock.unix();
    if !failure.is_empty() {
        let error = format!(
            "{} could not {}: {failure}",
            member.member_name,
            step.as_str()
        );
        db::restores::fail(&ctx.db.pool, id, &error, now).await?;
        tracing::warn!(cluster_id, restore_id = id, %error, "etcd restore failed");
        return Ok(RestorePhase::Failed);
    }
    db::restores::member_done(&ctx.db.pool, id, node_id, phase.level()).await?;
    let members = db::restores::members(&ctx.db.pool, id).await?;
    if members.iter().all(|m| m.done >= phase.level())
        && db::restores::advance(&ctx.db.pool, id, phase, phase.next(), now).await?
    {
        tracing::info!(
            cluster_id,
            restore_id = id,
            phase = %phase.next(),
            "etcd restore moved on"
        );
        return Ok(phase.next());
    }
    tracing::info!(cluster_id, restore_id = id, member = %member.member_name, step = step.as_str(), "etcd restore step done");
    Ok(phase)
}

fn phase_of(step: RestoreStep) -> RestorePhase {
    match step {
        RestoreStep::Stop => RestorePhase::Stop,
        RestoreStep::Restore => RestorePhase::Restore,
        RestoreStep::Start => RestorePhase::Start,
    }
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
