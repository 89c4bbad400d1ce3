//! `sa_key_rotations`: a cluster's service-account key rotation in progress, the swap of the
//! cluster's key columns when the new key starts signing, and the key policy columns of
//! `clusters`. Phase changes are guarded by the phase they leave, so two replicas never both
//! advance one rotation. The phases are a CA rotation's ([`RotationPhase`]).

use sqlx::{Any, Executor, Row};

use super::DbError;
use super::rotations::RotationPhase;

/// One service-account key rotation in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaRotation {
    pub cluster_id: i64,
    pub phase: RotationPhase,
    /// The public key (PEM) trusted beside the cluster's: the new one in trust-both, the old
    /// one in sign-new, none in drop-old.
    pub other_public: Option<String>,
    /// The new key, sealed, until it signs.
    pub new_key_sealed: Option<String>,
    /// Seconds between every apiserver signing with the new key and the old one's drop.
    pub drop_old_after: i64,
    /// When every control-plane node applied sign-new (the old key signs nothing after it).
    pub signing_since: Option<i64>,
    pub started_at: i64,
    pub updated_at: i64,
}

impl SaRotation {
    /// When the old public key goes, once known.
    pub fn drop_old_at(&self) -> Option<i64> {
        self.signing_since
            .map(|since| since.saturating_add(self.drop_old_after))
    }
}

pub(super) const COLUMNS: &str = "cluster_id, phase, other_public, new_key_sealed, drop_old_after, \
    signing_since, started_at, updated_at";

/// A rotation's column names: the table's own, or those [`prefixed_columns`] selects.
type Names = [&'static str; 8];

const PLAIN: Names = [
    "cluster_id",
    "phase",
    "other_public",
    "new_key_sealed",
    "drop_old_after",
    "signing_since",
    "started_at",
    "updated_at",
];

pub(super) const PREFIXED: Names = [
    "sa_rotation_cluster_id",
    "sa_rotation_phase",
    "sa_rotation_other_public",
    "sa_rotation_new_key_sealed",
    "sa_rotation_drop_old_after",
    "sa_rotation_signing_since",
    "sa_rotation_started_at",
    "sa_rotation_updated_at",
];

/// The columns of the table aliased `s`, under the [`PREFIXED`] names.
pub(super) fn prefixed_columns() -> String {
    super::aliased_columns("s", &PLAIN, &PREFIXED)
}

pub(super) fn from_row(r: &sqlx::any::AnyRow) -> Result<SaRotation, DbError> {
    from_row_named(r, &PLAIN)
}

/// A rotation from a row whose columns go by `names`.
pub(super) fn from_row_named(r: &sqlx::any::AnyRow, names: &Names) -> Result<SaRotation, DbError> {
    let [
        cluster_id,
        phase,
        other_public,
        new_key_sealed,
        drop_old_after,
        signing_since,
        started_at,
        updated_at,
    ] = *names;
    Ok(SaRotation {
        cluster_id: r.try_get(cluster_id)?,
        phase: super::phase::decode(r, phase)?,
        other_public: r.try_get(other_public)?,
        new_key_sealed: r.try_get(new_key_sealed)?,
        drop_old_after: r.try_get(drop_old_after)?,
        signing_since: r.try_get(signing_since)?,
        started_at: r.try_get(started_at)?,
        updated_at: r.try_get(updated_at)?,
    })
}

pub async fn get<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Option<SaRotation>, DbError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM sa_key_rotations WHERE cluster_id = $1"
    ))
    .bind(cluster_id)
    .fetch_optional(db)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Clusters with a rotation of their service-account key in progress.
pub async fn in_progress<'c>(db: impl Executor<'c, Database = Any>) -> Result<Vec<i64>, DbError> {
    Ok(
        sqlx::query_scalar("SELECT cluster_id FROM sa_key_rotations ORDER BY cluster_id")
            .fetch_all(db)
            .await?,
    )
}

/// Starts a rotation in trust-both with the new key's public half and sealed key; false when
/// one is already in progress.
pub async fn insert(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    new_public: &str,
    new_key_sealed: &str,
    drop_old_after: i64,
    now: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query(
        "INSERT INTO sa_key_rotations (cluster_id, phase, other_public, new_key_sealed, \
         drop_old_after, started_at, updated_at) \
         VALUES ($1, 'trust-both', $2, $3, $4, $5, $5) ON CONFLICT (cluster_id) DO NOTHING",
    )
    .bind(cluster_id)
    .bind(new_public)
    .bind(new_key_sealed)
    .bind(drop_old_after)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Moves the rotation from `from` to `to`, `other_public` trusted beside the cluster's key
/// (the waiting key is forgotten); false when it was no longer in `from`.
pub async fn advance(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    from: RotationPhase,
    to: RotationPhase,
    other_public: Option<&str>,
    now: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE sa_key_rotations SET phase = $1, other_public = $2, new_key_sealed = NULL, \
         updated_at = $3 WHERE cluster_id = $4 AND phase = $5",
    )
    .bind(to.as_str())
    .bind(other_public)
    .bind(now)
    .bind(cluster_id)
    .bind(from.as_str())
    .execute(&mut *tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records that every control-plane node signs with the new key since `now` (once).
pub async fn set_signing_since<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    now: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE sa_key_rotations SET signing_since = $1, updated_at = $1 \
         WHERE cluster_id = $2 AND phase = 'sign-new' AND signing_since IS NULL",
    )
    .bind(now)
    .bind(cluster_id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Ends the rotation (from drop-old); false when it had already ended.
pub async fn finish<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<bool, DbError> {
    let done =
        sqlx::query("DELETE FROM sa_key_rotations WHERE cluster_id = $1 AND phase = 'drop-old'")
            .bind(cluster_id)
            .execute(db)
            .await?;
    Ok(done.rows_affected() == 1)
}

/// Makes `public` / `key_sealed` the cluster's service-account key, made at `now`.
pub async fn set_key(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    public: &str,
    key_sealed: &str,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE clusters SET sa_public = $1, sa_key_sealed = $2, sa_key_created_at = $3 \
         WHERE id = $4",
    )
    .bind(public)
    .bind(key_sealed)
    .bind(now)
    .bind(cluster_id)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Records when the cluster's service-account key was made (a key it took from elsewhere).
pub async fn set_made_at<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    made_at: i64,
) -> Result<(), DbError> {
    sqlx::query("UPDATE clusters SET sa_key_created_at = $1 WHERE id = $2")
        .bind(made_at)
        .bind(cluster_id)
        .execute(db)
        .await?;
    Ok(())
}

/// Sets the cluster's key policy.
pub async fn set_policy<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    max_age_days: i64,
    auto_rotate: bool,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE clusters SET sa_key_max_age_days = $1, sa_key_auto_rotate = $2 WHERE id = $3",
    )
    .bind(max_age_days)
    .bind(i64::from(auto_rotate))
    .bind(cluster_id)
    .execute(db)
    .await?;
    Ok(())
}

/// The founded clusters that asked for automatic rotation, whose key is older than their
/// maximum age at `now` and is not being rotated.
pub async fn due<'c>(db: impl Executor<'c, Database = Any>, now: i64) -> Result<Vec<i64>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT c.id FROM clusters c WHERE c.phase = 'founded' AND c.sa_key_auto_rotate = 1 \
         AND COALESCE(c.sa_key_created_at, c.created_at) + c.sa_key_max_age_days * 86400 <= $1 \
         AND NOT EXISTS (SELECT 1 FROM sa_key_rotations r WHERE r.cluster_id = c.id) \
         ORDER BY c.id",
    )
    .bind(now)
    .fetch_all(db)
    .await?)
}
