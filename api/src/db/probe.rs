//! Whether the database can take writes, for `/readyz`. A `SELECT 1` answers happily from a
//! database whose disk is full; only a write tells. Each check upserts this process's row of
//! `readiness_probe` with a page of fresh random content, in its own transaction, and commits.
//! A commit that failed anywhere in the process in the last few seconds also counts: the
//! probe's small write can still fit where a founding does not. A failed probe is itself
//! recorded, so pooled connections opened before it are replaced.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Db, DbError};

/// A page of fresh content: small, so frequent probes do not fill the log they check.
const PROBE_BYTES: usize = 4 * 1024;
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
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.failed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Passes `e` through, remembering it when it says the database cannot take writes now.
    pub(super) fn observe(&self, e: DbError) -> DbError {
        if matches!(e, DbError::Unavailable(_)) {
            *self.slot() = Some(Instant::now());
        }
        e
    }

    /// Whether a failure was recorded after a connection of age `age` was opened.
    pub(super) fn failed_since_open(&self, age: Duration) -> bool {
        self.slot().is_some_and(|at| at.elapsed() < age)
    }

    fn recent_failure(&self) -> Option<Duration> {
        self.slot()
            .map(|at| at.elapsed())
            .filter(|ago| *ago < FAILURE_MEMORY)
    }
}

pub(super) async fn check(db: &Db) -> Result<(), DbError> {
    write_probe(db).await.map_err(|e| db.health.observe(e))?;
    match db.health.recent_failure() {
        Some(ago) => Err(DbError::WritesFailing { ago }),
        None => Ok(()),
    }
}

async fn write_probe(db: &Db) -> Result<(), DbError> {
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
    tx.commit().await
}
