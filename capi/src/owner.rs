//! The Cluster API objects that own a provider's object, read as Cluster API v1beta2 writes
//! them: the `Cluster` (found through the owner reference Cluster API sets, read for what a
//! provider must honour — `spec.paused`, whether its infrastructure is provisioned — and for its
//! control plane) and a `MachinePool` (its replicas, version and Cluster).

use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Resource};

/// Cluster API's core group.
pub const CLUSTER_GROUP: &str = "cluster.x-k8s.io";
/// The label Cluster API puts on every object of a cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// `Cluster`, `cluster.x-k8s.io/v1beta2`.
pub fn cluster_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(CLUSTER_GROUP, "v1beta2", "Cluster"))
}

/// `MachinePool`, `cluster.x-k8s.io/v1beta2`.
pub fn machine_pool_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        CLUSTER_GROUP,
        "v1beta2",
        "MachinePool",
    ))
}

/// The name of the Cluster API object of `kind` that owns `object`.
fn owned_by<K: Resource>(object: &K, kind: &str) -> Option<String> {
    object
        .meta()
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|r| r.kind == kind && r.api_version.split('/').next() == Some(CLUSTER_GROUP))
        .map(|r| r.name.clone())
}

/// The name of the `Cluster` that owns `object` (Cluster API sets the reference once the Cluster
/// refers to the object).
pub fn owner_cluster<K: Resource>(object: &K) -> Option<String> {
    owned_by(object, "Cluster")
}

/// The name of the `MachinePool` that owns `object` (Cluster API sets the reference once the
/// MachinePool's `infrastructureRef` names the object).
pub fn owner_machine_pool<K: Resource>(object: &K) -> Option<String> {
    owned_by(object, "MachinePool")
}

/// What an infrastructure machine pool reads of its `MachinePool`.
#[derive(Debug, Clone)]
pub struct MachinePool {
    pub name: String,
    pub cluster: String,
    /// `spec.replicas`; 1 when unset, as Cluster API's defaulting makes it.
    pub replicas: i64,
    /// `spec.template.spec.version`.
    pub version: Option<String>,
}

/// The MachinePool `name` in `namespace`, or `None` when it is gone.
pub async fn machine_pool(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<MachinePool>, kube::Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &machine_pool_resource());
    Ok(api.get_opt(name).await?.map(|pool| {
        let spec = &pool.data["spec"];
        MachinePool {
            name: name.to_owned(),
            cluster: spec["clusterName"].as_str().unwrap_or_default().to_owned(),
            replicas: spec["replicas"].as_i64().unwrap_or(1),
            version: spec["template"]["spec"]["version"]
                .as_str()
                .filter(|v| !v.is_empty())
                .map(str::to_owned),
        }
    }))
}

/// What a provider reads of its Cluster.
#[derive(Debug, Clone)]
pub struct Owner {
    pub name: String,
    pub paused: bool,
    pub infrastructure_provisioned: bool,
    pub deleting: bool,
    /// `spec.controlPlaneRef`'s name when it is an `ExK8sControlPlane`.
    pub control_plane: Option<String>,
}

/// The Cluster `name` in `namespace`, or `None` when it is gone.
pub async fn get(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<Owner>, kube::Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &cluster_resource());
    Ok(api.get_opt(name).await?.map(|cluster| Owner {
        name: name.to_owned(),
        paused: cluster.data["spec"]["paused"].as_bool().unwrap_or(false),
        infrastructure_provisioned:
            cluster.data["status"]["initialization"]["infrastructureProvisioned"]
                .as_bool()
                .unwrap_or(false),
        deleting: cluster.metadata.deletion_timestamp.is_some(),
        control_plane: (cluster.data["spec"]["controlPlaneRef"]["kind"].as_str()
            == Some("ExK8sControlPlane"))
        .then(|| cluster.data["spec"]["controlPlaneRef"]["name"].as_str())
        .flatten()
        .map(str::to_owned),
    }))
}

/// Whether `object` carries Cluster API's paused annotation.
pub fn annotated_paused<K: Resource>(object: &K) -> bool {
    object
        .meta()
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(crate::conditions::PAUSED_ANNOTATION))
}
