//! A full disk under the database, on a real filesystem (a size-limited tmpfs): SQLite with its
//! file there, and PostgreSQL with its database in a tablespace there (the data directory and
//! write-ahead log stay elsewhere, as a production server's usually do).
//!
//! While the disk is full every founding answers 503 with `Retry-After` (never a 500), no VM or
//! security group exists without its committed journal row — read through a separate
//! connection, so a row stuck in some pooled connection's open transaction would not count —
//! and `/readyz` says 503. Once space returns the same process serves again by itself:
//! `/readyz` 200 and a founding succeeds, with no connection left holding a lock.

use std::sync::Arc;
use std::time::Duration;

use exk8s_api::db::Db;
use exk8s_tests::postgres::PrivatePostgres;
use exk8s_tests::tmpfs::Tmpfs;
use sqlx::Row as _;

use crate::app::{Backend, TestApp, json_of, spawn_with, test_config};
use crate::crash::wait_until;

/// Every VM and security group the simulator holds has a committed journal row.
async fn every_resource_is_journaled(app: &TestApp, db_url: &str) {
    let observer = Db::connect(db_url).unwrap();
    let tokens: Vec<String> = sqlx::query("SELECT client_token FROM cluster_resources")
        .fetch_all(&observer.pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("client_token"))
        .collect();
    observer.pool.close().await;
    for vm in app.sims.compute.vms() {
        let token = vm.client_token.clone().unwrap();
        assert!(
            tokens.contains(&token),
            "VM {} ({token}) exists without a committed journal row",
            vm.id
        );
    }
    for group in app.sims.compute.security_groups() {
        let token = group.client_token.clone().unwrap();
        assert!(
            tokens.contains(&token),
            "security group {} exists without a committed journal row",
            group.id
        );
    }
}

async fn readyz(app: &TestApp) -> u16 {
    app.http
        .get(format!("{}/readyz", app.url))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn full_disk_then_space_again(app: &TestApp, disk: &Tmpfs, db_url: &str) {
    let first = app.found(1, serde_json::json!({})).await;
    assert_eq!(first.status(), 201, "{}", json_of(first).await);
    assert_eq!(readyz(app).await, 200);

    let filler = disk.fill();
    assert!(disk.free_bytes() < 4096, "the disk is not full");
    let mut refused = 0;
    for attempt in 0..12 {
        let response = app.found(1, serde_json::json!({})).await;
        let status = response.status().as_u16();
        if status == 503 {
            assert!(
                response.headers().contains_key("retry-after"),
                "a 503 without Retry-After"
            );
            refused += 1;
        } else {
            assert_eq!(
                status,
                201,
                "attempt {attempt}: {}",
                json_of(response).await
            );
        }
        every_resource_is_journaled(app, db_url).await;
        if refused >= 3 {
            break;
        }
    }
    assert!(refused >= 3, "a full disk never refused a founding");
    assert_eq!(readyz(app).await, 503, "/readyz is ready on a full disk");

    std::fs::remove_file(&filler).unwrap();
    wait_until(
        "/readyz once space returned",
        Duration::from_secs(20),
        || async { readyz(app).await == 200 },
    )
    .await;
    for _ in 0..3 {
        let response = app.found(1, serde_json::json!({})).await;
        assert_eq!(
            response.status(),
            201,
            "after space returned: {}",
            json_of(response).await
        );
    }
    let list = app.get("/clusters").send().await.unwrap();
    assert_eq!(list.status(), 200);
    every_resource_is_journaled(app, db_url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_on_a_full_disk_loses_no_journal_row_and_heals_by_itself() {
    // Room for SQLite's write-ahead log to reach its checkpoint size (4 MiB) once space returns.
    let disk = Tmpfs::mount(8192, None);
    let db_url = format!("sqlite://{}/exk8s.db?mode=rwc", disk.path().display());
    let scratch = Arc::new(tempfile::tempdir().unwrap());
    let app = spawn_with(Backend::Sqlite, test_config(), Some((&db_url, scratch))).await;
    full_disk_then_space_again(&app, &disk, &db_url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_with_a_full_tablespace_loses_no_journal_row_and_heals_by_itself() {
    let pg = PrivatePostgres::start();
    // The migrated database takes about 3.5 MiB, the template's catalogs included; the rest is
    // the room the foundings need once space returns (each first write to a table or index
    // takes a page of its own: 4 MiB in all left too little once migration 0032 added four).
    let disk = Tmpfs::mount(6144, Some("postgres:postgres"));
    // Its own admin connection comes before any `Db`: install the drivers here, or the test
    // works only after another test of the process has installed them.
    sqlx::any::install_default_drivers();
    let admin = sqlx::AnyPool::connect(&pg.url()).await.unwrap();
    sqlx::query(&format!(
        "CREATE TABLESPACE small LOCATION '{}'",
        disk.path().display()
    ))
    .execute(&admin)
    .await
    .unwrap();
    sqlx::query("CREATE DATABASE exk8s_full TABLESPACE small")
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let db_url = format!("postgres://postgres@127.0.0.1:{}/exk8s_full", pg.port());
    let scratch = Arc::new(tempfile::tempdir().unwrap());
    let app = spawn_with(Backend::Postgres, test_config(), Some((&db_url, scratch))).await;
    full_disk_then_space_again(&app, &disk, &db_url).await;
}
