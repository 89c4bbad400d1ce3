//! A cluster founded from another's snapshot (`restore_from`), on SQLite and PostgreSQL, the
//! members played by the test: it keeps the source's trust and restores the snapshot before
//! anything else starts.

use exk8s_common::node_auth::NodeKey;
use serde_json::{Value, json};

use crate::app::{Backend, TestApp, both_backends, json_of, spawn_app};
use crate::restore::{ack, restore_view, signed, stored, task};
use crate::sync::booted_cluster;

/// `POST /clusters` for one node restored from `restore_from`, with `extra` fields.
async fn found_from(app: &TestApp, restore_from: Value, extra: Value) -> reqwest::Response {
    let mut body = json!({"control_plane_image_id": 42, "restore_from": restore_from});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    app.found(1, body).await
}

async fn sealed_column(app: &TestApp, cluster: i64, column: &str) -> String {
    use sqlx::Row as _;
    sqlx::query(&format!("SELECT {column} FROM clusters WHERE id = $1"))
        .bind(cluster)
        .fetch_one(&app.state.db.pool)
        .await
        .unwrap()
        .get::<String, _>(column)
}

async fn a_cluster_founded_from_a_snapshot_keeps_the_trust_and_restores_it(backend: Backend) {
    let app = spawn_app(backend).await;
    let nodes = booted_cluster(&app).await;
    let source = nodes[0].0.cluster;
    let (snapshot_id, snapshot) = stored(&app, source, (&nodes[0].0, &nodes[0].1)).await;

    // What restore_from names is checked before anything is made.
    let refusals = [
        (
            json!({"cluster_id": 999_999, "snapshot_id": snapshot_id}),
            json!({}),
            "restore_from",
        ),
        (
            json!({"cluster_id": source}),
            json!({}),
            "restore_from.snapshot_id",
        ),
        (
            json!({"cluster_id": source, "snapshot_id": snapshot_id + 50}),
            json!({}),
            "restore_from",
        ),
        (
            json!({"cluster_id": source, "snapshot_id": snapshot_id}),
            json!({"key_algorithm": "rsa-2048"}),
            "key_algorithm",
        ),
    ];
    let clusters = app.cluster_count().await;
    for (from, extra, field) in refusals {
        let refused = found_from(&app, from.clone(), extra).await;
        let status = refused.status();
        let said = json_of(refused).await;
        assert!(status == 400 || status == 422, "{from}: {status} {said}");
        assert_eq!(said["error"]["field"], field, "{from}: {said}");
    }
    assert_eq!(app.cluster_count().await, clusters, "nothing was made");

    // Between service-account keys (sign-new: the old key's tokens still verify at the
    // source), the source would not be carried whole: refused with the reason, nothing made.
    // In trust-both (the waiting key signed nothing) it would be, and the founding goes on.
    let put_rotation = |phase: &'static str| {
        let pool = app.state.db.pool.clone();
        async move {
            sqlx::query("DELETE FROM sa_key_rotations WHERE cluster_id = $1")
                .bind(source)
                .execute(&pool)
                .await
                .unwrap();
            sqlx::query(
                "INSERT INTO sa_key_rotations (cluster_id, phase, other_public, \
                 drop_old_after, signing_since, started_at, updated_at) \
                 VALUES ($1, $2, 'old public key', 90000, NULL, 1, 1)",
            )
            .bind(source)
            .bind(phase)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    put_rotation("sign-new").await;
    let refused = found_from(
        &app,
        json!({"cluster_id": source, "snapshot_id": snapshot_id}),
        json!({}),
    )
    .await;
    assert_eq!(refused.status(), 409);
    let said = json_of(refused).await.to_string();
    assert!(
        said.contains("rotating its service-account key (phase sign-new)")
            && said.contains("found it once the old key is dropped"),
        "{said}"
    );
    assert_eq!(app.cluster_count().await, clusters, "nothing was made");
    put_rotation("trust-both").await;

    // The source's service-account key is 400 days old: the new cluster keeps it, and its age.
    let made_at = exk8s_api::db::now() - 400 * 86_400;
    sqlx::query("UPDATE clusters SET sa_key_created_at = $1 WHERE id = $2")
        .bind(made_at)
        .bind(source)
        .execute(&app.state.db.pool)
        .await
        .unwrap();
    let created = found_from(
        &app,
        json!({"cluster_id": source, "snapshot_id": snapshot_id}),
        json!({}),
    )
    .await;
    assert_eq!(created.status(), 201);
    sqlx::query("DELETE FROM sa_key_rotations WHERE cluster_id = $1")
        .bind(source)
        .execute(&app.state.db.pool)
        .await
        .unwrap();
    let created = json_of(created).await;
    let restored = created["cluster_id"].as_i64().unwrap();
    let key = json_of(
        app.get(&format!("/clusters/{restored}/service-account-key"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(key["created_at"], made_at, "{key}");
    assert_eq!(key["age_days"], 400, "{key}");
    assert_ne!(created["control_plane_dns_name"], json!(null));
    // The source's trust, sealed anew for the new cluster: the same CAs and keys.
    let trust = |cluster: i64| {
        let app = &app;
        async move {
            json_of(
                app.get(&format!("/clusters/{cluster}/trust"))
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        }
    };
    let (ours, theirs) = (trust(restored).await, trust(source).await);
    assert_eq!(
        ours["certificate_authority_pem"],
        theirs["certificate_authority_pem"]
    );
    assert_ne!(ours["server"], theirs["server"], "a new DNS name");
    for column in ["sa_public", "etcd_ca_cert", "front_proxy_ca_cert"] {
        assert_eq!(
            sealed_column(&app, restored, column).await,
            sealed_column(&app, source, column).await,
            "{column}"
        );
    }
    assert_ne!(
        sealed_column(&app, restored, "encryption_key_sealed").await,
        sealed_column(&app, source, "encryption_key_sealed").await,
        "sealed anew, under the new cluster's name"
    );
    // Nothing is restored before its control plane is up; once its member reported, it is.
    assert_eq!(
        restore_view(&app, restored).await["error"]["code"],
        "not_found"
    );
    let node = crate::bootstrap::credentials_for(&app, 7, &created)
        .await
        .remove(0);
    let key = NodeKey::generate().unwrap();
    crate::sync::register(&app, &node, &key).await;
    assert_eq!(
        crate::bootstrap::report(&app, &node, "complete", "succeeded").await,
        204
    );
    let started = restore_view(&app, restored).await;
    assert_eq!(started["phase"], "stop", "{started}");
    assert_eq!(started["snapshot_id"], snapshot_id);
    let member = (&node, &key);
    let told = task(&app, member).await;
    assert_eq!(told["step"], "stop");
    let id = told["id"].as_i64().unwrap();
    assert_eq!(ack(&app, member, id, "stop", "").await, 204);
    assert_eq!(task(&app, member).await["step"], "restore");
    let content = format!("/nodes/{}/snapshots/{snapshot_id}/content", node.vm);
    let fetched = signed(&app, member, "GET", &content, b"").await;
    assert_eq!(fetched.status(), 200);
    assert_eq!(
        fetched.bytes().await.unwrap().as_ref(),
        snapshot.as_slice(),
        "the source's snapshot"
    );
    assert_eq!(ack(&app, member, id, "restore", "").await, 204);
    assert_eq!(ack(&app, member, id, "start", "").await, 204);
    assert_eq!(restore_view(&app, restored).await["phase"], "done");
    // Once done, the next report starts nothing again.
    assert_eq!(
        crate::bootstrap::report(&app, &node, "complete", "succeeded").await,
        204
    );
    assert_eq!(restore_view(&app, restored).await["id"], id);
}

both_backends!(a_cluster_founded_from_a_snapshot_keeps_the_trust_and_restores_it);
