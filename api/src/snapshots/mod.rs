//! etcd snapshots. The API never dials into a cluster: a snapshot is asked of one healthy voter
//! (`POST /clusters/{id}/snapshots`), whose agent learns of it from its next generation check
//! (`GET /nodes/{vm}/generation` names the task — no new generation, so nothing restarts),
//! streams the snapshot from its own etcd member, checks etcd's trailing checksum, and `PUT`s it
//! to `/nodes/{vm}/snapshots/{id}` before the task's deadline: an upload only that node may
//! make, only for that snapshot, signed with its node key over the body's declared digest. The
//! node holds no storage credentials. On its way to the store the API checks the body against
//! its signed digest and etcd's checksum and seals it under the cluster's snapshot key
//! ([`cipher`]; the key itself sealed by the KEK, made at the first snapshot): the store only
//! ever holds ciphertext, and an object that does not verify is never recorded as stored.

pub mod cipher;
pub mod schedule;
mod upload;

use std::sync::Arc;

use exk8s_api_types::phase::{ClusterPhase, EtcdMembership};
use exk8s_common::contract::Role;
use zeroize::Zeroizing;

use crate::crypto::{Keyring, SealError};
use crate::db::snapshots::{NewSnapshot, SnapshotRow, SnapshotState, Trigger};
use crate::db::{self, Db, DbError};
use crate::trust::cluster_aad;

pub use crate::snapshot_store::{Location, Store, StoreError};
pub use upload::{MAX_SNAPSHOT_BYTES, Upload, UploadError, upload};

/// How long a member has to take and upload a snapshot asked of it: two of its sync timer's
/// intervals (5 minutes, up to 2 more of random delay) and the upload.
pub const UPLOAD_WINDOW_SECS: i64 = 20 * 60;

/// What the snapshot calls use.
#[derive(Debug, Clone)]
pub struct Snapshots {
    pub db: Db,
    pub keks: Arc<Keyring>,
    pub store: Store,
    pub clock: Arc<dyn crate::clock::Clock>,
    /// Whether a member's VM still runs (a restore leaves out the ones that do not).
    pub compute: Arc<dyn crate::compute::Compute>,
}

/// Why a snapshot call was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("not found")]
    NotFound,
    #[error("cluster {id} is {phase}, not founded: it has no etcd to snapshot yet")]
    NotFounded { id: i64, phase: ClusterPhase },
    #[error(
        "snapshot {id} is being taken by {member} (until {not_after}); ask again once it is \
         stored or has failed"
    )]
    InProgress {
        id: i64,
        member: String,
        not_after: i64,
    },
    #[error(
        "no etcd voter of cluster {0} is healthy and reachable by its agent (a booted \
         control-plane node whose last report succeeded): nothing can take a snapshot now"
    )]
    NoVoter(i64),
    #[error("{0}")]
    BadSchedule(String),
    #[error("{0}")]
    Restoring(String),
    #[error("snapshot {id} is {state}, not stored: there is nothing to read")]
    NotStored { id: i64, state: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Cipher(#[from] cipher::CipherError),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error(transparent)]
    Db(#[from] DbError),
}

async fn founded(
    ctx: &Snapshots,
    org_id: i64,
    cluster_id: i64,
) -> Result<db::clusters::ClusterRow, SnapshotError> {
    let cluster = db::clusters::get(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(SnapshotError::NotFound)?;
    if cluster.phase != ClusterPhase::Founded {
        return Err(SnapshotError::NotFounded {
            id: cluster_id,
            phase: cluster.phase,
        });
    }
    Ok(cluster)
}

/// The voter that takes a cluster's snapshot: a booted control-plane node whose last report
/// succeeded, that is not leaving, and whose agent syncs (it has a node key); the oldest.
pub(crate) fn taker(nodes: &[db::nodes::NodeRow]) -> Option<&db::nodes::NodeRow> {
    nodes.iter().find(|n| {
        n.role == Role::ControlPlane
            && n.etcd_membership == Some(EtcdMembership::Voter)
            && n.removal.is_none()
            && n.node_key.is_some()
            && n.phase.healthy()
    })
}

/// Asks a voter of `org_id`'s cluster `cluster_id` for a snapshot now.
pub async fn request(
    ctx: &Snapshots,
    org_id: i64,
    cluster_id: i64,
    trigger: Trigger,
) -> Result<SnapshotRow, SnapshotError> {
    founded(ctx, org_id, cluster_id).await?;
    request_of(ctx, cluster_id, trigger).await
}

/// Asks a voter of founded cluster `cluster_id` for a snapshot now.
async fn request_of(
    ctx: &Snapshots,
    cluster_id: i64,
    trigger: Trigger,
) -> Result<SnapshotRow, SnapshotError> {
    if let Some(why) =
        db::restores::refusal(&ctx.db.pool, cluster_id, "take a snapshot after it").await?
    {
        return Err(SnapshotError::Restoring(why));
    }
    let now = ctx.clock.unix();
    db::snapshots::expire(&ctx.db.pool, cluster_id, now).await?;
    if let Some(taking) = db::snapshots::list(&ctx.db.pool, cluster_id)
        .await?
        .into_iter()
        .find(|s| s.state == SnapshotState::Requested)
    {
        return Err(SnapshotError::InProgress {
            id: taking.id,
            member: taking.member_name,
            not_after: taking.not_after,
        });
    }
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let node = taker(&nodes).ok_or(SnapshotError::NoVoter(cluster_id))?;
    let row = db::snapshots::insert(
        &ctx.db.pool,
        &NewSnapshot {
            cluster_id,
            trigger,
            node_id: node.id,
            member_name: &node.node_name,
            requested_at: now,
            not_after: now + UPLOAD_WINDOW_SECS,
        },
    )
    .await?;
    tracing::info!(
        cluster_id,
        snapshot_id = row.id,
        member = %row.member_name,
        trigger = trigger.as_str(),
        "etcd snapshot asked of a voter"
    );
    Ok(row)
}

/// The cluster's snapshots, newest first (those whose member missed its deadline failed); a
/// deleted cluster's are those it keeps ([`crate::kept`]).
pub async fn list(
    ctx: &Snapshots,
    org_id: i64,
    cluster_id: i64,
) -> Result<Vec<SnapshotRow>, SnapshotError> {
    db::clusters::get_or_kept(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(SnapshotError::NotFound)?;
    db::snapshots::expire(&ctx.db.pool, cluster_id, ctx.clock.unix()).await?;
    Ok(db::snapshots::list(&ctx.db.pool, cluster_id).await?)
}

/// One snapshot.
pub async fn get(
    ctx: &Snapshots,
    org_id: i64,
    cluster_id: i64,
    id: i64,
) -> Result<SnapshotRow, SnapshotError> {
    list(ctx, org_id, cluster_id)
        .await?
        .into_iter()
        .find(|s| s.id == id)
        .ok_or(SnapshotError::NotFound)
}

/// Deletes a snapshot: its object, then its row. A snapshot being taken is failed first, so
/// its upload is refused.
pub async fn delete(
    ctx: &Snapshots,
    org_id: i64,
    cluster_id: i64,
    id: i64,
) -> Result<(), SnapshotError> {
    let row = get(ctx, org_id, cluster_id, id).await?;
    if row.state == SnapshotState::Requested {
        db::snapshots::failed(
            &ctx.db.pool,
            id,
            "deleted before it was taken",
            ctx.clock.unix(),
        )
        .await?;
    }
    if let Some(key) = &row.object_key {
        ctx.store.delete(key).await?;
    }
    db::snapshots::delete(&ctx.db.pool, id).await?;
    tracing::info!(cluster_id, snapshot_id = id, "etcd snapshot deleted");
    Ok(())
}

/// The snapshot node `node_id` is asked to take now, if any.
pub async fn asked_of(
    ctx: &Snapshots,
    node_id: i64,
) -> Result<Option<exk8s_common::contract::SnapshotTask>, DbError> {
    Ok(
        db::snapshots::asked_of(&ctx.db.pool, node_id, ctx.clock.unix())
            .await?
            .map(|s| exk8s_common::contract::SnapshotTask {
                id: s.id,
                not_after: s.not_after,
            }),
    )
}

/// The cluster's snapshot key, made (and sealed by the KEK) at its first use.
async fn cluster_key(
    ctx: &Snapshots,
    cluster_id: i64,
) -> Result<Zeroizing<[u8; 32]>, SnapshotError> {
    let aad = cluster_aad(cluster_id, "snapshot_key");
    if db::snapshots::key(&ctx.db.pool, cluster_id)
        .await?
        .is_none()
    {
        let mut fresh = Zeroizing::new([0u8; 32]);
        getrandom::fill(fresh.as_mut()).map_err(|_| SealError::Random)?;
        let sealed = ctx.keks.seal(&aad, fresh.as_ref())?;
        db::snapshots::set_key_once(&ctx.db.pool, cluster_id, &sealed).await?;
    }
    // Whichever first snapshot's key won.
    let sealed = db::snapshots::key(&ctx.db.pool, cluster_id)
        .await?
        .ok_or(SnapshotError::NotFound)?;
    let opened = ctx.keks.open(&aad, &sealed)?;
    let key: [u8; 32] = opened
        .as_slice()
        .try_into()
        .map_err(|_| SealError::Open(aad))?;
    Ok(Zeroizing::new(key))
}

/// A stored snapshot's bytes as etcd wrote them, opened piece by piece as the store yields
/// them: for disaster recovery outside exk8s (`etcdutl snapshot restore`). An object that was
/// changed or truncated ends the stream with an error before its last piece.
pub async fn content(
    ctx: &Snapshots,
    org_id: i64,
    cluster_id: i64,
    id: i64,
) -> Result<
    futures_util::stream::BoxStream<'static, Result<bytes::Bytes, SnapshotError>>,
    SnapshotError,
> {
    use futures_util::StreamExt as _;
    let row = get(ctx, org_id, cluster_id, id).await?;
    let Some(object) = row
        .object_key
        .filter(|_| row.state == SnapshotState::Stored)
    else {
        return Err(SnapshotError::NotStored {
            id,
            state: row.state.as_str(),
        });
    };
    let key = cluster_key(ctx, cluster_id).await?;
    let sealed = ctx.store.read(&object).await?;
    let opener = cipher::Opener::new(&key, cipher::associated_data(cluster_id, id));
    let state = (sealed, Some(opener));
    Ok(
        futures_util::stream::unfold(state, |(mut sealed, opener)| async move {
            let mut opener = opener?;
            match sealed.next().await {
                Some(Ok(piece)) => {
                    let out = opener
                        .push(&piece)
                        .map(|b| bytes::Bytes::copy_from_slice(&b))
                        .map_err(SnapshotError::from);
                    let keep = out.is_ok().then_some(opener);
                    Some((out, (sealed, keep)))
                }
                Some(Err(e)) => Some((Err(e.into()), (sealed, None))),
                None => {
                    let last = opener
                        .finish()
                        .map(|b| bytes::Bytes::copy_from_slice(&b))
                        .map_err(SnapshotError::from);
                    Some((last, (sealed, None)))
                }
            }
        })
        .boxed(),
    )
}
