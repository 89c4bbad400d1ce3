//! A worker pool end to end with real binaries, on the SQLite dev stack and on PostgreSQL:
//! three control-plane nodes and a pool of three workers booted by `exk8s-agent run` (each
//! worker's root holds the worker files only); the pool scaled to 5, then to 1 — the four
//! newest drained by the oldest control-plane node's agent on its sync (recorded in its root)
//! before their VMs go — then deleted. VMs made and released match the simulator's, each
//! worker carries the bridge template containerd fills with its Node's pod range (from the
//! controller-manager; `boot_cluster.rs` boots it), and a worker's kubeconfigs complete mTLS with
//! a control-plane node's apiserver certificate under the control plane's shared name.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use exk8s_tests::cluster::{Founded, agent_ok, found, operator, run_each};
use exk8s_tests::dev::{MANY_AGENTS, Stack, http, start_dev, start_postgres_serve};
use exk8s_tests::procs::wait_until;
use exk8s_tests::tls::{self, KubeconfigIdentity};
use serde_json::{Value, json};

fn pool(stack: &Stack, cluster: i64, id: i64) -> Option<Value> {
    match operator(
        stack,
        "GET",
        &format!("/clusters/{cluster}/node-pools/{id}"),
    )
    .call()
    {
        Ok(r) => Some(r.into_json().unwrap()),
        Err(ureq::Error::Status(404, _)) => None,
        Err(e) => panic!("GET pool: {e}"),
    }
}

fn patch(stack: &Stack, cluster: i64, id: i64, count: i64) {
    let r = operator(
        stack,
        "PATCH",
        &format!("/clusters/{cluster}/node-pools/{id}"),
    )
    .send_json(json!({"count": count}))
    .unwrap();
    assert_eq!(r.status(), 202);
}

/// Waits until the pool has `count` workers and none leaving.
fn settled(stack: &Stack, cluster: i64, id: i64, count: usize) -> Value {
    wait_until(&format!("pool at {count}"), Duration::from_secs(60), || {
        pool(stack, cluster, id).is_some_and(|p| {
            p["replicas"] == json!(count) && p["nodes"].as_array().unwrap().len() == count
        })
    });
    pool(stack, cluster, id).unwrap()
}

fn field(pool: &Value, name: &str) -> BTreeSet<i64> {
    pool["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n[name].as_i64().unwrap())
        .collect()
}

/// The simulator's VMs: (control-plane, worker) ids.
fn sim_vms(stack: &Stack) -> (BTreeSet<i64>, BTreeSet<i64>) {
    let vms: Vec<Value> = http()
        .get(&format!("{}/sim/compute/v1/vms", stack.base))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let role = |r: &str| {
        vms.iter()
            .filter(|vm| vm["tags"]["exk8s.io/role"] == r)
            .map(|vm| vm["id"].as_i64().unwrap())
            .collect()
    };
    (role("control-plane"), role("worker"))
}

fn recorded(root: &Path) -> String {
    std::fs::read_to_string(root.join("var/lib/exk8s/recorded-actions.log")).unwrap_or_default()
}

/// Boots every worker of `pool` not booted yet; returns its root.
fn boot(stack: &Stack, founded: &Founded, dir: &Path, pool: &Value) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for vm in field(pool, "vm_id") {
        let root = dir.join(format!("worker-{vm}"));
        if root.exists() {
            continue;
        }
        agent_ok(stack, founded, &root, vm, "run");
        roots.push(root);
    }
    roots
}

fn pool_lifecycle(stack: Stack, dir: &Path) {
    let founded = found(
        &stack,
        dir,
        &json!({"control_plane_count": 3, "control_plane_image_id": 1, "control_plane_instance_type": "dev.small", "subnet_id": 1}),
    );
    let cluster = founded.cluster;
    let cp_roots = run_each(&stack, &founded, dir, "cp");

    let created: Value = operator(&stack, "POST", &format!("/clusters/{cluster}/node-pools"))
        .set("Idempotency-Key", "e2e-pool")
        .send_json(
            json!({"name": "blue", "count": 3, "instance_type": "dev.small", "image_id": 1,
                          "subnet_id": 1, "labels": {"node.kubernetes.io/pool": "blue"}}),
        )
        .unwrap()
        .into_json()
        .unwrap();
    let id = created["id"].as_i64().unwrap();
    let three = settled(&stack, cluster, id, 3);
    for root in &boot(&stack, &founded, dir, &three) {
        let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
        assert!(
            read("etc/systemd/system/kubelet.service").contains("node.kubernetes.io/pool=blue")
        );
        assert!(read("etc/containerd/bridge-cni.conflist.tmpl").contains(".PodCIDRRanges"));
        assert!(!root.join("etc/exk8s/pki/etcd-ca.pem").exists());
        assert!(!root.join("etc/exk8s/kubeconfig/admin.kubeconfig").exists());
        assert!(
            !root
                .join("etc/kubernetes/manifests/kube-apiserver.yaml")
                .exists()
        );
        assert!(recorded(root).contains("kubelet.service"));
    }
    let three = pool(&stack, cluster, id).unwrap();
    assert_eq!(three["ready_replicas"], 3, "every worker's agent completed");

    // A worker's kubelet and kube-proxy reach the control plane through the node's balancer
    // (`127.0.0.1:7445`), which finds the members by the control plane's shared name: mTLS
    // against the apiserver certificate a control-plane node serves, which names 127.0.0.1.
    let pki = cp_roots[0].join("etc/exk8s/pki");
    let read = |p: &str| std::fs::read(pki.join(p)).unwrap();
    let port = tls::serve(
        &read("apiserver.pem"),
        &read("apiserver-key.pem"),
        &read("ca.pem"),
    );
    let worker_root = dir.join(format!("worker-{}", three["nodes"][0]["vm_id"]));
    let balancer = std::fs::read_to_string(
        worker_root.join("etc/systemd/system/exk8s-apiserver-balancer.service"),
    )
    .unwrap();
    let members = format!(
        "--apiserver={}:6443",
        founded.created["control_plane_dns_name"].as_str().unwrap()
    );
    assert!(balancer.contains(&members), "{balancer}");
    let endpoint = "https://127.0.0.1:7445";
    for kubeconfig in ["kubelet.kubeconfig", "kube-proxy.kubeconfig"] {
        let text =
            std::fs::read_to_string(worker_root.join("etc/exk8s/kubeconfig").join(kubeconfig))
                .unwrap();
        let identity = KubeconfigIdentity::parse(&text);
        assert_eq!(identity.server, endpoint, "{kubeconfig}");
        tls::handshake(
            port,
            &identity.server_host(),
            &identity.ca_pem,
            Some((&identity.cert_pem, &identity.key_pem)),
        )
        .unwrap_or_else(|e| panic!("{kubeconfig}: {e}"));
    }

    patch(&stack, cluster, id, 5);
    let five = settled(&stack, cluster, id, 5);
    boot(&stack, &founded, dir, &five);
    let made = field(&five, "vm_id");
    assert_eq!(sim_vms(&stack).1, made);

    // The four newest go; booted, they are drained first, by the oldest control-plane node.
    patch(&stack, cluster, id, 1);
    wait_until("four workers draining", Duration::from_secs(30), || {
        pool(&stack, cluster, id).is_some_and(|p| {
            p["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["removal"] == "draining")
                .count()
                == 4
        })
    });
    assert_eq!(
        sim_vms(&stack).1.len(),
        5,
        "nothing deleted before its drain"
    );
    let leaving: Vec<String> = pool(&stack, cluster, id).unwrap()["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["removal"] == "draining")
        .map(|n| n["name"].as_str().unwrap().to_owned())
        .collect();
    agent_ok(&stack, &founded, &cp_roots[0], founded.vms[0], "sync");
    let actions = recorded(&cp_roots[0]);
    for name in &leaving {
        assert!(
            actions.contains(&format!("drain node {name} through the eviction API")),
            "{actions}"
        );
    }
    let one = settled(&stack, cluster, id, 1);
    let oldest = five["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .min_by_key(|n| n["ordinal"].as_i64())
        .unwrap()
        .clone();
    assert_eq!(one["nodes"][0]["vm_id"], oldest["vm_id"]);
    assert_eq!(sim_vms(&stack).1, field(&one, "vm_id"));

    let deleted = operator(
        &stack,
        "DELETE",
        &format!("/clusters/{cluster}/node-pools/{id}"),
    )
    .call()
    .unwrap();
    assert_eq!(deleted.status(), 202);
    wait_until("the last worker draining", Duration::from_secs(30), || {
        pool(&stack, cluster, id).is_some_and(|p| p["nodes"][0]["removal"] == "draining")
    });
    agent_ok(&stack, &founded, &cp_roots[0], founded.vms[0], "sync");
    wait_until("the pool to go", Duration::from_secs(30), || {
        pool(&stack, cluster, id).is_none()
    });
    let (control_plane, workers) = sim_vms(&stack);
    assert!(workers.is_empty(), "every worker VM released: {workers:?}");
    assert_eq!(control_plane, founded.vms.iter().copied().collect());
    let nodes = exk8s_tests::cluster::view(&stack, cluster)["nodes"].clone();
    let ordinals: BTreeSet<i64> = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["ordinal"].as_i64().unwrap())
        .collect();
    assert_eq!(ordinals.len(), 3, "only the control plane is left: {nodes}");
}

#[test]
fn a_pool_lives_and_goes_on_the_sqlite_dev_stack() {
    let dir = tempfile::tempdir().unwrap();
    let stack = start_dev(
        &dir.path().join("dev"),
        "127.0.17.0/24",
        &dir.path().join("api.log"),
        &MANY_AGENTS,
    );
    pool_lifecycle(stack, dir.path());
}

#[test]
fn a_pool_lives_and_goes_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let stack = start_postgres_serve(dir.path(), "127.0.18.0/24", &[]);
    pool_lifecycle(stack, dir.path());
}
