//! The database: one code path over sqlx's `AnyPool` for SQLite (the embedded default) and
//! PostgreSQL (several API replicas). Portable SQL with `$N` placeholders; integers for time
//! and booleans. Each table's queries live in their own module and take an executor, so a
//! handler can run several in one transaction.

pub mod clusters;
pub mod idempotency;
pub mod issuances;
pub mod nodes;
pub mod resources;
pub mod tokens;

use std::time::Duration;

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{AnyPool, Executor as _};

/// Which dialect a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn of(url: &str) -> Option<Self> {
        if url.starts_with("sqlite:") {
            Some(Self::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Self::Postgres)
        } else {
            None
        }
    }
}

/// Database failures, split by what the caller should do about them.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The database did not answer (down, unreachable, pool exhausted): retry later.
    #[error("the database is unavailable")]
    Unavailable(#[source] sqlx::Error),
    #[error("database query failed")]
    Query(#[source] sqlx::Error),
    #[error("running migrations")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    #[error("unsupported database URL (expected sqlite:… or postgres://…)")]
    UnsupportedUrl,
}

impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::WorkerCrashed => Self::Unavailable(e),
            sqlx::Error::Database(ref db)
                if db
                    .code()
                    .is_some_and(|c| c.starts_with("08") || c == "57P01" || c == "57P03") =>
            {
                // PostgreSQL connection exceptions and admin shutdown.
                Self::Unavailable(e)
            }
            other => Self::Query(other),
        }
    }
}

/// The shared pool and its dialect.
#[derive(Debug, Clone)]
pub struct Db {
    pub pool: AnyPool,
    pub backend: Backend,
}

impl Db {
    /// Connects (lazily: a database that is down at start makes requests 503, not the process
    /// exit) and configures SQLite for concurrent use.
    pub fn connect(url: &str) -> Result<Self, DbError> {
        install_default_drivers();
        let backend = Backend::of(url).ok_or(DbError::UnsupportedUrl)?;
        let options = AnyPoolOptions::new()
            .max_connections(if backend == Backend::Sqlite { 8 } else { 20 })
            .acquire_timeout(Duration::from_secs(5))
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        conn.execute("PRAGMA busy_timeout = 10000").await?;
                        conn.execute("PRAGMA foreign_keys = ON").await?;
                        conn.execute("PRAGMA synchronous = NORMAL").await?;
                    }
                    Ok(())
                })
            });
        let pool = options.connect_lazy(url)?;
        Ok(Self { pool, backend })
    }

    /// Applies the dialect's migrations.
    pub async fn migrate(&self) -> Result<(), DbError> {
        let migrator = match self.backend {
            Backend::Sqlite => sqlx::migrate!("../migrations/sqlite"),
            Backend::Postgres => sqlx::migrate!("../migrations/postgres"),
        };
        migrator.run(&self.pool).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(inner) => match DbError::from(inner) {
                DbError::Unavailable(inner) => DbError::Unavailable(inner),
                DbError::Query(inner) => {
                    DbError::Migrate(sqlx::migrate::MigrateError::Execute(inner))
                }
                other => other,
            },
            other => DbError::Migrate(other),
        })
    }

    /// `SELECT 1`: is the database answering?
    pub async fn ping(&self) -> Result<(), DbError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

/// Unix seconds now.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
