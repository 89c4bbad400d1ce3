//! A control-plane node's first boot brings its components up in order, with the real API and
//! agent on the dev stack: etcd, its health, the kubelet, the apiserver's `/readyz`, the
//! controller-manager's and scheduler's `/healthz`, the node's registration, then the addons —
//! read from the agent's recorded actions — and each node condition follows what the boot's
//! waits and later syncs' probes saw. A component that never becomes healthy stops the
//! sequence there, and the failure the node reports names it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::io::{BufRead as _, BufReader};
use std::path::Path;

use exk8s_tests::cluster::{agent, found, operator};
use exk8s_tests::dev::start_dev;
use serde_json::{Value, json};

fn recorded(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("var/lib/exk8s/recorded-actions.log"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Where each of `steps` first appears in `actions`, in the order given (panics on a missing
/// one).
fn positions(actions: &[String], steps: &[&str]) -> Vec<usize> {
    steps
        .iter()
        .map(|step| {
            actions
                .iter()
                .position(|a| a.contains(step))
                .unwrap_or_else(|| panic!("no `{step}` in {actions:#?}"))
        })
        .collect()
}

const ORDER: [&str; 7] = [
    "systemctl start --no-block etcd.service",
    "wait for etcd health",
    "systemctl start --no-block kubelet.service",
    "wait for apiserver /readyz",
    "wait for kube-controller-manager /healthz at https://127.0.0.1:10257/healthz",
    "wait for kube-scheduler /healthz at https://127.0.0.1:10259/healthz",
    "wait for node ",
];

const NODE_CONDITIONS: [&str; 5] = [
    "EtcdMemberHealthy",
    "APIServerPodHealthy",
    "ControllerManagerPodHealthy",
    "SchedulerPodHealthy",
    "KubeletHealthy",
];

/// Condition `type_` of node `vm` in `GET /clusters/{cluster}`.
fn node_condition(stack: &exk8s_tests::dev::Stack, cluster: i64, vm: i64, type_: &str) -> Value {
    let view = exk8s_tests::cluster::view(stack, cluster);
    let node = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["vm_id"] == vm)
        .unwrap()
        .clone();
    node["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_}: {node}"))
        .clone()
}

/// The cluster's `report` events up to the first failed one.
fn reports_until_failure(stack: &exk8s_tests::dev::Stack, cluster: i64) -> Vec<Value> {
    let stream = operator(stack, "GET", &format!("/clusters/{cluster}/events"))
        .call()
        .unwrap();
    let mut reports = Vec::new();
    let mut kind = String::new();
    for line in BufReader::new(stream.into_reader()).lines() {
        let line = line.unwrap();
        if let Some(k) = line.strip_prefix("event: ") {
            kind = k.to_owned();
        } else if let Some(data) = line.strip_prefix("data: ") {
            if kind == "report" {
                let report: Value = serde_json::from_str(data).unwrap();
                let failed = report["phase"].as_str().unwrap().ends_with(":failed");
                reports.push(report);
                if failed {
                    return reports;
                }
            }
        }
    }
    panic!("the stream ended without a failed report: {reports:?}");
}

#[test]
fn components_come_up_in_order_and_one_that_stays_down_stops_the_boot() {
    let dir = tempfile::tempdir().unwrap();
    let stack = start_dev(
        &dir.path().join("dev"),
        "127.0.26.0/24",
        &dir.path().join("api.log"),
        &[],
    );
    let body = json!({"control_plane_count": 1, "control_plane_image_id": 1,
        "control_plane_instance_type": "dev.small", "subnet_id": 1});

    let healthy = found(&stack, dir.path(), &body);
    let vm = healthy.vms[0];
    let root = dir.path().join(format!("vm-{vm}"));
    let out = agent(&stack, &healthy.keys, &root, vm, "run", None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let actions = recorded(&root);
    let at = positions(&actions, &ORDER);
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{actions:#?}");
    let addons = positions(&actions, &["KUBECONFIG="])[0];
    assert!(
        addons > at[6],
        "addons after the node registered: {actions:#?}"
    );
    for type_ in NODE_CONDITIONS {
        let c = node_condition(&stack, healthy.cluster, vm, type_);
        assert_eq!(c["status"], "True", "reported by the boot: {c}");
    }

    // A sync that finds the scheduler down says so; the next one, healthy again.
    let out = agent(
        &stack,
        &healthy.keys,
        &root,
        vm,
        "sync",
        Some("kube-scheduler /healthz"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let down = node_condition(&stack, healthy.cluster, vm, "SchedulerPodHealthy");
    assert_eq!(down["status"], "False", "{down}");
    assert!(
        down["message"]
            .as_str()
            .unwrap()
            .contains("wait for kube-scheduler /healthz"),
        "{down}"
    );
    let others = node_condition(&stack, healthy.cluster, vm, "ControllerManagerPodHealthy");
    assert_eq!(others["status"], "True");
    let out = agent(&stack, &healthy.keys, &root, vm, "sync", None);
    assert!(out.status.success());
    let up = node_condition(&stack, healthy.cluster, vm, "SchedulerPodHealthy");
    assert_eq!(up["status"], "True", "{up}");

    let stuck = found(&stack, dir.path(), &body);
    let vm = stuck.vms[0];
    let root = dir.path().join(format!("vm-{vm}"));
    let out = agent(
        &stack,
        &stuck.keys,
        &root,
        vm,
        "run",
        Some("kube-controller-manager /healthz"),
    );
    assert!(!out.status.success(), "the boot stopped");
    let actions = recorded(&root);
    positions(&actions, &ORDER[..4]);
    for after in &ORDER[5..] {
        assert!(
            !actions.iter().any(|a| a.contains(after)),
            "`{after}` ran after the controller-manager stayed down: {actions:#?}"
        );
    }
    assert!(
        !actions.iter().any(|a| a.contains("KUBECONFIG=")),
        "no addons: {actions:#?}"
    );
    let conditions = |type_: &str| node_condition(&stack, stuck.cluster, vm, type_);
    assert_eq!(conditions("APIServerPodHealthy")["status"], "True");
    let stayed_down = conditions("ControllerManagerPodHealthy");
    assert_eq!(stayed_down["status"], "False", "{stayed_down}");
    assert!(
        stayed_down["message"]
            .as_str()
            .unwrap()
            .contains("wait for kube-controller-manager /healthz"),
        "{stayed_down}"
    );
    assert_eq!(conditions("SchedulerPodHealthy")["status"], "Unknown");
    let reports = reports_until_failure(&stack, stuck.cluster);
    let failed = reports.last().unwrap();
    assert_eq!(failed["vm_id"], vm);
    assert_eq!(failed["phase"], "apiserver:failed");
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("wait for kube-controller-manager /healthz"),
        "{failed}"
    );
}
