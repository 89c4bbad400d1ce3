//! Nodes on their way out (`cluster_nodes.removal`): a pool's worker is marked `draining`,
//! naming the control-plane node whose agent evicts its pods and the generation of that node
//! whose bundle asks for it; once that generation is applied (or the drain's deadline passed)
//! it is `drained`, its VM is deleted and its row — with its pod range — goes.

use sqlx::{Any, Executor, Row};

use super::DbError;
use super::nodes::{COLUMNS, NodeRow, from_row};
use super::phase::Removal;

/// The pool's nodes, oldest first.
pub async fn pool_nodes<'c>(
    db: impl Executor<'c, Database = Any>,
    pool_id: i64,
) -> Result<Vec<NodeRow>, DbError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM cluster_nodes WHERE pool_id = $1 ORDER BY ordinal"
    ))
    .bind(pool_id)
    .fetch_all(db)
    .await?;
    Ok(rows.iter().map(from_row).collect::<Result<_, _>>()?)
}

/// Gives the control-plane node `node_id` its next desired generation, returned.
pub async fn bump_generation(tx: &mut sqlx::AnyConnection, node_id: i64) -> Result<i64, DbError> {
    let row = sqlx::query(
        "UPDATE cluster_nodes SET desired_generation = desired_generation + 1 WHERE id = $1 \
         RETURNING desired_generation",
    )
    .bind(node_id)
    .fetch_one(&mut *tx)
    .await?;
    Ok(row.try_get("desired_generation")?)
}

/// Marks `node_id` draining (by `drain_by` at `drain_generation`, when a drainer exists); a
/// node already draining keeps its start and gets the new drainer.
pub async fn start_draining(
    tx: &mut sqlx::AnyConnection,
    node_id: i64,
    drain_by: Option<(i64, i64)>,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE cluster_nodes SET removal = 'draining', removal_since = COALESCE(removal_since, $1), \
         drain_by = $2, drain_generation = $3 \
         WHERE id = $4 AND (removal IS NULL OR removal = 'draining')",
    )
    .bind(now)
    .bind(drain_by.map(|(node, _)| node))
    .bind(drain_by.map(|(_, generation)| generation))
    .bind(node_id)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

pub async fn set<'c>(
    db: impl Executor<'c, Database = Any>,
    node_id: i64,
    removal: Removal,
) -> Result<(), DbError> {
    sqlx::query("UPDATE cluster_nodes SET removal = $1 WHERE id = $2")
        .bind(removal.as_str())
        .bind(node_id)
        .execute(db)
        .await?;
    Ok(())
}

/// The names of the nodes the control-plane node `drainer` is asked to drain.
pub async fn drained_by<'c>(
    db: impl Executor<'c, Database = Any>,
    drainer: i64,
) -> Result<Vec<String>, DbError> {
    let rows = sqlx::query(
        "SELECT node_name FROM cluster_nodes WHERE drain_by = $1 AND removal = 'draining' \
         ORDER BY ordinal",
    )
    .bind(drainer)
    .fetch_all(db)
    .await?;
    Ok(rows
        .iter()
        .map(|r| r.try_get("node_name"))
        .collect::<Result<_, _>>()?)
}

/// The pools with a worker the control-plane node `drainer` drains.
pub async fn pools_drained_by<'c>(
    db: impl Executor<'c, Database = Any>,
    drainer: i64,
) -> Result<Vec<i64>, DbError> {
    let rows = sqlx::query(
        "SELECT DISTINCT pool_id FROM cluster_nodes \
         WHERE drain_by = $1 AND removal = 'draining' AND pool_id IS NOT NULL",
    )
    .bind(drainer)
    .fetch_all(db)
    .await?;
    Ok(rows
        .iter()
        .map(|r| r.try_get("pool_id"))
        .collect::<Result<_, _>>()?)
}

/// Forgets a removed node (its pod range is free again), in the caller's transaction, and puts
/// its removal on the cluster's stream at `now` (`how`: what happened to it).
pub async fn delete(
    tx: &mut sqlx::AnyConnection,
    node: &NodeRow,
    how: &str,
    now: i64,
) -> Result<(), DbError> {
    let deleted = sqlx::query("DELETE FROM cluster_nodes WHERE id = $1")
        .bind(node.id)
        .execute(&mut *tx)
        .await?;
    if deleted.rows_affected() == 1 {
        super::events::removed(tx, node, how, now).await?;
    }
    Ok(())
}
