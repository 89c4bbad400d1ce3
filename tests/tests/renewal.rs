//! Renewal reaches real etcd one member at a time: a 3-node cluster booted by the real agent,
//! three real etcd members from its roots holding data; `POST /certificates/renew`; each node
//! then syncs (new etcd serving, peer and client certificates) and its member restarts from the
//! updated root. After every step a client with the NEW healthcheck certificate and one still
//! holding the OLD one both find every member healthy, and the data is intact. The re-minted
//! operator kubeconfig verifies against the renewed apiserver certificate.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;

use exk8s_tests::cluster::{
    Booted, ETCD_CLIENT, agent_ok, boot_three, keep_etcd_identity, operator, operator_kubeconfig,
};
use exk8s_tests::etcd::{etcdctl, three_with_key, wait_all_healthy};
use exk8s_tests::tls::{self, KubeconfigIdentity};
use serde_json::Value;

const PKI: &str = "etc/exk8s/pki";

fn file(root: &Path, name: &str) -> Vec<u8> {
    std::fs::read(root.join(PKI).join(name)).unwrap()
}

#[test]
fn renewed_certificates_reach_real_etcd_one_member_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let booted = boot_three(dir.path(), "127.0.15.0/24");
    let mut etcd = three_with_key(&booted, "/renewal");
    let Booted {
        stack,
        founded,
        roots,
        endpoints,
    } = booted;
    let (client_cert, client_key) = ETCD_CLIENT;

    // A client that keeps the OLD healthcheck identity (and the etcd CA, which does not change).
    let old = keep_etcd_identity(&roots[0], &dir.path().join("old-client"));

    let started: Value = operator(
        &stack,
        "POST",
        &format!("/clusters/{}/certificates/renew", founded.cluster),
    )
    .call()
    .unwrap()
    .into_json()
    .unwrap();
    assert_eq!(started["nodes"].as_array().unwrap().len(), 3, "{started}");

    for (i, vm) in founded.vms.iter().enumerate() {
        let before = (
            file(&roots[i], "etcd-server.pem"),
            file(&roots[i], "etcd-peer.pem"),
        );
        agent_ok(&stack, &founded, &roots[i], *vm, "sync");
        assert_ne!(
            file(&roots[i], "etcd-server.pem"),
            before.0,
            "vm {vm}: serving kept"
        );
        assert_ne!(
            file(&roots[i], "etcd-peer.pem"),
            before.1,
            "vm {vm}: peer kept"
        );
        etcd.restart(i);
        wait_all_healthy(
            &roots[i],
            &endpoints,
            3,
            &format!("NEW identity after vm {vm}"),
        );
        wait_all_healthy(&old, &endpoints, 3, &format!("OLD identity after vm {vm}"));
        let (ok, out) = etcdctl(
            &roots[i],
            &endpoints,
            client_cert,
            client_key,
            &["get", "/renewal", "--print-value-only"],
        );
        assert!(ok && out.trim() == "kept", "after vm {vm}: {out}");
    }
    assert_ne!(
        file(&roots[0], "etcd-healthcheck-client.pem"),
        file(&old, "etcd-healthcheck-client.pem"),
        "the healthcheck identity was not renewed"
    );
    drop(etcd);

    // The operator's re-minted kubeconfig verifies against the renewed apiserver certificate.
    let text = operator_kubeconfig(&stack, founded.cluster);
    let kubeconfig = KubeconfigIdentity::parse(&text);
    let port = tls::serve(
        &file(&roots[0], "apiserver.pem"),
        &file(&roots[0], "apiserver-key.pem"),
        &file(&roots[0], "ca.pem"),
    );
    tls::handshake(
        port,
        &kubeconfig.server_host(),
        &kubeconfig.ca_pem,
        Some((&kubeconfig.cert_pem, &kubeconfig.key_pem)),
    )
    .expect("the re-minted operator kubeconfig against the renewed apiserver certificate");
}
