//! The schema: this binary's migrations, applied at start, and whether it may run against a
//! schema a newer binary has migrated — the rolling deploy of docs/upgrading-exk8s.md
//! ("Migrations"), where old and new API processes serve side by side on one PostgreSQL.
//!
//! A binary ignores applied migrations newer than its own: the release policy keeps each
//! migration additive for the previous release. One that cannot be raises the floor in
//! `schema_compatibility` (migration 0035), and a binary older than the floor refuses to start
//! with both versions named, instead of failing on a query later.

use std::time::Duration;

use sqlx::Row as _;
use sqlx::migrate::{MigrateError, Migrator};

use super::{Backend, Db, DbError};

/// How long [`Db::migrate`] waits for a database that does not answer before it gives up.
const MIGRATE_WAIT: Duration = Duration::from_secs(60);

/// This binary's migrations for `backend`.
fn migrator(backend: Backend) -> Migrator {
    let mut migrator = match backend {
        Backend::Sqlite => sqlx::migrate!("../migrations/sqlite"),
        Backend::Postgres => sqlx::migrate!("../migrations/postgres"),
    };
    // Migrations a newer binary applied belong to a release that keeps them additive for this
    // one (or raises the floor checked below).
    migrator.set_ignore_missing(true);
    migrator
}

/// The newest migration this binary knows.
pub fn newest_known(backend: Backend) -> i64 {
    migrator(backend)
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap_or(0)
}

impl Db {
    /// Applies the dialect's migrations, waiting up to [`MIGRATE_WAIT`] for a database that
    /// does not answer yet — one starting beside this process, or a disk so busy that opening a
    /// connection outlasts the pool's acquire timeout — and saying so each second it waits. Each
    /// migration is its own transaction, so a try cut short is taken up where it stopped.
    /// Then checks that this binary may run against the schema (the module's doc).
    pub async fn migrate(&self) -> Result<(), DbError> {
        let deadline = std::time::Instant::now() + MIGRATE_WAIT;
        loop {
            match self.migrate_once().await {
                Err(DbError::Unavailable(e)) if std::time::Instant::now() < deadline => {
                    tracing::warn!(error = %crate::error_chain(&e), "the database does not answer yet: the migrations wait for it");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => return Err(e),
                Ok(()) => break,
            }
        }
        self.check_compatible().await
    }

    async fn migrate_once(&self) -> Result<(), DbError> {
        migrator(self.backend)
            .run(&self.pool)
            .await
            .map_err(|e| match e {
                MigrateError::Execute(inner) => match DbError::from(inner) {
                    DbError::Unavailable(inner) => DbError::Unavailable(inner),
                    DbError::Query(inner) => DbError::Migrate(MigrateError::Execute(inner)),
                    other => other,
                },
                other => DbError::Migrate(other),
            })
    }

    /// Refuses a schema whose floor is past this binary; says so when a newer binary's
    /// migrations are applied that this one runs beside.
    async fn check_compatible(&self) -> Result<(), DbError> {
        let knows = newest_known(self.backend);
        let needs: i64 = sqlx::query(
            "SELECT CAST(oldest_binary_migration AS BIGINT) AS v FROM schema_compatibility WHERE id = 1",
        )
        .fetch_one(&self.pool)
        .await?
        .try_get("v")?;
        if needs > knows {
            return Err(DbError::SchemaTooNew { needs, knows });
        }
        let applied: i64 = sqlx::query(
            "SELECT CAST(COALESCE(MAX(version), 0) AS BIGINT) AS v FROM _sqlx_migrations WHERE success",
        )
        .fetch_one(&self.pool)
        .await?
        .try_get("v")?;
        if applied > knows {
            tracing::warn!(
                applied,
                knows,
                "a newer exk8s-api migrated this database: this binary runs beside it (a rolling deploy); finish the deploy"
            );
        }
        Ok(())
    }
}
