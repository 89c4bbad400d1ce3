//! An org's own settings where it differs from the API's (migration 0034): today how long its
//! deleted clusters are kept (`exk8s-api orgs`).

use sqlx::Row as _;

use super::DbError;

/// One org's settings; `None` is the API's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrgSettings {
    pub org_id: i64,
    pub keep_deleted_days: Option<u32>,
    pub updated_at: i64,
}

fn from_row(r: &sqlx::any::AnyRow) -> Result<OrgSettings, sqlx::Error> {
    let days: Option<i64> = r.try_get("keep_deleted_days")?;
    Ok(OrgSettings {
        org_id: r.try_get("org_id")?,
        // The column's CHECK bounds it to 0..=3650.
        keep_deleted_days: days.and_then(|d| u32::try_from(d).ok()),
        updated_at: r.try_get("updated_at")?,
    })
}

/// Every org with settings of its own, by id.
pub async fn list(db: &sqlx::AnyPool) -> Result<Vec<OrgSettings>, DbError> {
    let rows = sqlx::query(
        "SELECT org_id, CAST(keep_deleted_days AS BIGINT) AS keep_deleted_days, updated_at \
         FROM org_settings ORDER BY org_id",
    )
    .fetch_all(db)
    .await?;
    Ok(rows.iter().map(from_row).collect::<Result<_, _>>()?)
}

/// Sets how long org `org_id`'s deleted clusters are kept.
pub async fn set_keep_deleted_days(
    db: &sqlx::AnyPool,
    org_id: i64,
    days: u32,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO org_settings (org_id, keep_deleted_days, updated_at) VALUES ($1, $2, $3) \
         ON CONFLICT (org_id) DO UPDATE SET keep_deleted_days = excluded.keep_deleted_days, \
         updated_at = excluded.updated_at",
    )
    .bind(org_id)
    .bind(i64::from(days))
    .bind(now)
    .execute(db)
    .await?;
    Ok(())
}

/// Forgets org `org_id`'s settings: the API's hold again. False when it had none.
pub async fn reset(db: &sqlx::AnyPool, org_id: i64) -> Result<bool, DbError> {
    let done = sqlx::query("DELETE FROM org_settings WHERE org_id = $1")
        .bind(org_id)
        .execute(db)
        .await?;
    Ok(done.rows_affected() > 0)
}

/// The days cluster `cluster_id`'s org keeps its deleted clusters, where it set its own.
pub async fn keep_deleted_days_of_cluster(
    db: &sqlx::AnyPool,
    cluster_id: i64,
) -> Result<Option<u32>, DbError> {
    let days: Option<Option<i64>> = sqlx::query_scalar(
        "SELECT CAST(o.keep_deleted_days AS BIGINT) FROM clusters c \
         JOIN org_settings o ON o.org_id = c.org_id WHERE c.id = $1",
    )
    .bind(cluster_id)
    .fetch_optional(db)
    .await?;
    Ok(days.flatten().and_then(|d| u32::try_from(d).ok()))
}
