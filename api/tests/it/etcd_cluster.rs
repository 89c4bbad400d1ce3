//! Real etcd from rendered bundles: three members started with the exact ExecStart flags of
//! each node's rendered `etcd.service` and the rendered certificate files (see
//! `exk8s_tests::etcd` for the only remaps: the root prefix, the data dir, and the shared
//! `127.0.0.1:2379` listener), then health, a write through one member read back through
//! another, the agent's own health wait, and a client from the wrong CA refused. The node
//! addresses 127.0.10.11–13 are loopback, so members talk TLS on their rendered addresses.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use exk8s_api::pki::KeyAlgorithm;
use exk8s_api::render::paths::PATHS;
use exk8s_common::payload::PlanStep;
use exk8s_tests::etcd::{EtcdCluster, etcdctl};

use crate::helpers::render_cluster;
use crate::render_validators::write_root;

#[test]
fn three_real_etcd_members_run_from_rendered_units_and_certificates() {
    let ips: Vec<Ipv4Addr> = (11..=13).map(|i| Ipv4Addr::new(127, 0, 10, i)).collect();
    let cluster = render_cluster(&ips, KeyAlgorithm::EcdsaP256);
    let dirs: Vec<tempfile::TempDir> = ips.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let roots: Vec<PathBuf> = dirs.iter().map(|d| d.path().to_owned()).collect();
    for (bundle, root) in cluster.bundles.iter().zip(&roots) {
        write_root(bundle, root);
    }
    let mut etcd = EtcdCluster::start(&roots);
    let all: String = ips
        .iter()
        .map(|ip| format!("https://{ip}:2379"))
        .collect::<Vec<_>>()
        .join(",");
    let (health_cert, health_key) = (
        PATHS.etcd_healthcheck_client_cert,
        PATHS.etcd_healthcheck_client_key,
    );
    let said = etcd.wait_healthy(&all, health_cert, health_key, Duration::from_secs(60));
    println!("{said}");

    // Each member also answers on its (remapped) loopback listener, with the localhost SAN.
    for (root, port) in roots.iter().zip(&etcd.local_ports) {
        let (ok, out) = etcdctl(
            root,
            &format!("https://127.0.0.1:{port}"),
            health_cert,
            health_key,
            &["endpoint", "health"],
        );
        assert!(ok, "loopback listener: {out}");
    }

    // The agent's own wait, driven by the rendered plan step (only the listener remapped).
    let (endpoint, ca, cert, key) = cluster.bundles[0]
        .plan
        .iter()
        .find_map(|s| match s {
            PlanStep::WaitEtcdHealthy {
                endpoint,
                ca_file,
                cert_file,
                key_file,
                ..
            } => Some((
                endpoint.clone(),
                ca_file.clone(),
                cert_file.clone(),
                key_file.clone(),
            )),
            _ => None,
        })
        .expect("the plan waits for etcd");
    assert_eq!(endpoint.as_str(), "https://127.0.0.1:2379");
    let probe = exk8s_agent::apply::waits::EtcdProbe {
        endpoint: format!("https://127.0.0.1:{}", etcd.local_ports[0]),
        ca_file: ca.as_str().into(),
        cert_file: cert.as_str().into(),
        key_file: key.as_str().into(),
        timeout: Duration::from_secs(20),
    };
    exk8s_agent::apply::waits::etcd(&roots[0], &probe).expect("the agent's etcd wait");
    let wrong = exk8s_agent::apply::waits::EtcdProbe {
        cert_file: PATHS.apiserver_kubelet_client_cert.into(),
        key_file: PATHS.apiserver_kubelet_client_key.into(),
        timeout: Duration::from_secs(3),
        ..probe
    };
    assert!(
        exk8s_agent::apply::waits::etcd(&roots[0], &wrong).is_err(),
        "a cluster-CA identity passed"
    );

    // The apiserver's etcd client writes through member 1 and reads back through member 3.
    let (cert, key) = (
        PATHS.apiserver_etcd_client_cert,
        PATHS.apiserver_etcd_client_key,
    );
    let (ok, out) = etcdctl(
        &roots[0],
        "https://127.0.10.11:2379",
        cert,
        key,
        &["put", "/exk8s/probe", "founded"],
    );
    assert!(ok, "put: {out}");
    let (ok, out) = etcdctl(
        &roots[2],
        "https://127.0.10.13:2379",
        cert,
        key,
        &["get", "/exk8s/probe", "--print-value-only"],
    );
    assert!(ok, "get: {out}");
    assert_eq!(out.trim(), "founded");

    // A client certificate from the cluster CA (not the etcd CA) is refused.
    let (kubelet_cert, kubelet_key) = (
        PATHS.apiserver_kubelet_client_cert,
        PATHS.apiserver_kubelet_client_key,
    );
    let (ok, out) = etcdctl(
        &roots[0],
        "https://127.0.10.11:2379",
        kubelet_cert,
        kubelet_key,
        &["get", "/exk8s/probe"],
    );
    assert!(!ok, "a cluster-CA client reached etcd: {out}");
}
