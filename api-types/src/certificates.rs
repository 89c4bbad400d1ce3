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
