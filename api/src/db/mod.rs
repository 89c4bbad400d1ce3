//! The database: one code path over sqlx's `AnyPool` for SQLite (the embedded default) and
//! PostgreSQL (several API replicas). Portable SQL with `$N` placeholders; integers for time
//! and booleans. Each table's queries live in their own module and take an executor, so a
//! handler can run several in one transaction.

pub mod callers;
pub mod certificates;
pub mod clusters;
pub mod components;
pub mod events;
pub mod health_watch;
pub mod history;
pub mod idempotency;
pub mod issuances;
pub mod kept;
pub mod keys;
pub mod leases;
pub mod membership;
pub mod nodes;
pub mod nonces;
pub mod orgs;
pub mod pages;
pub mod resources;
pub mod tokens;
pub mod turns;

pub mod phase;
pub mod pools;
mod probe;
pub mod quotas;
pub mod remediations;
pub mod removals;
pub mod renewal;
pub mod restores;
pub mod rotations;
pub mod sa_rotations;
pub mod schema;
pub mod snapshots;
pub mod standby;
mod tx;

use std::time::Duration;

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{AnyPool, Connection as _, Executor as _};

pub use tx::Tx;

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
    /// A unique constraint refused the row: it collides with one that exists.
    #[error("the record collides with an existing one")]
    Duplicate(#[source] sqlx::Error),
    #[error("running migrations")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// A newer binary migrated the schema past what this one may run against.
    #[error(
        "the database's schema was migrated by a newer exk8s-api that binaries before migration \
         {needs} cannot run against; this binary knows migrations up to {knows}: run that newer \
         release (docs/upgrading-exk8s.md, \"Migrations\")"
    )]
    SchemaTooNew { needs: i64, knows: i64 },
    #[error("unsupported database URL (expected sqlite:… or postgres://…)")]
    UnsupportedUrl,
    /// A commit failed moments ago (a full disk, a lost connection): not ready for writes.
    #[error("a database write failed {}s ago", ago.as_secs())]
    WritesFailing { ago: Duration },
    #[error("the operating system's random source failed")]
    Random,
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
            sqlx::Error::Database(ref db) if db.code().is_some_and(|c| is_unavailable(&c)) => {
                Self::Unavailable(e)
            }
            sqlx::Error::Database(ref db) if db.is_unique_violation() => Self::Duplicate(e),
            other => Self::Query(other),
        }
    }
}

/// Error codes that mean "the database cannot do this now", not "this query is wrong".
fn is_unavailable(code: &str) -> bool {
    // PostgreSQL SQLSTATEs (five characters): connection exceptions (08…), insufficient
    // resources (53…: disk full, out of memory, too many connections), shutdown (57P01/57P03).
    let postgres = code.len() == 5
        && (code.starts_with("08") || code.starts_with("53") || code == "57P01" || code == "57P03");
    // SQLite result codes (extended codes keep the primary one in the low byte): BUSY, LOCKED,
    // IOERR, FULL, CANTOPEN.
    let sqlite = code
        .parse::<i32>()
        .is_ok_and(|c| matches!(c & 0xff, 5 | 6 | 10 | 13 | 14));
    postgres || sqlite
}

/// `alias.column AS name` for each column and the name it is selected under, joined.
pub(crate) fn aliased_columns(alias: &str, columns: &[&str], names: &[&str]) -> String {
    columns
        .iter()
        .zip(names)
        .map(|(column, name)| format!("{alias}.{column} AS {name}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// SQLite's default durability on this store's connections (see [`Db::connect_with`]).
pub(crate) const SQLITE_SYNC_NORMAL: &str = "PRAGMA synchronous = NORMAL";
/// SQLite's durability for a write that must survive a power cut.
pub(crate) const SQLITE_SYNC_FULL: &str = "PRAGMA synchronous = FULL";

/// How long a connection may sit in the pool before it is pinged again when taken.
const IDLE_BEFORE_PING: Duration = Duration::from_secs(1);

/// The shared pool and its dialect.
#[derive(Debug, Clone)]
pub struct Db {
    pub pool: AnyPool,
    pub backend: Backend,
    /// This process's row in `readiness_probe`.
    instance: i64,
    health: std::sync::Arc<probe::WriteHealth>,
    /// This process's passes at each lease ([`turns`]).
    turns: std::sync::Arc<turns::Turns>,
}

impl Db {
    /// Connects (lazily: a database that is down at start makes requests 503, not the process
    /// exit) and configures SQLite for concurrent use.
    pub fn connect(url: &str) -> Result<Self, DbError> {
        Self::connect_with(url, IDLE_BEFORE_PING)
    }

    /// [`Db::connect`], a connection taken from the pool after `idle_before_ping` or more in it
    /// being pinged first (tests choose the bound; sqlx's idle times cannot be injected).
    pub fn connect_with(url: &str, idle_before_ping: Duration) -> Result<Self, DbError> {
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
                        // WAL with NORMAL: a commit survives the process crashing, and is on
                        // disk by the next checkpoint; a power cut may lose the last ones. What
                        // must be on disk before the outside world acts on it (a journal intent
                        // before its compute or DNS call) is written with FULL, whose fsync of
                        // the WAL also persists every commit before it
                        // ([`resources::journal_intent`]).
                        conn.execute(SQLITE_SYNC_NORMAL).await?;
                    }
                    Ok(())
                })
            });
        // A connection that hit a full disk or an I/O error can keep answering that error to
        // every later write, long after space returned (SQLite does; a fresh connection
        // does not). So a connection opened before the last such failure is closed instead
        // of handed out, and the pool opens a new one.
        let health = std::sync::Arc::new(probe::WriteHealth::default());
        let watch = std::sync::Arc::clone(&health);
        //
        // sqlx pings every connection when it goes back to the pool, so one handed out again
        // soon after was just shown alive. Only a connection idle longer than
        // `idle_before_ping` (long enough to have missed a database restart) is pinged again
        // before use: a failed ping closes it and the pool opens another, as sqlx's own test
        // would. Under load, that saves a round trip on every statement outside a transaction.
        let options = options
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                let stale = watch.failed_since_open(meta.age);
                Box::pin(async move {
                    if !stale && meta.idle_for >= idle_before_ping {
                        conn.ping().await?;
                    }
                    Ok(!stale)
                })
            });
        let pool = options.connect_lazy(url)?;
        Ok(Self {
            pool,
            backend,
            instance: i64::from(uuid::Uuid::new_v4().as_u128() as u32),
            health,
            turns: std::sync::Arc::default(),
        })
    }

    /// Where this process's passes at one lease take their turns.
    pub fn turns(&self) -> &std::sync::Arc<turns::Turns> {
        &self.turns
    }

    /// `SELECT 1`: is the database answering?
    pub async fn ping(&self) -> Result<(), DbError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Can the database take writes? Writes and commits a small probe row (see [`probe`]);
    /// fails while the disk is full or the database is read-only, and for a short while after
    /// any commit failed.
    pub async fn check_writable(&self) -> Result<(), DbError> {
        probe::check(self).await
    }
}

/// Unix seconds now.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
