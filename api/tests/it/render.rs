//! Rendering: golden files for fixed inputs and consistency between files, units and manifests
//! (`render_validators` checks the output with real tools).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

use exk8s_api::pki::{
    BundleCerts, ControlPlaneCerts, IssuedCert, KeyAlgorithm, NodeCerts, NodeServingCerts,
    SecretPem, ServiceAccountKey,
};
use exk8s_api::render::paths::PATHS;
use exk8s_api::render::{
    ArtifactCatalog, Issuance, NodeCredentials, RenderError, RenderInput, render_bundle,
    render_userdata,
};
use exk8s_common::payload::{BundlePayload, PlanStep};

use crate::helpers::{
    RenderedCluster, cluster_spec, control_plane, facts, issuance, network, render_cluster, text,
};

// --- golden files ------------------------------------------------------------------------

fn fake(name: &str) -> IssuedCert {
    IssuedCert {
        cert_pem: format!(
            "-----BEGIN CERTIFICATE-----\nFIXTURE {name}\n-----END CERTIFICATE-----\n"
        ),
        key_pem: SecretPem::new(format!(
            "-----BEGIN PRIVATE KEY-----\nFIXTURE {name}\n-----END PRIVATE KEY-----\n"
        )),
        minted: None,
    }
}

/// Renders with fixed, fake credentials so output is stable byte for byte.
pub(crate) fn golden(ips: &[Ipv4Addr], node_index: usize) -> BundlePayload {
    golden_as(ips, node_index, &issuance(7))
}

pub(crate) fn golden_as(ips: &[Ipv4Addr], node_index: usize, issued: &Issuance) -> BundlePayload {
    golden_waiting(
        ips,
        node_index,
        issued,
        exk8s_api::render::DEFAULT_UPDATE_WAIT_SECS,
    )
}

/// [`golden_as`] rendered with `update_wait_secs` (`--update-wait-secs`).
pub(crate) fn golden_waiting(
    ips: &[Ipv4Addr],
    node_index: usize,
    issued: &Issuance,
    update_wait_secs: u32,
) -> BundlePayload {
    let spec = cluster_spec(network());
    let nodes = control_plane(ips);
    let serving = NodeServingCerts {
        apiserver: fake("apiserver"),
        etcd_server: fake("etcd-server"),
        etcd_peer: fake("etcd-peer"),
    };
    let minted = BundleCerts::ControlPlane {
        node: NodeCerts {
            kubelet_serving: fake("kubelet"),
            kubelet_client: fake("kubelet-client"),
            kube_proxy: fake("kube-proxy"),
        },
        control_plane: Box::new(ControlPlaneCerts {
            apiserver_kubelet_client: fake("apiserver-kubelet-client"),
            apiserver_etcd_client: fake("apiserver-etcd-client"),
            front_proxy_client: fake("front-proxy-client"),
            etcd_healthcheck_client: fake("etcd-healthcheck-client"),
            controller_manager: fake("controller-manager"),
            scheduler: fake("scheduler"),
            admin: fake("admin"),
            super_admin: fake("super-admin"),
        }),
    };
    let sa = ServiceAccountKey {
        public_pem: "-----BEGIN PUBLIC KEY-----\nFIXTURE sa\n-----END PUBLIC KEY-----\n".into(),
        private_pem: SecretPem::new(
            "-----BEGIN PRIVATE KEY-----\nFIXTURE sa\n-----END PRIVATE KEY-----\n".into(),
        ),
    };
    render_bundle(&RenderInput {
        cluster: &spec,
        node: &nodes[node_index],
        peers: &nodes,
        credentials: NodeCredentials {
            cluster_ca_pem: "FIXTURE cluster CA\n",
            etcd_ca_pem: "FIXTURE etcd CA\n",
            front_proxy_ca_pem: "FIXTURE front-proxy CA\n",
            service_account: &sa,
            service_account_public_pem: &sa.public_pem,
            serving: &serving,
            minted: &minted,
        },
        issuance: issued,
        artifacts: &ArtifactCatalog::default(),
        update_wait_secs,
    })
    .unwrap()
}

/// The whole bundle as reviewable text: every file with its mode, then artifacts and plan.
fn describe(bundle: &BundlePayload) -> String {
    let mut out = String::new();
    for file in &bundle.files {
        let body = String::from_utf8_lossy(file.content.as_bytes());
        out.push_str(&format!(
            "### {} ({}, {}:{})\n{body}\n",
            file.path, file.mode, file.owner, file.group
        ));
    }
    out.push_str("### artifacts\n");
    out.push_str(&serde_json::to_string_pretty(&bundle.artifacts).unwrap());
    out.push_str("\n### packages\n");
    out.push_str(&serde_json::to_string_pretty(&bundle.packages).unwrap());
    out.push_str("\n### plan\n");
    out.push_str(&serde_json::to_string_pretty(&bundle.plan).unwrap());
    out.push('\n');
    out
}

/// Issuance renders and serialises a bundle before its transaction takes the serial and the
/// generation, then puts them in the payload's head: nothing else may depend on them.
#[test]
fn only_the_head_depends_on_the_serial_and_generation() {
    let first = golden_as(&ips(3), 1, &issuance(7));
    let mut later = issuance(8);
    later.generation = 5;
    let second = golden_as(&ips(3), 1, &later);
    assert_ne!(first.freshness, second.freshness);
    assert_ne!(first.identity, second.identity);
    assert_eq!(first.files, second.files);
    assert_eq!(first.artifacts, second.artifacts);
    assert_eq!(first.packages, second.packages);
    assert_eq!(first.plan, second.plan);
}

pub(crate) fn ips(n: u8) -> Vec<Ipv4Addr> {
    (1..=n).map(|i| Ipv4Addr::new(10, 0, 0, 10 + i)).collect()
}

#[test]
fn golden_one_node_cluster() {
    insta::assert_snapshot!("one_node_initial", describe(&golden(&ips(1), 0)));
}

#[test]
fn golden_three_node_cluster() {
    insta::assert_snapshot!("three_node_initial", describe(&golden(&ips(3), 0)));
    insta::assert_snapshot!("three_node_second", describe(&golden(&ips(3), 1)));
}

#[test]
fn golden_userdata() {
    let userdata = render_userdata(
        "https://k8sapi.example.com",
        "http://169.254.169.254",
        false,
    )
    .unwrap();
    insta::assert_snapshot!("userdata", userdata);
}

// --- consistency, on bundles with real certificates ---------------------------------------

pub(crate) fn real() -> &'static RenderedCluster {
    static CLUSTER: OnceLock<RenderedCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| render_cluster(&ips(3), KeyAlgorithm::EcdsaP256))
}

pub(crate) fn yaml_docs(text: &str) -> Vec<yaml_serde::Value> {
    use serde::Deserialize;
    yaml_serde::Deserializer::from_str(text)
        .map(|doc| yaml_serde::Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// The words of a unit's ExecStart (continuation lines joined).
fn exec_start(unit: &str) -> Vec<String> {
    let joined = unit.replace("\\\n", " ");
    let line = joined
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("unit has ExecStart");
    line.split_whitespace().map(str::to_owned).collect()
}

/// `--flag=value` → value, for every flag.
pub(crate) fn flag<'a>(args: &'a [String], name: &str) -> Vec<&'a str> {
    let prefix = format!("--{name}=");
    args.iter()
        .filter_map(|a| a.strip_prefix(prefix.as_str()))
        .collect()
}

pub(crate) fn pod_command(manifest: &str) -> Vec<String> {
    let doc = &yaml_docs(manifest)[0];
    doc["spec"]["containers"][0]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// Absolute paths that are node directories or binaries rather than bundle files.
fn node_owned(path: &str) -> bool {
    [
        PATHS.etcd_data_dir,
        PATHS.audit_log_dir,
        PATHS.static_pod_dir,
        PATHS.kubelet_config_dir,
    ]
    .iter()
    .any(|dir| path == *dir || path.starts_with(&format!("{dir}/")))
        || path == PATHS.containerd_socket
}

fn absolute_values(args: &[String]) -> Vec<&str> {
    args.iter()
        .filter_map(|a| a.split_once('=').map(|(_, v)| v))
        .filter(|v| v.starts_with('/'))
        .collect()
}

#[test]
fn every_path_a_unit_or_manifest_names_is_in_the_bundle() {
    // systemd makes the kubelet's drop-in directory from ConfigurationDirectory=, which is
    // relative to /etc.
    assert!(PATHS.kubelet_config_dir.starts_with("/etc/"));
    for bundle in &real().bundles {
        let kubelet = text(bundle, PATHS.kubelet_unit);
        let made = format!(
            "ConfigurationDirectory={}",
            &PATHS.kubelet_config_dir["/etc/".len()..]
        );
        assert!(kubelet.lines().any(|l| l == made), "{made} in {kubelet}");
        assert_eq!(
            flag(&exec_start(kubelet), "config-dir"),
            [PATHS.kubelet_config_dir]
        );
        let exists = |path: &str| bundle.file(path).is_some() || node_owned(path);
        for unit in [PATHS.etcd_unit, PATHS.kubelet_unit] {
            let args = exec_start(text(bundle, unit));
            let installed = bundle.artifacts.iter().any(|a| a.dest.as_str() == args[0]);
            assert!(
                installed,
                "{unit} runs {}, which the bundle does not install",
                args[0]
            );
            for path in absolute_values(&args) {
                assert!(exists(path), "{unit} names {path}, which the bundle lacks");
            }
        }
        for manifest in [
            PATHS.apiserver_manifest,
            PATHS.controller_manager_manifest,
            PATHS.scheduler_manifest,
        ] {
            let doc = &yaml_docs(text(bundle, manifest))[0];
            let mounts: BTreeSet<&str> = doc["spec"]["volumes"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|v| v["hostPath"]["path"].as_str().unwrap())
                .collect();
            for volume in doc["spec"]["volumes"].as_sequence().unwrap() {
                let path = volume["hostPath"]["path"].as_str().unwrap();
                if volume["hostPath"]["type"] == "File" {
                    assert!(
                        bundle.file(path).is_some(),
                        "{manifest} mounts missing file {path}"
                    );
                }
            }
            for path in absolute_values(&pod_command(text(bundle, manifest))) {
                let mounted = mounts
                    .iter()
                    .any(|m| path == *m || path.starts_with(&format!("{m}/")));
                assert!(mounted, "{manifest} uses {path} without mounting it");
                assert!(
                    exists(path),
                    "{manifest} names {path}, which the bundle lacks"
                );
            }
        }
        let kubelet_config = &yaml_docs(text(bundle, PATHS.kubelet_config))[0];
        for key in ["tlsCertFile", "tlsPrivateKeyFile"] {
            assert!(exists(kubelet_config[key].as_str().unwrap()), "{key}");
        }
        assert_eq!(
            kubelet_config["tlsCertFile"], PATHS.kubelet_cert,
            "serving cert, not client"
        );
        assert!(exists(
            kubelet_config["authentication"]["x509"]["clientCAFile"]
                .as_str()
                .unwrap()
        ));
        for step in &bundle.plan {
            let paths: Vec<&str> = match step {
                PlanStep::WaitEtcdHealthy {
                    ca_file,
                    cert_file,
                    key_file,
                    ..
                } => {
                    vec![ca_file.as_str(), cert_file.as_str(), key_file.as_str()]
                }
                PlanStep::WaitApiserverReady { kubeconfig, .. } => vec![kubeconfig.as_str()],
                PlanStep::KubectlApply { kubeconfig, file } => {
                    vec![kubeconfig.as_str(), file.as_str()]
                }
                PlanStep::HelmInstall {
                    kubeconfig,
                    values_file,
                    ..
                } => {
                    vec![kubeconfig.as_str(), values_file.as_str()]
                }
                PlanStep::WaitRollout { kubeconfig, .. } => vec![kubeconfig.as_str()],
                PlanStep::EnableStart { watch, .. } => watch.iter().map(|p| p.as_str()).collect(),
                _ => vec![],
            };
            for path in paths {
                assert!(
                    bundle.file(path).is_some(),
                    "plan step {step:?} names missing {path}"
                );
            }
        }
    }
}

#[test]
fn modes_are_exact_keys_and_kubeconfigs_private() {
    for bundle in &real().bundles {
        for file in &bundle.files {
            let path = file.path.as_str();
            let secret = path.ends_with("-key.pem")
                || path.ends_with(".kubeconfig")
                || path == PATHS.encryption_config;
            if secret {
                assert_eq!(file.mode.to_string(), "0600", "{path}");
            }
            if path.ends_with(".pem") && !path.ends_with("-key.pem") {
                assert_eq!(file.mode.to_string(), "0644", "{path}");
            }
            assert_eq!(file.owner.as_str(), "root", "{path}");
            assert!(
                !file.mode.is_private() || secret || path.starts_with(PATHS.static_pod_dir),
                "{path}"
            );
        }
    }
}

#[test]
fn no_ca_private_key_ever_reaches_a_node() {
    let cluster = real();
    for bundle in &cluster.bundles {
        for file in &bundle.files {
            let content = String::from_utf8_lossy(file.content.as_bytes());
            for ca in [
                &cluster.pki.cluster_ca,
                &cluster.pki.etcd_ca,
                &cluster.pki.front_proxy_ca,
            ] {
                let key = ca.key_pem().expose();
                let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
                assert!(!content.contains(key), "{} holds a CA key", file.path);
                assert!(
                    !content.replace('\n', "").contains(&body),
                    "{} holds a CA key",
                    file.path
                );
            }
        }
    }
}

#[test]
fn etcd_servers_are_the_peers_client_urls_and_the_cert_covers_the_advertise_address() {
    let cluster = real();
    let expected: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("https://{}:2379", n.addresses.private_ipv4))
        .collect();
    for (bundle, node) in cluster.bundles.iter().zip(&cluster.nodes) {
        let cmd = pod_command(text(bundle, PATHS.apiserver_manifest));
        assert_eq!(flag(&cmd, "etcd-servers"), [expected.join(",")]);
        let advertise: IpAddr = flag(&cmd, "advertise-address")[0].parse().unwrap();
        assert_eq!(advertise, IpAddr::V4(node.addresses.private_ipv4));
        let cert = facts(text(bundle, PATHS.apiserver_cert));
        assert!(
            cert.ips.contains(&advertise),
            "apiserver cert lacks {advertise}"
        );
        let vip = cluster.spec.network.service_cidr.api_service_ip();
        assert!(
            cert.ips.contains(&vip),
            "apiserver cert lacks the service VIP"
        );

        let etcd = exec_start(text(bundle, PATHS.etcd_unit));
        let bootstrap = text(bundle, PATHS.etcd_bootstrap_env);
        let initial = bootstrap
            .lines()
            .find_map(|l| l.strip_prefix("ETCD_INITIAL_CLUSTER="))
            .unwrap();
        assert_eq!(initial.split(',').count(), cluster.nodes.len());
        assert_eq!(flag(&etcd, "name"), [node.addresses.name.as_str()]);
        assert_eq!(
            flag(&etcd, "listen-client-urls"),
            [format!(
                "https://{}:2379,https://127.0.0.1:2379",
                node.addresses.private_ipv4
            )
            .as_str()]
        );
    }
}

#[test]
fn cluster_dns_is_the_coredns_service_ip_inside_the_service_cidr() {
    let cluster = real();
    let bundle = &cluster.bundles[0];
    let kubelet = &yaml_docs(text(bundle, PATHS.kubelet_config))[0];
    let cluster_dns: IpAddr = kubelet["clusterDNS"][0].as_str().unwrap().parse().unwrap();
    let service = yaml_docs(text(bundle, PATHS.coredns_manifest))
        .into_iter()
        .find(|d| d["kind"] == "Service")
        .unwrap();
    let dns_ip: IpAddr = service["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(cluster_dns, dns_ip);
    assert!(cluster.spec.network.service_cidr.contains(dns_ip));
    let deployment = yaml_docs(text(bundle, PATHS.coredns_manifest))
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    assert_eq!(deployment["spec"]["replicas"], 2);
}

#[test]
fn rendering_refuses_inconsistent_inputs() {
    let cluster = real();
    let spec = &cluster.spec;
    let mut nodes = cluster.nodes.clone();
    nodes[1].is_initial = true;
    let serving = NodeServingCerts {
        apiserver: fake("a"),
        etcd_server: fake("b"),
        etcd_peer: fake("c"),
    };
    let minted = golden_minted();
    let input = |node, peers| RenderInput {
        cluster: spec,
        node,
        peers,
        credentials: NodeCredentials {
            cluster_ca_pem: "x",
            etcd_ca_pem: "x",
            front_proxy_ca_pem: "x",
            service_account: &cluster.pki.service_account,
            service_account_public_pem: &cluster.pki.service_account.public_pem,
            serving: &serving,
            minted: &minted,
        },
        issuance: Box::leak(Box::new(issuance(1))),
        artifacts: Box::leak(Box::new(ArtifactCatalog::default())),
        update_wait_secs: exk8s_api::render::DEFAULT_UPDATE_WAIT_SECS,
    };
    let err = render_bundle(&input(&nodes[0], &nodes)).unwrap_err();
    assert!(matches!(err, RenderError::InitialNodes(2)), "{err}");
    let stranger = &control_plane(&[Ipv4Addr::new(10, 9, 9, 9)])[0];
    let err = render_bundle(&input(stranger, &cluster.nodes)).unwrap_err();
    assert!(matches!(err, RenderError::NodeNotInPeers(_)), "{err}");
    assert!(render_userdata("ftp://x", "http://imds", false).is_err());
}

fn golden_minted() -> BundleCerts {
    BundleCerts::ControlPlane {
        node: NodeCerts {
            kubelet_serving: fake("1"),
            kubelet_client: fake("2"),
            kube_proxy: fake("7"),
        },
        control_plane: Box::new(ControlPlaneCerts {
            apiserver_kubelet_client: fake("3"),
            apiserver_etcd_client: fake("4"),
            front_proxy_client: fake("5"),
            etcd_healthcheck_client: fake("6"),
            controller_manager: fake("8"),
            scheduler: fake("9"),
            admin: fake("10"),
            super_admin: fake("11"),
        }),
    }
}
