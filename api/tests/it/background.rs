//! Founding in the background: `POST /clusters` answers 202 with the cluster `provisioning` at
//! its `Location` before founding finished (held deterministically at its first VM by the
//! compute simulator), founding then goes on without a waiter; a full founding pool refuses
//! with 503 + Retry-After before recording anything; a founding that fails after the 202 ends
//! `failed` with its reason and nothing left; a replay of the same key answers the same 202.
//! A name asked for is the cluster's, unique in its org. (A crash after the 202 is in crash.rs.)

use std::time::Duration;

use exk8s_api::sim::Faults;
use serde_json::{Value, json};

use crate::app::{Backend, TestApp, both_backends, json_of, spawn_with, test_config, valid_body};
use crate::founding::assert_nothing_left;

fn hold(app: &TestApp, held: bool) {
    app.sims.set_faults(Faults {
        hold_vm_create: held,
        ..app.sims.compute.faults()
    });
}

/// `GET /clusters/{id}` until founding ended: no longer `provisioning`, nor `compensating` (a
/// failure being undone, on its way to `failed`). Up to three minutes: an RSA-4096 founding's
/// keys take tens of seconds of CPU when other tests share the cores.
async fn settled(app: &TestApp, location: &str) -> Value {
    for _ in 0..3600 {
        let view = json_of(app.get(location).send().await.unwrap()).await;
        if view["phase"] != "provisioning" && view["phase"] != "compensating" {
            return view;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{location} still provisioning after 3 minutes");
}

async fn founding_answers_202_before_it_finishes(backend: Backend) {
    let app = spawn_with(backend, test_config(), None).await;
    hold(&app, true);
    let mut body = valid_body(3);
    body["key_algorithm"] = json!("rsa-4096");
    let send = || {
        app.post("/clusters")
            .header("Idempotency-Key", "bg-1")
            .json(&body)
            .send()
    };
    let accepted = send().await.unwrap();
    assert_eq!(accepted.status(), 202);
    let location = accepted.headers()["location"].to_str().unwrap().to_owned();
    let view = json_of(accepted).await;
    let id = view["id"].as_i64().unwrap();
    assert_eq!(location, format!("/clusters/{id}"));
    assert_eq!(view["phase"], "provisioning", "{view}");
    assert_eq!(view["key_algorithm"], "rsa-4096");
    assert_eq!(view["nodes"], json!([]));
    assert_eq!(view["ready"], false);
    assert_eq!(view["name"], format!("exk8s-7-{id:x}"));

    // Held at its first VM: founding has not finished, whatever the machine's speed.
    let again = json_of(app.get(&location).send().await.unwrap()).await;
    assert_eq!(again["phase"], "provisioning");
    assert!(app.sims.compute.vms().is_empty());
    let kubeconfig = app
        .get(&format!("{location}/kubeconfig"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        kubeconfig.status(),
        409,
        "no kubeconfig before founding ends"
    );
    let credential = app
        .post(&format!("{location}/credentials"))
        .send()
        .await
        .unwrap();
    assert_eq!(credential.status(), 409, "nor a credential");
    let trust = app.get(&format!("{location}/trust")).send().await.unwrap();
    assert_eq!(trust.status(), 409, "nor its trust");

    // A replay answers the first 202, Location included, and founds nothing more.
    let replay = send().await.unwrap();
    assert_eq!(replay.status(), 202);
    assert_eq!(replay.headers()["location"].to_str().unwrap(), location);
    assert_eq!(json_of(replay).await["id"], id);
    assert_eq!(app.cluster_count().await, 1);

    hold(&app, false);
    let founded = settled(&app, &location).await;
    assert_eq!(founded["phase"], "founded", "{founded}");
    assert_eq!(founded["nodes"].as_array().unwrap().len(), 3);
    assert_eq!(app.sims.compute.vms().len(), 3);
    let kubeconfig = app
        .get(&format!("{location}/kubeconfig"))
        .send()
        .await
        .unwrap();
    assert_eq!(kubeconfig.status(), 200);
}
both_backends!(founding_answers_202_before_it_finishes);

async fn a_full_founding_pool_refuses_before_recording(backend: Backend) {
    let mut config = test_config();
    config.founding_workers = 1;
    config.founding_queue = 2;
    let app = spawn_with(backend, config, None).await;
    hold(&app, true);
    for _ in 0..2 {
        let accepted = app.post("/clusters").json(&valid_body(1)).send().await;
        assert_eq!(accepted.unwrap().status(), 202);
    }
    let refused = app
        .post("/clusters")
        .json(&valid_body(1))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "10");
    assert_eq!(app.cluster_count().await, 2, "the refused one left no row");

    hold(&app, false);
    let clusters = json_of(app.get("/clusters").send().await.unwrap()).await;
    for cluster in clusters.as_array().unwrap() {
        let view = settled(&app, &format!("/clusters/{}", cluster["id"])).await;
        assert_eq!(view["phase"], "founded", "{view}");
    }
    let later = app.post("/clusters").json(&valid_body(1)).send().await;
    assert_eq!(later.unwrap().status(), 202, "the places are free again");
}
both_backends!(a_full_founding_pool_refuses_before_recording);

async fn a_founding_that_fails_after_the_202_records_why(backend: Backend) {
    let app = spawn_with(backend, test_config(), None).await;
    app.sims.set_faults(Faults {
        fail_vm_create_nth: Some(2),
        ..Faults::default()
    });
    let accepted = app
        .post("/clusters")
        .json(&valid_body(3))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    let location = accepted.headers()["location"].to_str().unwrap().to_owned();
    let failed = settled(&app, &location).await;
    assert_eq!(failed["phase"], "failed", "{failed}");
    assert_eq!(failed["error_reason"], "VM creation", "{failed}");
    assert!(
        failed["error_message"]
            .as_str()
            .is_some_and(|m| m.contains("VM create")),
        "{failed}"
    );
    assert_nothing_left(&app);
}
both_backends!(a_founding_that_fails_after_the_202_records_why);

async fn a_name_asked_for_is_the_clusters_and_unique_in_its_org(backend: Backend) {
    let app = spawn_with(backend, test_config(), None).await;
    let mut body = valid_body(1);
    body["name"] = json!("shop");
    let created = json_of(app.found(1, json!({"name": "shop"})).await).await;
    assert_eq!(created["name"], "shop");
    let id = created["cluster_id"].as_i64().unwrap();
    let view = json_of(app.get(&format!("/clusters/{id}")).send().await.unwrap()).await;
    assert_eq!(view["name"], "shop");
    assert_eq!(
        view["control_plane_dns_name"],
        format!("exk8s-7-{id:x}.k8s.internal"),
        "DNS names stay the API's"
    );
    let kubeconfig = app
        .get(&format!("/clusters/{id}/kubeconfig"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        kubeconfig.contains("name: \"shop\""),
        "the kubeconfig's cluster"
    );

    let again = app.post("/clusters").json(&body).send().await.unwrap();
    assert_eq!(again.status(), 409);
    assert!(
        json_of(again).await["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`shop` already exists"),
    );
    assert_eq!(app.cluster_count().await, 1, "the refused one left no row");
    let other_org =
        crate::app::operator_token(&app.state, 8, exk8s_api::tokens::Scope::Operator, 3600).await;
    let elsewhere = app
        .http
        .post(format!("{}/clusters", app.url))
        .bearer_auth(other_org)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(elsewhere.status(), 202, "another org may use the name");
    for bad in ["Shop", "42", "exk8s-7-1", "shop-", ""] {
        body["name"] = json!(bad);
        let refused = app.post("/clusters").json(&body).send().await.unwrap();
        assert_eq!(refused.status(), 400, "{bad}");
        assert_eq!(json_of(refused).await["error"]["field"], "name", "{bad}");
    }
}
both_backends!(a_name_asked_for_is_the_clusters_and_unique_in_its_org);

/// A machine asks for its bundle as soon as it boots — here before founding recorded its node
/// (founding held at its second VM, the first one made and journaled): it is told to retry
/// (503 with `Retry-After`), never refused, and gets its bundle once founding ends. The same VM
/// asked for with another org's credentials, and a VM no journal names, are no node (404).
async fn a_vm_asking_before_its_node_is_recorded_is_told_to_retry(backend: Backend) {
    use crate::app::{imds_token, operator_token};
    use crate::bootstrap::{NONCE, fetch};
    use exk8s_api::tokens::Scope;

    let app = spawn_with(backend, test_config(), None).await;
    app.sims.set_faults(Faults {
        hold_vm_create: true,
        hold_vm_create_after: app.sims.compute.vm_creates() + 1,
        ..Faults::default()
    });
    let accepted = app
        .post("/clusters")
        .json(&valid_body(3))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    let location = accepted.headers()["location"].to_str().unwrap().to_owned();
    // The first VM made, and journaled with its id (founding then waits at the second).
    let mut first = None;
    for _ in 0..600 {
        if let Some(vm) = app.sims.compute.vms().first() {
            let journaled: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM cluster_resources WHERE external_id = $1 AND state = 'created'",
            )
            .bind(vm.id.to_string())
            .fetch_one(&app.state.db.pool)
            .await
            .unwrap();
            if journaled == 1 {
                first = Some(vm.id);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = first.expect("the first VM made and journaled within 30 s");
    assert_eq!(
        app.sims.compute.vms().len(),
        1,
        "founding holds at the second"
    );

    let bearer = format!(
        "Bearer {}",
        operator_token(&app.state, 7, Scope::Bootstrap, 600).await
    );
    let imds = imds_token(&app.state, first, 7, 600).await;
    let early = fetch(&app, first, Some(&imds), Some(&bearer), NONCE).await;
    let (status, retry) = (early.status(), early.headers().get("retry-after").cloned());
    assert_eq!(status, 503, "{:?}", early.text().await);
    assert_eq!(retry.unwrap(), "2");

    let stranger = format!(
        "Bearer {}",
        operator_token(&app.state, 8, Scope::Bootstrap, 600).await
    );
    let stranger_imds = imds_token(&app.state, first, 8, 600).await;
    let elsewhere = fetch(&app, first, Some(&stranger_imds), Some(&stranger), NONCE).await;
    assert_eq!(elsewhere.status(), 404, "another org's VM is no node");
    let unmade = first + 1000;
    let unmade_imds = imds_token(&app.state, unmade, 7, 600).await;
    let nowhere = fetch(&app, unmade, Some(&unmade_imds), Some(&bearer), NONCE).await;
    assert_eq!(nowhere.status(), 404, "a VM no journal names is no node");

    app.sims.set_faults(Faults::default());
    let founded = settled(&app, &location).await;
    assert_eq!(founded["phase"], "founded", "{founded}");
    let bundle = fetch(
        &app,
        first,
        Some(&imds),
        Some(&bearer),
        "bootstrap-test-nonce-0002",
    )
    .await;
    assert_eq!(bundle.status(), 200, "{:?}", bundle.text().await);
}
both_backends!(a_vm_asking_before_its_node_is_recorded_is_told_to_retry);
