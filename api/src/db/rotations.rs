//! `ca_rotations`: a cluster's CA rotation in progress, and the swap of a cluster's CA columns
//! when the new CA starts signing. Phase changes are guarded by the phase they leave, so two
//! replicas never both advance one rotation.

use sqlx::{Any, Executor, Row};

use super::DbError;
use crate::pki::CaRole;

/// Where a rotation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotationPhase {
    /// Trust files carry the old and the new CA; the old one still signs.
    TrustBoth,
    /// The new CA signs; the old one is still trusted.
    SignNew,
    /// Only the new CA is trusted.
    DropOld,
}

impl RotationPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TrustBoth => "trust-both",
            Self::SignNew => "sign-new",
            Self::DropOld => "drop-old",
        }
    }
}

impl std::fmt::Display for RotationPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RotationPhase {
    type Err = exk8s_common::contract::UnknownName;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "trust-both" => Ok(Self::TrustBoth),
            "sign-new" => Ok(Self::SignNew),
            "drop-old" => Ok(Self::DropOld),
            other => Err(exk8s_common::contract::UnknownName::new(
                other,
                &["trust-both", "sign-new", "drop-old"],
            )),
        }
    }
}

/// The CA a rotation replaces as the API names it: the same spelling as the
/// `certificate_authorities` fields of `POST /clusters` (`front_proxy`).
pub fn ca_name(role: CaRole) -> &'static str {
    match role {
        CaRole::Cluster => "cluster",
        CaRole::Etcd => "etcd",
        CaRole::FrontProxy => "front_proxy",
    }
}

/// The spelling `rotate-ca` took before the names were made one (deprecated), and the one the
/// `ca_rotations.ca` column keeps (its CHECK constraint names it).
pub const DEPRECATED_FRONT_PROXY: &str = "front-proxy";

/// The CA as the `ca_rotations.ca` column stores it.
fn stored_name(role: CaRole) -> &'static str {
    match role {
        CaRole::FrontProxy => DEPRECATED_FRONT_PROXY,
        other => ca_name(other),
    }
}

/// The CA called `name`, if it is one (the deprecated `front-proxy` included).
pub fn ca_named(name: &str) -> Option<CaRole> {
    if name == DEPRECATED_FRONT_PROXY {
        return Some(CaRole::FrontProxy);
    }
    CaRole::ALL.into_iter().find(|role| ca_name(*role) == name)
}

/// One rotation in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotation {
    pub cluster_id: i64,
    pub ca: CaRole,
    pub phase: RotationPhase,
    /// The CA certificate trusted beside the current one (new in trust-both, old in sign-new).
    pub other_cert: Option<String>,
    /// The new CA's sealed key, until it signs.
    pub new_key_sealed: Option<String>,
    pub started_at: i64,
    pub updated_at: i64,
}

pub async fn get<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Option<Rotation>, DbError> {
    let row = sqlx::query(
        "SELECT cluster_id, ca, phase, other_cert, new_key_sealed, started_at, updated_at \
         FROM ca_rotations WHERE cluster_id = $1",
    )
    .bind(cluster_id)
    .fetch_optional(db)
    .await?;
    row.as_ref().map(rotation_row).transpose()
}

/// The columns [`rotation_row`] reads.
pub(super) const ROTATION_COLUMNS: &str =
    "cluster_id, ca, phase, other_cert, new_key_sealed, started_at, updated_at";

pub(super) fn rotation_row(r: &sqlx::any::AnyRow) -> Result<Rotation, DbError> {
    rotation_row_named(r, &PLAIN)
}

/// The names of [`ROTATION_COLUMNS`] in a row, in their order.
pub(super) type Names = [&'static str; 7];

const PLAIN: Names = [
    "cluster_id",
    "ca",
    "phase",
    "other_cert",
    "new_key_sealed",
    "started_at",
    "updated_at",
];

/// The names `r.<column> AS rotation_<column>` gives, for a join in which a node's columns
/// keep their own names.
pub(super) const PREFIXED: Names = [
    "rotation_cluster_id",
    "rotation_ca",
    "rotation_phase",
    "rotation_other_cert",
    "rotation_new_key_sealed",
    "rotation_started_at",
    "rotation_updated_at",
];

/// [`ROTATION_COLUMNS`] of the table aliased `r`, under the [`PREFIXED`] names.
pub(super) fn prefixed_columns() -> String {
    super::aliased_columns("r", &PLAIN, &PREFIXED)
}

/// A rotation from a row whose columns go by `names`.
pub(super) fn rotation_row_named(
    r: &sqlx::any::AnyRow,
    names: &Names,
) -> Result<Rotation, DbError> {
    let [
        cluster_id,
        ca,
        phase,
        other_cert,
        new_key_sealed,
        started_at,
        updated_at,
    ] = *names;
    let ca_name: String = r.try_get(ca)?;
    Ok(Rotation {
        cluster_id: r.try_get(cluster_id)?,
        ca: ca_named(&ca_name).ok_or_else(|| {
            DbError::Query(sqlx::Error::ColumnDecode {
                index: ca.into(),
                source: format!("unknown CA `{ca_name}`").into(),
            })
        })?,
        phase: super::phase::decode(r, phase)?,
        other_cert: r.try_get(other_cert)?,
        new_key_sealed: r.try_get(new_key_sealed)?,
        started_at: r.try_get(started_at)?,
        updated_at: r.try_get(updated_at)?,
    })
}

/// Why another change of `cluster_id` must wait, when a rotation of one of its CAs or of its
/// service-account key is in progress (one statement: any executor serves). `then` ends the
/// sentence ("upgrade after it").
pub async fn refusal<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    then: &str,
) -> Result<Option<String>, DbError> {
    let row = sqlx::query(
        "SELECT ca, phase FROM ca_rotations WHERE cluster_id = $1 \
         UNION ALL SELECT 'service-account key', phase FROM sa_key_rotations WHERE cluster_id = $1",
    )
    .bind(cluster_id)
    .fetch_optional(db)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let what: String = row.try_get("ca")?;
    let phase: String = row.try_get("phase")?;
    let what = match ca_named(&what) {
        Some(ca) => format!("the {} CA", ca_name(ca)),
        None => format!("the {what}"),
    };
    Ok(Some(format!(
        "a rotation of {what} is in progress (phase {phase}); {then}"
    )))
}

/// Clusters with a rotation in progress.
pub async fn in_progress<'c>(db: impl Executor<'c, Database = Any>) -> Result<Vec<i64>, DbError> {
    let rows = sqlx::query("SELECT cluster_id FROM ca_rotations ORDER BY cluster_id")
        .fetch_all(db)
        .await?;
    Ok(rows
        .iter()
        .map(|r| r.try_get("cluster_id"))
        .collect::<Result<_, _>>()?)
}

/// Starts a rotation in phase trust-both; false when one is already in progress.
pub async fn insert(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    ca: CaRole,
    new_cert: &str,
    new_key_sealed: &str,
    now: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query(
        "INSERT INTO ca_rotations (cluster_id, ca, phase, other_cert, new_key_sealed, started_at, updated_at) \
         VALUES ($1, $2, 'trust-both', $3, $4, $5, $5) ON CONFLICT (cluster_id) DO NOTHING",
    )
    .bind(cluster_id)
    .bind(stored_name(ca))
    .bind(new_cert)
    .bind(new_key_sealed)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    rotation_started(tx, cluster_id, ca_name(ca), now).await?;
    Ok(true)
}

/// Moves the rotation from `from` to `to` with the new trusted-beside certificate; false when
/// it was no longer in `from` (another replica advanced it).
pub async fn advance(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    from: RotationPhase,
    to: RotationPhase,
    other_cert: Option<&str>,
    now: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE ca_rotations SET phase = $1, other_cert = $2, new_key_sealed = NULL, updated_at = $3 \
         WHERE cluster_id = $4 AND phase = $5",
    )
    .bind(to.as_str())
    .bind(other_cert)
    .bind(now)
    .bind(cluster_id)
    .bind(from.as_str())
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    rotation_moved(tx, cluster_id, Some(to), now).await?;
    Ok(true)
}

/// Ends the rotation (from drop-old) at `now`; false when it had already ended.
pub async fn finish(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    now: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query("DELETE FROM ca_rotations WHERE cluster_id = $1 AND phase = 'drop-old'")
        .bind(cluster_id)
        .execute(&mut *tx)
        .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    rotation_moved(tx, cluster_id, None, now).await?;
    Ok(true)
}

/// A rotation started: its row, and the oldest beyond [`super::history::ROTATIONS_KEPT`] gone.
async fn rotation_started(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    ca: &str,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query("INSERT INTO ca_rotation_history (cluster_id, ca, started_at) VALUES ($1, $2, $3)")
        .bind(cluster_id)
        .bind(ca)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    sqlx::query(&format!(
        "DELETE FROM ca_rotation_history WHERE cluster_id = $1 AND id < ( \
         SELECT h.id FROM ca_rotation_history h WHERE h.cluster_id = $1 \
         ORDER BY h.id DESC LIMIT 1 OFFSET {})",
        super::history::ROTATIONS_KEPT - 1
    ))
    .bind(cluster_id)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// The cluster's rotation under way entered `phase`, or ended (`None`).
async fn rotation_moved(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    phase: Option<RotationPhase>,
    now: i64,
) -> Result<(), DbError> {
    let column = match phase {
        Some(RotationPhase::TrustBoth) => return Ok(()),
        Some(RotationPhase::SignNew) => "sign_new_at",
        Some(RotationPhase::DropOld) => "drop_old_at",
        None => "finished_at",
    };
    sqlx::query(&format!(
        "UPDATE ca_rotation_history SET {column} = $1 WHERE id = ( \
         SELECT max(id) FROM ca_rotation_history WHERE cluster_id = $2 AND finished_at IS NULL)"
    ))
    .bind(now)
    .bind(cluster_id)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Replaces one of a cluster's CAs (certificate and sealed key).
pub async fn set_ca(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    ca: CaRole,
    cert: &str,
    key_sealed: &str,
) -> Result<(), DbError> {
    let (cert_column, key_column) = match ca {
        CaRole::Cluster => ("ca_cert", "ca_key_sealed"),
        CaRole::Etcd => ("etcd_ca_cert", "etcd_ca_key_sealed"),
        CaRole::FrontProxy => ("front_proxy_ca_cert", "front_proxy_ca_key_sealed"),
    };
    sqlx::query(&format!(
        "UPDATE clusters SET {cert_column} = $1, {key_column} = $2 WHERE id = $3"
    ))
    .bind(cert)
    .bind(key_sealed)
    .bind(cluster_id)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn one_spelling_and_the_deprecated_alias() {
        for role in CaRole::ALL {
            assert_eq!(ca_named(ca_name(role)), Some(role));
        }
        assert_eq!(ca_name(CaRole::FrontProxy), "front_proxy");
        assert_eq!(ca_named("front-proxy"), Some(CaRole::FrontProxy));
        assert_eq!(ca_named("front proxy"), None);
    }
}
