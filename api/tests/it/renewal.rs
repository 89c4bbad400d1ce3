//! Certificates renew themselves, under an injected clock on SQLite and PostgreSQL: a cluster
//! whose leaves last three days, moved forward a day at a time for thirty days, with each node
//! syncing whatever the rollout hands it. Every node is renewed about every two days, never two
//! control-plane nodes in flight at once, no leaf a node runs is ever past its notAfter, and the
//! renewed certificates (serving ones included) verify with openssl at the clock's time.

use std::collections::BTreeMap;
use std::sync::Arc;

use exk8s_api::clock::{Clock as _, ManualClock};
use exk8s_common::node_auth::NodeKey;
use serde_json::{Value, json};
use sqlx::Row as _;
use time::{Duration, OffsetDateTime};

use crate::app::{Backend, TestApp, both_backends, spawn_clocked, test_config};
use crate::bootstrap::{credentials_for, report};
use crate::helpers::{openssl, openssl_verify};
use crate::sync::{fetch_update, register, sync_report, update_payload};

async fn in_flight(app: &TestApp, cluster: i64) -> i64 {
    sqlx::query(
        "SELECT COUNT(*) AS n FROM cluster_nodes WHERE cluster_id = $1 \
         AND role = 'control-plane' AND handed_generation > applied_generation",
    )
    .bind(cluster)
    .fetch_one(&app.state.db.pool)
    .await
    .unwrap()
    .get("n")
}

/// `openssl verify` of a bundle's certificate file against its CA file at unix time `at`.
fn verifies(payload: &exk8s_common::BundlePayload, ca: &str, leaf: &str, at: i64) {
    let file = |path: &str| payload.file(path).unwrap().content.as_bytes().to_vec();
    let (ok, out) = openssl_verify(&file(ca), &file(leaf), Some(at));
    assert!(ok, "{leaf} at {at}: {out}");
}

async fn leaves_renew_themselves_over_thirty_days(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(OffsetDateTime::now_utc()));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let created: Value = app
        .found(
            3,
            json!({"leaf_lifetime_days": 3, "control_plane_image_id": 42}),
        )
        .await
        .json()
        .await
        .unwrap();
    let cluster = created["cluster_id"].as_i64().unwrap();
    let nodes = credentials_for(&app, 7, &created).await;
    let mut keys = Vec::new();
    let mut last: BTreeMap<i64, exk8s_common::BundlePayload> = BTreeMap::new();
    for node in &nodes {
        let key = NodeKey::generate().unwrap();
        last.insert(node.vm, register(&app, node, &key).await);
        assert_eq!(report(&app, node, "complete", "succeeded").await, 204);
        keys.push(key);
    }
    let mut renewals: BTreeMap<i64, u32> = BTreeMap::new();
    for day in 1..=30 {
        clock.advance(Duration::days(1));
        exk8s_api::renewal::pass(&app.state.renewer())
            .await
            .unwrap();
        // The nodes' timers: each asks until nobody has anything left to apply.
        for _round in 0..6 {
            let mut moved = false;
            for (node, key) in nodes.iter().zip(&keys) {
                let response = fetch_update(&app, node, key).await;
                match response.status().as_u16() {
                    204 | 409 => continue,
                    200 => {}
                    other => panic!("day {day}: vm {}: {other}", node.vm),
                }
                assert!(
                    in_flight(&app, cluster).await <= 1,
                    "day {day}: two nodes in flight"
                );
                let payload = update_payload(&app, response).await;
                sync_report(&app, node, key, "succeeded", payload.identity.generation).await;
                *renewals.entry(node.vm).or_default() += 1;
                last.insert(node.vm, payload);
                moved = true;
            }
            if !moved {
                break;
            }
        }
        // No leaf a node runs is past its notAfter; the inventory says so too.
        let now = clock.unix();
        let inventory: Value = app
            .http
            .get(format!("{}/clusters/{cluster}/certificates", app.url))
            .bearer_auth(&app.token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for entry in inventory["certificates"].as_array().unwrap() {
            if entry["vm_id"].is_null() {
                continue; // the CAs, and the operator kubeconfig (re-minted on request)
            }
            assert!(
                entry["not_after"].as_i64().unwrap() > now,
                "day {day}: expired: {entry}"
            );
        }
        for payload in last.values() {
            for (ca, leaf) in [
                ("/etc/exk8s/pki/ca.pem", "/etc/exk8s/pki/apiserver.pem"),
                ("/etc/exk8s/pki/ca.pem", "/etc/exk8s/pki/kubelet.pem"),
                (
                    "/etc/exk8s/pki/etcd-ca.pem",
                    "/etc/exk8s/pki/etcd-server.pem",
                ),
                ("/etc/exk8s/pki/etcd-ca.pem", "/etc/exk8s/pki/etcd-peer.pem"),
                (
                    "/etc/exk8s/pki/etcd-ca.pem",
                    "/etc/exk8s/pki/apiserver-etcd-client.pem",
                ),
            ] {
                verifies(payload, ca, leaf, now);
            }
        }
    }
    // About every two days: fifteen renewals in thirty days, give or take the last.
    for node in &nodes {
        let count = renewals.get(&node.vm).copied().unwrap_or(0);
        assert!(
            (14..=16).contains(&count),
            "vm {}: {count} renewals",
            node.vm
        );
    }
}

both_backends!(leaves_renew_themselves_over_thirty_days);

async fn a_pass_reads_the_fleet_a_page_at_a_time_and_renews_every_page(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(OffsetDateTime::now_utc()));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let mut vms = Vec::new();
    for _ in 0..5 {
        let created: Value = app
            .found(1, json!({"leaf_lifetime_days": 3}))
            .await
            .json()
            .await
            .unwrap();
        let node = credentials_for(&app, 7, &created).await.remove(0);
        register(&app, &node, &NodeKey::generate().unwrap()).await;
        assert_eq!(report(&app, &node, "complete", "succeeded").await, 204);
        vms.push(node.vm);
    }
    // A day in, nothing is due: the pass reads every page and renews nothing.
    clock.advance(Duration::days(1));
    assert!(
        exk8s_api::renewal::pass_in_pages(&app.state.renewer(), 2)
            .await
            .unwrap()
            .is_empty()
    );
    // Past two thirds of the leaves' three days, every node of every page (2 + 2 + 1) is due.
    clock.advance(Duration::hours(25));
    let renewed = exk8s_api::renewal::pass_in_pages(&app.state.renewer(), 2)
        .await
        .unwrap();
    let renewed: Vec<i64> = renewed.iter().map(|r| r.vm_id).collect();
    assert_eq!(renewed, vms);
    // Each is moving to its next generation now: a second pass finds nothing to do.
    assert!(
        exk8s_api::renewal::pass_in_pages(&app.state.renewer(), 2)
            .await
            .unwrap()
            .is_empty()
    );
}

both_backends!(a_pass_reads_the_fleet_a_page_at_a_time_and_renews_every_page);

/// What openssl says about a bundle file's certificate (`-serial` or `-ext subjectAltName`).
fn openssl_says(payload: &exk8s_common::BundlePayload, path: &str, args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("c.pem"),
        payload.file(path).unwrap().content.as_bytes(),
    )
    .unwrap();
    let mut all = vec!["x509", "-noout", "-in", "c.pem"];
    all.extend_from_slice(args);
    let (ok, out) = openssl(&all, dir.path());
    assert!(ok, "{out}");
    out
}

async fn a_forced_renewal_re_mints_every_leaf_keeping_the_serving_names(backend: Backend) {
    let app = crate::app::spawn_app(backend).await;
    let created: Value = app
        .found(3, json!({"control_plane_image_id": 42}))
        .await
        .json()
        .await
        .unwrap();
    let cluster = created["cluster_id"].as_i64().unwrap();
    let nodes = credentials_for(&app, 7, &created).await;
    let mut booted = Vec::new();
    for node in &nodes {
        let key = NodeKey::generate().unwrap();
        let first = register(&app, node, &key).await;
        assert_eq!(report(&app, node, "complete", "succeeded").await, 204);
        booted.push((node, key, first));
    }
    let renew = |id: i64| {
        app.http
            .post(format!("{}/clusters/{id}/certificates/renew", app.url))
            .bearer_auth(&app.token)
            .send()
    };
    assert_eq!(renew(999_999).await.unwrap().status(), 404);
    let started = renew(cluster).await.unwrap();
    assert_eq!(started.status(), 202);
    let started: Value = started.json().await.unwrap();
    assert_eq!(started["nodes"].as_array().unwrap().len(), 3, "{started}");
    for (node, key, first) in &booted {
        let renewed = update_payload(&app, fetch_update(&app, node, key).await).await;
        sync_report(&app, node, key, "succeeded", renewed.identity.generation).await;
        for file in first.files.iter().filter(|f| {
            f.path.as_str().ends_with(".pem")
                && f.content.as_bytes().starts_with(b"-----BEGIN CERTIFICATE")
        }) {
            let path = file.path.as_str();
            let (before, after) = (
                openssl_says(first, path, &["-serial"]),
                openssl_says(&renewed, path, &["-serial"]),
            );
            if path.ends_with("ca.pem") {
                assert_eq!(before, after, "{path}: a CA changed");
            } else {
                assert_ne!(before, after, "{path} was not re-minted");
            }
        }
        for path in [
            "/etc/exk8s/pki/apiserver.pem",
            "/etc/exk8s/pki/etcd-server.pem",
        ] {
            assert_eq!(
                openssl_says(first, path, &["-ext", "subjectAltName"]),
                openssl_says(&renewed, path, &["-ext", "subjectAltName"]),
                "{path}: the names changed"
            );
        }
    }
}

both_backends!(a_forced_renewal_re_mints_every_leaf_keeping_the_serving_names);
