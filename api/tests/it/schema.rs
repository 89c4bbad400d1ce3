//! The schema, checked on the real databases: both dialects' migrations leave the same tables
//! and columns; closed sets (phases, roles, report states) are refused by the database itself;
//! rows written before the node model migrate into it.

use std::collections::BTreeSet;

use exk8s_api::db::Db;
use sqlx::Row;

use crate::app::{Backend, both_backends, fresh_database};

async fn migrated(backend: Backend, dir: &std::path::Path) -> Db {
    let db = Db::connect(&fresh_database(backend, dir).await).unwrap();
    db.migrate().await.unwrap();
    db
}

/// `(table, column, not null)` of every table but sqlx's own.
async fn columns(db: &Db, backend: Backend) -> BTreeSet<(String, String, bool)> {
    let sql = match backend {
        Backend::Sqlite => {
            "SELECT m.name AS t, p.name AS c, p.\"notnull\" + p.pk AS nn \
             FROM sqlite_master m JOIN pragma_table_info(m.name) p \
             WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' AND m.name <> '_sqlx_migrations'"
        }
        Backend::Postgres => {
            "SELECT table_name::text AS t, column_name::text AS c, \
             CAST(CASE WHEN is_nullable = 'NO' THEN 1 ELSE 0 END AS BIGINT) AS nn \
             FROM information_schema.columns \
             WHERE table_schema = 'public' AND table_name <> '_sqlx_migrations'"
        }
    };
    sqlx::query(sql)
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get::<String, _>("t"),
                r.get::<String, _>("c"),
                r.get::<i64, _>("nn") != 0,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_dialects_migrate_to_the_same_tables_and_columns() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = columns(
        &migrated(Backend::Sqlite, dir.path()).await,
        Backend::Sqlite,
    )
    .await;
    let postgres = columns(
        &migrated(Backend::Postgres, dir.path()).await,
        Backend::Postgres,
    )
    .await;
    assert!(sqlite.len() > 80, "{sqlite:?}");
    let only_sqlite: Vec<_> = sqlite.difference(&postgres).collect();
    let only_postgres: Vec<_> = postgres.difference(&sqlite).collect();
    assert!(
        only_sqlite.is_empty() && only_postgres.is_empty(),
        "only in SQLite: {only_sqlite:?}\nonly in PostgreSQL: {only_postgres:?}"
    );
}

const INSERT_CLUSTER: &str = "INSERT INTO clusters (org_id, name, phase, spec_json, key_algorithm, \
    kubernetes_version, service_cidr, pod_cidr, cluster_domain, control_plane_dns_name, created_at, updated_at) \
    VALUES (7, 'c', $1, '{}', 'ecdsa-p256', 'v1.35.3', '10.96.0.0/12', '172.16.0.0/12', 'cluster.local', 'c.k8s', 1, 1) \
    RETURNING id";

async fn insert_node(db: &Db, cluster: i64, ordinal: i64, phase: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO cluster_nodes (cluster_id, ordinal, vm_id, node_name, private_ipv4, is_initial, phase, created_at) \
         VALUES ($1, $2, $3, 'n', '10.0.0.1', 0, $4, 1)",
    )
    .bind(cluster)
    .bind(ordinal)
    .bind(cluster * 100 + ordinal)
    .bind(phase)
    .execute(&db.pool)
    .await
    .map(|_| ())
}

async fn closed_sets_are_checked_by_the_database(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let db = migrated(backend, dir.path()).await;
    let insert = |phase: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query(INSERT_CLUSTER)
                .bind(phase)
                .fetch_one(&pool)
                .await
                .map(|r| r.get::<i64, _>("id"))
        }
    };
    assert!(
        insert("founding").await.is_err(),
        "an unknown cluster phase"
    );
    let cluster = insert("founded").await.unwrap();
    assert!(insert_node(&db, cluster, 1, "booting").await.is_err());
    assert!(insert_node(&db, cluster, 1, "etcd:failed").await.is_err());
    insert_node(&db, cluster, 1, "etcd").await.unwrap();
    for refused in [
        "UPDATE cluster_nodes SET role = 'master'",
        "UPDATE cluster_nodes SET phase_state = 'ok'",
        "UPDATE cluster_nodes SET desired_generation = 0",
        "UPDATE clusters SET phase = 'done'",
    ] {
        assert!(
            sqlx::query(refused).execute(&db.pool).await.is_err(),
            "{refused} was accepted"
        );
    }
    sqlx::query("UPDATE cluster_nodes SET role = 'worker', phase = 'sync', phase_state = 'failed'")
        .execute(&db.pool)
        .await
        .unwrap();
}

/// A fresh database (its SQLite file in `dir`) migrated up to, not including, the migration
/// whose file name starts with `first_left_out`.
async fn migrated_before(backend: Backend, dir: &std::path::Path, first_left_out: &str) -> Db {
    let url = fresh_database(backend, dir).await;
    migrate_from_files(backend, &url, |name| name < first_left_out, &[]).await;
    Db::connect(&url).unwrap()
}

/// Migrates `url` with the migration files of `backend`'s dialect that `keep` names, then each
/// of `extra` (file name, SQL) — another release's migrations, as its binary would run them.
pub(crate) async fn migrate_from_files(
    backend: Backend,
    url: &str,
    keep: impl Fn(&str) -> bool,
    extra: &[(&str, &str)],
) {
    let dialect = match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../migrations")
        .join(dialect);
    let chosen = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let name = entry.unwrap().file_name();
        if keep(name.to_str().unwrap()) {
            std::fs::copy(source.join(&name), chosen.path().join(&name)).unwrap();
        }
    }
    for (name, sql) in extra {
        std::fs::write(chosen.path().join(name), sql).unwrap();
    }
    let db = Db::connect(url).unwrap();
    sqlx::migrate::Migrator::new(chosen.path())
        .await
        .unwrap()
        .run(&db.pool)
        .await
        .unwrap();
    db.pool.close().await;
}

/// Rows of a database at migration 0002 (free-text phases) keep their meaning at 0003.
async fn rows_from_before_the_node_model_migrate(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let db = migrated_before(backend, dir.path(), "0003").await;
    let cluster: i64 = sqlx::query(INSERT_CLUSTER)
        .bind("founded")
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get("id");
    for (ordinal, phase) in [(1, "complete"), (2, "etcd:failed"), (3, "pending")] {
        insert_node(&db, cluster, ordinal, phase).await.unwrap();
    }
    // A facet row hangs off each node by a cascading foreign key: rewriting the node table
    // must not delete it.
    sqlx::query(
        "INSERT INTO etcd_members (node_id, server_cert, server_key_sealed, peer_cert, peer_key_sealed) \
         SELECT id, 'c', 'k', 'c', 'k' FROM cluster_nodes",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    db.migrate().await.unwrap();
    let facets: i64 = sqlx::query("SELECT COUNT(*) AS n FROM etcd_members")
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get("n");
    assert_eq!(facets, 3, "facet rows survive the migration");
    let rows = sqlx::query(
        "SELECT phase, phase_state, role, desired_generation, applied_generation \
         FROM cluster_nodes ORDER BY ordinal",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let got: Vec<(String, String, String, i64, i64)> = rows
        .iter()
        .map(|r| {
            (
                r.get("phase"),
                r.get("phase_state"),
                r.get("role"),
                r.get("desired_generation"),
                r.get("applied_generation"),
            )
        })
        .collect();
    let row = |p: &str, s: &str, applied| (p.into(), s.into(), "control-plane".into(), 1, applied);
    assert_eq!(
        got,
        vec![
            row("complete", "succeeded", 1),
            row("etcd", "failed", 0),
            row("pending", "succeeded", 0),
        ]
    );
    let phase: String = sqlx::query("SELECT phase FROM clusters")
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get("phase");
    assert_eq!(phase, "founded");
}

/// Migration 0016 drops the rows of earlier bundles of a node's generation (the inventory
/// reads only the latest per name) and keeps everything else.
async fn superseded_certificate_rows_are_dropped(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let db = migrated_before(backend, dir.path(), "0016").await;
    let cluster: i64 = sqlx::query(INSERT_CLUSTER)
        .bind("founded")
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get("id");
    insert_node(&db, cluster, 1, "pending").await.unwrap();
    // (on the node, generation, name, stays after 0016), in insertion order.
    let rows = [
        (true, 1, "kubelet", false),
        (true, 1, "apiserver", true),
        (true, 1, "kubelet", false),
        (true, 1, "kubelet", true),
        (true, 2, "kubelet", false),
        (true, 2, "kubelet", true),
        (false, 0, "cluster-ca", true),
    ];
    let mut kept = Vec::new();
    for (on_node, generation, name, stays) in rows {
        let id: i64 = sqlx::query(
            "INSERT INTO issued_certificates (cluster_id, node_id, generation, name, kind, \
             subject, issuer, serial, not_before, not_after, created_at) \
             VALUES ($1, (SELECT id FROM cluster_nodes WHERE $2 = 1), $3, $4, 'client', 's', \
             'i', '01', 1, 2, 1) RETURNING id",
        )
        .bind(cluster)
        .bind(i64::from(on_node))
        .bind(generation)
        .bind(name)
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get("id");
        if stays {
            kept.push(id);
        }
    }
    db.migrate().await.unwrap();
    let left: Vec<i64> = sqlx::query("SELECT id FROM issued_certificates ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("id"))
        .collect();
    assert_eq!(left, kept);
}

both_backends!(
    closed_sets_are_checked_by_the_database,
    rows_from_before_the_node_model_migrate,
    superseded_certificate_rows_are_dropped
);

/// A database that first answers only after the pool's acquire timeout (5 s) has passed — a
/// server started beside its database, or a disk busy enough that opening a connection takes
/// that long: the migrations wait for it instead of failing the start. The database is reached
/// through a port nothing listens on until a forwarder opens it, 7 s in.
#[tokio::test]
async fn the_migrations_wait_for_a_database_that_answers_late() {
    let dir = tempfile::tempdir().unwrap();
    let mut url =
        reqwest::Url::parse(&fresh_database(Backend::Postgres, dir.path()).await).unwrap();
    let real = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    url.set_port(Some(port)).unwrap();
    let late = std::time::Duration::from_secs(7);
    tokio::spawn(async move {
        tokio::time::sleep(late).await;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        loop {
            let (mut client, _) = listener.accept().await.unwrap();
            let real = real.clone();
            tokio::spawn(async move {
                let mut server = tokio::net::TcpStream::connect(real).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    let started = std::time::Instant::now();
    let db = Db::connect(url.as_str()).unwrap();
    db.migrate().await.unwrap();
    assert!(started.elapsed() >= late, "{:?}", started.elapsed());
    let migrated: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(migrated > 30, "{migrated}");
}
