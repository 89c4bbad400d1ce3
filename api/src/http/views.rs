//! What the operator routes answer about a cluster: its view, its nodes, its members, its pools,
//! a CA rotation's progress, and Cluster API conditions. Plain data: the routes and the view
//! builders fill them, and nothing here reaches back into them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::db::{self, phase::ClusterPhase, phase::EtcdMembership};
use exk8s_common::contract::Role;

/// One condition, as Cluster API v1beta2 writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    pub message: String,
    /// RFC 3339.
    #[serde(rename = "lastTransitionTime")]
    pub last_transition_time: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    pub vm_id: i64,
    pub ordinal: i64,
    pub name: String,
    pub private_ipv4: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_ipv4: Option<String>,
    pub is_initial: bool,
    /// `control-plane` or `worker`.
    #[schema(value_type = String, pattern = "^(control-plane|worker)$")]
    pub role: Role,
    /// The last phase the node's agent reported: `pending` until it reports, then the phase
    /// (`etcd`, `complete`, `sync`, …) followed by `:started` or `:failed` unless it succeeded.
    pub phase: String,
    /// The serial of the last bundle issued to the node.
    pub serial: i64,
    /// The generation the node should run (bumped whenever its bundle would change).
    pub desired_generation: i64,
    /// The generation the node last reported healthy (0 before its first bundle is applied).
    pub applied_generation: i64,
    /// `applied_generation` has reached `desired_generation`.
    pub up_to_date: bool,
    /// A control-plane node's place in etcd: `voter`, `joining` or `leaving`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_membership: Option<crate::db::phase::EtcdMembership>,
    /// The operator asked to replace this control-plane member (its replacement joins first,
    /// or after it when it is down).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replacing: bool,
    /// Its components' health as its agent last reported it: `EtcdMemberHealthy`,
    /// `APIServerPodHealthy`, `ControllerManagerPodHealthy`, `SchedulerPodHealthy` and
    /// `KubeletHealthy` (a worker: `KubeletHealthy`).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A cluster's status (the fields of Cluster API's infrastructure contract, and per-node phases).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClusterView {
    pub id: i64,
    pub name: String,
    pub phase: ClusterPhase,
    /// True when every node finished booting (the initial one after its addons).
    pub ready: bool,
    pub api_endpoints: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    pub control_plane_dns_name: String,
    pub dns_configured: bool,
    pub key_algorithm: String,
    pub kubernetes_version: String,
    pub service_cidr: String,
    pub pod_cidr: String,
    pub nodes: Vec<NodeView>,
    /// The worker pools, counted.
    pub node_pools: Vec<PoolSummary>,
    /// The control-plane size asked for with `PATCH` (absent: as founded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desired_control_plane_count: Option<i64>,
    /// Why the last control-plane change stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub membership_error: Option<String>,
    /// The control plane's etcd members: how many are asked for and where each one stands.
    pub control_plane_members: MembersView,
    /// Control-plane machines (Cluster API's `replicas`), leaving ones included.
    pub replicas: i64,
    /// Control-plane machines whose agent last reported healthy (`readyReplicas`).
    pub ready_replicas: i64,
    /// Control-plane machines running their newest generation (`upToDateReplicas`).
    pub up_to_date_replicas: i64,
    /// The Kubernetes version the control plane runs (`version`).
    pub version: String,
    /// A control-plane machine finished its boot: the control plane came up (`initialized`).
    pub initialized: bool,
    pub created_at: i64,
    /// Conditions in Cluster API v1beta2's shape: `Available`, `EtcdClusterHealthy`,
    /// `ControlPlaneComponentsHealthy`, `CertificatesAvailable`, `MachinesReady`, `ScalingUp`,
    /// `ScalingDown`, `Deleting`.
    pub conditions: Vec<Condition>,
    /// A CA rotation in progress.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_rotation: Option<CaRotationView>,
}

/// A control plane's etcd members, counted from what the agents last reported (a joining
/// member votes once its agent reported it promoted; a leaving one until etcd no longer lists it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MembersView {
    /// The size asked for with `PATCH`, or else the members that are not leaving.
    pub desired: i64,
    /// Voting members.
    pub voters: i64,
    /// Members joining: learners until promoted.
    pub joining: i64,
    /// Members being removed from etcd.
    pub leaving: i64,
}

impl MembersView {
    pub(super) fn of(nodes: &[db::nodes::NodeRow], asked: Option<i64>) -> Self {
        let count = |m: EtcdMembership| {
            let n = nodes
                .iter()
                .filter(|n| n.role == Role::ControlPlane && n.etcd_membership == Some(m))
                .count();
            i64::try_from(n).unwrap_or(i64::MAX)
        };
        let (voters, joining, leaving) = (
            count(EtcdMembership::Voter),
            count(EtcdMembership::Joining),
            count(EtcdMembership::Leaving),
        );
        Self {
            desired: asked.unwrap_or(voters + joining),
            voters,
            joining,
            leaving,
        }
    }
}

/// A worker pool's counts.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PoolSummary {
    pub id: i64,
    pub name: String,
    /// The count asked for.
    pub desired: i64,
    /// Workers that exist and are not being removed.
    pub replicas: i64,
    /// Of those, the ones whose agent finished and last reported healthy.
    pub ready_replicas: i64,
    /// Of those, the ones running their desired generation.
    pub up_to_date_replicas: i64,
}

/// Where a CA rotation stands.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CaRotationView {
    /// `cluster`, `etcd` or `front_proxy`.
    pub ca: String,
    /// `trust-both`, `sign-new` or `drop-old`.
    pub phase: String,
    pub started_at: i64,
    pub updated_at: i64,
    /// What the phase waits for before the next: the node that has not applied its generation
    /// yet, and where it is (absent when nothing holds it: it moves on at the next pass). Nodes
    /// that never took a bundle are not waited for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}
