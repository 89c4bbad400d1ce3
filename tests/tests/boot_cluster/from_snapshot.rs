//! A cluster founded from another's snapshot on a booted machine (`POST /clusters` with
//! `restore_from`), the source deleted first (its machine released; the API keeps its trust and
//! stored snapshots: `crate::kept` of the API): the new node boots from its own bundle (a
//! new name, address and DNS name) with the source's CAs, service-account key and
//! secrets-encryption key; once it reported up, the API restores the source's snapshot onto
//! it, its sync unit running the three steps. Then it serves the source's ConfigMap and
//! Secret, the source's operator kubeconfig (its CA and client certificate) works against the
//! new DNS name, and a token the source issued authenticates.

use std::time::Duration;

use exk8s_tests::cluster::{found, operator, operator_kubeconfig};
use exk8s_tests::procs::wait_until;
use serde_json::{Value, json};

use super::control_plane::{admin, hand, kubectl_with};
use super::one_node::OneNode;

/// The module doc, from `source`'s snapshot `snapshot`; `token` is a service account's the
/// source issued under its current key.
pub(crate) fn found_from(source: OneNode<'_>, snapshot: i64, token: &str) {
    let (stack, dir) = (source.stack, source.dir);
    let old_kubeconfig = operator_kubeconfig(stack, source.cluster);
    // The source is lost: deleted by mistake, its machine released; what recovery needs is kept.
    let id = source.cluster.to_string();
    let deleted = stack.exk8s(dir, &["clusters", "delete", &id, "--yes"]);
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    wait_until("the source's delete", Duration::from_secs(120), || {
        operator(stack, "GET", &format!("/deleted-clusters/{id}"))
            .call()
            .is_ok()
    });
    let kept: Value = operator(stack, "GET", &format!("/deleted-clusters/{id}"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(kept["kept"], json!(["trust", "snapshots"]), "{kept}");
    assert!(
        !exk8s_tests::site::sim_vm_ids(stack).contains(&source.machine.vm),
        "the source's machine is released"
    );

    let target_dir = dir.join("target");
    std::fs::create_dir_all(&target_dir).unwrap();
    let target = found(
        stack,
        &target_dir,
        &json!({"control_plane_count": 1, "control_plane_image_id": 1,
                "control_plane_instance_type": "dev.small", "subnet_id": 1,
                "pod_network": "none",
                "restore_from": {"cluster_id": source.cluster, "snapshot_id": snapshot}}),
    );
    let node = OneNode::booted(stack, &target, dir);
    assert_ne!(node.dns_name, source.dns_name);
    let restore = || {
        operator(stack, "GET", &format!("/clusters/{}/restore", node.cluster))
            .call()
            .unwrap()
            .into_json::<Value>()
            .unwrap()
    };
    // Its member reported up at its first boot: the restore of the source's snapshot began.
    let begun = restore();
    assert_eq!(
        (&begun["snapshot_id"], &begun["phase"]),
        (&json!(snapshot), &json!("stop")),
        "{begun}"
    );
    for step in ["stop", "restore", "start"] {
        node.sync();
        let done = node
            .machine
            .journal_grep("exk8s-agent-sync.service", &format!("{step} step done"));
        assert!(!done.is_empty(), "{step}");
    }
    assert_eq!(restore()["phase"], "done");
    let machine = &node.machine;
    assert_eq!(admin(machine, &["get", "--raw", "/readyz"]), "ok");
    let kept = admin(
        machine,
        &[
            "get",
            "configmap",
            "snapshotted",
            "-o",
            "jsonpath={.data.kept}",
        ],
    );
    assert_eq!(kept, "yes");
    let password = admin(
        machine,
        &["get", "secret", "kept", "-o", "jsonpath={.data.password}"],
    );
    assert_eq!(
        password, "aHVudGVyMg==",
        "the source's encryption key opens its Secret"
    );
    // The source's operator kubeconfig: its CA is trusted, its certificate accepted, at the
    // new name.
    let old = hand(machine, "source-operator.kubeconfig", &old_kubeconfig);
    let got = kubectl_with(
        machine,
        &old,
        &[
            &format!("--server=https://{}:6443", node.dns_name),
            "get",
            "configmap",
            "snapshotted",
            "-o",
            "name",
        ],
    );
    assert_eq!(got.as_deref(), Ok("configmap/snapshotted"));
    assert_eq!(
        node.whoami(token).as_deref(),
        Ok("system:serviceaccount:default:robot")
    );
    node.machine.stop();
}
