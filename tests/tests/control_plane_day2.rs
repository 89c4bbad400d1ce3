//! Day 2 with a real control plane: three nodes (etcd 3.6, kube-apiserver, controller-manager,
//! scheduler from their roots, each in its own namespace) go through a forced renewal and the
//! rotation of the etcd and front-proxy CAs through all three phases (an apiserver exits about
//! 2 s after SIGTERM with the rendered `--shutdown-send-retry-after`; without it, 11–30 s,
//! waiting for its clients' connections). Nodes sync one at a time; after each sync the harness
//! restarts what the agent's apply changed (etcd when the agent restarted its unit, a static pod
//! when its manifest changed) and waits for the node to be ready again
//! (`exk8s_tests::availability` samples). Throughout, from a client namespace on the same LAN,
//! every apiserver's `/readyz` and `GET /api` through the operator kubeconfig (re-fetched at
//! each rotation phase, as an operator following `ca_rotation` would) are sampled every 200 ms:
//! no failed sample except on the one node being restarted, never two nodes down at once. (The
//! cluster CA's rotation, with the exec credential plugin and the operator's kubeconfigs, runs
//! on booted machines: `boot_cluster`'s `rotation`.)

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;

use exk8s_tests::availability::{self, Shared};
use exk8s_tests::cluster::{boot_three, operator, view};
use exk8s_tests::control_plane::kubectl;
use exk8s_tests::rolling::{Rolling, operator_kubeconfig};
use serde_json::json;

/// The client namespace's index in the LAN (after the three nodes).
const CLIENT: usize = 3;

/// Rotates `ca` through its phases, one sync round each, re-fetching the operator kubeconfig at
/// each phase; the phases seen.
fn rotate(cluster: &mut Rolling<'_>, ca: &str, dir: &Path) -> Vec<String> {
    let booted = cluster.booted;
    let id = booted.founded.cluster;
    let started: serde_json::Value = operator(
        &booted.stack,
        "POST",
        &format!("/clusters/{id}/certificates/rotate-ca"),
    )
    .send_json(json!({"ca": ca}))
    .unwrap_or_else(|e| {
        let log = std::fs::read_to_string(dir.join("api.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        panic!("rotate-ca {ca}: {e}\n{}", tail.join("\n"))
    })
    .into_json()
    .unwrap();
    assert_eq!(started["phase"], "trust-both", "{started}");
    let mut phases = Vec::new();
    while let Some(phase) = view(&booted.stack, id)["ca_rotation"]["phase"].as_str() {
        let phase = phase.to_owned();
        assert!(
            phases.len() < 3,
            "{ca}: the rotation does not end: {phases:?}"
        );
        let config = dir.join(format!("operator-{ca}-{phase}.kubeconfig"));
        operator_kubeconfig(&booted.stack, id, &config);
        *cluster.shared.operator_config.lock().unwrap() = config;
        cluster.shared.step(&format!("rotate {ca}: {phase}"));
        let restarted = cluster.sync_round();
        assert!(restarted >= 3, "{ca} {phase}: only {restarted} restarts");
        phases.push(phase);
    }
    phases
}
#[test]
fn day_two_changes_keep_every_other_apiserver_ready() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let booted = boot_three(dir, "10.219.0.0/24");
    let founded = &booted.founded;
    let ips = booted.ips();
    let dns_name = booted.dns_name();
    let lan = booted.lan(&["10.219.0.250"]);
    let first_config = dir.join("operator-before.kubeconfig");
    operator_kubeconfig(&booted.stack, founded.cluster, &first_config);
    let serving = ips.iter().cloned().enumerate().collect();
    let shared = Shared::new(serving, first_config.clone());
    let mut cluster = Rolling::start(&booted, &lan, &shared);
    let samples = availability::sample_during(&lan, CLIENT, dns_name, &shared, || {
        let id = founded.cluster;
        shared.step("renew");
        operator(
            &booted.stack,
            "POST",
            &format!("/clusters/{id}/certificates/renew"),
        )
        .call()
        .unwrap();
        assert!(
            cluster.sync_round() >= 3,
            "a renewal restarts every apiserver"
        );
        for ca in ["etcd", "front_proxy"] {
            assert_eq!(
                rotate(&mut cluster, ca, dir),
                ["trust-both", "sign-new", "drop-old"],
                "{ca}"
            );
        }
    });
    eprintln!("{}", availability::check(&samples, 50, 10));

    // The operator kubeconfig from before still works: its CA was not rotated.
    let (ok, out, err) = kubectl(&lan, CLIENT, &first_config, &["get", "--raw", "/api"]);
    assert!(ok && out.contains("APIVersions"), "{err}");
    for node in &mut cluster.nodes {
        node.assert_running();
    }
}
