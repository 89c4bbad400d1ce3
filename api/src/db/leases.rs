//! The leases that let one API process at a time move a change on: a cluster's control-plane
//! membership (`clusters.membership_lease_*`) or a node pool (`node_pools.lease_*`). A lease is
//! taken when free or expired, renewed and released only by its holder.

use sqlx::{Any, Executor};

use super::DbError;

/// What a lease guards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Leased {
    /// Cluster `id`'s control-plane membership changes.
    Membership(i64),
    /// Node pool `id`'s convergence.
    Pool(i64),
}

/// (table, until column, holder column, row id): fixed names, never input.
fn columns(what: Leased) -> (&'static str, &'static str, &'static str, i64) {
    match what {
        Leased::Membership(id) => (
            "clusters",
            "membership_lease_until",
            "membership_lease_holder",
            id,
        ),
        Leased::Pool(id) => ("node_pools", "lease_until", "lease_holder", id),
    }
}

/// Takes the lease for `holder` until `until` when nobody holds it or its holder's expired by
/// `now`; false when another holds it.
pub async fn claim<'c>(
    db: impl Executor<'c, Database = Any>,
    what: Leased,
    holder: &str,
    now: i64,
    until: i64,
) -> Result<bool, DbError> {
    let (table, until_col, holder_col, id) = columns(what);
    let done = sqlx::query(&format!(
        "UPDATE {table} SET {until_col} = $1, {holder_col} = $2 WHERE id = $3 \
         AND ({until_col} IS NULL OR {until_col} < $4)"
    ))
    .bind(until)
    .bind(holder)
    .bind(id)
    .bind(now)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Extends `holder`'s lease to `until`; false when it no longer holds it.
pub async fn renew<'c>(
    db: impl Executor<'c, Database = Any>,
    what: Leased,
    holder: &str,
    until: i64,
) -> Result<bool, DbError> {
    let (table, until_col, holder_col, id) = columns(what);
    let done = sqlx::query(&format!(
        "UPDATE {table} SET {until_col} = $1 WHERE id = $2 AND {holder_col} = $3 \
         AND {until_col} IS NOT NULL"
    ))
    .bind(until)
    .bind(id)
    .bind(holder)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Gives `holder`'s lease back, recording how the change ended: a membership change keeps its
/// last error unless a new one is given, a pool records `error` as its last (`None`: it
/// converged).
pub async fn release<'c>(
    db: impl Executor<'c, Database = Any>,
    what: Leased,
    holder: &str,
    error: Option<&str>,
) -> Result<(), DbError> {
    let (table, until_col, holder_col, id) = columns(what);
    let error_set = match what {
        Leased::Membership(_) => "membership_error = COALESCE($1, membership_error)",
        Leased::Pool(_) => "last_error = $1",
    };
    sqlx::query(&format!(
        "UPDATE {table} SET {until_col} = NULL, {holder_col} = NULL, {error_set} \
         WHERE id = $2 AND {holder_col} = $3"
    ))
    .bind(error)
    .bind(id)
    .bind(holder)
    .execute(db)
    .await?;
    Ok(())
}
