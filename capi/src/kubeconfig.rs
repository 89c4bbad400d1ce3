//! The `<cluster>-kubeconfig` Secret in Cluster API's format (type `cluster.x-k8s.io/secret`,
//! the cluster-name label, the kubeconfig under `value`, owned by the control plane), and when
//! it must be renewed: a new client certificate is minted only when the stored one trusts
//! other CAs than the cluster's clients trust now, was minted at another step of a CA rotation
//! (from `sign-new` on, certificates come from the new CA, which stays trusted after `drop-old`),
//! names another server, or has less than a third of its life left.

use std::collections::BTreeMap;

use base64::Engine as _;
use exk8s_api_types::ClusterTrust;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The Secret's type Cluster API reads.
pub const SECRET_TYPE: &str = "cluster.x-k8s.io/secret";
/// The key of the kubeconfig in it.
pub const KEY: &str = "value";
/// The annotation naming the CA rotation's step the kubeconfig was minted at (`none` outside
/// one; `cluster/sign-new`, …).
pub const ROTATION_ANNOTATION: &str = "exk8s.dev/ca-rotation";

/// `<cluster>-kubeconfig`.
pub fn secret_name(cluster: &str) -> String {
    format!("{cluster}-kubeconfig")
}

/// The Secret holding `kubeconfig` for `cluster` in `namespace`, owned by `owner`, minted at
/// CA rotation step `rotation`.
pub fn secret(
    cluster: &str,
    namespace: &str,
    owner: OwnerReference,
    kubeconfig: &str,
    rotation: &str,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(cluster)),
            namespace: Some(namespace.to_owned()),
            annotations: Some(BTreeMap::from([(
                ROTATION_ANNOTATION.to_owned(),
                rotation.to_owned(),
            )])),
            labels: Some(BTreeMap::from([(
                crate::owner::CLUSTER_NAME_LABEL.to_owned(),
                cluster.to_owned(),
            )])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        type_: Some(SECRET_TYPE.to_owned()),
        data: Some(BTreeMap::from([(
            KEY.to_owned(),
            ByteString(kubeconfig.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    }
}

/// Why a stored kubeconfig must be replaced, or `None` while it stays valid; `rotation` is the
/// CA rotation's step now.
pub fn stale(
    stored: Option<&Secret>,
    trust: &ClusterTrust,
    rotation: &str,
    now: i64,
) -> Option<String> {
    let Some(secret) = stored else {
        return Some("there is none yet".into());
    };
    if secret.type_.as_deref() != Some(SECRET_TYPE) {
        return Some(format!("its type is not {SECRET_TYPE}"));
    }
    let minted_at = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ROTATION_ANNOTATION));
    if minted_at.map(String::as_str) != Some(rotation) {
        return Some(format!("the CA rotation is at {rotation} now"));
    }
    let Some(text) = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KEY))
        .and_then(|v| std::str::from_utf8(&v.0).ok())
    else {
        return Some(format!("it holds no {KEY}"));
    };
    let Ok(kubeconfig) = yaml_serde::from_str::<serde_json::Value>(text) else {
        return Some("it holds no kubeconfig YAML".into());
    };
    let cluster = &kubeconfig["clusters"][0]["cluster"];
    if cluster["server"].as_str() != Some(trust.server.as_str()) {
        return Some(format!("the cluster's server is now {}", trust.server));
    }
    let decoded = |v: &serde_json::Value| {
        v.as_str()
            .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
    };
    let Some(ca) = decoded(&cluster["certificate-authority-data"]) else {
        return Some("it names no certificate authority".into());
    };
    if pem_blocks(&ca) != pem_blocks(trust.certificate_authority_pem.as_bytes()) {
        return Some("the cluster's clients trust other CAs now (a CA rotation)".into());
    }
    let Some(cert) = decoded(&kubeconfig["users"][0]["user"]["client-certificate-data"]) else {
        return Some("it holds no client certificate".into());
    };
    let Some((not_before, not_after)) = validity(&cert) else {
        return Some("its client certificate cannot be read".into());
    };
    let left = not_after - now;
    if left * 3 < not_after - not_before {
        return Some(format!(
            "its client certificate has {} hours left of {}",
            left.max(0) / 3600,
            (not_after - not_before) / 3600
        ));
    }
    None
}

/// The DER of every PEM block in `pem`, in order.
fn pem_blocks(pem: &[u8]) -> Vec<Vec<u8>> {
    pem::parse_many(pem)
        .map(|blocks| blocks.into_iter().map(|b| b.into_contents()).collect())
        .unwrap_or_default()
}

/// A PEM certificate's notBefore and notAfter, unix seconds.
fn validity(pem: &[u8]) -> Option<(i64, i64)> {
    let block = pem::parse(pem).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(block.contents()).ok()?;
    let v = cert.validity();
    Some((v.not_before.timestamp(), v.not_after.timestamp()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIBATAKBggqhkjOPQQDAjAVMRMwEQYDVQQDEwprdWJlcm5l\ndGVzMB4XDTI2MDEwMTAwMDAwMFoXDTI3MDEwMTAwMDAwMFowFTETMBEGA1UEAxMK\na3ViZXJuZXRlczBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABA==\n-----END CERTIFICATE-----\n";

    fn trust(ca: &str) -> ClusterTrust {
        ClusterTrust {
            server: "https://cp.example:6443".into(),
            certificate_authority_pem: ca.into(),
        }
    }

    fn stored(server: &str, ca: &str) -> Secret {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    client-certificate-data: {}\n",
            b64(ca),
            b64("not a certificate")
        );
        let owner = OwnerReference {
            api_version: "controlplane.cluster.x-k8s.io/v1alpha1".into(),
            kind: "ExK8sControlPlane".into(),
            name: "cp".into(),
            uid: "u".into(),
            ..OwnerReference::default()
        };
        secret("shop", "default", owner, &kubeconfig, "none")
    }

    #[test]
    fn the_secret_is_in_cluster_apis_format() {
        let s = stored("https://cp.example:6443", CA);
        assert_eq!(s.metadata.name.as_deref(), Some("shop-kubeconfig"));
        assert_eq!(s.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
        assert_eq!(
            s.metadata.labels.unwrap()["cluster.x-k8s.io/cluster-name"],
            "shop"
        );
        assert!(s.data.unwrap().contains_key("value"));
    }

    #[test]
    fn each_reason_to_renew_is_named() {
        assert_eq!(
            stale(None, &trust(CA), "none", 0).unwrap(),
            "there is none yet"
        );
        let other_server = stored("https://old.example:6443", CA);
        assert!(
            stale(Some(&other_server), &trust(CA), "none", 0)
                .unwrap()
                .contains("server")
        );
        let rotated = stored("https://cp.example:6443", CA);
        let two = format!("{CA}{CA}");
        assert!(
            stale(Some(&rotated), &trust(&two), "none", 0)
                .unwrap()
                .contains("CA rotation")
        );
        // Minted before the rotation's step now: renewed.
        assert!(
            stale(Some(&rotated), &trust(CA), "cluster/sign-new", 0)
                .unwrap()
                .contains("cluster/sign-new")
        );
        // Same trust, but the client certificate cannot be read: renewed too.
        assert!(
            stale(Some(&rotated), &trust(CA), "none", 0)
                .unwrap()
                .contains("client certificate")
        );
    }
}
