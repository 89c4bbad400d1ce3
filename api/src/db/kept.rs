//! Deleted clusters kept for recovery (migration 0033): a delete ends by turning the cluster's
//! row `deleted` with a `kept_until`, keeping what `restore_from` needs — the row's sealed trust,
//! its CA standby, its service-account key rotation, its stored snapshots — and its history
//! (events, ended CA rotations, what it was restored from); everything else of it goes at once.
//! The purge deletes the row, and with it (`ON DELETE CASCADE`) all that was kept.

use sqlx::{Any, Executor, Row as _};

use super::DbError;

/// The tables referring to `clusters` whose rows a kept cluster keeps (snapshots: the stored ones).
pub const KEPT: [&str; 6] = [
    "snapshots",
    "sa_key_rotations",
    "ca_standby",
    "cluster_events",
    "restore_sources",
    "ca_rotation_history",
];

/// The tables referring to `clusters` whose rows go with the delete (with them, by cascade, every
/// table referring to a node, a pool or a restore).
pub const GONE: [&str; 7] = [
    "restores",
    "remediations",
    "ca_rotations",
    "issued_certificates",
    "certificate_history",
    "cluster_nodes",
    "node_pools",
];

/// A kept cluster and what it keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptRow {
    pub id: i64,
    pub name: String,
    pub kubernetes_version: String,
    pub deleted_at: i64,
    pub kept_until: i64,
    /// Its stored snapshots: how many, and their bytes.
    pub snapshots: i64,
    pub snapshot_bytes: i64,
}

const COLUMNS: &str = "c.id, c.name, c.kubernetes_version, c.deleted_at, c.kept_until, \
    (SELECT COUNT(*) FROM snapshots s WHERE s.cluster_id = c.id) AS snapshots, \
    (SELECT CAST(COALESCE(SUM(s.size_bytes), 0) AS BIGINT) FROM snapshots s \
     WHERE s.cluster_id = c.id) AS bytes";

fn from_row(r: &sqlx::any::AnyRow) -> Result<KeptRow, sqlx::Error> {
    Ok(KeptRow {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        kubernetes_version: r.try_get("kubernetes_version")?,
        deleted_at: r.try_get("deleted_at")?,
        kept_until: r.try_get("kept_until")?,
        snapshots: r.try_get("snapshots")?,
        snapshot_bytes: r.try_get("bytes")?,
    })
}

/// Ends cluster `id`'s delete: every row of [`GONE`] and every snapshot not stored deleted, the
/// cluster `deleted`, kept until `kept_until`. One transaction: a crash leaves it `deleting`.
pub async fn keep(db: &super::Db, id: i64, now: i64, kept_until: i64) -> Result<(), DbError> {
    let mut tx = db.begin().await?;
    for table in GONE {
        sqlx::query(&format!("DELETE FROM {table} WHERE cluster_id = $1"))
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query("DELETE FROM snapshots WHERE cluster_id = $1 AND state <> 'stored'")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "UPDATE clusters SET phase = 'deleted', deleted_at = $1, kept_until = $2, \
         updated_at = $1, security_group_id = NULL, upgrade_snapshot_id = NULL \
         WHERE id = $3 AND phase = 'deleting'",
    )
    .bind(now)
    .bind(kept_until)
    .bind(id)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The org's kept clusters, the soonest purged first.
pub async fn list<'c>(
    db: impl Executor<'c, Database = Any>,
    org_id: i64,
) -> Result<Vec<KeptRow>, DbError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM clusters c WHERE c.org_id = $1 AND c.phase = 'deleted' \
         ORDER BY c.kept_until, c.id"
    ))
    .bind(org_id)
    .fetch_all(db)
    .await?;
    Ok(rows.iter().map(from_row).collect::<Result<_, _>>()?)
}

/// The org's kept cluster `id`; another org's, or one not deleted, is not found.
pub async fn get<'c>(
    db: impl Executor<'c, Database = Any>,
    org_id: i64,
    id: i64,
) -> Result<Option<KeptRow>, DbError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM clusters c WHERE c.id = $1 AND c.org_id = $2 \
         AND c.phase = 'deleted'"
    ))
    .bind(id)
    .bind(org_id)
    .fetch_optional(db)
    .await?;
    Ok(row.as_ref().map(from_row).transpose()?)
}

/// Kept clusters whose time is up at `now`.
pub async fn due<'c>(db: impl Executor<'c, Database = Any>, now: i64) -> Result<Vec<i64>, DbError> {
    let ids = sqlx::query_scalar(
        "SELECT id FROM clusters WHERE phase = 'deleted' AND kept_until <= $1 ORDER BY id",
    )
    .bind(now)
    .fetch_all(db)
    .await?;
    Ok(ids)
}

/// A cluster being restored from kept cluster `id`: one founded from it (`restore_from`), not
/// failed or deleted, whose restore from it has not yet ended `done`.
pub async fn restoring_from<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
) -> Result<Option<i64>, DbError> {
    let found = sqlx::query_scalar(
        "SELECT rs.cluster_id FROM restore_sources rs JOIN clusters c ON c.id = rs.cluster_id \
         WHERE rs.source_cluster_id = $1 AND c.phase NOT IN ('failed', 'deleted') \
           AND NOT EXISTS (SELECT 1 FROM restores r WHERE r.cluster_id = rs.cluster_id \
                           AND r.source_cluster_id = $1 AND r.phase = 'done') \
         ORDER BY rs.cluster_id LIMIT 1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?;
    Ok(found)
}

/// The object keys of kept cluster `id`'s snapshots (what the purge deletes from the store first).
pub async fn object_keys<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
) -> Result<Vec<String>, DbError> {
    let keys = sqlx::query_scalar(
        "SELECT object_key FROM snapshots WHERE cluster_id = $1 AND object_key IS NOT NULL \
         ORDER BY id",
    )
    .bind(id)
    .fetch_all(db)
    .await?;
    Ok(keys)
}

/// Deletes kept cluster `id`'s row and, by cascade, all it kept. Whether there was one.
pub async fn purge<'c>(db: impl Executor<'c, Database = Any>, id: i64) -> Result<bool, DbError> {
    let done = sqlx::query("DELETE FROM clusters WHERE id = $1 AND phase = 'deleted'")
        .bind(id)
        .execute(db)
        .await?;
    Ok(done.rows_affected() > 0)
}
