//! etcd's own clients for tests that run real etcd: etcdctl with an identity kept under a root
//! (node paths, as a bundle writes them), and a bulk writer through the v3 JSON gateway
//! (`tests/tests/etcd_membership.rs`, which proves the agent's etcd client against real etcd).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

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
