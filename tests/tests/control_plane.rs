//! Founding, for real: a cluster founded on the dev stack, its node booted by the real agent
//! into a root, then the node's rendered control plane run from that root with Kubernetes' own
//! binaries (etcd 3.6, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, built by
//! `scripts/k8s-binaries.sh`) in a network namespace of its own, with exactly the rendered flags,
//! certificates, kubeconfigs, encryption and audit configuration and service-account keys. For
//! each key algorithm it proves: `/readyz` and `/livez`; the addons apply with server-side apply
//! (RBAC first, with the break-glass identity); the operator kubeconfig the API hands out reaches
//! the control-plane name and is `exk8s-admin` in `exk8s:cluster-admins`; the controller-manager
//! and scheduler hold their leader leases and answer `/healthz`; the node's kubelet identity is
//! `system:node:<name>` and the Node authorizer lets it create its own Node but not another's;
//! a service-account token is minted and authenticates; a Secret is stored encrypted
//! (`k8s:enc:` read back from etcd); the audit log gets the policy's entries; the aggregation
//! layer's `apiservices` list.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;

use exk8s_tests::cluster::operator_kubeconfig;
use exk8s_tests::control_plane::{Node, etcdctl, kubectl, kubectl_until};
use exk8s_tests::dev::start_dev;
use exk8s_tests::one_node::{OneNode, READY, boot_one};
use serde_json::{Value, json};

const KUBECONFIG: &str = "etc/exk8s/kubeconfig";

fn founded_for_real(algorithm: &str) {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let stack = start_dev(&dir.join("dev"), "10.217.0.0/24", &dir.join("api.log"), &[]);
    // The apiserver comes up from the rendered flags and files.
    let OneNode {
        founded,
        root,
        ip,
        dns_name,
        lan,
        mut node,
        static_pods,
        super_admin,
        ..
    } = boot_one(&stack, dir, &json!({"key_algorithm": algorithm}));
    assert_eq!(
        static_pods,
        [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler"
        ]
    );
    let kubeconfig = |name: &str| root.join(KUBECONFIG).join(name);
    let admin = kubeconfig("admin.kubeconfig");
    let until = |node: &mut Node, config: &Path, args: &[&str]| {
        kubectl_until(&lan, &mut [node], 0, config, args, READY)
    };
    assert_eq!(
        until(&mut node, &super_admin, &["get", "--raw", "/livez"]),
        "ok"
    );

    // The initial node's addons, as its plan applies them: RBAC with the break-glass identity,
    // then the rest with the admin identity it binds.
    for (config, manifest) in [
        (&super_admin, "rbac.yaml"),
        (&admin, "coredns.yaml"),
        (&admin, "kube-proxy.yaml"),
    ] {
        let file = root.join("etc/exk8s/manifests").join(manifest);
        let file = file.display().to_string();
        let applied = until(
            &mut node,
            config,
            &[
                "apply",
                "--server-side",
                "--field-manager=exk8s",
                "-f",
                &file,
            ],
        );
        assert!(
            applied.contains("serverside-applied"),
            "{manifest}: {applied}"
        );
    }

    // The operator's kubeconfig, as the API hands it out, reaches the control-plane name.
    let operator_config = dir.join("operator.kubeconfig");
    let text = operator_kubeconfig(&stack, founded.cluster);
    assert!(text.contains(&format!("https://{dns_name}:6443")), "{text}");
    std::fs::write(&operator_config, text).unwrap();
    let whoami: Value = serde_json::from_str(&until(
        &mut node,
        &operator_config,
        &["auth", "whoami", "-o", "json"],
    ))
    .unwrap();
    assert_eq!(whoami["status"]["userInfo"]["username"], "exk8s-admin");
    assert!(
        whoami["status"]["userInfo"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("exk8s:cluster-admins")),
        "{whoami}"
    );
    let namespaces = until(
        &mut node,
        &operator_config,
        &["get", "namespaces", "-o", "name"],
    );
    assert!(namespaces.contains("namespace/kube-system"), "{namespaces}");

    // The controller-manager and scheduler hold their leader leases and are healthy.
    for (lease, port) in [
        ("kube-controller-manager", 10257),
        ("kube-scheduler", 10259),
    ] {
        let holder = until(
            &mut node,
            &admin,
            &[
                "-n",
                "kube-system",
                "get",
                "lease",
                lease,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
        );
        assert!(!holder.is_empty(), "{lease} has no holder");
        let health = lan
            .command(0, "curl")
            .args(["-sk", &format!("https://127.0.0.1:{port}/healthz")])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&health.stdout),
            "ok",
            "{lease} /healthz"
        );
    }

    // The kubelet's identity: system:node:<name>, allowed its own Node, refused another's.
    let kubelet = kubeconfig("kubelet.kubeconfig");
    let me: Value = serde_json::from_str(&until(
        &mut node,
        &kubelet,
        &["auth", "whoami", "-o", "json"],
    ))
    .unwrap();
    let user = me["status"]["userInfo"]["username"]
        .as_str()
        .unwrap()
        .to_owned();
    let node_name = user
        .strip_prefix("system:node:")
        .expect("a node identity")
        .to_owned();
    let node_object = |name: &str| {
        let path = dir.join(format!("node-{name}.json"));
        let body = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
        std::fs::write(&path, body.to_string()).unwrap();
        path.display().to_string()
    };
    let own = node_object(&node_name);
    let (ok, out, err) = kubectl(&lan, 0, &kubelet, &["create", "-f", &own]);
    assert!(ok, "the kubelet may create its own Node: {out}{err}");
    let other = node_object("someone-else");
    let (ok, _, err) = kubectl(&lan, 0, &kubelet, &["create", "-f", &other]);
    assert!(!ok && err.contains("Forbidden"), "another's Node: {err}");

    // A service-account token, signed with the rendered key, authenticates.
    let token = until(
        &mut node,
        &admin,
        &["-n", "default", "create", "token", "default"],
    );
    // A token-only kubeconfig: a client certificate beside the token would win.
    let bearer = dir.join("token.kubeconfig");
    let ca = root.join("etc/exk8s/pki/ca.pem");
    let config = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{dns_name}:6443\n    certificate-authority: {}\nusers:\n- name: sa\n  user:\n    token: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: sa}}\ncurrent-context: c\n",
        ca.display(),
        token.trim()
    );
    std::fs::write(&bearer, config).unwrap();
    let (ok, out, err) = kubectl(
        &lan,
        0,
        &bearer,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out, "system:serviceaccount:default:default");

    // Secrets are encrypted at rest with the rendered key.
    until(
        &mut node,
        &admin,
        &[
            "-n",
            "default",
            "create",
            "secret",
            "generic",
            "proof",
            "--from-literal=k=plaintext-value",
        ],
    );
    let stored = etcdctl(
        &lan,
        0,
        &root,
        &format!("https://{ip}:2379"),
        ("apiserver-etcd-client.pem", "apiserver-etcd-client-key.pem"),
        &[
            "get",
            "/registry/secrets/default/proof",
            "--print-value-only",
        ],
    );
    let stored = String::from_utf8_lossy(&stored.stdout);
    assert!(
        stored.starts_with("k8s:enc:"),
        "not encrypted: {stored:.80}"
    );
    assert!(!stored.contains("plaintext-value"));

    // The audit policy's entries reach the rendered log.
    let audit = std::fs::read_to_string(root.join("var/log/kubernetes/audit/audit.log")).unwrap();
    assert!(
        audit.contains("\"apiVersion\":\"audit.k8s.io/v1\""),
        "{audit:.200}"
    );
    assert!(
        audit.contains("secrets"),
        "the Secret's creation is audited"
    );

    // The aggregation layer (front-proxy identity) serves its API.
    let services = until(&mut node, &admin, &["get", "apiservices", "-o", "name"]);
    assert!(services.contains("v1.apps"), "{services}");
    node.assert_running();
}

#[test]
fn an_ecdsa_cluster_runs_kubernetes_from_its_bundle() {
    founded_for_real("ecdsa-p256");
}

#[test]
fn an_rsa_cluster_runs_kubernetes_from_its_bundle() {
    founded_for_real("rsa-2048");
}

/// Three control-plane nodes, each in its own namespace on one LAN: three etcd 3.6 members form
/// one cluster from their units, three kube-apiservers become ready through it, each node's
/// controller-manager and scheduler run, and exactly one of each holds the leader lease; what
/// one apiserver writes, another reads.
#[test]
fn three_nodes_run_three_apiservers_over_one_etcd_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let booted = exk8s_tests::cluster::boot_three(dir, "10.218.0.0/24");
    let ips = booted.ips();
    let lan = booted.lan(&[]);
    let mut nodes: Vec<Node> = booted
        .roots
        .iter()
        .enumerate()
        .map(|(i, root)| Node::new(root, i))
        .collect();
    for node in &mut nodes {
        node.start_etcd(&lan);
    }
    for node in &mut nodes {
        node.sync_static_pods(&lan);
    }
    let super_admin = |i: usize| {
        booted.roots[i]
            .join(KUBECONFIG)
            .join("super-admin.kubeconfig")
    };
    for i in 0..3 {
        let mut all: Vec<&mut Node> = nodes.iter_mut().collect();
        let ready = kubectl_until(
            &lan,
            &mut all,
            i,
            &super_admin(i),
            &["get", "--raw", "/readyz"],
            READY,
        );
        assert_eq!(ready, "ok", "apiserver {i}");
    }
    // One etcd cluster of three voters, seen from the third node.
    let listed = etcdctl(
        &lan,
        2,
        &booted.roots[2],
        &format!("https://{}:2379", ips[2]),
        (
            "etcd-healthcheck-client.pem",
            "etcd-healthcheck-client-key.pem",
        ),
        &["member", "list", "-w", "json"],
    );
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let members = listed["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{listed}");
    assert!(members.iter().all(|m| m["isLearner"] != true), "{listed}");

    // Written through the first apiserver, read through the third.
    let mut all: Vec<&mut Node> = nodes.iter_mut().collect();
    kubectl_until(
        &lan,
        &mut all,
        0,
        &super_admin(0),
        &[
            "-n",
            "default",
            "create",
            "configmap",
            "shared",
            "--from-literal=k=v",
        ],
        READY,
    );
    let read = kubectl_until(
        &lan,
        &mut all,
        2,
        &super_admin(2),
        &[
            "-n",
            "default",
            "get",
            "configmap",
            "shared",
            "-o",
            "jsonpath={.data.k}",
        ],
        READY,
    );
    assert_eq!(read, "v");

    // Each lease has exactly one holder, one of the three nodes' processes.
    for lease in ["kube-controller-manager", "kube-scheduler"] {
        let holder = kubectl_until(
            &lan,
            &mut all,
            1,
            &super_admin(1),
            &[
                "-n",
                "kube-system",
                "get",
                "lease",
                lease,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
            READY,
        );
        assert!(!holder.is_empty(), "{lease}");
    }
    for node in &mut nodes {
        node.assert_running();
    }
}
