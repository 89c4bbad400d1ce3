//! Service-account key rotation on SQLite and PostgreSQL, with the nodes' syncs played by the
//! test and an injected clock: trust-both (every apiserver's public-key file carries the old
//! and the new key; the old one still signs), sign-new (the new key signs — openssl derives the
//! trusted public key from it — and the old is still trusted), then, only once the wait after
//! every node applied sign-new is over, drop-old (the new key alone). Refusals on the way (one
//! change at a time, bad input naming its field), the rotation carried on by another API
//! process after the first is gone, and the key's age: the condition that warns and the
//! rotation the reconciler starts for a cluster that asked for it.

use std::sync::Arc;

use exk8s_api::clock::ManualClock;
use serde_json::{Value, json};
use time::{Duration, OffsetDateTime};

use crate::app::{
    Backend, TestApp, both_backends, json_of, spawn_clocked, spawn_replica, test_config,
};
use crate::membership::condition;
use crate::rotation::{booted, every_node_syncs};

const PUBLIC: &str = "/etc/exk8s/pki/service-account.pem";
const KEY: &str = "/etc/exk8s/pki/service-account-key.pem";

fn file(payload: &exk8s_common::BundlePayload, path: &str) -> String {
    String::from_utf8(payload.file(path).unwrap().content.as_bytes().to_vec()).unwrap()
}

fn keys_in(pem: &str) -> usize {
    pem.matches("-----BEGIN PUBLIC KEY-----").count()
}

/// The public key openssl derives from a private key (PEM).
fn public_of(private_pem: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("key.pem");
    std::fs::write(&path, private_pem).unwrap();
    let out = std::process::Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

async fn rotate(app: &TestApp, cluster: i64, body: Value) -> reqwest::Response {
    app.post(&format!("/clusters/{cluster}/certificates/rotate-sa-key"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn view(app: &TestApp, cluster: i64) -> Value {
    json_of(
        app.get(&format!("/clusters/{cluster}"))
            .send()
            .await
            .unwrap(),
    )
    .await
}

async fn phase(app: &TestApp, cluster: i64) -> Option<String> {
    view(app, cluster).await["service_account_key"]["rotation"]["phase"]
        .as_str()
        .map(str::to_owned)
}

async fn reconcile(app: &TestApp) {
    exk8s_api::founding::reconcile::sa_rotations(&app.state.reconciler()).await;
}

async fn the_service_account_key_rotates_in_three_phases(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(OffsetDateTime::now_utc()));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let (cluster, nodes, first) = booted(&app).await;
    let old_public = file(&first, PUBLIC);
    let old_key = file(&first, KEY);
    assert_eq!(keys_in(&old_public), 1);
    assert_eq!(public_of(&old_key), old_public, "the bundle's pair agrees");

    for (body, status, field) in [
        (
            json!({"drop_old_after_seconds": -1}),
            422,
            Some("drop_old_after_seconds"),
        ),
        (
            json!({"drop_old_after_seconds": 2_592_001}),
            422,
            Some("drop_old_after_seconds"),
        ),
        (json!({"drop_old_after": 5}), 400, None),
    ] {
        let response = rotate(&app, cluster, body.clone()).await;
        assert_eq!(response.status(), status, "{body}");
        let said = json_of(response).await;
        if let Some(field) = field {
            assert_eq!(said["error"]["field"], field, "{said}");
        }
    }
    assert_eq!(rotate(&app, 999_999, json!({})).await.status(), 404);
    assert_eq!(phase(&app, cluster).await, None, "nothing started");

    let started = rotate(&app, cluster, json!({"drop_old_after_seconds": 3600})).await;
    assert_eq!(started.status(), 202);
    let started = json_of(started).await;
    assert_eq!(started["phase"], "trust-both", "{started}");
    assert_eq!(started["drop_old_after_seconds"], 3600, "{started}");
    assert_eq!(started["nodes"].as_array().unwrap().len(), 3, "{started}");

    // One change at a time, each refusal naming the rotation.
    let again = rotate(&app, cluster, json!({})).await;
    assert_eq!(again.status(), 409);
    assert!(json_of(again).await.to_string().contains("trust-both"));
    for response in [
        app.post(&format!("/clusters/{cluster}/certificates/rotate-ca"))
            .json(&json!({"ca": "cluster"}))
            .send()
            .await
            .unwrap(),
        app.patch(&format!("/clusters/{cluster}"))
            .json(&json!({"control_plane_count": 5}))
            .send()
            .await
            .unwrap(),
    ] {
        assert_eq!(response.status(), 409);
        let said = json_of(response).await.to_string();
        assert!(said.contains("service-account key"), "{said}");
    }
    let seen = view(&app, cluster).await;
    let rotating = condition(&seen, "ServiceAccountKeyRotating");
    assert_eq!(
        (&rotating["status"], &rotating["reason"]),
        (&json!("True"), &json!("WaitingForNode")),
        "{rotating}"
    );

    // trust-both: both public keys trusted, the old key signs.
    let trust_both = every_node_syncs(&app, &nodes).await;
    let mut new_public = String::new();
    for payload in &trust_both {
        let public = file(payload, PUBLIC);
        assert_eq!(keys_in(&public), 2, "{public}");
        assert!(public.starts_with(&old_public));
        new_public = public[old_public.len()..].to_owned();
        assert_eq!(file(payload, KEY), old_key, "the old key still signs");
    }
    assert_ne!(new_public, old_public);
    assert_eq!(phase(&app, cluster).await.as_deref(), Some("sign-new"));

    // sign-new: the new key signs, both are trusted.
    let sign_new = every_node_syncs(&app, &nodes).await;
    for payload in &sign_new {
        let key = file(payload, KEY);
        assert_eq!(public_of(&key), new_public, "the new key signs");
        let public = file(payload, PUBLIC);
        assert_eq!(keys_in(&public), 2);
        assert!(public.starts_with(&new_public) && public.ends_with(&old_public));
    }
    // Every node signs with the new key: the old one stays for the wait, then goes.
    let seen = view(&app, cluster).await;
    let key = &seen["service_account_key"];
    let since = key["rotation"]["signing_since"].as_i64().unwrap();
    assert_eq!(key["rotation"]["drop_old_at"], since + 3600, "{key}");
    assert_eq!(
        key["created_at"], since,
        "the new key's age counts from sign-new: {key}"
    );
    let rotating = condition(&seen, "ServiceAccountKeyRotating");
    assert_eq!(rotating["reason"], "WaitingForTokenRefresh", "{rotating}");
    reconcile(&app).await;
    clock.advance(Duration::seconds(3599));
    reconcile(&app).await;
    assert_eq!(phase(&app, cluster).await.as_deref(), Some("sign-new"));
    clock.advance(Duration::seconds(1));
    reconcile(&app).await;
    assert_eq!(phase(&app, cluster).await.as_deref(), Some("drop-old"));

    // drop-old: the new key alone; the rotation ends.
    let drop_old = every_node_syncs(&app, &nodes).await;
    for payload in &drop_old {
        assert_eq!(file(payload, PUBLIC), new_public);
        assert_eq!(public_of(&file(payload, KEY)), new_public);
    }
    assert_eq!(phase(&app, cluster).await, None);
    let seen = view(&app, cluster).await;
    assert_eq!(
        condition(&seen, "ServiceAccountKeyRotating")["status"],
        "False"
    );
    let inventory = json_of(
        app.get(&format!("/clusters/{cluster}/certificates"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(inventory["service_account_key_age_days"], 0, "{inventory}");
    // Another change may start.
    assert_eq!(
        app.post(&format!("/clusters/{cluster}/certificates/rotate-ca"))
            .json(&json!({"ca": "cluster"}))
            .send()
            .await
            .unwrap()
            .status(),
        202
    );
    assert_eq!(
        rotate(&app, cluster, json!({})).await.status(),
        409,
        "now the CA rotates"
    );
}

both_backends!(the_service_account_key_rotates_in_three_phases);

/// The rotation is in the database, not in a process: started by one API, carried to its end
/// by another after the first is gone (its reconciler pass moves the phases reports missed).
async fn another_api_process_finishes_a_rotation(backend: Backend) {
    let first = crate::app::spawn_app(backend).await;
    let (cluster, nodes, bundle) = booted(&first).await;
    let old_public = file(&bundle, PUBLIC);
    assert_eq!(
        rotate(&first, cluster, json!({"drop_old_after_seconds": 0}))
            .await
            .status(),
        202
    );
    every_node_syncs(&first, &nodes).await;
    assert_eq!(phase(&first, cluster).await.as_deref(), Some("sign-new"));
    let second = spawn_replica(&first, backend).await;
    drop(first);
    reconcile(&second).await;
    every_node_syncs(&second, &nodes).await;
    reconcile(&second).await;
    assert_eq!(phase(&second, cluster).await.as_deref(), Some("drop-old"));
    let last = every_node_syncs(&second, &nodes).await;
    reconcile(&second).await;
    assert_eq!(phase(&second, cluster).await, None);
    let public = file(&last[0], PUBLIC);
    assert_eq!(keys_in(&public), 1);
    assert_ne!(public, old_public);
    assert_eq!(public_of(&file(&last[0], KEY)), public);
}

both_backends!(another_api_process_finishes_a_rotation);

/// Past its maximum age the key is flagged (`ServiceAccountKeyFresh` False, saying how to
/// rotate it); a cluster that asked for automatic rotation has it started by the reconciler.
async fn an_old_key_is_flagged_and_rotated_when_asked(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(OffsetDateTime::now_utc()));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let (cluster, _nodes, _) = booted(&app).await;
    let path = format!("/clusters/{cluster}/service-account-key");
    let key = json_of(app.get(&path).send().await.unwrap()).await;
    assert_eq!(
        (&key["max_age_days"], &key["auto_rotate"], &key["age_days"]),
        (&json!(365), &json!(false), &json!(0)),
        "{key}"
    );
    let fresh = condition(&view(&app, cluster).await, "ServiceAccountKeyFresh");
    assert_eq!(fresh["status"], "True", "{fresh}");
    for bad in [0, 3651] {
        let response = app
            .put(&path)
            .json(&json!({"max_age_days": bad, "auto_rotate": false}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 422);
        assert_eq!(json_of(response).await["error"]["field"], "max_age_days");
    }
    let set = app
        .put(&path)
        .json(&json!({"max_age_days": 30, "auto_rotate": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    assert_eq!(json_of(set).await["max_age_days"], 30);

    clock.advance(Duration::days(31));
    let seen = view(&app, cluster).await;
    let fresh = condition(&seen, "ServiceAccountKeyFresh");
    assert_eq!(
        (&fresh["status"], &fresh["reason"]),
        (&json!("False"), &json!("KeyTooOld")),
        "{fresh}"
    );
    let message = fresh["message"].as_str().unwrap();
    assert!(
        message.contains("31 days old") && message.contains("exk8s rotate-sa-key"),
        "{message}"
    );
    reconcile(&app).await;
    assert_eq!(
        phase(&app, cluster).await,
        None,
        "only flagged: it did not ask"
    );

    let set = app
        .put(&path)
        .json(&json!({"max_age_days": 30, "auto_rotate": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    reconcile(&app).await;
    assert_eq!(phase(&app, cluster).await.as_deref(), Some("trust-both"));
    let key = json_of(app.get(&path).send().await.unwrap()).await;
    assert_eq!(key["rotation"]["drop_old_after_seconds"], 90_000, "{key}");
    let fresh = condition(&view(&app, cluster).await, "ServiceAccountKeyFresh");
    assert_eq!(fresh["reason"], "KeyRotating", "{fresh}");
    assert_eq!(
        app.get("/clusters/999999/service-account-key")
            .send()
            .await
            .unwrap()
            .status(),
        404
    );

    // The credential matrix of the new routes: no token 401; another org's token 404 (nothing
    // about this cluster revealed, nothing started or changed).
    let other =
        crate::app::operator_token(&app.state, 8, exk8s_api::tokens::Scope::Operator, 3600).await;
    let routes = [
        ("GET", path.clone(), None),
        (
            "PUT",
            path.clone(),
            Some(json!({"max_age_days": 10, "auto_rotate": false})),
        ),
        (
            "POST",
            format!("/clusters/{cluster}/certificates/rotate-sa-key"),
            Some(json!({})),
        ),
    ];
    for (method, route, body) in routes {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        for (token, status) in [(None, 401), (Some(&other), 404)] {
            let mut request = app
                .http
                .request(method.clone(), format!("{}{route}", app.url));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            if let Some(body) = &body {
                request = request.json(body);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), status, "{method} {route}");
        }
    }
    let key = json_of(app.get(&path).send().await.unwrap()).await;
    assert_eq!(key["max_age_days"], 30, "unchanged: {key}");
}

both_backends!(an_old_key_is_flagged_and_rotated_when_asked);
