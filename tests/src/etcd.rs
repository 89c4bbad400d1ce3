//! Real etcd members started from rendered node roots, to check the rendering in seconds (a
//! booted machine's systemd runs the same unit: `tests/tests/boot_cluster.rs`): each with the
//! exact ExecStart flags of its root's `etcd.service`, the environment of its `EnvironmentFile`
//! and the certificate files in that root. Only what three members on
//! one host require is remapped: file paths are prefixed with the root, the data dir moves into
//! the root, and the `127.0.0.1:2379` listener every member would share gets a free port.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::procs::{Proc, free_port};

/// Where a rendered bundle puts the unit.
pub const ETCD_UNIT: &str = "etc/systemd/system/etcd.service";
/// Where a rendered unit's etcd lives: `<this>/<version>/etcd`.
pub const ETCD_RELEASES: &str = "/opt/exk8s/etcd/";

/// The etcd release a rendered unit runs (its ExecStart names the binary of that release).
pub fn unit_release(unit: &str) -> String {
    let words = crate::units::exec_start(unit);
    words[0]
        .strip_prefix(ETCD_RELEASES)
        .and_then(|rest| rest.strip_suffix("/etcd"))
        .unwrap_or_else(|| panic!("the unit runs {}, not a release's etcd", words[0]))
        .to_owned()
}

/// The harness's etcd binary for the release a rendered unit runs.
pub fn unit_binary(unit: &str) -> PathBuf {
    crate::bins::etcd_at(&unit_release(unit), "etcd")
}

/// The rendered unit's ExecStart arguments with only the permitted remaps applied.
pub fn member_args(unit: &str, root: &Path, local_port: u16) -> Vec<String> {
    let words = crate::units::exec_start(unit);
    unit_release(unit);
    words[1..]
        .iter()
        .map(|arg| {
            let (flag, value) = arg.split_once('=').unwrap_or((arg.as_str(), ""));
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
            arg.clone()
        })
        .collect()
}

/// Running members; killed and reaped when dropped.
pub struct EtcdCluster {
    members: Vec<Proc>,
    pub roots: Vec<PathBuf>,
    /// Each member's remapped loopback client port.
    pub local_ports: Vec<u16>,
}

impl EtcdCluster {
    /// Starts one member per root (the etcd the nodes run, [`crate::bins::ETCD_VERSION`]).
    pub fn start(roots: &[PathBuf]) -> Self {
        let mut members = Vec::new();
        let mut local_ports = Vec::new();
        for root in roots {
            let port = free_port();
            members.push(spawn_member(root, port));
            local_ports.push(port);
        }
        Self {
            members,
            roots: roots.to_vec(),
            local_ports,
        }
    }

    /// Polls `endpoint health --cluster` until every member is healthy; panics with the
    /// members' logs when one exits or the deadline passes. Returns etcdctl's report.
    pub fn wait_healthy(
        &mut self,
        endpoints: &str,
        cert: &str,
        key: &str,
        timeout: Duration,
    ) -> String {
        let start = Instant::now();
        loop {
            let (ok, said) = etcdctl(
                &self.roots[0],
                endpoints,
                cert,
                key,
                &["endpoint", "health", "--cluster"],
            );
            if ok && said.matches("is healthy").count() == self.members.len() {
                return said;
            }
            for (i, member) in self.members.iter_mut().enumerate() {
                if let Some(status) = member.0.try_wait().unwrap() {
                    let log =
                        std::fs::read_to_string(self.roots[i].join("etcd.log")).unwrap_or_default();
                    panic!("etcd member {} exited with {status}:\n{log}", i + 1);
                }
            }
            assert!(
                start.elapsed() < timeout,
                "etcd never became healthy: {said}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// One member from `root`'s unit, its log appended to `root/etcd.log`.
fn spawn_member(root: &Path, local_port: u16) -> Proc {
    let unit = std::fs::read_to_string(root.join(ETCD_UNIT)).unwrap();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("etcd.log"))
        .unwrap();
    let child = Command::new(unit_binary(&unit))
        .args(member_args(&unit, root, local_port))
        .envs(crate::units::unit_environment(root, &unit))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting etcd");
    Proc(child)
}

/// etcdctl with TLS files from `root` (paths given as absolute node paths).
pub fn etcdctl(
    root: &Path,
    endpoints: &str,
    cert: &str,
    key: &str,
    args: &[&str],
) -> (bool, String) {
    let file = |p: &str| root.join(p.trim_start_matches('/'));
    let out = Command::new(crate::bins::etcd("etcdctl"))
        .arg(format!("--endpoints={endpoints}"))
        .arg(format!(
            "--cacert={}",
            file("/etc/exk8s/pki/etcd-ca.pem").display()
        ))
        .arg(format!("--cert={}", file(cert).display()))
        .arg(format!("--key={}", file(key).display()))
        .arg("--command-timeout=5s")
        .args(args)
        .output()
        .expect("running etcdctl");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// Writes `/k/0000`… (`count` keys) through `endpoint`'s JSON gateway with the identity in
/// `root` (node paths) — one connection, not a process per key.
pub fn put_keys(root: &Path, endpoint: &str, cert: &str, key: &str, count: usize) {
    use base64::Engine as _;
    let read = |p: &str| std::fs::read(root.join(p.trim_start_matches('/'))).unwrap();
    let tls = crate::tls::mutual(&read("/etc/exk8s/pki/etcd-ca.pem"), &read(cert), &read(key));
    let agent = ureq::AgentBuilder::new()
        .tls_config(tls)
        .timeout(Duration::from_secs(10))
        .build();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    for i in 0..count {
        agent
            .post(&format!("{}/v3/kv/put", endpoint.trim_end_matches('/')))
            .send_json(serde_json::json!({"key": b64(&format!("/k/{i:04}")), "value": b64("v")}))
            .unwrap();
    }
}
