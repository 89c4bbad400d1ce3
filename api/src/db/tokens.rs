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

/// The names a statement gives a principal token's columns.
struct ApiTokenNames {
    id: &'static str,
    org_id: &'static str,
    principal: &'static str,
    scope: &'static str,
    expires_at: &'static str,
    revoked: &'static str,
    created_at: &'static str,
}

const PLAIN: ApiTokenNames = ApiTokenNames {
    id: "id",
    org_id: "org_id",
    principal: "principal",
    scope: "scope",
    expires_at: "expires_at",
    revoked: "revoked",
    created_at: "created_at",
};

/// The names [`JOINED_COLUMNS`] gives, apart from any other table's.
const JOINED: ApiTokenNames = ApiTokenNames {
    id: "principal_id",
    org_id: "principal_org_id",
    principal: "principal_name",
    scope: "principal_scope",
    expires_at: "principal_expires_at",
    revoked: "principal_revoked",
    created_at: "principal_created_at",
};

/// A principal token's columns as `t.<column>`, named as [`JOINED`] says.
pub(super) const JOINED_COLUMNS: &str = "t.id AS principal_id, t.org_id AS principal_org_id, \
    t.principal AS principal_name, t.scope AS principal_scope, t.expires_at AS principal_expires_at, \
    t.revoked AS principal_revoked, t.created_at AS principal_created_at";

fn api_token(row: &sqlx::any::AnyRow) -> Result<ApiToken, sqlx::Error> {
    api_token_named(row, &PLAIN)
}

/// The principal token of a row selected with [`JOINED_COLUMNS`]; `None` when an outer join
/// found none.
pub(super) fn joined_api_token(row: &sqlx::any::AnyRow) -> Result<Option<ApiToken>, sqlx::Error> {
    match row.try_get::<Option<i64>, _>(JOINED.id)? {
        Some(_) => api_token_named(row, &JOINED).map(Some),
        None => Ok(None),
    }
}

fn api_token_named(
    row: &sqlx::any::AnyRow,
    names: &ApiTokenNames,
) -> Result<ApiToken, sqlx::Error> {
    let scope: String = row.try_get(names.scope)?;
    Ok(ApiToken {
        id: row.try_get(names.id)?,
        org_id: row.try_get(names.org_id)?,
        principal: row.try_get(names.principal)?,
        scope: Scope::parse(&scope)
            .ok_or_else(|| sqlx::Error::Decode(format!("scope {scope}").into()))?,
        expires_at: row.try_get(names.expires_at)?,
        revoked: row.try_get::<i64, _>(names.revoked)? != 0,
        created_at: row.try_get(names.created_at)?,
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

/// Whether token `id` still exists, is not revoked and has not expired at `now`.
pub async fn api_token_valid<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    now: i64,
) -> Result<bool, DbError> {
    let valid: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM api_tokens WHERE id = $1 AND revoked = 0 AND expires_at > $2",
    )
    .bind(id)
    .bind(now)
    .fetch_optional(db)
    .await?;
    Ok(valid.is_some())
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

/// An IMDS session token's columns as `i.<column>`, named apart from any other table's.
pub(super) const JOINED_IMDS_COLUMNS: &str =
    "i.vm_id AS imds_vm_id, i.org_id AS imds_org_id, i.expires_at AS imds_expires_at";

/// The IMDS session of a row selected with [`JOINED_IMDS_COLUMNS`]; `None` when an outer join
/// found none.
pub(super) fn joined_imds_token(row: &sqlx::any::AnyRow) -> Result<Option<ImdsToken>, sqlx::Error> {
    match row.try_get::<Option<i64>, _>("imds_vm_id")? {
        Some(vm_id) => Ok(Some(ImdsToken {
            vm_id,
            org_id: row.try_get("imds_org_id")?,
            expires_at: row.try_get("imds_expires_at")?,
        })),
        None => Ok(None),
    }
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

/// Forgets instance-metadata session tokens expired before `now` (no request can present one);
/// returns how many. Every agent run adds one, so without this the table grows forever.
pub async fn prune_imds_tokens<'c>(
    db: impl Executor<'c, Database = Any>,
    now: i64,
) -> Result<u64, DbError> {
    let done = sqlx::query("DELETE FROM imds_tokens WHERE expires_at < $1")
        .bind(now)
        .execute(db)
        .await?;
    Ok(done.rows_affected())
}
