//! Worker pools: `POST /clusters/{id}/node-pools`, `PATCH …/{pool}` and what they answer.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::phase::Removal;

/// One taint, as Kubernetes writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TaintRequest {
    pub key: String,
    #[serde(default)]
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// `POST /clusters/{id}/node-pools`. Every field is optional in the type so a missing one gets
/// our own message; unknown fields are refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreatePoolRequest {
    /// Lowercase DNS label of at most 40 characters, unique in the cluster (not `cp`).
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
    )]
    pub name: Option<String>,
    /// Worker VMs, 0–1000 (required).
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 1000))]
    pub count: Option<i64>,
    /// Instance type, e.g. `e2.medium` (required).
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    )]
    pub instance_type: Option<String>,
    /// Image of the worker VMs, with the exk8s agent baked in (required, > 0).
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub image_id: Option<i64>,
    /// Subnet the workers join (required, must exist).
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub subnet_id: Option<i64>,
    /// Labels the kubelets register their nodes with (NodeRestriction's rules apply).
    pub labels: Option<BTreeMap<String, String>>,
    /// Taints the kubelets register their nodes with.
    pub taints: Option<Vec<TaintRequest>>,
    /// Workers made beyond `count` while workers of another release are replaced (new ones
    /// first, then the old drained and released; Cluster API's `maxSurge`), 0–10; default 1.
    /// 0: the pool never has more VMs than `count` — each old worker is drained and released
    /// before its replacement is made (`maxUnavailable` 1).
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 10))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<i64>,
}

/// `PATCH /clusters/{id}/node-pools/{pool}`: what is given changes. New labels and taints are
/// what nodes register with from then on; nodes already registered keep theirs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UpdatePoolRequest {
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 1000))]
    pub count: Option<i64>,
    pub labels: Option<BTreeMap<String, String>>,
    pub taints: Option<Vec<TaintRequest>>,
    /// `v1.MINOR.PATCH`: pins the pool's release (never newer than the oldest apiserver, at most
    /// three minors older); its workers are replaced one at a time, a new one first (unless
    /// `max_surge` is 0). The control
    /// plane's own release unpins it: it follows the control plane again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// `false` pins the pool at `kubernetes_version` (or at its release now) even when that is the
    /// control plane's: its workers stay there through the control plane's next upgrade. `true`
    /// makes it follow the control plane (with no `kubernetes_version`, or the control plane's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_control_plane: Option<bool>,
    /// Workers made beyond `count` during a replacement, 0–10 (0: each old worker goes before
    /// its replacement is made).
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 10))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<i64>,
}

/// One worker of a pool.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolNodeView {
    pub vm_id: i64,
    /// The provider ID its kubelet registers the Node with: `exk8s://<cluster>/<vm>`.
    pub provider_id: String,
    /// The cluster's machine number: higher was made later (scaling down removes the highest).
    pub ordinal: i64,
    pub name: String,
    pub private_ipv4: String,
    /// The last phase its agent reported (`pending` until it reports).
    pub phase: String,
    /// Its agent finished and last reported healthy (counted in the pool's `ready_replicas`).
    pub ready: bool,
    pub desired_generation: i64,
    pub applied_generation: i64,
    /// It runs its desired generation of its pool's release (a worker of another release is
    /// replaced, not updated).
    pub up_to_date: bool,
    /// The release it runs (its last healthy bundle's); absent before its first healthy report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// `draining` or `drained` while it is being removed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removal: Option<Removal>,
}

/// A pool and where its machines stand.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolView {
    pub id: i64,
    pub cluster_id: i64,
    pub name: String,
    pub instance_type: String,
    pub image_id: i64,
    pub subnet_id: i64,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<TaintRequest>,
    /// The count asked for.
    pub desired: i64,
    /// Workers that exist and are not being removed.
    pub replicas: i64,
    /// Of those, the ones whose agent finished and last reported healthy.
    pub ready_replicas: i64,
    /// Of those, the ones running their desired generation of the pool's release.
    pub up_to_date_replicas: i64,
    /// The release its workers run (new ones at once; the others are replaced one at a time).
    pub kubernetes_version: String,
    /// It takes the control plane's release once every member runs it (false: pinned).
    pub follow_control_plane: bool,
    /// Workers made beyond `desired` while workers of another release are replaced.
    pub max_surge: i64,
    /// `DELETE` was asked: the pool goes once its workers are gone.
    pub deleting: bool,
    /// Why the last attempt to converge the pool failed (it is retried).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    pub nodes: Vec<PoolNodeView>,
}
