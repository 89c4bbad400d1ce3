//! A rolling deploy of the API over one database, on SQLite and PostgreSQL. A newer release
//! migrates the schema the way the release policy allows (docs/upgrading-exk8s.md,
//! "Migrations": a new table, a new nullable column, a new column with a default) while this
//! binary serves: a replica of this binary started after it founds a cluster, rolls it out and
//! stores a snapshot, and the newer release's rows stay. A newer release that raises the
//! schema's floor past this binary makes it refuse to start, naming both migrations — through
//! `Db::migrate` and through `exk8s-api migrate` as an operator runs it.

use exk8s_api::db::{Db, DbError, schema};
use sqlx::Row as _;

use crate::app::{Backend, both_backends, fresh_database, json_of, spawn_app, spawn_replica};
use crate::sync::{booted_cluster, fetch_update, sync_report, update_payload};

/// What a newer release's additive migration does.
const ADDITIVE: &str = "\
CREATE TABLE a_newer_release (id BIGINT PRIMARY KEY, note TEXT NOT NULL);
INSERT INTO a_newer_release (id, note) VALUES (1, 'kept');
ALTER TABLE clusters ADD COLUMN a_newer_note TEXT;
ALTER TABLE cluster_nodes ADD COLUMN a_newer_flag INTEGER NOT NULL DEFAULT 0;
";

/// A newer release's migration that binaries before it cannot run against.
const CONTRACTING: &str = "UPDATE schema_compatibility SET oldest_binary_migration = 9001;";

/// Migrates `url` as a newer release would: this binary's migrations, then each of `extra`
/// (file name, SQL) as that release's own.
async fn newer_release(backend: Backend, url: &str, extra: &[(&str, &str)]) {
    crate::schema::migrate_from_files(backend, url, |_| true, extra).await;
}

async fn this_binary_serves_beside_a_newer_releases_migrations(backend: Backend) {
    let app = spawn_app(backend).await;
    newer_release(
        backend,
        &app.db_url,
        &[("9000_a_newer_release.sql", ADDITIVE)],
    )
    .await;
    // A replica of this binary (re)started mid-deploy: it migrates, finds migration 9000 it does
    // not know, and serves.
    let replica = spawn_replica(&app, backend).await;

    // A founding: every node fetches its first bundle and reports complete.
    let nodes = booted_cluster(&replica).await;
    let (a, ka) = &nodes[0];
    let cluster = a.cluster;
    let viewed = replica
        .get(&format!("/clusters/{cluster}"))
        .send()
        .await
        .unwrap();
    assert_eq!(viewed.status(), 200);
    assert_eq!(json_of(viewed).await["phase"], "founded");

    // A rollout: the first node takes generation 2 and reports it.
    let started = replica
        .post(&format!("/clusters/{cluster}/rollout"))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    let payload = update_payload(&replica, fetch_update(&replica, a, ka).await).await;
    assert_eq!(payload.identity.generation, 2);
    sync_report(&replica, a, ka, "succeeded", 2).await;

    // A snapshot, asked for through the older process too, stored by the node.
    let (snapshot, _) = crate::restore::stored(&app, cluster, (a, ka)).await;
    let listed = replica
        .get(&format!("/clusters/{cluster}/snapshots"))
        .send()
        .await
        .unwrap();
    let listed = json_of(listed).await;
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == snapshot && s["state"] == "stored"),
        "{listed}"
    );

    // The newer release's rows and defaults are its own, untouched.
    let note: String = sqlx::query("SELECT note FROM a_newer_release WHERE id = 1")
        .fetch_one(&replica.state.db.pool)
        .await
        .unwrap()
        .get("note");
    assert_eq!(note, "kept");
    let flags: i64 = sqlx::query(
        "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM cluster_nodes WHERE cluster_id = $1 AND a_newer_flag = 0",
    )
    .bind(cluster)
    .fetch_one(&replica.state.db.pool)
    .await
    .unwrap()
    .get("n");
    assert_eq!(
        flags, 3,
        "this binary's inserts took the newer column's default"
    );
}

async fn a_newer_release_past_this_binary_is_refused_at_start(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = fresh_database(backend, dir.path()).await;
    let db = Db::connect(&url).unwrap();
    db.migrate().await.unwrap();
    newer_release(
        backend,
        &url,
        &[
            ("9000_a_newer_release.sql", ADDITIVE),
            ("9001_contracting.sql", CONTRACTING),
        ],
    )
    .await;
    let knows = schema::newest_known(db.backend);
    match db.migrate().await {
        Err(DbError::SchemaTooNew { needs, knows: k }) => {
            assert_eq!((needs, k), (9001, knows));
        }
        other => panic!("a schema past this binary was not refused: {other:?}"),
    }
    let run = crate::crash::api(&["migrate", "--database-url", &url]);
    assert!(!run.status.success());
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(
        said.contains("before migration 9001")
            && said.contains(&format!("knows migrations up to {knows}")),
        "{said}"
    );
}

both_backends!(
    this_binary_serves_beside_a_newer_releases_migrations,
    a_newer_release_past_this_binary_is_refused_at_start,
);
