//! `snapshots`: each etcd snapshot asked of a cluster's voter, and what became of it; and the
//! cluster's sealed snapshot key (`clusters.snapshot_key`). A state change is guarded by the
//! state it leaves, so an upload and an expiry never both decide one snapshot.

use sqlx::{Any, Executor, Row};

use super::DbError;

/// Where a snapshot stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotState {
    /// Asked of a member, which has not uploaded it yet.
    Requested,
    /// Sealed and in the store.
    Stored,
    /// Never stored; `error` says why.
    Failed,
}

impl SnapshotState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requested => "requested",
            Self::Stored => "stored",
            Self::Failed => "failed",
        }
    }

    fn parse(text: &str) -> Result<Self, DbError> {
        match text {
            "requested" => Ok(Self::Requested),
            "stored" => Ok(Self::Stored),
            "failed" => Ok(Self::Failed),
            other => Err(DbError::Query(sqlx::Error::Decode(
                format!("snapshot state `{other}`").into(),
            ))),
        }
    }
}

/// Who asked for a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Operator,
    Schedule,
    /// The preflight of a Kubernetes upgrade: no member changes version before it is stored.
    Upgrade,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Schedule => "schedule",
            Self::Upgrade => "upgrade",
        }
    }

    fn parse(text: &str) -> Result<Self, DbError> {
        match text {
            "operator" => Ok(Self::Operator),
            "schedule" => Ok(Self::Schedule),
            "upgrade" => Ok(Self::Upgrade),
            other => Err(DbError::Query(sqlx::Error::Decode(
                format!("snapshot trigger `{other}`").into(),
            ))),
        }
    }
}

/// One row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRow {
    pub id: i64,
    pub cluster_id: i64,
    pub state: SnapshotState,
    pub trigger: Trigger,
    /// The member asked to take it.
    pub node_id: i64,
    pub member_name: String,
    pub requested_at: i64,
    /// The upload must come before.
    pub not_after: i64,
    pub taken_at: Option<i64>,
    pub revision: Option<i64>,
    pub etcd_version: Option<String>,
    pub size_bytes: Option<i64>,
    /// SHA-256 (hex) of the snapshot as etcd wrote it.
    pub sha256: Option<String>,
    pub object_key: Option<String>,
    /// SHA-256 (hex) of the cluster CA certificate it was taken under.
    pub ca_sha256: Option<String>,
    pub error: Option<String>,
}

const COLUMNS: &str = "id, cluster_id, state, trigger, node_id, member_name, requested_at, \
    not_after, taken_at, revision, etcd_version, size_bytes, sha256, object_key, ca_sha256, error";

fn row(r: &sqlx::any::AnyRow) -> Result<SnapshotRow, DbError> {
    Ok(SnapshotRow {
        id: r.try_get("id")?,
        cluster_id: r.try_get("cluster_id")?,
        state: SnapshotState::parse(&r.try_get::<String, _>("state")?)?,
        trigger: Trigger::parse(&r.try_get::<String, _>("trigger")?)?,
        node_id: r.try_get("node_id")?,
        member_name: r.try_get("member_name")?,
        requested_at: r.try_get("requested_at")?,
        not_after: r.try_get("not_after")?,
        taken_at: r.try_get("taken_at")?,
        revision: r.try_get("revision")?,
        etcd_version: r.try_get("etcd_version")?,
        size_bytes: r.try_get("size_bytes")?,
        sha256: r.try_get("sha256")?,
        object_key: r.try_get("object_key")?,
        ca_sha256: r.try_get("ca_sha256")?,
        error: r.try_get("error")?,
    })
}

/// A snapshot to ask of a member.
#[derive(Debug, Clone)]
pub struct NewSnapshot<'a> {
    pub cluster_id: i64,
    pub trigger: Trigger,
    pub node_id: i64,
    pub member_name: &'a str,
    pub requested_at: i64,
    pub not_after: i64,
}

pub async fn insert<'c>(
    db: impl Executor<'c, Database = Any>,
    new: &NewSnapshot<'_>,
) -> Result<SnapshotRow, DbError> {
    let r = sqlx::query(&format!(
        "INSERT INTO snapshots (cluster_id, state, trigger, node_id, member_name, requested_at, \
         not_after) VALUES ($1, 'requested', $2, $3, $4, $5, $6) RETURNING {COLUMNS}"
    ))
    .bind(new.cluster_id)
    .bind(new.trigger.as_str())
    .bind(new.node_id)
    .bind(new.member_name)
    .bind(new.requested_at)
    .bind(new.not_after)
    .fetch_one(db)
    .await?;
    row(&r)
}

pub async fn get<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    id: i64,
) -> Result<Option<SnapshotRow>, DbError> {
    sqlx::query(&format!(
        "SELECT {COLUMNS} FROM snapshots WHERE cluster_id = $1 AND id = $2"
    ))
    .bind(cluster_id)
    .bind(id)
    .fetch_optional(db)
    .await?
    .as_ref()
    .map(row)
    .transpose()
}

/// The cluster's snapshots, newest first.
pub async fn list<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Vec<SnapshotRow>, DbError> {
    sqlx::query(&format!(
        "SELECT {COLUMNS} FROM snapshots WHERE cluster_id = $1 ORDER BY id DESC"
    ))
    .bind(cluster_id)
    .fetch_all(db)
    .await?
    .iter()
    .map(row)
    .collect()
}

/// The snapshot node `node_id` is asked to take now, if any.
pub async fn asked_of<'c>(
    db: impl Executor<'c, Database = Any>,
    node_id: i64,
    now: i64,
) -> Result<Option<SnapshotRow>, DbError> {
    sqlx::query(&format!(
        "SELECT {COLUMNS} FROM snapshots WHERE node_id = $1 AND state = 'requested' \
         AND not_after >= $2 ORDER BY id LIMIT 1"
    ))
    .bind(node_id)
    .bind(now)
    .fetch_optional(db)
    .await?
    .as_ref()
    .map(row)
    .transpose()
}

/// Fails the cluster's requested snapshots whose upload did not come by its deadline; how many.
pub async fn expire<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    now: i64,
) -> Result<u64, DbError> {
    Ok(sqlx::query(
        "UPDATE snapshots SET state = 'failed', finished_at = $2, error = 'the member did not \
         upload it before its deadline (it was down, or its agent could not take it: see its \
         log)' WHERE cluster_id = $1 AND state = 'requested' AND not_after < $2",
    )
    .bind(cluster_id)
    .bind(now)
    .execute(db)
    .await?
    .rows_affected())
}

/// Fails every cluster's requested snapshots past their deadline; how many.
pub async fn expire_all<'c>(
    db: impl Executor<'c, Database = Any>,
    now: i64,
) -> Result<u64, DbError> {
    Ok(sqlx::query(
        "UPDATE snapshots SET state = 'failed', finished_at = $1, error = 'the member did not \
         upload it before its deadline (it was down, or its agent could not take it: see its \
         log)' WHERE state = 'requested' AND not_after < $1",
    )
    .bind(now)
    .execute(db)
    .await?
    .rows_affected())
}

/// What a stored snapshot is.
#[derive(Debug, Clone)]
pub struct Stored<'a> {
    pub taken_at: i64,
    pub revision: i64,
    pub etcd_version: &'a str,
    pub size_bytes: i64,
    pub sha256: &'a str,
    pub object_key: &'a str,
    pub ca_sha256: &'a str,
}

/// Records snapshot `id` stored; false when it was no longer requested (expired meanwhile).
pub async fn stored<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    s: &Stored<'_>,
) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE snapshots SET state = 'stored', taken_at = $1, finished_at = $1, revision = $2, \
         etcd_version = $3, size_bytes = $4, sha256 = $5, object_key = $6, ca_sha256 = $7 \
         WHERE id = $8 AND state = 'requested'",
    )
    .bind(s.taken_at)
    .bind(s.revision)
    .bind(s.etcd_version)
    .bind(s.size_bytes)
    .bind(s.sha256)
    .bind(s.object_key)
    .bind(s.ca_sha256)
    .bind(id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records snapshot `id` failed with `error` at `now`, if it was still requested.
pub async fn failed<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    error: &str,
    now: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE snapshots SET state = 'failed', error = $1, finished_at = $3 \
         WHERE id = $2 AND state = 'requested'",
    )
    .bind(error)
    .bind(id)
    .bind(now)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Names snapshot `id` the one cluster `cluster_id`'s upgrade waits for (`None`: none).
pub async fn set_upgrade_snapshot<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    id: Option<i64>,
) -> Result<(), DbError> {
    sqlx::query("UPDATE clusters SET upgrade_snapshot_id = $1 WHERE id = $2")
        .bind(id)
        .bind(cluster_id)
        .execute(db)
        .await?;
    Ok(())
}

/// Snapshot `id` is stored: an upgrade of cluster `cluster_id` that waited for it waits no more.
pub async fn upgrade_snapshot_stored<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    id: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE clusters SET upgrade_snapshot_id = NULL WHERE id = $1 AND upgrade_snapshot_id = $2",
    )
    .bind(cluster_id)
    .bind(id)
    .execute(db)
    .await?;
    Ok(())
}

/// The snapshot cluster `cluster_id`'s upgrade waits for, as named by
/// `clusters.upgrade_snapshot_id`: `None` when it names none; its id, and its row unless that is
/// gone (deleted before it was stored: the upgrade must not go on as if it had been).
pub async fn upgrade_snapshot<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Option<(i64, Option<SnapshotRow>)>, DbError> {
    let found = sqlx::query(
        "SELECT c.upgrade_snapshot_id AS wanted, s.id, s.cluster_id, s.state, s.trigger, \
         s.node_id, s.member_name, s.requested_at, s.not_after, s.taken_at, s.revision, \
         s.etcd_version, s.size_bytes, s.sha256, s.object_key, s.ca_sha256, s.error \
         FROM clusters c LEFT JOIN snapshots s ON s.id = c.upgrade_snapshot_id \
         WHERE c.id = $1 AND c.upgrade_snapshot_id IS NOT NULL",
    )
    .bind(cluster_id)
    .fetch_optional(db)
    .await?;
    let Some(r) = found else {
        return Ok(None);
    };
    let wanted: i64 = r.try_get("wanted")?;
    if r.try_get::<Option<i64>, _>("id")?.is_none() {
        return Ok(Some((wanted, None)));
    }
    Ok(Some((wanted, Some(row(&r)?))))
}

pub async fn delete<'c>(db: impl Executor<'c, Database = Any>, id: i64) -> Result<(), DbError> {
    sqlx::query("DELETE FROM snapshots WHERE id = $1")
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}

/// The cluster's sealed snapshot key, if it has one.
pub async fn key<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Option<String>, DbError> {
    let r = sqlx::query("SELECT snapshot_key FROM clusters WHERE id = $1")
        .bind(cluster_id)
        .fetch_optional(db)
        .await?;
    Ok(r.map(|r| r.try_get::<Option<String>, _>("snapshot_key"))
        .transpose()?
        .flatten())
}

/// Gives the cluster `sealed` as its snapshot key unless it has one already (two first
/// snapshots at once keep one key).
pub async fn set_key_once<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    sealed: &str,
) -> Result<(), DbError> {
    sqlx::query("UPDATE clusters SET snapshot_key = $1 WHERE id = $2 AND snapshot_key IS NULL")
        .bind(sealed)
        .bind(cluster_id)
        .execute(db)
        .await?;
    Ok(())
}

/// Sets the cluster's schedule.
pub async fn set_schedule<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    every_secs: i64,
    retain: i64,
) -> Result<(), DbError> {
    sqlx::query("UPDATE clusters SET snapshot_every_secs = $1, snapshot_retain = $2 WHERE id = $3")
        .bind(every_secs)
        .bind(retain)
        .bind(cluster_id)
        .execute(db)
        .await?;
    Ok(())
}

/// The founded clusters whose scheduled snapshot is due at `now`: none is being taken, none
/// failed since `retry_after`, and the last one stored (or the cluster's founding) is at least
/// its interval old.
pub async fn due<'c>(
    db: impl Executor<'c, Database = Any>,
    now: i64,
    retry_after: i64,
) -> Result<Vec<i64>, DbError> {
    Ok(sqlx::query_scalar::<_, i64>(
        "SELECT c.id FROM clusters c WHERE c.phase = 'founded' AND c.snapshot_every_secs > 0 \
         AND NOT EXISTS (SELECT 1 FROM snapshots s WHERE s.cluster_id = c.id \
             AND s.state = 'requested' AND s.not_after >= $1) \
         AND NOT EXISTS (SELECT 1 FROM snapshots s WHERE s.cluster_id = c.id \
             AND s.state = 'failed' AND s.requested_at > $2) \
         AND COALESCE((SELECT MAX(s.taken_at) FROM snapshots s WHERE s.cluster_id = c.id \
             AND s.state = 'stored'), c.created_at) + c.snapshot_every_secs <= $1 \
         ORDER BY c.id",
    )
    .bind(now)
    .bind(retry_after)
    .fetch_all(db)
    .await?)
}

/// The clusters with more stored (or failed) snapshots than they keep.
pub async fn over_retention<'c>(
    db: impl Executor<'c, Database = Any>,
) -> Result<Vec<i64>, DbError> {
    Ok(sqlx::query_scalar::<_, i64>(
        "SELECT c.id FROM clusters c WHERE \
         (SELECT COUNT(*) FROM snapshots s WHERE s.cluster_id = c.id AND s.state = 'stored') \
             > c.snapshot_retain \
         OR (SELECT COUNT(*) FROM snapshots s WHERE s.cluster_id = c.id AND s.state = 'failed') \
             > c.snapshot_retain \
         ORDER BY c.id",
    )
    .fetch_all(db)
    .await?)
}

/// Each cluster's latest snapshot in each state (up to three rows per cluster); `{clusters}`
/// stands for the page's predicate on `cluster_id`.
pub(crate) const LATEST_SQL: &str = "SELECT id, cluster_id, state, trigger, node_id, \
    member_name, requested_at, not_after, taken_at, revision, etcd_version, size_bytes, sha256, \
    object_key, ca_sha256, error FROM snapshots WHERE id IN \
    (SELECT MAX(id) FROM snapshots WHERE {clusters} GROUP BY cluster_id, state)";

pub(crate) fn snapshot_row(r: &sqlx::any::AnyRow) -> Result<SnapshotRow, DbError> {
    row(r)
}
