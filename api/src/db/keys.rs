//! The key pool's demand: for each RSA cluster that is being founded or runs, how many of its
//! nodes (by role) have not yet been handed their desired generation — each will soon ask for a
//! bundle, and each bundle takes fresh leaf keys. Nodes being removed ask for nothing more.

use exk8s_common::contract::Role;
use sqlx::{Any, Executor, Row as _};

use super::DbError;
use super::phase::decode;

/// Nodes of one cluster and role that will ask for a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingBundles {
    pub cluster_id: i64,
    /// The cluster's stored key algorithm (`rsa-2048`, …).
    pub key_algorithm: String,
    pub role: Role,
    pub nodes: i64,
}

const SELECT: &str = "SELECT n.cluster_id, c.key_algorithm, n.role, COUNT(*) AS nodes \
     FROM cluster_nodes n JOIN clusters c ON c.id = n.cluster_id \
     WHERE n.handed_generation < n.desired_generation AND n.removal IS NULL \
       AND c.phase IN ('provisioning', 'founded') AND c.key_algorithm LIKE 'rsa-%'";
const GROUP: &str = " GROUP BY n.cluster_id, c.key_algorithm, n.role";

/// Every RSA cluster's pending bundles.
pub async fn pending<'c>(
    db: impl Executor<'c, Database = Any>,
) -> Result<Vec<PendingBundles>, DbError> {
    let rows = sqlx::query(&format!("{SELECT}{GROUP}"))
        .fetch_all(db)
        .await?;
    rows.iter().map(row).collect()
}

/// One cluster's pending bundles (none unless it is an RSA cluster).
pub async fn pending_in<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Vec<PendingBundles>, DbError> {
    let rows = sqlx::query(&format!("{SELECT} AND n.cluster_id = $1{GROUP}"))
        .bind(cluster_id)
        .fetch_all(db)
        .await?;
    rows.iter().map(row).collect()
}

fn row(r: &sqlx::any::AnyRow) -> Result<PendingBundles, DbError> {
    Ok(PendingBundles {
        cluster_id: r.try_get("cluster_id")?,
        key_algorithm: r.try_get("key_algorithm")?,
        role: decode(r, "role")?,
        nodes: r.try_get("nodes")?,
    })
}
