//! A deleted cluster keeps what recovery needs (its trust and stored snapshots) until it is
//! purged, on SQLite and PostgreSQL: listed with `/deleted-clusters`, its name free again, a
//! cluster founded from its snapshot, the purge refused unconfirmed and while a restore reads
//! from it, and at its time the reconciler's purge drops the rows and the stored objects; an
//! org's own retention (`exk8s-api orgs`) applies to its later deletes.

use std::sync::Arc;

use exk8s_api::clock::ManualClock;
use serde_json::{Value, json};

use crate::app::{Backend, TestApp, both_backends, json_of, spawn_app};
use crate::restore::stored;
use crate::sync::booted_cluster;

const DAY: i64 = 86_400;

async fn count(app: &TestApp, sql: &str, cluster: i64) -> i64 {
    sqlx::query_scalar(sql)
        .bind(cluster)
        .fetch_one(&app.state.db.pool)
        .await
        .unwrap()
}

async fn get_json(app: &TestApp, path: &str) -> (u16, Value) {
    let got = app.get(path).send().await.unwrap();
    (got.status().as_u16(), json_of(got).await)
}

async fn purge(app: &TestApp, cluster: i64, query: &str) -> (u16, String) {
    let done = app
        .delete(&format!("/deleted-clusters/{cluster}{query}"))
        .send()
        .await
        .unwrap();
    (done.status().as_u16(), done.text().await.unwrap())
}

/// The objects in the test's snapshot store (a directory: one file per stored snapshot).
fn objects(app: &TestApp) -> usize {
    walk(&app._dir.path().join("snapshots"))
}

fn walk(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| {
                if e.path().is_dir() {
                    walk(&e.path())
                } else {
                    1
                }
            })
            .sum()
    })
}

/// The reconciler's purge pass, its clock `days` ahead.
async fn purge_pass(app: &TestApp, days: i64) -> usize {
    let mut ctx = app.state.snapshots();
    let clock = ManualClock::starting_at(time::OffsetDateTime::now_utc());
    clock.advance(time::Duration::seconds(days * DAY));
    ctx.clock = Arc::new(clock);
    exk8s_api::kept::purge_due(&ctx).await
}

async fn a_deleted_cluster_keeps_its_trust_and_snapshots_until_it_is_purged(backend: Backend) {
    let app = spawn_app(backend).await;
    let nodes = booted_cluster(&app).await;
    let source = nodes[0].0.cluster;
    let (snapshot_id, snapshot) = stored(&app, source, (&nodes[0].0, &nodes[0].1)).await;
    sqlx::query("UPDATE clusters SET name = 'shop' WHERE id = $1")
        .bind(source)
        .execute(&app.state.db.pool)
        .await
        .unwrap();
    let (_, trust) = get_json(&app, &format!("/clusters/{source}/trust")).await;
    let stored_objects = objects(&app);
    assert!(stored_objects >= 1, "the snapshot's object is stored");

    let deleted = app
        .delete(&format!("/clusters/{source}"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let now = exk8s_api::db::now();

    // Gone from everything a cluster is, kept where recovery looks.
    assert_eq!(get_json(&app, &format!("/clusters/{source}")).await.0, 404);
    let (_, clusters) = get_json(&app, "/clusters").await;
    assert!(
        !clusters.to_string().contains("\"shop\""),
        "not listed: {clusters}"
    );
    let (status, listed) = get_json(&app, "/deleted-clusters").await;
    assert_eq!(status, 200);
    let kept = &listed[0];
    assert_eq!(kept["cluster_id"], source, "{listed}");
    assert_eq!(kept["name"], "shop");
    assert_eq!(kept["kept"], json!(["trust", "snapshots"]));
    assert_eq!(kept["snapshots"], 1);
    assert_eq!(kept["snapshot_bytes"], snapshot.len());
    let until = kept["kept_until"].as_i64().unwrap();
    assert!(
        (until - (now + 30 * DAY)).abs() <= 5,
        "kept 30 days by default: {kept}"
    );
    let (_, one) = get_json(&app, &format!("/deleted-clusters/{source}")).await;
    assert_eq!(&one, kept);
    let (_, snapshots) = get_json(&app, &format!("/clusters/{source}/snapshots")).await;
    assert_eq!(snapshots[0]["id"], snapshot_id, "{snapshots}");
    for (sql, left) in [
        (
            "SELECT COUNT(*) FROM cluster_nodes WHERE cluster_id = $1",
            0,
        ),
        (
            "SELECT COUNT(*) FROM issued_certificates WHERE cluster_id = $1",
            0,
        ),
        ("SELECT COUNT(*) FROM ca_standby WHERE cluster_id = $1", 1),
    ] {
        assert_eq!(count(&app, sql, source).await, left, "{sql}");
    }
    assert_eq!(objects(&app), stored_objects, "the snapshot's object stays");

    // Its name is free again; a snapshot cannot be asked of it.
    let named = app.found(1, json!({"name": "shop"})).await;
    assert_eq!(named.status(), 201, "{}", named.text().await.unwrap());
    let asked = app
        .post(&format!("/clusters/{source}/snapshots"))
        .send()
        .await
        .unwrap();
    assert_eq!(asked.status(), 404);

    // A cluster founded from it keeps its trust.
    let from = json!({"cluster_id": source, "snapshot_id": snapshot_id});
    let created = app.found(1, json!({"restore_from": from})).await;
    assert_eq!(created.status(), 201);
    let restored = json_of(created).await["cluster_id"].as_i64().unwrap();
    let (_, ours) = get_json(&app, &format!("/clusters/{restored}/trust")).await;
    assert_eq!(
        ours["certificate_authority_pem"],
        trust["certificate_authority_pem"]
    );

    // The purge: only confirmed, and not while that cluster is restored from it.
    for query in ["", "?confirm=other", "?confirm=shop&also=1"] {
        let (status, said) = purge(&app, source, query).await;
        assert!(status == 422 || status == 400, "{query}: {status} {said}");
        assert!(
            said.contains("confirm") || said.contains("also"),
            "{query}: {said}"
        );
    }
    let (status, said) = purge(&app, source, "?confirm=shop").await;
    assert_eq!(status, 409, "{said}");
    assert!(
        said.contains(&format!("cluster {restored} is being restored")),
        "{said}"
    );
    assert_eq!(purge_pass(&app, 31).await, 0, "kept past its time: in use");
    assert_eq!(
        get_json(&app, &format!("/deleted-clusters/{source}"))
            .await
            .0,
        200
    );

    // That cluster deleted and purged by its operator, the source's time comes.
    assert_eq!(
        app.delete(&format!("/clusters/{restored}"))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    let (_, theirs) = get_json(&app, &format!("/deleted-clusters/{restored}")).await;
    let name = theirs["name"].as_str().unwrap().to_owned();
    assert_eq!(theirs["kept"], json!(["trust"]), "{theirs}");
    assert_eq!(
        purge(&app, restored, &format!("?confirm={name}")).await.0,
        204
    );
    assert_eq!(
        get_json(&app, &format!("/deleted-clusters/{restored}"))
            .await
            .0,
        404
    );
    assert_eq!(purge_pass(&app, 29).await, 0, "not yet");
    assert_eq!(purge_pass(&app, 31).await, 1);
    assert_eq!(
        get_json(&app, &format!("/deleted-clusters/{source}"))
            .await
            .0,
        404
    );
    assert_eq!(
        get_json(&app, &format!("/clusters/{source}/snapshots"))
            .await
            .0,
        404
    );
    for table in ["clusters", "snapshots", "ca_standby"] {
        let column = if table == "clusters" {
            "id"
        } else {
            "cluster_id"
        };
        let sql = format!("SELECT COUNT(*) FROM {table} WHERE {column} = $1");
        assert_eq!(count(&app, &sql, source).await, 0, "{table}");
    }
    assert_eq!(objects(&app), stored_objects - 1, "its object is gone");
}

/// Every table referring to `clusters` is either kept with a deleted cluster or goes with its
/// delete: a new one must be put in one list or the other.
async fn every_table_of_a_cluster_is_kept_or_goes(backend: Backend) {
    let app = spawn_app(backend).await;
    let sql = match backend {
        Backend::Sqlite => {
            "SELECT m.name FROM sqlite_master m, pragma_foreign_key_list(m.name) f \
             WHERE m.type = 'table' AND f.\"table\" = 'clusters' ORDER BY m.name"
        }
        Backend::Postgres => {
            "SELECT CAST(conrelid::regclass AS TEXT) FROM pg_constraint \
             WHERE contype = 'f' AND confrelid = 'clusters'::regclass ORDER BY 1"
        }
    };
    let referring: Vec<String> = sqlx::query_scalar(sql)
        .fetch_all(&app.state.db.pool)
        .await
        .unwrap();
    let mut classified: Vec<String> = exk8s_api::db::kept::KEPT
        .iter()
        .chain(exk8s_api::db::kept::GONE.iter())
        .map(|t| (*t).to_owned())
        .collect();
    classified.sort();
    let mut referring = referring;
    referring.sort();
    referring.dedup();
    assert_eq!(referring, classified);
}

/// `exk8s-api orgs` against the app's database: its exit status and what it said.
fn orgs(app: &TestApp, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["orgs", args[0], "--database-url", &app.db_url];
    all.extend(&args[1..]);
    let out = crate::crash::api(&all);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Founds a one-node cluster of org 7, deletes it, and says how many days it is kept.
async fn kept_days_of_a_delete(app: &TestApp) -> i64 {
    let created = app.found(1, json!({})).await;
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
    let id = json_of(created).await["cluster_id"].as_i64().unwrap();
    let deleted = app.delete(&format!("/clusters/{id}")).send().await.unwrap();
    assert_eq!(deleted.status(), 204);
    let now = exk8s_api::db::now();
    let (_, kept) = get_json(app, &format!("/deleted-clusters/{id}")).await;
    let until = kept["kept_until"].as_i64().unwrap();
    // Whole days, read a moment after the delete.
    (until - now + DAY / 2).div_euclid(DAY)
}

/// An org's own retention, set with `exk8s-api orgs`, holds for its deletes from then on; reset,
/// the API's holds again. Bad input is refused by name.
async fn an_org_keeps_its_deleted_clusters_for_its_own_days(backend: Backend) {
    let app = spawn_app(backend).await;
    assert_eq!(kept_days_of_a_delete(&app).await, 30, "the API's default");

    let (ok, _, said) = orgs(&app, &["set", "--org", "7", "--keep-deleted-days", "3"]);
    assert!(ok, "{said}");
    assert!(
        said.contains("org 7: its deleted clusters are kept 3 days"),
        "{said}"
    );
    let (ok, listed, said) = orgs(&app, &["list"]);
    assert!(ok, "{said}");
    let row: Vec<&str> = listed.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..2], ["7", "3"], "{listed}");
    assert_eq!(kept_days_of_a_delete(&app).await, 3, "org 7's own");

    // Zero: purged at the reconciler's next pass.
    assert!(orgs(&app, &["set", "--org", "7", "--keep-deleted-days", "0"]).0);
    assert_eq!(kept_days_of_a_delete(&app).await, 0);
    assert_eq!(purge_pass(&app, 0).await, 1, "the one kept 0 days");

    let (ok, _, said) = orgs(&app, &["reset", "--org", "7"]);
    assert!(ok, "{said}");
    assert!(said.contains("the API's settings hold again"), "{said}");
    assert_eq!(kept_days_of_a_delete(&app).await, 30);
    let (_, listed, _) = orgs(&app, &["list"]);
    assert_eq!(listed.lines().count(), 1, "only the header: {listed}");
    let (ok, _, said) = orgs(&app, &["reset", "--org", "7"]);
    assert!(ok && said.contains("had no settings of its own"), "{said}");

    for (args, named) in [
        (
            &["set", "--org", "7", "--keep-deleted-days", "3651"][..],
            "--keep-deleted-days",
        ),
        (
            &["set", "--org", "7", "--keep-deleted-days", "-1"][..],
            "--keep-deleted-days",
        ),
        (
            &["set", "--org", "0", "--keep-deleted-days", "3"][..],
            "--org",
        ),
        (&["set", "--org", "7"][..], "--keep-deleted-days"),
    ] {
        let (ok, _, said) = orgs(&app, args);
        assert!(!ok, "{args:?} was taken");
        assert!(said.contains(named), "{args:?}: {said}");
    }
}

both_backends!(a_deleted_cluster_keeps_its_trust_and_snapshots_until_it_is_purged);
both_backends!(an_org_keeps_its_deleted_clusters_for_its_own_days);
both_backends!(every_table_of_a_cluster_is_kept_or_goes);
