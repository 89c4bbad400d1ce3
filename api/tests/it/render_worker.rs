//! A worker's bundle carries exactly what a worker needs: its kubelet identity (checked with
//! openssl: CN `system:node:<name>`, O `system:nodes`, the EKUs, SANs, the chain to the cluster
//! CA), kubeconfigs pointing at the control-plane endpoint, its pool's labels and taints set at
//! registration — and none of a control-plane node's files, artifacts or steps.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Command;

use base64::Engine as _;
use exk8s_api::labels::{NodeLabel, Taint};
use exk8s_api::pki::{ClusterPki, KeyAlgorithm, NodeAddresses, NodeCerts};
use exk8s_api::render::paths::PATHS;
use exk8s_api::render::{ArtifactCatalog, WorkerInput, WorkerNode, render_worker_bundle};
use exk8s_common::contract::Role;
use exk8s_common::payload::{BundlePayload, PlanStep};
use time::OffsetDateTime;

use crate::helpers::{cluster_spec, issuance, network, openssl, text};
use crate::render::yaml_docs;
use crate::render_validators::write_root;

const NAME: &str = "blue-301.cluster-42.internal";

fn worker() -> (ClusterPki, BundlePayload) {
    let now = OffsetDateTime::now_utc();
    let pki = ClusterPki::generate(KeyAlgorithm::EcdsaP256, now).unwrap();
    let node = WorkerNode {
        vm_id: 301,
        addresses: NodeAddresses {
            name: NAME.parse().unwrap(),
            private_ipv4: Ipv4Addr::new(10, 0, 1, 31),
            private_ipv6: None,
            public_ipv4: None,
        },
        labels: vec![
            NodeLabel::new("node.kubernetes.io/pool", "blue").unwrap(),
            NodeLabel::new("example.com/tier", "batch").unwrap(),
        ],
        taints: vec![Taint::new("dedicated", "batch", "NoSchedule").unwrap()],
    };
    let minted = NodeCerts::mint(&pki, &node.addresses, now).unwrap();
    let spec = cluster_spec(network());
    let bundle = render_worker_bundle(&WorkerInput {
        cluster: &spec,
        node: &node,
        cluster_ca_pem: pki.cluster_ca.cert_pem(),
        minted: &minted,
        apiservers: &[Ipv4Addr::new(10, 0, 1, 11), Ipv4Addr::new(10, 0, 1, 12)],
        issuance: &issuance(1),
        artifacts: &ArtifactCatalog::default(),
    })
    .unwrap();
    (pki, bundle)
}

/// Every file a worker's bundle holds, exactly.
pub(crate) fn worker_paths() -> BTreeSet<&'static str> {
    [
        PATHS.ca_cert,
        PATHS.kubelet_cert,
        PATHS.kubelet_key,
        PATHS.kubelet_kubeconfig,
        PATHS.kube_proxy_kubeconfig,
        PATHS.kubelet_unit,
        PATHS.kubelet_config,
        PATHS.containerd_config,
        PATHS.cni_template,
        PATHS.sysctl_conf,
        PATHS.modules_conf,
        PATHS.container_scope_conf,
        PATHS.balancer_socket,
        PATHS.balancer_unit,
        PATHS.balancer_seeds,
    ]
    .into()
}

#[test]
fn a_worker_bundle_carries_exactly_what_a_worker_needs() {
    let (_, bundle) = worker();
    assert_eq!(bundle.identity.role, Role::Worker);
    assert!(!bundle.identity.is_initial_control_plane);
    let paths: BTreeSet<&str> = bundle.files.iter().map(|f| f.path.as_str()).collect();
    let expected = worker_paths();
    assert_eq!(
        paths, expected,
        "no CA key, SA key, etcd file, admin kubeconfig or manifest"
    );
    let artifacts: Vec<&str> = bundle.artifacts.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(artifacts, ["kubelet"]);
    assert!(
        bundle
            .plan
            .iter()
            .all(|s| matches!(s, PlanStep::DaemonReload {} | PlanStep::EnableStart { .. })),
        "no wait, static pod or addon step: {:?}",
        bundle.plan
    );
    // The kubelet and kube-proxy reach the control plane through the node's balancer, which
    // finds the apiservers by the control plane's shared name.
    for path in [PATHS.kubelet_kubeconfig, PATHS.kube_proxy_kubeconfig] {
        let doc = &yaml_docs(text(&bundle, path))[0];
        assert_eq!(
            doc["clusters"][0]["cluster"]["server"].as_str(),
            Some("https://127.0.0.1:7445"),
            "{path}"
        );
    }
    let balancer = text(&bundle, PATHS.balancer_unit);
    assert!(
        balancer.contains("--apiserver=exk8s-7-2a.k8s.example.com:6443")
            && balancer.contains(&format!("--ca-file={}", PATHS.ca_cert))
            && balancer.contains(&format!("--seeds-file={}", PATHS.balancer_seeds))
            && balancer.contains("--listen=127.0.0.1:7445"),
        "{balancer}"
    );
    // Until that name first resolves, the members the bundle was made with.
    let seeds: Vec<&str> = text(&bundle, PATHS.balancer_seeds)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect();
    assert_eq!(seeds, ["10.0.1.11:6443", "10.0.1.12:6443"]);
    let socket = text(&bundle, PATHS.balancer_socket);
    assert!(socket.contains("ListenStream=127.0.0.1:7445"), "{socket}");
    let started: Vec<String> = bundle
        .plan
        .iter()
        .filter_map(|s| match s {
            PlanStep::EnableStart { unit, .. } => Some(unit.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(
        started,
        [
            "systemd-modules-load.service",
            "systemd-sysctl.service",
            "containerd.service",
            "exk8s-apiserver-balancer.socket",
            "exk8s-apiserver-balancer.service",
            "kubelet.service"
        ],
        "the balancer before the kubelet"
    );
    // Registration: the node's name pinned, its pool's labels and taints.
    let unit = text(&bundle, PATHS.kubelet_unit);
    assert!(
        unit.contains(&format!("--hostname-override={NAME}")),
        "{unit}"
    );
    assert!(
        unit.contains("--node-labels=example.com/tier=batch,node.kubernetes.io/pool=blue")
            || unit.contains("--node-labels=node.kubernetes.io/pool=blue,example.com/tier=batch"),
        "{unit}"
    );
    assert!(unit.contains("(exk8s worker node)"), "{unit}");
    let config = &yaml_docs(text(&bundle, PATHS.kubelet_config))[0];
    assert_eq!(config["registerWithTaints"][0]["key"], "dedicated");
    assert_eq!(config["registerWithTaints"][0]["value"], "batch");
    assert_eq!(config["registerWithTaints"][0]["effect"], "NoSchedule");
    assert_eq!(config["registerWithTaints"].as_sequence().unwrap().len(), 1);
    // No static pods on a worker: no directory for the kubelet to look for each second.
    assert!(config.get("staticPodPath").is_none(), "{config:?}");
    // Its pod range is the one Kubernetes gives its Node: containerd writes the bridge
    // configuration from the template with it (tests/tests/boot_cluster/nodes.rs checks this on booted machines).
    let containerd = text(&bundle, PATHS.containerd_config);
    assert!(
        containerd.contains(&format!("conf_template = \"{}\"", PATHS.cni_template)),
        "{containerd}"
    );
    let template = text(&bundle, PATHS.cni_template);
    assert!(
        template.contains("range $i, $range := .PodCIDRRanges"),
        "{template}"
    );
    assert!(
        !template.contains("172.16."),
        "no range of the API's: {template}"
    );
}

#[test]
fn the_worker_kubelet_identity_checks_out_with_openssl() {
    let (pki, bundle) = worker();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), pki.cluster_ca.cert_pem()).unwrap();
    assert_eq!(text(&bundle, PATHS.ca_cert), pki.cluster_ca.cert_pem());
    let doc = &yaml_docs(text(&bundle, PATHS.kubelet_kubeconfig))[0];
    let client = base64::engine::general_purpose::STANDARD
        .decode(
            doc["users"][0]["user"]["client-certificate-data"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    std::fs::write(dir.path().join("client.pem"), client).unwrap();
    std::fs::write(
        dir.path().join("serving.pem"),
        text(&bundle, PATHS.kubelet_cert),
    )
    .unwrap();
    let (ok, subject) = openssl(
        &[
            "x509",
            "-noout",
            "-subject",
            "-nameopt",
            "RFC2253",
            "-in",
            "client.pem",
        ],
        dir.path(),
    );
    assert!(ok, "{subject}");
    assert!(
        subject.contains(&format!("CN=system:node:{NAME}")) && subject.contains("O=system:nodes"),
        "{subject}"
    );
    for (cert, purpose) in [("client.pem", "sslclient"), ("serving.pem", "sslserver")] {
        let (ok, out) = openssl(
            &["verify", "-purpose", purpose, "-CAfile", "ca.pem", cert],
            dir.path(),
        );
        assert!(ok, "{cert} as {purpose}: {out}");
    }
    let (ok, out) = openssl(
        &[
            "verify",
            "-purpose",
            "sslserver",
            "-CAfile",
            "ca.pem",
            "client.pem",
        ],
        dir.path(),
    );
    assert!(!ok, "the client certificate serves: {out}");
    let (ok, sans) = openssl(
        &[
            "x509",
            "-noout",
            "-ext",
            "subjectAltName",
            "-in",
            "serving.pem",
        ],
        dir.path(),
    );
    assert!(ok, "{sans}");
    assert!(
        sans.contains(&format!("DNS:{NAME}")) && sans.contains("IP Address:10.0.1.31"),
        "{sans}"
    );
}

#[test]
fn systemd_analyze_verify_accepts_the_worker_units() {
    let (_, bundle) = worker();
    let root = tempfile::tempdir().unwrap();
    write_root(&bundle, root.path());
    let systemd_dir = root.path().join("usr/lib/systemd");
    std::fs::create_dir_all(&systemd_dir).unwrap();
    assert!(
        Command::new("cp")
            .args(["-r", "/usr/lib/systemd/system"])
            .arg(&systemd_dir)
            .status()
            .unwrap()
            .success()
    );
    for artifact in &bundle.artifacts {
        crate::render_validators::write_root_executable(root.path(), artifact.dest.as_str());
    }
    // The balancer is the agent the image carries.
    crate::render_validators::write_root_executable(root.path(), "/usr/bin/exk8s-agent");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.path().display()))
        .args([
            PATHS.kubelet_unit,
            PATHS.balancer_socket,
            PATHS.balancer_unit,
        ])
        .output()
        .expect("systemd-analyze must be installed");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}
