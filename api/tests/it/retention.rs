//! What the database keeps, on SQLite and PostgreSQL: months of agent runs (an instance-metadata
//! token and a report each) on an injected clock, the reconciler's prune pass now and then, and
//! the tables stay bounded by their retention; each node's latest report survives.

use std::sync::Arc;

use exk8s_api::clock::{Clock as _, ManualClock};
use exk8s_api::db;
use exk8s_api::founding::reconcile::{self, REPORT_RETENTION_SECS};
use time::{Duration, OffsetDateTime};

use crate::app::{Backend, both_backends, spawn_clocked, test_config};

async fn count(app: &crate::app::TestApp, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(&app.state.db.pool)
        .await
        .unwrap()
}

async fn months_of_agent_runs_stay_bounded(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(OffsetDateTime::now_utc()));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let nodes = crate::app::cluster_with_credentials(&app, 7, 1).await;
    let node_id: i64 = sqlx::query_scalar("SELECT id FROM cluster_nodes WHERE vm_id = $1")
        .bind(nodes[0].vm)
        .fetch_one(&app.state.db.pool)
        .await
        .unwrap();
    let pool = &app.state.db.pool;
    let before_tokens = count(&app, "imds_tokens").await;
    // 3,000 agent runs an hour apart (about four months); the reconciler prunes once a day.
    let runs = 3_000;
    for run in 0..runs {
        let now = clock.unix();
        let hash = format!("{run:064x}");
        db::tokens::insert_imds_token(pool, &hash, nodes[0].vm, 7, now, now + 6 * 3600)
            .await
            .unwrap();
        db::issuances::insert_report(pool, node_id, "sync", "succeeded", "", now)
            .await
            .unwrap();
        if run % 24 == 23 {
            reconcile::prune(&app.state.reconciler()).await;
        }
        clock.advance(Duration::hours(1));
    }
    reconcile::prune(&app.state.reconciler()).await;
    let tokens = count(&app, "imds_tokens").await;
    let reports = count(&app, "node_reports").await;
    // Only tokens still valid (the last six hours' runs) remain.
    assert!(
        tokens <= 6,
        "{tokens} instance-metadata tokens kept of {runs}"
    );
    assert!(
        before_tokens > 0 && tokens < before_tokens + runs,
        "nothing pruned"
    );
    let window = REPORT_RETENTION_SECS / 3600;
    assert!(
        (window - 1..=window + 1).contains(&reports),
        "{reports} reports kept, the retention holds {window}"
    );
    // A node that stopped reporting long ago keeps its latest report.
    clock.advance(Duration::days(365));
    reconcile::prune(&app.state.reconciler()).await;
    assert_eq!(count(&app, "node_reports").await, 1);
    assert_eq!(count(&app, "imds_tokens").await, 0);
    let last = db::issuances::last_report_at(pool, nodes[0].cluster)
        .await
        .unwrap();
    assert!(last.is_some());
}

both_backends!(months_of_agent_runs_stay_bounded);
