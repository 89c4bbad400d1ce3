//! `node_pools`: groups of worker VMs alike — placement, and the labels and taints their
//! kubelets register with (stored as JSON, checked again when read).

use sqlx::{Any, Executor, Row};

use super::DbError;

/// One pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRow {
    pub id: i64,
    pub cluster_id: i64,
    pub name: String,
    pub instance_type: String,
    pub image_id: i64,
    pub subnet_id: i64,
    /// `{"key": "value", …}`.
    pub labels_json: String,
    /// `[{"key", "value", "effect"}, …]`.
    pub taints_json: String,
    pub desired_count: i64,
}

/// A pool to make.
#[derive(Debug, Clone)]
pub struct NewPool<'a> {
    pub cluster_id: i64,
    pub name: &'a str,
    pub instance_type: &'a str,
    pub image_id: i64,
    pub subnet_id: i64,
    pub labels_json: &'a str,
    pub taints_json: &'a str,
    pub desired_count: i64,
}

pub async fn insert(
    tx: &mut sqlx::AnyConnection,
    pool: &NewPool<'_>,
    now: i64,
) -> Result<i64, DbError> {
    let row = sqlx::query(
        "INSERT INTO node_pools (cluster_id, name, instance_type, image_id, subnet_id, labels_json, \
         taints_json, desired_count, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9) RETURNING id",
    )
    .bind(pool.cluster_id)
    .bind(pool.name)
    .bind(pool.instance_type)
    .bind(pool.image_id)
    .bind(pool.subnet_id)
    .bind(pool.labels_json)
    .bind(pool.taints_json)
    .bind(pool.desired_count)
    .bind(now)
    .fetch_one(&mut *tx)
    .await?;
    Ok(row.try_get("id")?)
}

pub async fn get<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
) -> Result<Option<PoolRow>, DbError> {
    let row = sqlx::query(
        "SELECT id, cluster_id, name, instance_type, image_id, subnet_id, labels_json, \
         taints_json, desired_count FROM node_pools WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?;
    let Some(r) = row else { return Ok(None) };
    Ok(Some(PoolRow {
        id: r.try_get("id")?,
        cluster_id: r.try_get("cluster_id")?,
        name: r.try_get("name")?,
        instance_type: r.try_get("instance_type")?,
        image_id: r.try_get("image_id")?,
        subnet_id: r.try_get("subnet_id")?,
        labels_json: r.try_get("labels_json")?,
        taints_json: r.try_get("taints_json")?,
        desired_count: r.try_get("desired_count")?,
    }))
}
