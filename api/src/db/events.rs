//! `cluster_events`: a cluster's changes in order — its phase, each node it gained or lost,
//! each report a node made, each unhealthy machine's replacement started and finished, each
//! snapshot asked for, stored or failed, each phase of a restore, each step of an upgrade.
//! Triggers write most rows (migrations 0012 on), so every path that makes such a change is
//! streamed without having to remember to; a node's removal is written here ([`removed`]), in
//! the transaction that deletes its row (a trigger on that delete would also fire inside a
//! cluster's own deletion). This module reads them, a page at a time after a given id, and
//! prunes them by age. A kind this build does not know (written by a newer API beside it) is
//! read as [`Change::Unknown`], which streams leave out.

use sqlx::{Any, Executor, Row as _};

use exk8s_common::contract::Role;

use super::DbError;
use super::phase::{ClusterPhase, NodePhase, decode};

/// One change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The cluster entered `phase` (with the reason a failure recorded).
    Cluster {
        phase: ClusterPhase,
        reason: Option<String>,
        message: Option<String>,
    },
    /// The cluster gained a node.
    Node { vm_id: i64, phase: NodePhase },
    /// A node left the cluster: its VM deleted, its row gone.
    Removed {
        vm_id: i64,
        /// `control-plane` or `worker`.
        set: String,
        /// The node, and how it left.
        message: String,
    },
    /// A node reported.
    Report {
        vm_id: i64,
        phase: NodePhase,
        message: String,
    },
    /// An unhealthy machine's replacement started, or finished (a row of `remediations`).
    Remediation {
        vm_id: i64,
        /// `control-plane` or `worker`.
        set: String,
        /// The machine is gone and its set back at its size, every node up.
        finished: bool,
        /// Cluster API's reason (`MachineDeleted`, ...).
        reason: String,
        /// The node, and what is wrong with it.
        message: String,
    },
    /// A snapshot was asked for, stored or failed (`state`, as `GET …/snapshots` shows it).
    Snapshot {
        snapshot_id: i64,
        /// The member asked (none when its node is gone).
        vm_id: Option<i64>,
        state: String,
        /// `SnapshotFailed` for a failure.
        reason: Option<String>,
        /// Whom it was asked of and by what, what was stored, or why it failed.
        message: String,
    },
    /// A restore entered `phase` (`stop`, `restore`, `start`, `done`, `failed`).
    Restore {
        /// The snapshot it restores.
        snapshot_id: i64,
        phase: String,
        /// `RestoreFailed` for a failure.
        reason: Option<String>,
        /// Which restore and of what, or why it failed.
        message: String,
    },
    /// A step of a Kubernetes upgrade (or its rollback).
    Upgrade {
        /// `started` (the control plane's target changed), `member` (a member runs a new
        /// release), `done` (every member runs the target) or `pool` (a pool takes another
        /// release).
        step: String,
        /// The member of a `member` step.
        vm_id: Option<i64>,
        /// From which release to which, who runs what, or the pool.
        message: String,
    },
    /// A kind this build does not know: a newer API's, written beside this one during a
    /// rolling deploy. Kept (a page's length says whether more follow), never streamed.
    Unknown { kind: String },
}

/// A stored change: its id (the stream's event id) and when it happened (unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub id: i64,
    pub at: i64,
    pub change: Change,
}

fn row(r: &sqlx::any::AnyRow) -> Result<EventRow, sqlx::Error> {
    let kind: String = r.try_get("kind")?;
    let vm_id: Option<i64> = r.try_get("vm_id")?;
    let node_phase = || {
        let phase: String = r.try_get("phase")?;
        let state: Option<String> = r.try_get("state")?;
        NodePhase::from_columns(&phase, state.as_deref().unwrap_or("succeeded")).map_err(|e| {
            sqlx::Error::ColumnDecode {
                index: "phase".into(),
                source: Box::new(e),
            }
        })
    };
    // A text column a change may leave empty, and the snapshot a snapshot or restore names.
    let text = |column: &str| {
        r.try_get::<Option<String>, _>(column)
            .map(Option::unwrap_or_default)
    };
    let snapshot_id = r
        .try_get::<Option<i64>, _>("snapshot_id")?
        .unwrap_or_default();
    let change = match (kind.as_str(), vm_id) {
        ("node", Some(vm_id)) => Change::Node {
            vm_id,
            phase: node_phase()?,
        },
        ("report", Some(vm_id)) => Change::Report {
            vm_id,
            phase: node_phase()?,
            message: text("message")?,
        },
        ("removed", Some(vm_id)) => Change::Removed {
            vm_id,
            set: r.try_get("phase")?,
            message: text("message")?,
        },
        ("remediation", Some(vm_id)) => Change::Remediation {
            vm_id,
            set: r.try_get("phase")?,
            finished: text("state")? == "finished",
            reason: text("reason")?,
            message: text("message")?,
        },
        ("snapshot", _) => Change::Snapshot {
            snapshot_id,
            vm_id,
            state: r.try_get("phase")?,
            reason: r.try_get("reason")?,
            message: text("message")?,
        },
        ("restore", _) => Change::Restore {
            snapshot_id,
            phase: r.try_get("phase")?,
            reason: r.try_get("reason")?,
            message: text("message")?,
        },
        ("upgrade", _) => Change::Upgrade {
            step: r.try_get("phase")?,
            vm_id,
            message: text("message")?,
        },
        ("cluster", _) => Change::Cluster {
            phase: decode(r, "phase")?,
            reason: r.try_get("reason")?,
            message: r.try_get("message")?,
        },
        _ => Change::Unknown { kind },
    };
    Ok(EventRow {
        id: r.try_get("id")?,
        at: r.try_get("created_at")?,
        change,
    })
}

/// Records that `node` left its cluster at `now` (`how`: what happened to it), in the
/// transaction that deletes its row.
pub async fn removed(
    tx: &mut sqlx::AnyConnection,
    node: &super::nodes::NodeRow,
    how: &str,
    now: i64,
) -> Result<(), DbError> {
    let set = match node.role {
        Role::ControlPlane => "control-plane",
        Role::Worker => "worker",
    };
    sqlx::query(
        "INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, message, created_at) \
         VALUES ($1, 'removed', $2, $3, $4, $5)",
    )
    .bind(node.cluster_id)
    .bind(node.vm_id)
    .bind(set)
    .bind(format!("{}: {how}", node.node_name))
    .bind(now)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// At most `limit` of the cluster's changes after id `after`, in id order.
pub async fn after<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    after: i64,
    limit: i64,
) -> Result<Vec<EventRow>, DbError> {
    let rows = sqlx::query(
        "SELECT id, kind, vm_id, phase, state, reason, message, snapshot_id, created_at \
         FROM cluster_events \
         WHERE cluster_id = $1 AND id > $2 ORDER BY id LIMIT $3",
    )
    .bind(cluster_id)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.iter().map(row).collect::<Result<_, _>>()?)
}

/// The cluster's `limit` latest changes, newest first.
pub async fn latest<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    limit: i64,
) -> Result<Vec<EventRow>, DbError> {
    let rows = sqlx::query(
        "SELECT id, kind, vm_id, phase, state, reason, message, snapshot_id, created_at \
         FROM cluster_events WHERE cluster_id = $1 ORDER BY id DESC LIMIT $2",
    )
    .bind(cluster_id)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.iter().map(row).collect::<Result<_, _>>()?)
}

/// At most `limit` changes of every cluster after id `after`, in id order, each with its
/// cluster (the process's change feed reads them for all streams at once).
pub async fn after_all<'c>(
    db: impl Executor<'c, Database = Any>,
    after: i64,
    limit: i64,
) -> Result<Vec<(i64, EventRow)>, DbError> {
    let rows = sqlx::query(
        "SELECT id, cluster_id, kind, vm_id, phase, state, reason, message, snapshot_id, \
         created_at \
         FROM cluster_events WHERE id > $1 ORDER BY id LIMIT $2",
    )
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows
        .iter()
        .map(|r| Ok((r.try_get("cluster_id")?, row(r)?)))
        .collect::<Result<_, sqlx::Error>>()?)
}

/// The highest change id of all clusters (0 when there is none).
pub async fn last_id<'c>(db: impl Executor<'c, Database = Any>) -> Result<i64, DbError> {
    let last: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM cluster_events")
        .fetch_one(db)
        .await?;
    Ok(last.unwrap_or(0))
}

/// The highest change id of cluster `cluster_id` (0 when it has none).
pub async fn last_of<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<i64, DbError> {
    let last: Option<i64> =
        sqlx::query_scalar("SELECT MAX(id) FROM cluster_events WHERE cluster_id = $1")
            .bind(cluster_id)
            .fetch_one(db)
            .await?;
    Ok(last.unwrap_or(0))
}

/// Deletes changes recorded before `before` (unix seconds); returns how many.
pub async fn prune<'c>(db: impl Executor<'c, Database = Any>, before: i64) -> Result<u64, DbError> {
    let done = sqlx::query("DELETE FROM cluster_events WHERE created_at < $1")
        .bind(before)
        .execute(db)
        .await?;
    Ok(done.rows_affected())
}
