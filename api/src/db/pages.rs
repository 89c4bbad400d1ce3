//! A page of clusters' related rows, one query per table for the whole page: what
//! `GET /clusters` needs to build 500 views without 500 × 10 round trips. Each function takes
//! the page's cluster ids and binds them as `IN ($1, …, $n)` (at most a page: far below either
//! backend's limit on bound values).

use std::collections::HashMap;

use sqlx::{Any, Executor, Row as _};

use super::DbError;
use super::certificates::{CERT_COLUMNS, CertRow, cert_row};
use super::components::{ComponentRow, component_row};
use super::nodes::NodeRow;
use super::pools::PoolRow;
use super::rotations::{ROTATION_COLUMNS, Rotation, rotation_row};

/// `rows` grouped by `key`, each group in the rows' order.
pub fn group<T>(rows: Vec<T>, key: impl Fn(&T) -> i64) -> HashMap<i64, Vec<T>> {
    let mut groups: HashMap<i64, Vec<T>> = HashMap::new();
    for row in rows {
        groups.entry(key(&row)).or_default().push(row);
    }
    groups
}

/// `$1, $2, …, $n`.
fn marks(n: usize) -> String {
    (1..=n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs `sql`, whose `{ids}` stands for the ids' placeholders, bound to `ids`.
async fn fetch<'c>(
    db: impl Executor<'c, Database = Any>,
    sql: &str,
    ids: &[i64],
) -> Result<Vec<sqlx::any::AnyRow>, DbError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = sql.replace("{ids}", &marks(ids.len()));
    let mut query = sqlx::query(&sql);
    for id in ids {
        query = query.bind(*id);
    }
    Ok(query.fetch_all(db).await?)
}

/// The clusters' nodes, by cluster and ordinal.
pub async fn nodes<'c>(
    db: impl Executor<'c, Database = Any>,
    ids: &[i64],
) -> Result<Vec<NodeRow>, DbError> {
    let sql = format!(
        "SELECT {} FROM cluster_nodes WHERE cluster_id IN ({{ids}}) ORDER BY cluster_id, ordinal",
        super::nodes::COLUMNS
    );
    let rows = fetch(db, &sql, ids).await?;
    Ok(rows
        .iter()
        .map(super::nodes::from_row)
        .collect::<Result<_, _>>()?)
}

/// The clusters' recorded certificates, each with its cluster, in recording order.
pub async fn certificates<'c>(
    db: impl Executor<'c, Database = Any>,
    ids: &[i64],
) -> Result<Vec<(i64, CertRow)>, DbError> {
    let sql = format!(
        "SELECT cluster_id, {CERT_COLUMNS} FROM issued_certificates \
         WHERE cluster_id IN ({{ids}}) ORDER BY id"
    );
    let rows = fetch(db, &sql, ids).await?;
    rows.iter()
        .map(|r| Ok((r.try_get("cluster_id")?, cert_row(r)?)))
        .collect()
}

/// The clusters' CA rotations in progress.
pub async fn rotations<'c>(
    db: impl Executor<'c, Database = Any>,
    ids: &[i64],
) -> Result<Vec<Rotation>, DbError> {
    let sql = format!("SELECT {ROTATION_COLUMNS} FROM ca_rotations WHERE cluster_id IN ({{ids}})");
    let rows = fetch(db, &sql, ids).await?;
    rows.iter().map(rotation_row).collect()
}

/// When each cluster's nodes last reported (clusters none of whose nodes reported are absent).
pub async fn last_reports<'c>(
    db: impl Executor<'c, Database = Any>,
    ids: &[i64],
) -> Result<HashMap<i64, i64>, DbError> {
    let sql = "SELECT n.cluster_id, MAX(r.created_at) AS at FROM node_reports r \
         JOIN cluster_nodes n ON n.id = r.node_id WHERE n.cluster_id IN ({ids}) \
         GROUP BY n.cluster_id";
    let rows = fetch(db, sql, ids).await?;
    rows.iter()
        .map(|r| Ok((r.try_get("cluster_id")?, r.try_get("at")?)))
        .collect()
}

/// Each cluster's asked-for control-plane size and its membership error.
pub async fn memberships<'c>(
    db: impl Executor<'c, Database = Any>,
    ids: &[i64],
) -> Result<HashMap<i64, (Option<i64>, Option<String>)>, DbError> {
    let sql = "SELECT id, desired_control_plane_count AS n, membership_error AS e \
         FROM clusters WHERE id IN ({ids})";
    let rows = fetch(db, sql, ids).await?;
    rows.iter()
        .map(|r| Ok((r.try_get("id")?, (r.try_get("n")?, r.try_get("e")?))))
        .collect()
}

/// The clusters' node pools, by cluster and id.
pub async fn pools<'c>(
    db: impl Executor<'c, Database = Any>,
    ids: &[i64],
) -> Result<Vec<PoolRow>, DbError> {
    let sql = format!(
        "SELECT {} FROM node_pools WHERE cluster_id IN ({{ids}}) ORDER BY cluster_id, id",
        super::pools::COLUMNS
    );
    let rows = fetch(db, &sql, ids).await?;
    Ok(rows
        .iter()
        .map(super::pools::from_row)
        .collect::<Result<_, _>>()?)
}

/// The clusters' nodes' component health, each with its cluster.
pub async fn components<'c>(
    db: impl Executor<'c, Database = Any>,
    ids: &[i64],
) -> Result<Vec<(i64, ComponentRow)>, DbError> {
    let sql = "SELECT n.cluster_id, c.node_id, c.component, c.healthy, c.message, c.changed_at \
         FROM node_components c JOIN cluster_nodes n ON n.id = c.node_id \
         WHERE n.cluster_id IN ({ids}) ORDER BY c.node_id, c.component";
    let rows = fetch(db, sql, ids).await?;
    rows.iter()
        .map(|r| Ok((r.try_get("cluster_id")?, component_row(r)?)))
        .collect()
}
