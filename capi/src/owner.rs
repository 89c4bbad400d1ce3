//! The Cluster API `Cluster` that owns a provider's object, read as Cluster API v1beta2 writes
//! it: found through the owner reference Cluster API sets, and read for what a provider must
//! honour — `spec.paused` and whether its infrastructure is provisioned.

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

/// The name of the `Cluster` that owns `object` (Cluster API sets the reference once the Cluster
/// refers to the object).
pub fn owner_cluster<K: Resource>(object: &K) -> Option<String> {
    object
        .meta()
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|r| r.kind == "Cluster" && r.api_version.split('/').next() == Some(CLUSTER_GROUP))
        .map(|r| r.name.clone())
}

/// What a provider reads of its Cluster.
#[derive(Debug, Clone)]
pub struct Owner {
    pub name: String,
    pub paused: bool,
    pub infrastructure_provisioned: bool,
    pub deleting: bool,
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
