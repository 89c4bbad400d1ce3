//! Kubeconfig files: one cluster (CA data + server URL), one user with an embedded client
//! certificate and key, one context. The result holds a private key, so it is a [`SecretPem`].
//!
//! Every scalar is written as a JSON string, which is a valid YAML double-quoted scalar: no
//! cluster name or URL can break the document, whatever it contains.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::{IssuedCert, SecretPem};

/// The facts one kubeconfig binds together.
#[derive(Debug, Clone, Copy)]
pub struct KubeconfigSpec<'a> {
    pub cluster_name: &'a str,
    /// `https://127.0.0.1:6443` on a node; the shared DNS name for the operator.
    pub server: &'a str,
    pub ca_pem: &'a str,
    /// The user entry's name: the certificate's CN.
    pub user: &'a str,
    pub credentials: &'a IssuedCert,
}

fn quoted(value: &str) -> String {
    // Serialising a &str to JSON cannot fail.
    serde_json::to_string(value).unwrap_or_else(|_| unreachable!("strings always serialise"))
}

/// Renders the kubeconfig YAML.
pub fn render(spec: &KubeconfigSpec<'_>) -> SecretPem {
    let cluster = quoted(spec.cluster_name);
    let user = quoted(spec.user);
    let context = quoted(&format!("{}@{}", spec.user, spec.cluster_name));
    let key_data = zeroize::Zeroizing::new(BASE64.encode(spec.credentials.key_pem.expose()));
    SecretPem::new(format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: {cluster}\n\
         \x20 cluster:\n\
         \x20   certificate-authority-data: {ca}\n\
         \x20   server: {server}\n\
         users:\n\
         - name: {user}\n\
         \x20 user:\n\
         \x20   client-certificate-data: {cert}\n\
         \x20   client-key-data: {key}\n\
         contexts:\n\
         - name: {context}\n\
         \x20 context:\n\
         \x20   cluster: {cluster}\n\
         \x20   user: {user}\n\
         current-context: {context}\n\
         preferences: {{}}\n",
        ca = BASE64.encode(spec.ca_pem),
        server = quoted(spec.server),
        cert = BASE64.encode(&spec.credentials.cert_pem),
        key = key_data.as_str(),
    ))
}
