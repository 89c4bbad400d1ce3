//! A member's upload of the snapshot asked of it, streamed into the store: the body is hashed
//! (its declared, signed digest must match), its last 32 bytes must be the SHA-256 of the rest
//! (the checksum etcd appends to every snapshot it streams), and it is sealed chunk by chunk on
//! its way out. Nothing is recorded as stored unless all of that held; a partial object is
//! aborted, never left behind.

use exk8s_common::names::Sha256Digest;
use futures_util::{Stream, StreamExt as _};
use sha2::{Digest as _, Sha256};

use super::{SnapshotError, Snapshots, cipher, cluster_key};
use crate::db::clusters::ClusterRow;
use crate::db::nodes::NodeRow;
use crate::db::snapshots::{SnapshotRow, SnapshotState, Stored};
use crate::db::{self};

/// The largest snapshot taken: etcd's own limit on a member's store is 8 GiB by default.
pub const MAX_SNAPSHOT_BYTES: u64 = 16 << 30;
/// The length of etcd's trailing checksum.
const CHECKSUM: usize = 32;
/// Store parts written at once.
const PARTS_IN_FLIGHT: usize = 4;

/// What the member says with its upload.
#[derive(Debug, Clone)]
pub struct Upload<'a> {
    pub node: &'a NodeRow,
    pub cluster: &'a ClusterRow,
    pub snapshot_id: i64,
    /// The body's SHA-256, as signed.
    pub declared: Sha256Digest,
    pub revision: i64,
    pub etcd_version: String,
    /// The member could not take it, and says why (the body is then empty).
    pub failure: Option<String>,
}

/// Why an upload was refused.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("no snapshot {0} is asked of this node now (never, taken, failed or expired)")]
    NotAsked(i64),
    #[error("the snapshot was refused: {0}")]
    Refused(String),
    #[error("the upload broke off: {0}")]
    BrokenOff(String),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
}

/// SHA-256 of everything but the last [`CHECKSUM`] bytes, and those bytes.
struct Trailer {
    body: Sha256,
    tail: Vec<u8>,
}

impl Trailer {
    fn push(&mut self, data: &[u8]) {
        self.tail.extend_from_slice(data);
        if self.tail.len() > CHECKSUM {
            let settled = self.tail.len() - CHECKSUM;
            self.body.update(&self.tail[..settled]);
            self.tail.drain(..settled);
        }
    }

    fn holds(self) -> bool {
        self.tail.len() == CHECKSUM && self.body.finalize().as_slice() == self.tail.as_slice()
    }
}

/// Takes the upload of `up.snapshot_id` from `body`; the stored row.
pub async fn upload<S, E>(
    ctx: &Snapshots,
    up: Upload<'_>,
    mut body: S,
) -> Result<SnapshotRow, UploadError>
where
    S: Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let cluster_id = up.cluster.id;
    let id = up.snapshot_id;
    let row = db::snapshots::get(&ctx.db.pool, cluster_id, id)
        .await
        .map_err(SnapshotError::from)?
        .filter(|s| {
            s.node_id == up.node.id
                && s.state == SnapshotState::Requested
                && s.not_after >= ctx.clock.unix()
        })
        .ok_or(UploadError::NotAsked(id))?;
    if let Some(reason) = &up.failure {
        let said: String = reason.chars().take(500).collect();
        let error = format!("{} could not take it: {said}", row.member_name);
        tracing::warn!(cluster_id, snapshot_id = id, %error, "etcd snapshot failed");
        db::snapshots::failed(&ctx.db.pool, id, &error, ctx.clock.unix())
            .await
            .map_err(SnapshotError::from)?;
        return Ok(reread(ctx, cluster_id, id).await?);
    }
    let key = cluster_key(ctx, cluster_id).await?;
    let mut attempt = [0u8; 4];
    getrandom::fill(&mut attempt)
        .map_err(|_| SnapshotError::from(crate::crypto::SealError::Random))?;
    let object = ctx.store.key(cluster_id, id, &hex::encode(attempt));
    let mut writer = ctx
        .store
        .writer(&object)
        .await
        .map_err(SnapshotError::from)?;
    let (mut sealer, header) = cipher::Sealer::new(&key, cipher::associated_data(cluster_id, id))
        .map_err(SnapshotError::from)?;
    writer.write(&header);
    let mut whole = Sha256::new();
    let mut trailer = Trailer {
        body: Sha256::new(),
        tail: Vec::with_capacity(2 * CHECKSUM),
    };
    let mut size: u64 = 0;
    let outcome: Result<(), UploadError> = async {
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(|e| UploadError::BrokenOff(e.to_string()))?;
            size += piece.len() as u64;
            if size > MAX_SNAPSHOT_BYTES {
                return Err(UploadError::Refused(format!(
                    "it is larger than {MAX_SNAPSHOT_BYTES} bytes"
                )));
            }
            whole.update(&piece);
            trailer.push(&piece);
            let sealed = sealer.push(&piece).map_err(SnapshotError::from)?;
            writer
                .wait_for_capacity(PARTS_IN_FLIGHT)
                .await
                .map_err(|e| UploadError::BrokenOff(format!("the store: {e}")))?;
            writer.write(&sealed);
        }
        Ok(())
    }
    .await;
    let checked = outcome.and_then(|()| {
        let digest = hex::encode(whole.finalize());
        if digest != up.declared.to_hex() {
            return Err(UploadError::Refused(format!(
                "its SHA-256 is {digest}, not the {} its signature declared",
                up.declared.to_hex()
            )));
        }
        if !trailer.holds() {
            return Err(UploadError::Refused(
                "it is not an etcd snapshot: its last 32 bytes are not the SHA-256 of the rest"
                    .into(),
            ));
        }
        Ok(digest)
    });
    let digest = match checked.and_then(|d| Ok((d, sealer.finish().map_err(SnapshotError::from)?)))
    {
        Ok((digest, last)) => {
            writer.write(&last);
            digest
        }
        Err(e) => {
            let _ = writer.abort().await;
            fail(ctx, id, &e).await;
            return Err(e);
        }
    };
    if let Err(e) = ctx.store.finish(writer).await {
        let e = UploadError::from(SnapshotError::from(e));
        fail(ctx, id, &e).await;
        return Err(e);
    }
    let ca_sha256 = hex::encode(Sha256::digest(
        up.cluster.ca_cert.as_deref().unwrap_or_default().as_bytes(),
    ));
    let stored = Stored {
        taken_at: ctx.clock.unix(),
        revision: up.revision,
        etcd_version: &up.etcd_version,
        size_bytes: i64::try_from(size).unwrap_or(i64::MAX),
        sha256: &digest,
        object_key: &object,
        ca_sha256: &ca_sha256,
    };
    if !db::snapshots::stored(&ctx.db.pool, id, &stored)
        .await
        .map_err(SnapshotError::from)?
    {
        // Expired or deleted while it came in: nothing may keep its object.
        ctx.store
            .delete(&object)
            .await
            .map_err(SnapshotError::from)?;
        return Err(UploadError::NotAsked(id));
    }
    // An upgrade waiting for it goes on.
    db::snapshots::upgrade_snapshot_stored(&ctx.db.pool, cluster_id, id)
        .await
        .map_err(SnapshotError::from)?;
    tracing::info!(
        cluster_id,
        snapshot_id = id,
        size,
        revision = up.revision,
        "etcd snapshot stored"
    );
    Ok(reread(ctx, cluster_id, id).await?)
}

async fn reread(ctx: &Snapshots, cluster_id: i64, id: i64) -> Result<SnapshotRow, SnapshotError> {
    db::snapshots::get(&ctx.db.pool, cluster_id, id)
        .await?
        .ok_or(SnapshotError::NotFound)
}

/// Records the upload's failure on its row (best effort: the row expires otherwise).
async fn fail(ctx: &Snapshots, id: i64, e: &UploadError) {
    let error = crate::error_chain(e);
    tracing::warn!(snapshot_id = id, %error, "etcd snapshot upload refused");
    if let Err(db) = db::snapshots::failed(&ctx.db.pool, id, &error, ctx.clock.unix()).await {
        tracing::warn!(snapshot_id = id, error = %crate::error_chain(&db), "cannot record the snapshot's failure (it expires instead)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trailer_is_the_digest_of_everything_before_it() {
        let body = b"a bolt database, page after page".repeat(100);
        let mut snapshot = body.clone();
        snapshot.extend_from_slice(&Sha256::digest(&body));
        for piece in [1, 7, 32, 33, 4096] {
            let mut trailer = Trailer {
                body: Sha256::new(),
                tail: Vec::new(),
            };
            snapshot.chunks(piece).for_each(|p| trailer.push(p));
            assert!(trailer.holds(), "pieces of {piece}");
        }
        let mut trailer = Trailer {
            body: Sha256::new(),
            tail: Vec::new(),
        };
        trailer.push(&body);
        assert!(!trailer.holds(), "no checksum");
        let mut short = Trailer {
            body: Sha256::new(),
            tail: Vec::new(),
        };
        short.push(&[0; 10]);
        assert!(!short.holds());
    }
}
