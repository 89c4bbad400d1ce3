//! `idempotency_keys`: a retried `POST /clusters` with the same `Idempotency-Key` and body gets
//! the first response; another body under the same key is refused (422); a retry while the first
//! is still running is refused (409). Stored responses are sealed (they hold a kubeconfig).

use sqlx::{Any, Executor, Row};

use super::DbError;

/// An in-flight claim older than this is considered abandoned by a crashed process.
pub const ABANDONED_AFTER_SECS: i64 = 900;

#[derive(Debug)]
pub enum Claim {
    /// This request owns the key now.
    New,
    /// The same key was used with a different body.
    Mismatch,
    /// The first request with this key is still running.
    InFlight,
    /// The first request finished: replay its response.
    Done {
        status: u16,
        response_sealed: String,
    },
}

pub async fn claim(
    tx: &mut sqlx::AnyConnection,
    org_id: i64,
    key: &str,
    request_sha256: &str,
    now: i64,
) -> Result<Claim, DbError> {
    sqlx::query("DELETE FROM idempotency_keys WHERE org_id = $1 AND idem_key = $2 AND state = 'in_flight' AND created_at < $3")
        .bind(org_id)
        .bind(key)
        .bind(now - ABANDONED_AFTER_SECS)
        .execute(&mut *tx)
        .await?;
    let inserted = sqlx::query(
        "INSERT INTO idempotency_keys (org_id, idem_key, request_sha256, state, created_at) \
         VALUES ($1, $2, $3, 'in_flight', $4) ON CONFLICT (org_id, idem_key) DO NOTHING",
    )
    .bind(org_id)
    .bind(key)
    .bind(request_sha256)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 1 {
        return Ok(Claim::New);
    }
    let row = sqlx::query(
        "SELECT request_sha256, state, status_code, response_sealed FROM idempotency_keys \
         WHERE org_id = $1 AND idem_key = $2",
    )
    .bind(org_id)
    .bind(key)
    .fetch_one(&mut *tx)
    .await?;
    let stored_hash: String = row.try_get("request_sha256")?;
    if stored_hash != request_sha256 {
        return Ok(Claim::Mismatch);
    }
    let state: String = row.try_get("state")?;
    let status: Option<i64> = row.try_get("status_code")?;
    let response: Option<String> = row.try_get("response_sealed")?;
    match (state.as_str(), status, response) {
        ("done", Some(status), Some(response_sealed)) => Ok(Claim::Done {
            status: u16::try_from(status).unwrap_or(500),
            response_sealed,
        }),
        _ => Ok(Claim::InFlight),
    }
}

/// How a claim ends.
#[derive(Debug)]
pub enum Ending {
    /// The answer is final: a retry replays it.
    Done {
        status: u16,
        response_sealed: String,
    },
    /// The request failed in a way a retry may fix (database down): forget the claim.
    Released,
}

/// Ends the claim made at `claimed_at` — only that one, and only while it is still in flight, so
/// a late ending never touches a later claim of the key. Returns whether it was still there.
pub async fn end<'c>(
    db: impl Executor<'c, Database = Any>,
    org_id: i64,
    key: &str,
    claimed_at: i64,
    ending: &Ending,
) -> Result<bool, DbError> {
    let done = match ending {
        Ending::Done {
            status,
            response_sealed,
        } => sqlx::query(
            "UPDATE idempotency_keys SET state = 'done', status_code = $1, response_sealed = $2 \
             WHERE org_id = $3 AND idem_key = $4 AND created_at = $5 AND state = 'in_flight'",
        )
        .bind(i64::from(*status))
        .bind(response_sealed.as_str())
        .bind(org_id)
        .bind(key)
        .bind(claimed_at),
        Ending::Released => sqlx::query(
            "DELETE FROM idempotency_keys \
             WHERE org_id = $1 AND idem_key = $2 AND created_at = $3 AND state = 'in_flight'",
        )
        .bind(org_id)
        .bind(key)
        .bind(claimed_at),
    }
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Forgets keys claimed before `before` (answered or abandoned): a retry after that runs anew, as
/// with every idempotency-key API that keeps keys for a day. Returns how many.
pub async fn prune<'c>(db: impl Executor<'c, Database = Any>, before: i64) -> Result<u64, DbError> {
    let done = sqlx::query("DELETE FROM idempotency_keys WHERE created_at < $1")
        .bind(before)
        .execute(db)
        .await?;
    Ok(done.rows_affected())
}
