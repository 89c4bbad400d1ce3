//! The PKI's single cases: stored CAs reload and keep signing, bad CAs and inputs are refused,
//! lifetimes are bounded by the CA, kubeconfigs carry their identity, key material never
//! prints, and minting follows the node's role.

use exk8s_api::pki::kubeconfig::{self, KubeconfigSpec};
use exk8s_api::pki::{
    BundleCerts, CaKey, CaRole, CertAuthority, ClusterPki, KeyAlgorithm, PkiError, ServiceCidr,
};
use exk8s_common::names::NodeName;
use time::Duration;

use crate::helpers::{cluster, facts};
use crate::pki::verify;

#[test]
fn a_stored_ca_reloads_from_pem_and_keeps_signing() {
    let f = cluster(KeyAlgorithm::EcdsaP256);
    let stored = &f.pki.etcd_ca;
    let reloaded = CertAuthority::from_pem(
        CaRole::Etcd,
        stored.cert_pem(),
        stored.key_pem().clone(),
        KeyAlgorithm::EcdsaP256,
    )
    .unwrap();
    assert_eq!(reloaded.not_after(), stored.not_after());
    assert_eq!(reloaded.key_kind(), CaKey::EcdsaP256);
    let spec = exk8s_api::pki::etcd_member_spec(&f.nodes[2]);
    let leaf = reloaded.issue(&spec, f.now).unwrap();
    assert_eq!(
        facts(&leaf.cert_pem).authority_key_id,
        facts(stored.cert_pem()).subject_key_id
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), stored.cert_pem()).unwrap();
    std::fs::write(dir.path().join("leaf.pem"), &leaf.cert_pem).unwrap();
    let (ok, out) = verify(dir.path(), "ca.pem", "sslserver", "leaf.pem", &[]);
    assert!(ok, "{out}");

    let rsa = cluster(KeyAlgorithm::Rsa3072);
    let reloaded = CertAuthority::from_pem(
        CaRole::Cluster,
        rsa.pki.cluster_ca.cert_pem(),
        rsa.pki.cluster_ca.key_pem().clone(),
        KeyAlgorithm::Rsa3072,
    )
    .unwrap();
    assert_eq!(reloaded.key_kind(), CaKey::Rsa { bits: 3072 });
}

#[test]
fn a_ca_with_the_wrong_key_or_a_leaf_posing_as_ca_is_refused() {
    let f = cluster(KeyAlgorithm::EcdsaP256);
    let err = CertAuthority::from_pem(
        CaRole::Etcd,
        f.pki.etcd_ca.cert_pem(),
        f.pki.cluster_ca.key_pem().clone(),
        KeyAlgorithm::EcdsaP256,
    )
    .unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
    let leaf = &f.serving[0].apiserver;
    let err = CertAuthority::from_pem(
        CaRole::Cluster,
        &leaf.cert_pem,
        leaf.key_pem.clone(),
        KeyAlgorithm::EcdsaP256,
    )
    .unwrap_err();
    assert!(err.to_string().contains("not a CA"), "{err}");
    assert!(!err.to_string().contains("PRIVATE"), "{err}");
}

#[test]
fn a_leaf_never_outlives_its_ca_and_an_expired_ca_signs_nothing() {
    let f = cluster(KeyAlgorithm::EcdsaP256);
    let ca = &f.pki.cluster_ca;
    let spec = exk8s_api::pki::ClientIdentity::Admin.spec();
    let late = f.now + Duration::days(3650 - 30);
    let leaf = ca.issue(&spec, late).unwrap();
    assert_eq!(facts(&leaf.cert_pem).not_after, ca.not_after());
    let err = ca.issue(&spec, f.now + Duration::days(3651)).unwrap_err();
    assert!(matches!(err, PkiError::CaExpired { .. }), "{err}");
}

#[test]
fn bad_inputs_are_refused_with_a_reason() {
    for bad in ["ed25519", "rsa-1024", "dsa"] {
        let err = bad.parse::<KeyAlgorithm>().unwrap_err();
        assert!(err.to_string().contains("unknown key algorithm"), "{err}");
    }
    // Node names: empty and uppercase are refused, never silently lower-cased, because the
    // kubelet's CN must equal the registered node name byte for byte.
    assert!(NodeName::new("").is_err());
    assert!(NodeName::new("CP-1.cluster-42.internal").is_err());
    for cidr in ["10.96.0.1/12", "10.96.0.0", "not-a-cidr"] {
        let err = ServiceCidr::parse(cidr).unwrap_err();
        assert!(matches!(err, PkiError::BadServiceCidr(..)), "{cidr}: {err}");
    }
}

#[test]
fn kubeconfigs_carry_the_identity_and_survive_odd_names() {
    let f = cluster(KeyAlgorithm::EcdsaP256);
    let admin = &f.bundles[0].control_plane().unwrap().admin;
    let rendered = kubeconfig::render(&KubeconfigSpec {
        cluster_name: "odd: name # not a comment",
        server: "https://127.0.0.1:6443",
        ca_pem: f.pki.cluster_ca.cert_pem(),
        user: "exk8s-admin",
        credentials: admin,
    });
    let doc: yaml_serde::Value = yaml_serde::from_str(rendered.expose()).unwrap();
    let b64 = |v: &yaml_serde::Value| {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap();
        String::from_utf8(bytes).unwrap()
    };
    assert_eq!(doc["kind"], "Config");
    let cluster = &doc["clusters"][0];
    assert_eq!(cluster["name"], "odd: name # not a comment");
    assert_eq!(cluster["cluster"]["server"], "https://127.0.0.1:6443");
    assert_eq!(
        b64(&cluster["cluster"]["certificate-authority-data"]),
        f.pki.cluster_ca.cert_pem()
    );
    let user = &doc["users"][0];
    assert_eq!(user["name"], "exk8s-admin");
    assert_eq!(
        b64(&user["user"]["client-certificate-data"]),
        admin.cert_pem
    );
    assert_eq!(
        b64(&user["user"]["client-key-data"]),
        admin.key_pem.expose()
    );
    assert_eq!(doc["current-context"], doc["contexts"][0]["name"]);
    assert_eq!(
        doc["contexts"][0]["context"]["cluster"],
        "odd: name # not a comment"
    );
    assert_eq!(format!("{rendered:?}"), "[redacted]");
}

#[test]
fn key_material_never_prints() {
    let f = cluster(KeyAlgorithm::EcdsaP256);
    let debug = format!("{:?} {:?} {:?}", f.pki, f.serving[0], f.bundles[0]);
    assert!(!debug.contains("PRIVATE KEY"), "{debug}");
    assert!(debug.contains("[redacted]"));
}

#[test]
fn the_service_account_key_follows_the_cluster_algorithm() {
    for alg in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::Rsa2048] {
        let pki: &ClusterPki = &cluster(alg).pki;
        assert_eq!(pki.algorithm, alg);
        assert!(
            pki.service_account
                .private_pem
                .expose()
                .contains("PRIVATE KEY")
        );
    }
}

#[test]
fn a_worker_bundle_mints_only_what_every_node_carries() {
    let f = cluster(KeyAlgorithm::EcdsaP256);
    let now = f.now;
    let worker = BundleCerts::mint(
        &f.pki,
        &f.nodes[0],
        exk8s_common::contract::Role::Worker,
        now,
    )
    .unwrap();
    assert!(worker.control_plane().is_none());
    assert!(matches!(worker, BundleCerts::Worker { .. }));
    let control_plane = BundleCerts::mint(
        &f.pki,
        &f.nodes[0],
        exk8s_common::contract::Role::ControlPlane,
        now,
    )
    .unwrap();
    assert!(control_plane.control_plane().is_some());
}
