//! `cluster_nodes` and its two control-plane facets: `etcd_members` (the stacked etcd member's
//! serving and peer certificates) and `apiserver_nodes` (the apiserver serving certificate).

use sqlx::{Any, Executor, Row};

use super::DbError;

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
    pub phase: String,
}

const COLUMNS: &str = "id, cluster_id, ordinal, vm_id, node_name, private_ipv4, private_ipv6, public_ipv4, \
    is_initial, serial, issuance_allowed, phase";

fn from_row(r: &sqlx::any::AnyRow) -> Result<NodeRow, sqlx::Error> {
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
        phase: r.try_get("phase")?,
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
}

pub async fn insert(
    tx: &mut sqlx::AnyConnection,
    node: &NewNode<'_>,
    now: i64,
) -> Result<i64, DbError> {
    let row = sqlx::query(
        "INSERT INTO cluster_nodes (cluster_id, ordinal, vm_id, node_name, private_ipv4, private_ipv6, \
         public_ipv4, is_initial, serial, issuance_allowed, phase, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0, 1, 'pending', $9) RETURNING id",
    )
    .bind(node.cluster_id)
    .bind(node.ordinal)
    .bind(node.vm_id)
    .bind(node.node_name)
    .bind(node.private_ipv4)
    .bind(node.private_ipv6)
    .bind(node.public_ipv4)
    .bind(i64::from(node.is_initial))
    .bind(now)
    .fetch_one(&mut *tx)
    .await?;
    Ok(row.try_get("id")?)
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

pub async fn serving<'c>(
    db: impl Executor<'c, Database = Any>,
    node_id: i64,
) -> Result<Option<ServingRow>, DbError> {
    let row = sqlx::query(
        "SELECT e.server_cert, e.server_key_sealed, e.peer_cert, e.peer_key_sealed, a.serving_cert, a.serving_key_sealed \
         FROM etcd_members e JOIN apiserver_nodes a ON a.node_id = e.node_id WHERE e.node_id = $1",
    )
    .bind(node_id)
    .fetch_optional(db)
    .await?;
    let Some(r) = row else { return Ok(None) };
    Ok(Some(ServingRow {
        etcd_server_cert: r.try_get("server_cert")?,
        etcd_server_key_sealed: r.try_get("server_key_sealed")?,
        etcd_peer_cert: r.try_get("peer_cert")?,
        etcd_peer_key_sealed: r.try_get("peer_key_sealed")?,
        apiserver_cert: r.try_get("serving_cert")?,
        apiserver_key_sealed: r.try_get("serving_key_sealed")?,
    }))
}

/// Takes the next serial for an issuance, in the caller's transaction. Refuses (None) when the
/// node may not be issued a bundle now; an issuance to a `complete` node consumes its re-arm.
pub async fn take_serial(
    tx: &mut sqlx::AnyConnection,
    node_id: i64,
) -> Result<Option<i64>, DbError> {
    let row = sqlx::query(
        "UPDATE cluster_nodes SET serial = serial + 1, \
         issuance_allowed = CASE WHEN phase = 'complete' THEN 0 ELSE issuance_allowed END \
         WHERE id = $1 AND issuance_allowed = 1 RETURNING serial",
    )
    .bind(node_id)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(row.map(|r| r.try_get("serial")).transpose()?)
}

/// Records a node's reported phase; `complete` closes issuance until an operator re-arms.
pub async fn set_phase<'c>(
    db: impl Executor<'c, Database = Any>,
    node_id: i64,
    phase: &str,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE cluster_nodes SET phase = $1, \
         issuance_allowed = CASE WHEN $1 = 'complete' THEN 0 ELSE issuance_allowed END WHERE id = $2",
    )
    .bind(phase)
    .bind(node_id)
    .execute(db)
    .await?;
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
