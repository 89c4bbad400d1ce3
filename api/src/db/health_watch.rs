//! `health_watch`: when the health passes last ran (any replica's), so that a pass resuming
//! after a gap — every API replica away, or paused — starts every node's silence from the
//! moment the API could hear polls again (`cluster_nodes.silence_counts_from`), as Cluster
//! API's machine health checks time a condition from when the controller saw it.

use sqlx::Row as _;

use super::DbError;

/// Records a pass at `now`. When the last one ran more than `gap` seconds before (or never),
/// the watch resumes: every node's silence counts from `now`. Returns whether it resumed.
pub async fn pass_at(db: &super::Db, now: i64, gap: i64) -> Result<bool, DbError> {
    let mut tx = db.begin().await?;
    let last: Option<i64> = sqlx::query("SELECT last_pass_at FROM health_watch WHERE id = 1")
        .fetch_optional(&mut *tx)
        .await?
        .map(|r| r.try_get("last_pass_at"))
        .transpose()?;
    let resumed = last.is_none_or(|last| now - last > gap);
    if resumed {
        sqlx::query("UPDATE cluster_nodes SET silence_counts_from = $1")
            .bind(now)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query(RAN).bind(now).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(resumed)
}

/// Records that a pass was still running at `now` (a long pass is no gap).
pub async fn ran_at(db: &super::Db, now: i64) -> Result<(), DbError> {
    sqlx::query(RAN).bind(now).execute(&db.pool).await?;
    Ok(())
}

const RAN: &str = "INSERT INTO health_watch (id, last_pass_at) VALUES (1, $1) \
     ON CONFLICT (id) DO UPDATE SET last_pass_at = excluded.last_pass_at \
     WHERE health_watch.last_pass_at < excluded.last_pass_at";
