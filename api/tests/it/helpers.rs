//! Shared test helpers: a fixture cluster PKI per algorithm (built once, shared by tests),
//! certificate inspection through x509-parser, and openssl as an independent verifier.

use exk8s_common::contract::Role;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use exk8s_api::pki::{
    BundleCerts, ClusterNetwork, ClusterPki, KeyAlgorithm, NodeAddresses, NodeServingCerts,
    ServiceCidr,
};
use time::OffsetDateTime;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::X509Certificate;

/// A founded cluster's PKI with three nodes, each node's serving certs and two nodes' bundles.
pub struct ClusterFixture {
    pub now: OffsetDateTime,
    pub nodes: Vec<NodeAddresses>,
    pub pki: ClusterPki,
    pub serving: Vec<NodeServingCerts>,
    pub bundles: Vec<BundleCerts>,
}

pub fn network() -> ClusterNetwork {
    ClusterNetwork::new(
        ServiceCidr::parse("10.96.0.0/12").unwrap(),
        "cluster.local",
        "exk8s-7-2a.k8s.example.com",
    )
    .unwrap()
}

/// Node 1 has every kind of address; nodes 2 and 3 only a private IPv4.
pub fn nodes() -> Vec<NodeAddresses> {
    (1u8..=3)
        .map(|i| NodeAddresses {
            name: format!("cp-{i}.cluster-42.internal").parse().unwrap(),
            private_ipv4: Ipv4Addr::new(10, 0, 0, 10 + i),
            private_ipv6: (i == 1).then(|| Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x11)),
            public_ipv4: (i == 1).then_some(Ipv4Addr::new(203, 0, 113, 11)),
        })
        .collect()
}

fn build(algorithm: KeyAlgorithm) -> ClusterFixture {
    let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
    let network = network();
    let nodes = nodes();
    let pki = ClusterPki::generate(algorithm, now).unwrap();
    let serving = nodes
        .iter()
        .map(|n| NodeServingCerts::generate(&pki, n, &network, now).unwrap())
        .collect();
    let bundles = nodes[..2]
        .iter()
        .map(|n| BundleCerts::mint(&pki, n, Role::ControlPlane, now).unwrap())
        .collect();
    ClusterFixture {
        now,
        nodes,
        pki,
        serving,
        bundles,
    }
}

/// The fixture for `algorithm`, built on first use (RSA-4096 keys take a while).
pub fn cluster(algorithm: KeyAlgorithm) -> &'static ClusterFixture {
    static FIXTURES: [OnceLock<ClusterFixture>; 5] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    let index = KeyAlgorithm::ALL
        .iter()
        .position(|a| *a == algorithm)
        .unwrap();
    FIXTURES[index].get_or_init(|| build(algorithm))
}

/// Decodes a PEM certificate into DER.
pub fn der(pem_text: &str) -> Vec<u8> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem_text.as_bytes()).unwrap();
    assert_eq!(pem.label, "CERTIFICATE");
    pem.contents
}

/// What a test wants to know about a certificate, read by x509-parser.
#[derive(Debug)]
pub struct CertFacts {
    pub subject_cn: String,
    pub subject_o: Vec<String>,
    pub issuer_cn: String,
    pub is_ca: Option<bool>,
    pub basic_constraints_critical: bool,
    pub key_usage: Vec<&'static str>,
    pub key_usage_critical: bool,
    pub server_auth: bool,
    pub client_auth: bool,
    pub has_eku: bool,
    pub dns_names: BTreeSet<String>,
    pub ips: BTreeSet<IpAddr>,
    pub subject_key_id: Option<Vec<u8>>,
    pub authority_key_id: Option<Vec<u8>>,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    pub serial: Vec<u8>,
    pub signature_oid: String,
}

pub fn facts(pem_text: &str) -> CertFacts {
    let der = der(pem_text);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    facts_of(&cert)
}

fn facts_of(cert: &X509Certificate<'_>) -> CertFacts {
    let names = |it: &mut dyn Iterator<Item = &x509_parser::x509::AttributeTypeAndValue<'_>>| {
        it.map(|a| a.as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let bc = cert.basic_constraints().unwrap();
    let ku = cert.key_usage().unwrap();
    let eku = cert.extended_key_usage().unwrap();
    let mut dns_names = BTreeSet::new();
    let mut ips = BTreeSet::new();
    if let Some(san) = cert.subject_alternative_name().unwrap() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(n) => {
                    dns_names.insert((*n).to_owned());
                }
                GeneralName::IPAddress(raw) => {
                    let ip = match raw.len() {
                        4 => IpAddr::from(<[u8; 4]>::try_from(*raw).unwrap()),
                        16 => IpAddr::from(<[u8; 16]>::try_from(*raw).unwrap()),
                        n => panic!("IP SAN of {n} bytes"),
                    };
                    ips.insert(ip);
                }
                other => panic!("unexpected SAN {other:?}"),
            }
        }
    }
    let mut subject_key_id = None;
    let mut authority_key_id = None;
    for ext in cert.iter_extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(id) => subject_key_id = Some(id.0.to_vec()),
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                authority_key_id = aki.key_identifier.as_ref().map(|id| id.0.to_vec());
            }
            _ => {}
        }
    }
    let mut key_usage = Vec::new();
    if let Some(ku) = &ku {
        let v = ku.value;
        for (on, name) in [
            (v.digital_signature(), "digitalSignature"),
            (v.non_repudiation(), "nonRepudiation"),
            (v.key_encipherment(), "keyEncipherment"),
            (v.data_encipherment(), "dataEncipherment"),
            (v.key_agreement(), "keyAgreement"),
            (v.key_cert_sign(), "keyCertSign"),
            (v.crl_sign(), "cRLSign"),
        ] {
            if on {
                key_usage.push(name);
            }
        }
    }
    CertFacts {
        subject_cn: names(&mut cert.subject().iter_common_name()).join(","),
        subject_o: names(&mut cert.subject().iter_organization()),
        issuer_cn: names(&mut cert.issuer().iter_common_name()).join(","),
        is_ca: bc.as_ref().map(|b| b.value.ca),
        basic_constraints_critical: bc.as_ref().is_some_and(|b| b.critical),
        key_usage,
        key_usage_critical: ku.as_ref().is_some_and(|k| k.critical),
        server_auth: eku.as_ref().is_some_and(|e| e.value.server_auth),
        client_auth: eku.as_ref().is_some_and(|e| e.value.client_auth),
        has_eku: eku.is_some(),
        dns_names,
        ips,
        subject_key_id,
        authority_key_id,
        not_before: cert.validity().not_before.to_datetime(),
        not_after: cert.validity().not_after.to_datetime(),
        serial: cert.raw_serial().to_vec(),
        signature_oid: cert.signature_algorithm.algorithm.to_id_string(),
    }
}

/// Runs openssl; returns (success, combined output). openssl is required: scripts/test.sh
/// installs it, and a missing openssl fails the test rather than skipping it.
pub fn openssl(args: &[&str], dir: &Path) -> (bool, String) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl must be installed (scripts/test.sh installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

// ---------------------------------------------------------------------------------------------
// Rendering helpers

use exk8s_api::render::{
    ArtifactCatalog, ClusterSpec, ControlPlaneNode, EncryptionKey, Issuance, NodeCredentials,
    PodCidr, RenderInput, Versions, render_bundle,
};
use exk8s_common::payload::BundlePayload;

pub const FIXED_ISSUED_AT: i64 = 1_767_225_600;

pub fn cluster_spec(network: ClusterNetwork) -> ClusterSpec {
    ClusterSpec {
        cluster_id: 42,
        org_id: 7,
        name: "exk8s-7-2a".parse().unwrap(),
        network,
        pod_cidr: PodCidr::parse("172.16.0.0/12").unwrap(),
        pod_network: exk8s_api::cluster::spec::PodNetwork::Cilium,
        versions: Versions::default(),
        encryption_key: EncryptionKey::from_bytes([7; 32]),
    }
}

/// Control-plane nodes at the given private IPv4 addresses; the first is the initial node.
pub fn control_plane(ips: &[Ipv4Addr]) -> Vec<ControlPlaneNode> {
    ips.iter()
        .enumerate()
        .map(|(i, ip)| ControlPlaneNode {
            vm_id: 101 + i as u64,
            addresses: NodeAddresses {
                name: format!("cp-{}.cluster-42.internal", i + 1).parse().unwrap(),
                private_ipv4: *ip,
                private_ipv6: None,
                public_ipv4: None,
            },
            is_initial: i == 0,
            membership: exk8s_api::render::Membership::Voter,
        })
        .collect()
}

pub fn issuance(serial: u64) -> Issuance {
    Issuance {
        bundle_id: "6f1c1a52-3c7e-4d4e-9a55-0b0f6d1e2a01".parse().unwrap(),
        issued_at: FIXED_ISSUED_AT,
        expires_at: FIXED_ISSUED_AT + 900,
        serial,
        nonce: "fixture-nonce-0123456789".parse().unwrap(),
        kind: exk8s_common::contract::BundleKind::Bootstrap,
        generation: 1,
        drains: Vec::new(),
    }
}

/// A cluster rendered with real certificates: PKI, nodes, and one bundle per node.
pub struct RenderedCluster {
    pub pki: ClusterPki,
    pub spec: ClusterSpec,
    pub nodes: Vec<ControlPlaneNode>,
    pub bundles: Vec<BundlePayload>,
}

pub fn render_cluster(ips: &[Ipv4Addr], algorithm: KeyAlgorithm) -> RenderedCluster {
    render_nodes(control_plane(ips), algorithm)
}

/// Every node of `nodes` rendered (as peers of each other) with real certificates.
pub fn render_nodes(nodes: Vec<ControlPlaneNode>, algorithm: KeyAlgorithm) -> RenderedCluster {
    render_nodes_of(&cluster_spec(network()), nodes, algorithm)
}

/// [`render_nodes`] for the cluster `spec`.
pub fn render_nodes_of(
    spec: &ClusterSpec,
    nodes: Vec<ControlPlaneNode>,
    algorithm: KeyAlgorithm,
) -> RenderedCluster {
    let now = OffsetDateTime::now_utc();
    let pki = ClusterPki::generate(algorithm, now).unwrap();
    let bundles = nodes
        .iter()
        .map(|node| {
            let serving =
                NodeServingCerts::generate(&pki, &node.addresses, &spec.network, now).unwrap();
            let minted = BundleCerts::mint(&pki, &node.addresses, Role::ControlPlane, now).unwrap();
            render_bundle(&RenderInput {
                cluster: spec,
                node,
                peers: &nodes,
                credentials: NodeCredentials {
                    cluster_ca_pem: pki.cluster_ca.cert_pem(),
                    etcd_ca_pem: pki.etcd_ca.cert_pem(),
                    front_proxy_ca_pem: pki.front_proxy_ca.cert_pem(),
                    service_account: &pki.service_account,
                    service_account_public_pem: &pki.service_account.public_pem,
                    serving: &serving,
                    minted: &minted,
                },
                issuance: &issuance(1),
                artifacts: &ArtifactCatalog::default(),
                update_wait_secs: exk8s_api::render::DEFAULT_UPDATE_WAIT_SECS,
            })
            .unwrap()
        })
        .collect();
    RenderedCluster {
        pki,
        spec: spec.clone(),
        nodes,
        bundles,
    }
}

/// A file's content as text.
pub fn text<'a>(bundle: &'a BundlePayload, path: &str) -> &'a str {
    let file = bundle
        .file(path)
        .unwrap_or_else(|| panic!("bundle has no {path}"));
    std::str::from_utf8(file.content.as_bytes()).unwrap()
}

/// Finds a tool the test suite needs: `$env_var`, then `.venv/bin/<name>` in the workspace,
/// then PATH. Panics (never skips) when missing: scripts/test.sh installs it.
pub fn tool(name: &str, env_var: &str) -> std::path::PathBuf {
    if let Some(p) = std::env::var_os(env_var) {
        return p.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.venv/bin")
        .join(name);
    if venv.exists() {
        return venv;
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| panic!("{name} is required; run scripts/test.sh, which installs it"))
}

/// `openssl verify` of `leaf_pem` against `ca_pem` alone (at `at`, unix seconds, when given).
pub fn openssl_verify(ca_pem: &[u8], leaf_pem: &[u8], at: Option<i64>) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca_pem).unwrap();
    std::fs::write(dir.path().join("leaf.pem"), leaf_pem).unwrap();
    let at = at.map(|t| t.to_string());
    let mut args = vec!["verify"];
    if let Some(at) = &at {
        args.extend(["-attime", at.as_str()]);
    }
    args.extend(["-CAfile", "ca.pem", "leaf.pem"]);
    openssl(&args, dir.path())
}
