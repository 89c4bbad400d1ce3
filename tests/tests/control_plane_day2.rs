//! Day 2 with a real control plane: three nodes (etcd 3.6, kube-apiserver, controller-manager,
//! scheduler from their roots, each in its own namespace) go through a forced renewal and the
//! rotation of each CA (cluster, etcd, front-proxy) through all three phases, about
//! seven minutes on two cores (an apiserver exits about 2 s after SIGTERM with the rendered
//! `--shutdown-send-retry-after`; without it, 11–30 s, waiting for its clients' connections). Nodes
//! sync one at a time; after each sync the harness restarts what the agent's apply changed (etcd
//! when the agent restarted its unit, a static pod when its manifest changed) and waits for the
//! node to be ready again (`exk8s_tests::availability` samples). Throughout, from a client namespace on the same LAN, every apiserver's `/readyz`
//! and `GET /api` through the operator kubeconfig (re-fetched at each rotation phase, as an
//! operator following `ca_rotation` would) are sampled every 200 ms: no failed sample except on
//! the one node being restarted, never two nodes down at once. After the cluster CA's rotation
//! the operator kubeconfig fetched before it is refused (its client certificate's CA was
//! dropped; the apiserver's new certificate it verifies, through the standby it trusts) and a
//! new one works, while the kubeconfig `exk8s kubeconfig --exec` wrote before everything (its
//! user runs `exk8s credential`, client-go's exec credential plugin) works at every step of the rotation with no operator action: the
//! plugin reuses its cached certificate until the CA that signed it is dropped, then mints one
//! under the new CA. So does a copy of it whose trust file is the one the plugin wrote before
//! everything, never updated — what a kubectl reads that started before a rotation: it holds
//! the cluster CA's standby, which the rotation takes as its new CA.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::{Path, PathBuf};
use std::process::Command;

use exk8s_tests::availability::{self, Shared};
use exk8s_tests::cluster::{boot_three, operator, view};
use exk8s_tests::control_plane::kubectl;
use exk8s_tests::netns::{Forward, Lan};
use exk8s_tests::procs::binary;
use exk8s_tests::rolling::{Rolling, operator_kubeconfig};
use serde_json::json;

/// The client namespace's index in the LAN (after the three nodes).
const CLIENT: usize = 3;

/// kubectl in the client namespace through the kubeconfig `exk8s kubeconfig --exec` wrote,
/// each run calling `exk8s credential` (on PATH, logged in through EXK8S_TOKEN, its cache in
/// the test's directory) through a forward of the API's port.
struct Plugin {
    kubeconfig: PathBuf,
    /// [`Self::frozen`] before any change.
    frozen_before: PathBuf,
    cache: PathBuf,
    path: std::ffi::OsString,
    token: String,
    _forward: Forward,
}

impl Plugin {
    fn new(booted: &exk8s_tests::cluster::Booted, lan: &Lan, dir: &Path) -> Self {
        let stack = &booted.stack;
        let cache = dir.join("cache");
        let exk8s = binary("exk8s");
        let mut path = exk8s.parent().unwrap().as_os_str().to_owned();
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        let written = Command::new(&exk8s)
            .env("EXK8S_API", &stack.base)
            .env("EXK8S_TOKEN", &stack.token)
            .env("XDG_CACHE_HOME", &cache)
            .args(["kubeconfig", &booted.founded.cluster.to_string(), "--exec"])
            .output()
            .unwrap();
        assert!(
            written.status.success(),
            "{}",
            String::from_utf8_lossy(&written.stderr)
        );
        let kubeconfig = dir.join("exec.kubeconfig");
        std::fs::write(&kubeconfig, &written.stdout).unwrap();
        let port: u16 = stack.base.rsplit(':').next().unwrap().parse().unwrap();
        let mut plugin = Self {
            kubeconfig,
            frozen_before: PathBuf::new(),
            cache,
            path,
            token: stack.token.clone(),
            _forward: lan.forward_loopback(CLIENT, port),
        };
        plugin.works(lan, "before any change");
        plugin.frozen_before = plugin.frozen(dir);
        plugin
    }

    /// `kubectl get --raw /api` through the plugin succeeds (at `step`).
    fn works(&self, lan: &Lan, step: &str) {
        self.works_through(lan, &self.kubeconfig, step);
    }

    /// A copy of the plugin's kubeconfig naming a copy of the trust file its last run wrote,
    /// which nothing updates: what a kubectl holds that read the file before a rotation.
    fn frozen(&self, dir: &Path) -> PathBuf {
        let text = std::fs::read_to_string(&self.kubeconfig).unwrap();
        let doc: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
        let trust = doc["clusters"][0]["cluster"]["certificate-authority"]
            .as_str()
            .expect("the exec kubeconfig names a trust file")
            .to_owned();
        let copy = dir.join("frozen-ca.pem");
        std::fs::copy(&trust, &copy).unwrap();
        let kubeconfig = dir.join("frozen.kubeconfig");
        std::fs::write(&kubeconfig, text.replace(&trust, copy.to_str().unwrap())).unwrap();
        kubeconfig
    }

    /// `kubectl get --raw /api` through the plugin with `kubeconfig` succeeds (at `step`).
    fn works_through(&self, lan: &Lan, kubeconfig: &Path, step: &str) {
        let out = lan
            .command(CLIENT, exk8s_tests::bins::kubernetes("kubectl"))
            .env("PATH", &self.path)
            .env("EXK8S_TOKEN", &self.token)
            .env("XDG_CACHE_HOME", &self.cache)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--request-timeout=10s", "get", "--raw", "/api"])
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("APIVersions"),
            "kubectl through exk8s credential, {step}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The cached credential's certificate (PEM).
    fn cached_certificate(&self) -> String {
        let dir = self.cache.join("exk8s/credentials");
        let file = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "json"))
            .expect("a cached credential");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&file).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{}", file.display());
        let cached: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        cached["client_certificate_pem"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

/// Rotates `ca` through its phases, one sync round each, re-fetching the operator kubeconfig at
/// each phase, and using the plugin's kubeconfig (never re-fetched) at each; the phases seen.
fn rotate(cluster: &mut Rolling<'_>, ca: &str, dir: &Path, plugin: &Plugin) -> Vec<String> {
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
        plugin.works(cluster.lan, &format!("after the {ca} CA's {phase} phase"));
        // A client whose trust file was written before the rotation: the standby it trusts
        // is the new CA.
        plugin.works_through(
            cluster.lan,
            &plugin.frozen_before,
            &format!("its trust file from before, after the {ca} CA's {phase} phase"),
        );
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
    let plugin = Plugin::new(&booted, &lan, dir);
    let first_credential = plugin.cached_certificate();
    plugin.works(&lan, "again");
    assert_eq!(
        plugin.cached_certificate(),
        first_credential,
        "the cached credential is reused"
    );
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
        for ca in ["cluster", "etcd", "front_proxy"] {
            assert_eq!(
                rotate(&mut cluster, ca, dir, &plugin),
                ["trust-both", "sign-new", "drop-old"],
                "{ca}"
            );
        }
    });
    eprintln!("{}", availability::check(&samples, 50, 10));

    // The operator kubeconfig from before the cluster CA's rotation is refused — not for the
    // apiserver's certificate (it trusts the standby, the new CA) but for its own, signed by the
    // CA that was dropped; a new one works.
    let (ok, _, err) = kubectl(&lan, CLIENT, &first_config, &["get", "--raw", "/api"]);
    assert!(!ok, "the old operator kubeconfig still works");
    assert!(err.contains("Unauthorized"), "{err}");
    let fresh = dir.join("operator-after.kubeconfig");
    operator_kubeconfig(&booted.stack, founded.cluster, &fresh);
    let (ok, out, err) = kubectl(&lan, CLIENT, &fresh, &["get", "--raw", "/api"]);
    assert!(ok && out.contains("APIVersions"), "{err}");
    // The plugin's kubeconfig, written before everything, still works: its credential was
    // minted again under the new cluster CA once the old one was dropped.
    plugin.works(&lan, "after every change");
    assert_ne!(plugin.cached_certificate(), first_credential);
    plugin.works_through(
        &lan,
        &plugin.frozen_before,
        "its trust file from before, at the end",
    );
    for node in &mut cluster.nodes {
        node.assert_running();
    }
}
