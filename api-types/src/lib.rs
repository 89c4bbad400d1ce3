//! The operator API's requests and answers: one definition that `exk8s-api` serves and the
//! `exk8s` CLI reads. Plain data with serde; the OpenAPI schema of each type is behind the
//! `openapi` feature (the API turns it on). The node channel's types (bundles, reports) are in
//! `exk8s_common::contract`, not here.

pub mod certificates;
pub mod cluster;
pub mod error;
pub mod events;
pub mod health;
pub mod kept;
pub mod phase;
pub mod pools;
mod secret;
pub mod snapshots;

pub use certificates::{
    CertificateInventory, CertificateView, ClusterTrust, OperatorCredential, RolloutNode,
    RolloutStarted, RotateCaRequest, RotateSaKeyRequest, RotationStarted, SaKeyRotationStarted,
    SaKeyRotationView, ServiceAccountKeyPolicy, ServiceAccountKeyView,
};
pub use cluster::{
    CaRotationView, ClusterChange, ClusterCreated, ClusterPatch, ClusterView, Condition,
    CreateClusterRequest, DeleteAccepted, DnsRecord, DownloadView, KubernetesVersionView,
    MembersView, NodeView, PoolSummary, RestoreFrom, ScalingView, SuppliedCaRequest,
    SuppliedCasRequest, UpgradeState, UpgradeView,
};
pub use error::{ErrorBody, ErrorDetail};
pub use events::{ChangeEvent, StatusEvent, StreamEnd};
pub use health::{HealthPolicy, MaxUnhealthy, PoolHealthPolicy};
pub use kept::DeletedClusterView;
pub use phase::{ClusterPhase, EtcdMembership, Removal};
pub use pools::{CreatePoolRequest, PoolNodeView, PoolView, TaintRequest, UpdatePoolRequest};
pub use secret::SecretPem;
pub use snapshots::{
    RestoreMemberView, RestoreRequest, RestoreView, SnapshotSchedule, SnapshotView,
};

/// The provider ID a node's kubelet registers its Node with (`spec.providerID`): the cluster and
/// the VM, so a Node names the machine behind it (Cluster API's MachinePool matches Nodes by it).
pub fn provider_id(cluster_id: impl std::fmt::Display, vm_id: impl std::fmt::Display) -> String {
    format!("exk8s://{cluster_id}/{vm_id}")
}
