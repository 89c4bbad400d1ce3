//! A node's generations as stored: the serial and generation a bootstrap issuance takes, a
//! report's outcome, a re-arm, the cluster's row lock under which the rollout gate is decided
//! again before an update is handed out, and the bumps that ask for a new bundle.
//! [`crate::lifecycle::generations`] decides what a report does; this only stores it.

use exk8s_common::contract::Role;
use sqlx::{Any, Executor, Row};

use super::DbError;
use crate::db::phase::NodePhase;
use crate::lifecycle::generations::{self, NodeGenerations};

/// A bootstrap issuance's serial and the generation it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handed {
    pub serial: i64,
    pub generation: i64,
}

/// Takes the next serial for a bootstrap issuance, in the caller's transaction, and records
/// the node's desired generation as handed out, and `node_key` (when sent) as the key of the
/// node's day-2 requests (the latest bootstrap fetch wins). Refuses (None) when the node may
/// not be issued a bootstrap bundle now; an issuance to a `complete` node consumes its re-arm.
pub async fn take_serial(
    tx: &mut sqlx::AnyConnection,
    node_id: i64,
    version: &str,
    node_key: Option<&str>,
) -> Result<Option<Handed>, DbError> {
    let row = sqlx::query(
        "UPDATE cluster_nodes SET serial = serial + 1, handed_generation = desired_generation, \
         handed_version = $2, node_key = COALESCE($3, node_key), \
         issuance_allowed = CASE WHEN phase = 'complete' THEN 0 ELSE issuance_allowed END \
         WHERE id = $1 AND issuance_allowed = 1 RETURNING serial, handed_generation",
    )
    .bind(node_id)
    .bind(version)
    .bind(node_key)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(r) = row else { return Ok(None) };
    Ok(Some(Handed {
        serial: r.try_get("serial")?,
        generation: r.try_get("handed_generation")?,
    }))
}

/// Records a node's report as [`generations::report`] decides it, on the node's generations read
/// under its row's lock in `tx`; a newer generation applied ends the certificates' lives of the
/// one it replaces (kept in the history, at `at`).
pub async fn record_report(
    tx: &mut sqlx::AnyConnection,
    node_id: i64,
    phase: NodePhase,
    generation: Option<i64>,
    at: i64,
) -> Result<(), DbError> {
    // The no-op write takes the row's lock (both databases) before it is read.
    sqlx::query("UPDATE cluster_nodes SET applied_generation = applied_generation WHERE id = $1")
        .bind(node_id)
        .execute(&mut *tx)
        .await?;
    let row = sqlx::query(
        "SELECT cluster_id, desired_generation, handed_generation, applied_generation, \
         handed_version FROM cluster_nodes WHERE id = $1",
    )
    .bind(node_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else { return Ok(()) };
    let now = NodeGenerations {
        desired: row.try_get("desired_generation")?,
        handed: row.try_get("handed_generation")?,
        applied: row.try_get("applied_generation")?,
    };
    let reported = generations::report(now, phase, generation);
    let (name, state) = reported.phase.columns();
    // The node runs its handed bundle's version once it applied that very bundle (an older
    // generation reported late says nothing about the version it runs).
    let runs_handed = reported.applied == now.handed && reported.applied > now.applied;
    let handed_version: Option<String> = row.try_get("handed_version")?;
    sqlx::query(
        "UPDATE cluster_nodes SET phase = $1, phase_state = $2, applied_generation = $3, \
         issuance_allowed = CASE WHEN $4 = 1 THEN 0 ELSE issuance_allowed END, \
         kubernetes_version = CASE WHEN $5 = 1 THEN $6 ELSE kubernetes_version END WHERE id = $7",
    )
    .bind(name)
    .bind(state)
    .bind(reported.applied)
    .bind(i64::from(reported.closes_bootstrap))
    .bind(i64::from(runs_handed && handed_version.is_some()))
    .bind(handed_version)
    .bind(node_id)
    .execute(&mut *tx)
    .await?;
    if reported.applied > now.applied && now.applied >= 1 {
        let cluster_id: i64 = row.try_get("cluster_id")?;
        crate::db::history::node_lives_ended(tx, cluster_id, node_id, now.applied, at).await?;
    }
    Ok(())
}

/// Allows one more issuance to a node (certificate renewal or repair).
pub async fn rearm<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    vm_id: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE cluster_nodes SET issuance_allowed = 1 WHERE cluster_id = $1 AND vm_id = $2",
    )
    .bind(cluster_id)
    .bind(vm_id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Locks `cluster_id`'s row for the rest of `tx`: rollout decisions for one cluster (which
/// node may take its next generation, `rollout::gate`) are then taken one at a time, on both
/// databases, over node rows read after the lock.
pub async fn lock_cluster(tx: &mut sqlx::AnyConnection, cluster_id: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE clusters SET updated_at = updated_at WHERE id = $1")
        .bind(cluster_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Takes the next serial for an update bundle and hands the node its desired generation, when
/// it is behind. Whether the rollout allows it is the caller's decision, taken under
/// [`lock_cluster`] in the same transaction.
pub async fn hand_update(
    tx: &mut sqlx::AnyConnection,
    node_id: i64,
    version: &str,
) -> Result<Option<Handed>, DbError> {
    let row = sqlx::query(
        "UPDATE cluster_nodes SET serial = serial + 1, handed_generation = desired_generation, \
         handed_version = $2 WHERE id = $1 AND desired_generation > applied_generation \
         RETURNING serial, handed_generation",
    )
    .bind(node_id)
    .bind(version)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(r) = row else { return Ok(None) };
    Ok(Some(Handed {
        serial: r.try_get("serial")?,
        generation: r.try_get("handed_generation")?,
    }))
}

/// Gives every node of the cluster its next desired generation; `(vm_id, desired)` per node.
pub async fn bump_generations(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
) -> Result<Vec<(i64, i64)>, DbError> {
    let rows = sqlx::query(
        "UPDATE cluster_nodes SET desired_generation = desired_generation + 1 \
         WHERE cluster_id = $1 RETURNING vm_id, desired_generation",
    )
    .bind(cluster_id)
    .fetch_all(&mut *tx)
    .await?;
    let mut nodes = rows
        .iter()
        .map(|r| Ok((r.try_get("vm_id")?, r.try_get("desired_generation")?)))
        .collect::<Result<Vec<(i64, i64)>, sqlx::Error>>()?;
    nodes.sort_unstable();
    Ok(nodes)
}

/// Gives every node of the cluster but node `except` (an id) its next desired generation.
pub async fn bump_generations_except(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    except: i64,
) -> Result<u64, DbError> {
    let done = sqlx::query(
        "UPDATE cluster_nodes SET desired_generation = desired_generation + 1 \
         WHERE cluster_id = $1 AND id <> $2",
    )
    .bind(cluster_id)
    .bind(except)
    .execute(&mut *tx)
    .await?;
    Ok(done.rows_affected())
}

/// Gives every node of `role` in the cluster its next desired generation.
pub async fn bump_role_generations(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    role: Role,
) -> Result<u64, DbError> {
    let done = sqlx::query(
        "UPDATE cluster_nodes SET desired_generation = desired_generation + 1 \
         WHERE cluster_id = $1 AND role = $2",
    )
    .bind(cluster_id)
    .bind(role.as_str())
    .execute(&mut *tx)
    .await?;
    Ok(done.rows_affected())
}
