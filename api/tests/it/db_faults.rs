//! Database faults on PostgreSQL: a PRIVATE server (its own port and data directory) is stopped
//! the hard way while bundles are being fetched and while a cluster is being founded. Every
//! answer is then a valid bundle or a 503 with `Retry-After`; founding leaves no VM, group or
//! node behind; and once the server is back the same API process serves again, no restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use exk8s_api::sim::Faults;
use exk8s_common::{Expected, verify};
use exk8s_tests::postgres::PrivatePostgres;
use serde_json::Value;

use crate::app::{Backend, TestApp, spawn_with, test_config};
use crate::bootstrap::{cluster_with_credentials, fetch, keyring};
use crate::crash::wait_until;

async fn stop(pg: &Arc<PrivatePostgres>) {
    let pg = Arc::clone(pg);
    tokio::task::spawn_blocking(move || pg.stop())
        .await
        .unwrap();
}

async fn start(pg: &Arc<PrivatePostgres>) {
    let pg = Arc::clone(pg);
    tokio::task::spawn_blocking(move || pg.start_again())
        .await
        .unwrap();
}

async fn app_on(pg: &PrivatePostgres, config: exk8s_api::app::ApiConfig) -> TestApp {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let mut app = spawn_with(Backend::Postgres, config, Some((&pg.url(), dir))).await;
    app.http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    app
}

fn assert_unavailable(response: &reqwest::Response, what: &str) {
    assert_eq!(response.status(), 503, "{what}");
    let retry = response
        .headers()
        .get("retry-after")
        .unwrap_or_else(|| panic!("{what}: a 503 without Retry-After"));
    assert!(
        retry.to_str().unwrap().parse::<u64>().unwrap() > 0,
        "{what}: Retry-After {retry:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_answers_503_and_heals_without_a_restart() {
    let pg = Arc::new(PrivatePostgres::start());
    let app = Arc::new(app_on(&pg, test_config()).await);
    let nodes = cluster_with_credentials(&app, 7, 3).await;
    let ring = Arc::new(keyring(&app).await);
    let node = Arc::new((
        nodes[0].vm,
        nodes[0].imds.clone(),
        nodes[0].bootstrap.clone(),
    ));

    // Fetches run without pause through the outage and the recovery.
    let running = Arc::new(AtomicBool::new(true));
    let fetcher = {
        let (app, ring, node, running) = (
            Arc::clone(&app),
            Arc::clone(&ring),
            Arc::clone(&node),
            Arc::clone(&running),
        );
        tokio::spawn(async move {
            let (mut ok, mut unavailable) = (0, 0);
            let mut n = 0u32;
            while running.load(Ordering::SeqCst) {
                n += 1;
                let nonce = format!("db-fault-nonce-{n:08}");
                let bearer = format!("Bearer {}", node.2);
                let response = fetch(&app, node.0, Some(&node.1), Some(&bearer), &nonce).await;
                if response.status() == 200 {
                    let bundle = verify(&response.bytes().await.unwrap(), &ring).unwrap();
                    let nonce = nonce.parse().unwrap();
                    bundle
                        .check_binding(&Expected {
                            vm_id: node.0 as u64,
                            nonce: Some(&nonce),
                            cluster_id: None,
                            org_id: Some(7),
                            kind: Some(exk8s_common::contract::BundleKind::Bootstrap),
                            now: exk8s_api::db::now(),
                            clock_skew_secs: 300,
                            applied_serial: None,
                        })
                        .unwrap();
                    ok += 1;
                } else {
                    assert_unavailable(&response, "a bundle fetch during the outage");
                    unavailable += 1;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (ok, unavailable)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop(&pg).await;

    let bearer = format!("Bearer {}", nodes[1].bootstrap);
    let during = fetch(
        &app,
        nodes[1].vm,
        Some(&nodes[1].imds),
        Some(&bearer),
        "db-fault-nonce-while-down",
    )
    .await;
    assert_unavailable(&during, "a bundle fetch with the database stopped");
    let body: Value = during.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable", "{body}");

    let vms_before = app.sims.compute.vms().len();
    let founding = app.found(3, serde_json::json!({})).await;
    assert_unavailable(&founding, "POST /clusters with the database stopped");
    assert_eq!(
        app.sims.compute.vms().len(),
        vms_before,
        "founding created VMs it could not record"
    );
    assert_unavailable(
        &app.get("/clusters").send().await.unwrap(),
        "GET /clusters with the database stopped",
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    start(&pg).await;
    wait_until(
        "bundle fetches to succeed again",
        Duration::from_secs(30),
        || async {
            let nonce = "db-fault-nonce-after-restart";
            let response = fetch(
                &app,
                nodes[1].vm,
                Some(&nodes[1].imds),
                Some(&bearer),
                nonce,
            );
            match response.await.status().as_u16() {
                200 => true,
                503 => false,
                other => panic!("a fetch after the restart answered {other}"),
            }
        },
    )
    .await;
    let founded = app.found(1, serde_json::json!({})).await;
    assert_eq!(
        founded.status(),
        201,
        "founding after the database came back"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    running.store(false, Ordering::SeqCst);
    let (ok, unavailable) = fetcher.await.unwrap();
    assert!(ok > 0, "no fetch succeeded before and after the outage");
    assert!(unavailable > 0, "no fetch ran during the outage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_mid_founding_leaves_no_partial_cluster() {
    let pg = Arc::new(PrivatePostgres::start());
    let config = exk8s_api::app::ApiConfig {
        address_timeout: Duration::from_secs(60),
        provisioning_deadline: Duration::from_secs(2),
        reconcile_interval: Duration::from_millis(500),
        ..test_config()
    };
    let app = Arc::new(app_on(&pg, config).await);
    // VMs get no address until the database is down: founding waits, then its next write —
    // the node records — meets the outage.
    app.sims.compute.set_faults(Faults {
        address_after_polls: u32::MAX,
        ..Faults::default()
    });
    let founding = {
        let app = Arc::clone(&app);
        tokio::spawn(async move { app.found(3, serde_json::json!({})).await })
    };
    wait_until("three VMs", Duration::from_secs(20), || async {
        app.sims.compute.vms().len() == 3
    })
    .await;
    stop(&pg).await;
    app.sims.compute.assign_addresses_now();

    let response = founding.await.unwrap();
    assert_unavailable(&response, "founding that lost its database");
    assert!(
        app.sims.compute.vms().is_empty() && app.sims.compute.security_groups().is_empty(),
        "founding left VMs or groups behind: {:?} {:?}",
        app.sims.compute.vms(),
        app.sims.compute.security_groups()
    );

    start(&pg).await;
    // The same process, no restart: its reconciler finishes the journal once the database
    // answers — the cluster ends `failed`, with no node records.
    wait_until(
        "the reconciler to mark the cluster failed",
        Duration::from_secs(30),
        || async {
            let Ok(response) = app.get("/clusters").send().await else {
                return false;
            };
            let list: Value = response.json().await.unwrap_or_default();
            list.as_array()
                .is_some_and(|l| l.len() == 1 && l[0]["phase"] == "failed")
        },
    )
    .await;
    {
        use sqlx::Row as _;
        let pool = &app.state.db.pool;
        let count = |sql: &'static str| async move {
            sqlx::query(sql)
                .fetch_one(pool)
                .await
                .unwrap()
                .get::<i64, _>("n")
        };
        assert_eq!(count("SELECT COUNT(*) AS n FROM cluster_nodes").await, 0);
        assert_eq!(
            count("SELECT COUNT(*) AS n FROM cluster_resources WHERE state <> 'deleted'").await,
            0,
            "the journal still lists live resources"
        );
    }

    app.sims.compute.set_faults(Faults::default());
    let again = app.found(3, serde_json::json!({})).await;
    assert_eq!(again.status(), 201, "founding after the database came back");
    assert_eq!(app.sims.compute.vms().len(), 3);
}
