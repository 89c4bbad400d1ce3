//! Whether the database can take writes, for `/readyz`. A `SELECT 1` answers happily from a
//! database whose disk is full; only a write tells. Each check upserts this process's row of
//! `readiness_probe` with fresh random content about the size of one founding's records, in
//! its own transaction, and commits. A commit that failed anywhere in the process in the last
//! few seconds also counts: the probe's small write can still fit where a founding does not.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Db, DbError};

/// Roughly one founding's rows (sealed keys and certificates).
const PROBE_BYTES: usize = 32 * 1024;
/// How long a failed commit keeps the service unready.
const FAILURE_MEMORY: Duration = Duration::from_secs(5);
/// Probe rows of processes gone this long are removed.
const STALE_SECS: i64 = 24 * 3600;

/// When a write last failed for want of storage or connection, in this process.
#[derive(Debug, Default)]
pub(super) struct WriteHealth {
    failed_at: Mutex<Option<Instant>>,
}

impl WriteHealth {
    pub(super) fn record_failure(&self) {
        *self
            .failed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
    }

    fn recent_failure(&self) -> Option<Duration> {
        let failed_at = *self
            .failed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        failed_at
            .map(|at| at.elapsed())
            .filter(|ago| *ago < FAILURE_MEMORY)
    }
}

pub(super) async fn check(db: &Db) -> Result<(), DbError> {
    let mut noise = [0u8; PROBE_BYTES / 2];
    getrandom::fill(&mut noise).map_err(|_| DbError::Random)?;
    let payload = hex::encode(noise);
    let now = super::now();
    let mut tx = db.begin().await?;
    sqlx::query(
        "INSERT INTO readiness_probe (id, payload, checked_at) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET payload = excluded.payload, checked_at = excluded.checked_at",
    )
    .bind(db.instance)
    .bind(&payload)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM readiness_probe WHERE checked_at < $1")
        .bind(now - STALE_SECS)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    match db.health.recent_failure() {
        Some(ago) => Err(DbError::WritesFailing { ago }),
        None => Ok(()),
    }
}
