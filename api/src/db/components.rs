//! `node_components`: each node component's health as its agent last reported it, kept with
//! when its health last changed.

use exk8s_common::contract::{Component, ComponentHealth};
use sqlx::{Any, Executor, Row as _};

use super::DbError;
use super::phase::decode;

/// One component of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentRow {
    pub node_id: i64,
    pub component: Component,
    pub healthy: bool,
    pub message: String,
    /// When `healthy` last changed (unix seconds).
    pub changed_at: i64,
}

/// Records what a node's probes saw, each component's transition time kept while its health
/// stays the same.
pub async fn record(
    tx: &mut sqlx::AnyConnection,
    node_id: i64,
    seen: &[ComponentHealth],
    now: i64,
) -> Result<(), DbError> {
    for health in seen {
        sqlx::query(
            "INSERT INTO node_components (node_id, component, healthy, message, changed_at, reported_at) \
             VALUES ($1, $2, $3, $4, $5, $5) \
             ON CONFLICT (node_id, component) DO UPDATE SET healthy = excluded.healthy, \
             message = excluded.message, reported_at = excluded.reported_at, \
             changed_at = CASE WHEN node_components.healthy = excluded.healthy \
                 THEN node_components.changed_at ELSE excluded.changed_at END",
        )
        .bind(node_id)
        .bind(health.component.as_str())
        .bind(i64::from(health.healthy))
        .bind(&health.message)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// Every reported component of the cluster's nodes.
pub async fn for_cluster<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Vec<ComponentRow>, DbError> {
    let rows = sqlx::query(
        "SELECT c.node_id, c.component, c.healthy, c.message, c.changed_at \
         FROM node_components c JOIN cluster_nodes n ON n.id = c.node_id \
         WHERE n.cluster_id = $1 ORDER BY c.node_id, c.component",
    )
    .bind(cluster_id)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(component_row)
        .collect::<Result<_, sqlx::Error>>()
        .map_err(DbError::from)
}

pub(super) fn component_row(r: &sqlx::any::AnyRow) -> Result<ComponentRow, sqlx::Error> {
    Ok(ComponentRow {
        node_id: r.try_get("node_id")?,
        component: decode(r, "component")?,
        healthy: r.try_get::<i64, _>("healthy")? != 0,
        message: r.try_get("message")?,
        changed_at: r.try_get("changed_at")?,
    })
}
