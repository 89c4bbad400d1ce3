//! `restores` and `restore_members`: in-place restores of a cluster's etcd from one of its
//! snapshots, and how far each member got. Every move is guarded by the state it leaves, so
//! two API processes (or a replayed acknowledgement) never move one restore twice.

use sqlx::{Any, Executor, Row};

use super::DbError;

/// Where a restore stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RestorePhase {
    /// Every member puts its control-plane static pods aside and stops etcd.
    Stop,
    /// Every member restores the snapshot into a fresh data directory and starts etcd.
    Restore,
    /// The members put their static pods back, one at a time.
    Start,
    Done,
    /// `error` says where and why.
    Failed,
}

impl RestorePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Restore => "restore",
            Self::Start => "start",
            Self::Done => "done",
            Self::Failed => "failed",
        }
    }

    fn parse(text: &str) -> Result<Self, DbError> {
        [
            Self::Stop,
            Self::Restore,
            Self::Start,
            Self::Done,
            Self::Failed,
        ]
        .into_iter()
        .find(|p| p.as_str() == text)
        .ok_or_else(|| {
            DbError::Query(sqlx::Error::Decode(
                format!("restore phase `{text}`").into(),
            ))
        })
    }

    /// How far a member is once it finished this phase (`restore_members.done`).
    pub fn level(self) -> i64 {
        match self {
            Self::Stop => 1,
            Self::Restore => 2,
            Self::Start | Self::Done => 3,
            Self::Failed => 0,
        }
    }

    /// The phase after this one.
    pub fn next(self) -> Self {
        match self {
            Self::Stop => Self::Restore,
            Self::Restore => Self::Start,
            Self::Start | Self::Done => Self::Done,
            Self::Failed => Self::Failed,
        }
    }

    /// Whether the restore still runs.
    pub fn running(self) -> bool {
        matches!(self, Self::Stop | Self::Restore | Self::Start)
    }
}

impl std::fmt::Display for RestorePhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreRow {
    pub id: i64,
    pub cluster_id: i64,
    /// The cluster the snapshot belongs to: this one, or the one it was founded from.
    pub source_cluster_id: i64,
    pub snapshot_id: i64,
    /// The SHA-256 of the snapshot as etcd wrote it: what every member checks before restoring.
    pub sha256: String,
    pub phase: RestorePhase,
    /// The restored cluster's `--initial-cluster-token`.
    pub token: String,
    pub bump_revision: i64,
    pub started_at: i64,
    pub updated_at: i64,
    pub error: Option<String>,
}

/// A member of a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRow {
    pub node_id: i64,
    pub ordinal: i64,
    pub member_name: String,
    pub peer_url: String,
    /// 0 nothing yet, 1 stopped, 2 restored, 3 started.
    pub done: i64,
}

const COLUMNS: &str = "id, cluster_id, source_cluster_id, snapshot_id, sha256, phase, token, bump_revision, \
                       started_at, updated_at, error";

fn restore_row(row: &sqlx::any::AnyRow) -> Result<RestoreRow, DbError> {
    Ok(RestoreRow {
        id: row.try_get("id")?,
        cluster_id: row.try_get("cluster_id")?,
        source_cluster_id: row.try_get("source_cluster_id")?,
        snapshot_id: row.try_get("snapshot_id")?,
        sha256: row.try_get("sha256")?,
        phase: RestorePhase::parse(&row.try_get::<String, _>("phase")?)?,
        token: row.try_get("token")?,
        bump_revision: row.try_get("bump_revision")?,
        started_at: row.try_get("started_at")?,
        updated_at: row.try_get("updated_at")?,
        error: row.try_get("error")?,
    })
}

/// A restore to record, with its members.
#[derive(Debug, Clone)]
pub struct NewRestore<'a> {
    pub cluster_id: i64,
    pub source_cluster_id: i64,
    pub snapshot_id: i64,
    pub sha256: &'a str,
    pub token: &'a str,
    pub bump_revision: i64,
    pub now: i64,
    /// (node id, ordinal, etcd member name, peer URL).
    pub members: Vec<(i64, i64, &'a str, String)>,
}

/// Records a restore in its first phase; the unique index refuses a second running one.
pub async fn insert(tx: &mut sqlx::AnyConnection, new: &NewRestore<'_>) -> Result<i64, DbError> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO restores (cluster_id, source_cluster_id, snapshot_id, sha256, phase, token, \
         bump_revision, started_at, updated_at) \
         VALUES ($1, $2, $3, $4, 'stop', $5, $6, $7, $7) RETURNING id",
    )
    .bind(new.cluster_id)
    .bind(new.source_cluster_id)
    .bind(new.snapshot_id)
    .bind(new.sha256)
    .bind(new.token)
    .bind(new.bump_revision)
    .bind(new.now)
    .fetch_one(&mut *tx)
    .await?;
    for (node_id, ordinal, name, peer_url) in &new.members {
        sqlx::query(
            "INSERT INTO restore_members (restore_id, node_id, ordinal, member_name, peer_url) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(id)
        .bind(*node_id)
        .bind(*ordinal)
        .bind(*name)
        .bind(peer_url.as_str())
        .execute(&mut *tx)
        .await?;
    }
    Ok(id)
}

/// The cluster's restore that still runs, if any.
pub async fn running<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Option<RestoreRow>, DbError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM restores WHERE cluster_id = $1 \
         AND phase IN ('stop', 'restore', 'start')"
    ))
    .bind(cluster_id)
    .fetch_optional(db)
    .await?;
    row.as_ref().map(restore_row).transpose()
}

/// The cluster's latest restore, if any.
pub async fn latest<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Option<RestoreRow>, DbError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM restores WHERE cluster_id = $1 ORDER BY id DESC LIMIT 1"
    ))
    .bind(cluster_id)
    .fetch_optional(db)
    .await?;
    row.as_ref().map(restore_row).transpose()
}

/// The restore's members, by ordinal.
pub async fn members<'c>(
    db: impl Executor<'c, Database = Any>,
    restore_id: i64,
) -> Result<Vec<MemberRow>, DbError> {
    let rows = sqlx::query(
        "SELECT node_id, ordinal, member_name, peer_url, done FROM restore_members \
         WHERE restore_id = $1 ORDER BY ordinal",
    )
    .bind(restore_id)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(MemberRow {
                node_id: row.try_get("node_id")?,
                ordinal: row.try_get("ordinal")?,
                member_name: row.try_get("member_name")?,
                peer_url: row.try_get("peer_url")?,
                done: row.try_get("done")?,
            })
        })
        .collect()
}

/// Member `node_id` of restore `restore_id` finished the step that brings it to `level`
/// (from the one before); false when it had already.
pub async fn member_done<'c>(
    db: impl Executor<'c, Database = Any>,
    restore_id: i64,
    node_id: i64,
    level: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE restore_members SET done = $1 WHERE restore_id = $2 AND node_id = $3 \
         AND done = $4",
    )
    .bind(level)
    .bind(restore_id)
    .bind(node_id)
    .bind(level - 1)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Moves the restore from `from` to `to`; false when it was not in `from`.
pub async fn advance<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    from: RestorePhase,
    to: RestorePhase,
    now: i64,
) -> Result<bool, DbError> {
    let moved =
        sqlx::query("UPDATE restores SET phase = $1, updated_at = $2 WHERE id = $3 AND phase = $4")
            .bind(to.as_str())
            .bind(now)
            .bind(id)
            .bind(from.as_str())
            .execute(db)
            .await?;
    Ok(moved.rows_affected() == 1)
}

/// Fails the restore while it runs, saying why; false when it no longer ran.
pub async fn fail<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    error: &str,
    now: i64,
) -> Result<bool, DbError> {
    let failed = sqlx::query(
        "UPDATE restores SET phase = 'failed', error = $1, updated_at = $2 WHERE id = $3 \
         AND phase IN ('stop', 'restore', 'start')",
    )
    .bind(error)
    .bind(now)
    .bind(id)
    .execute(db)
    .await?;
    Ok(failed.rows_affected() == 1)
}

/// What refuses another change of `cluster_id` while one of its restores runs: a sentence
/// naming the restore and its phase, ending with `then`.
pub async fn refusal<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    then: &str,
) -> Result<Option<String>, DbError> {
    Ok(running(db, cluster_id).await?.map(|r| {
        format!(
            "restore {} of this cluster's etcd (from snapshot {}) is in its {} phase; {then}",
            r.id, r.snapshot_id, r.phase
        )
    }))
}

/// The cluster and snapshot a cluster was founded from (`restore_from`), if any.
pub async fn source_of<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Option<(i64, i64)>, DbError> {
    let row = sqlx::query(
        "SELECT source_cluster_id, snapshot_id FROM restore_sources WHERE cluster_id = $1",
    )
    .bind(cluster_id)
    .fetch_optional(db)
    .await?;
    row.map(|r| Ok((r.try_get("source_cluster_id")?, r.try_get("snapshot_id")?)))
        .transpose()
}

/// Records that `cluster_id` is founded from `source_cluster_id`'s snapshot `snapshot_id`.
pub async fn set_source<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    (source_cluster_id, snapshot_id): (i64, i64),
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO restore_sources (cluster_id, source_cluster_id, snapshot_id) \
         VALUES ($1, $2, $3)",
    )
    .bind(cluster_id)
    .bind(source_cluster_id)
    .bind(snapshot_id)
    .execute(db)
    .await?;
    Ok(())
}

/// Clusters founded from a snapshot whose restore has not started yet.
pub async fn pending_sources<'c>(
    db: impl Executor<'c, Database = Any>,
) -> Result<Vec<i64>, DbError> {
    Ok(sqlx::query_scalar::<_, i64>(
        "SELECT s.cluster_id FROM restore_sources s WHERE NOT EXISTS \
         (SELECT 1 FROM restores r WHERE r.cluster_id = s.cluster_id) ORDER BY s.cluster_id",
    )
    .fetch_all(db)
    .await?)
}

/// Clusters whose latest restore is done.
pub async fn latest_done<'c>(db: impl Executor<'c, Database = Any>) -> Result<Vec<i64>, DbError> {
    Ok(sqlx::query_scalar::<_, i64>(
        "SELECT r.cluster_id FROM restores r WHERE r.phase = 'done' \
         AND r.id = (SELECT MAX(l.id) FROM restores l WHERE l.cluster_id = r.cluster_id) \
         ORDER BY r.cluster_id",
    )
    .fetch_all(db)
    .await?)
}
