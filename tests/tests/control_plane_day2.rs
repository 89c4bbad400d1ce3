//! Day 2 with a real control plane: three nodes (etcd 3.6, kube-apiserver, controller-manager,
//! scheduler from their roots, each in its own namespace) go through a rollout, a forced renewal
//! and the rotation of each CA (cluster, etcd, front-proxy) through all three phases, about
//! eight minutes on two cores (an apiserver exits about 2 s after SIGTERM with the rendered
//! `--shutdown-send-retry-after`; without it, 11–30 s, waiting for its clients' connections). Nodes
//! sync one at a time; after each sync the harness restarts what the agent's apply changed (etcd
//! when the agent restarted its unit, a static pod when its manifest changed) and waits for the
//! node to be ready again (`exk8s_tests::availability` samples). Throughout, from a client namespace on the same LAN, every apiserver's `/readyz`
//! and `GET /api` through the operator kubeconfig (re-fetched at each rotation phase, as an
//! operator following `ca_rotation` would) are sampled every 200 ms: no failed sample except on
//! the one node being restarted, never two nodes down at once. After the cluster CA's rotation
//! the operator kubeconfig fetched before it fails and a new one works.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;
use std::time::Duration;

use exk8s_tests::availability::{self, Shared};
use exk8s_tests::cluster::{Booted, agent_ok, boot_three, operator, view};
use exk8s_tests::control_plane::{Node, kubectl, kubectl_until};
use exk8s_tests::dev::Stack;
use exk8s_tests::netns::Lan;
use serde_json::json;

const READY: Duration = Duration::from_secs(120);
/// The client namespace's index in the LAN (after the three nodes).
const CLIENT: usize = 3;

fn operator_kubeconfig(stack: &Stack, cluster: i64, to: &Path) {
    std::fs::write(
        to,
        exk8s_tests::cluster::operator_kubeconfig(stack, cluster),
    )
    .unwrap();
}

/// The three nodes, driven one at a time.
struct Cluster<'a> {
    booted: &'a Booted,
    lan: &'a Lan,
    nodes: Vec<Node>,
    shared: &'a Shared,
}

impl Cluster<'_> {
    fn wait_ready(&mut self, i: usize) {
        let config = self.booted.roots[i].join("etc/exk8s/kubeconfig/super-admin.kubeconfig");
        let mut all: Vec<&mut Node> = self.nodes.iter_mut().collect();
        let ready = kubectl_until(
            self.lan,
            &mut all,
            i,
            &config,
            &["get", "--raw", "/readyz"],
            READY,
        );
        assert_eq!(ready, "ok");
    }

    /// Every node syncs once, one at a time, each restarted from its new files and ready again
    /// before the next; how many processes were restarted.
    fn sync_round(&mut self) -> usize {
        let mut restarted = 0;
        for i in 0..3 {
            let vm = self.booted.founded.vms[i];
            agent_ok(
                &self.booted.stack,
                &self.booted.founded,
                &self.booted.roots[i],
                vm,
                "sync",
            );
            self.shared.set_changing(Some(i));
            if self.nodes[i].sync_etcd(self.lan) {
                restarted += 1;
            }
            restarted += self.nodes[i].sync_static_pods(self.lan).len();
            self.wait_ready(i);
            self.shared.set_changing(None);
        }
        restarted
    }

    /// Rotates `ca` through its phases, one sync round each, re-fetching the operator
    /// kubeconfig at each phase; the phases seen.
    fn rotate(&mut self, ca: &str, dir: &Path) -> Vec<String> {
        let cluster = self.booted.founded.cluster;
        let started: serde_json::Value = operator(
            &self.booted.stack,
            "POST",
            &format!("/clusters/{cluster}/certificates/rotate-ca"),
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
        while let Some(phase) = view(&self.booted.stack, cluster)["ca_rotation"]["phase"].as_str() {
            let phase = phase.to_owned();
            assert!(
                phases.len() < 3,
                "{ca}: the rotation does not end: {phases:?}"
            );
            let config = dir.join(format!("operator-{ca}-{phase}.kubeconfig"));
            operator_kubeconfig(&self.booted.stack, cluster, &config);
            *self.shared.operator_config.lock().unwrap() = config;
            self.shared.step(&format!("rotate {ca}: {phase}"));
            let restarted = self.sync_round();
            assert!(restarted >= 3, "{ca} {phase}: only {restarted} restarts");
            phases.push(phase);
        }
        phases
    }
}

#[test]
fn day_two_changes_keep_every_other_apiserver_ready() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let booted = boot_three(dir, "10.219.0.0/24");
    let founded = &booted.founded;
    let mut ips: Vec<String> = founded
        .vms
        .iter()
        .map(|vm| founded.ip_of[vm].clone())
        .collect();
    let dns_name = founded.created["control_plane_dns_name"].as_str().unwrap();
    let hosts: String = ips.iter().map(|ip| format!("{ip} {dns_name}\n")).collect();
    let mut addresses = ips.clone();
    addresses.push("10.219.0.250".to_owned());
    let lan = Lan::new(
        &addresses.iter().map(String::as_str).collect::<Vec<_>>(),
        24,
        &hosts,
    );
    ips.truncate(3);
    let first_config = dir.join("operator-before.kubeconfig");
    operator_kubeconfig(&booted.stack, founded.cluster, &first_config);
    let serving = ips.iter().cloned().enumerate().collect();
    let shared = Shared::new(serving, first_config.clone());
    let mut cluster = Cluster {
        booted: &booted,
        lan: &lan,
        nodes: booted
            .roots
            .iter()
            .enumerate()
            .map(|(i, r)| Node::new(r, i))
            .collect(),
        shared: &shared,
    };
    for node in &mut cluster.nodes {
        node.start_etcd(&lan);
    }
    for node in &mut cluster.nodes {
        node.sync_static_pods(&lan);
    }
    for i in 0..3 {
        cluster.wait_ready(i);
    }
    let samples = availability::sample_during(&lan, CLIENT, dns_name, &shared, || {
        let id = founded.cluster;
        shared.step("rollout");
        operator(&booted.stack, "POST", &format!("/clusters/{id}/rollout"))
            .call()
            .unwrap();
        assert!(
            cluster.sync_round() >= 3,
            "a rollout restarts every apiserver"
        );
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
        for ca in ["cluster", "etcd", "front_proxy"] {
            assert_eq!(
                cluster.rotate(ca, dir),
                ["trust-both", "sign-new", "drop-old"],
                "{ca}"
            );
        }
    });
    eprintln!("{}", availability::check(&samples, 10));

    // The operator kubeconfig from before the cluster CA's rotation is refused; a new one works.
    let (ok, _, err) = kubectl(&lan, CLIENT, &first_config, &["get", "--raw", "/api"]);
    assert!(!ok, "the old operator kubeconfig still works");
    assert!(err.contains("certificate") || err.contains("x509"), "{err}");
    let fresh = dir.join("operator-after.kubeconfig");
    operator_kubeconfig(&booted.stack, founded.cluster, &fresh);
    let (ok, out, err) = kubectl(&lan, CLIENT, &fresh, &["get", "--raw", "/api"]);
    assert!(ok && out.contains("APIVersions"), "{err}");
    for node in &mut cluster.nodes {
        node.assert_running();
    }
}
