//! `POST /clusters` and the operator routes, on SQLite and PostgreSQL: founding, the bad-body
//! corpus, failure at every step leaving nothing behind, org isolation, tokens,
//! sealed keys bound to their row, two replicas, deletion, and the service endpoints.

use std::time::Duration;

use exk8s_api::sim::Faults;
use exk8s_api::tokens::Scope;
use serde_json::{Value, json};

use crate::app::{
    Backend, TestApp, both_backends, json_of, operator_token, spawn_app, spawn_with, test_config,
};

pub(crate) fn assert_nothing_left(app: &TestApp) {
    assert!(
        app.sims.compute.vms().is_empty(),
        "VMs left: {:?}",
        app.sims.compute.vms()
    );
    assert!(
        app.sims.compute.security_groups().is_empty(),
        "groups left: {:?}",
        app.sims.compute.security_groups()
    );
}

async fn founds_one_and_three_node_clusters(backend: Backend) {
    let app = spawn_app(backend).await;
    let response = app.found(3, json!({"allocate_public_ipv4": true})).await;
    assert_eq!(response.status(), 201);
    let created = json_of(response).await;
    let id = created["cluster_id"].as_i64().unwrap();
    assert_eq!(created["control_plane_vm_ids"].as_array().unwrap().len(), 3);
    assert_eq!(created["name"], format!("exk8s-7-{id:x}"));
    assert_eq!(
        created["control_plane_dns_name"],
        format!("exk8s-7-{id:x}.k8s.internal")
    );
    assert_eq!(created["dns_configured"], true);
    assert_eq!(created["bootstrap_path_template"], "/bootstrap/{vm_id}");
    let kubeconfig: yaml_serde::Value =
        yaml_serde::from_str(created["kubeconfig"].as_str().unwrap()).unwrap();
    assert_eq!(
        kubeconfig["clusters"][0]["cluster"]["server"],
        format!("https://exk8s-7-{id:x}.k8s.internal:6443")
    );

    let vms = app.sims.compute.vms();
    assert_eq!(vms.len(), 3);
    assert!(
        vms.iter()
            .all(|vm| vm.tags["exk8s.io/role"] == "control-plane"
                && vm.tags["exk8s.io/cluster"] == id.to_string())
    );
    let groups = app.sims.compute.security_groups();
    assert_eq!(groups.len(), 1);
    assert!(
        groups[0]
            .rules
            .iter()
            .any(|r| r.protocol == "tcp" && r.port == Some(6443) && r.source_cidr == "0.0.0.0/0")
    );
    assert!(
        groups[0]
            .rules
            .iter()
            .any(|r| r.protocol == "all" && r.source_cidr == "127.0.10.0/24")
    );
    assert_eq!(app.sims.dns.records().len(), 1);

    let view = json_of(app.get(&format!("/clusters/{id}")).send().await.unwrap()).await;
    assert_eq!(view["phase"], "founded");
    assert_eq!(view["ready"], false);
    assert_eq!(view["pod_network"], "cilium", "the default");
    assert_eq!(
        view["api_endpoints"],
        json!([format!("https://exk8s-7-{id:x}.k8s.internal:6443")])
    );
    let nodes = view["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    let vm = nodes[0]["vm_id"].as_i64().unwrap();
    assert_eq!(nodes[0]["name"], format!("cp-{vm}.cluster-{id}.internal"));
    assert_eq!(nodes[0]["is_initial"], true);
    assert_eq!(nodes[1]["is_initial"], false);
    assert!(nodes.iter().all(|n| n["phase"] == "pending"
        && n["role"] == "control-plane"
        && n["desired_generation"] == 1
        && n["applied_generation"] == 0
        && n["up_to_date"] == false));

    let existing = groups[0].id;
    let response = app
        .found(
            1,
            json!({"security_group_ids": [existing], "pod_network": "none"}),
        )
        .await;
    assert_eq!(response.status(), 201);
    assert_eq!(
        app.sims.compute.security_groups().len(),
        1,
        "a group was created although one was given"
    );
    let list = json_of(app.get("/clusters").send().await.unwrap()).await;
    let networks: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["pod_network"])
        .collect();
    assert_eq!(networks, [&json!("cilium"), &json!("none")]);
}

async fn failure_at_every_step_leaves_nothing_behind(backend: Backend) {
    let app = spawn_app(backend).await;
    // The subnet is checked before anything exists: its failure leaves no row at all.
    app.sims.set_faults(Faults {
        fail_subnet_lookup: true,
        ..Faults::default()
    });
    let response = app.found(3, json!({})).await;
    assert_eq!(response.status(), 502);
    let error = json_of(response).await;
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("subnet lookup"),
        "{error}"
    );
    assert_eq!(app.cluster_count().await, 0);
    assert_nothing_left(&app);

    let steps: Vec<(&str, Faults, i64)> = vec![
        (
            "security group creation",
            Faults {
                fail_group_create: true,
                ..Faults::default()
            },
            3,
        ),
        (
            "VM creation",
            Faults {
                fail_vm_create_nth: Some(1),
                ..Faults::default()
            },
            3,
        ),
        (
            "VM creation",
            Faults {
                fail_vm_create_nth: Some(2),
                ..Faults::default()
            },
            3,
        ),
        (
            "VM creation",
            Faults {
                fail_vm_create_nth: Some(3),
                ..Faults::default()
            },
            3,
        ),
        (
            "address lookup",
            Faults {
                address_after_polls: 1_000_000,
                ..Faults::default()
            },
            3,
        ),
    ];
    for (reason, faults, count) in steps {
        app.sims.set_faults(Faults::default());
        let created_before = app.sims.compute.vms().len();
        assert_eq!(created_before, 0);
        // Restart the VM-create counter by counting from this simulator's current total.
        let faults = match faults.fail_vm_create_nth {
            Some(n) => Faults {
                fail_vm_create_nth: Some(n + vm_creates_so_far(&app)),
                ..faults
            },
            None => faults,
        };
        app.sims.set_faults(faults);
        let response = app.found(count, json!({})).await;
        assert!(
            response.status().is_server_error() || response.status() == 422,
            "{reason}: {}",
            response.status()
        );
        let error = json_of(response).await;
        assert!(
            error["error"]["message"].as_str().unwrap().contains(reason),
            "{reason}: {error}"
        );
        assert_nothing_left(&app);
        let clusters = json_of(app.get("/clusters").send().await.unwrap()).await;
        let last = clusters.as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["phase"], "failed", "{reason}: {last}");
        assert_eq!(last["error_reason"], reason);
    }

    // The compute API hands out a VM id a node already has (a reused id, or a simulator that
    // lost its state): an upstream fault named as such, never a 500, and compensated.
    app.sims.set_faults(Faults::default());
    let squatted = app.sims.compute.next_vm_id();
    squat_vm_id(&app, squatted).await;
    let response = app.found(1, json!({})).await;
    assert_eq!(response.status(), 502, "a reused VM id");
    let error = json_of(response).await;
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("VM id {squatted}")) && message.contains("already belongs"),
        "{error}"
    );
    assert_nothing_left(&app);

    // DNS is a soft failure: the cluster stands.
    app.sims.set_faults(Faults {
        fail_dns: true,
        ..Faults::default()
    });
    let response = app.found(1, json!({})).await;
    assert_eq!(response.status(), 201);
    let created = json_of(response).await;
    assert_eq!(created["dns_configured"], false);
    assert!(
        created["dns_error"].as_str().unwrap().contains("DNS"),
        "{created}"
    );
    assert_eq!(app.sims.compute.vms().len(), 1);
    let view = json_of(
        app.get(&format!("/clusters/{}", created["cluster_id"]))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(view["phase"], "founded");
    assert_eq!(view["dns_configured"], false);
}

fn vm_creates_so_far(app: &TestApp) -> u32 {
    app.sims.compute.vm_creates()
}

async fn squat_vm_id(app: &TestApp, vm_id: i64) {
    let pool = &app.state.db.pool;
    let now = exk8s_api::db::now();
    sqlx::query(
        "INSERT INTO clusters (org_id, name, phase, spec_json, key_algorithm, kubernetes_version, service_cidr, \
         pod_cidr, cluster_domain, control_plane_dns_name, created_at, updated_at) \
         VALUES (999, 'squatter', 'failed', '{}', 'ecdsa-p256', 'v1.35.3', '10.96.0.0/12', '172.16.0.0/12', 'cluster.local', 'x', $1, $1)",
    )
    .bind(now)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO cluster_nodes (cluster_id, ordinal, vm_id, node_name, private_ipv4, is_initial, serial, \
         issuance_allowed, phase, created_at) \
         SELECT id, 1, $1, 'squat', '127.0.0.1', 1, 0, 1, 'pending', $2 FROM clusters WHERE name = 'squatter'",
    )
    .bind(vm_id)
    .bind(now)
    .execute(pool)
    .await
    .unwrap();
}

async fn orgs_are_isolated_and_tokens_are_checked(backend: Backend) {
    let app = spawn_app(backend).await;
    let created = json_of(app.found(1, json!({})).await).await;
    let id = created["cluster_id"].as_i64().unwrap();
    let other_org = operator_token(&app.state, 8, Scope::Operator, 3600).await;
    let as_other = |method: reqwest::Method, path: String| {
        app.http
            .request(method, format!("{}{path}", app.url))
            .bearer_auth(&other_org)
            .json(&json!({"ca": "cluster"}))
            .send()
    };
    for (method, path) in [
        (reqwest::Method::GET, format!("/clusters/{id}")),
        (reqwest::Method::GET, format!("/clusters/{id}/kubeconfig")),
        (reqwest::Method::GET, format!("/clusters/{id}/certificates")),
        (reqwest::Method::POST, format!("/clusters/{id}/rollout")),
        (
            reqwest::Method::POST,
            format!("/clusters/{id}/certificates/renew"),
        ),
        (
            reqwest::Method::POST,
            format!("/clusters/{id}/certificates/rotate-ca"),
        ),
        (reqwest::Method::GET, format!("/clusters/{id}/events")),
        (reqwest::Method::DELETE, format!("/clusters/{id}")),
    ] {
        let response = as_other(method.clone(), path.clone()).await.unwrap();
        assert_eq!(response.status(), 404, "{method} {path}");
    }
    // Nothing moved for the cluster's own org.
    let view = json_of(app.get(&format!("/clusters/{id}")).send().await.unwrap()).await;
    assert!(view["ca_rotation"].is_null(), "{view}");
    assert_eq!(view["nodes"][0]["desired_generation"], 1, "{view}");
    let listed = json_of(
        as_other(reqwest::Method::GET, "/clusters".into())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(listed, json!([]));
    assert_eq!(
        app.sims.compute.vms().len(),
        1,
        "another org deleted the cluster"
    );

    let expired = operator_token(&app.state, 7, Scope::Operator, -1).await;
    let bootstrap = operator_token(&app.state, 7, Scope::Bootstrap, 3600).await;
    let revoked = operator_token(&app.state, 7, Scope::Operator, 3600).await;
    sqlx::query("UPDATE api_tokens SET revoked = 1 WHERE token_hash = $1")
        .bind(exk8s_api::tokens::hash(&revoked))
        .execute(&app.state.db.pool)
        .await
        .unwrap();
    for url in [
        format!("{}/clusters", app.url),
        format!("{}/clusters/{id}/events", app.url),
    ] {
        for (what, auth, status) in [
            ("expired", Some(format!("Bearer {expired}")), 401),
            ("revoked", Some(format!("Bearer {revoked}")), 401),
            ("unknown", Some("Bearer exk8s_op_nope".to_owned()), 401),
            ("malformed", Some("Basic abc".to_owned()), 401),
            ("missing", None, 401),
            ("bootstrap scope", Some(format!("Bearer {bootstrap}")), 403),
        ] {
            let mut request = app.http.get(&url);
            if let Some(auth) = auth {
                request = request.header("Authorization", auth);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status().as_u16(), status, "{what} {url}");
            let body = json_of(response).await;
            assert!(
                !body.to_string().contains("exk8s_test"),
                "{what}: the body echoes a token"
            );
        }
    }
}

async fn a_sealed_key_moved_to_another_row_does_not_open(backend: Backend) {
    let app = spawn_app(backend).await;
    let a = json_of(app.found(1, json!({})).await).await["cluster_id"]
        .as_i64()
        .unwrap();
    let b = json_of(app.found(1, json!({})).await).await["cluster_id"]
        .as_i64()
        .unwrap();
    let kubeconfig = app
        .get(&format!("/clusters/{b}/kubeconfig"))
        .send()
        .await
        .unwrap();
    assert_eq!(kubeconfig.status(), 200);
    let sealed: String = {
        use sqlx::Row as _;
        sqlx::query("SELECT ca_key_sealed FROM clusters WHERE id = $1")
            .bind(a)
            .fetch_one(&app.state.db.pool)
            .await
            .unwrap()
            .get("ca_key_sealed")
    };
    assert!(!sealed.contains("PRIVATE KEY"));
    sqlx::query("UPDATE clusters SET ca_key_sealed = $1 WHERE id = $2")
        .bind(&sealed)
        .bind(b)
        .execute(&app.state.db.pool)
        .await
        .unwrap();
    let response = app
        .get(&format!("/clusters/{b}/kubeconfig"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    let body = response.text().await.unwrap();
    assert!(
        !body.contains("apiVersion") && !body.contains("PRIVATE"),
        "{body}"
    );
    let kubeconfig = app
        .get(&format!("/clusters/{a}/kubeconfig"))
        .send()
        .await
        .unwrap();
    assert_eq!(kubeconfig.status(), 200, "the original row still opens");
}

async fn deleting_a_cluster_removes_everything(backend: Backend) {
    let app = spawn_app(backend).await;
    let created = json_of(app.found(3, json!({})).await).await;
    let id = created["cluster_id"].as_i64().unwrap();
    let fresh = app
        .get(&format!("/clusters/{id}/kubeconfig"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_ne!(
        fresh,
        created["kubeconfig"].as_str().unwrap(),
        "the kubeconfig must carry a fresh certificate"
    );
    let response = app.delete(&format!("/clusters/{id}")).send().await.unwrap();
    assert_eq!(response.status(), 204);
    assert_nothing_left(&app);
    assert!(app.sims.dns.records().is_empty());
    assert_eq!(
        app.get(&format!("/clusters/{id}"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        app.delete(&format!("/clusters/{id}"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(app.cluster_count().await, 0);
}

/// Several replicas are a PostgreSQL deployment (SQLite is the single-instance default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_postgres_database() {
    let backend = Backend::Postgres;
    let first = spawn_app(backend).await;
    let second = spawn_with(
        backend,
        test_config(),
        Some((&first.db_url, first._dir.clone())),
    )
    .await;
    let created = json_of(first.found(1, json!({})).await).await;
    let id = created["cluster_id"].as_i64().unwrap();
    let seen = second
        .http
        .get(format!("{}/clusters/{id}", second.url))
        .bearer_auth(&first.token)
        .send()
        .await
        .unwrap();
    assert_eq!(seen.status(), 200);
    assert_eq!(json_of(seen).await["phase"], "founded");
    let kubeconfig = second
        .http
        .get(format!("{}/clusters/{id}/kubeconfig", second.url))
        .bearer_auth(&first.token)
        .send()
        .await
        .unwrap();
    assert_eq!(
        kubeconfig.status(),
        200,
        "the second replica opens the first one's sealed keys"
    );
}

async fn service_endpoints_answer(backend: Backend) {
    let mut app = spawn_app(backend).await;
    assert_eq!(app.found(1, json!({})).await.status(), 201);
    let get = |path: &str| app.http.get(format!("{}{path}", app.url)).send();
    assert_eq!(get("/healthz").await.unwrap().status(), 200);
    assert_eq!(get("/readyz").await.unwrap().status(), 200);
    let metrics = get("/metrics").await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("exk8s_clusters_founded_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "exk8s_http_requests_total{method=\"POST\",route=\"/clusters\",status=\"201\"} 1"
        ),
        "{metrics}"
    );
    let openapi = json_of(get("/openapi.json").await.unwrap()).await;
    assert!(openapi["openapi"].as_str().unwrap().starts_with("3.1"));
    for path in [
        "/clusters",
        "/clusters/{id}",
        "/clusters/{id}/kubeconfig",
        "/healthz",
        "/readyz",
        "/metrics",
    ] {
        assert!(
            openapi["paths"][path].is_object(),
            "{path} missing from the OpenAPI document"
        );
    }
    assert!(openapi["components"]["securitySchemes"]["operator_token"].is_object());
    let docs = get("/docs").await.unwrap();
    assert_eq!(docs.status(), 200);
    assert!(docs.text().await.unwrap().contains("<html"), "the docs UI");
    let id = get("/healthz")
        .await
        .unwrap()
        .headers()
        .get("x-request-id")
        .cloned();
    assert!(id.is_some(), "every response carries a request id");

    // Graceful shutdown: the server stops and /healthz had answered until then.
    app.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), &mut app.server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

both_backends!(
    founds_one_and_three_node_clusters,
    failure_at_every_step_leaves_nothing_behind,
    orgs_are_isolated_and_tokens_are_checked,
    a_sealed_key_moved_to_another_row_does_not_open,
    deleting_a_cluster_removes_everything,
    service_endpoints_answer,
);
