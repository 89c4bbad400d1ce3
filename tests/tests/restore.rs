//! Restoring a cluster's etcd in place, for real: a founded cluster's node runs etcd 3.6 and
//! kube-apiserver from its bundle in a namespace of its own; 1,000 ConfigMaps, a Secret and a
//! service-account token are made through the apiserver; a snapshot is taken (`exk8s snapshots
//! create`, the agent streaming it from its member); 100 more ConfigMaps are written and the
//! list's resourceVersion kept, as an informer would; then the disaster: etcd killed and its
//! data directory destroyed. `exk8s restore CLUSTER SNAPSHOT --yes` asks the API, and the
//! member's agent, synced three times while the harness plays systemd and the kubelet, stops
//! (its static pods put aside), restores (the snapshot fetched from the API and checked,
//! `etcdutl snapshot restore` with a new cluster token, `--bump-revision` and
//! `--mark-compacted`, etcd started from it) and starts (the pods back, the apiserver ready).
//! Once on SQLite (`exk8s-api dev`) and once on PostgreSQL (`exk8s-api serve`); on SQLite the
//! API is killed (SIGKILL) and restarted between the steps and goes on from its journal.
//! After it: the 1,000 ConfigMaps and the Secret are back and the 100 are not; the Secret is
//! still encrypted in etcd; a watch from the kept resourceVersion ends at once with "too old
//! resource version" instead of waiting silently for revisions that will never come; and the
//! token issued before the snapshot still authenticates.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;

use exk8s_tests::bins::etcd;
use exk8s_tests::cluster::{agent_inside, agent_ok, found, install_recorded_artifacts};
use exk8s_tests::control_plane::{Node, kubectl, kubectl_until};
use exk8s_tests::dev::{start_dev, start_postgres_serve};
use exk8s_tests::netns::Lan;
use exk8s_tests::one_node::{OneNode, READY, boot_one};
use serde_json::{Value, json};

/// `count` ConfigMaps named `<prefix>-<n>`, as one List for `kubectl create -f`.
fn config_maps(prefix: &str, count: usize) -> String {
    let items: Vec<Value> = (0..count)
        .map(|n| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": format!("{prefix}-{n}"), "namespace": "default"},
                   "data": {"n": n.to_string()}})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// How many ConfigMaps of `default` are named `<prefix>-…`.
fn counted(lan: &Lan, admin: &Path, prefix: &str) -> usize {
    let (ok, out, err) = kubectl(lan, 0, admin, &["get", "configmaps", "-o", "name"]);
    assert!(ok, "{err}");
    out.lines()
        .filter(|l| l.starts_with(&format!("configmap/{prefix}-")))
        .count()
}

/// The agent syncs once inside its namespace while the harness plays systemd and the
/// kubelet; its log, which must show restore step `step` done.
fn sync_step(
    node: &mut Node,
    lan: &Lan,
    stack: &exk8s_tests::dev::Stack,
    founded: &exk8s_tests::cluster::Founded,
    (root, vm): (&Path, i64),
    step: &str,
) -> String {
    let (mut agent, _api) = agent_inside(lan, node.index, stack, founded, root, vm, "sync", READY);
    let out = node.run_agent(lan, &mut agent);
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{step}: {log}");
    assert!(log.contains(&format!("{step} step done")), "{step}: {log}");
    log
}

/// The API's database.
enum Store {
    /// `exk8s-api dev`: SQLite in its data directory.
    Sqlite,
    /// `exk8s-api serve` on a fresh PostgreSQL database.
    Postgres,
}

#[test]
fn a_cluster_restored_in_place_serves_what_its_snapshot_held() {
    restored_in_place(Store::Sqlite, "10.226.0.0/24");
}

#[test]
fn a_cluster_restored_in_place_on_postgresql_serves_what_its_snapshot_held() {
    restored_in_place(Store::Postgres, "10.228.0.0/24");
}

fn restored_in_place(store: Store, sim_cidr: &str) {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let stack = match store {
        Store::Sqlite => start_dev(&dir.join("dev"), sim_cidr, &dir.join("api.log"), &[]),
        Store::Postgres => {
            let objects = dir.join("snapshots").display().to_string();
            start_postgres_serve(dir, sim_cidr, &["--snapshot-store", &objects])
        }
    };
    let OneNode {
        founded,
        vm,
        root,
        dns_name,
        lan,
        mut node,
        super_admin: admin,
        ..
    } = boot_one(&stack, dir, &json!({}));

    // What the snapshot holds: 1,000 ConfigMaps, a Secret, a service account's token.
    let before = dir.join("before.json");
    std::fs::write(&before, config_maps("before", 1000)).unwrap();
    let (ok, _, err) = kubectl(&lan, 0, &admin, &["create", "-f", before.to_str().unwrap()]);
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(
        &lan,
        0,
        &admin,
        &[
            "create",
            "secret",
            "generic",
            "kept",
            "--from-literal=password=hunter2",
        ],
    );
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(&lan, 0, &admin, &["create", "serviceaccount", "restorer"]);
    assert!(ok, "{err}");
    let (ok, token, err) = kubectl(
        &lan,
        0,
        &admin,
        &["create", "token", "restorer", "--duration=2h"],
    );
    assert!(ok, "{err}");
    let token = token.trim().to_owned();

    let cluster = founded.cluster;
    let exk8s = |args: &[&str]| stack.exk8s(dir, args);
    let name = cluster.to_string();
    let asked = exk8s(&["-o", "json", "snapshots", "create", &name]);
    assert!(
        asked.status.success(),
        "{}",
        String::from_utf8_lossy(&asked.stderr)
    );
    let asked: Value = serde_json::from_slice(&asked.stdout).unwrap();
    let snapshot = asked[0]["id"].as_i64().unwrap();
    let (mut agent, forward) = agent_inside(&lan, 0, &stack, &founded, &root, vm, "sync", READY);
    let taken = agent.output().unwrap();
    drop(forward);
    assert!(
        taken.status.success(),
        "{}",
        String::from_utf8_lossy(&taken.stderr)
    );

    // Written after it, and an informer's last resourceVersion.
    let after = dir.join("after.json");
    std::fs::write(&after, config_maps("after", 100)).unwrap();
    let (ok, _, err) = kubectl(&lan, 0, &admin, &["create", "-f", after.to_str().unwrap()]);
    assert!(ok, "{err}");
    let (ok, seen, err) = kubectl(
        &lan,
        0,
        &admin,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/configmaps?limit=1",
        ],
    );
    assert!(ok, "{err}");
    let seen: Value = serde_json::from_str(&seen).unwrap();
    let seen = seen["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    // The disaster: etcd gone, with its data.
    node.kill_etcd();
    std::fs::remove_dir_all(root.join("var/lib/etcd")).unwrap();

    let unconfirmed = exk8s(&["restore", &name, &snapshot.to_string()]);
    assert_eq!(unconfirmed.status.code(), Some(2), "asks for --yes");
    let restore = exk8s(&[
        "-o",
        "json",
        "restore",
        &name,
        &snapshot.to_string(),
        "--yes",
    ]);
    assert!(
        restore.status.success(),
        "{}",
        String::from_utf8_lossy(&restore.stderr)
    );
    let restore: Value = serde_json::from_slice(&restore.stdout).unwrap();
    assert_eq!(restore["phase"], "stop", "{restore}");

    sync_step(&mut node, &lan, &stack, &founded, (&root, vm), "stop");
    assert!(
        !root
            .join("etc/kubernetes/manifests/kube-apiserver.yaml")
            .exists(),
        "the apiserver's manifest is put aside"
    );
    // The API dies mid-restore (SIGKILL) and comes back: the journal says where it was. (On
    // `dev`, whose simulated cloud is kept in its data directory; `serve`'s lives in its
    // process and would not know the VM again.)
    if matches!(store, Store::Sqlite) {
        stack.kill_and_restart();
    }
    let restored = sync_step(&mut node, &lan, &stack, &founded, (&root, vm), "restore");
    assert!(
        restored.contains("--mark-compacted") || restored.contains("older marked compacted"),
        "{restored}"
    );
    sync_step(&mut node, &lan, &stack, &founded, (&root, vm), "start");
    let ready = kubectl_until(
        &lan,
        &mut [&mut node],
        0,
        &admin,
        &["get", "--raw", "/readyz"],
        READY,
    );
    assert_eq!(ready, "ok");
    let view: Value = stack_get(&stack, &format!("/clusters/{cluster}/restore"));
    assert_eq!(view["phase"], "done", "{view}");

    // What the snapshot held is back, and only that.
    assert_eq!(counted(&lan, &admin, "before"), 1000);
    assert_eq!(counted(&lan, &admin, "after"), 0);
    let (ok, password, err) = kubectl(
        &lan,
        0,
        &admin,
        &["get", "secret", "kept", "-o", "jsonpath={.data.password}"],
    );
    assert!(ok, "{err}");
    assert_eq!(password, "aHVudGVyMg==");
    let stored = etcd_get(&lan, &root, "/registry/secrets/default/kept");
    assert!(
        stored.starts_with(b"k8s:enc:"),
        "the Secret is still encrypted in etcd"
    );

    // An informer's watch from before ends at once instead of waiting for revisions that
    // will never come.
    let (ok, watched, err) = kubectl(
        &lan,
        0,
        &admin,
        &[
            "get",
            "--raw",
            &format!(
                "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={seen}&timeoutSeconds=5"
            ),
        ],
    );
    assert!(
        watched.contains("too old resource version") || err.contains("too old resource version"),
        "ok {ok}: {watched} {err}"
    );

    // The token issued before the snapshot still authenticates.
    let config = dir.join("token.kubeconfig");
    let ca = root.join("etc/exk8s/pki/ca.pem");
    std::fs::write(
        &config,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{dns_name}:6443\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
            ca.display()
        ),
    )
    .unwrap();
    let (ok, whoami, err) = kubectl(
        &lan,
        0,
        &config,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(whoami, "system:serviceaccount:default:restorer");
    node.assert_running();
}

fn stack_get(stack: &exk8s_tests::dev::Stack, path: &str) -> Value {
    exk8s_tests::cluster::operator(stack, "GET", path)
        .call()
        .unwrap()
        .into_json()
        .unwrap()
}

/// The value of `key` in the node's etcd, read with etcdctl and the healthcheck identity.
fn etcd_get(lan: &Lan, root: &Path, key: &str) -> Vec<u8> {
    let pki = root.join("etc/exk8s/pki");
    let out = lan
        .command(0, etcd("etcdctl"))
        .arg("--endpoints=https://127.0.0.1:2379")
        .arg(format!("--cacert={}", pki.join("etcd-ca.pem").display()))
        .arg(format!(
            "--cert={}",
            pki.join("etcd-healthcheck-client.pem").display()
        ))
        .arg(format!(
            "--key={}",
            pki.join("etcd-healthcheck-client-key.pem").display()
        ))
        .args(["get", key, "--print-value-only"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A cluster founded elsewhere from another's snapshot (`POST /clusters` with `restore_from`):
/// its node boots from its own bundle (a new name, address and DNS name) with the source's CAs,
/// service-account key and secrets-encryption key; once it reported up, the API restores the
/// source's snapshot onto it (its agent's three steps). Then it serves the source's ConfigMap
/// and Secret, the source's operator kubeconfig (its CA and client certificate) works against
/// its new DNS name, and the source's service-account token authenticates.
#[test]
fn a_cluster_founded_from_another_clusters_snapshot_serves_its_objects() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let stack = start_dev(&dir.join("dev"), "10.227.0.0/24", &dir.join("api.log"), &[]);
    let one = json!({"control_plane_count": 1, "control_plane_image_id": 1,
                     "control_plane_instance_type": "dev.small", "subnet_id": 1});
    let OneNode {
        founded: source,
        vm,
        root,
        dns_name,
        lan,
        node,
        super_admin: admin,
        ..
    } = boot_one(&stack, dir, &json!({}));
    // The initial node's RBAC, as its plan applies it: the operator's group bound.
    let rbac = root
        .join("etc/exk8s/manifests/rbac.yaml")
        .display()
        .to_string();
    for args in [
        &[
            "apply",
            "--server-side",
            "--field-manager=exk8s",
            "-f",
            &rbac,
        ][..],
        &["create", "configmap", "carried", "--from-literal=kept=yes"][..],
        &[
            "create",
            "secret",
            "generic",
            "kept",
            "--from-literal=password=hunter2",
        ][..],
        &["create", "serviceaccount", "restorer"][..],
    ] {
        let (ok, _, err) = kubectl(&lan, 0, &admin, args);
        assert!(ok, "{err}");
    }
    let (ok, token, err) = kubectl(
        &lan,
        0,
        &admin,
        &["create", "token", "restorer", "--duration=2h"],
    );
    assert!(ok, "{err}");
    let token = token.trim().to_owned();
    let old_kubeconfig = dir.join("source-operator.kubeconfig");
    std::fs::write(
        &old_kubeconfig,
        exk8s_tests::cluster::operator_kubeconfig(&stack, source.cluster),
    )
    .unwrap();
    let asked = exk8s_tests::cluster::operator(
        &stack,
        "POST",
        &format!("/clusters/{}/snapshots", source.cluster),
    )
    .call()
    .unwrap()
    .into_json::<Value>()
    .unwrap();
    let snapshot = asked["id"].as_i64().unwrap();
    let (mut agent, forward) = agent_inside(&lan, 0, &stack, &source, &root, vm, "sync", READY);
    let taken = agent.output().unwrap();
    drop(forward);
    assert!(
        taken.status.success(),
        "{}",
        String::from_utf8_lossy(&taken.stderr)
    );
    // The source is lost.
    drop(node);

    let mut body = one.clone();
    body["restore_from"] = json!({"cluster_id": source.cluster, "snapshot_id": snapshot});
    std::fs::create_dir_all(dir.join("target")).unwrap();
    let target = found(&stack, &dir.join("target"), &body);
    let new_vm = target.vms[0];
    let new_root = dir.join(format!("target/vm-{new_vm}"));
    let new_ip = target.ip_of[&new_vm].clone();
    let new_dns = target.created["control_plane_dns_name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(new_dns, dns_name);
    let index = lan.add(&new_ip, &format!("{new_ip} {new_dns}\n"));
    agent_ok(&stack, &target, &new_root, new_vm, "run");
    install_recorded_artifacts(&new_root);
    let mut node = Node::new(&new_root, index);
    node.start_etcd(&lan);
    node.sync_static_pods(&lan);
    let admin = new_root.join("etc/exk8s/kubeconfig/super-admin.kubeconfig");
    let ready = kubectl_until(
        &lan,
        &mut [&mut node],
        index,
        &admin,
        &["get", "--raw", "/readyz"],
        READY,
    );
    assert_eq!(ready, "ok");
    // Its member reported up during `run`: the restore of the source's snapshot has begun.
    let view = stack_get(&stack, &format!("/clusters/{}/restore", target.cluster));
    assert_eq!(
        (&view["phase"], &view["snapshot_id"]),
        (&json!("stop"), &json!(snapshot)),
        "{view}"
    );
    for step in ["stop", "restore", "start"] {
        sync_step(&mut node, &lan, &stack, &target, (&new_root, new_vm), step);
    }
    let ready = kubectl_until(
        &lan,
        &mut [&mut node],
        index,
        &admin,
        &["get", "--raw", "/readyz"],
        READY,
    );
    assert_eq!(ready, "ok");
    let (ok, kept, err) = kubectl(
        &lan,
        index,
        &admin,
        &["get", "configmap", "carried", "-o", "jsonpath={.data.kept}"],
    );
    assert!(ok && kept == "yes", "{err}");
    let (ok, password, err) = kubectl(
        &lan,
        index,
        &admin,
        &["get", "secret", "kept", "-o", "jsonpath={.data.password}"],
    );
    assert!(ok, "{err}");
    assert_eq!(
        password, "aHVudGVyMg==",
        "the source's encryption key opens its Secret"
    );
    // The source's operator kubeconfig: its CA is trusted, its certificate accepted, at the
    // new name.
    let (ok, out, err) = kubectl(
        &lan,
        index,
        &old_kubeconfig,
        &[
            &format!("--server=https://{new_dns}:6443"),
            "get",
            "configmap",
            "carried",
            "-o",
            "name",
        ],
    );
    assert!(ok && out.trim() == "configmap/carried", "{out} {err}");
    let config = dir.join("token.kubeconfig");
    std::fs::write(
        &config,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{new_dns}:6443\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
            new_root.join("etc/exk8s/pki/ca.pem").display()
        ),
    )
    .unwrap();
    let (ok, whoami, err) = kubectl(
        &lan,
        index,
        &config,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(whoami, "system:serviceaccount:default:restorer");
    node.assert_running();
}
