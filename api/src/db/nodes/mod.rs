//! `cluster_nodes` (role, last report, generations, day-2 key) and its two control-plane
//! facets: `etcd_members` (the stacked etcd member's serving and peer certificates) and
//! `apiserver_nodes` (the apiserver serving certificate).
//!
//! Generations: `desired` is bumped by the API whenever the node's bundle would change;
//! `handed` is the generation of the last bundle issued to the node; `applied` is what the
//! node reported healthy. A node is up to date when `applied == desired`.

mod updates;

use std::sync::LazyLock;

use exk8s_common::contract::Role;
use sqlx::{Any, Executor, Row};

use super::DbError;
use super::clusters::{self, ClusterRow};
use super::phase::{EtcdMembership, NodePhase, Removal, decode};
use super::{rotations, sa_rotations};
use crate::lifecycle::generations::NodeGenerations;

pub use updates::{
    Handed, bump_generations, bump_generations_except, bump_role_generations, hand_update,
    lock_cluster, rearm, record_report, take_serial,
};

#[derive(Debug, Clone)]
pub struct NodeRow {
    pub id: i64,
    pub cluster_id: i64,
    pub ordinal: i64,
    pub vm_id: i64,
    pub node_name: String,
    pub private_ipv4: String,
    pub private_ipv6: Option<String>,
    pub public_ipv4: Option<String>,
    pub is_initial: bool,
    pub serial: i64,
    pub issuance_allowed: bool,
    pub role: Role,
    pub phase: NodePhase,
    pub desired_generation: i64,
    pub handed_generation: i64,
    pub applied_generation: i64,
    /// The node's day-2 public key (base64 ed25519), registered with its first bundle fetch.
    pub node_key: Option<String>,
    /// A worker's pool.
    pub pool_id: Option<i64>,
    /// Set while the node is being removed.
    pub removal: Option<Removal>,
    pub removal_since: Option<i64>,
    /// The control-plane node whose agent drains this one, and the generation of it that
    /// carries the drain.
    pub drain_by: Option<i64>,
    pub drain_generation: Option<i64>,
    /// A control-plane node's place in etcd (None for workers).
    pub etcd_membership: Option<EtcdMembership>,
    /// When the operator asked to replace this control-plane member (None: not asked).
    pub replace_since: Option<i64>,
    /// The Kubernetes version of the last bundle the node was handed.
    pub handed_version: Option<String>,
    /// The Kubernetes version the node runs: its handed bundle's, once reported healthy (None
    /// before its first healthy report).
    pub kubernetes_version: Option<String>,
    /// The last signed request of the node's agent, to [`HEARTBEAT_EVERY`] (None: not seen
    /// since heartbeats were kept).
    pub last_seen_at: Option<i64>,
    /// The release its agent said it is at its last bundle fetch (None: not said yet).
    pub agent_version: Option<String>,
    /// What the compute API last said of its VM when not running (`gone`, `stopped`, ...),
    /// and since when a health pass has seen it so; both None while it runs.
    pub vm_state: Option<String>,
    pub vm_down_since: Option<i64>,
    /// The earliest moment its silence counts from: when the health passes last resumed after
    /// a gap ([`super::health_watch`]); None: not since the node was made.
    pub silence_counts_from: Option<i64>,
    pub created_at: i64,
}

impl NodeRow {
    pub fn generations(&self) -> NodeGenerations {
        NodeGenerations {
            desired: self.desired_generation,
            handed: self.handed_generation,
            applied: self.applied_generation,
        }
    }

    /// It runs what it should ([`NodeGenerations::up_to_date`]).
    pub fn up_to_date(&self) -> bool {
        self.generations().up_to_date()
    }

    /// Handed a generation it has not reported applied yet ([`NodeGenerations::in_flight`]).
    pub fn in_flight(&self) -> bool {
        self.generations().in_flight()
    }
}

pub(super) const COLUMNS: &str = "id, cluster_id, ordinal, vm_id, node_name, private_ipv4, private_ipv6, public_ipv4, \
    is_initial, serial, issuance_allowed, role, phase, phase_state, desired_generation, \
    handed_generation, applied_generation, node_key, pool_id, removal, removal_since, \
    drain_by, drain_generation, etcd_membership, replace_since, handed_version, \
    kubernetes_version, last_seen_at, agent_version, vm_state, vm_down_since, silence_counts_from, created_at";

pub(super) fn from_row(r: &sqlx::any::AnyRow) -> Result<NodeRow, sqlx::Error> {
    Ok(NodeRow {
        id: r.try_get("id")?,
        cluster_id: r.try_get("cluster_id")?,
        ordinal: r.try_get("ordinal")?,
        vm_id: r.try_get("vm_id")?,
        node_name: r.try_get("node_name")?,
        private_ipv4: r.try_get("private_ipv4")?,
        private_ipv6: r.try_get("private_ipv6")?,
        public_ipv4: r.try_get("public_ipv4")?,
        is_initial: r.try_get::<i64, _>("is_initial")? != 0,
        serial: r.try_get("serial")?,
        issuance_allowed: r.try_get::<i64, _>("issuance_allowed")? != 0,
        role: decode(r, "role")?,
        phase: NodePhase::from_columns(
            &r.try_get::<String, _>("phase")?,
            &r.try_get::<String, _>("phase_state")?,
        )
        .map_err(|e| sqlx::Error::ColumnDecode {
            index: "phase".into(),
            source: Box::new(e),
        })?,
        desired_generation: r.try_get("desired_generation")?,
        handed_generation: r.try_get("handed_generation")?,
        applied_generation: r.try_get("applied_generation")?,
        node_key: r.try_get("node_key")?,
        pool_id: r.try_get("pool_id")?,
        removal: optional::<Removal>(r, "removal")?,
        removal_since: r.try_get("removal_since")?,
        drain_by: r.try_get("drain_by")?,
        drain_generation: r.try_get("drain_generation")?,
        etcd_membership: optional(r, "etcd_membership")?,
        replace_since: r.try_get("replace_since")?,
        handed_version: r.try_get("handed_version")?,
        kubernetes_version: r.try_get("kubernetes_version")?,
        last_seen_at: r.try_get("last_seen_at")?,
        agent_version: r.try_get("agent_version")?,
        vm_state: r.try_get("vm_state")?,
        vm_down_since: r.try_get("vm_down_since")?,
        silence_counts_from: r.try_get("silence_counts_from")?,
        created_at: r.try_get("created_at")?,
    })
}

/// Decodes a nullable closed-set column.
fn optional<T>(r: &sqlx::any::AnyRow, column: &str) -> Result<Option<T>, sqlx::Error>
where
    T: std::str::FromStr<Err = exk8s_common::contract::UnknownName>,
{
    r.try_get::<Option<String>, _>(column)?
        .map(|text| text.parse::<T>())
        .transpose()
        .map_err(|e| sqlx::Error::ColumnDecode {
            index: column.into(),
            source: Box::new(e),
        })
}

/// A node to insert with its sealed serving keys.
#[derive(Debug, Clone)]
pub struct NewNode<'a> {
    pub cluster_id: i64,
    pub ordinal: i64,
    pub vm_id: i64,
    pub node_name: &'a str,
    pub private_ipv4: &'a str,
    pub private_ipv6: Option<&'a str>,
    pub public_ipv4: Option<&'a str>,
    pub is_initial: bool,
    pub role: Role,
    /// A worker's pool.
    pub pool_id: Option<i64>,
    /// A control-plane node's place in etcd (None for workers).
    pub etcd_membership: Option<EtcdMembership>,
}

pub async fn insert(
    tx: &mut sqlx::AnyConnection,
    node: &NewNode<'_>,
    now: i64,
) -> Result<i64, DbError> {
    let row = sqlx::query(
        "INSERT INTO cluster_nodes (cluster_id, ordinal, vm_id, node_name, private_ipv4, private_ipv6, \
         public_ipv4, is_initial, serial, issuance_allowed, role, pool_id, \
         etcd_membership, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0, 1, $9, $10, $11, $12) RETURNING id",
    )
    .bind(node.cluster_id)
    .bind(node.ordinal)
    .bind(node.vm_id)
    .bind(node.node_name)
    .bind(node.private_ipv4)
    .bind(node.private_ipv6)
    .bind(node.public_ipv4)
    .bind(i64::from(node.is_initial))
    .bind(node.role.as_str())
    .bind(node.pool_id)
    .bind(node.etcd_membership.map(EtcdMembership::as_str))
    .bind(now)
    .fetch_one(&mut *tx)
    .await?;
    Ok(row.try_get("id")?)
}

/// How many nodes the cluster has, for a caller about to add one in the same transaction:
/// this first takes the cluster's row lock (a write that changes nothing; on SQLite, the
/// database's write lock), so concurrent additions count one after another and never both
/// take the last block of the pod CIDR.
pub async fn count_for_adding(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
) -> Result<i64, DbError> {
    sqlx::query("UPDATE clusters SET last_ordinal = last_ordinal WHERE id = $1")
        .bind(cluster_id)
        .execute(&mut *tx)
        .await?;
    let row = sqlx::query("SELECT COUNT(*) AS n FROM cluster_nodes WHERE cluster_id = $1")
        .bind(cluster_id)
        .fetch_one(&mut *tx)
        .await?;
    Ok(row.try_get("n")?)
}

/// The stacked etcd facet.
pub async fn insert_etcd_member(
    tx: &mut sqlx::AnyConnection,
    node_id: i64,
    server: (&str, &str),
    peer: (&str, &str),
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO etcd_members (node_id, server_cert, server_key_sealed, peer_cert, peer_key_sealed) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(node_id)
    .bind(server.0)
    .bind(server.1)
    .bind(peer.0)
    .bind(peer.1)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// The apiserver facet.
pub async fn insert_apiserver_node(
    tx: &mut sqlx::AnyConnection,
    node_id: i64,
    cert: &str,
    key_sealed: &str,
) -> Result<(), DbError> {
    sqlx::query("INSERT INTO apiserver_nodes (node_id, serving_cert, serving_key_sealed) VALUES ($1, $2, $3)")
        .bind(node_id)
        .bind(cert)
        .bind(key_sealed)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

pub async fn list<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Vec<NodeRow>, DbError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM cluster_nodes WHERE cluster_id = $1 ORDER BY ordinal"
    ))
    .bind(cluster_id)
    .fetch_all(db)
    .await?;
    Ok(rows.iter().map(from_row).collect::<Result<_, _>>()?)
}

/// Records the release the node's agent said it is at a bundle fetch, written only when it
/// changed.
pub async fn set_agent_version<'c>(
    db: impl Executor<'c, Database = Any>,
    node_id: i64,
    version: &str,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE cluster_nodes SET agent_version = $1 \
         WHERE id = $2 AND (agent_version IS NULL OR agent_version <> $1)",
    )
    .bind(version)
    .bind(node_id)
    .execute(db)
    .await?;
    Ok(())
}

/// How stale `last_seen_at` may be before a signed request writes it again: one write per node
/// per minute at most, so the hottest route (the generation poll) rarely writes at all.
pub const HEARTBEAT_EVERY: i64 = 60;

/// Whether `node`'s heartbeat needs writing at `now`.
pub fn heartbeat_due(node: &NodeRow, now: i64) -> bool {
    node.last_seen_at
        .is_none_or(|seen| now - seen >= HEARTBEAT_EVERY)
}

/// Records that the node's agent was seen at `now` (a signed request of its own).
pub async fn seen<'c>(
    db: impl Executor<'c, Database = Any>,
    node_id: i64,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE cluster_nodes SET last_seen_at = $1 \
         WHERE id = $2 AND (last_seen_at IS NULL OR last_seen_at < $1)",
    )
    .bind(now)
    .bind(node_id)
    .execute(db)
    .await?;
    Ok(())
}

/// Records what the compute API says of the node's VM: `state` None while it runs (clearing
/// the time it went down), else `gone` or its state, kept with when a pass first saw it down.
pub async fn set_vm_state<'c>(
    db: impl Executor<'c, Database = Any>,
    node_id: i64,
    state: Option<&str>,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE cluster_nodes SET vm_state = $1, \
         vm_down_since = CASE WHEN $2 = 0 THEN NULL ELSE COALESCE(vm_down_since, $3) END \
         WHERE id = $4",
    )
    .bind(state)
    .bind(i64::from(state.is_some()))
    .bind(now)
    .bind(node_id)
    .execute(db)
    .await?;
    Ok(())
}

/// The node a VM is, if it belongs to any cluster.
pub async fn find_by_vm<'c>(
    db: impl Executor<'c, Database = Any>,
    vm_id: i64,
) -> Result<Option<NodeRow>, DbError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM cluster_nodes WHERE vm_id = $1"
    ))
    .bind(vm_id)
    .fetch_optional(db)
    .await?;
    Ok(row.as_ref().map(from_row).transpose()?)
}

/// A node's columns as `n.<column>` and its cluster's as [`clusters::joined_columns`] gives
/// them, for a statement that joins `clusters c ON c.id = n.cluster_id` (a node's cluster always
/// exists: the foreign key cascades). Every request a node makes reads both; read them back
/// with [`with_cluster_from_row`].
pub(super) fn with_cluster_columns() -> String {
    format!("{}, {}", prefixed_columns(), clusters::joined_columns())
}

/// The node's columns as `n.<column>`.
fn prefixed_columns() -> String {
    COLUMNS
        .split(", ")
        .map(|c| format!("n.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The node and cluster of a row selected with [`with_cluster_columns`]; `None` when an outer
/// join found no node.
pub(super) fn with_cluster_from_row(
    row: &sqlx::any::AnyRow,
) -> Result<Option<(NodeRow, ClusterRow)>, sqlx::Error> {
    if row.try_get::<Option<i64>, _>("id")?.is_none() {
        return Ok(None);
    }
    Ok(Some((
        from_row(row)?,
        clusters::from_row_named(row, &clusters::JOINED)?,
    )))
}

/// A node's stored serving certificates (keys sealed).
#[derive(Debug, Clone)]
pub struct ServingRow {
    pub etcd_server_cert: String,
    pub etcd_server_key_sealed: String,
    pub etcd_peer_cert: String,
    pub etcd_peer_key_sealed: String,
    pub apiserver_cert: String,
    pub apiserver_key_sealed: String,
}

/// What a control-plane node's bundle reads of its cluster, in one statement: the cluster's
/// nodes by ordinal, the node's serving certificates (`None` when either facet is missing) and
/// the cluster's CA and service-account key rotations in progress.
pub struct ControlPlaneView {
    pub nodes: Vec<NodeRow>,
    pub serving: Option<ServingRow>,
    pub rotation: Option<super::rotations::Rotation>,
    pub sa_rotation: Option<super::sa_rotations::SaRotation>,
}

/// Reads [`ControlPlaneView`] for node `node_id` of cluster `cluster_id`. Only `node_id`'s row
/// is joined to its serving certificates and the cluster's rotation, so a large cluster's rows
/// do not each carry the rotation's certificate and sealed key.
pub async fn control_plane_view<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    node_id: i64,
) -> Result<ControlPlaneView, DbError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {}, {}, {}, \
             e.server_cert AS server_cert, e.server_key_sealed AS server_key_sealed, \
             e.peer_cert AS peer_cert, e.peer_key_sealed AS peer_key_sealed, \
             a.serving_cert AS serving_cert, a.serving_key_sealed AS serving_key_sealed \
             FROM cluster_nodes n \
             LEFT JOIN ca_rotations r ON r.cluster_id = n.cluster_id AND n.id = $2 \
             LEFT JOIN sa_key_rotations s ON s.cluster_id = n.cluster_id AND n.id = $2 \
             LEFT JOIN etcd_members e ON e.node_id = n.id AND n.id = $2 \
             LEFT JOIN apiserver_nodes a ON a.node_id = n.id AND n.id = $2 \
             WHERE n.cluster_id = $1 ORDER BY n.ordinal",
            prefixed_columns(),
            rotations::prefixed_columns(),
            sa_rotations::prefixed_columns()
        )
    });
    let rows = sqlx::query(&SQL)
        .bind(cluster_id)
        .bind(node_id)
        .fetch_all(db)
        .await?;
    let (mut serving, mut rotation, mut sa_rotation) = (None, None, None);
    for r in &rows {
        if r.try_get::<Option<i64>, _>(rotations::PREFIXED[0])?
            .is_some()
        {
            rotation = Some(rotations::rotation_row_named(r, &rotations::PREFIXED)?);
        }
        if r.try_get::<Option<i64>, _>(sa_rotations::PREFIXED[0])?
            .is_some()
        {
            sa_rotation = Some(sa_rotations::from_row_named(r, &sa_rotations::PREFIXED)?);
        }
        let etcd: Option<String> = r.try_get("server_cert")?;
        let apiserver: Option<String> = r.try_get("serving_cert")?;
        if let (Some(etcd_server_cert), Some(apiserver_cert)) = (etcd, apiserver) {
            serving = Some(ServingRow {
                etcd_server_cert,
                etcd_server_key_sealed: r.try_get("server_key_sealed")?,
                etcd_peer_cert: r.try_get("peer_cert")?,
                etcd_peer_key_sealed: r.try_get("peer_key_sealed")?,
                apiserver_cert,
                apiserver_key_sealed: r.try_get("serving_key_sealed")?,
            });
        }
    }
    Ok(ControlPlaneView {
        nodes: rows.iter().map(from_row).collect::<Result<_, _>>()?,
        serving,
        rotation,
        sa_rotation,
    })
}
