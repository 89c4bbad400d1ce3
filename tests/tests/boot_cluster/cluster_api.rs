//! Cluster API reaches a booted cluster: a management cluster (real etcd, kube-apiserver and
//! kube-controller-manager on the host's loopback), Cluster API's core controller and
//! `exk8s-capi`; the docs' example manifest, naming the booted cluster (`spec.name`), brings it
//! under Cluster API — adopted, not founded again — and the Cluster becomes `Available` in
//! Cluster API's own status: its remote-connection probe reached the booted apiserver through
//! the `<cluster>-kubeconfig` Secret exk8s-capi wrote.
//!
//! Cluster API's controller sits on the cluster's network: the machine's network namespace
//! (the LAN, and the management apiserver through a port the dev stack forwards into every
//! machine), with a mount namespace of its own whose `/etc/hosts` names the control plane as
//! the cloud's DNS does. It runs the host's binary, not inside the machine. The
//! controller is stopped at the end: the cluster's later changes are the test's own.

use std::time::Duration;

use exk8s_tests::cluster::{operator, view};
use exk8s_tests::management::{Management, example_manifest};
use serde_json::Value;

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
}
