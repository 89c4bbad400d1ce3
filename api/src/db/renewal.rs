//! The writes certificate renewal makes: which clusters to look at, a node's next generation
//! when it is not already moving, and a node's re-minted serving certificates.

use sqlx::{Any, Executor, Row};

use super::DbError;

/// Ids of at most `limit` founded clusters with an id above `after`, in id order, each with
/// its `certificates_version`: one page of a renewal pass.
pub async fn founded_page<'c>(
    db: impl Executor<'c, Database = Any>,
    after: i64,
    limit: i64,
) -> Result<Vec<(i64, i64)>, DbError> {
    let rows = sqlx::query(
        "SELECT id, certificates_version FROM clusters WHERE phase = 'founded' AND id > $1 \
         ORDER BY id LIMIT $2",
    )
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows
        .iter()
        .map(|r| Ok((r.try_get("id")?, r.try_get("certificates_version")?)))
        .collect::<Result<_, sqlx::Error>>()?)
}

/// Gives one node its next desired generation, only when it runs its desired one (nothing
/// pending or in flight). The new desired generation, or `None` when the node was moving.
pub async fn bump_idle_node(
    tx: &mut sqlx::AnyConnection,
    node_id: i64,
) -> Result<Option<i64>, DbError> {
    let row = sqlx::query(
        "UPDATE cluster_nodes SET desired_generation = desired_generation + 1 \
         WHERE id = $1 AND desired_generation = applied_generation \
         RETURNING desired_generation",
    )
    .bind(node_id)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(row.map(|r| r.try_get("desired_generation")).transpose()?)
}

/// A node's serving certificates, re-minted: `(cert, sealed key)` each.
#[derive(Debug, Clone, Copy)]
pub struct ServingRows<'a> {
    pub apiserver: (&'a str, &'a str),
    pub etcd_server: (&'a str, &'a str),
    pub etcd_peer: (&'a str, &'a str),
}

/// Replaces a node's stored serving certificates.
pub async fn replace_serving(
    tx: &mut sqlx::AnyConnection,
    node_id: i64,
    serving: &ServingRows<'_>,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE etcd_members SET server_cert = $1, server_key_sealed = $2, peer_cert = $3, \
         peer_key_sealed = $4 WHERE node_id = $5",
    )
    .bind(serving.etcd_server.0)
    .bind(serving.etcd_server.1)
    .bind(serving.etcd_peer.0)
    .bind(serving.etcd_peer.1)
    .bind(node_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE apiserver_nodes SET serving_cert = $1, serving_key_sealed = $2 WHERE node_id = $3",
    )
    .bind(serving.apiserver.0)
    .bind(serving.apiserver.1)
    .bind(node_id)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
