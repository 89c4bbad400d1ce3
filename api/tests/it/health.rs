//! Machine health checks on SQLite and PostgreSQL, with an injected clock: the agent's
//! authenticated requests are its heartbeat (written at most once a minute); the health pass
//! keeps what the compute API says of each VM (one listing per cluster, by tag); each node's
//! `HealthCheckSucceeded` watches a problem and turns False once it lasted the policy's
//! timeout, back to True when it is gone; the policy is read and replaced per cluster, and a
//! policy that would misjudge a healthy machine is refused naming its field.

use std::sync::Arc;

use exk8s_api::clock::{Clock as _, ManualClock};
use exk8s_api::sim::VmEvent;
use serde_json::{Value, json};

use crate::app::{Backend, TestApp, both_backends, json_of, spawn_clocked, test_config};
use crate::sync::{Signing, send};
use crate::upgrade::{booted, view};

/// The node's `HealthCheckSucceeded`: status, reason, message.
fn checked(view: &Value, vm: i64) -> (String, String, String) {
    let node = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["vm_id"] == vm)
        .unwrap_or_else(|| panic!("no node {vm} in {view}"));
    let condition = node["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "HealthCheckSucceeded")
        .unwrap_or_else(|| panic!("node {vm} has no HealthCheckSucceeded: {node}"));
    let text = |k: &str| condition[k].as_str().unwrap().to_owned();
    (text("status"), text("reason"), text("message"))
}

fn last_seen(view: &Value, vm: i64) -> Option<i64> {
    view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["vm_id"] == vm)
        .and_then(|n| n["last_seen_at"].as_i64())
}

async fn health_pass(app: &TestApp) {
    exk8s_api::health::pass::pass(&app.state.health()).await;
}

async fn a_machine_is_judged_by_its_vm_its_heartbeat_and_its_components(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(time::OffsetDateTime::now_utc()));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let t0 = clock.unix();
    let nodes = booted(&app).await;
    let cluster = nodes[0].0.cluster;
    let vm = |i: usize| nodes[i].0.vm;

    // Booted and reported: heard from now, healthy; the policy is the default one.
    health_pass(&app).await;
    let seen = view(&app, cluster).await;
    for i in 0..3 {
        assert_eq!(last_seen(&seen, vm(i)), Some(t0), "{seen}");
        let (status, reason, _) = checked(&seen, vm(i));
        assert_eq!((status.as_str(), reason.as_str()), ("True", "Healthy"));
    }
    assert_eq!(seen["health_policy"]["max_unhealthy"], "40%", "{seen}");
    assert_eq!(seen["health_policy"]["remediation"], true);

    // Node 0's VM is stopped behind our back: watched at once, unhealthy after two minutes,
    // healthy again once it runs.
    assert!(app.sims.compute.befall(vm(0), VmEvent::Stop));
    health_pass(&app).await;
    let (status, reason, message) = checked(&view(&app, cluster).await, vm(0));
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "Watching"),
        "{message}"
    );
    assert!(
        message.contains("its VM is stopped") && message.contains("unhealthy in 2 minutes"),
        "{message}"
    );
    clock.advance(time::Duration::minutes(3));
    health_pass(&app).await;
    let (status, reason, message) = checked(&view(&app, cluster).await, vm(0));
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "MachineNotRunning"),
        "{message}"
    );
    assert!(
        message.contains("its VM is stopped (3 minutes)"),
        "{message}"
    );
    assert!(app.sims.compute.befall(vm(0), VmEvent::Start));
    health_pass(&app).await;
    let (status, reason, _) = checked(&view(&app, cluster).await, vm(0));
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Healthy"));

    // Node 1's VM is destroyed: the compute API no longer knows it.
    assert!(app.sims.compute.befall(vm(1), VmEvent::Destroy));
    health_pass(&app).await;
    clock.advance(time::Duration::minutes(2));
    let (status, reason, message) = checked(&view(&app, cluster).await, vm(1));
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "MachineDeleted"),
        "{message}"
    );

    // Node 2 polls (a signed request): its heartbeat moves, then not again within a minute.
    let (node, key) = &nodes[2];
    let poll = || async {
        let path = format!("/nodes/{}/generation", node.vm);
        let answer = send(&app, "GET", &path, b"", &Signing::new(key, &node.imds)).await;
        assert_eq!(answer.status(), 200);
    };
    poll().await;
    let polled_at = clock.unix();
    assert_eq!(
        last_seen(&view(&app, cluster).await, vm(2)),
        Some(polled_at)
    );
    clock.advance(time::Duration::seconds(30));
    poll().await;
    assert_eq!(
        last_seen(&view(&app, cluster).await, vm(2)),
        Some(polled_at)
    );
    // Then it falls silent: watched past half the timeout, unhealthy at it.
    clock.advance(time::Duration::minutes(8));
    let (status, reason, message) = checked(&view(&app, cluster).await, vm(2));
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "Watching"),
        "{message}"
    );
    assert!(
        message.contains("its agent stopped asking for updates"),
        "{message}"
    );
    clock.advance(time::Duration::minutes(7));
    let (status, reason, message) = checked(&view(&app, cluster).await, vm(2));
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NodeUnreachable"),
        "{message}"
    );
    assert!(message.contains("(15 minutes)"), "{message}");
}

async fn the_health_policy_is_read_replaced_and_checked(backend: Backend) {
    let app = crate::app::spawn_app(backend).await;
    let nodes = booted(&app).await;
    let cluster = nodes[0].0.cluster;
    let path = format!("/clusters/{cluster}/health-policy");
    let got = json_of(app.get(&path).send().await.unwrap()).await;
    assert_eq!(got["unreachable_after_secs"], 900, "{got}");
    assert_eq!(got["max_remediations"], 3);

    // Left-out fields take their defaults.
    let put = app
        .put(&path)
        .json(&json!({"remediation": false, "max_unhealthy": "1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let set = json_of(put).await;
    assert_eq!(
        (&set["remediation"], &set["max_unhealthy"]),
        (&json!(false), &json!("1"))
    );
    assert_eq!(set["unreachable_after_secs"], 900);
    let shown = view(&app, cluster).await;
    assert_eq!(shown["health_policy"], set, "{shown}");

    for (body, field, says) in [
        (
            json!({"unreachable_after_secs": 120}),
            "unreachable_after_secs",
            "polls every five to seven minutes",
        ),
        (
            json!({"vm_down_after_secs": 5}),
            "vm_down_after_secs",
            "shorter than a minute",
        ),
        (
            json!({"max_remediations": 0}),
            "max_remediations",
            "turn remediation off instead",
        ),
    ] {
        let refused = app.put(&path).json(&body).send().await.unwrap();
        assert_eq!(refused.status(), 422, "{body}");
        let error = json_of(refused).await;
        assert_eq!(error["error"]["field"], field, "{error}");
        assert!(
            error["error"]["message"].as_str().unwrap().contains(says),
            "{error}"
        );
    }
    for body in [json!({"max_unhealthy": "150%"}), json!({"remedy": true})] {
        let refused = app.put(&path).json(&body).send().await.unwrap();
        assert!(matches!(refused.status().as_u16(), 400 | 422), "{body}");
    }
    // Unchanged by the refusals.
    assert_eq!(json_of(app.get(&path).send().await.unwrap()).await, set);
    let missing = app
        .get("/clusters/999999/health-policy")
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
}

/// The compute contract's listing by tag and the simulator's VM events, over HTTP: the client
/// the API runs against a real compute service, served by the simulator.
#[tokio::test]
async fn the_compute_client_lists_vms_by_tag_and_the_simulator_kills_them_over_http() {
    use exk8s_api::compute::{Compute, CreateVm, http::HttpCompute};

    let sims = exk8s_api::sim::Simulators::new("127.0.10.0/24").unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = exk8s_api::sim::server::router(sims.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let compute = HttpCompute::new(&base).unwrap();
    let mut ids = Vec::new();
    for (token, cluster) in [("a", "7"), ("b", "7"), ("c", "8")] {
        let vm = compute
            .create_vm(&CreateVm {
                name: token.into(),
                image_id: 1,
                instance_type: "small".into(),
                zone_id: 1,
                subnet_id: 7,
                security_group_ids: vec![],
                allocate_public_ipv4: false,
                ssh_pubkey: None,
                root_volume_size_gib: 10,
                userdata: String::new(),
                tags: [("exk8s.io/cluster".to_owned(), cluster.to_owned())].into(),
                client_token: token.into(),
            })
            .await
            .unwrap();
        ids.push(vm.id);
    }
    let listed = |vms: Vec<exk8s_api::compute::Vm>| {
        let mut ids: Vec<(i64, String)> = vms.into_iter().map(|vm| (vm.id, vm.state)).collect();
        ids.sort();
        ids
    };
    let seven = compute.vms_tagged("exk8s.io/cluster", "7").await.unwrap();
    assert_eq!(
        listed(seven),
        vec![(ids[0], "running".into()), (ids[1], "running".into())]
    );
    assert!(
        compute
            .vms_tagged("exk8s.io/cluster", "9")
            .await
            .unwrap()
            .is_empty()
    );

    let http = reqwest::Client::new();
    let befall = |vm: i64, event: &str| {
        let url = format!("{base}/sim/vms/{vm}/{event}");
        let http = http.clone();
        async move { http.post(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(befall(ids[0], "stop").await, 204);
    assert_eq!(befall(ids[1], "destroy").await, 204);
    let seven = compute.vms_tagged("exk8s.io/cluster", "7").await.unwrap();
    assert_eq!(listed(seven), vec![(ids[0], "stopped".into())]);
    assert_eq!(compute.get_vm(ids[1]).await.unwrap(), None);
    assert_eq!(befall(ids[0], "start").await, 204);
    assert_eq!(
        compute.get_vm(ids[0]).await.unwrap().unwrap().state,
        "running"
    );
    // Refusals name what is wrong.
    assert_eq!(befall(ids[1], "stop").await, 404);
    assert_eq!(befall(ids[0], "explode").await, 404);
    let bad = http
        .get(format!("{base}/v1/vms?tag=no-equals-sign"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("key=value"));
}

both_backends!(
    a_machine_is_judged_by_its_vm_its_heartbeat_and_its_components,
    the_health_policy_is_read_replaced_and_checked,
);
