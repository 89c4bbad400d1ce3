//! The PKI against PKI.md, row by row and for every key algorithm: read back with x509-parser
//! and checked again by openssl, an independent verifier.

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;
use std::path::Path;

use exk8s_api::pki::{CaRole, IssuedCert, KeyAlgorithm};
use time::Duration;

use crate::helpers::{ClusterFixture, cluster, facts, openssl, tool};

/// One row of PKI.md's table, with the expected values written out independently of the code.
struct Row<'a> {
    name: String,
    cert: &'a IssuedCert,
    signer: CaRole,
    cn: &'a str,
    o: &'a [&'a str],
    server: bool,
    client: bool,
    dns: Vec<&'a str>,
    ips: Vec<&'a str>,
}

const NODE1: &str = "cp-1.cluster-42.internal";
const NODE2: &str = "cp-2.cluster-42.internal";
const SHARED_DNS: &str = "exk8s-7-2a.k8s.example.com";

fn rows(f: &ClusterFixture) -> Vec<Row<'_>> {
    let apiserver_dns = |node| {
        vec![
            node,
            SHARED_DNS,
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "localhost",
        ]
    };
    let row = |name: &str, cert, signer, cn, o, server, client, dns, ips| Row {
        name: name.to_owned(),
        cert,
        signer,
        cn,
        o,
        server,
        client,
        dns,
        ips,
    };
    let (s1, s2) = (&f.serving[0], &f.serving[1]);
    let b = &f.bundles[0];
    use CaRole::*;
    vec![
        row(
            "apiserver (node 1)",
            &s1.apiserver,
            Cluster,
            "kube-apiserver",
            &[],
            true,
            false,
            apiserver_dns(NODE1),
            vec![
                "10.96.0.1",
                "10.0.0.11",
                "fd00::11",
                "203.0.113.11",
                "127.0.0.1",
            ],
        ),
        row(
            "apiserver (node 2)",
            &s2.apiserver,
            Cluster,
            "kube-apiserver",
            &[],
            true,
            false,
            apiserver_dns(NODE2),
            vec!["10.96.0.1", "10.0.0.12", "127.0.0.1"],
        ),
        row(
            "etcd-server (node 1)",
            &s1.etcd_server,
            Etcd,
            NODE1,
            &[],
            true,
            true,
            vec![NODE1, "localhost"],
            vec!["10.0.0.11", "fd00::11", "127.0.0.1", "::1"],
        ),
        row(
            "etcd-peer (node 1)",
            &s1.etcd_peer,
            Etcd,
            NODE1,
            &[],
            true,
            true,
            vec![NODE1, "localhost"],
            vec!["10.0.0.11", "fd00::11", "127.0.0.1", "::1"],
        ),
        row(
            "etcd-server (node 2)",
            &s2.etcd_server,
            Etcd,
            NODE2,
            &[],
            true,
            true,
            vec![NODE2, "localhost"],
            vec!["10.0.0.12", "127.0.0.1", "::1"],
        ),
        row(
            "kubelet serving",
            &b.node().kubelet_serving,
            Cluster,
            "system:node:cp-1.cluster-42.internal",
            &["system:nodes"],
            true,
            false,
            vec![NODE1],
            vec!["10.0.0.11", "fd00::11", "203.0.113.11"],
        ),
        row(
            "kubelet client",
            &b.node().kubelet_client,
            Cluster,
            "system:node:cp-1.cluster-42.internal",
            &["system:nodes"],
            false,
            true,
            vec![],
            vec![],
        ),
        row(
            "apiserver-kubelet-client",
            &b.control_plane().unwrap().apiserver_kubelet_client,
            Cluster,
            "kube-apiserver-kubelet-client",
            &[],
            false,
            true,
            vec![],
            vec![],
        ),
        row(
            "apiserver-etcd-client",
            &b.control_plane().unwrap().apiserver_etcd_client,
            Etcd,
            "kube-apiserver-etcd-client",
            &[],
            false,
            true,
            vec![],
            vec![],
        ),
        row(
            "front-proxy-client",
            &b.control_plane().unwrap().front_proxy_client,
            FrontProxy,
            "front-proxy-client",
            &[],
            false,
            true,
            vec![],
            vec![],
        ),
        row(
            "etcd-healthcheck-client",
            &b.control_plane().unwrap().etcd_healthcheck_client,
            Etcd,
            "kube-etcd-healthcheck-client",
            &[],
            false,
            true,
            vec![],
            vec![],
        ),
        row(
            "kube-proxy",
            &b.node().kube_proxy,
            Cluster,
            "system:kube-proxy",
            &[],
            false,
            true,
            vec![],
            vec![],
        ),
        row(
            "controller-manager",
            &b.control_plane().unwrap().controller_manager,
            Cluster,
            "system:kube-controller-manager",
            &[],
            false,
            true,
            vec![],
            vec![],
        ),
        row(
            "scheduler",
            &b.control_plane().unwrap().scheduler,
            Cluster,
            "system:kube-scheduler",
            &[],
            false,
            true,
            vec![],
            vec![],
        ),
        row(
            "admin",
            &b.control_plane().unwrap().admin,
            Cluster,
            "exk8s-admin",
            &["exk8s:cluster-admins"],
            false,
            true,
            vec![],
            vec![],
        ),
        row(
            "super-admin",
            &b.control_plane().unwrap().super_admin,
            Cluster,
            "exk8s-super-admin",
            &["system:masters"],
            false,
            true,
            vec![],
            vec![],
        ),
    ]
}

fn signature_oid(alg: KeyAlgorithm) -> &'static str {
    match alg {
        KeyAlgorithm::EcdsaP256 => "1.2.840.10045.4.3.2",
        KeyAlgorithm::EcdsaP384 => "1.2.840.10045.4.3.3",
        _ => "1.2.840.113549.1.1.11",
    }
}

fn check_cas(alg: KeyAlgorithm, f: &ClusterFixture) {
    for role in CaRole::ALL {
        let ca = facts(f.pki.ca(role).cert_pem());
        let what = format!("{alg} {role}");
        assert_eq!(ca.subject_cn, role.common_name(), "{what}");
        assert_eq!(ca.issuer_cn, role.common_name(), "{what} is self-signed");
        assert_eq!(ca.is_ca, Some(true), "{what}");
        assert!(ca.basic_constraints_critical, "{what}");
        assert!(ca.key_usage_critical, "{what}");
        assert_eq!(
            ca.key_usage,
            ["digitalSignature", "keyCertSign", "cRLSign"],
            "{what}"
        );
        assert!(!ca.has_eku, "{what} must have no EKU");
        assert!(ca.subject_key_id.is_some(), "{what}");
        assert_eq!(ca.not_before, f.now - Duration::minutes(5), "{what}");
        assert_eq!(ca.not_after, f.now + Duration::days(3650), "{what}");
        assert_eq!(ca.signature_oid, signature_oid(alg), "{what}");
    }
}

fn check_rows(alg: KeyAlgorithm) {
    let f = cluster(alg);
    check_cas(alg, f);
    for row in rows(f) {
        let c = facts(&row.cert.cert_pem);
        let what = format!("{alg} {}", row.name);
        let ca = facts(f.pki.ca(row.signer).cert_pem());
        assert_eq!(c.subject_cn, row.cn, "{what}: CN");
        assert_eq!(c.subject_o, row.o, "{what}: O");
        assert_eq!(c.issuer_cn, row.signer.common_name(), "{what}: signer");
        assert_eq!(
            c.authority_key_id, ca.subject_key_id,
            "{what}: authority key id"
        );
        assert!(c.subject_key_id.is_some(), "{what}: subject key id");
        assert_eq!(c.is_ca, Some(false), "{what}: CA:FALSE");
        assert!(c.basic_constraints_critical, "{what}");
        assert!(c.key_usage_critical, "{what}");
        let usage: &[&str] = if alg.is_rsa() {
            &["digitalSignature", "keyEncipherment"]
        } else {
            &["digitalSignature"]
        };
        assert_eq!(c.key_usage, usage, "{what}: key usage");
        assert_eq!(
            (c.server_auth, c.client_auth),
            (row.server, row.client),
            "{what}: EKU"
        );
        let dns: BTreeSet<String> = row.dns.iter().map(|s| s.to_string()).collect();
        let ips: BTreeSet<IpAddr> = row.ips.iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(c.dns_names, dns, "{what}: DNS SANs");
        assert_eq!(c.ips, ips, "{what}: IP SANs");
        assert_eq!(
            c.not_before,
            f.now - Duration::minutes(5),
            "{what}: NotBefore backdated"
        );
        assert_eq!(c.not_after, f.now + Duration::days(365), "{what}: one year");
        assert!(c.not_after <= ca.not_after, "{what}: outlives its CA");
        assert!(
            c.serial[0] < 0x80 && c.serial.len() <= 20,
            "{what}: serial {:?}",
            c.serial
        );
        assert!(c.serial.len() >= 16, "{what}: serial has under 128 bits");
        assert_eq!(c.signature_oid, signature_oid(alg), "{what}");
        assert!(
            row.cert
                .key_pem
                .expose()
                .starts_with("-----BEGIN PRIVATE KEY-----")
        );
    }
}

/// Every serial in one cluster (CAs, serving, two bundles) is distinct.
fn check_serials(alg: KeyAlgorithm) {
    let f = cluster(alg);
    let mut pems: Vec<&str> = CaRole::ALL
        .iter()
        .map(|r| f.pki.ca(*r).cert_pem())
        .collect();
    for s in &f.serving {
        pems.extend([&s.apiserver, &s.etcd_server, &s.etcd_peer].map(|c| c.cert_pem.as_str()));
    }
    for b in &f.bundles {
        for c in [
            &b.node().kubelet_serving,
            &b.node().kubelet_client,
            &b.control_plane().unwrap().apiserver_kubelet_client,
            &b.control_plane().unwrap().apiserver_etcd_client,
            &b.control_plane().unwrap().front_proxy_client,
            &b.control_plane().unwrap().etcd_healthcheck_client,
            &b.node().kube_proxy,
            &b.control_plane().unwrap().controller_manager,
            &b.control_plane().unwrap().scheduler,
            &b.control_plane().unwrap().admin,
            &b.control_plane().unwrap().super_admin,
        ] {
            pems.push(&c.cert_pem);
        }
    }
    let serials: HashSet<Vec<u8>> = pems.iter().map(|p| facts(p).serial).collect();
    assert_eq!(serials.len(), pems.len(), "{alg}: a serial was reused");
    assert_eq!(pems.len(), 3 + 9 + 22);
}

fn ca_file(role: CaRole) -> &'static str {
    match role {
        CaRole::Cluster => "ca.pem",
        CaRole::Etcd => "etcd-ca.pem",
        CaRole::FrontProxy => "front-proxy-ca.pem",
    }
}

pub(crate) fn verify(
    dir: &Path,
    ca: &str,
    purpose: &str,
    cert: &str,
    extra: &[&str],
) -> (bool, String) {
    let mut args = vec!["verify", "-x509_strict", "-CAfile", ca, "-purpose", purpose];
    args.extend_from_slice(extra);
    args.push(cert);
    openssl(&args, dir)
}

/// Every certificate kind (the three CAs and each PKI.md row) parses with pyca/cryptography, a
/// strict DER parser: OpenSSL and Go accept an encoded DEFAULT value (`cA FALSE` written out),
/// strict parsers refuse it ("EncodedDefault").
fn check_strict_der(alg: KeyAlgorithm) {
    let f = cluster(alg);
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let mut write = |name: String, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        files.push(path);
    };
    for role in CaRole::ALL {
        write(ca_file(role).to_owned(), f.pki.ca(role).cert_pem());
    }
    for (i, row) in rows(f).iter().enumerate() {
        write(
            format!("{i}-{}.pem", row.name.replace([' ', '(', ')'], "_")),
            &row.cert.cert_pem,
        );
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/strict_der.py");
    let out = std::process::Command::new(tool("python", "EXK8S_PYTHON"))
        .arg(script)
        .args(&files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{alg}: a strict DER parser refused certificates:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        files.len() > 10,
        "{alg}: only {} certificates checked",
        files.len()
    );
}

fn check_with_openssl(alg: KeyAlgorithm) {
    let f = cluster(alg);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for role in CaRole::ALL {
        std::fs::write(d.join(ca_file(role)), f.pki.ca(role).cert_pem()).unwrap();
    }
    for (i, row) in rows(f).iter().enumerate() {
        let cert = format!("cert-{i}.pem");
        let key = format!("key-{i}.pem");
        std::fs::write(d.join(&cert), &row.cert.cert_pem).unwrap();
        std::fs::write(d.join(&key), row.cert.key_pem.expose()).unwrap();
        let what = format!("{alg} {}", row.name);
        let signer = ca_file(row.signer);
        for (purpose, wanted) in [("sslserver", row.server), ("sslclient", row.client)] {
            let (ok, out) = verify(d, signer, purpose, &cert, &[]);
            assert_eq!(
                ok, wanted,
                "{what}: openssl verify -purpose {purpose}: {out}"
            );
        }
        let purpose = if row.server { "sslserver" } else { "sslclient" };
        for other in CaRole::ALL.into_iter().filter(|r| *r != row.signer) {
            let (ok, out) = verify(d, ca_file(other), purpose, &cert, &[]);
            assert!(!ok, "{what} verified against the {other}: {out}");
        }
        let (ok, cert_key) = openssl(&["x509", "-in", &cert, "-noout", "-pubkey"], d);
        assert!(ok, "{cert_key}");
        let (ok, key_pub) = openssl(&["pkey", "-in", &key, "-pubout"], d);
        assert!(ok, "{key_pub}");
        assert_eq!(cert_key, key_pub, "{what}: key does not match certificate");
    }
    // Names and addresses, checked by openssl's own matcher.
    std::fs::write(d.join("apiserver-1.pem"), &f.serving[0].apiserver.cert_pem).unwrap();
    std::fs::write(d.join("etcd-1.pem"), &f.serving[0].etcd_server.cert_pem).unwrap();
    for (cert, check) in [
        (
            "apiserver-1.pem",
            ["-verify_hostname", "kubernetes.default.svc.cluster.local"],
        ),
        ("apiserver-1.pem", ["-verify_hostname", SHARED_DNS]),
        ("apiserver-1.pem", ["-verify_ip", "10.96.0.1"]),
        ("apiserver-1.pem", ["-verify_ip", "10.0.0.11"]),
        ("apiserver-1.pem", ["-verify_ip", "127.0.0.1"]),
        ("etcd-1.pem", ["-verify_ip", "127.0.0.1"]),
        ("etcd-1.pem", ["-verify_hostname", "localhost"]),
    ] {
        let ca = if cert.starts_with("etcd") {
            "etcd-ca.pem"
        } else {
            "ca.pem"
        };
        let (ok, out) = verify(d, ca, "sslserver", cert, &check);
        assert!(ok, "{alg} {cert} {check:?}: {out}");
    }
    let (ok, _) = verify(
        d,
        "ca.pem",
        "sslserver",
        "apiserver-1.pem",
        &["-verify_ip", "10.0.0.12"],
    );
    assert!(
        !ok,
        "{alg}: node 1's apiserver cert must not cover node 2's address"
    );

    // The service-account keypair: a public key for --service-account-key-file, and the
    // private key it belongs to.
    let sa = &f.pki.service_account;
    assert!(
        sa.public_pem.starts_with("-----BEGIN PUBLIC KEY-----"),
        "{alg}"
    );
    std::fs::write(d.join("sa.pub"), &sa.public_pem).unwrap();
    std::fs::write(d.join("sa.key"), sa.private_pem.expose()).unwrap();
    let (ok, from_private) = openssl(&["pkey", "-in", "sa.key", "-pubout"], d);
    assert!(ok, "{from_private}");
    let (ok, public) = openssl(&["pkey", "-pubin", "-in", "sa.pub"], d);
    assert!(ok, "{public}");
    assert_eq!(
        from_private, public,
        "{alg}: service-account keys do not pair"
    );
}

macro_rules! per_algorithm {
    ($($name:ident => $alg:expr),* $(,)?) => {$(
        mod $name {
            use super::*;
            #[test]
            fn every_certificate_matches_its_pki_md_row() { check_rows($alg) }
            #[test]
            fn openssl_verifies_purposes_names_and_trust_domains() { check_with_openssl($alg) }
            #[test]
            fn a_strict_der_parser_reads_every_certificate() { check_strict_der($alg) }
            #[test]
            fn serials_are_unique_across_the_cluster() { check_serials($alg) }
        }
    )*};
}

per_algorithm! {
    ecdsa_p256 => KeyAlgorithm::EcdsaP256,
    ecdsa_p384 => KeyAlgorithm::EcdsaP384,
    rsa_2048 => KeyAlgorithm::Rsa2048,
    rsa_3072 => KeyAlgorithm::Rsa3072,
    rsa_4096 => KeyAlgorithm::Rsa4096,
}
