//! Removing workers that booted, on SQLite and PostgreSQL: scaling a pool down marks its newest
//! workers draining and asks one control-plane node — by its next update bundle — to drain them
//! through the eviction API; only once that node reports the bundle applied are the VMs deleted
//! (a failed drain keeps them). A drain nobody finishes ends at the deadline (injected clock).
//! Deleting the cluster deletes its pools and their machines.

use std::sync::Arc;
use std::time::Duration;

use exk8s_api::clock::ManualClock;
use exk8s_api::tokens::Scope;
use exk8s_common::node_auth::NodeKey;
use exk8s_common::payload::PlanStep;
use serde_json::{Value, json};

use crate::app::{
    Backend, Node, TestApp, both_backends, credentials_for, imds_token, json_of, operator_token,
    spawn_clocked, test_config,
};
use crate::bootstrap::report;
use crate::crash::wait_until;
use crate::pools::{idle, pool, pool_body, settled, worker_vms};
use crate::sync::{fetch_update, register, sync_report, update_payload};

/// Registers and completes every worker of the pool, as their agents would.
async fn boot_workers(app: &TestApp, cluster: i64, pool: &Value) {
    let bootstrap = operator_token(&app.state, 7, Scope::Bootstrap, 3600).await;
    for node in pool["nodes"].as_array().unwrap() {
        let vm = node["vm_id"].as_i64().unwrap();
        let worker = Node {
            vm,
            cluster,
            imds: imds_token(&app.state, vm, 7, 600).await,
            bootstrap: bootstrap.clone(),
        };
        register(app, &worker, &NodeKey::generate().unwrap()).await;
        assert_eq!(report(app, &worker, "complete", "succeeded").await, 204);
    }
}

fn drains(payload: &exk8s_common::BundlePayload) -> Vec<String> {
    payload
        .plan
        .iter()
        .filter_map(|step| match step {
            PlanStep::DrainNode {
                kubeconfig, node, ..
            } => {
                assert_eq!(
                    kubeconfig.as_str(),
                    "/etc/exk8s/kubeconfig/admin.kubeconfig"
                );
                Some(node.as_str().to_owned())
            }
            _ => None,
        })
        .collect()
}

async fn removals(app: &TestApp, cluster: i64, id: i64) -> Vec<Value> {
    let p = pool(app, cluster, id).await;
    p["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["removal"].clone())
        .collect()
}

async fn booted_workers_are_drained_by_a_control_plane_node_before_their_vms_go(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(time::OffsetDateTime::now_utc()));
    let config = test_config();
    let drain_timeout = config.node_drain_timeout;
    let app = spawn_clocked(backend, config, None, clock.clone()).await;
    let created = json_of(app.found(3, json!({"control_plane_image_id": 42})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let mut control_plane = Vec::new();
    for node in credentials_for(&app, 7, &created).await {
        let key = NodeKey::generate().unwrap();
        register(&app, &node, &key).await;
        assert_eq!(report(&app, &node, "complete", "succeeded").await, 204);
        control_plane.push((node, key));
    }
    let path = format!("/clusters/{cluster}/node-pools");
    let id = json_of(
        app.post(&path)
            .json(&pool_body("blue", 2))
            .send()
            .await
            .unwrap(),
    )
    .await["id"]
        .as_i64()
        .unwrap();
    let two = settled(&app, cluster, id, 2).await;
    let machines = |view: &Value| {
        view["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "MachinesReady")
            .cloned()
            .unwrap()
    };
    let view = json_of(
        app.get(&format!("/clusters/{cluster}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let waiting = machines(&view);
    assert_eq!(waiting["status"], "False");
    assert!(
        waiting["message"]
            .as_str()
            .unwrap()
            .starts_with("2 of 5 machines are not ready: blue-"),
        "{waiting}"
    );
    assert_eq!(
        view["ready"], true,
        "the control plane is ready without its workers"
    );
    assert_eq!(
        view["node_pools"],
        json!([{"id": id, "name": "blue", "desired": 2, "replicas": 2, "ready_replicas": 0, "up_to_date_replicas": 0}])
    );
    boot_workers(&app, cluster, &two).await;
    let view = json_of(
        app.get(&format!("/clusters/{cluster}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(machines(&view)["status"], "True", "{view}");
    assert_eq!(machines(&view)["message"], "all 5 machines are ready");
    assert_eq!(view["node_pools"][0]["ready_replicas"], 2);
    assert_eq!(view["node_pools"][0]["up_to_date_replicas"], 2);
    let names: Vec<String> = two["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_owned())
        .collect();

    let scale = |count: i64| {
        app.patch(&format!("{path}/{id}"))
            .json(&json!({"count": count}))
            .send()
    };
    assert_eq!(scale(0).await.unwrap().status(), 202);
    wait_until("both workers draining", Duration::from_secs(20), || async {
        removals(&app, cluster, id).await == [json!("draining"), json!("draining")]
    })
    .await;
    assert_eq!(pool(&app, cluster, id).await["replicas"], 0);
    assert_eq!(
        worker_vms(&app, "blue").len(),
        2,
        "no VM goes before its drain"
    );

    // The oldest control-plane node drains; the others have nothing new.
    let (drainer, key) = &control_plane[0];
    let update = update_payload(&app, fetch_update(&app, drainer, key).await).await;
    assert_eq!(drains(&update), names);
    for (other, other_key) in &control_plane[1..] {
        assert_eq!(fetch_update(&app, other, other_key).await.status(), 204);
    }
    // A failed drain keeps the workers; the retried update drains them.
    sync_report(&app, drainer, key, "failed", update.identity.generation).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(removals(&app, cluster, id).await.len(), 2);
    assert_eq!(worker_vms(&app, "blue").len(), 2);
    let retried = update_payload(&app, fetch_update(&app, drainer, key).await).await;
    assert_eq!(drains(&retried), names);
    sync_report(&app, drainer, key, "succeeded", retried.identity.generation).await;
    settled(&app, cluster, id, 0).await;
    assert!(worker_vms(&app, "blue").is_empty());

    // Nobody drains this one: it goes at the deadline.
    assert_eq!(scale(1).await.unwrap().status(), 202);
    let one = settled(&app, cluster, id, 1).await;
    boot_workers(&app, cluster, &one).await;
    assert_eq!(scale(0).await.unwrap().status(), 202);
    wait_until("the worker draining", Duration::from_secs(20), || async {
        removals(&app, cluster, id).await == [json!("draining")]
    })
    .await;
    idle(&app, id).await;
    assert_eq!(
        exk8s_api::founding::reconcile::pools(&app.state.reconciler()).await,
        0
    );
    assert_eq!(
        worker_vms(&app, "blue").len(),
        1,
        "still within the deadline"
    );
    clock.advance(time::Duration::seconds(
        i64::try_from(drain_timeout.as_secs()).unwrap() + 1,
    ));
    assert_eq!(
        exk8s_api::founding::reconcile::pools(&app.state.reconciler()).await,
        1
    );
    assert!(worker_vms(&app, "blue").is_empty());
    assert_eq!(pool(&app, cluster, id).await["nodes"], json!([]));

    // Deleting the cluster deletes its pools and their machines.
    assert_eq!(scale(2).await.unwrap().status(), 202);
    settled(&app, cluster, id, 2).await;
    let deleted = app
        .delete(&format!("/clusters/{cluster}"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(app.sims.compute.vms().is_empty());
    assert_eq!(app.get(&path).send().await.unwrap().status(), 404);
    use sqlx::Row as _;
    let left: i64 = sqlx::query("SELECT COUNT(*) AS n FROM node_pools")
        .fetch_one(&app.state.db.pool)
        .await
        .unwrap()
        .get("n");
    assert_eq!(left, 0);
}

both_backends!(booted_workers_are_drained_by_a_control_plane_node_before_their_vms_go);
