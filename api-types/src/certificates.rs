//! A cluster's certificates: the inventory, renewing every leaf, rotating a CA, and the rollout
//! each starts.

use serde::{Deserialize, Serialize};

/// One certificate, as the API issued it.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CertificateView {
    /// The node's VM; absent for the cluster's own certificates (CAs, operator kubeconfig).
    pub vm_id: Option<i64>,
    /// The node generation whose bundle carried it (0 for the cluster's own).
    pub generation: i64,
    /// What it is: `cluster-ca`, `apiserver`, `etcd-peer`, `admin.kubeconfig`, …
    pub name: String,
    /// `ca`, `serving` or `client`.
    pub kind: String,
    pub subject: String,
    pub issuer: String,
    /// Hex, colon-separated.
    pub serial: String,
    /// Unix seconds.
    pub not_before: i64,
    /// Unix seconds.
    pub not_after: i64,
    /// Whole days until `not_after` (negative once expired).
    pub days_left: i64,
}

/// A cluster's certificates.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CertificateInventory {
    pub cluster_id: i64,
    /// Days since the service-account signing key was made (at founding). It is not rotated
    /// automatically: rotating it invalidates every issued service-account token.
    pub service_account_key_age_days: i64,
    /// Soonest `not_after` first.
    pub certificates: Vec<CertificateView>,
}

/// Which CA to rotate.
#[derive(Debug, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RotateCaRequest {
    /// `cluster`, `etcd` or `front_proxy`, as `certificate_authorities` names them.
    /// `front-proxy` is a deprecated alias of `front_proxy`, still accepted.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^(cluster|etcd|front_proxy|front-proxy)$")
    )]
    pub ca: Option<String>,
}

/// A CA rotation started: its first phase, and each node's new desired generation.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RotationStarted {
    pub cluster_id: i64,
    pub ca: String,
    /// `trust-both`, then (by itself) `sign-new` and `drop-old`; `GET /clusters/{id}` shows it.
    pub phase: String,
    pub nodes: Vec<RolloutNode>,
}

/// A started rollout: each node's new desired generation.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RolloutStarted {
    pub cluster_id: i64,
    pub nodes: Vec<RolloutNode>,
}

#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RolloutNode {
    pub vm_id: i64,
    pub desired_generation: i64,
}

/// What a client of a cluster's apiservers trusts now: the cluster CA, the other one while that
/// CA is rotated, and the standby its next rotation will take (`GET /clusters/{id}/trust`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterTrust {
    /// `https://<the control plane's DNS name>:6443`.
    pub server: String,
    /// PEM, one to three certificates.
    pub certificate_authority_pem: String,
}

/// A short-lived client certificate of the cluster's admin identity (`POST
/// /clusters/{id}/credentials`), for client-go's exec credential plugin (`exk8s credential`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OperatorCredential {
    pub server: String,
    /// What to trust when reaching `server` (as [`ClusterTrust`]).
    pub certificate_authority_pem: String,
    pub client_certificate_pem: String,
    /// Its private key (PKCS#8 PEM); shown by no `Debug`.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub client_key_pem: crate::SecretPem,
    /// The CA certificate that signed it: while `certificate_authority_pem` holds it, the
    /// apiservers accept the credential.
    pub issuer_pem: String,
    /// RFC 3339; hours after it was minted.
    pub expires_at: String,
}

/// `POST /clusters/{id}/certificates/rotate-sa-key`: how long the old service-account public
/// key stays trusted once every apiserver signs with the new one.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RotateSaKeyRequest {
    /// Seconds, 0–2592000 (default 90000: 25 hours, within which every kubelet refreshes the
    /// projected tokens it holds). 0 drops the old key as soon as every apiserver signs with
    /// the new one: tokens signed before (a leaked key's) stop authenticating at once, pods'
    /// included until their kubelet refreshes them.
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 2592000))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_old_after_seconds: Option<i64>,
}

/// A service-account key rotation started: its first phase and each control-plane node's new
/// desired generation (workers carry no service-account key).
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SaKeyRotationStarted {
    pub cluster_id: i64,
    /// `trust-both`, then (by itself) `sign-new` and `drop-old`; `GET /clusters/{id}` shows it.
    pub phase: String,
    pub drop_old_after_seconds: i64,
    pub nodes: Vec<RolloutNode>,
}

/// A cluster's service-account signing key: its age, its policy and its rotation in progress
/// (`GET|PUT /clusters/{id}/service-account-key`, and in `GET /clusters/{id}`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ServiceAccountKeyView {
    /// When the key in use was made (unix seconds).
    pub created_at: i64,
    pub age_days: i64,
    /// Past this age the `ServiceAccountKeyFresh` condition turns False (and, with
    /// `auto_rotate`, the API rotates the key).
    pub max_age_days: i64,
    pub auto_rotate: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<SaKeyRotationView>,
}

/// Where a service-account key rotation stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SaKeyRotationView {
    /// `trust-both`, `sign-new` or `drop-old`.
    pub phase: String,
    pub started_at: i64,
    pub updated_at: i64,
    pub drop_old_after_seconds: i64,
    /// When every apiserver signed with the new key (sign-new applied everywhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_since: Option<i64>,
    /// When the old public key is dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_old_at: Option<i64>,
    /// The control-plane node the phase waits for, and where it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}

/// `PUT /clusters/{id}/service-account-key`: the key's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ServiceAccountKeyPolicy {
    /// 1–3650 (default 365).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 3650))]
    pub max_age_days: i64,
    /// Rotate the key once it is past `max_age_days` (default false: only warn).
    pub auto_rotate: bool,
}
