//! The provider's kinds, as Cluster API's v1beta2 contracts name their fields:
//! [`ExK8sCluster`] (infrastructure: the exk8s API a cluster is founded through, provisioned once
//! its credentials work), [`ExK8sControlPlane`] (control plane: the exk8s cluster itself —
//! `spec.replicas`, `spec.version` and the founding fields; its status the contract's replicas,
//! version, selector, `initialization.controlPlaneInitialized` and conditions) and
//! [`ExK8sMachinePool`] (a `MachinePool`'s infrastructure: an exk8s worker pool — its
//! `spec.providerIDList`, `status.replicas` and `initialization.provisioned`).
//!
//! The schemas carry the validation the apiserver applies before the controller sees an object:
//! ranges, patterns, enums, odd control planes and founding fields that cannot change, each
//! refusal naming its field.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use kube::CustomResourceExt as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The label Cluster API reads on a provider's CRD: which of its versions implement which
/// contract (`cluster.x-k8s.io/<contract>: <versions, _-separated>`).
pub const CONTRACT_LABEL: (&str, &str) = ("cluster.x-k8s.io/v1beta2", "v1alpha1");

/// Where a controller finds its exk8s API and the token it calls it with.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsRef {
    /// A Secret in the object's namespace with `url` (the exk8s API's base URL) and `token` (an
    /// operator token of the org the cluster belongs to); `ca.crt` (PEM) when the API's
    /// certificate is not signed by a public CA.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A control-plane endpoint, as Cluster API's `APIEndpoint`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ApiEndpoint {
    pub host: String,
    pub port: i32,
}

/// The infrastructure a cluster is founded on: an exk8s API and an org's token.
// Each `printcolumn(...)` names `type_` again: clippy reads them as one attribute repeated.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ExK8sCluster",
    namespaced,
    status = "ExK8sClusterStatus",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
    ),
    printcolumn(
        name = "Provisioned",
        type_ = "boolean",
        json_path = ".status.initialization.provisioned"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ExK8sClusterSpec {
    pub credentials_ref: CredentialsRef,
}

/// Cluster API's `initialization` of an infrastructure cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct InfrastructureInitialization {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExK8sClusterStatus {
    #[serde(default)]
    pub initialization: InfrastructureInitialization,
    /// `Ready` (the exk8s API answers with these credentials) and `Paused`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The key algorithm of every certificate and key the cluster's PKI makes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum KeyAlgorithm {
    #[serde(rename = "ecdsa-p256")]
    EcdsaP256,
    #[serde(rename = "ecdsa-p384")]
    EcdsaP384,
    #[serde(rename = "rsa-2048")]
    Rsa2048,
    #[serde(rename = "rsa-3072")]
    Rsa3072,
    #[serde(rename = "rsa-4096")]
    Rsa4096,
}

/// The pod network the first node installs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PodNetwork {
    Cilium,
    Flannel,
    None,
}

/// An exk8s cluster's control plane: its size, its Kubernetes version and how it is founded.
// Each `printcolumn(...)` names `type_` again: clippy reads them as one attribute repeated.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ExK8sControlPlane",
    namespaced,
    status = "ExK8sControlPlaneStatus",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
    ),
    printcolumn(
        name = "Initialized",
        type_ = "boolean",
        json_path = ".status.initialization.controlPlaneInitialized"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Up-to-date",
        type_ = "integer",
        json_path = ".status.upToDateReplicas"
    ),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ExK8sControlPlaneSpec {
    /// Control-plane machines (etcd members): 1, 3, 5 or 7.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self % 2 == 1", "message": "replicas must be odd (1, 3, 5 or 7): etcd keeps a quorum of an odd number of members"}]))]
    #[schemars(range(min = 1, max = 7))]
    pub replicas: i32,
    /// The Kubernetes version, `v1.MINOR.PATCH`: one the exk8s API installs; a change upgrades
    /// one member at a time within Kubernetes' version skew policy.
    #[schemars(regex(pattern = r"^v1\.[0-9]+\.[0-9]+$"))]
    pub version: String,
    /// The API server's endpoint, set by the controller once exk8s founded the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// The exk8s API and token (a Secret in this namespace).
    pub credentials_ref: CredentialsRef,
    /// The exk8s cluster's name in its org; default the Cluster's name. An exk8s cluster of
    /// that name is taken as this one (a cluster founded with `exk8s` comes under Cluster API);
    /// otherwise one is founded: 1–40 of a-z, 0-9 and '-', starting with a letter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$"))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "name cannot change: it names the exk8s cluster"}]))]
    pub name: Option<String>,
    /// The machines' instance type, e.g. `e2.medium`.
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "instanceType cannot change after founding"}]))]
    pub instance_type: String,
    /// The image the machines boot (with exk8s-agent baked in).
    #[schemars(range(min = 1))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "imageID cannot change after founding"}]))]
    #[serde(rename = "imageID")]
    pub image_id: i64,
    /// The subnet the machines join.
    #[schemars(range(min = 1))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "subnetID cannot change after founding"}]))]
    #[serde(rename = "subnetID")]
    pub subnet_id: i64,
    /// The zone; default 1.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "zoneID")]
    #[schemars(range(min = 1))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "zoneID cannot change after founding"}]))]
    pub zone_id: Option<i64>,
    /// Default `ecdsa-p256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "keyAlgorithm cannot change after founding"}]))]
    pub key_algorithm: Option<KeyAlgorithm>,
    /// Default `cilium`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "podNetwork cannot change after founding"}]))]
    pub pod_network: Option<PodNetwork>,
    /// Whether an upgrade first stores an etcd snapshot (default true): exk8s changes no
    /// member's version before it is stored. False goes on without one (no snapshot store, or
    /// after the upgrade's snapshot failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_before_upgrade: Option<bool>,
    /// Days every leaf certificate lasts (default 365).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3650))]
    pub leaf_lifetime_days: Option<i64>,
}

/// Cluster API's `initialization` of a control plane.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneInitialization {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExK8sControlPlaneStatus {
    /// The exk8s cluster's id, once founded.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "clusterID")]
    pub cluster_id: Option<i64>,
    #[serde(default)]
    pub initialization: ControlPlaneInitialization,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_date_replicas: Option<i32>,
    /// The oldest version a control-plane member runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The scale subresource's selector (Cluster API's control-plane machines' labels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// `Available`, `Paused`, `Founded` and exk8s's own (`EtcdClusterHealthy`,
    /// `ControlPlaneComponentsHealthy`, `CertificatesAvailable`, `RollingOut`, `ScalingUp`,
    /// `ScalingDown`, `Deleting`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A taint a pool's kubelets register their nodes with.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct PoolTaint {
    #[schemars(length(min = 1, max = 316))]
    pub key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 63))]
    pub value: String,
    pub effect: TaintEffect,
}

/// A taint's effect.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::PreferNoSchedule => "PreferNoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

/// The workers of a Cluster API `MachinePool`: an exk8s worker pool of the cluster its Cluster's
/// `ExK8sControlPlane` founded. The count is the MachinePool's `spec.replicas`; the version its
/// `spec.template.spec.version` (when set, the pool is pinned to it).
// Each `printcolumn(...)` names `type_` again: clippy reads them as one attribute repeated.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ExK8sMachinePool",
    namespaced,
    status = "ExK8sMachinePoolStatus",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
    ),
    printcolumn(
        name = "Provisioned",
        type_ = "boolean",
        json_path = ".status.initialization.provisioned"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ExK8sMachinePoolSpec {
    /// The exk8s pool's name in its cluster; default this object's name. A pool of that name is
    /// taken as this one; otherwise one is made: 1–40 of a-z, 0-9 and '-', not `cp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "name cannot change: it names the exk8s pool"}, {"rule": "self != 'cp'", "message": "name cannot be cp: it is the control plane's"}]))]
    pub name: Option<String>,
    /// The workers' instance type, e.g. `e2.medium`.
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "instanceType cannot change: the pool's machines are made of it"}]))]
    pub instance_type: String,
    /// The image the workers boot (with exk8s-agent baked in).
    #[schemars(range(min = 1))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "imageID cannot change: the pool's machines are made of it"}]))]
    #[serde(rename = "imageID")]
    pub image_id: i64,
    /// The subnet the workers join.
    #[schemars(range(min = 1))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "subnetID cannot change: the pool's machines are made in it"}]))]
    #[serde(rename = "subnetID")]
    pub subnet_id: i64,
    /// Labels the kubelets register their nodes with (Kubernetes' NodeRestriction rules apply);
    /// a change applies to nodes registered from then on.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Taints the kubelets register their nodes with; a change applies to nodes registered from
    /// then on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub taints: Vec<PoolTaint>,
    /// Workers made beyond the count while workers of another version are replaced, 0–10
    /// (default 1; 0: each old worker goes before its replacement is made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10))]
    pub max_surge: Option<i32>,
    /// The provider IDs (`exk8s://<cluster>/<vm>`) of the pool's machines, set by the controller:
    /// Cluster API matches Nodes by them.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        rename = "providerIDList"
    )]
    #[schemars(length(max = 10000))]
    pub provider_id_list: Vec<String>,
}

/// One machine of the pool (informational, as the contract's `instances`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolInstance {
    /// The Node's name.
    pub instance_name: String,
    #[serde(rename = "providerID")]
    pub provider_id: String,
    /// The Kubernetes version it runs, once it reported healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Its agent finished and last reported healthy.
    pub ready: bool,
}

/// Cluster API's `initialization` of an infrastructure machine pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct MachinePoolInitialization {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExK8sMachinePoolStatus {
    /// The exk8s pool's id, once made.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "poolID")]
    pub pool_id: Option<i64>,
    #[serde(default)]
    pub initialization: MachinePoolInitialization,
    /// The contract's v1beta1 `ready`, kept beside `initialization.provisioned`: Cluster API
    /// v1.14's MachinePool controller still reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Machines that exist and are not being removed.
    #[serde(default)]
    pub replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_date_replicas: Option<i32>,
    /// The version the pool's workers are made with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<PoolInstance>,
    /// `Ready`, `Paused` and `SpecApplied`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Every CRD as YAML documents, for `kubectl apply -f`.
pub fn crds_yaml() -> Result<String, yaml_serde::Error> {
    let mut out = String::new();
    for crd in [
        ExK8sCluster::crd(),
        ExK8sControlPlane::crd(),
        ExK8sMachinePool::crd(),
    ] {
        out.push_str("---\n");
        out.push_str(&yaml_serde::to_string(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_crd_carries_the_contract_label_cluster_api_reads() {
        for crd in [
            ExK8sCluster::crd(),
            ExK8sControlPlane::crd(),
            ExK8sMachinePool::crd(),
        ] {
            let labels = crd.metadata.labels.unwrap_or_default();
            assert_eq!(
                labels.get(CONTRACT_LABEL.0).map(String::as_str),
                Some(CONTRACT_LABEL.1),
                "{:?}",
                crd.metadata.name
            );
        }
    }

    #[test]
    fn the_control_plane_serves_the_scale_subresource_with_its_selector() {
        let crd = serde_json::to_value(ExK8sControlPlane::crd()).unwrap();
        let scale = &crd["spec"]["versions"][0]["subresources"]["scale"];
        assert_eq!(scale["specReplicasPath"], ".spec.replicas");
        assert_eq!(scale["statusReplicasPath"], ".status.replicas");
        assert_eq!(scale["labelSelectorPath"], ".status.selector");
    }
}
