//! `bundle_issuances` (the audit of every bundle request, served or refused) and
//! `node_reports` (what agents say about their phases).

use sqlx::{Any, Executor, Row};

use super::DbError;

/// One audit row.
#[derive(Debug, Clone, Default)]
pub struct Audit<'a> {
    pub vm_id: i64,
    pub cluster_id: Option<i64>,
    pub serial: Option<i64>,
    pub bundle_id: Option<&'a str>,
    pub bundle_sha256: Option<&'a str>,
    pub key_id: Option<&'a str>,
    /// `issued` or `refused`.
    pub outcome: &'a str,
    /// Why a request was refused (never shown to the caller).
    pub reason: Option<&'a str>,
    pub source_address: Option<&'a str>,
}

pub async fn insert<'c>(
    db: impl Executor<'c, Database = Any>,
    audit: &Audit<'_>,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO bundle_issuances (vm_id, cluster_id, serial, bundle_id, bundle_sha256, key_id, outcome, reason, \
         source_address, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(audit.vm_id)
    .bind(audit.cluster_id)
    .bind(audit.serial)
    .bind(audit.bundle_id)
    .bind(audit.bundle_sha256)
    .bind(audit.key_id)
    .bind(audit.outcome)
    .bind(audit.reason)
    .bind(audit.source_address)
    .bind(now)
    .execute(db)
    .await?;
    Ok(())
}

pub async fn insert_report<'c>(
    db: impl Executor<'c, Database = Any>,
    node_id: i64,
    phase: &str,
    state: &str,
    message: &str,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query("INSERT INTO node_reports (node_id, phase, state, message, created_at) VALUES ($1, $2, $3, $4, $5)")
        .bind(node_id)
        .bind(phase)
        .bind(state)
        .bind(message)
        .bind(now)
        .execute(db)
        .await?;
    Ok(())
}

/// Forgets node reports made before `before`, except each node's latest (a cluster's view
/// says when a node last reported); returns how many.
pub async fn prune_reports<'c>(
    db: impl Executor<'c, Database = Any>,
    before: i64,
) -> Result<u64, DbError> {
    let done = sqlx::query(
        "DELETE FROM node_reports WHERE created_at < $1 \
         AND id NOT IN (SELECT MAX(id) FROM node_reports GROUP BY node_id)",
    )
    .bind(before)
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

/// When a node of the cluster last reported (Unix seconds), if one ever did.
pub async fn last_report_at<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Option<i64>, DbError> {
    let row = sqlx::query(
        "SELECT MAX(r.created_at) AS at FROM node_reports r \
         JOIN cluster_nodes n ON n.id = r.node_id WHERE n.cluster_id = $1",
    )
    .bind(cluster_id)
    .fetch_one(db)
    .await?;
    Ok(row.try_get("at")?)
}
