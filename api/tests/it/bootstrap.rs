//! The bootstrap endpoint on SQLite and PostgreSQL: the credential matrix, the 2 orgs × 2 VMs
//! cross matrix, verified and bound envelopes, concurrent serials, 410 and re-arm, rate limits,
//! phase reports, and no secret in any log line.

use std::collections::{BTreeMap, BTreeSet};

use exk8s_api::app::ApiConfig;
use exk8s_api::ratelimit::Limit;
use exk8s_api::tokens::Scope;
use exk8s_common::{Expected, Keyring, verify};
use serde_json::{Value, json};

use crate::app::{
    Backend, TestApp, both_backends, capture_logs, imds_token, operator_token, spawn_app,
    spawn_with, test_config,
};

pub(crate) const NONCE: &str = "bootstrap-test-nonce-0001";

pub(crate) use crate::app::{Node, cluster_with_credentials, credentials_for};

pub(crate) async fn fetch(
    app: &TestApp,
    vm: i64,
    imds: Option<&str>,
    bearer: Option<&str>,
    nonce: &str,
) -> reqwest::Response {
    let mut request = app
        .http
        .get(format!("{}/bootstrap/{vm}", app.url))
        .header("X-Exk8s-Nonce", nonce);
    if let Some(imds) = imds {
        request = request.header("X-exc-imds-token", imds);
    }
    if let Some(bearer) = bearer {
        request = request.header("Authorization", bearer);
    }
    request.send().await.unwrap()
}

pub(crate) async fn report(
    app: &TestApp,
    node: &Node,
    phase: &str,
    state: &str,
) -> reqwest::StatusCode {
    app.http
        .post(format!("{}/bootstrap/{}/status", app.url, node.vm))
        .header("X-exc-imds-token", &node.imds)
        .bearer_auth(&node.bootstrap)
        .json(&json!({"phase": phase, "state": state, "message": ""}))
        .send()
        .await
        .unwrap()
        .status()
}

async fn audit_count(app: &TestApp, outcome: &str) -> i64 {
    use sqlx::Row as _;
    sqlx::query("SELECT COUNT(*) AS n FROM bundle_issuances WHERE outcome = $1")
        .bind(outcome)
        .fetch_one(&app.state.db.pool)
        .await
        .unwrap()
        .get("n")
}

pub(crate) async fn keyring(app: &TestApp) -> Keyring {
    let text = app
        .http
        .get(format!("{}/bootstrap/keys", app.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut ring = Keyring::new();
    ring.add_pub_text(&text, "/bootstrap/keys").unwrap();
    ring
}

async fn credential_matrix(backend: Backend) {
    let app = spawn_app(backend).await;
    let nodes = cluster_with_credentials(&app, 7, 3).await;
    let (me, other) = (&nodes[0], &nodes[1]);
    let expired_imds = imds_token(&app.state, me.vm, 7, -10).await;
    let other_org_imds = imds_token(&app.state, me.vm, 8, 600).await;
    let expired_bearer = operator_token(&app.state, 7, Scope::Bootstrap, -10).await;
    let revoked_bearer = operator_token(&app.state, 7, Scope::Bootstrap, 3600).await;
    sqlx::query("UPDATE api_tokens SET revoked = 1 WHERE token_hash = $1")
        .bind(exk8s_api::tokens::hash(&revoked_bearer))
        .execute(&app.state.db.pool)
        .await
        .unwrap();
    let other_org_bearer = operator_token(&app.state, 8, Scope::Bootstrap, 3600).await;
    let long = "x".repeat(300);
    let imds_cells: Vec<(&str, Option<String>)> = vec![
        ("absent", None),
        ("malformed", Some(long.clone())),
        ("expired", Some(expired_imds)),
        ("unknown", Some("exk8s_imds_unknown".into())),
        ("other-vm", Some(other.imds.clone())),
        ("other-org", Some(other_org_imds)),
        ("valid", Some(me.imds.clone())),
    ];
    let bearer_cells: Vec<(&str, Option<String>)> = vec![
        ("absent", None),
        ("malformed", Some("Basic abc".into())),
        ("expired", Some(format!("Bearer {expired_bearer}"))),
        ("revoked", Some(format!("Bearer {revoked_bearer}"))),
        ("operator-scope", Some(format!("Bearer {}", app.token))),
        ("other-org", Some(format!("Bearer {other_org_bearer}"))),
        ("valid", Some(format!("Bearer {}", me.bootstrap))),
    ];
    let bad_imds = |c: &str| ["absent", "malformed", "expired", "unknown"].contains(&c);
    let bad_bearer = |c: &str| ["absent", "malformed", "expired", "revoked"].contains(&c);
    let expected = |i: &str, b: &str| -> u16 {
        if bad_imds(i) || bad_bearer(b) {
            401
        } else if b == "operator-scope" {
            403
        } else if i == "valid" && b == "valid" {
            200
        } else {
            404
        }
    };
    let mut bodies: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
    let refused_before = audit_count(&app, "refused").await;
    let mut refusals = 0;
    for (imds_case, imds) in &imds_cells {
        for (bearer_case, bearer) in &bearer_cells {
            let response = fetch(&app, me.vm, imds.as_deref(), bearer.as_deref(), NONCE).await;
            let status = response.status().as_u16();
            assert_eq!(
                status,
                expected(imds_case, bearer_case),
                "IMDS {imds_case} × bearer {bearer_case}"
            );
            if status != 200 {
                refusals += 1;
                bodies
                    .entry(status)
                    .or_default()
                    .insert(response.text().await.unwrap());
            }
        }
    }
    for (status, set) in &bodies {
        assert_eq!(
            set.len(),
            1,
            "status {status} answered with different bodies: {set:?}"
        );
    }
    assert_eq!(
        audit_count(&app, "refused").await - refused_before,
        refusals,
        "every refusal is audited"
    );
}

async fn cross_matrix_of_orgs_and_vms(backend: Backend) {
    let app = spawn_app(backend).await;
    let org7 = cluster_with_credentials(&app, 7, 1).await;
    let org8 = cluster_with_credentials(&app, 8, 1).await;
    let all = [&org7[0], &org8[0]];
    for caller in all {
        for target in all {
            let response = fetch(
                &app,
                target.vm,
                Some(&caller.imds),
                Some(&format!("Bearer {}", caller.bootstrap)),
                NONCE,
            )
            .await;
            let status = response.status().as_u16();
            if caller.vm == target.vm {
                assert_eq!(status, 200);
                let envelope = response.bytes().await.unwrap();
                let bundle = verify(&envelope, &keyring(&app).await).unwrap();
                assert_eq!(bundle.payload().identity.vm_id, caller.vm as u64);
            } else {
                assert_eq!(
                    status, 404,
                    "vm {} fetched vm {}'s bundle",
                    caller.vm, target.vm
                );
            }
        }
    }
    assert_eq!(audit_count(&app, "refused").await, 2);
    assert_eq!(audit_count(&app, "issued").await, 2);
}

async fn envelopes_verify_and_bind_and_serials_increase(backend: Backend) {
    let app = spawn_app(backend).await;
    let nodes = cluster_with_credentials(&app, 7, 3).await;
    let node = &nodes[1];
    let ring = keyring(&app).await;
    let response = fetch(
        &app,
        node.vm,
        Some(&node.imds),
        Some(&format!("Bearer {}", node.bootstrap)),
        NONCE,
    )
    .await;
    assert_eq!(response.status(), 200);
    let bundle = verify(&response.bytes().await.unwrap(), &ring).unwrap();
    let p = bundle.payload();
    assert_eq!(
        (p.identity.vm_id, p.identity.cluster_id, p.identity.org_id),
        (node.vm as u64, node.cluster as u64, 7)
    );
    assert_eq!(p.freshness.nonce.as_str(), NONCE);
    assert!(!p.identity.is_initial_control_plane);
    assert_eq!(
        p.identity.kind,
        exk8s_common::contract::BundleKind::Bootstrap
    );
    assert_eq!(p.identity.generation, 1);
    let nonce = NONCE.parse().unwrap();
    bundle
        .check_binding(&Expected {
            vm_id: node.vm as u64,
            nonce: Some(&nonce),
            cluster_id: Some(node.cluster as u64),
            org_id: Some(7),
            kind: Some(exk8s_common::contract::BundleKind::Bootstrap),
            now: exk8s_api::db::now(),
            clock_skew_secs: 300,
            applied_serial: None,
        })
        .unwrap();
    assert_eq!(
        p.freshness.expires_at - p.freshness.issued_at,
        900,
        "the configured bundle TTL"
    );
    // The bundle carries leaf certificates only: no CA key.
    let ca_key_sealed: String = {
        use sqlx::Row as _;
        sqlx::query("SELECT ca_key_sealed FROM clusters WHERE id = $1")
            .bind(node.cluster)
            .fetch_one(&app.state.db.pool)
            .await
            .unwrap()
            .get("ca_key_sealed")
    };
    let ca_key = app
        .state
        .keks
        .open_text(&format!("cluster/{}/ca_key", node.cluster), &ca_key_sealed)
        .unwrap();
    let body: String = ca_key.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(p.files.iter().all(|f| {
        !String::from_utf8_lossy(f.content.as_bytes())
            .replace('\n', "")
            .contains(&body)
    }));

    // 32 concurrent fetches: 32 distinct serials, all above the first one. Every other one
    // through the old control-plane path, an alias for agents baked before the role-neutral one.
    let mut tasks = Vec::new();
    for i in 0..32 {
        let path = if i % 2 == 0 {
            "bootstrap"
        } else {
            "bootstrap/control-plane"
        };
        let request = app
            .http
            .get(format!("{}/{path}/{}", app.url, node.vm))
            .header("X-exc-imds-token", &node.imds)
            .bearer_auth(&node.bootstrap)
            .header("X-Exk8s-Nonce", format!("concurrent-nonce-{i:08}"));
        tasks.push(tokio::spawn(async move { request.send().await.unwrap() }));
    }
    let mut serials = BTreeSet::new();
    for task in tasks {
        let response = task.await.unwrap();
        assert_eq!(response.status(), 200);
        let bundle = verify(&response.bytes().await.unwrap(), &ring).unwrap();
        assert!(
            serials.insert(bundle.payload().freshness.serial),
            "a serial was issued twice"
        );
    }
    assert_eq!(serials.len(), 32);
    assert!(serials.iter().all(|s| *s > p.freshness.serial));
    assert_eq!(
        *serials.iter().next_back().unwrap(),
        p.freshness.serial + 32
    );

    let bad_nonce = fetch(
        &app,
        node.vm,
        Some(&node.imds),
        Some(&format!("Bearer {}", node.bootstrap)),
        "short",
    )
    .await;
    assert_eq!(bad_nonce.status(), 400);
}

async fn complete_nodes_get_410_until_rearmed(backend: Backend) {
    let app = spawn_app(backend).await;
    let nodes = cluster_with_credentials(&app, 7, 1).await;
    let node = &nodes[0];
    let bearer = format!("Bearer {}", node.bootstrap);
    assert_eq!(
        fetch(&app, node.vm, Some(&node.imds), Some(&bearer), NONCE)
            .await
            .status(),
        200
    );
    for phase in [
        "fetch",
        "verify",
        "files",
        "prereqs",
        "services",
        "etcd",
        "apiserver",
        "addons",
    ] {
        assert_eq!(report(&app, node, phase, "started").await, 204);
        // Through the old control-plane path too: an alias for agents baked before.
        let through_alias = app
            .http
            .post(format!(
                "{}/bootstrap/control-plane/{}/status",
                app.url, node.vm
            ))
            .header("X-exc-imds-token", &node.imds)
            .bearer_auth(&node.bootstrap)
            .json(&json!({"phase": phase, "state": "succeeded", "message": ""}))
            .send()
            .await
            .unwrap();
        assert_eq!(through_alias.status(), 204);
    }
    let view: Value = app
        .get(&format!("/clusters/{}", node.cluster))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["nodes"][0]["phase"], "addons");
    assert_eq!(view["nodes"][0]["applied_generation"], 0);
    assert_eq!(view["ready"], false);
    assert_eq!(report(&app, node, "complete", "succeeded").await, 204);
    let view: Value = app
        .get(&format!("/clusters/{}", node.cluster))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["nodes"][0]["phase"], "complete");
    assert_eq!(view["nodes"][0]["applied_generation"], 1);
    assert_eq!(view["nodes"][0]["up_to_date"], true);
    assert_eq!(view["ready"], true);

    assert_eq!(
        fetch(&app, node.vm, Some(&node.imds), Some(&bearer), NONCE)
            .await
            .status(),
        410
    );
    let rearm = app
        .post(&format!(
            "/clusters/{}/nodes/{}/rearm",
            node.cluster, node.vm
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(rearm.status(), 204);
    assert_eq!(
        fetch(&app, node.vm, Some(&node.imds), Some(&bearer), NONCE)
            .await
            .status(),
        200
    );
    assert_eq!(
        fetch(&app, node.vm, Some(&node.imds), Some(&bearer), NONCE)
            .await
            .status(),
        410,
        "a re-arm allows one bundle"
    );

    for (body, field) in [
        (json!({"phase": "dance", "state": "started"}), "phase"),
        (json!({"phase": "etcd", "state": "maybe"}), "state"),
        (
            json!({"phase": "etcd", "state": "failed", "message": "x".repeat(1001)}),
            "message",
        ),
        (
            json!({"phase": "etcd", "state": "failed", "extra": 1}),
            "extra",
        ),
    ] {
        let response = app
            .http
            .post(format!("{}/bootstrap/{}/status", app.url, node.vm))
            .header("X-exc-imds-token", &node.imds)
            .bearer_auth(&node.bootstrap)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["field"], field);
    }
    let other_org = operator_token(&app.state, 8, Scope::Operator, 3600).await;
    let rearm = app
        .http
        .post(format!(
            "{}/clusters/{}/nodes/{}/rearm",
            app.url, node.cluster, node.vm
        ))
        .bearer_auth(other_org)
        .send()
        .await
        .unwrap();
    assert_eq!(rearm.status(), 404);
}

async fn rate_limits_answer_429_with_retry_after(backend: Backend) {
    let config = ApiConfig {
        rate_per_vm: Limit {
            per_minute: 6,
            burst: 3,
        },
        ..test_config()
    };
    let app = spawn_with(backend, config, None).await;
    let nodes = cluster_with_credentials(&app, 7, 1).await;
    let node = &nodes[0];
    let bearer = format!("Bearer {}", node.bootstrap);
    for _ in 0..3 {
        assert_eq!(
            fetch(&app, node.vm, Some(&node.imds), Some(&bearer), NONCE)
                .await
                .status(),
            200
        );
    }
    let limited = fetch(&app, node.vm, Some(&node.imds), Some(&bearer), NONCE).await;
    assert_eq!(limited.status(), 429);
    let wait: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=10).contains(&wait), "{wait}");
    assert_eq!(
        report(&app, node, "fetch", "started").await,
        429,
        "the status route shares the VM's budget"
    );
}

async fn no_secret_reaches_the_logs(backend: Backend) {
    let logs = capture_logs();
    let app = spawn_app(backend).await;
    let nodes = cluster_with_credentials(&app, 7, 3).await;
    let mut secrets = vec![app.token.clone()];
    for node in &nodes {
        let response = fetch(
            &app,
            node.vm,
            Some(&node.imds),
            Some(&format!("Bearer {}", node.bootstrap)),
            NONCE,
        )
        .await;
        assert_eq!(response.status(), 200);
        secrets.push(node.imds.clone());
        secrets.push(node.bootstrap.clone());
        // A refused request with credentials in it is logged too.
        let _ = fetch(
            &app,
            node.vm + 100,
            Some(&node.imds),
            Some(&format!("Bearer {}", node.bootstrap)),
            NONCE,
        )
        .await;
    }
    let kubeconfig = app
        .get(&format!("/clusters/{}/kubeconfig", nodes[0].cluster))
        .send()
        .await
        .unwrap();
    assert_eq!(kubeconfig.status(), 200);
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(
        text.contains("bundle issued"),
        "the capture holds this test's logs"
    );
    assert!(
        text.contains("TRACE") || text.contains("DEBUG"),
        "logs were captured at trace level"
    );
    for needle in [
        "PRIVATE KEY",
        "BEGIN CERTIFICATE",
        "client-key-data",
        "exk8s_imds_",
        "exk8s_op_",
        "exk8s_bs_",
    ] {
        let line = text.lines().find(|l| l.contains(needle));
        assert!(
            line.is_none(),
            "a log line contains {needle}: {}",
            line.unwrap_or_default()
                .chars()
                .take(400)
                .collect::<String>()
        );
    }
    for secret in &secrets {
        assert!(
            !text.contains(secret.as_str()),
            "a log line contains an issued token"
        );
    }
}

async fn the_openapi_document_describes_the_bootstrap_routes(backend: Backend) {
    let app = spawn_app(backend).await;
    let doc: Value = app
        .http
        .get(format!("{}/openapi.json", app.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for prefix in ["/bootstrap", "/bootstrap/control-plane"] {
        let fetch = &doc["paths"][format!("{prefix}/{{vm_id}}")]["get"];
        assert_eq!(
            fetch["security"],
            json!([{"imds_token": [], "bootstrap_token": []}])
        );
        let status = &doc["paths"][format!("{prefix}/{{vm_id}}/status")]["post"];
        assert!(status.is_object(), "{prefix}");
        // The old paths are documented as deprecated aliases; the role-neutral ones are not.
        let alias = prefix.ends_with("control-plane");
        for operation in [fetch, status] {
            assert_eq!(
                operation["deprecated"].as_bool().unwrap_or(false),
                alias,
                "{prefix}"
            );
        }
    }
    assert!(doc["paths"]["/bootstrap/keys"]["get"].is_object());
    assert!(doc["paths"]["/clusters/{id}/nodes/{vm_id}/rearm"]["post"].is_object());
    assert_eq!(
        doc["components"]["securitySchemes"]["imds_token"]["name"],
        "X-exc-imds-token"
    );
}

both_backends!(
    credential_matrix,
    cross_matrix_of_orgs_and_vms,
    envelopes_verify_and_bind_and_serials_increase,
    complete_nodes_get_410_until_rearmed,
    rate_limits_answer_429_with_retry_after,
    no_secret_reaches_the_logs,
    the_openapi_document_describes_the_bootstrap_routes,
);
