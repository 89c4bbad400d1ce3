//! A TLS endpoint serving a rendered certificate and requiring client certificates from a
//! given CA (as kube-apiserver does with `--client-ca-file`), and a client that speaks with the
//! identity and trust of a kubeconfig. rustls is the independent implementation here.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .unwrap()
}

fn roots(pem: &[u8]) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs(pem) {
        roots.add(cert).unwrap();
    }
    roots
}

/// A client configuration trusting `ca_pem` and presenting `cert_pem`/`key_pem`.
pub fn mutual(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Arc<rustls::ClientConfig> {
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots(ca_pem))
            .with_client_auth_cert(
                certs(cert_pem),
                PrivateKeyDer::from_pem_slice(key_pem).unwrap(),
            )
            .unwrap(),
    )
}

/// Serves TLS on a loopback port with `cert`/`key`, requiring a client certificate signed by
/// `client_ca`; answers "ok" to each authenticated connection. Returns the port.
pub fn serve(cert_pem: &[u8], key_pem: &[u8], client_ca_pem: &[u8]) -> u16 {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(client_ca_pem)),
        provider(),
    )
    .build()
    .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            certs(cert_pem),
            PrivateKeyDer::from_pem_slice(key_pem).unwrap(),
        )
        .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let config = Arc::clone(&config);
            std::thread::spawn(move || {
                let Ok(connection) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(connection, stream);
                let mut buf = [0u8; 4];
                if tls.read_exact(&mut buf).is_ok() {
                    let _ = tls.write_all(b"ok");
                    let _ = tls.flush();
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                }
            });
        }
    });
    port
}

/// The cluster and user of a kubeconfig.
pub struct KubeconfigIdentity {
    pub server: String,
    pub ca_pem: Vec<u8>,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl KubeconfigIdentity {
    pub fn parse(text: &str) -> Self {
        let doc: yaml_serde::Value = yaml_serde::from_str(text).unwrap();
        let b64 = |v: &yaml_serde::Value| BASE64.decode(v.as_str().unwrap()).unwrap();
        Self {
            server: doc["clusters"][0]["cluster"]["server"]
                .as_str()
                .unwrap()
                .to_owned(),
            ca_pem: b64(&doc["clusters"][0]["cluster"]["certificate-authority-data"]),
            cert_pem: b64(&doc["users"][0]["user"]["client-certificate-data"]),
            key_pem: b64(&doc["users"][0]["user"]["client-key-data"]),
        }
    }

    /// The host part of the server URL.
    pub fn server_host(&self) -> String {
        let rest = self.server.trim_start_matches("https://");
        rest.rsplit_once(':')
            .map_or(rest, |(host, _)| host)
            .to_owned()
    }
}

/// Connects to `port`, verifying the server certificate for `server_name` against `ca_pem` and
/// presenting `client` when given. Ok when the server answered "ok".
pub fn handshake(
    port: u16,
    server_name: &str,
    ca_pem: &[u8],
    client: Option<(&[u8], &[u8])>,
) -> Result<(), String> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(ca_pem));
    let config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(certs(cert), PrivateKeyDer::from_pem_slice(key).unwrap())
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
    let connection =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(connection, stream);
    tls.write_all(b"ping").map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    match tls.read_to_end(&mut answer) {
        Ok(_) if answer == b"ok" => Ok(()),
        Ok(_) => Err(format!("unexpected answer {answer:?}")),
        Err(e) if answer == b"ok" => Err(format!("answer then error: {e}")),
        Err(e) => Err(e.to_string()),
    }
}

/// `openssl args` in `dir` (certificates made independently of exk8s); panics with what it said
/// when it fails.
pub fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl must be installed (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed P-256 certificate for `subject` (`/CN=…`), valid `days`, written as `key` and
/// `cert` in `dir` with openssl: a test's own CA or server, made independently of exk8s.
pub fn self_signed(dir: &std::path::Path, subject: &str, days: u32, key: &str, cert: &str) {
    let days = days.to_string();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            subject,
            "-days",
            &days,
            "-keyout",
            key,
            "-out",
            cert,
        ],
    );
}
