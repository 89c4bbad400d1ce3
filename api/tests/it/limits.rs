//! What bounds an org and a subnet, on SQLite and PostgreSQL: a subnet that runs out of
//! addresses mid-founding (named, compensated) and the per-org quotas on clusters, VMs and pools.

use exk8s_api::tokens::Scope;
use serde_json::json;

use crate::app::{
    Backend, WAIT, both_backends, json_of, operator_token, spawn_app, spawn_with, test_config,
    valid_body,
};

/// The subnet runs out of addresses while a cluster is founded: the compute API's answer is
/// named in the error, and what founding made is compensated.
async fn a_full_subnet_is_named_and_compensated(backend: Backend) {
    use exk8s_api::compute::{Compute, CreateVm};
    let app = spawn_app(backend).await;
    // 127.0.10.0/24 hands out .11 to .254: leave two of them free.
    for i in 0..242 {
        let squatter = CreateVm {
            name: format!("squatter-{i}"),
            image_id: 1,
            instance_type: "small".into(),
            zone_id: 1,
            subnet_id: 1,
            security_group_ids: vec![],
            allocate_public_ipv4: false,
            ssh_pubkey: None,
            root_volume_size_gib: 10,
            userdata: String::new(),
            tags: Default::default(),
            client_token: format!("squatter-{i}"),
        };
        app.sims.compute.create_vm(&squatter).await.unwrap();
    }
    let squatters = app.sims.compute.vms().len();
    let response = app.found(3, json!({})).await;
    assert_eq!(response.status(), 422);
    let error = json_of(response).await;
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("VM creation")
            && message.contains("no free address")
            && message.contains("127.0.10.0/24"),
        "{error}"
    );
    assert_eq!(
        app.sims.compute.vms().len(),
        squatters,
        "the two VMs founding made are compensated"
    );
    assert!(app.sims.compute.security_groups().is_empty());
    // A cluster that fits still founds.
    let response = app.found(1, json!({})).await;
    assert_eq!(response.status(), 201);
}

/// Per-org quotas on clusters, VMs and pools: each refusal is a 409 `quota_exceeded` naming the
/// quota, the org's use and what was asked; nothing is made; another org is not counted.
async fn quotas_bound_what_an_org_makes(backend: Backend) {
    let config = exk8s_api::app::ApiConfig {
        quotas: exk8s_api::quotas::Quotas {
            clusters: 2,
            vms: 5,
            pools: 1,
        },
        ..test_config()
    };
    let app = spawn_with(backend, config, None).await;
    let refused = |response: reqwest::Response, what: &'static str, used: i64, asked: i64| async move {
        assert_eq!(response.status(), 409, "{what}");
        let error = json_of(response).await;
        assert_eq!(error["error"]["code"], "quota_exceeded", "{error}");
        let message = error["error"]["message"].as_str().unwrap().to_owned();
        assert!(
            message.contains(&format!("{what} quota"))
                && message.contains(&format!("it uses {used}"))
                && message.contains(&format!("asks for {asked} more")),
            "{message}"
        );
    };
    let first = json_of(app.found(3, json!({})).await).await;
    let cluster = first["cluster_id"].as_i64().unwrap();
    refused(app.found(3, json!({})).await, "vms", 3, 3).await;
    assert_eq!(app.found(1, json!({})).await.status(), 201);
    refused(app.found(1, json!({})).await, "clusters", 2, 1).await;
    assert_eq!(
        app.sims.compute.vms().len(),
        4,
        "nothing made for a refusal"
    );

    let pools = format!("/clusters/{cluster}/node-pools");
    let response = app
        .post(&pools)
        .json(&crate::pools::pool_body("big", 2))
        .send()
        .await
        .unwrap();
    refused(response, "vms", 4, 2).await;
    let response = app
        .post(&pools)
        .json(&crate::pools::pool_body("one", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let response = app
        .post(&pools)
        .json(&crate::pools::pool_body("two", 0))
        .send()
        .await
        .unwrap();
    refused(response, "pools", 1, 1).await;

    // Another org has its own quota.
    let other = operator_token(&app.state, 8, Scope::Operator, 3600).await;
    let response = app
        .http
        .post(format!("{}/clusters", app.url))
        .header(WAIT.0, WAIT.1)
        .bearer_auth(other)
        .json(&valid_body(3))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
}

both_backends!(
    a_full_subnet_is_named_and_compensated,
    quotas_bound_what_an_org_makes,
);
