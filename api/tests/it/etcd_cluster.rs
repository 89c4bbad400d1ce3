//! Real etcd from rendered bundles: three members started with the exact ExecStart flags of
//! each node's rendered `etcd.service` and the rendered certificate files, then health, a write
//! through one member read back through another, and a client from the wrong CA refused.
//!
//! Remapped so three members fit on one host, and nothing else: each node's files live under
//! its own temporary root (paths are prefixed with it), the data dir, and the `127.0.0.1:2379`
//! listener that every member would otherwise share. The node addresses 127.0.10.11–13 are
//! loopback, so the members really talk to each other over TLS on their rendered addresses.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use exk8s_api::pki::KeyAlgorithm;
use exk8s_api::render::paths::PATHS;
use exk8s_common::payload::PlanStep;

use crate::helpers::{render_cluster, text};
use crate::render::write_root;

/// Kills and reaps every etcd it holds, whatever happens in the test.
struct Members(Vec<Child>);

impl Drop for Members {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_loopback_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The rendered unit's ExecStart arguments, with only the permitted remaps applied.
fn member_args(unit: &str, root: &Path, local_port: u16) -> Vec<String> {
    let joined = unit.replace("\\\n", " ");
    let exec = joined
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap();
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some(PATHS.etcd_binary));
    words
        .map(|arg| {
            let (flag, value) = arg.split_once('=').unwrap_or((arg, ""));
            if flag == "--data-dir" {
                return format!("--data-dir={}", root.join("var/lib/etcd").display());
            }
            if flag == "--listen-client-urls" {
                let remapped = format!("https://127.0.0.1:{local_port}");
                return format!(
                    "{flag}={}",
                    value.replace("https://127.0.0.1:2379", &remapped)
                );
            }
            if let Some(relative) = value.strip_prefix('/') {
                return format!("{flag}={}", root.join(relative).display());
            }
            arg.to_owned()
        })
        .collect()
}

fn etcdctl(root: &Path, endpoints: &str, cert: &str, key: &str, args: &[&str]) -> (bool, String) {
    let file = |p: &str| root.join(&p[1..]);
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .arg(format!("--cacert={}", file(PATHS.etcd_ca_cert).display()))
        .arg(format!("--cert={}", file(cert).display()))
        .arg(format!("--key={}", file(key).display()))
        .arg("--command-timeout=5s")
        .args(args)
        .output()
        .expect("etcdctl must be installed (scripts/test.sh installs etcd-client)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn three_real_etcd_members_run_from_rendered_units_and_certificates() {
    let ips: Vec<Ipv4Addr> = (11..=13).map(|i| Ipv4Addr::new(127, 0, 10, i)).collect();
    let cluster = render_cluster(&ips, KeyAlgorithm::EcdsaP256);
    let roots: Vec<tempfile::TempDir> = ips.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let mut members = Members(Vec::new());
    let mut local_ports = Vec::new();
    for (bundle, root) in cluster.bundles.iter().zip(&roots) {
        write_root(bundle, root.path());
        let port = free_loopback_port();
        local_ports.push(port);
        let args = member_args(text(bundle, PATHS.etcd_unit), root.path(), port);
        let log = std::fs::File::create(root.path().join("etcd.log")).unwrap();
        let child = Command::new("etcd")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd must be installed (scripts/test.sh installs etcd-server)");
        members.0.push(child);
    }
    let root1: PathBuf = roots[0].path().to_owned();
    let all: String = ips
        .iter()
        .map(|ip| format!("https://{ip}:2379"))
        .collect::<Vec<_>>()
        .join(",");
    let health = |root: &Path, endpoints: &str| {
        etcdctl(
            root,
            endpoints,
            PATHS.etcd_healthcheck_client_cert,
            PATHS.etcd_healthcheck_client_key,
            &["endpoint", "health", "--cluster"],
        )
    };

    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut healthy, mut said) = health(&root1, &all);
    while !healthy && Instant::now() < deadline {
        for (i, child) in members.0.iter_mut().enumerate() {
            if let Some(status) = child.try_wait().unwrap() {
                let log =
                    std::fs::read_to_string(roots[i].path().join("etcd.log")).unwrap_or_default();
                panic!("etcd member {} exited with {status}:\n{log}", i + 1);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        (healthy, said) = health(&root1, &all);
    }
    assert!(healthy, "cluster never became healthy: {said}");
    assert_eq!(said.matches("is healthy").count(), 3, "{said}");
    println!("{said}");

    // Each member also answers on its (remapped) loopback listener, with the localhost SAN.
    for (root, port) in roots.iter().zip(&local_ports) {
        let (ok, out) = etcdctl(
            root.path(),
            &format!("https://127.0.0.1:{port}"),
            PATHS.etcd_healthcheck_client_cert,
            PATHS.etcd_healthcheck_client_key,
            &["endpoint", "health"],
        );
        assert!(ok, "loopback listener: {out}");
    }

    // The agent's own wait, driven by the rendered plan step (only the listener remapped).
    let step = cluster.bundles[0]
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
    assert_eq!(step.0.as_str(), "https://127.0.0.1:2379");
    let probe = exk8s_agent::apply::waits::EtcdProbe {
        endpoint: format!("https://127.0.0.1:{}", local_ports[0]),
        ca_file: step.1.as_str().into(),
        cert_file: step.2.as_str().into(),
        key_file: step.3.as_str().into(),
        timeout: Duration::from_secs(20),
    };
    exk8s_agent::apply::waits::etcd(&root1, &probe).expect("the agent's etcd wait");
    let wrong = exk8s_agent::apply::waits::EtcdProbe {
        cert_file: PATHS.apiserver_kubelet_client_cert.into(),
        key_file: PATHS.apiserver_kubelet_client_key.into(),
        timeout: Duration::from_secs(3),
        ..probe
    };
    assert!(
        exk8s_agent::apply::waits::etcd(&root1, &wrong).is_err(),
        "a cluster-CA identity passed"
    );

    // The apiserver's etcd client writes through member 1 and reads back through member 3.
    let (cert, key) = (
        PATHS.apiserver_etcd_client_cert,
        PATHS.apiserver_etcd_client_key,
    );
    let (ok, out) = etcdctl(
        &root1,
        "https://127.0.10.11:2379",
        cert,
        key,
        &["put", "/exk8s/probe", "founded"],
    );
    assert!(ok, "put: {out}");
    let root3 = roots[2].path();
    let (ok, out) = etcdctl(
        root3,
        "https://127.0.10.13:2379",
        cert,
        key,
        &["get", "/exk8s/probe", "--print-value-only"],
    );
    assert!(ok, "get: {out}");
    assert_eq!(out.trim(), "founded");

    // A client certificate from the cluster CA (not the etcd CA) is refused.
    let (ok, out) = etcdctl(
        &root1,
        "https://127.0.10.11:2379",
        PATHS.apiserver_kubelet_client_cert,
        PATHS.apiserver_kubelet_client_key,
        &["get", "/exk8s/probe"],
    );
    assert!(!ok, "a cluster-CA client reached etcd: {out}");
    drop(members);
}
