//! A cluster as the operator sees it and asks for it: founding (`POST /clusters`), its view
//! (`GET /clusters/{id}`) with its nodes, members, pools and Cluster API conditions, and
//! scaling its control plane (`PATCH /clusters/{id}`).

use serde::{Deserialize, Serialize};

use crate::SecretPem;
use crate::phase::{ClusterPhase, EtcdMembership};
use exk8s_common::contract::Role;

/// One condition, as Cluster API v1beta2 writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeView {
    pub vm_id: i64,
    /// The provider ID its kubelet registers the Node with: `exk8s://<cluster>/<vm>`.
    pub provider_id: String,
    pub ordinal: i64,
    pub name: String,
    pub private_ipv4: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_ipv4: Option<String>,
    pub is_initial: bool,
    /// `control-plane` or `worker`.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^(control-plane|worker)$"))]
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
    /// `applied_generation` has reached `desired_generation` — for a pool's worker, of its
    /// pool's release too (a worker of another release is replaced, not updated).
    pub up_to_date: bool,
    /// The Kubernetes version it runs (its last healthy bundle's); absent before its first
    /// healthy report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// A control-plane node's place in etcd: `voter`, `joining` or `leaving`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_membership: Option<EtcdMembership>,
    /// The operator asked to replace this control-plane member (its replacement joins first,
    /// or after it when it is down).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replacing: bool,
    /// When its agent last made a signed request (unix seconds, to the minute); absent before
    /// its first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_at: Option<i64>,
    /// The release of its agent (`exk8s-agent --version`) at its last bundle fetch; absent
    /// before that, and for agents older than 0.1 that do not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Its components' health as its agent last reported it: `EtcdMemberHealthy`,
    /// `APIServerPodHealthy`, `ControllerManagerPodHealthy`, `SchedulerPodHealthy` and
    /// `KubeletHealthy` (a worker: `KubeletHealthy`); then `HealthCheckSucceeded`, the machine
    /// judged by the cluster's health policy (False with the problem once it lasted the
    /// policy's timeout).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A cluster's status (the fields of Cluster API's infrastructure contract, and per-node phases).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// The version the control plane is to run (`PATCH` it to upgrade); `version` is the one
    /// it runs.
    pub kubernetes_version: String,
    pub service_cidr: String,
    pub pod_cidr: String,
    /// The pod network the first node installed with its addons (`cilium`, or `none`: the
    /// operator brings one).
    pub pod_network: String,
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
    /// The oldest Kubernetes version a control-plane member runs (Cluster API's `version`).
    pub version: String,
    /// A control-plane machine finished its boot: the control plane came up (`initialized`).
    pub initialized: bool,
    pub created_at: i64,
    /// Conditions in Cluster API v1beta2's shape: `Available`, `EtcdClusterHealthy`,
    /// `ControlPlaneComponentsHealthy`, `CertificatesAvailable`, `MachinesReady`, `RollingOut`,
    /// `ScalingUp`, `ScalingDown`, `CARotating`, `Deleting`.
    pub conditions: Vec<Condition>,
    /// A CA rotation in progress.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_rotation: Option<CaRotationView>,
    /// The service-account signing key: its age, policy and rotation in progress.
    #[serde(default)]
    pub service_account_key: crate::ServiceAccountKeyView,
    /// How machines are judged unhealthy and whether they are replaced without an operator
    /// (`PUT /clusters/{id}/health-policy`).
    #[serde(default)]
    pub health_policy: crate::HealthPolicy,
}

/// A control plane's etcd members, counted from what the agents last reported (a joining
/// member votes once its agent reported it promoted; a leaving one until etcd no longer lists it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// A worker pool's counts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolSummary {
    pub id: i64,
    pub name: String,
    /// The count asked for.
    pub desired: i64,
    /// Workers that exist and are not being removed.
    pub replicas: i64,
    /// Of those, the ones whose agent finished and last reported healthy.
    pub ready_replicas: i64,
    /// Of those, the ones running their desired generation of the pool's release.
    pub up_to_date_replicas: i64,
}

/// Where a CA rotation stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// A DNS record the operator may want.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DnsRecord {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub values: Vec<String>,
}

/// What founding answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterCreated {
    pub cluster_id: i64,
    pub name: String,
    /// Admin kubeconfig pointing at the shared control-plane DNS name.
    pub kubeconfig: String,
    pub control_plane_vm_ids: Vec<i64>,
    pub control_plane_dns_name: String,
    pub service_cidr: String,
    pub pod_cidr: String,
    pub dns_configured: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns_error: Option<String>,
    pub bootstrap_path_template: String,
    pub wildcard_ingress_dns_name: String,
    pub suggested_dns_records: Vec<DnsRecord>,
}

/// The request body. Every field is optional in the type so that a missing one gets our own
/// message; unknown fields are refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateClusterRequest {
    /// The cluster's name in its org (its kubeconfig's cluster and context): 1–40 of a-z, 0-9
    /// and '-', starting with a letter, not ending with '-', not starting with `exk8s-` (the
    /// names the API gives: `exk8s-<org>-<id hex>` when none is asked for). Unique in the org.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$", max_length = 40)
    )]
    pub name: Option<String>,
    /// Control-plane VMs: 1 (default) or 3. Even counts are refused (etcd quorum).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 3))]
    pub control_plane_count: Option<i64>,
    /// Image of the control-plane VMs (required, > 0).
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub control_plane_image_id: Option<i64>,
    /// Instance type, e.g. `e2.medium` (required).
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    )]
    pub control_plane_instance_type: Option<String>,
    /// Default 1.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub zone_id: Option<i64>,
    /// Subnet the VMs join (required).
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub subnet_id: Option<i64>,
    /// Existing security groups; when empty the API creates one (all IPv4 from the subnet, TCP
    /// 6443 from anywhere). At most 5, each positive, none repeated.
    #[cfg_attr(feature = "openapi", schema(max_items = 5))]
    pub security_group_ids: Option<Vec<i64>>,
    pub allocate_public_ipv4: Option<bool>,
    /// An OpenSSH public key line for the VMs.
    pub ssh_pubkey: Option<String>,
    /// Default 20, between 10 and 2048.
    #[cfg_attr(feature = "openapi", schema(minimum = 10, maximum = 2048))]
    pub root_volume_size_gib: Option<i64>,
    /// `ecdsa-p256` (default), `ecdsa-p384`, `rsa-2048`, `rsa-3072`, `rsa-4096`.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^(ecdsa-p256|ecdsa-p384|rsa-2048|rsa-3072|rsa-4096)$")
    )]
    pub key_algorithm: Option<String>,
    /// One of the configured versions; default the first.
    pub kubernetes_version: Option<String>,
    /// Days every leaf certificate lasts (default 365, at least 1, at most 3650); leaves are
    /// renewed automatically before they expire.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 3650))]
    pub leaf_lifetime_days: Option<i64>,
    /// The pod network the first node installs: `cilium` (default), `flannel` (VXLAN between
    /// nodes) or `none` (the operator brings one; until then each node's pods use containerd's
    /// bridge, within the node).
    #[cfg_attr(feature = "openapi", schema(pattern = "^(cilium|flannel|none)$"))]
    pub pod_network: Option<String>,
    /// CAs to found the cluster on instead of new ones (bring your own CA). Each given one is
    /// checked before anything is created: a CA certificate (CA:TRUE, keyCertSign) with an
    /// RSA (2048–8192 bits), P-256 or P-384 key, valid now and for one leaf lifetime more, and
    /// its matching private key. The keys are sealed like generated ones and never returned.
    pub certificate_authorities: Option<SuppliedCasRequest>,
    /// Found the cluster from another cluster's stored etcd snapshot (disaster recovery
    /// elsewhere): it keeps that cluster's CAs, service-account key and secrets-encryption key
    /// (so its tokens and kubeconfigs still work and its Secrets still open), and once its
    /// control plane is up its etcd is restored from the snapshot. Its nodes, addresses and
    /// DNS name are new. Not with `certificate_authorities`.
    pub restore_from: Option<RestoreFrom>,
}

/// The cluster and stored snapshot a new cluster is restored from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RestoreFrom {
    pub cluster_id: Option<i64>,
    pub snapshot_id: Option<i64>,
}

/// The CAs an operator brings, by role; a role left out gets a CA made by the API.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SuppliedCasRequest {
    /// Signs the apiservers', kubelets' and every Kubernetes client certificate.
    pub cluster: Option<SuppliedCaRequest>,
    /// Signs etcd's serving and peer certificates and its clients'.
    pub etcd: Option<SuppliedCaRequest>,
    /// Signs the front-proxy (aggregation layer) client certificate.
    pub front_proxy: Option<SuppliedCaRequest>,
}

/// One CA: its certificate and private key, PEM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SuppliedCaRequest {
    /// One `CERTIFICATE` PEM block.
    pub cert_pem: Option<String>,
    /// The private key, PEM (PKCS#8, SEC1 or PKCS#1). Never logged or returned.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = Password))]
    pub key_pem: Option<SecretPem>,
}

/// `PATCH /clusters/{id}`: one change at a time — the control plane's size, or the
/// Kubernetes version it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ClusterPatch {
    /// 1, 3, 5 or 7.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 7))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_count: Option<i64>,
    /// `v1.MINOR.PATCH`, one of `GET /kubernetes-versions`: upgrades the control plane one
    /// member at a time, within Kubernetes' version skew policy (or, while an upgrade is
    /// under way, back to the version the other members run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// With `kubernetes_version` only: whether an etcd voter must store a snapshot before any
    /// member changes version (default true). False skips it — when the snapshot store is
    /// down, or to go on after the upgrade's snapshot failed; a failed upgrade then has no
    /// snapshot from just before it to restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_first: Option<bool>,
}

/// What `PATCH /clusters/{id}` answers: where the change it asked for stands.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum ClusterChange {
    Scaling(ScalingView),
    Upgrade(UpgradeView),
}

/// Where a change of the control plane's Kubernetes version stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpgradeView {
    pub cluster_id: i64,
    /// `current` (it runs the version already), `upgrading` or `rolling-back`.
    pub upgrade: UpgradeState,
    /// The oldest version a control-plane member runs.
    pub from_version: String,
    pub to_version: String,
    /// Members that run `to_version`, of all members.
    pub done: i64,
    pub members: i64,
    /// The etcd snapshot no member changes version before (`GET
    /// /clusters/{id}/snapshots/{snapshot_id}`); absent once it is stored, or when skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<i64>,
}

/// How a version change stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum UpgradeState {
    Current,
    Upgrading,
    RollingBack,
}

/// Where a control-plane change stands.
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScalingView {
    pub cluster_id: i64,
    /// The size asked for.
    pub desired: i64,
    /// Voting members now.
    pub voters: i64,
}

/// What `DELETE /clusters/{id}` answers when the delete goes on in the background (202).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeleteAccepted {
    pub cluster_id: i64,
    /// `deleting`.
    pub phase: ClusterPhase,
    /// Why the delete did not finish at once.
    pub message: String,
}

/// A Kubernetes release the API installs (`GET /kubernetes-versions`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KubernetesVersionView {
    /// `v1.MINOR.PATCH`.
    pub version: String,
    /// New clusters get it when they ask for none.
    pub default: bool,
    pub etcd: String,
    pub coredns: String,
    pub pause: String,
    pub cilium_chart: String,
    /// Flannel's release, for clusters whose pod network is flannel.
    pub flannel: String,
    pub helm: String,
    /// Where each binary a node installs comes from.
    pub downloads: Vec<DownloadView>,
}

/// One download a node makes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DownloadView {
    /// `etcd`, `etcdctl`, `kubelet`, `kubectl` or `helm`.
    pub name: String,
    pub version: String,
    pub url: String,
    /// The digest the artifact catalog pins; absent: the agent checks `<url>.sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}
