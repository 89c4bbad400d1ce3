//! `api_tokens` (principal tokens, by SHA-256) and `imds_tokens` (the table the instance-metadata
//! service writes: session token hash → vm and org).

use sqlx::{Any, Executor, Row};

use super::DbError;
use crate::tokens::Scope;

/// A principal token's record.
#[derive(Debug, Clone)]
pub struct ApiToken {
    pub id: i64,
    pub org_id: i64,
    pub principal: String,
    pub scope: Scope,
    pub expires_at: i64,
    pub revoked: bool,
    pub created_at: i64,
}

fn api_token(row: &sqlx::any::AnyRow) -> Result<ApiToken, sqlx::Error> {
    let scope: String = row.try_get("scope")?;
    Ok(ApiToken {
        id: row.try_get("id")?,
        org_id: row.try_get("org_id")?,
        principal: row.try_get("principal")?,
        scope: Scope::parse(&scope)
            .ok_or_else(|| sqlx::Error::Decode(format!("scope {scope}").into()))?,
        expires_at: row.try_get("expires_at")?,
        revoked: row.try_get::<i64, _>("revoked")? != 0,
        created_at: row.try_get("created_at")?,
    })
}

const COLUMNS: &str = "id, org_id, principal, scope, expires_at, revoked, created_at";

pub async fn insert_api_token<'c>(
    db: impl Executor<'c, Database = Any>,
    token_hash: &str,
    org_id: i64,
    principal: &str,
    scope: Scope,
    created_at: i64,
    expires_at: i64,
) -> Result<i64, DbError> {
    let row = sqlx::query(
        "INSERT INTO api_tokens (token_hash, org_id, principal, scope, created_at, expires_at, revoked) \
         VALUES ($1, $2, $3, $4, $5, $6, 0) RETURNING id",
    )
    .bind(token_hash)
    .bind(org_id)
    .bind(principal)
    .bind(scope.as_str())
    .bind(created_at)
    .bind(expires_at)
    .fetch_one(db)
    .await?;
    Ok(row.try_get("id")?)
}

pub async fn find_api_token<'c>(
    db: impl Executor<'c, Database = Any>,
    token_hash: &str,
) -> Result<Option<ApiToken>, DbError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM api_tokens WHERE token_hash = $1"
    ))
    .bind(token_hash)
    .fetch_optional(db)
    .await?;
    Ok(row.as_ref().map(api_token).transpose()?)
}

pub async fn list_api_tokens<'c>(
    db: impl Executor<'c, Database = Any>,
) -> Result<Vec<ApiToken>, DbError> {
    let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM api_tokens ORDER BY id"))
        .fetch_all(db)
        .await?;
    Ok(rows.iter().map(api_token).collect::<Result<_, _>>()?)
}

/// Revokes a token; false when no such token exists.
pub async fn revoke_api_token<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query("UPDATE api_tokens SET revoked = 1 WHERE id = $1")
        .bind(id)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// An IMDS session token's record.
#[derive(Debug, Clone)]
pub struct ImdsToken {
    pub vm_id: i64,
    pub org_id: i64,
    pub expires_at: i64,
}

pub async fn insert_imds_token<'c>(
    db: impl Executor<'c, Database = Any>,
    token_hash: &str,
    vm_id: i64,
    org_id: i64,
    created_at: i64,
    expires_at: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO imds_tokens (token_hash, vm_id, org_id, created_at, expires_at) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(token_hash)
    .bind(vm_id)
    .bind(org_id)
    .bind(created_at)
    .bind(expires_at)
    .execute(db)
    .await?;
    Ok(())
}

/// Both credentials of a bootstrap request, in one statement: the IMDS session `imds_hash`
/// names and the principal token `bearer_hash` names, each `None` when unknown. Issuance's
/// busiest path reads them together; the caller still judges them in its own order.
pub async fn find_bootstrap_pair<'c>(
    db: impl Executor<'c, Database = Any>,
    imds_hash: &str,
    bearer_hash: &str,
) -> Result<(Option<ImdsToken>, Option<ApiToken>), DbError> {
    // Both hashes are unique, so the one-row anchor yields exactly one row.
    let row = sqlx::query(
        "SELECT i.vm_id AS imds_vm_id, i.org_id AS imds_org_id, i.expires_at AS imds_expires_at, \
         t.id AS id, t.org_id AS org_id, t.principal AS principal, t.scope AS scope, \
         t.expires_at AS expires_at, t.revoked AS revoked, t.created_at AS created_at \
         FROM (SELECT 1 AS anchor) q \
         LEFT JOIN imds_tokens i ON i.token_hash = $1 \
         LEFT JOIN api_tokens t ON t.token_hash = $2",
    )
    .bind(imds_hash)
    .bind(bearer_hash)
    .fetch_one(db)
    .await?;
    let session = match row.try_get::<Option<i64>, _>("imds_vm_id")? {
        Some(vm_id) => Some(ImdsToken {
            vm_id,
            org_id: row.try_get("imds_org_id")?,
            expires_at: row.try_get("imds_expires_at")?,
        }),
        None => None,
    };
    let principal = match row.try_get::<Option<i64>, _>("id")? {
        Some(_) => Some(api_token(&row)?),
        None => None,
    };
    Ok((session, principal))
}

pub async fn find_imds_token<'c>(
    db: impl Executor<'c, Database = Any>,
    token_hash: &str,
) -> Result<Option<ImdsToken>, DbError> {
    let row =
        sqlx::query("SELECT vm_id, org_id, expires_at FROM imds_tokens WHERE token_hash = $1")
            .bind(token_hash)
            .fetch_optional(db)
            .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(ImdsToken {
        vm_id: row.try_get("vm_id")?,
        org_id: row.try_get("org_id")?,
        expires_at: row.try_get("expires_at")?,
    }))
}
