//! Cluster API reaches a booted cluster: a management cluster (real etcd, kube-apiserver and
//! kube-controller-manager on the host's loopback), Cluster API's core controller and
//! `exk8s-capi`; the docs' example manifest, naming the booted cluster (`spec.name`), brings it
//! under Cluster API — adopted, not founded again — and the Cluster becomes `Available` in
//! Cluster API's own status: its remote-connection probe reached the booted apiserver through
//! the `<cluster>-kubeconfig` Secret exk8s-capi wrote. Then the docs' MachinePool: exk8s makes
//! a worker pool, the worker boots, and Cluster API's MachinePool controller matches its Node by
//! the provider ID its kubelet registered (`status.nodeRefs`, one ready replica); deleting the
//! MachinePool drains the worker and deletes its machine.
//!
//! Cluster API's controller sits on the cluster's network: the machine's network namespace
//! (the LAN, and the management apiserver through a port the dev stack forwards into every
//! machine), with a mount namespace of its own whose `/etc/hosts` names the control plane as
//! the cloud's DNS does. It runs the host's binary, not inside the machine. The
//! controller is stopped at the end: the cluster's later changes are the test's own.

use std::time::Duration;

use exk8s_tests::cluster::{operator, view};
use exk8s_tests::machine::Machine;
use exk8s_tests::management::{Management, example_manifest, example_workers_manifest};
use exk8s_tests::timeline::mark;
use serde_json::Value;

use super::control_plane::admin;
use super::one_node::OneNode;

/// Condition `type_` of `object`'s status.
fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// The check, with the management apiserver on `port` (forwarded into the machines).
pub(crate) fn available(node: &OneNode<'_>, port: u16) {
    let dir = node.dir.join("management");
    let mut management = Management::start_on(&dir, port);
    management.install_crds();
    management.start_exk8s_capi();
    let hosts = dir.join("hosts");
    std::fs::write(
        &hosts,
        format!("127.0.0.1 localhost\n{} {}\n", node.ip, node.dns_name),
    )
    .unwrap();
    let launcher: Vec<String> = [
        "nsenter".to_owned(),
        format!("--net=/run/netns/{}", node.machine.netns),
        "--".to_owned(),
        "unshare".to_owned(),
        "--mount".to_owned(),
        "--".to_owned(),
        "sh".to_owned(),
        "-c".to_owned(),
        r#"mount --bind "$0" /etc/hosts && exec "$@""#.to_owned(),
        hosts.display().to_string(),
    ]
    .to_vec();
    management.start_cluster_api(&launcher);

    let cluster = view(node.stack, node.cluster);
    let name = cluster["name"].as_str().unwrap();
    let version = cluster["kubernetes_version"].as_str().unwrap();
    let manifest = example_manifest(&node.stack.base, &node.stack.token, version, 1)
        + &format!("  name: {name}\n");
    management.apply(&manifest).unwrap();

    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    loop {
        let capi = management.get("cluster.cluster.x-k8s.io", "shop").unwrap();
        if condition(&capi, "Available").is_some_and(|c| c["status"] == "True") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the Cluster is not Available after 240 s: {:#}\n{}",
            capi["status"],
            management.controller_logs()
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    let capi = management.get("cluster.cluster.x-k8s.io", "shop").unwrap();
    assert_eq!(capi["status"]["phase"], "Provisioned", "{capi:#}");
    let probe = condition(&capi, "RemoteConnectionProbe").unwrap();
    assert_eq!(probe["status"], "True", "{probe}");
    assert_eq!(
        capi["spec"]["controlPlaneEndpoint"]["host"],
        node.dns_name.as_str()
    );
    // Adopted: the control plane names the booted cluster, and the org has no other.
    let cp = management.get("exk8scontrolplane", "shop").unwrap();
    assert_eq!(cp["status"]["clusterID"], node.cluster, "{cp:#}");
    assert_eq!(cp["status"]["readyReplicas"], 1, "{cp:#}");
    let listed: Value = operator(node.stack, "GET", "/clusters")
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    eprintln!(
        "Cluster API's Cluster, Available: {}",
        condition(&capi, "Available").unwrap()
    );
    workers(node, &management, version);
}

/// Polls `done` every 2 s for `limit`; panics with the controllers' logs and `state` then.
fn within(
    management: &Management,
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> bool,
    state: impl Fn() -> String,
) {
    let deadline = std::time::Instant::now() + limit;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not after {limit:?}: {}\n{}",
            state(),
            management.controller_logs()
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// The docs' MachinePool of one worker on the booted cluster: its Node matched by provider ID,
/// then deleted.
fn workers(node: &OneNode<'_>, management: &Management, version: &str) {
    mark("a MachinePool: exk8s makes a worker pool, the worker boots, its Node matched");
    management
        .apply(&example_workers_manifest(version, 1))
        .unwrap();
    let machine_pool = || {
        management
            .get("machinepool.cluster.x-k8s.io", "shop-workers")
            .unwrap_or_default()
    };
    let pools = || {
        let all: Value = operator(
            node.stack,
            "GET",
            &format!("/clusters/{}/node-pools", node.cluster),
        )
        .call()
        .unwrap()
        .into_json()
        .unwrap();
        all
    };
    let mut vm = 0;
    within(
        management,
        "the worker's machine",
        Duration::from_secs(120),
        || {
            vm = pools()[0]["nodes"][0]["vm_id"].as_i64().unwrap_or_default();
            vm > 0
        },
        || pools().to_string(),
    );
    Machine::of(node.stack, vm).wait_booted();
    within(
        management,
        "Cluster API: one ready replica, its Node matched",
        Duration::from_secs(420),
        || {
            let mp = machine_pool();
            mp["status"]["nodeRefs"]
                .as_array()
                .is_some_and(|r| r.len() == 1)
                && mp["status"]["deprecated"]["v1beta1"]["readyReplicas"] == 1
        },
        || format!("{:#}\nexk8s: {:#}", machine_pool()["status"], pools()),
    );
    let mp = machine_pool();
    let worker = &pools()[0]["nodes"][0];
    let provider_id = format!("exk8s://{}/{vm}", node.cluster);
    assert_eq!(worker["provider_id"], provider_id.as_str(), "{worker}");
    assert_eq!(
        mp["spec"]["providerIDList"],
        serde_json::json!([provider_id]),
        "{mp:#}"
    );
    assert_eq!(
        mp["status"]["nodeRefs"][0]["name"], worker["name"],
        "{mp:#}"
    );
    assert_eq!(mp["status"]["replicas"], 1, "{mp:#}");
    // The Node as the worker's kubelet registered it.
    let name = worker["name"].as_str().unwrap();
    let registered = admin(
        &node.machine,
        &["get", "node", name, "-o", "jsonpath={.spec.providerID}"],
    );
    assert_eq!(registered, provider_id);
    eprintln!("Cluster API's MachinePool: {:#}", mp["status"]);

    mark("the MachinePool deleted: the worker drained, its machine gone");
    management.kubectl_ok(&[
        "delete",
        "machinepool.cluster.x-k8s.io",
        "shop-workers",
        "--wait=false",
    ]);
    within(
        management,
        "the MachinePool, its ExK8sMachinePool and the exk8s pool gone",
        Duration::from_secs(300),
        || {
            // The control-plane node's agent drains the worker (its timer is stopped here).
            node.sync();
            management
                .get("machinepool.cluster.x-k8s.io", "shop-workers")
                .is_none()
                && management.get("exk8smachinepool", "shop-workers").is_none()
                && pools().as_array().is_some_and(Vec::is_empty)
        },
        || format!("{:#}", pools()),
    );
    let left = view(node.stack, node.cluster);
    assert_eq!(left["nodes"].as_array().unwrap().len(), 1, "{left:#}");
    let nodes = admin(&node.machine, &["get", "nodes", "-o", "name"]);
    assert!(!nodes.contains(name), "{nodes}");
}
