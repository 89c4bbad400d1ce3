//! The embedded store's durability: SQLite commits with `synchronous = NORMAL` (durable across
//! a crash of the process), and a journal intent — written before the compute or DNS call it
//! records — with FULL, whose fsync of the WAL also puts every earlier commit on disk. Seen by
//! triggers that record the level each insert ran under, through a real founding.

use sqlx::Row;

use crate::app::{Backend, spawn_app};

/// `PRAGMA synchronous` levels.
const NORMAL: i64 = 1;
const FULL: i64 = 2;

#[tokio::test]
async fn journal_intents_commit_with_full_and_everything_else_with_normal() {
    let app = spawn_app(Backend::Sqlite).await;
    let pool = &app.state.db.pool;
    for statement in [
        "CREATE TABLE test_sync_seen (tbl TEXT NOT NULL, level INTEGER NOT NULL)",
        "CREATE TRIGGER test_sync_resources AFTER INSERT ON cluster_resources BEGIN \
         INSERT INTO test_sync_seen SELECT 'cluster_resources', synchronous FROM pragma_synchronous; END",
        "CREATE TRIGGER test_sync_clusters AFTER INSERT ON clusters BEGIN \
         INSERT INTO test_sync_seen SELECT 'clusters', synchronous FROM pragma_synchronous; END",
    ] {
        sqlx::query(statement).execute(pool).await.unwrap();
    }
    let founded = app.found(3, serde_json::json!({})).await;
    assert_eq!(founded.status(), 201, "{}", founded.text().await.unwrap());

    let seen = sqlx::query("SELECT tbl, level FROM test_sync_seen ORDER BY rowid")
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<String, _>("tbl"), r.get::<i64, _>("level")))
        .collect::<Vec<_>>();
    let levels = |table: &str| {
        seen.iter()
            .filter(|(t, _)| t == table)
            .map(|(_, level)| *level)
            .collect::<Vec<_>>()
    };
    // Three VMs and the DNS record, each journaled before its call.
    let journal = levels("cluster_resources");
    assert!(journal.len() >= 3, "journal intents seen: {seen:?}");
    assert!(journal.iter().all(|&l| l == FULL), "{seen:?}");
    assert_eq!(levels("clusters"), vec![NORMAL], "{seen:?}");

    // Every pooled connection is back at the store's default.
    let mut held = Vec::new();
    for _ in 0..app.state.db.pool.size() {
        let mut conn = pool.acquire().await.unwrap();
        let level: i64 = sqlx::query("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await
            .unwrap()
            .get(0);
        assert_eq!(level, NORMAL);
        held.push(conn);
    }
}
