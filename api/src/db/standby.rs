//! `ca_standby`: the cluster CA made ahead of its next rotation — its certificate, and its key
//! sealed under the KEK (`crate::standby` makes, opens and hands them out).

use sqlx::Row as _;

use super::DbError;

/// A cluster's standby CA as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standby {
    pub cert: String,
    pub key_sealed: String,
}

/// Cluster `cluster_id`'s standby, if it has one.
pub async fn get<'c>(
    db: impl sqlx::Executor<'c, Database = sqlx::Any>,
    cluster_id: i64,
) -> Result<Option<Standby>, DbError> {
    let row = sqlx::query("SELECT cert, key_sealed FROM ca_standby WHERE cluster_id = $1")
        .bind(cluster_id)
        .fetch_optional(db)
        .await?;
    Ok(row
        .map(|r| {
            Ok::<_, sqlx::Error>(Standby {
                cert: r.try_get("cert")?,
                key_sealed: r.try_get("key_sealed")?,
            })
        })
        .transpose()?)
}

/// Records `standby` as cluster `cluster_id`'s (replacing any it had).
pub async fn put<'c>(
    db: impl sqlx::Executor<'c, Database = sqlx::Any>,
    cluster_id: i64,
    standby: &Standby,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO ca_standby (cluster_id, cert, key_sealed, created_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (cluster_id) DO UPDATE SET cert = excluded.cert, \
         key_sealed = excluded.key_sealed, created_at = excluded.created_at",
    )
    .bind(cluster_id)
    .bind(&standby.cert)
    .bind(&standby.key_sealed)
    .bind(now)
    .execute(db)
    .await?;
    Ok(())
}

/// Takes cluster `cluster_id`'s standby away (a rotation made it its new CA); false when it
/// had none.
pub async fn take<'c>(
    db: impl sqlx::Executor<'c, Database = sqlx::Any>,
    cluster_id: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query("DELETE FROM ca_standby WHERE cluster_id = $1")
        .bind(cluster_id)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}
