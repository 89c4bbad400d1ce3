//! What a cluster's certificates were and the CA rotations it went through, for the timeline
//! of its certificates: `certificate_history` keeps a certificate's life once it ended (a
//! node's generation when the node applied a newer one, a cluster's own certificate when
//! replaced) and `ca_rotation_history` each rotation with when it entered each phase (written
//! by [`super::rotations`] as it moves one). Written in the transaction that ends the life or
//! moves the rotation; the last [`LIVES_KEPT`] lives per node and name and the last
//! [`ROTATIONS_KEPT`] rotations per cluster are kept.

use sqlx::{Any, Executor, Row as _};

use super::DbError;

/// Past lives kept per node (or cluster) and certificate name.
pub const LIVES_KEPT: i64 = 5;
/// Past and current rotations kept per cluster.
pub const ROTATIONS_KEPT: i64 = 10;

const COLUMNS: &str = "generation, name, kind, subject, issuer, serial, not_before, not_after";

/// Keeps the lives of node `node_id`'s certificates of `generation`, which the node no longer
/// runs: it applied a newer one (the rows go at its next issuance, `certificates::supersede`).
/// The latest row per name: a generation's earlier bundles are not lives of their own.
pub(crate) async fn node_lives_ended(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    node_id: i64,
    generation: i64,
    now: i64,
) -> Result<(), DbError> {
    let kept = sqlx::query(&format!(
        "INSERT INTO certificate_history (cluster_id, node_id, {COLUMNS}, superseded_at) \
         SELECT cluster_id, node_id, {COLUMNS}, $4 FROM issued_certificates WHERE id IN ( \
         SELECT max(id) FROM issued_certificates \
         WHERE cluster_id = $1 AND node_id = $2 AND generation = $3 GROUP BY name) ORDER BY id"
    ))
    .bind(cluster_id)
    .bind(node_id)
    .bind(generation)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    if kept.rows_affected() > 0 {
        sqlx::query(&format!(
            "DELETE FROM certificate_history WHERE cluster_id = $1 AND node_id = $2 AND id < ( \
             SELECT h.id FROM certificate_history h WHERE h.cluster_id = $1 AND h.node_id = $2 \
             AND h.name = certificate_history.name ORDER BY h.id DESC LIMIT 1 OFFSET {})",
            LIVES_KEPT - 1
        ))
        .bind(cluster_id)
        .bind(node_id)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// Keeps the life of the cluster's own certificate `name`, about to be replaced.
pub(super) async fn cluster_life_ended(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    name: &str,
    now: i64,
) -> Result<(), DbError> {
    let kept = sqlx::query(&format!(
        "INSERT INTO certificate_history (cluster_id, node_id, {COLUMNS}, superseded_at) \
         SELECT cluster_id, node_id, {COLUMNS}, $3 FROM issued_certificates \
         WHERE cluster_id = $1 AND node_id IS NULL AND name = $2"
    ))
    .bind(cluster_id)
    .bind(name)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    if kept.rows_affected() > 0 {
        sqlx::query(&format!(
            "DELETE FROM certificate_history WHERE cluster_id = $1 AND node_id IS NULL \
             AND name = $2 AND id < ( \
             SELECT h.id FROM certificate_history h WHERE h.cluster_id = $1 \
             AND h.node_id IS NULL AND h.name = $2 ORDER BY h.id DESC LIMIT 1 OFFSET {})",
            LIVES_KEPT - 1
        ))
        .bind(cluster_id)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// A certificate's life that ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PastLife {
    /// The node's VM, or `None` for the cluster's own certificates.
    pub vm_id: Option<i64>,
    pub generation: i64,
    pub name: String,
    pub kind: String,
    pub issuer: String,
    pub serial: String,
    pub not_before: i64,
    pub not_after: i64,
    /// When the life ended: its successor applied or put in its place.
    pub superseded_at: i64,
}

/// The cluster's kept past lives, oldest first.
pub async fn lives<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Vec<PastLife>, DbError> {
    let rows = sqlx::query(
        "SELECT n.vm_id, h.generation, h.name, h.kind, h.issuer, h.serial, h.not_before, \
         h.not_after, h.superseded_at FROM certificate_history h \
         LEFT JOIN cluster_nodes n ON n.id = h.node_id WHERE h.cluster_id = $1 ORDER BY h.id",
    )
    .bind(cluster_id)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(PastLife {
                vm_id: r.try_get("vm_id")?,
                generation: r.try_get("generation")?,
                name: r.try_get("name")?,
                kind: r.try_get("kind")?,
                issuer: r.try_get("issuer")?,
                serial: r.try_get("serial")?,
                not_before: r.try_get("not_before")?,
                not_after: r.try_get("not_after")?,
                superseded_at: r.try_get("superseded_at")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(DbError::from)
}

/// A CA rotation as kept: when it started, entered sign-new and drop-old, and ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PastRotation {
    /// `cluster`, `etcd` or `front_proxy` (the API's names).
    pub ca: String,
    pub started_at: i64,
    pub sign_new_at: Option<i64>,
    pub drop_old_at: Option<i64>,
    pub finished_at: Option<i64>,
}

/// The cluster's kept rotations, newest first.
pub async fn rotations<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Vec<PastRotation>, DbError> {
    let rows = sqlx::query(
        "SELECT ca, started_at, sign_new_at, drop_old_at, finished_at FROM ca_rotation_history \
         WHERE cluster_id = $1 ORDER BY id DESC",
    )
    .bind(cluster_id)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(PastRotation {
                ca: r.try_get("ca")?,
                started_at: r.try_get("started_at")?,
                sign_new_at: r.try_get("sign_new_at")?,
                drop_old_at: r.try_get("drop_old_at")?,
                finished_at: r.try_get("finished_at")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(DbError::from)
}
