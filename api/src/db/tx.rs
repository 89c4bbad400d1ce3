//! [`Tx`]: a write transaction on its own pooled connection that can never go back to the pool
//! still inside a transaction.
//!
//! sqlx's own `Transaction` tracks nesting in a counter beside the connection. When a COMMIT or
//! ROLLBACK fails — SQLite on a full disk rolls the transaction back by itself, or keeps it
//! open — that counter and the database disagree, and the connection returns to the pool still
//! holding a transaction: every later "autocommit" statement on it is silently never committed,
//! and on SQLite it holds the write lock, so everyone else answers `database is locked` until a
//! restart. Here BEGIN and COMMIT are plain statements, and a connection whose transaction did
//! not end in a successful COMMIT is closed instead of pooled (the pool opens a fresh one).

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use sqlx::Any;
use sqlx::AnyConnection;
use sqlx::pool::PoolConnection;

use super::probe::WriteHealth;
use super::{Backend, Db, DbError};

/// An open transaction. Commit it; dropping it (an error, a timeout) rolls it back by closing
/// its connection.
pub struct Tx {
    conn: Option<PoolConnection<Any>>,
    health: Arc<WriteHealth>,
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tx")
    }
}

impl Db {
    /// Begins a write transaction. On SQLite it takes the write lock at once (`IMMEDIATE`), so
    /// two transactions never deadlock upgrading a read lock.
    pub async fn begin(&self) -> Result<Tx, DbError> {
        let mut conn = self.pool.acquire().await?;
        let begin = match self.backend {
            Backend::Sqlite => "BEGIN IMMEDIATE",
            Backend::Postgres => "BEGIN",
        };
        if let Err(e) = sqlx::query(begin).execute(&mut *conn).await {
            discard(conn).await;
            return Err(self.health.observe(e.into()));
        }
        Ok(Tx {
            conn: Some(conn),
            health: Arc::clone(&self.health),
        })
    }
}

impl Tx {
    /// Commits. On failure the connection is closed, never pooled, whatever state the
    /// database left the transaction in.
    pub async fn commit(mut self) -> Result<(), DbError> {
        let Some(mut conn) = self.conn.take() else {
            return Ok(());
        };
        match sqlx::query("COMMIT").execute(&mut *conn).await {
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "COMMIT failed; closing the connection");
                discard(conn).await;
                Err(self.health.observe(e.into()))
            }
        }
    }
}

/// Closes a connection whose transaction state is unknown; the database rolls back whatever
/// it still holds when the connection ends.
async fn discard(conn: PoolConnection<Any>) {
    let _ = conn.close().await;
}

impl Drop for Tx {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // No COMMIT happened: detach the connection from the pool and drop it, which ends
            // the session and with it the transaction.
            drop(conn.detach());
        }
    }
}

impl Deref for Tx {
    type Target = AnyConnection;

    fn deref(&self) -> &AnyConnection {
        // `conn` is `Some` from `begin` until `commit` consumes the value or `drop` runs.
        self.conn
            .as_deref()
            .unwrap_or_else(|| unreachable!("a Tx always holds its connection"))
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        self.conn
            .as_deref_mut()
            .unwrap_or_else(|| unreachable!("a Tx always holds its connection"))
    }
}
