//! Waiting for the control plane: etcd's `/health` over mutual TLS with the healthcheck client
//! certificate, the apiserver's `/readyz` with the identity and CA of a kubeconfig, the
//! controller-manager's and scheduler's `/healthz` on loopback, this node's Node object, and a
//! static pod's mirror pod running the inputs its new manifest names (what kubeadm's upgrade
//! waits for with `kubernetes.io/config.hash`). Each polls every two seconds until healthy or
//! its deadline (from the plan) passes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::http;

const POLL: Duration = Duration::from_secs(2);

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

/// Where a test harness that plays the kubelet records, per manifest file name, the inputs
/// digest of the pod it runs (a kubelet reports that through the mirror pod).
pub const STAND_IN_KUBELET_DIR: &str = "run/exk8s-test-kubelet";

/// The stand-in for [`static_pod`] where no kubelet runs (a test harness's nodes, through
/// [`super::host::RecordingHost`]): the harness's record says it runs the new inputs, and what
/// the kubelet itself checks before it calls the pod ready answers 200 — the HTTP GET of the
/// manifest's readiness probe (else its liveness probe) on this node. Polled until both hold or
/// the probe's deadline.
pub fn manifest_probe(root: &Path, probe: &StaticPodProbe) -> Result<(), String> {
    let manifest: yaml_serde::Value = yaml_serde::from_slice(&read(root, &probe.manifest)?)
        .map_err(|e| format!("{}: {e}", probe.manifest.display()))?;
    let container = &manifest["spec"]["containers"][0];
    let get = [&container["readinessProbe"], &container["livenessProbe"]]
        .into_iter()
        .map(|p| &p["httpGet"])
        .find(|g| g.is_mapping())
        .ok_or_else(|| format!("{} has no HTTP probe", probe.manifest.display()))?;
    let port = get["port"].as_u64().ok_or_else(|| {
        format!(
            "{}: the probe has no numeric port",
            probe.manifest.display()
        )
    })?;
    let url = format!(
        "{}://{}:{port}{}",
        get["scheme"]
            .as_str()
            .unwrap_or("HTTP")
            .to_ascii_lowercase(),
        get["host"].as_str().unwrap_or("127.0.0.1"),
        get["path"].as_str().unwrap_or("/"),
    );
    let record = root.join(STAND_IN_KUBELET_DIR).join(
        probe
            .manifest
            .file_name()
            .ok_or_else(|| format!("{} names no file", probe.manifest.display()))?,
    );
    let start = Instant::now();
    while std::fs::read_to_string(&record).map_or(true, |r| r.trim() != probe.inputs_sha256) {
        if start.elapsed() >= probe.timeout {
            return Err(format!(
                "not running the new inputs after {}s ({})",
                probe.timeout.as_secs(),
                record.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let tls = http::loopback_tls().map_err(|e| e.to_string())?;
    let left = probe.timeout.saturating_sub(start.elapsed());
    poll(
        &http::agent(tls, Duration::from_secs(5)),
        &url,
        left,
        |_| true,
    )
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
    fn without_a_kubelet_the_manifests_own_probe_is_polled() {
        let root = tempfile::tempdir().unwrap();
        let manifests = root.path().join("etc/kubernetes/manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        let records = root.path().join(super::STAND_IN_KUBELET_DIR);
        std::fs::create_dir_all(&records).unwrap();
        let write = |name: &str, probes: &str| {
            let text =
                format!("apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: c\n{probes}");
            std::fs::write(manifests.join(name), text).unwrap();
            std::fs::write(records.join(name), "new\n").unwrap();
            super::StaticPodProbe {
                kubeconfig: "/etc/exk8s/kubeconfig/admin.kubeconfig".into(),
                manifest: format!("/etc/kubernetes/manifests/{name}").into(),
                mirror_pod: "c-node".into(),
                inputs_sha256: "new".into(),
                timeout: Duration::from_secs(1),
            }
        };
        let http_get = |kind: &str, port: u16| {
            format!(
                "    {kind}:\n      httpGet:\n        host: 127.0.0.1\n        path: /readyz\n        port: {port}\n        scheme: HTTPS\n"
            )
        };
        let up = component_serving("ok");
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let down = closed.local_addr().unwrap().port();
        drop(closed);
        // The readiness probe wins over the liveness probe.
        let ready = write(
            "ready.yaml",
            &(http_get("readinessProbe", up) + &http_get("livenessProbe", down)),
        );
        super::manifest_probe(root.path(), &ready).unwrap();
        let live_only = write("live.yaml", &http_get("livenessProbe", up));
        super::manifest_probe(root.path(), &live_only).unwrap();
        let failing = write("failing.yaml", &http_get("readinessProbe", down));
        let failed = super::manifest_probe(root.path(), &failing).unwrap_err();
        assert!(failed.contains("not healthy after"), "{failed}");
        // The old pod answering is not the new one running.
        std::fs::write(records.join("live.yaml"), "old\n").unwrap();
        let old = super::manifest_probe(root.path(), &live_only).unwrap_err();
        assert!(old.contains("not running the new inputs"), "{old}");
        let none = write("none.yaml", "    image: x\n");
        let refused = super::manifest_probe(root.path(), &none).unwrap_err();
        assert!(refused.contains("has no HTTP probe"), "{refused}");
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
