//! Workers served by the role in their node record, on SQLite and PostgreSQL: a worker of a
//! pool (recorded directly here; the pool API builds on this) fetches its first bundle through
//! the same bootstrap route with its own credentials and gets the worker bundle — its pool's
//! labels and taints, its own pod range, the control-plane endpoint, no control-plane file —
//! recorded in the inventory; later its updates are not held by the control-plane rollout.

use std::collections::BTreeSet;

use exk8s_api::db;
use exk8s_api::tokens::Scope;
use exk8s_common::contract::Role;
use exk8s_common::node_auth::NodeKey;
use serde_json::json;

use crate::app::{
    Backend, Node, TestApp, both_backends, credentials_for, imds_token, json_of, operator_token,
    spawn_app,
};
use crate::bootstrap::report;
use crate::sync::{fetch_update, register, update_payload};

const WORKER_VM: i64 = 9001;

/// Records pool `blue` and one worker VM of it in `cluster`.
pub(crate) async fn record_worker(app: &TestApp, cluster: i64) -> Node {
    let mut tx = app.state.db.begin().await.unwrap();
    // The founding nodes hold blocks 0–2.
    assert_eq!(insert_worker(&mut tx, cluster, "blue", WORKER_VM).await, 3);
    tx.commit().await.unwrap();
    Node {
        vm: WORKER_VM,
        cluster,
        imds: imds_token(&app.state, WORKER_VM, 7, 600).await,
        bootstrap: operator_token(&app.state, 7, Scope::Bootstrap, 3600).await,
    }
}

/// Inserts pool `pool` and worker VM `vm` of it, in `tx`; how many nodes the cluster had before.
async fn insert_worker(tx: &mut sqlx::AnyConnection, cluster: i64, pool: &str, vm: i64) -> i64 {
    let now = db::now();
    let pool_id = db::pools::insert(
        &mut *tx,
        &db::pools::NewPool {
            cluster_id: cluster,
            name: pool,
            instance_type: "e2.medium",
            image_id: 42,
            subnet_id: 5,
            labels_json: r#"{"node.kubernetes.io/pool":"blue"}"#,
            taints_json: r#"[{"key":"dedicated","value":"blue","effect":"NoSchedule"}]"#,
            desired_count: 1,
            kubernetes_version: "v1.35.3",
            max_surge: 1,
        },
        now,
    )
    .await
    .unwrap();
    let name = exk8s_api::trust::node_name(cluster, pool, vm).unwrap();
    let before = db::nodes::count_for_adding(&mut *tx, cluster)
        .await
        .unwrap();
    db::nodes::insert(
        &mut *tx,
        &db::nodes::NewNode {
            cluster_id: cluster,
            ordinal: vm,
            vm_id: vm,
            node_name: name.as_str(),
            private_ipv4: "10.0.1.31",
            private_ipv6: None,
            public_ipv4: None,
            is_initial: false,
            role: Role::Worker,
            pool_id: Some(pool_id),
            etcd_membership: None,
        },
        now,
    )
    .await
    .unwrap();
    before
}

async fn a_worker_gets_the_worker_bundle_by_its_record(backend: Backend) {
    let app = spawn_app(backend).await;
    let created = json_of(app.found(3, json!({"control_plane_image_id": 42})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let mut control_plane = Vec::new();
    for node in credentials_for(&app, 7, &created).await {
        let key = NodeKey::generate().unwrap();
        register(&app, &node, &key).await;
        assert_eq!(report(&app, &node, "complete", "succeeded").await, 204);
        control_plane.push((node, key));
    }
    let worker = record_worker(&app, cluster).await;
    let key = NodeKey::generate().unwrap();
    let bundle = register(&app, &worker, &key).await;
    assert_eq!(bundle.identity.role, Role::Worker);
    let paths: BTreeSet<&str> = bundle.files.iter().map(|f| f.path.as_str()).collect();
    for forbidden in [
        "/etc/exk8s/pki/etcd-ca.pem",
        "/etc/exk8s/pki/service-account-key.pem",
        "/etc/exk8s/kubeconfig/admin.kubeconfig",
        "/etc/kubernetes/manifests/kube-apiserver.yaml",
    ] {
        assert!(!paths.contains(forbidden), "a worker got {forbidden}");
    }
    // The worker files of `render_worker`, the balancer's socket, unit and seeds among them.
    assert_eq!(paths, crate::render_worker::worker_paths());
    let text = |path: &str| {
        String::from_utf8(bundle.file(path).unwrap().content.as_bytes().to_vec()).unwrap()
    };
    // The seeds are the control-plane members' private addresses, from their records.
    let view = json_of(
        app.get(&format!("/clusters/{cluster}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let mut members: Vec<String> = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == "control-plane")
        .map(|n| format!("{}:6443", n["private_ipv4"].as_str().unwrap()))
        .collect();
    let seeds = text("/etc/exk8s/balancer-seeds");
    let mut seeds: Vec<String> = seeds
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    members.sort();
    seeds.sort();
    assert_eq!(members.len(), 3, "{view}");
    assert_eq!(seeds, members);
    let unit = text("/etc/systemd/system/kubelet.service");
    assert!(
        unit.contains("--node-labels=node.kubernetes.io/pool=blue"),
        "{unit}"
    );
    assert!(
        unit.contains(&format!(
            "--hostname-override=blue-{WORKER_VM}.cluster-{cluster}.internal"
        )),
        "{unit}"
    );
    let config = text("/var/lib/kubelet/config.yaml");
    assert!(config.contains("registerWithTaints"), "{config}");
    // The Node names its machine, as the API shows it.
    let listed = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["vm_id"] == WORKER_VM)
        .unwrap_or_else(|| panic!("no worker {WORKER_VM} in {view}"));
    assert_eq!(
        listed["provider_id"],
        format!("exk8s://{cluster}/{WORKER_VM}")
    );
    assert!(
        config.contains(&format!("providerID: \"exk8s://{cluster}/{WORKER_VM}\"\n")),
        "{config}"
    );
    // No pod range of the API's: containerd fills the template with the Node's.
    let template = text("/etc/containerd/bridge-cni.conflist.tmpl");
    assert!(template.contains(".PodCIDRRanges"), "{template}");
    // Through the node's balancer, which finds the members by the control plane's name.
    let kubeconfig = text("/etc/exk8s/kubeconfig/kubelet.kubeconfig");
    assert!(
        kubeconfig.contains("https://127.0.0.1:7445"),
        "{kubeconfig}"
    );
    let balancer = text("/etc/systemd/system/exk8s-apiserver-balancer.service");
    assert!(balancer.contains(":6443"), "{balancer}");

    // The inventory records the worker's three certificates, no serving one of the control plane.
    let inventory = json_of(
        app.get(&format!("/clusters/{cluster}/certificates"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let names: BTreeSet<&str> = inventory["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["vm_id"] == WORKER_VM)
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["kubelet", "kubelet.kubeconfig", "kube-proxy.kubeconfig"])
    );

    // Updates: a control-plane node in flight holds the other control-plane nodes, not workers.
    assert_eq!(report(&app, &worker, "complete", "succeeded").await, 204);
    let rollout = app
        .post(&format!("/clusters/{cluster}/rollout"))
        .send()
        .await
        .unwrap();
    assert_eq!(rollout.status(), 202);
    let (first, first_key) = &control_plane[0];
    assert_eq!(fetch_update(&app, first, first_key).await.status(), 200);
    let (second, second_key) = &control_plane[1];
    assert_eq!(fetch_update(&app, second, second_key).await.status(), 409);
    let update = update_payload(&app, fetch_update(&app, &worker, &key).await).await;
    assert_eq!(update.identity.role, Role::Worker);
    assert_eq!(update.identity.generation, 2);

    // A worker's credentials never reach a control-plane node's bundle, nor the other way round.
    let (cp, _) = &control_plane[0];
    for (vm, imds, bearer) in [
        (cp.vm, &worker.imds, &worker.bootstrap),
        (worker.vm, &cp.imds, &cp.bootstrap),
    ] {
        let response = crate::bootstrap::fetch(
            &app,
            vm,
            Some(imds),
            Some(&format!("Bearer {bearer}")),
            crate::bootstrap::NONCE,
        )
        .await;
        assert_eq!(
            response.status(),
            404,
            "VM {vm} with another VM's credentials"
        );
    }
}

both_backends!(a_worker_gets_the_worker_bundle_by_its_record);

/// Two additions to one cluster at once (two pools' workers recorded together): the second
/// waits for the first's transaction and counts its node, so two never both take the pod
/// CIDR's last block.
async fn concurrent_additions_count_one_after_another(backend: Backend) {
    let app = spawn_app(backend).await;
    let created = json_of(app.found(3, json!({"control_plane_image_id": 42})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let mut first = app.state.db.begin().await.unwrap();
    let taken = insert_worker(&mut first, cluster, "blue", WORKER_VM).await;
    assert_eq!(taken, 3);
    let state = app.state.clone();
    let second = tokio::spawn(async move {
        let mut tx = state.db.begin().await.unwrap();
        let before = insert_worker(&mut tx, cluster, "green", WORKER_VM + 1).await;
        tx.commit().await.unwrap();
        before
    });
    // Room for a second addition that does not wait to run ahead (it would finish at once).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second addition waits for the first's transaction"
    );
    first.commit().await.unwrap();
    assert_eq!(second.await.unwrap(), taken + 1);
}

both_backends!(concurrent_additions_count_one_after_another);
