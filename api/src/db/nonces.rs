//! `node_request_nonces`: the nonce of each signed day-2 request, remembered until no timestamp
//! that could carry it is accepted any more, so a replayed request is refused. Taking one is
//! one statement outside any transaction (the agents' polls all pass here); expired rows are
//! forgotten by the reconciler's sweep ([`prune`]), or replaced when the same nonce comes back.

use sqlx::{Any, Executor};

use super::DbError;

/// Remembers node `node_id`'s request nonce until `expires_at`; false when the node used it
/// before and it has not expired by `now` (a replay).
pub async fn remember<'c>(
    db: impl Executor<'c, Database = Any>,
    node_id: i64,
    nonce: &str,
    expires_at: i64,
    now: i64,
) -> Result<bool, DbError> {
    let taken = sqlx::query(
        "INSERT INTO node_request_nonces (node_id, nonce, expires_at) VALUES ($1, $2, $3) \
         ON CONFLICT (node_id, nonce) DO UPDATE SET expires_at = excluded.expires_at \
         WHERE node_request_nonces.expires_at < $4",
    )
    .bind(node_id)
    .bind(nonce)
    .bind(expires_at)
    .bind(now)
    .execute(db)
    .await?;
    Ok(taken.rows_affected() == 1)
}

/// Forgets every nonce expired by `now`; returns how many.
pub async fn prune<'c>(db: impl Executor<'c, Database = Any>, now: i64) -> Result<u64, DbError> {
    let done = sqlx::query("DELETE FROM node_request_nonces WHERE expires_at < $1")
        .bind(now)
        .execute(db)
        .await?;
    Ok(done.rows_affected())
}
