//! Component conditions on SQLite and PostgreSQL, following what agents report of their
//! components: per node (`EtcdMemberHealthy`, `APIServerPodHealthy`, …) and per cluster
//! (`Available` by its rule — etcd quorum and one healthy apiserver, not every node ready —,
//! `EtcdClusterHealthy`, `ControlPlaneComponentsHealthy`), through a founding, a node whose
//! apiserver never becomes ready, a later sync that sees an apiserver fall and recover, and the
//! loss of etcd quorum; malformed component lists are refused (400) naming the field.

use serde_json::{Value, json};

use crate::app::{Backend, Node, TestApp, both_backends, credentials_for, json_of, spawn_app};
use crate::membership::{condition, view};

async fn report(app: &TestApp, node: &Node, phase: &str, state: &str, components: Value) -> u16 {
    app.http
        .post(format!(
            "{}/bootstrap/control-plane/{}/status",
            app.url, node.vm
        ))
        .header("X-exc-imds-token", &node.imds)
        .bearer_auth(&node.bootstrap)
        .json(&json!({"phase": phase, "state": state, "message": "", "components": components}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn all_healthy() -> Value {
    json!([
        {"component": "etcd", "healthy": true},
        {"component": "kube-apiserver", "healthy": true},
        {"component": "kube-controller-manager", "healthy": true},
        {"component": "kube-scheduler", "healthy": true},
        {"component": "kubelet", "healthy": true},
    ])
}

/// (status, reason) of the cluster's condition `type_`.
fn cluster_condition(view: &Value, type_: &str) -> (String, String) {
    let c = condition(view, type_);
    (
        c["status"].as_str().unwrap().to_owned(),
        c["reason"].as_str().unwrap().to_owned(),
    )
}

fn node_condition(view: &Value, vm: i64, type_: &str) -> Value {
    let node = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["vm_id"] == vm)
        .unwrap();
    node["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} on {node}"))
        .clone()
}

fn pair(status: &str, reason: &str) -> (String, String) {
    (status.to_owned(), reason.to_owned())
}

async fn conditions_follow_the_component_reports(backend: Backend) {
    let app = spawn_app(backend).await;
    let created = json_of(app.found(3, json!({"control_plane_image_id": 42})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let nodes = credentials_for(&app, 7, &created).await;

    let before = view(&app, cluster).await;
    assert_eq!(
        cluster_condition(&before, "EtcdClusterHealthy"),
        pair("Unknown", "NotReported")
    );
    assert_eq!(
        cluster_condition(&before, "ControlPlaneComponentsHealthy"),
        pair("Unknown", "NotReported")
    );
    assert_eq!(
        cluster_condition(&before, "Available"),
        pair("False", "EtcdQuorumLost")
    );
    for type_ in [
        "EtcdMemberHealthy",
        "APIServerPodHealthy",
        "ControllerManagerPodHealthy",
        "SchedulerPodHealthy",
        "KubeletHealthy",
    ] {
        assert_eq!(
            node_condition(&before, nodes[0].vm, type_)["status"],
            "Unknown"
        );
    }

    // One of three etcd members healthy: no quorum yet.
    assert_eq!(
        report(&app, &nodes[0], "complete", "succeeded", all_healthy()).await,
        204
    );
    let one = view(&app, cluster).await;
    assert_eq!(
        cluster_condition(&one, "EtcdClusterHealthy"),
        pair("False", "QuorumLost")
    );
    assert_eq!(
        cluster_condition(&one, "Available"),
        pair("False", "EtcdQuorumLost")
    );
    assert_eq!(
        node_condition(&one, nodes[0].vm, "APIServerPodHealthy")["status"],
        "True"
    );

    // Two of three: quorum and an apiserver — Available, though not every node is ready.
    assert_eq!(
        report(&app, &nodes[1], "complete", "succeeded", all_healthy()).await,
        204
    );
    let two = view(&app, cluster).await;
    assert_eq!(
        cluster_condition(&two, "Available"),
        pair("True", "Available")
    );
    assert_eq!(two["ready"], false);
    assert_eq!(
        cluster_condition(&two, "EtcdClusterHealthy"),
        pair("False", "MembersUnhealthy")
    );

    // The third node's apiserver never becomes ready: its probe's message is the condition's.
    let probe = "not healthy after 600s: unhealthy: [-]etcd failed: reason withheld";
    let stuck = json!([
        {"component": "etcd", "healthy": true},
        {"component": "kubelet", "healthy": true},
        {"component": "kube-apiserver", "healthy": false, "message": probe},
    ]);
    assert_eq!(
        report(&app, &nodes[2], "apiserver", "failed", stuck).await,
        204
    );
    let third = view(&app, cluster).await;
    let apiserver = node_condition(&third, nodes[2].vm, "APIServerPodHealthy");
    assert_eq!(apiserver["status"], "False");
    assert_eq!(apiserver["reason"], "Unhealthy");
    assert_eq!(apiserver["message"], probe);
    assert_eq!(
        node_condition(&third, nodes[2].vm, "SchedulerPodHealthy")["status"],
        "Unknown",
        "never reached"
    );
    assert_eq!(
        cluster_condition(&third, "EtcdClusterHealthy"),
        pair("True", "Healthy")
    );
    let components = condition(&third, "ControlPlaneComponentsHealthy");
    assert_eq!(components["status"], "False");
    assert!(
        components["message"].as_str().unwrap().contains(&format!(
            "kube-apiserver on {}: {probe}",
            third["nodes"][2]["name"].as_str().unwrap()
        )),
        "{components}"
    );
    assert_eq!(
        cluster_condition(&third, "Available"),
        pair("True", "Available")
    );

    // A sync sees the first node's apiserver fall, then recover.
    let falling =
        json!([{"component": "kube-apiserver", "healthy": false, "message": "connection refused"}]);
    assert_eq!(
        report(&app, &nodes[0], "sync", "succeeded", falling).await,
        204
    );
    let fell = view(&app, cluster).await;
    assert_eq!(
        node_condition(&fell, nodes[0].vm, "APIServerPodHealthy")["message"],
        "connection refused"
    );
    assert_eq!(
        node_condition(&fell, nodes[0].vm, "EtcdMemberHealthy")["status"],
        "True",
        "what a report leaves out stays as last reported"
    );
    let back = json!([{"component": "kube-apiserver", "healthy": true}]);
    assert_eq!(
        report(&app, &nodes[0], "sync", "succeeded", back).await,
        204
    );
    let recovered = view(&app, cluster).await;
    assert_eq!(
        node_condition(&recovered, nodes[0].vm, "APIServerPodHealthy")["status"],
        "True"
    );

    // Two etcd members down: quorum lost, not Available whatever the apiservers say.
    for node in &nodes[..2] {
        let down = json!([{"component": "etcd", "healthy": false, "message": "no answer"}]);
        assert_eq!(report(&app, node, "sync", "failed", down).await, 204);
    }
    let lost = view(&app, cluster).await;
    assert_eq!(
        cluster_condition(&lost, "EtcdClusterHealthy"),
        pair("False", "QuorumLost")
    );
    assert_eq!(
        cluster_condition(&lost, "Available"),
        pair("False", "EtcdQuorumLost")
    );

    // Malformed lists are refused, naming the field.
    let twice =
        json!([{"component": "etcd", "healthy": true}, {"component": "etcd", "healthy": false}]);
    let long = json!([{"component": "etcd", "healthy": false, "message": "x".repeat(1001)}]);
    for bad in [twice, long] {
        let refused = app
            .http
            .post(format!(
                "{}/bootstrap/control-plane/{}/status",
                app.url, nodes[0].vm
            ))
            .header("X-exc-imds-token", &nodes[0].imds)
            .bearer_auth(&nodes[0].bootstrap)
            .json(&json!({"phase": "sync", "state": "succeeded", "components": bad}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 400);
        assert_eq!(json_of(refused).await["error"]["field"], "components");
    }
    let unknown = json!([{"component": "kube-proxy", "healthy": true}]);
    assert_eq!(
        report(&app, &nodes[0], "sync", "succeeded", unknown).await,
        400
    );
}
both_backends!(conditions_follow_the_component_reports);
