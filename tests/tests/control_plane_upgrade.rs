//! A Kubernetes minor upgrade's failure paths with a real control plane: three nodes (etcd 3.6,
//! and kube-apiserver, kube-controller-manager and kube-scheduler of Kubernetes'
//! [`KUBERNETES_VERSION`], each node in its own network namespace) are upgraded to
//! [`NEXT_KUBERNETES_VERSION`] through `PATCH /clusters/{id}`. Each node syncs in turn (the API
//! hands the new release to one member at a time); the harness runs each static pod at the
//! release its manifest's image names, as a kubelet would, so the control plane really is mixed
//! mid-way: new apiservers beside old ones on one etcd. Every apiserver's `/readyz` and the
//! operator's `GET /api` are sampled every 200 ms throughout: no failure except on the node
//! being restarted. (The upgrade's happy path, workers included — new ones booted at the
//! release, the old ones drained — runs on booted machines: `boot_cluster`'s `day2::upgrade`.)
//!
//! Each upgrade starts with an etcd snapshot: the first member's agent takes it from its real
//! etcd and uploads it in the sync that then takes the new release, never before it is stored.
//!
//! First the new release's apiserver is broken (a real one that cannot verify etcd): the first
//! member's agent, waiting for real, sees it never get ready, puts the previous files back (the
//! old apiserver runs again) and reports the sync failed; the upgrade stops there, saying where
//! and why, and no other member is handed the release; the operator rolls back. With a working
//! build the upgrade starts again; mid-way the operator rolls back (`PATCH` to the release the
//! others run: the upgraded member goes back to it), then upgrades again, to the end — the API
//! killed with SIGKILL and restarted after the first member. Each member's etcd moves to the
//! release's etcd (v3.6.10 → v3.6.14) with it, before its apiserver. At the end every apiserver
//! reports the new release, the cluster's `version` is it, and a ConfigMap written before the
//! upgrade is read after it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use exk8s_tests::availability::{self, Shared};
use std::path::{Path, PathBuf};
use std::time::Duration;

use exk8s_tests::bins::{
    ETCD_VERSION, KUBERNETES_VERSION, NEXT_ETCD_VERSION, NEXT_KUBERNETES_VERSION, kubernetes_at,
};
use exk8s_tests::cluster::{boot_three_with, operator, view};
use exk8s_tests::control_plane::{etcdctl, kubectl};
use exk8s_tests::rolling::{Rolling, operator_kubeconfig};
use serde_json::{Value, json};

/// The client namespace's index in the LAN (after the three nodes).
const CLIENT: usize = 3;

/// How long the agent waits for the broken apiserver before it gives up (the plan's deadline,
/// shortened for the test: the sync must fail, and fails only when this runs out).
const WAIT_CAP: Duration = Duration::from_secs(25);

/// How long the agent waits for a component it restarted that should come up: the harness's
/// stop of the old process alone takes ~10 s of it (the apiserver's graceful shutdown), and a
/// new apiserver on two shared cores may take tens of seconds more — a 25 s cap failed CI.
const SYNC_CAP: Duration = Duration::from_secs(120);

/// A kube-apiserver of `release` that runs but never gets ready: it trusts the cluster CA
/// instead of etcd's, so no etcd server verifies. Written under `dir`.
fn broken_apiserver(dir: &Path, root: &Path, release: &str) -> PathBuf {
    let real = kubernetes_at(release, "kube-apiserver");
    let wrong_ca = root.join("etc/exk8s/pki/ca.pem");
    let path = dir.join("broken-kube-apiserver");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nexec {} \"$@\" --etcd-cafile={}\n",
            real.display(),
            wrong_ca.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// The etcd release node `i`'s member reports (`3.6.14`).
fn etcd_release(cluster: &Rolling<'_>, ips: &[String], i: usize) -> String {
    let out = etcdctl(
        cluster.lan,
        i,
        &cluster.booted.roots[i],
        &format!("https://{}:2379", ips[i]),
        ("apiserver-etcd-client.pem", "apiserver-etcd-client-key.pem"),
        &["endpoint", "status", "-w", "json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    status[0]["Status"]["version"].as_str().unwrap().to_owned()
}

/// The cluster's `RollingOut` condition.
fn rolling_out(view: &Value) -> Value {
    view["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "RollingOut")
        .unwrap()
        .clone()
}

/// The release node `i`'s apiserver reports, asked through its own super-admin kubeconfig.
fn apiserver_release(cluster: &Rolling<'_>, i: usize) -> String {
    let config = cluster.booted.roots[i].join("etc/exk8s/kubeconfig/super-admin.kubeconfig");
    let (ok, out, err) = kubectl(cluster.lan, i, &config, &["get", "--raw", "/version"]);
    assert!(ok, "node {i}'s /version: {err}");
    let version: Value = serde_json::from_str(&out).unwrap();
    version["gitVersion"].as_str().unwrap().to_owned()
}

#[test]
fn a_minor_upgrade_keeps_every_other_apiserver_ready() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let offered = format!("{KUBERNETES_VERSION},{NEXT_KUBERNETES_VERSION}");
    let booted = boot_three_with(dir, "10.223.0.0/24", &["--kubernetes-versions", &offered]);
    let founded = &booted.founded;
    let ips = booted.ips();
    let dns_name = booted.dns_name();
    let lan = booted.lan(&["10.223.0.250"]);
    let config = dir.join("operator.kubeconfig");
    operator_kubeconfig(&booted.stack, founded.cluster, &config);
    let shared = Shared::new(ips.iter().cloned().enumerate().collect(), config.clone());
    let mut cluster = Rolling::start(&booted, &lan, &shared);
    for i in 0..3 {
        assert_eq!(apiserver_release(&cluster, i), KUBERNETES_VERSION);
        assert_eq!(
            format!("v{}", etcd_release(&cluster, &ips, i)),
            ETCD_VERSION
        );
    }
    // Written through node 0's apiserver (as system:masters: the harness installs no addons,
    // so the operator's group has no binding), read at the end through node 2's.
    let super_admin =
        |i: usize| booted.roots[i].join("etc/exk8s/kubeconfig/super-admin.kubeconfig");
    let (ok, _, err) = kubectl(
        &lan,
        0,
        &super_admin(0),
        &[
            "create",
            "configmap",
            "before-upgrade",
            "--from-literal=kept=yes",
        ],
    );
    assert!(ok, "{err}");

    let id = founded.cluster;
    let patch = |version: &str| -> Value {
        operator(&booted.stack, "PATCH", &format!("/clusters/{id}"))
            .send_json(json!({ "kubernetes_version": version }))
            .unwrap()
            .into_json()
            .unwrap()
    };
    let samples = availability::sample_during(&lan, CLIENT, dns_name, &shared, || {
        // A broken build: the first member fails to run it, goes back, and the upgrade stops.
        shared.step("upgrade to a broken apiserver");
        let broken = broken_apiserver(dir, &booted.roots[0], NEXT_KUBERNETES_VERSION);
        cluster.nodes[0].run_instead(NEXT_KUBERNETES_VERSION, "kube-apiserver", &broken);
        assert_eq!(patch(NEXT_KUBERNETES_VERSION)["upgrade"], "upgrading");
        let failed = cluster.sync_waiting(0, WAIT_CAP);
        let log = String::from_utf8_lossy(&failed.stderr);
        assert!(!failed.status.success(), "the sync must fail: {log}");
        assert!(
            log.contains("wait for static pod kube-apiserver") && log.contains("not healthy"),
            "the agent names the wait that failed: {log}"
        );
        assert_eq!(
            apiserver_release(&cluster, 0),
            KUBERNETES_VERSION,
            "put back"
        );
        let stopped = view(&booted.stack, id);
        let condition = rolling_out(&stopped);
        let message = condition["message"].as_str().unwrap();
        let first = stopped["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["vm_id"] == founded.vms[0])
            .unwrap();
        assert!(
            message.contains("stopped") && message.contains(first["name"].as_str().unwrap()),
            "the upgrade stops at the member that failed: {condition}"
        );
        assert_eq!(stopped["version"], KUBERNETES_VERSION);
        // No other member is handed the release while one failed.
        for i in 1..3 {
            assert_eq!(cluster.sync(i), 0, "node {i} waits");
            assert_eq!(apiserver_release(&cluster, i), KUBERNETES_VERSION);
        }
        shared.step("roll back the broken upgrade");
        assert_eq!(patch(KUBERNETES_VERSION)["upgrade"], "rolling-back");
        cluster.sync_round();
        assert_eq!(rolling_out(&view(&booted.stack, id))["status"], "False");
        cluster.nodes[0].run_instead(
            NEXT_KUBERNETES_VERSION,
            "kube-apiserver",
            &kubernetes_at(NEXT_KUBERNETES_VERSION, "kube-apiserver"),
        );

        // The first member takes the new release; then the operator thinks better of it.
        shared.step("upgrade, first member");
        let started = patch(NEXT_KUBERNETES_VERSION);
        assert_eq!(started["upgrade"], "upgrading", "{started}");
        // The preflight snapshot: the first member's agent takes it from its real etcd and
        // uploads it before it asks for (and is handed) the new release, in the same sync.
        let snapshot = started["snapshot_id"].as_i64().expect("a snapshot first");
        let synced = sync_taking_snapshot(&mut cluster, 0, snapshot);
        let stored: Value = operator(
            &booted.stack,
            "GET",
            &format!("/clusters/{id}/snapshots/{snapshot}"),
        )
        .call()
        .unwrap()
        .into_json()
        .unwrap();
        assert_eq!(
            (
                &stored["state"],
                &stored["trigger"],
                &stored["etcd_version"]
            ),
            (&json!("stored"), &json!("upgrade"), &json!("3.6.10")),
            "taken at the old release's etcd: {stored}"
        );
        assert!(
            synced.contains("phase apiserver: succeeded"),
            "then it took the release: {synced}"
        );
        assert_eq!(apiserver_release(&cluster, 0), NEXT_KUBERNETES_VERSION);
        assert_eq!(view(&booted.stack, id)["version"], KUBERNETES_VERSION);

        shared.step("roll back");
        let back = patch(KUBERNETES_VERSION);
        assert_eq!(back["upgrade"], "rolling-back", "{back}");
        cluster.sync_round();
        for i in 0..3 {
            assert_eq!(
                apiserver_release(&cluster, i),
                KUBERNETES_VERSION,
                "node {i}"
            );
        }

        shared.step("upgrade");
        let again = patch(NEXT_KUBERNETES_VERSION);
        assert_eq!(again["upgrade"], "upgrading", "{again}");
        let snapshot = again["snapshot_id"].as_i64().expect("a snapshot first");
        for i in 0..3 {
            if i == 0 {
                sync_taking_snapshot(&mut cluster, 0, snapshot);
            } else {
                let restarted = cluster.sync(i);
                assert!(
                    restarted >= 3,
                    "node {i}: every static pod runs the new release ({restarted} restarts)"
                );
            }
            assert_eq!(apiserver_release(&cluster, i), NEXT_KUBERNETES_VERSION);
            let during = view(&booted.stack, id);
            let expected = if i < 2 {
                KUBERNETES_VERSION
            } else {
                NEXT_KUBERNETES_VERSION
            };
            assert_eq!(during["version"], expected, "after node {i}: {during}");
            if i == 0 {
                // The API dies mid-upgrade (SIGKILL) and comes back: the upgrade goes on from
                // its rows, with no operator call.
                shared.step("upgrade, the API killed and restarted");
                booted.stack.kill_and_restart();
            }
        }
    });
    eprintln!("{}", availability::check(&samples, 20, 10));

    let after = view(&booted.stack, id);
    let rolling = rolling_out(&after);
    assert_eq!(rolling["status"], "False", "{rolling}");
    for node in after["nodes"].as_array().unwrap() {
        assert_eq!(
            node["kubernetes_version"], NEXT_KUBERNETES_VERSION,
            "{node}"
        );
    }
    let (ok, out, err) = kubectl(
        &lan,
        2,
        &super_admin(2),
        &[
            "get",
            "configmap",
            "before-upgrade",
            "-o",
            "jsonpath={.data.kept}",
        ],
    );
    assert!(
        ok && out == "yes",
        "the ConfigMap written before: {out} {err}"
    );
    // Each member's etcd moved to the release's etcd with it, one member at a time.
    for i in 0..3 {
        assert_eq!(
            format!("v{}", etcd_release(&cluster, &ips, i)),
            NEXT_ETCD_VERSION
        );
    }
    for node in &mut cluster.nodes {
        node.assert_running();
    }
}

/// Node `i`'s agent, in its namespace with its real etcd, takes the upgrade's snapshot
/// `snapshot` and uploads it, then takes the new release in the same sync (the harness restarting
/// what it restarts meanwhile); its log.
fn sync_taking_snapshot(cluster: &mut Rolling<'_>, i: usize, snapshot: i64) -> String {
    let synced = cluster.sync_waiting(i, SYNC_CAP);
    let log = String::from_utf8_lossy(&synced.stderr).into_owned();
    assert!(synced.status.success(), "node {i}'s sync: {log}");
    let uploaded = log.find(&format!("etcd snapshot {snapshot} taken and uploaded"));
    let asked = log.find("is wanted (applied:");
    assert!(
        uploaded.is_some() && asked.is_some() && uploaded < asked,
        "node {i} takes the snapshot first, then asks for its update: {log}"
    );
    assert_eq!(apiserver_release(cluster, i), NEXT_KUBERNETES_VERSION);
    log
}
