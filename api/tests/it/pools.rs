//! Worker pools through the API, on SQLite and PostgreSQL, against the compute simulator: a
//! pool is made, scaled up and down (newest first) and deleted, VMs following;
//! every bad request is refused with the field named; a creation left half-made is undone and
//! the pool converged by the reconciler (a burst of creations: `pool_burst.rs`).

use std::collections::BTreeSet;
use std::time::Duration;

use exk8s_api::db;
use serde_json::{Value, json};

use crate::app::{Backend, TestApp, both_backends, json_of, operator_token, spawn_app};
use crate::crash::wait_until;
use exk8s_api::tokens::Scope;

pub(crate) fn pool_body(name: &str, count: i64) -> Value {
    json!({"name": name, "count": count, "instance_type": "e2.small", "image_id": 77, "subnet_id": 5})
}

/// Founds a 3-node cluster; its id.
pub(crate) async fn founded(app: &TestApp) -> i64 {
    let created = json_of(app.found(3, json!({})).await).await;
    created["cluster_id"].as_i64().unwrap()
}

pub(crate) async fn pool(app: &TestApp, cluster: i64, pool: i64) -> Value {
    let response = app
        .get(&format!("/clusters/{cluster}/node-pools/{pool}"))
        .send()
        .await
        .unwrap();
    json_of(response).await
}

/// Waits until the pool has exactly `count` workers, none on its way out.
pub(crate) async fn settled(app: &TestApp, cluster: i64, id: i64, count: usize) -> Value {
    wait_until(
        &format!("pool {id} at {count} workers"),
        Duration::from_secs(30),
        || async {
            let p = pool(app, cluster, id).await;
            p["nodes"].as_array().map(Vec::len) == Some(count)
                && p["replicas"] == json!(count)
                && p.get("error_message").is_none()
        },
    )
    .await;
    pool(app, cluster, id).await
}

/// Waits until no convergence holds the pool (the background one a change started is done).
pub(crate) async fn idle(app: &TestApp, pool: i64) {
    use sqlx::Row as _;
    wait_until(
        "the pool's convergence to end",
        Duration::from_secs(30),
        || async {
            sqlx::query("SELECT lease_until FROM node_pools WHERE id = $1")
                .bind(pool)
                .fetch_optional(&app.state.db.pool)
                .await
                .unwrap()
                .is_none_or(|r| r.get::<Option<i64>, _>("lease_until").is_none())
        },
    )
    .await;
}

/// The simulator's worker VMs of `pool`, by id.
pub(crate) fn worker_vms(app: &TestApp, pool: &str) -> BTreeSet<i64> {
    app.sims
        .compute
        .vms()
        .into_iter()
        .filter(|vm| vm.tags.get("exk8s.io/pool").map(String::as_str) == Some(pool))
        .map(|vm| vm.id)
        .collect()
}

/// The VM ids of a pool's view.
pub(crate) fn vm_ids(pool: &Value) -> BTreeSet<i64> {
    pool["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["vm_id"].as_i64().unwrap())
        .collect()
}

async fn a_pool_is_made_scaled_newest_first_and_deleted(backend: Backend) {
    let app = spawn_app(backend).await;
    let cluster = founded(&app).await;
    let mut body = pool_body("blue", 3);
    body["labels"] = json!({"node.kubernetes.io/pool": "blue"});
    body["taints"] = json!([{"key": "dedicated", "value": "blue", "effect": "NoSchedule"}]);
    let response = app
        .post(&format!("/clusters/{cluster}/node-pools"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let created = json_of(response).await;
    assert_eq!(created["desired"], 3);
    assert_eq!(created["labels"]["node.kubernetes.io/pool"], "blue");
    let id = created["id"].as_i64().unwrap();

    let three = settled(&app, cluster, id, 3).await;
    assert_eq!(vm_ids(&three), worker_vms(&app, "blue"));
    for node in three["nodes"].as_array().unwrap() {
        let name = node["name"].as_str().unwrap();
        assert_eq!(
            name,
            format!("blue-{}.cluster-{cluster}.internal", node["vm_id"])
        );
        assert_eq!(node["phase"], "pending");
    }
    for vm in app.sims.compute.vms() {
        if vm.tags.contains_key("exk8s.io/pool") {
            assert_eq!(vm.tags["exk8s.io/role"], "worker");
            assert_eq!(vm.tags["exk8s.io/cluster"], cluster.to_string());
        }
    }

    let scale = |count: i64| {
        app.patch(&format!("/clusters/{cluster}/node-pools/{id}"))
            .json(&json!({"count": count}))
            .send()
    };
    assert_eq!(scale(5).await.unwrap().status(), 202);
    let five = settled(&app, cluster, id, 5).await;
    assert!(vm_ids(&five).is_superset(&vm_ids(&three)));
    assert_eq!(vm_ids(&five), worker_vms(&app, "blue"));

    // Workers that never booted run nothing: they go without a drain, newest first.
    assert_eq!(scale(1).await.unwrap().status(), 202);
    let one = settled(&app, cluster, id, 1).await;
    let oldest = five["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .min_by_key(|n| n["ordinal"].as_i64())
        .unwrap();
    assert_eq!(one["nodes"][0]["ordinal"], oldest["ordinal"]);
    let kept = oldest["vm_id"].as_i64().unwrap();
    assert_eq!(worker_vms(&app, "blue"), BTreeSet::from([kept]));

    // New labels and taints are what workers register with from then on.
    let relabelled = app
        .patch(&format!("/clusters/{cluster}/node-pools/{id}"))
        .json(&json!({"labels": {"node.kubernetes.io/pool": "blue-2"}, "taints": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(relabelled.status(), 202);
    let relabelled = json_of(relabelled).await;
    assert_eq!(
        relabelled["labels"],
        json!({"node.kubernetes.io/pool": "blue-2"})
    );
    assert_eq!(relabelled["taints"], json!([]));
    assert_eq!(relabelled["desired"], 1, "the count is kept");

    assert_eq!(scale(2).await.unwrap().status(), 202);
    let two = settled(&app, cluster, id, 2).await;
    assert!(vm_ids(&two).contains(&kept));

    let deleted = app
        .delete(&format!("/clusters/{cluster}/node-pools/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 202);
    wait_until("the pool to go", Duration::from_secs(30), || async {
        app.get(&format!("/clusters/{cluster}/node-pools/{id}"))
            .send()
            .await
            .unwrap()
            .status()
            == 404
    })
    .await;
    assert!(worker_vms(&app, "blue").is_empty());
    let nodes = db::nodes::list(&app.state.db.pool, cluster).await.unwrap();
    assert_eq!(nodes.len(), 3, "only the control plane is left");
    let journal = db::resources::list_for_cluster(&app.state.db.pool, cluster)
        .await
        .unwrap();
    let pool_vms: Vec<_> = journal.iter().filter(|r| r.pool_id == Some(id)).collect();
    assert_eq!(
        pool_vms.len(),
        6,
        "3, then 2 more, then 1 after scaling to 1"
    );
    assert!(pool_vms.iter().all(|r| r.state == "deleted"));
    // The cluster's machine ordinals were never reused.
    let ordinals: BTreeSet<i64> = journal.iter().filter_map(|r| r.ordinal).collect();
    assert_eq!(ordinals.len(), 9);
    assert_eq!(app.sims.compute.vms().len(), 3);
}

async fn bad_pool_requests_are_refused_naming_the_problem(backend: Backend) {
    let app = spawn_app(backend).await;
    let cluster = founded(&app).await;
    let path = format!("/clusters/{cluster}/node-pools");
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({"count": 1, "instance_type": "e2.small", "image_id": 77, "subnet_id": 5}),
            "name",
        ),
        (
            {
                let mut b = pool_body("blue", 1);
                b["count"] = json!(1001);
                b
            },
            "count",
        ),
        (
            {
                let mut b = pool_body("Blue", 1);
                b["count"] = json!(1);
                b
            },
            "name",
        ),
        (
            {
                let mut b = pool_body("blue", 1);
                b["subnet_id"] = json!(5000);
                b
            },
            "subnet_id",
        ),
        (
            {
                let mut b = pool_body("blue", 1);
                b["labels"] = json!({"kubernetes.io/role": "x"});
                b
            },
            "labels.kubernetes.io/role",
        ),
        (
            {
                let mut b = pool_body("blue", 1);
                b["taints"] = json!([{"key": "a", "effect": "Never"}]);
                b
            },
            "taints[0]",
        ),
    ];
    for (body, field) in cases {
        let response = app.post(&path).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 422, "{body}");
        let error = json_of(response).await;
        assert_eq!(error["error"]["field"], field, "{error}");
    }
    let unknown = app
        .post(&path)
        .json(&json!({"name": "x", "count": 1, "colour": "red"}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 400, "unknown fields are refused");

    assert_eq!(
        app.post(&path)
            .json(&pool_body("blue", 0))
            .send()
            .await
            .unwrap()
            .status(),
        202
    );
    let again = app
        .post(&path)
        .json(&pool_body("blue", 0))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 409);
    assert!(
        json_of(again).await["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already has a pool named `blue`")
    );

    // Nobody else's cluster, and no cluster at all, is found.
    let other = operator_token(&app.state, 8, Scope::Operator, 600).await;
    for (token, path) in [
        (&other, format!("/clusters/{cluster}/node-pools")),
        (&app.token, "/clusters/999999/node-pools".to_owned()),
    ] {
        let response = app
            .http
            .post(format!("{}{path}", app.url))
            .bearer_auth(token)
            .json(&pool_body("green", 1))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{path}");
        let listed = app
            .http
            .get(format!("{}{path}", app.url))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(listed.status(), 404, "{path}");
    }

    let pools = json_of(app.get(&path).send().await.unwrap()).await;
    let id = pools[0]["id"].as_i64().unwrap();
    let nothing = app
        .patch(&format!("{path}/{id}"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(nothing.status(), 422);
    assert!(
        json_of(nothing).await["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nothing to change")
    );

    // One key, one request: another body, or the same body on another route, is refused.
    let keyed = |body: Value, path: &str| {
        app.post(path)
            .header("Idempotency-Key", "pool-key-1")
            .json(&body)
            .send()
    };
    assert_eq!(
        keyed(pool_body("red", 0), &path).await.unwrap().status(),
        202
    );
    let replay = keyed(pool_body("red", 0), &path).await.unwrap();
    assert_eq!(replay.status(), 202);
    assert_eq!(json_of(replay).await["name"], "red");
    assert_eq!(
        keyed(pool_body("red", 1), &path).await.unwrap().status(),
        422
    );
    assert_eq!(
        keyed(crate::app::valid_body(1), "/clusters")
            .await
            .unwrap()
            .status(),
        422,
        "a pool's key is not a cluster's"
    );
}

async fn a_creation_left_half_made_is_undone_and_the_pool_converged(backend: Backend) {
    let app = spawn_app(backend).await;
    let cluster = founded(&app).await;
    // The pool's row as a process killed before its convergence left it (recorded directly: a
    // convergence spawned by `POST` could start at any time, even after the crash below).
    let cluster_view = json_of(
        app.get(&format!("/clusters/{cluster}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let version = cluster_view["kubernetes_version"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut conn = app.state.db.pool.acquire().await.unwrap();
    let id = db::pools::insert(
        &mut conn,
        &db::pools::NewPool {
            cluster_id: cluster,
            name: "blue",
            instance_type: "e2.small",
            image_id: 77,
            subnet_id: 5,
            labels_json: "{}",
            taints_json: "[]",
            desired_count: 0,
            kubernetes_version: &version,
            max_surge: 1,
        },
        db::now(),
    )
    .await
    .unwrap();
    drop(conn);
    settled(&app, cluster, id, 0).await;

    // What a process killed between the compute call and the node record leaves: a journaled
    // VM that exists, and one journaled whose create never answered.
    let ordinal = db::clusters::next_ordinal(&app.state.db.pool, cluster)
        .await
        .unwrap();
    let vm = exk8s_api::machines::create(
        &app.state.machines(),
        exk8s_api::machines::NewMachine {
            cluster_id: cluster,
            ordinal,
            pool_id: Some(id),
            vm: exk8s_api::compute::CreateVm {
                name: "half-made".into(),
                image_id: 77,
                instance_type: "e2.small".into(),
                zone_id: 1,
                subnet_id: 5,
                security_group_ids: vec![],
                allocate_public_ipv4: false,
                ssh_pubkey: None,
                root_volume_size_gib: 20,
                userdata: String::new(),
                tags: [("exk8s.io/pool".to_owned(), "blue".to_owned())].into(),
                client_token: String::new(),
            },
        },
    )
    .await
    .unwrap();
    let lost = db::clusters::next_ordinal(&app.state.db.pool, cluster)
        .await
        .unwrap();
    db::resources::journal_intent(
        &app.state.db,
        &db::resources::Intent {
            cluster_id: cluster,
            kind: db::resources::Kind::Vm,
            client_token: &exk8s_api::machines::client_token(cluster, lost),
            ordinal: Some(lost),
            pool_id: Some(id),
        },
        db::now(),
    )
    .await
    .unwrap();
    db::pools::update(
        &app.state.db.pool,
        id,
        &db::pools::PoolChange {
            desired_count: Some(2),
            ..Default::default()
        },
        db::now(),
    )
    .await
    .unwrap();
    assert_eq!(
        db::pools::needing_work(&app.state.db.pool, db::now())
            .await
            .unwrap(),
        vec![id]
    );

    assert_eq!(
        exk8s_api::founding::reconcile::pools(&app.state.reconciler()).await,
        1
    );
    let two = pool(&app, cluster, id).await;
    assert_eq!(two["replicas"], 2);
    assert!(
        !vm_ids(&two).contains(&vm.id),
        "the half-made VM was released, not adopted"
    );
    assert!(app.sims.compute.vms().iter().all(|v| v.id != vm.id));
    assert_eq!(worker_vms(&app, "blue"), vm_ids(&two));
    assert!(
        db::pools::needing_work(&app.state.db.pool, db::now())
            .await
            .unwrap()
            .is_empty()
    );
}

async fn the_pod_cidr_bounds_how_many_workers_a_cluster_may_have(backend: Backend) {
    let config = exk8s_api::app::ApiConfig {
        // Four /24 blocks: the control plane takes three.
        pod_cidr: "10.244.0.0/22".into(),
        ..crate::app::test_config()
    };
    let app = crate::app::spawn_with(backend, config, None).await;
    let cluster = founded(&app).await;
    let path = format!("/clusters/{cluster}/node-pools");
    let refused = app
        .post(&path)
        .json(&pool_body("big", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    let error = json_of(refused).await;
    assert_eq!(error["error"]["field"], "count");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("10.244.0.0/22 has room for 4 nodes"),
        "{error}"
    );
    let created = json_of(
        app.post(&path)
            .json(&pool_body("small", 1))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let id = created["id"].as_i64().unwrap();
    settled(&app, cluster, id, 1).await;
    let more = app
        .patch(&format!("{path}/{id}"))
        .json(&json!({"count": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(more.status(), 422);
}

both_backends!(
    the_pod_cidr_bounds_how_many_workers_a_cluster_may_have,
    a_pool_is_made_scaled_newest_first_and_deleted,
    bad_pool_requests_are_refused_naming_the_problem,
    a_creation_left_half_made_is_undone_and_the_pool_converged,
);
