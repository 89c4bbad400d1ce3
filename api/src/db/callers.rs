//! Who a node's request says it is, read in one statement: the credentials it carries and the
//! node and cluster its path names. This is the first read of every bundle fetch and of every
//! poll a fleet's agents make. The statement only gathers the records; the caller judges them,
//! in an order that reveals nothing to a caller who fails an earlier check.

use std::sync::LazyLock;

use sqlx::{Any, Executor};

use super::DbError;
use super::clusters::ClusterRow;
use super::nodes::{self, NodeRow};
use super::tokens::{self, ApiToken, ImdsToken};

/// The records a node's request names, each `None` when there is none.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// The IMDS session its token names.
    pub session: Option<ImdsToken>,
    /// The principal token its bearer names (bootstrap requests only).
    pub principal: Option<ApiToken>,
    /// The node whose VM the path names, and that node's cluster.
    pub member: Option<(NodeRow, ClusterRow)>,
}

/// A bootstrap request's records: the IMDS session `imds_hash` names, the principal token
/// `bearer_hash` names, and the node of VM `path_vm` with its cluster.
pub async fn bootstrap<'c>(
    db: impl Executor<'c, Database = Any>,
    imds_hash: &str,
    bearer_hash: &str,
    path_vm: i64,
) -> Result<Caller, DbError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {}, {}, {} FROM (SELECT 1 AS anchor) q \
             LEFT JOIN imds_tokens i ON i.token_hash = $1 \
             LEFT JOIN api_tokens t ON t.token_hash = $2 \
             LEFT JOIN cluster_nodes n ON n.vm_id = $3 \
             LEFT JOIN clusters c ON c.id = n.cluster_id",
            tokens::JOINED_IMDS_COLUMNS,
            tokens::JOINED_COLUMNS,
            nodes::with_cluster_columns()
        )
    });
    // Every join is on a unique column, so the one-row anchor yields exactly one row.
    let row = sqlx::query(&SQL)
        .bind(imds_hash)
        .bind(bearer_hash)
        .bind(path_vm)
        .fetch_one(db)
        .await?;
    Ok(Caller {
        session: tokens::joined_imds_token(&row)?,
        principal: tokens::joined_api_token(&row)?,
        member: nodes::with_cluster_from_row(&row)?,
    })
}

/// A signed day-2 request's records: the IMDS session `imds_hash` names and the node of VM
/// `path_vm` with its cluster (its registered key among the node's columns).
pub async fn signed<'c>(
    db: impl Executor<'c, Database = Any>,
    imds_hash: &str,
    path_vm: i64,
) -> Result<Caller, DbError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {}, {} FROM (SELECT 1 AS anchor) q \
             LEFT JOIN imds_tokens i ON i.token_hash = $1 \
             LEFT JOIN cluster_nodes n ON n.vm_id = $2 \
             LEFT JOIN clusters c ON c.id = n.cluster_id",
            tokens::JOINED_IMDS_COLUMNS,
            nodes::with_cluster_columns()
        )
    });
    let row = sqlx::query(&SQL)
        .bind(imds_hash)
        .bind(path_vm)
        .fetch_one(db)
        .await?;
    Ok(Caller {
        session: tokens::joined_imds_token(&row)?,
        principal: None,
        member: nodes::with_cluster_from_row(&row)?,
    })
}
