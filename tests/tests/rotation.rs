//! The etcd CA rotates under real etcd, step by step: a 3-node cluster booted by the real agent
//! runs three real etcd members holding data; `POST /certificates/rotate-ca {"ca": "etcd"}`;
//! then nodes sync in turn, each member restarting from its root whenever its etcd files
//! changed (as the agent's plan restarts etcd.service), until the rotation is over. After every
//! step a client holding any node's identity finds every member healthy — members already
//! rotated and not yet rotated alike. At the end a certificate signed by the old CA is refused,
//! and the data written before the rotation is intact.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;

use exk8s_tests::cluster::{
    Booted, ETCD_CLIENT, agent_ok, boot_three, keep_etcd_identity, operator, view,
};
use exk8s_tests::etcd::{etcdctl, three_with_key, wait_all_healthy};
use serde_json::json;

const PKI: &str = "etc/exk8s/pki";
const ETCD_FILES: [&str; 3] = ["etcd-ca.pem", "etcd-server.pem", "etcd-peer.pem"];

fn etcd_files(root: &Path) -> Vec<Vec<u8>> {
    ETCD_FILES
        .iter()
        .map(|name| std::fs::read(root.join(PKI).join(name)).unwrap())
        .collect()
}

#[test]
fn the_etcd_ca_rotates_without_a_member_ever_unhealthy() {
    let dir = tempfile::tempdir().unwrap();
    let booted = boot_three(dir.path(), "127.0.16.0/24");
    let mut etcd = three_with_key(&booted, "/rotation");
    let Booted {
        stack,
        founded,
        roots,
        endpoints,
    } = booted;
    let (client_cert, client_key) = ETCD_CLIENT;

    // A client that keeps an identity signed by the OLD etcd CA.
    let old = keep_etcd_identity(&roots[0], &dir.path().join("old-client"));

    let started: serde_json::Value = operator(
        &stack,
        "POST",
        &format!("/clusters/{}/certificates/rotate-ca", founded.cluster),
    )
    .send_json(json!({"ca": "etcd"}))
    .unwrap()
    .into_json()
    .unwrap();
    assert_eq!(started["phase"], "trust-both", "{started}");

    let mut phases = Vec::new();
    let mut restarts = 0;
    for round in 0..6 {
        let Some(phase) = view(&stack, founded.cluster)["ca_rotation"]["phase"]
            .as_str()
            .map(str::to_owned)
        else {
            break;
        };
        phases.push(phase.clone());
        for (i, vm) in founded.vms.iter().enumerate() {
            let before = etcd_files(&roots[i]);
            agent_ok(&stack, &founded, &roots[i], *vm, "sync");
            if etcd_files(&roots[i]) != before {
                etcd.restart(i);
                restarts += 1;
            }
            for (j, root) in roots.iter().enumerate() {
                wait_all_healthy(
                    root,
                    &endpoints,
                    3,
                    &format!("round {round} ({phase}), vm {vm} synced, identity of node {j}"),
                );
            }
        }
    }
    assert_eq!(phases, ["trust-both", "sign-new", "drop-old"]);
    assert!(
        view(&stack, founded.cluster)["ca_rotation"].is_null(),
        "the rotation did not end"
    );
    assert_eq!(restarts, 9, "every member restarts once per phase");

    // The old CA is trusted nowhere any more; the data is intact.
    let (ok, said) = etcdctl(
        &old,
        &endpoints,
        "/etc/exk8s/pki/etcd-healthcheck-client.pem",
        "/etc/exk8s/pki/etcd-healthcheck-client-key.pem",
        &["endpoint", "health"],
    );
    assert!(
        !ok,
        "a certificate signed by the old CA was accepted: {said}"
    );
    let (ok, out) = etcdctl(
        &roots[2],
        &endpoints,
        client_cert,
        client_key,
        &["get", "/rotation", "--print-value-only"],
    );
    assert!(ok && out.trim() == "kept", "{out}");
}
