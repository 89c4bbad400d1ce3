//! The upgrade's preflight etcd snapshot. An upgrade asks a healthy voter for a snapshot as it
//! starts (or waits for the one a voter is already taking), names it in
//! `clusters.upgrade_snapshot_id`, and no control-plane member is handed a new version until
//! it is stored: if the new release breaks etcd's data, the state from just before is in the
//! store. A snapshot that fails stops the upgrade before anything changed; `PATCH` asks again
//! (or, with `snapshot_first: false`, goes on without one).

use exk8s_common::contract::Role;

use super::UpgradeError;
use super::skew::Release;
use super::state::running;
use crate::db::nodes::NodeRow;
use crate::db::snapshots::{NewSnapshot, SnapshotRow, SnapshotState, Trigger};
use crate::db::{self, DbError, clusters::ClusterRow};
use crate::rollout::{Hold, SnapshotWait};

/// Why the upgrade's snapshot `row` (`None`: deleted) is not stored at `now`; `None` when it is.
pub fn wait_of(row: Option<&SnapshotRow>, now: i64) -> Option<SnapshotWait> {
    let Some(row) = row else {
        return Some(SnapshotWait::Gone);
    };
    match row.state {
        SnapshotState::Stored => None,
        SnapshotState::Requested if row.not_after >= now => Some(SnapshotWait::Taking {
            member: row.member_name.clone(),
        }),
        SnapshotState::Requested => Some(SnapshotWait::Failed {
            error: format!("{} did not upload it before its deadline", row.member_name),
        }),
        SnapshotState::Failed => Some(SnapshotWait::Failed {
            error: row.error.clone().unwrap_or_default(),
        }),
    }
}

/// Whether `node`, behind its desired generation, must wait for the upgrade's snapshot: only a
/// control-plane member whose next bundle changes the version it runs, and only while the
/// snapshot the upgrade named is not stored. Reads the snapshot only in that case.
pub async fn hold<'c>(
    db: impl sqlx::Executor<'c, Database = sqlx::Any>,
    cluster: &ClusterRow,
    node: &NodeRow,
    now: i64,
) -> Result<Option<Hold>, DbError> {
    if cluster.upgrade_snapshot_id.is_none() {
        return Ok(None);
    }
    let target: Option<Release> = cluster.kubernetes_version.parse().ok();
    let changes_version =
        node.role == Role::ControlPlane && running(node).is_some_and(|runs| Some(runs) != target);
    if !changes_version {
        return Ok(None);
    }
    let Some((id, named)) = db::snapshots::upgrade_snapshot(db, cluster.id).await? else {
        return Ok(None);
    };
    Ok(wait_of(named.as_ref(), now).map(|wait| Hold::UpgradeSnapshot { id, wait }))
}

/// Asks for the upgrade's snapshot in the upgrade's transaction: the one a voter is taking
/// already (an operator's or the schedule's), or a new one of the oldest healthy voter. Its id.
pub(super) async fn ask(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    nodes: &[NodeRow],
    now: i64,
) -> Result<i64, UpgradeError> {
    db::snapshots::expire(&mut *tx, cluster_id, now).await?;
    let taking = db::snapshots::list(&mut *tx, cluster_id)
        .await?
        .into_iter()
        .find(|s| s.state == SnapshotState::Requested);
    let id = match taking {
        Some(taking) => taking.id,
        None => {
            let node = crate::snapshots::taker(nodes).ok_or_else(|| {
                UpgradeError::Conflict(format!(
                    "no etcd voter of cluster {cluster_id} can take the upgrade's snapshot (a \
                     booted control-plane member whose last report succeeded); upgrade once \
                     one can, or with \"snapshot_first\": false"
                ))
            })?;
            let new = NewSnapshot {
                cluster_id,
                trigger: Trigger::Upgrade,
                node_id: node.id,
                member_name: &node.node_name,
                requested_at: now,
                not_after: now + crate::snapshots::UPLOAD_WINDOW_SECS,
            };
            db::snapshots::insert(&mut *tx, &new).await?.id
        }
    };
    db::snapshots::set_upgrade_snapshot(&mut *tx, cluster_id, Some(id)).await?;
    Ok(id)
}

/// The upgrade's snapshot where it stands in `tx`: its id and why it is not stored (`None`
/// when none is named, or it is stored).
pub(super) async fn pending(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    now: i64,
) -> Result<Option<(i64, SnapshotWait)>, UpgradeError> {
    let Some((id, named)) = db::snapshots::upgrade_snapshot(&mut *tx, cluster_id).await? else {
        return Ok(None);
    };
    Ok(wait_of(named.as_ref(), now).map(|wait| (id, wait)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: SnapshotState, not_after: i64, error: Option<&str>) -> SnapshotRow {
        SnapshotRow {
            id: 7,
            cluster_id: 1,
            state,
            trigger: Trigger::Upgrade,
            node_id: 1,
            member_name: "cp-1".into(),
            requested_at: 0,
            not_after,
            taken_at: None,
            revision: None,
            etcd_version: None,
            size_bytes: None,
            sha256: None,
            object_key: None,
            ca_sha256: None,
            error: error.map(str::to_owned),
        }
    }

    #[test]
    fn only_a_stored_snapshot_lets_the_upgrade_go_on() {
        assert_eq!(
            wait_of(Some(&row(SnapshotState::Stored, 10, None)), 11),
            None
        );
        assert_eq!(
            wait_of(Some(&row(SnapshotState::Requested, 10, None)), 10),
            Some(SnapshotWait::Taking {
                member: "cp-1".into()
            })
        );
        assert_eq!(
            wait_of(Some(&row(SnapshotState::Requested, 10, None)), 11),
            Some(SnapshotWait::Failed {
                error: "cp-1 did not upload it before its deadline".into()
            }),
            "past its deadline it failed, before the reconciler marks it so"
        );
        assert_eq!(
            wait_of(Some(&row(SnapshotState::Failed, 10, Some("disk full"))), 1),
            Some(SnapshotWait::Failed {
                error: "disk full".into()
            })
        );
        assert_eq!(wait_of(None, 1), Some(SnapshotWait::Gone));
    }
}
