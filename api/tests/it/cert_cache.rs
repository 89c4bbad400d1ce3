//! The certificates that views judge come from memory while a cluster's are unchanged
//! (`exk8s_api::cert_cache`), on SQLite and PostgreSQL, under an injected clock: after every
//! write that changes them — a node's first bundle, a rollout's bundle, the generation it
//! applies, a re-minted operator kubeconfig — a view (one cluster's and a page's) says what
//! the rows in the database say; and a write that moves no stamp is not seen, which is the
//! proof that the copy in memory is what the views read.

use std::sync::Arc;

use exk8s_api::clock::{Clock as _, ManualClock};
use exk8s_api::db::{self, certificates::CertKind, certificates::NewCert};
use exk8s_api::pki::CertFacts;
use exk8s_common::node_auth::NodeKey;
use serde_json::{Value, json};
use time::{Duration, OffsetDateTime, format_description::well_known::Rfc3339};

use crate::app::{Backend, TestApp, both_backends, json_of, spawn_clocked, test_config};
use crate::bootstrap::report;
use crate::sync::{fetch_update, register, sync_report, update_payload};

/// The `CertificatesAvailable` condition of cluster `id` in its own view and in the page of
/// `GET /clusters` that holds it (they must agree), as (reason, message, lastTransitionTime).
async fn shown(app: &TestApp, id: i64) -> (String, String, String) {
    let condition = |view: &Value| {
        let found = view["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "CertificatesAvailable")
            .cloned()
            .unwrap();
        let text = |field: &str| found[field].as_str().unwrap().to_owned();
        (text("reason"), text("message"), text("lastTransitionTime"))
    };
    let one = json_of(app.get(&format!("/clusters/{id}")).send().await.unwrap()).await;
    let page = json_of(app.get("/clusters").send().await.unwrap()).await;
    let listed = page
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == id)
        .unwrap();
    assert_eq!(condition(&one), condition(listed), "the view and the page");
    condition(&one)
}

/// The same condition judged from the rows in the database, read now (nothing cached), and
/// the soonest expiries (nodes', operator credentials').
async fn recorded(
    app: &TestApp,
    id: i64,
    now: i64,
) -> ((String, String, String), exk8s_api::metrics::SoonestExpiry) {
    let pool = &app.state.db.pool;
    let cluster = db::clusters::get_by_id(pool, id).await.unwrap().unwrap();
    let nodes = db::nodes::list(pool, id).await.unwrap();
    let rows = db::certificates::list(pool, id).await.unwrap();
    let inventory =
        exk8s_api::certificates::inventory_of(id, cluster.created_at, &nodes, rows, now);
    let judged = exk8s_api::status::availability(&inventory, cluster.created_at, now);
    let since = OffsetDateTime::from_unix_timestamp(judged.since)
        .unwrap()
        .format(&Rfc3339)
        .unwrap();
    (
        (judged.reason.to_owned(), judged.message, since),
        inventory.soonest_expiry(),
    )
}

/// Asserts that the views say what the rows say, and that the gauge has the soonest expiry.
async fn views_say_what_is_recorded(app: &TestApp, id: i64, clock: &ManualClock, step: &str) {
    let now = clock.now().unix_timestamp();
    let (judged, soonest) = recorded(app, id, now).await;
    assert_eq!(shown(app, id).await, judged, "{step}");
    let metrics = app.metrics().await;
    for (name, value) in [
        ("certificate", soonest.nodes),
        ("operator_credential", soonest.operator),
    ] {
        let gauge = format!(
            "exk8s_cluster_{name}_soonest_expiry_timestamp_seconds{{cluster_id=\"{id}\"}} {}",
            value.unwrap()
        );
        assert!(metrics.contains(&gauge), "{step}: no {gauge}");
    }
}

async fn views_follow_every_certificate_write(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(OffsetDateTime::now_utc()));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let mut body = crate::app::valid_body(1);
    body["leaf_lifetime_days"] = json!(3);
    let created = json_of(
        app.post("/clusters")
            .header(crate::app::WAIT.0, crate::app::WAIT.1)
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    views_say_what_is_recorded(&app, cluster, &clock, "founded").await;
    let at_founding = shown(&app, cluster).await;
    assert_eq!(at_founding.0, "CertificatesValid", "{at_founding:?}");
    assert!(app.state.recorded.size().0 >= 1, "the views kept a copy");

    // A row written without moving a stamp (as no path of the API writes one) is not seen:
    // the views judge the copy they kept. It expires in a day, so it would be the news.
    let node = &crate::bootstrap::credentials_for(&app, 7, &created).await[0];
    let node_id = db::nodes::list(&app.state.db.pool, cluster).await.unwrap()[0].id;
    let now = clock.now().unix_timestamp();
    let facts = CertFacts {
        subject: "CN=unstamped".into(),
        issuer: "CN=kubernetes".into(),
        serial: "01".into(),
        not_before: now,
        not_after: now + 86_400,
    };
    let unstamped = NewCert {
        cluster_id: cluster,
        node_id: Some(node_id),
        generation: 1,
        name: "kubelet",
        kind: CertKind::Serving,
        facts: &facts,
    };
    let mut conn = app.state.db.pool.acquire().await.unwrap();
    db::certificates::insert(&mut conn, &[unstamped], now)
        .await
        .unwrap();
    drop(conn);
    let (would_be, _) = recorded(&app, cluster, now).await;
    assert_eq!(would_be.0, "CertificatesExpiringSoon", "{would_be:?}");
    assert_eq!(shown(&app, cluster).await, at_founding, "read from memory");

    // The node's first bundle takes its serial: its 14 leaves replace the row above (a later
    // row of the same name) and the views see them.
    clock.advance(Duration::hours(1));
    let key = NodeKey::generate().unwrap();
    register(&app, node, &key).await;
    views_say_what_is_recorded(&app, cluster, &clock, "first bundle").await;
    assert_ne!(shown(&app, cluster).await, at_founding);
    assert_eq!(report(&app, node, "complete", "succeeded").await, 204);
    views_say_what_is_recorded(&app, cluster, &clock, "complete").await;

    // A rollout's bundle: recorded at generation 2 while the node runs 1, then applied.
    clock.advance(Duration::hours(1));
    let started = app
        .post(&format!("/clusters/{cluster}/rollout"))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    update_payload(&app, fetch_update(&app, node, &key).await).await;
    views_say_what_is_recorded(&app, cluster, &clock, "generation 2 handed").await;
    let handed = shown(&app, cluster).await;
    sync_report(&app, node, &key, "succeeded", 2).await;
    views_say_what_is_recorded(&app, cluster, &clock, "generation 2 applied").await;
    assert_ne!(
        shown(&app, cluster).await,
        handed,
        "the applied leaves are newer"
    );

    // An operator kubeconfig re-minted with the clock set back three hours (before founding)
    // expires before anything else: the operator credentials' gauge moves to it, the nodes' does
    // not (no node runs it, so its expiry must not raise the nodes' alert).
    let (_, before) = recorded(&app, cluster, clock.now().unix_timestamp()).await;
    clock.advance(Duration::hours(-3));
    let kubeconfig = app
        .get(&format!("/clusters/{cluster}/kubeconfig"))
        .send()
        .await
        .unwrap();
    assert_eq!(kubeconfig.status(), 200);
    let (_, after) = recorded(&app, cluster, clock.now().unix_timestamp()).await;
    assert!(after.operator < before.operator, "{after:?} {before:?}");
    assert!(after.operator < after.nodes, "{after:?}");
    assert_eq!(after.nodes, before.nodes, "{after:?} {before:?}");
    views_say_what_is_recorded(&app, cluster, &clock, "operator kubeconfig").await;
}

both_backends!(views_follow_every_certificate_write);
