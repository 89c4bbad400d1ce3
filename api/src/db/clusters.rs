//! `clusters`: one row per cluster, its phase (`provisioning` → `founded` | `failed`, and
//! `compensating` / `deleting` in between, `deleted` while it is kept: [`super::kept`]), its
//! network facts, and its trust (CA certificates in clear, every private key sealed).

use sqlx::{Any, Executor, Row};

use super::DbError;
use super::phase::{ClusterPhase, decode};

/// A cluster row.
#[derive(Debug, Clone)]
pub struct ClusterRow {
    pub id: i64,
    pub org_id: i64,
    pub name: String,
    pub phase: ClusterPhase,
    pub spec_json: String,
    pub key_algorithm: String,
    pub kubernetes_version: String,
    pub service_cidr: String,
    pub pod_cidr: String,
    pub cluster_domain: String,
    pub control_plane_dns_name: String,
    pub ca_cert: Option<String>,
    pub ca_key_sealed: Option<String>,
    pub etcd_ca_cert: Option<String>,
    pub etcd_ca_key_sealed: Option<String>,
    pub front_proxy_ca_cert: Option<String>,
    pub front_proxy_ca_key_sealed: Option<String>,
    pub sa_public: Option<String>,
    pub sa_key_sealed: Option<String>,
    pub encryption_key_sealed: Option<String>,
    pub security_group_id: Option<i64>,
    pub dns_configured: bool,
    pub dns_error: Option<String>,
    pub error_reason: Option<String>,
    pub error_message: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// Moves with every change to the cluster's own recorded certificates (see
    /// [`super::certificates::Stamp`]).
    pub certificates_version: i64,
    /// How often the reconciler asks for an etcd snapshot (0: only when an operator asks).
    pub snapshot_every_secs: i64,
    /// How many stored snapshots are kept (the oldest beyond go).
    pub snapshot_retain: i64,
    /// When the service-account key was made (`None`: with the cluster).
    pub sa_key_created_at: Option<i64>,
    /// How old the service-account key may grow before `ServiceAccountKeyFresh` turns False.
    pub sa_key_max_age_days: i64,
    /// Whether the reconciler rotates the service-account key once it is past that age.
    pub sa_key_auto_rotate: bool,
    /// The etcd snapshot the running upgrade waits for before any member changes version.
    pub upgrade_snapshot_id: Option<i64>,
    /// The health policy as stored (JSON; None: the defaults): read it with
    /// `crate::health::policy::of`.
    pub health_policy: Option<String>,
    /// Why the last health pass left an unhealthy control-plane member alone (JSON,
    /// [`crate::health::blocked`]); None: nothing is held back.
    pub remediation_blocked: Option<String>,
}

impl ClusterRow {
    /// When the service-account key in use was made.
    pub fn sa_key_made_at(&self) -> i64 {
        self.sa_key_created_at.unwrap_or(self.created_at)
    }
}

const COLUMNS: &str = "id, org_id, name, phase, spec_json, key_algorithm, kubernetes_version, \
    service_cidr, pod_cidr, cluster_domain, control_plane_dns_name, ca_cert, ca_key_sealed, \
    etcd_ca_cert, etcd_ca_key_sealed, front_proxy_ca_cert, front_proxy_ca_key_sealed, sa_public, \
    sa_key_sealed, encryption_key_sealed, security_group_id, dns_configured, dns_error, \
    error_reason, error_message, created_at, updated_at, certificates_version, \
    snapshot_every_secs, snapshot_retain, sa_key_created_at, sa_key_max_age_days, \
    sa_key_auto_rotate, upgrade_snapshot_id, health_policy, remediation_blocked";

/// The names a row's cluster columns go by where they differ from [`COLUMNS`]: in a join with
/// `cluster_nodes`, whose `id`, `phase`, `kubernetes_version` and `created_at` are the node's.
pub(super) struct Names {
    pub id: &'static str,
    pub phase: &'static str,
    pub kubernetes_version: &'static str,
    pub created_at: &'static str,
}

const PLAIN: Names = Names {
    id: "id",
    phase: "phase",
    kubernetes_version: "kubernetes_version",
    created_at: "created_at",
};

/// The cluster's columns as `c.<column>` for a join in which the node is `n`: its id is the
/// node's `cluster_id`, and its phase, version and creation time are renamed (see [`JOINED`]).
pub(super) fn joined_columns() -> String {
    COLUMNS
        .split(", ")
        .filter_map(|column| match column.trim() {
            "id" => None,
            "phase" => Some("c.phase AS cluster_phase".to_owned()),
            "kubernetes_version" => {
                Some("c.kubernetes_version AS cluster_kubernetes_version".to_owned())
            }
            "created_at" => Some("c.created_at AS cluster_created_at".to_owned()),
            other => Some(format!("c.{other}")),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The names [`joined_columns`] gives.
pub(super) const JOINED: Names = Names {
    id: "cluster_id",
    phase: "cluster_phase",
    kubernetes_version: "cluster_kubernetes_version",
    created_at: "cluster_created_at",
};

fn from_row(r: &sqlx::any::AnyRow) -> Result<ClusterRow, sqlx::Error> {
    from_row_named(r, &PLAIN)
}

pub(super) fn from_row_named(
    r: &sqlx::any::AnyRow,
    names: &Names,
) -> Result<ClusterRow, sqlx::Error> {
    Ok(ClusterRow {
        id: r.try_get(names.id)?,
        org_id: r.try_get("org_id")?,
        name: r.try_get("name")?,
        phase: decode(r, names.phase)?,
        spec_json: r.try_get("spec_json")?,
        key_algorithm: r.try_get("key_algorithm")?,
        kubernetes_version: r.try_get(names.kubernetes_version)?,
        service_cidr: r.try_get("service_cidr")?,
        pod_cidr: r.try_get("pod_cidr")?,
        cluster_domain: r.try_get("cluster_domain")?,
        control_plane_dns_name: r.try_get("control_plane_dns_name")?,
        ca_cert: r.try_get("ca_cert")?,
        ca_key_sealed: r.try_get("ca_key_sealed")?,
        etcd_ca_cert: r.try_get("etcd_ca_cert")?,
        etcd_ca_key_sealed: r.try_get("etcd_ca_key_sealed")?,
        front_proxy_ca_cert: r.try_get("front_proxy_ca_cert")?,
        front_proxy_ca_key_sealed: r.try_get("front_proxy_ca_key_sealed")?,
        sa_public: r.try_get("sa_public")?,
        sa_key_sealed: r.try_get("sa_key_sealed")?,
        encryption_key_sealed: r.try_get("encryption_key_sealed")?,
        security_group_id: r.try_get("security_group_id")?,
        dns_configured: r.try_get::<i64, _>("dns_configured")? != 0,
        dns_error: r.try_get("dns_error")?,
        error_reason: r.try_get("error_reason")?,
        error_message: r.try_get("error_message")?,
        created_at: r.try_get(names.created_at)?,
        updated_at: r.try_get("updated_at")?,
        certificates_version: r.try_get("certificates_version")?,
        snapshot_every_secs: r.try_get("snapshot_every_secs")?,
        snapshot_retain: r.try_get("snapshot_retain")?,
        sa_key_created_at: r.try_get("sa_key_created_at")?,
        sa_key_max_age_days: r.try_get("sa_key_max_age_days")?,
        sa_key_auto_rotate: r.try_get::<i64, _>("sa_key_auto_rotate")? != 0,
        upgrade_snapshot_id: r.try_get("upgrade_snapshot_id")?,
        health_policy: r.try_get("health_policy")?,
        remediation_blocked: r.try_get("remediation_blocked")?,
    })
}

/// The facts a new cluster row starts with.
#[derive(Debug, Clone)]
pub struct NewCluster<'a> {
    pub org_id: i64,
    pub spec_json: &'a str,
    pub key_algorithm: &'a str,
    pub kubernetes_version: &'a str,
    pub service_cidr: &'a str,
    pub pod_cidr: &'a str,
    pub cluster_domain: &'a str,
    pub dns_zone: &'a str,
    /// The machines founding makes, ordinals 1 to this; later machines take the next ones.
    pub machines: i64,
    /// The name the operator asked for; `None`: `exk8s-<org>-<id hex>`.
    pub name: Option<&'a str>,
}

/// Inserts a `provisioning` cluster named as asked, or from its id (`exk8s-<org>-<id hex>`); its
/// control-plane DNS name is always `exk8s-<org>-<id hex>.<zone>` (names are unique per org,
/// DNS names everywhere). A name the org already uses is [`DbError::Duplicate`]. Returns (id,
/// name, dns name).
pub async fn insert_provisioning(
    tx: &mut sqlx::AnyConnection,
    new: &NewCluster<'_>,
    now: i64,
) -> Result<(i64, String, String), DbError> {
    let row = sqlx::query(
        "INSERT INTO clusters (org_id, name, phase, spec_json, key_algorithm, kubernetes_version, \
         service_cidr, pod_cidr, cluster_domain, control_plane_dns_name, created_at, updated_at) \
         VALUES ($1, $9, 'provisioning', $2, $3, $4, $5, $6, $7, '', $8, $8) RETURNING id",
    )
    .bind(new.org_id)
    .bind(new.spec_json)
    .bind(new.key_algorithm)
    .bind(new.kubernetes_version)
    .bind(new.service_cidr)
    .bind(new.pod_cidr)
    .bind(new.cluster_domain)
    .bind(now)
    .bind(new.name.unwrap_or(""))
    .fetch_one(&mut *tx)
    .await?;
    let id: i64 = row.try_get("id")?;
    let generated = format!("exk8s-{}-{:x}", new.org_id, id);
    let dns_name = format!("{generated}.{}", new.dns_zone);
    let name = new.name.map_or(generated, str::to_owned);
    sqlx::query(
        "UPDATE clusters SET name = $1, control_plane_dns_name = $2, last_ordinal = $3 WHERE id = $4",
    )
    .bind(&name)
    .bind(&dns_name)
    .bind(new.machines)
    .bind(id)
        .execute(&mut *tx)
        .await?;
    Ok((id, name, dns_name))
}

/// Takes the cluster's next machine ordinal (committed by the caller; never handed out twice,
/// even to concurrent callers: the row is locked by the update).
pub async fn next_ordinal<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<i64, DbError> {
    let row = sqlx::query(
        "UPDATE clusters SET last_ordinal = last_ordinal + 1 WHERE id = $1 RETURNING last_ordinal",
    )
    .bind(cluster_id)
    .fetch_one(db)
    .await?;
    Ok(row.try_get("last_ordinal")?)
}

/// The cluster's trust material: certificates in clear, keys sealed.
#[derive(Debug, Clone)]
pub struct Trust {
    pub ca_cert: String,
    pub ca_key_sealed: String,
    pub etcd_ca_cert: String,
    pub etcd_ca_key_sealed: String,
    pub front_proxy_ca_cert: String,
    pub front_proxy_ca_key_sealed: String,
    pub sa_public: String,
    pub sa_key_sealed: String,
    pub encryption_key_sealed: String,
}

pub async fn set_trust<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    t: &Trust,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE clusters SET ca_cert = $1, ca_key_sealed = $2, etcd_ca_cert = $3, etcd_ca_key_sealed = $4, \
         front_proxy_ca_cert = $5, front_proxy_ca_key_sealed = $6, sa_public = $7, sa_key_sealed = $8, \
         encryption_key_sealed = $9 WHERE id = $10",
    )
    .bind(&t.ca_cert)
    .bind(&t.ca_key_sealed)
    .bind(&t.etcd_ca_cert)
    .bind(&t.etcd_ca_key_sealed)
    .bind(&t.front_proxy_ca_cert)
    .bind(&t.front_proxy_ca_key_sealed)
    .bind(&t.sa_public)
    .bind(&t.sa_key_sealed)
    .bind(&t.encryption_key_sealed)
    .bind(id)
    .execute(db)
    .await?;
    Ok(())
}

/// Moves a cluster to `phase` and marks it alive now (the reconciler's staleness clock).
pub async fn set_phase<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    phase: ClusterPhase,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query("UPDATE clusters SET phase = $1, updated_at = $2 WHERE id = $3")
        .bind(phase.as_str())
        .bind(now)
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}

/// Marks a `provisioning` cluster alive now, as a founding worker takes it up: false when it
/// is no longer `provisioning` (the reconciler released it while it waited).
pub async fn resume_provisioning<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    now: i64,
) -> Result<bool, DbError> {
    let done =
        sqlx::query("UPDATE clusters SET updated_at = $1 WHERE id = $2 AND phase = 'provisioning'")
            .bind(now)
            .bind(id)
            .execute(db)
            .await?;
    Ok(done.rows_affected() == 1)
}

pub async fn set_security_group<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    group: i64,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query("UPDATE clusters SET security_group_id = $1, updated_at = $2 WHERE id = $3")
        .bind(group)
        .bind(now)
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}

/// Records why founding failed, and the phase: `compensating` while resources remain,
/// `failed` once they are gone.
pub async fn set_error<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    phase: ClusterPhase,
    reason: &str,
    message: &str,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE clusters SET phase = $1, error_reason = $2, error_message = $3, updated_at = $4 WHERE id = $5",
    )
    .bind(phase.as_str())
    .bind(reason)
    .bind(message)
    .bind(now)
    .bind(id)
    .execute(db)
    .await?;
    Ok(())
}

pub async fn set_dns<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    configured: bool,
    error: Option<&str>,
) -> Result<(), DbError> {
    sqlx::query("UPDATE clusters SET dns_configured = $1, dns_error = $2 WHERE id = $3")
        .bind(i64::from(configured))
        .bind(error)
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}

/// A cluster of `org_id`; another org's cluster, or a deleted one ([`super::kept`]), is simply
/// not found.
pub async fn get<'c>(
    db: impl Executor<'c, Database = Any>,
    org_id: i64,
    id: i64,
) -> Result<Option<ClusterRow>, DbError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM clusters WHERE id = $1 AND org_id = $2 AND phase <> 'deleted'"
    ))
    .bind(id)
    .bind(org_id)
    .fetch_optional(db)
    .await?;
    Ok(row.as_ref().map(from_row).transpose()?)
}

/// A cluster of `org_id` as [`get`] finds it, or a deleted one it keeps for recovery (what
/// `restore_from` and a kept cluster's snapshots read).
pub async fn get_or_kept<'c>(
    db: impl Executor<'c, Database = Any>,
    org_id: i64,
    id: i64,
) -> Result<Option<ClusterRow>, DbError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM clusters WHERE id = $1 AND org_id = $2"
    ))
    .bind(id)
    .bind(org_id)
    .fetch_optional(db)
    .await?;
    Ok(row.as_ref().map(from_row).transpose()?)
}

pub async fn get_by_id<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
) -> Result<Option<ClusterRow>, DbError> {
    let row = sqlx::query(&format!("SELECT {COLUMNS} FROM clusters WHERE id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await?;
    Ok(row.as_ref().map(from_row).transpose()?)
}

/// [`COLUMNS`] without the trust (read as NULL): what a view shows, a fifth of the bytes of a
/// full row. Rows read with it cannot open their cluster's trust.
const VIEW_COLUMNS: &str = "id, org_id, name, phase, spec_json, key_algorithm, \
    kubernetes_version, service_cidr, pod_cidr, cluster_domain, control_plane_dns_name, \
    CAST(NULL AS TEXT) AS ca_cert, CAST(NULL AS TEXT) AS ca_key_sealed, \
    CAST(NULL AS TEXT) AS etcd_ca_cert, CAST(NULL AS TEXT) AS etcd_ca_key_sealed, \
    CAST(NULL AS TEXT) AS front_proxy_ca_cert, CAST(NULL AS TEXT) AS front_proxy_ca_key_sealed, \
    CAST(NULL AS TEXT) AS sa_public, CAST(NULL AS TEXT) AS sa_key_sealed, \
    CAST(NULL AS TEXT) AS encryption_key_sealed, security_group_id, dns_configured, dns_error, \
    error_reason, error_message, created_at, updated_at, certificates_version, \
    snapshot_every_secs, snapshot_retain, sa_key_created_at, sa_key_max_age_days, \
    sa_key_auto_rotate, upgrade_snapshot_id, health_policy, remediation_blocked";

/// At most `limit` of the org's clusters (not the deleted ones) with an id above `after`, in id
/// order (one page of `GET /clusters`; the `(org_id, id)` index serves it without a sort).
/// Read with [`VIEW_COLUMNS`].
pub async fn list_page<'c>(
    db: impl Executor<'c, Database = Any>,
    org_id: i64,
    after: i64,
    limit: i64,
) -> Result<Vec<ClusterRow>, DbError> {
    let rows = sqlx::query(&format!(
        "SELECT {VIEW_COLUMNS} FROM clusters WHERE org_id = $1 AND id > $2 \
         AND phase <> 'deleted' ORDER BY id LIMIT $3"
    ))
    .bind(org_id)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.iter().map(from_row).collect::<Result<_, _>>()?)
}

/// Atomically takes one cluster stuck in `provisioning` since before `stale_before`, moving it
/// to `compensating`. Safe with several API replicas: exactly one wins each cluster.
pub async fn claim_stale<'c>(
    db: impl Executor<'c, Database = Any>,
    stale_before: i64,
    now: i64,
) -> Result<Option<i64>, DbError> {
    let row = sqlx::query(
        "UPDATE clusters SET phase = 'compensating', updated_at = $1 \
         WHERE id = (SELECT id FROM clusters WHERE phase IN ('provisioning', 'compensating') AND updated_at < $2 \
                     ORDER BY id LIMIT 1) \
           AND phase IN ('provisioning', 'compensating') AND updated_at < $2 \
         RETURNING id",
    )
    .bind(now)
    .bind(stale_before)
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| r.try_get("id")).transpose()?)
}

/// Clusters left `deleting` (a delete that could not finish, or a process that died in one).
pub async fn deleting<'c>(db: impl Executor<'c, Database = Any>) -> Result<Vec<i64>, DbError> {
    let ids = sqlx::query_scalar("SELECT id FROM clusters WHERE phase = 'deleting' ORDER BY id")
        .fetch_all(db)
        .await?;
    Ok(ids)
}

/// The cluster's target Kubernetes version (the one a control-plane node's next bundle
/// renders).
pub async fn kubernetes_version<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
) -> Result<Option<String>, DbError> {
    let row = sqlx::query("SELECT kubernetes_version FROM clusters WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await?;
    Ok(row.map(|r| r.try_get("kubernetes_version")).transpose()?)
}

/// Sets the cluster's target Kubernetes version.
pub async fn set_kubernetes_version<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    version: &str,
) -> Result<(), DbError> {
    sqlx::query("UPDATE clusters SET kubernetes_version = $1, updated_at = $2 WHERE id = $3")
        .bind(version)
        .bind(super::now())
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}

/// Every founded cluster's id (the health pass's round).
pub async fn founded<'c>(db: impl Executor<'c, Database = Any>) -> Result<Vec<i64>, DbError> {
    let rows = sqlx::query("SELECT id FROM clusters WHERE phase = 'founded' ORDER BY id")
        .fetch_all(db)
        .await?;
    Ok(rows
        .iter()
        .map(|r| r.try_get("id"))
        .collect::<Result<_, _>>()?)
}

/// Stores the cluster's health policy (None: back to the defaults).
pub async fn set_health_policy<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    policy: Option<&str>,
) -> Result<(), DbError> {
    sqlx::query("UPDATE clusters SET health_policy = $1 WHERE id = $2")
        .bind(policy)
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}

/// Stores why control-plane remediation waits (None: it does not).
pub async fn set_remediation_blocked<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    blocked: Option<&str>,
) -> Result<(), DbError> {
    sqlx::query("UPDATE clusters SET remediation_blocked = $1 WHERE id = $2")
        .bind(blocked)
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}
