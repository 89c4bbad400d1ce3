//! Where one control-plane bundle's CPU goes once its certificates are minted, stage by stage:
//! rendering the payload, serialising it, signing the envelope, and the whole chain.
//!
//! `cargo bench -p exk8s-api --bench bundle`

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "benchmark setup")]

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{Criterion, criterion_group, criterion_main};
use exk8s_api::pki::{
    BundleCerts, ClusterNetwork, ClusterPki, KeyAlgorithm, NodeAddresses, NodeServingCerts,
    ServiceCidr,
};
use exk8s_api::render::{
    ArtifactCatalog, ClusterSpec, ControlPlaneNode, EncryptionKey, Issuance, Membership,
    NodeCredentials, PodCidr, RenderInput, Versions, render_bundle,
};
use exk8s_common::BundleSigner as Signer;
use exk8s_common::contract::{BundleKind, Role};
use time::OffsetDateTime;

fn spec() -> ClusterSpec {
    let cidr = ServiceCidr::parse("10.96.0.0/12").unwrap();
    ClusterSpec {
        cluster_id: 42,
        org_id: 7,
        name: "exk8s-7-2a".parse().unwrap(),
        network: ClusterNetwork::new(cidr, "cluster.local", "exk8s-7-2a.k8s.example.com").unwrap(),
        pod_cidr: PodCidr::parse("172.16.0.0/12").unwrap(),
        pod_network: Default::default(),
        versions: Versions::default(),
        encryption_key: EncryptionKey::from_bytes([7; 32]),
    }
}

fn nodes() -> Vec<ControlPlaneNode> {
    (0..3u8)
        .map(|i| ControlPlaneNode {
            vm_id: 101 + u64::from(i),
            addresses: NodeAddresses {
                name: format!("cp-{}.cluster-42.internal", i + 1).parse().unwrap(),
                private_ipv4: Ipv4Addr::new(10, 0, 0, 11 + i),
                private_ipv6: None,
                public_ipv4: None,
            },
            is_initial: i == 0,
            membership: Membership::Voter,
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let now = OffsetDateTime::now_utc();
    let spec = spec();
    let nodes = nodes();
    let pki = ClusterPki::generate(KeyAlgorithm::EcdsaP256, now).unwrap();
    let node = &nodes[0];
    let serving = NodeServingCerts::generate(&pki, &node.addresses, &spec.network, now).unwrap();
    let minted = BundleCerts::mint(&pki, &node.addresses, Role::ControlPlane, now).unwrap();
    let issuance = Issuance {
        bundle_id: uuid::Uuid::new_v4(),
        issued_at: 1_800_000_000,
        expires_at: 1_800_000_900,
        serial: 1,
        nonce: "bench-nonce-0123456789abcdef".parse().unwrap(),
        kind: BundleKind::Bootstrap,
        generation: 1,
        drains: Vec::new(),
    };
    let artifacts = ArtifactCatalog::default();
    let input = RenderInput {
        cluster: &spec,
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
        issuance: &issuance,
        artifacts: &artifacts,
        update_wait_secs: exk8s_api::render::DEFAULT_UPDATE_WAIT_SECS,
    };
    let signer = Signer::from_seed(&[9; 32]);
    let payload = render_bundle(&input).unwrap();
    let bytes = serde_json::to_vec(&payload).unwrap();
    let envelope = signer.sign(exk8s_common::BUNDLE_PAYLOAD_TYPE, &bytes);
    let envelope_bytes = serde_json::to_vec(&envelope).unwrap();
    eprintln!(
        "payload {} bytes, envelope {} bytes, {} files",
        bytes.len(),
        envelope_bytes.len(),
        payload.files.len()
    );

    let mut group = c.benchmark_group("bundle");
    group.bench_function("mint", |b| {
        b.iter(|| BundleCerts::mint(&pki, &node.addresses, Role::ControlPlane, now).unwrap())
    });
    group.bench_function("render", |b| b.iter(|| render_bundle(&input).unwrap()));
    group.bench_function("serialise_payload", |b| {
        b.iter(|| serde_json::to_vec(black_box(&payload)).unwrap())
    });
    group.bench_function("sign", |b| {
        b.iter(|| signer.sign(exk8s_common::BUNDLE_PAYLOAD_TYPE, black_box(&bytes)))
    });
    group.bench_function("serialise_envelope", |b| {
        b.iter(|| serde_json::to_vec(black_box(&envelope)).unwrap())
    });
    group.bench_function("sign_to_json", |b| {
        b.iter(|| signer.sign_to_json(exk8s_common::BUNDLE_PAYLOAD_TYPE, black_box(&bytes)))
    });
    group.bench_function("certificate_facts", |b| {
        let certs = exk8s_api::certificates::bundle(Some(&serving), &minted);
        b.iter(|| {
            certs
                .iter()
                .map(|c| exk8s_api::pki::facts(c.pem).unwrap())
                .collect::<Vec<_>>()
        })
    });
    group.bench_function("digest_payload", |b| {
        b.iter(|| exk8s_common::names::Sha256Digest::of(black_box(&bytes)))
    });
    group.bench_function("render_to_envelope", |b| {
        b.iter(|| {
            let payload = render_bundle(&input).unwrap();
            let bytes = serde_json::to_vec(&payload).unwrap();
            let envelope = signer.sign_to_json(exk8s_common::BUNDLE_PAYLOAD_TYPE, &bytes);
            (envelope, exk8s_common::names::Sha256Digest::of(&bytes))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
