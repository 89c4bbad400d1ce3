//! The whole boot path with real binaries: `exk8s-api` (the dev stack on SQLite; `serve` with
//! the simulators on PostgreSQL) founds a 3-node cluster over HTTP; `exk8s-agent run` boots each
//! VM into its own root against the simulated IMDS (host actions recorded); then the roots are
//! checked file by file, a root's admin kubeconfig is checked against a TLS endpoint serving the
//! rendered apiserver certificate, and deleting the cluster leaves nothing in the simulator and
//! refuses the next agent run. (etcd and the control plane running from what the agent writes,
//! under systemd and the kubelet, is `boot_cluster.rs`'s.)

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use exk8s_common::names::Sha256Digest;
use exk8s_tests::cluster::{agent, found, view};
use exk8s_tests::dev::{MANY_AGENTS, Stack, http, start_dev, start_postgres_serve};
use exk8s_tests::tls::{self, KubeconfigIdentity};
use serde_json::{Value, json};

fn agent_run(stack: &Stack, keys: &Path, root: &Path, vm: i64) -> std::process::Output {
    agent(stack, keys, root, vm, "run", None)
}

fn agent_sync(
    stack: &Stack,
    keys: &Path,
    root: &Path,
    vm: i64,
    fail: Option<&str>,
) -> std::process::Output {
    agent(stack, keys, root, vm, "sync", fail)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn boot_path(stack: Stack, dir: &Path) {
    let http = http();
    let founded = found(
        &stack,
        dir,
        &json!({"control_plane_count": 3, "control_plane_image_id": 1, "control_plane_instance_type": "dev.small", "subnet_id": 1}),
    );
    let (cluster, vms, keys, ip_of, created) = (
        founded.cluster,
        founded.vms.clone(),
        founded.keys.clone(),
        founded.ip_of.clone(),
        founded.created.clone(),
    );
    assert_eq!(vms.len(), 3);
    let view = |_: &ureq::Agent| -> Value { view(&stack, cluster) };

    let mut roots = Vec::new();
    for vm in &vms {
        let root = dir.join(format!("vm-{vm}"));
        let out = agent_run(&stack, &keys, &root, *vm);
        assert!(
            out.status.success(),
            "agent for vm {vm}: {}",
            String::from_utf8_lossy(&out.stderr)
        );

        // Every file the agent recorded is on disk with its digest and an exact mode.
        let state: Value = serde_json::from_str(
            &std::fs::read_to_string(root.join("var/lib/exk8s/state.json")).unwrap(),
        )
        .unwrap();
        let files = state["files"].as_object().unwrap();
        assert!(files.len() >= 40, "only {} files", files.len());
        for (path, digest) in files {
            let on_disk = root.join(path.trim_start_matches('/'));
            let content = std::fs::read(&on_disk).unwrap();
            assert_eq!(
                Sha256Digest::of(&content).to_hex(),
                digest.as_str().unwrap(),
                "{path}"
            );
            let expected = if path.ends_with("-key.pem")
                || path.ends_with(".kubeconfig")
                || path.starts_with("/etc/kubernetes/manifests/")
                || path.ends_with("encryption-config.yaml")
            {
                0o600
            } else {
                0o644
            };
            assert_eq!(mode(&on_disk), expected, "{path}");
        }
        // The rendered units and manifests name this node's address.
        let ip = &ip_of[vm];
        let etcd_unit =
            std::fs::read_to_string(root.join("etc/systemd/system/etcd.service")).unwrap();
        assert!(
            etcd_unit.contains(&format!("--listen-peer-urls=https://{ip}:2380")),
            "vm {vm}"
        );
        let apiserver =
            std::fs::read_to_string(root.join("etc/kubernetes/manifests/kube-apiserver.yaml"))
                .unwrap();
        assert!(
            apiserver.contains(&format!("--advertise-address={ip}")),
            "vm {vm}"
        );
        let actions =
            std::fs::read_to_string(root.join("var/lib/exk8s/recorded-actions.log")).unwrap();
        assert!(
            actions.contains("systemctl start --no-block etcd.service"),
            "{actions}"
        );
        assert!(root.join("var/lib/exk8s/bootstrap.done").exists());
        roots.push(root);
    }

    // The phases reached the API.
    let status = view(&http);
    assert_eq!(status["phase"], "founded");
    assert!(
        status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["phase"] == "complete"),
        "{status}"
    );
    assert_eq!(status["ready"], true, "{status}");
    // Each agent said which release it is (its User-Agent), and its node shows it.
    assert!(
        status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["agent_version"] == env!("CARGO_PKG_VERSION")),
        "{status}"
    );

    rollout(&stack, &keys, cluster, &vms, &roots);

    // A root's admin kubeconfig against an endpoint serving that root's apiserver certificate.
    let pki = roots[0].join("etc/exk8s/pki");
    let read = |p: &str| std::fs::read(pki.join(p)).unwrap();
    let port = tls::serve(
        &read("apiserver.pem"),
        &read("apiserver-key.pem"),
        &read("ca.pem"),
    );
    let admin = KubeconfigIdentity::parse(
        &std::fs::read_to_string(roots[0].join("etc/exk8s/kubeconfig/admin.kubeconfig")).unwrap(),
    );
    let identity = Some((admin.cert_pem.as_slice(), admin.key_pem.as_slice()));
    assert_eq!(admin.server_host(), "127.0.0.1");
    for name in [
        admin.server_host().as_str(),
        "10.96.0.1",
        "kubernetes.default.svc.cluster.local",
        ip_of[&vms[0]].as_str(),
    ] {
        tls::handshake(port, name, &admin.ca_pem, identity)
            .unwrap_or_else(|e| panic!("server name {name}: {e}"));
    }
    assert!(
        tls::handshake(port, "evil.example.com", &admin.ca_pem, identity).is_err(),
        "a foreign name verified"
    );
    assert!(
        tls::handshake(port, "127.0.0.1", &admin.ca_pem, None).is_err(),
        "no client certificate was accepted"
    );
    let operator = KubeconfigIdentity::parse(created["kubeconfig"].as_str().unwrap());
    tls::handshake(
        port,
        &operator.server_host(),
        &operator.ca_pem,
        Some((&operator.cert_pem, &operator.key_pem)),
    )
    .expect("the operator kubeconfig's shared DNS name and admin identity");

    // Deleting the cluster leaves nothing, and its VMs cannot boot again.
    let deleted = http
        .delete(&format!("{}/clusters/{cluster}", stack.base))
        .set("Authorization", &format!("Bearer {}", stack.token))
        .call()
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let vms_left: Value = http
        .get(&format!("{}/sim/compute/v1/vms", stack.base))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let groups_left: Value = http
        .get(&format!("{}/sim/compute/v1/security-groups", stack.base))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(vms_left, json!([]));
    assert_eq!(groups_left, json!([]));
    let again = dir.join("after-delete");
    let out = agent_run(&stack, &keys, &again, vms[0]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!again.join("etc").exists(), "a deleted VM got files");
}

/// Every file the agent wrote under `root`: path → (inode, content).
fn written(root: &Path) -> BTreeMap<String, (u64, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt as _;
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("var/lib/exk8s/state.json")).unwrap(),
    )
    .unwrap();
    state["files"]
        .as_object()
        .unwrap()
        .keys()
        .map(|path| {
            let on_disk = root.join(path.trim_start_matches('/'));
            let inode = std::fs::metadata(&on_disk).unwrap().ino();
            (path.clone(), (inode, std::fs::read(&on_disk).unwrap()))
        })
        .collect()
}

fn recorded(root: &Path) -> String {
    std::fs::read_to_string(root.join("var/lib/exk8s/recorded-actions.log")).unwrap()
}

/// The node's (desired, applied) generations and phase, from `GET /clusters/{id}`.
fn generations(stack: &Stack, cluster: i64) -> BTreeMap<i64, (i64, i64, String)> {
    let view: Value = http()
        .get(&format!("{}/clusters/{cluster}", stack.base))
        .set("Authorization", &format!("Bearer {}", stack.token))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["vm_id"].as_i64().unwrap(),
                (
                    n["desired_generation"].as_i64().unwrap(),
                    n["applied_generation"].as_i64().unwrap(),
                    n["phase"].as_str().unwrap().to_owned(),
                ),
            )
        })
        .collect()
}

/// `POST /clusters/{id}/rollout`, then each node's `sync`: one node at a time (a node whose
/// update failed holds the others), only changed files rewritten, restarts in the safe order.
fn rollout(stack: &Stack, keys: &Path, cluster: i64, vms: &[i64], roots: &[std::path::PathBuf]) {
    let started: Value = http()
        .post(&format!("{}/clusters/{cluster}/rollout", stack.base))
        .set("Authorization", &format!("Bearer {}", stack.token))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert!(
        started["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["desired_generation"] == 2),
        "{started}"
    );
    let before: Vec<_> = roots.iter().map(|r| written(r)).collect();

    // The first node's update fails its health check: its previous files come back byte for
    // byte, and the failure holds every other node.
    let out = agent_sync(stack, keys, &roots[0], vms[0], Some("wait for etcd health"));
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let restored = written(&roots[0]);
    for (path, (_, content)) in &before[0] {
        assert_eq!(&restored[path].1, content, "{path} was not restored");
    }
    assert_eq!(
        generations(stack, cluster)[&vms[0]],
        (2, 1, "sync:failed".into())
    );
    let out = agent_sync(stack, keys, &roots[1], vms[1], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the update waits"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(written(&roots[1]), before[1], "a held node changed files");

    for (i, (vm, root)) in vms.iter().zip(roots).enumerate() {
        let log_before = recorded(root).len();
        let files_before = written(root);
        let out = agent_sync(stack, keys, root, *vm, None);
        assert!(
            out.status.success(),
            "sync of vm {vm}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let all = generations(stack, cluster);
        assert_eq!(
            all[vm],
            (2, 2, "sync".into()),
            "{all:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The nodes after this one have not moved yet: never two in flight.
        for later in &vms[i + 1..] {
            assert_eq!(all[later].1, 1, "{all:?}");
        }
        // Only files whose contents changed were replaced.
        let after = written(root);
        let mut changed = Vec::new();
        for (path, (inode, content)) in &after {
            let Some((old_inode, old_content)) = files_before.get(path) else {
                changed.push(path.clone());
                continue;
            };
            if content == old_content {
                assert_eq!(inode, old_inode, "vm {vm}: unchanged {path} was rewritten");
            } else {
                assert_ne!(inode, old_inode, "{path}");
                changed.push(path.clone());
            }
        }
        assert!(
            changed
                .iter()
                .any(|p| p.ends_with("apiserver-etcd-client.pem")),
            "vm {vm}: re-minted certificates did not change: {changed:?}"
        );
        assert!(
            !changed.iter().any(|p| p.ends_with("/ca.pem")),
            "{changed:?}"
        );
        // Restarts and health waits in the safe order.
        let log = recorded(root);
        let actions: Vec<&str> = log[log_before..]
            .lines()
            .filter(|l| l.contains("restart") || l.contains("wait for"))
            .collect();
        let position = |what: &str| actions.iter().position(|a| a.contains(what));
        let steps = [
            "wait for etcd health",
            "wait for static pod kube-apiserver-",
            "wait for static pod kube-controller-manager-",
            "wait for static pod kube-scheduler-",
            "restart --no-block kubelet.service",
            "wait for apiserver",
        ];
        let order: Vec<usize> = steps.iter().filter_map(|w| position(w)).collect();
        assert_eq!(order.len(), steps.len(), "vm {vm}: {actions:?}");
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "vm {vm}: {actions:?}"
        );
    }
}

#[test]
fn boot_path_on_the_sqlite_dev_stack() {
    let dir = tempfile::tempdir().unwrap();
    let stack = start_dev(
        &dir.path().join("dev"),
        "127.0.11.0/24",
        &dir.path().join("api.log"),
        &MANY_AGENTS,
    );
    boot_path(stack, dir.path());
}

#[test]
fn boot_path_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let stack = start_postgres_serve(dir.path(), "127.0.12.0/24", &[]);
    boot_path(stack, dir.path());
}
