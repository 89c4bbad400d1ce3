//! Waiting for the control plane: etcd's `/health` over mutual TLS with the healthcheck client
//! certificate, the apiserver's `/readyz` with the identity and CA of a kubeconfig, the
//! controller-manager's and scheduler's `/healthz` on loopback, this node's Node object, and a
//! static pod's mirror pod running the inputs its new manifest names (what kubeadm's upgrade
//! waits for with `kubernetes.io/config.hash`). Each polls every half second (one
//! request on a kept connection: a wait ends within half a second of what it waits for)
//! until healthy or its deadline (from the plan) passes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::http;

const POLL: Duration = Duration::from_millis(500);

pub use crate::etcd_probe::EtcdProbe;

#[derive(Debug, Clone)]
pub struct ApiserverProbe {
    pub kubeconfig: PathBuf,
    pub timeout: Duration,
}

/// A control-plane component answering `/healthz` on this node's loopback.
#[derive(Debug, Clone)]
pub struct ComponentProbe {
    pub component: String,
    pub port: u16,
    pub timeout: Duration,
}

impl ComponentProbe {
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}/healthz", self.port)
    }
}

/// This node's Node object, read through a kubeconfig's apiserver.
#[derive(Debug, Clone)]
pub struct NodeProbe {
    pub kubeconfig: PathBuf,
    pub node: String,
    pub timeout: Duration,
}

/// The annotation static pod manifests carry: a digest of the files the pod mounts.
pub const INPUTS_ANNOTATION: &str = "exk8s.io/inputs-sha256";

#[derive(Debug, Clone)]
pub struct StaticPodProbe {
    pub kubeconfig: PathBuf,
    /// The manifest the kubelet runs the pod from.
    pub manifest: PathBuf,
    /// `<pod name>-<node name>` in `kube-system`.
    pub mirror_pod: String,
    /// Hex digest the new manifest's annotation carries.
    pub inputs_sha256: String,
    pub timeout: Duration,
}

fn read(root: &Path, path: &Path) -> Result<Vec<u8>, String> {
    let full = root.join(path.strip_prefix("/").unwrap_or(path));
    std::fs::read(&full).map_err(|e| format!("reading {}: {e}", full.display()))
}

/// Polls `url` with `agent` until `healthy(status, body)` or the deadline.
fn poll(
    agent: &ureq::Agent,
    url: &str,
    timeout: Duration,
    healthy: impl Fn(&[u8]) -> bool,
) -> Result<(), String> {
    let start = Instant::now();
    let mut last = String::from("no answer yet");
    while start.elapsed() < timeout {
        match agent.get(url).call() {
            Ok(response) => match http::read_capped(response, 64 * 1024) {
                Ok(body) if healthy(&body) => return Ok(()),
                Ok(body) => {
                    last = format!(
                        "unhealthy: {}",
                        String::from_utf8_lossy(&body)
                            .chars()
                            .take(200)
                            .collect::<String>()
                    )
                }
                Err(e) => last = e,
            },
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(POLL);
    }
    Err(format!("not healthy after {}s: {last}", timeout.as_secs()))
}

pub fn etcd(root: &Path, probe: &EtcdProbe) -> Result<(), String> {
    let tls = http::mutual_tls(
        &read(root, &probe.ca_file)?,
        &read(root, &probe.cert_file)?,
        &read(root, &probe.key_file)?,
    )
    .map_err(|e| e.to_string())?;
    let agent = http::agent(tls, Duration::from_secs(5));
    let url = format!("{}/health", probe.endpoint.trim_end_matches('/'));
    poll(&agent, &url, probe.timeout, |body| {
        serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v["health"] == "true")
    })
}

/// The parts of a kubeconfig a readiness probe needs.
struct KubeconfigIdentity {
    server: String,
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

fn identity(text: &[u8]) -> Result<KubeconfigIdentity, String> {
    let doc: yaml_serde::Value =
        yaml_serde::from_slice(text).map_err(|e| format!("kubeconfig: {e}"))?;
    let field = |v: &yaml_serde::Value, what: &str| {
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("kubeconfig has no {what}"))
    };
    let decode = |v: &yaml_serde::Value, what: &str| {
        BASE64
            .decode(field(v, what)?)
            .map_err(|_| format!("kubeconfig {what} is not base64"))
    };
    let cluster = &doc["clusters"][0]["cluster"];
    let user = &doc["users"][0]["user"];
    Ok(KubeconfigIdentity {
        server: field(&cluster["server"], "server")?,
        ca: decode(
            &cluster["certificate-authority-data"],
            "certificate-authority-data",
        )?,
        cert: decode(&user["client-certificate-data"], "client-certificate-data")?,
        key: decode(&user["client-key-data"], "client-key-data")?,
    })
}

pub fn apiserver(root: &Path, probe: &ApiserverProbe) -> Result<(), String> {
    let id = identity(&read(root, &probe.kubeconfig)?)?;
    let tls = http::mutual_tls(&id.ca, &id.cert, &id.key).map_err(|e| e.to_string())?;
    let agent = http::agent(tls, Duration::from_secs(5));
    let url = format!("{}/readyz", id.server.trim_end_matches('/'));
    poll(&agent, &url, probe.timeout, |body| {
        body.trim_ascii() == b"ok"
    })
}

pub fn component(probe: &ComponentProbe) -> Result<(), String> {
    let tls = http::loopback_tls().map_err(|e| e.to_string())?;
    let agent = http::agent(tls, Duration::from_secs(5));
    poll(&agent, &probe.url(), probe.timeout, |body| {
        body.trim_ascii() == b"ok"
    })
}

pub fn node_registered(root: &Path, probe: &NodeProbe) -> Result<(), String> {
    let id = identity(&read(root, &probe.kubeconfig)?)?;
    let tls = http::mutual_tls(&id.ca, &id.cert, &id.key).map_err(|e| e.to_string())?;
    let agent = http::agent(tls, Duration::from_secs(5));
    let url = format!(
        "{}/api/v1/nodes/{}",
        id.server.trim_end_matches('/'),
        probe.node
    );
    poll(&agent, &url, probe.timeout, |body| {
        serde_json::from_slice::<serde_json::Value>(body)
            .is_ok_and(|node| node["kind"] == "Node" && node["metadata"]["name"] == probe.node)
    })
}

/// Whether a mirror pod (JSON) runs `inputs` and is Ready.
pub fn runs_inputs(pod: &serde_json::Value, inputs: &str) -> bool {
    let annotated = pod["metadata"]["annotations"][INPUTS_ANNOTATION] == inputs;
    let ready = pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    });
    annotated && ready
}

pub fn static_pod(root: &Path, probe: &StaticPodProbe) -> Result<(), String> {
    let id = identity(&read(root, &probe.kubeconfig)?)?;
    let tls = http::mutual_tls(&id.ca, &id.cert, &id.key).map_err(|e| e.to_string())?;
    let agent = http::agent(tls, Duration::from_secs(5));
    let url = format!(
        "{}/api/v1/namespaces/kube-system/pods/{}",
        id.server.trim_end_matches('/'),
        probe.mirror_pod
    );
    poll(&agent, &url, probe.timeout, |body| {
        serde_json::from_slice::<serde_json::Value>(body)
            .is_ok_and(|pod| runs_inputs(&pod, &probe.inputs_sha256))
    })
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::sync::Arc;
    use std::time::Duration;

    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};

    use super::{ComponentProbe, component, runs_inputs};

    /// A component on loopback with a certificate it signed itself, answering every request
    /// with `body`; its port.
    fn component_serving(body: &'static str) -> u16 {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let certs = vec![CertificateDer::from_pem_slice(made.cert.pem().as_bytes()).unwrap()];
        let key =
            PrivateKeyDer::from_pem_slice(made.signing_key.serialize_pem().as_bytes()).unwrap();
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let connection = rustls::ServerConnection::new(Arc::clone(&config)).unwrap();
                let mut tls = rustls::StreamOwned::new(connection, stream);
                let mut request = [0u8; 1024];
                if tls.read(&mut request).is_err() {
                    continue;
                }
                let _ = write!(
                    tls,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        });
        port
    }

    fn probe(port: u16) -> ComponentProbe {
        ComponentProbe {
            component: "kube-scheduler".into(),
            port,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_component_with_its_own_certificate_is_healthy_when_it_says_ok() {
        component(&probe(component_serving("ok"))).unwrap();
        let sick = component(&probe(component_serving("[-]leaderElection failed"))).unwrap_err();
        assert!(sick.contains("leaderElection failed"), "{sick}");
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let down = component(&probe(port)).unwrap_err();
        assert!(down.contains("not healthy after 1s"), "{down}");
    }

    #[test]
    fn only_a_ready_pod_with_the_new_inputs_counts() {
        let pod = |inputs: &str, ready: &str| {
            serde_json::json!({
                "metadata": {"annotations": {"exk8s.io/inputs-sha256": inputs}},
                "status": {"conditions": [{"type": "Ready", "status": ready}]},
            })
        };
        assert!(runs_inputs(&pod("new", "True"), "new"));
        assert!(!runs_inputs(&pod("old", "True"), "new"), "the old pod");
        assert!(!runs_inputs(&pod("new", "False"), "new"), "not ready yet");
        assert!(!runs_inputs(&serde_json::json!({}), "new"));
    }
}
