//! The day-2 routes on SQLite and PostgreSQL: the node-signature credential matrix (absent,
//! malformed, another VM's key, another VM's path, stale, replayed, unregistered, revoked,
//! valid), request nonces' expiry and sweep, and rollouts that hand a new generation to one
//! control-plane node at a time.

use exk8s_common::contract::BundleKind;
use exk8s_common::node_auth::{NodeKey, request_message};
use exk8s_common::{Keyring, verify};
use serde_json::{Value, json};

use crate::app::{Backend, TestApp, both_backends, json_of, spawn_app};
use crate::bootstrap::{Node, cluster_with_credentials, report};

/// A fresh nonce per request (16–64 URL-safe characters).
pub(crate) fn nonce() -> String {
    format!("sync-{}", uuid::Uuid::new_v4().simple())
}

/// The node's first fetch, registering `key`; its bundle's payload.
pub(crate) async fn register(
    app: &TestApp,
    node: &Node,
    key: &NodeKey,
) -> exk8s_common::BundlePayload {
    let response = app
        .http
        .get(format!("{}/bootstrap/control-plane/{}", app.url, node.vm))
        .header("X-Exk8s-Nonce", nonce())
        .header("X-exc-imds-token", &node.imds)
        .header("Authorization", format!("Bearer {}", node.bootstrap))
        .header("X-Exk8s-Node-Key", key.public().to_text())
        .send()
        .await
        .unwrap();
    update_payload(app, response).await
}

/// How a test request is signed.
pub(crate) struct Signing<'a> {
    pub(crate) key: Option<&'a NodeKey>,
    pub(crate) imds: &'a str,
    pub(crate) timestamp: i64,
    pub(crate) nonce: String,
    pub(crate) signature: Option<String>,
    /// Headers a route needs besides the signature's (an upload's declared digest).
    pub(crate) headers: Vec<(&'static str, String)>,
}

impl<'a> Signing<'a> {
    pub(crate) fn new(key: &'a NodeKey, imds: &'a str) -> Self {
        Self {
            key: Some(key),
            imds,
            timestamp: exk8s_api::db::now(),
            nonce: nonce(),
            signature: None,
            headers: Vec::new(),
        }
    }
}

pub(crate) async fn send(
    app: &TestApp,
    method: &str,
    path: &str,
    body: &[u8],
    s: &Signing<'_>,
) -> reqwest::Response {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = app
        .http
        .request(method.clone(), format!("{}{path}", app.url))
        .header("X-exc-imds-token", s.imds)
        .header("X-Exk8s-Nonce", &s.nonce)
        .header("X-Exk8s-Timestamp", s.timestamp.to_string());
    let signature = s.signature.clone().or_else(|| {
        s.key.map(|key| {
            key.sign(&request_message(
                method.as_str(),
                path,
                s.timestamp,
                &s.nonce,
                body,
            ))
        })
    });
    if let Some(signature) = signature {
        request = request.header("X-Exk8s-Signature", signature);
    }
    for (name, value) in &s.headers {
        request = request.header(*name, value);
    }
    if !body.is_empty() {
        request = request
            .header("Content-Type", "application/json")
            .body(body.to_vec());
    }
    request.send().await.unwrap()
}

async fn refused_audits(app: &TestApp) -> i64 {
    use sqlx::Row as _;
    sqlx::query("SELECT COUNT(*) AS n FROM bundle_issuances WHERE outcome = 'refused'")
        .fetch_one(&app.state.db.pool)
        .await
        .unwrap()
        .get("n")
}

async fn node_signature_credential_matrix(backend: Backend) {
    let app = spawn_app(backend).await;
    let nodes = cluster_with_credentials(&app, 7, 3).await;
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let (key_a, key_b, key_c) = (
        NodeKey::generate().unwrap(),
        NodeKey::generate().unwrap(),
        NodeKey::generate().unwrap(),
    );
    register(&app, a, &key_a).await;
    register(&app, b, &key_b).await;
    let path_a = format!("/nodes/{}/generation", a.vm);

    let mut unauthorized_bodies = Vec::new();
    let before = refused_audits(&app).await;
    let absent = Signing {
        key: None,
        ..Signing::new(&key_a, &a.imds)
    };
    let malformed = Signing {
        signature: Some("not-a-signature".into()),
        ..Signing::new(&key_a, &a.imds)
    };
    let stale = Signing {
        timestamp: exk8s_api::db::now() - 301,
        ..Signing::new(&key_a, &a.imds)
    };
    let cases = [
        ("absent", &absent),
        ("malformed", &malformed),
        ("another VM's key", &Signing::new(&key_b, &a.imds)),
        ("stale", &stale),
    ];
    for (case, signing) in cases {
        let response = send(&app, "GET", &path_a, b"", signing).await;
        assert_eq!(response.status(), 401, "{case}");
        unauthorized_bodies.push(response.text().await.unwrap());
    }
    // A's IMDS token on B's path: nothing about B is revealed.
    let other_path = send(
        &app,
        "GET",
        &format!("/nodes/{}/generation", b.vm),
        b"",
        &Signing::new(&key_a, &a.imds),
    )
    .await;
    assert_eq!(other_path.status(), 404);
    // A node that never registered a key has no day-2 credential.
    let unregistered = send(
        &app,
        "GET",
        &format!("/nodes/{}/generation", c.vm),
        b"",
        &Signing::new(&key_c, &c.imds),
    )
    .await;
    assert_eq!(unregistered.status(), 401);

    let valid = Signing::new(&key_a, &a.imds);
    let response = send(&app, "GET", &path_a, b"", &valid).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        json_of(response).await,
        json!({"desired_generation": 1, "applied_generation": 0, "up_to_date": false})
    );
    let replayed = send(&app, "GET", &path_a, b"", &valid).await;
    assert_eq!(replayed.status(), 401, "replayed");
    unauthorized_bodies.push(replayed.text().await.unwrap());
    // A signature for one path does not open another.
    let moved = Signing::new(&key_a, &a.imds);
    let signature = key_a.sign(&request_message(
        "GET",
        &path_a,
        moved.timestamp,
        &moved.nonce,
        b"",
    ));
    let moved = Signing {
        signature: Some(signature),
        ..moved
    };
    let response = send(&app, "GET", &format!("/nodes/{}/bundle", a.vm), b"", &moved).await;
    assert_eq!(response.status(), 401, "signature for another path");

    // Deleting the cluster revokes the node credential.
    let deleted = app
        .delete(&format!("/clusters/{}", a.cluster))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let revoked = send(&app, "GET", &path_a, b"", &Signing::new(&key_a, &a.imds)).await;
    assert_eq!(revoked.status(), 401, "revoked");
    unauthorized_bodies.push(revoked.text().await.unwrap());

    unauthorized_bodies.dedup();
    assert_eq!(
        unauthorized_bodies.len(),
        1,
        "one body for every bad credential: {unauthorized_bodies:?}"
    );
    assert_eq!(
        refused_audits(&app).await - before,
        9,
        "every refusal is audited"
    );
}

/// Every node of the cluster fetched its first bundle with a key and reported complete.
pub(crate) async fn booted_cluster(app: &TestApp) -> Vec<(Node, NodeKey)> {
    let nodes = cluster_with_credentials(app, 7, 3).await;
    let mut booted = Vec::new();
    for node in nodes {
        let key = NodeKey::generate().unwrap();
        register(app, &node, &key).await;
        assert_eq!(report(app, &node, "complete", "succeeded").await, 204);
        booted.push((node, key));
    }
    booted
}

pub(crate) async fn fetch_update(app: &TestApp, node: &Node, key: &NodeKey) -> reqwest::Response {
    send(
        app,
        "GET",
        &format!("/nodes/{}/bundle", node.vm),
        b"",
        &Signing::new(key, &node.imds),
    )
    .await
}

pub(crate) async fn sync_report(
    app: &TestApp,
    node: &Node,
    key: &NodeKey,
    state: &str,
    generation: u64,
) {
    let body =
        serde_json::to_vec(&json!({"phase": "sync", "state": state, "generation": generation}))
            .unwrap();
    let path = format!("/nodes/{}/status", node.vm);
    let response = send(app, "POST", &path, &body, &Signing::new(key, &node.imds)).await;
    assert_eq!(response.status(), 204, "{}", response.text().await.unwrap());
}

pub(crate) async fn update_payload(
    app: &TestApp,
    response: reqwest::Response,
) -> exk8s_common::BundlePayload {
    assert_eq!(response.status(), 200);
    let mut ring = Keyring::new();
    ring.insert(app.state.signer.verifying_key());
    verify(&response.bytes().await.unwrap(), &ring)
        .unwrap()
        .into_payload()
}

async fn rollouts_update_one_control_plane_node_at_a_time(backend: Backend) {
    let app = spawn_app(backend).await;
    let nodes = booted_cluster(&app).await;
    let [(a, ka), (b, kb), (c, kc)] = [&nodes[0], &nodes[1], &nodes[2]].map(|(n, k)| (n, k));
    for (node, key) in [(a, ka), (b, kb), (c, kc)] {
        assert_eq!(
            fetch_update(&app, node, key).await.status(),
            204,
            "up to date"
        );
    }
    let started = app
        .post(&format!("/clusters/{}/rollout", a.cluster))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    let started = json_of(started).await;
    assert!(
        started["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["desired_generation"] == 2)
    );

    let payload = update_payload(&app, fetch_update(&app, a, ka).await).await;
    assert_eq!(payload.identity.kind, BundleKind::Update);
    assert_eq!(payload.identity.generation, 2);
    assert_eq!(payload.freshness.serial, 2);
    let held = fetch_update(&app, b, kb).await;
    assert_eq!(held.status(), 409);
    assert_eq!(held.headers()["retry-after"], "30");
    assert!(
        held.text()
            .await
            .unwrap()
            .contains("another control-plane node")
    );
    // The node in flight may fetch again (its own retry): a newer serial.
    assert_eq!(
        update_payload(&app, fetch_update(&app, a, ka).await)
            .await
            .freshness
            .serial,
        3
    );
    sync_report(&app, a, ka, "succeeded", 2).await;

    assert_eq!(fetch_update(&app, b, kb).await.status(), 200);
    assert_eq!(fetch_update(&app, c, kc).await.status(), 409);
    // B fails and restores its files: the rollout holds until B is healthy again.
    sync_report(&app, b, kb, "failed", 2).await;
    assert_eq!(fetch_update(&app, c, kc).await.status(), 409);
    assert_eq!(fetch_update(&app, b, kb).await.status(), 200, "B retries");
    sync_report(&app, b, kb, "succeeded", 2).await;
    assert_eq!(
        update_payload(&app, fetch_update(&app, c, kc).await)
            .await
            .identity
            .generation,
        2
    );
    sync_report(&app, c, kc, "succeeded", 2).await;

    let view: Value = json_of(
        app.get(&format!("/clusters/{}", a.cluster))
            .send()
            .await
            .unwrap(),
    )
    .await;
    for node in view["nodes"].as_array().unwrap() {
        assert_eq!(
            (
                node["applied_generation"].as_i64(),
                node["up_to_date"].as_bool()
            ),
            (Some(2), Some(true)),
            "{node}"
        );
    }
    assert_eq!(view["ready"], true);
    assert_eq!(fetch_update(&app, a, ka).await.status(), 204);

    // Racing for the one slot: exactly one node wins it.
    let started = app
        .post(&format!("/clusters/{}/rollout", a.cluster))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    let (ra, rb, rc) = tokio::join!(
        fetch_update(&app, a, ka),
        fetch_update(&app, b, kb),
        fetch_update(&app, c, kc)
    );
    let mut statuses = [
        ra.status().as_u16(),
        rb.status().as_u16(),
        rc.status().as_u16(),
    ];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 409, 409]);

    let missing = app.post("/clusters/999999/rollout").send().await.unwrap();
    assert_eq!(missing.status(), 404);
}

/// A request nonce is refused again until it expires; then it may be taken anew, and the
/// reconciler's sweep forgets every expired one (and only those).
async fn request_nonces_expire_and_are_swept(backend: Backend) {
    use exk8s_api::db::nonces;
    let app = spawn_app(backend).await;
    let nodes = cluster_with_credentials(&app, 7, 3).await;
    let pool = &app.state.db.pool;
    let ids: Vec<i64> = exk8s_api::db::nodes::list(pool, nodes[0].cluster)
        .await
        .unwrap()
        .iter()
        .map(|n| n.id)
        .collect();
    let (a, b) = (ids[0], ids[1]);
    // Times an hour ahead, so the test app's own reconciler (sweeping at the real time) never
    // forgets a row this test stored.
    let t = exk8s_api::db::now() + 3600;
    assert!(
        nonces::remember(pool, a, "n-1", t + 100, t + 40)
            .await
            .unwrap()
    );
    assert!(
        !nonces::remember(pool, a, "n-1", t + 130, t + 70)
            .await
            .unwrap(),
        "replay"
    );
    // Nonces are the node's own.
    assert!(
        nonces::remember(pool, b, "n-1", t + 100, t + 70)
            .await
            .unwrap()
    );
    assert!(
        nonces::remember(pool, a, "n-2", t + 300, t + 70)
            .await
            .unwrap()
    );
    // Past its expiry, the same nonce is a new request's, remembered to its new expiry.
    assert!(
        nonces::remember(pool, a, "n-1", t + 400, t + 101)
            .await
            .unwrap()
    );
    assert!(
        !nonces::remember(pool, a, "n-1", t + 450, t + 350)
            .await
            .unwrap(),
        "replay"
    );
    let stored = || async {
        let rows: Vec<(i64, String, i64)> = sqlx::query_as(
            "SELECT node_id, nonce, expires_at FROM node_request_nonces ORDER BY node_id, nonce",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        rows
    };
    let row = |node: i64, nonce: &str, at: i64| (node, nonce.to_owned(), t + at);
    assert_eq!(
        stored().await,
        [row(a, "n-1", 400), row(a, "n-2", 300), row(b, "n-1", 100)]
    );
    assert_eq!(nonces::prune(pool, t + 300).await.unwrap(), 1);
    assert_eq!(stored().await, [row(a, "n-1", 400), row(a, "n-2", 300)]);
    assert_eq!(nonces::prune(pool, t + 401).await.unwrap(), 2);
    assert!(stored().await.is_empty());
}

both_backends!(
    node_signature_credential_matrix,
    rollouts_update_one_control_plane_node_at_a_time,
    request_nonces_expire_and_are_swept
);
