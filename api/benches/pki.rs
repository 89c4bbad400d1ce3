//! PKI cost per cluster and per bundle, for each key algorithm.
//!
//! `cargo bench -p exk8s-api --bench pki`
//!
//! * `found_cluster_pki` — three CAs, the service-account key, and etcd/apiserver serving certs
//!   for three nodes (what `POST /clusters` pays);
//! * `mint_node_bundle_certs` — every per-bundle certificate for one node (what each bundle
//!   fetch pays).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "benchmark setup")]

use exk8s_common::contract::Role;
use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{Criterion, criterion_group, criterion_main};
use exk8s_api::pki::{
    BundleCerts, ClusterNetwork, ClusterPki, KeyAlgorithm, NodeAddresses, NodeServingCerts,
    ServiceCidr,
};
use time::OffsetDateTime;

fn nodes() -> Vec<NodeAddresses> {
    (1..=3)
        .map(|i| NodeAddresses {
            name: format!("cp-{i}.cluster-42.internal").parse().unwrap(),
            private_ipv4: Ipv4Addr::new(10, 0, 0, 10 + i),
            private_ipv6: None,
            public_ipv4: None,
        })
        .collect()
}

fn network() -> ClusterNetwork {
    let cidr = ServiceCidr::parse("10.96.0.0/12").unwrap();
    ClusterNetwork::new(cidr, "cluster.local", "exk8s-7-2a.k8s.example.com").unwrap()
}

fn bench(c: &mut Criterion) {
    let now = OffsetDateTime::now_utc();
    let nodes = nodes();
    let network = network();
    for alg in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::Rsa2048] {
        let mut group = c.benchmark_group(alg.as_str());
        if alg.is_rsa() {
            group.sample_size(10);
        }
        group.bench_function("found_cluster_pki", |b| {
            b.iter(|| {
                let pki = ClusterPki::generate(alg, now).unwrap();
                for node in &nodes {
                    black_box(NodeServingCerts::generate(&pki, node, &network, now).unwrap());
                }
                pki
            })
        });
        let pki = ClusterPki::generate(alg, now).unwrap();
        group.bench_function("mint_node_bundle_certs", |b| {
            b.iter(|| BundleCerts::mint(&pki, &nodes[0], Role::ControlPlane, now).unwrap())
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
