//! A pooled PostgreSQL connection is pinged before use only when it sat idle past the pool's
//! bound (`Db::connect_with`); sqlx pinged it when it went back. Past the bound, a connection the
//! server dropped while it was idle is replaced and the statement succeeds; under the bound,
//! it is handed out unchecked, and using it is what fails.

use std::time::Duration;

use exk8s_api::db::Db;
use sqlx::Row;

use crate::app::{Backend, fresh_database};

/// A pool holding one idle connection, which the server then terminated.
async fn pool_with_a_dropped_connection(idle_before_ping: Duration) -> Db {
    let dir = tempfile::tempdir().unwrap();
    let url = fresh_database(Backend::Postgres, dir.path()).await;
    let db = Db::connect_with(&url, idle_before_ping).unwrap();
    let pid: i32 = sqlx::query("SELECT pg_backend_pid() AS pid")
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .try_get("pid")
        .unwrap();
    // The connection goes back to the pool (after sqlx's own ping) in a task of its own.
    for _ in 0..500 {
        if db.pool.num_idle() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!((db.pool.size(), db.pool.num_idle()), (1, 1));
    let admin = sqlx::AnyPool::connect(&url).await.unwrap();
    // Waits (up to 10 s) until the backend has exited.
    let ended: bool = sqlx::query("SELECT pg_terminate_backend($1, 10000) AS ended")
        .bind(pid)
        .fetch_one(&admin)
        .await
        .unwrap()
        .try_get("ended")
        .unwrap();
    assert!(ended, "backend {pid} still runs");
    admin.close().await;
    db
}

#[tokio::test]
async fn a_connection_idle_past_the_bound_is_pinged_and_replaced_when_dead() {
    let db = pool_with_a_dropped_connection(Duration::ZERO).await;
    let one: i64 = sqlx::query("SELECT CAST(1 AS BIGINT) AS one")
        .fetch_one(&db.pool)
        .await
        .expect("the dead connection replaced before use")
        .try_get("one")
        .unwrap();
    assert_eq!(one, 1);
}

#[tokio::test]
async fn a_connection_idle_under_the_bound_is_used_unchecked() {
    let db = pool_with_a_dropped_connection(Duration::from_secs(3600)).await;
    let used = sqlx::query("SELECT CAST(1 AS BIGINT) AS one")
        .fetch_one(&db.pool)
        .await;
    assert!(used.is_err(), "a dropped connection answered");
}
