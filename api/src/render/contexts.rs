//! One context struct per template: each is that template's declared inputs and nothing more.

use serde::Serialize;

use super::engine::{InputsSlot, PodUidSlot, Template};
use super::paths::NodePaths;

/// A template whose output carries no secret (one that does is written out, `MEMO = false`).
macro_rules! template {
    ($ty:ident => $name:literal) => {
        impl Template for $ty<'_> {
            const NAME: &'static str = $name;
            const MEMO: bool = true;
        }
    };
}

#[derive(Serialize)]
pub(crate) struct ClusterEnv<'a> {
    pub cluster_name: &'a str,
    pub cluster_id: u64,
    pub kubernetes_version: &'a str,
    pub cluster_domain: &'a str,
    pub service_cidr: String,
    pub api_service_ip: String,
    pub dns_service_ip: String,
    pub pod_cidr: String,
    pub control_plane_dns_name: &'a str,
    pub node_name: &'a str,
    pub node_ipv4: String,
    /// Empty when the node has no IPv6 address.
    pub node_ipv6: String,
    pub etcd_initial_cluster: &'a str,
    pub is_initial: bool,
}
template!(ClusterEnv => "cluster.env");

#[derive(Serialize)]
pub(crate) struct EtcdUnit<'a> {
    pub paths: &'a NodePaths,
    /// The etcd of the node's release ([`super::paths::etcd_binary`]).
    pub etcd_binary: String,
    pub name: &'a str,
    pub node_ip: String,
}
template!(EtcdUnit => "etcd.service");

/// etcd's bootstrap-only settings, apart from its unit so that a membership change (which
/// changes them) never restarts a running member: in a two-voter cluster that loses quorum.
#[derive(Serialize)]
pub(crate) struct EtcdBootstrap<'a> {
    pub initial_cluster: &'a str,
    /// `new` for a founding member, `existing` for one that joins a running cluster.
    pub initial_cluster_state: &'static str,
    pub cluster_token: String,
}
template!(EtcdBootstrap => "etcd-bootstrap.env");

#[derive(Serialize)]
pub(crate) struct KubeletUnit<'a> {
    pub paths: &'a NodePaths,
    /// The kubelet of the node's release ([`super::paths::kubernetes_binary`]).
    pub kubelet_binary: String,
    /// `control-plane` or `worker` (the unit's description).
    pub role: &'a str,
    pub node_name: &'a str,
    pub node_ip: String,
    /// `key=value,…` for `--node-labels`; empty for none.
    pub node_labels: String,
    /// `--config-dir` below `/etc`, which systemd makes before the kubelet starts
    /// (`ConfigurationDirectory=`): the kubelet refuses a drop-in directory that is missing.
    pub configuration_directory: &'a str,
}
template!(KubeletUnit => "kubelet.service");

#[derive(Serialize)]
pub(crate) struct KubeletConfig<'a> {
    pub paths: &'a NodePaths,
    pub node_ip: String,
    pub dns_service_ip: String,
    pub cluster_domain: &'a str,
    /// `exk8s://<cluster>/<vm>` ([`exk8s_api_types::provider_id`]).
    pub provider_id: String,
    pub register_with_taints: Vec<TaintContext<'a>>,
    /// Only a control-plane node has static pods: a worker's kubelet would otherwise log an
    /// error each second for the missing directory.
    pub static_pods: bool,
}

/// One taint the kubelet registers its node with.
#[derive(Serialize)]
pub(crate) struct TaintContext<'a> {
    pub key: &'a str,
    pub value: &'a str,
    pub effect: &'a str,
}
template!(KubeletConfig => "kubelet-config.yaml");

/// A hostPath volume mounted at the same path in the container.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Mount {
    pub name: String,
    pub path: &'static str,
    /// `File` or `DirectoryOrCreate`.
    pub kind: &'static str,
    pub read_only: bool,
}

#[derive(Serialize)]
pub(crate) struct Apiserver<'a> {
    pub paths: &'a NodePaths,
    pub image: String,
    /// Where the SHA-256 over the contents of every mounted file goes.
    pub inputs_sha256: InputsSlot,
    /// Where the pod's UID goes.
    pub pod_uid: PodUidSlot,
    pub node_ip: String,
    pub etcd_servers: &'a str,
    pub service_cidr: String,
    pub service_account_issuer: String,
    pub mounts: &'a [Mount],
}
template!(Apiserver => "kube-apiserver.yaml");

#[derive(Serialize)]
pub(crate) struct ControllerManager<'a> {
    pub paths: &'a NodePaths,
    pub image: String,
    /// Where the SHA-256 over the contents of every mounted file goes.
    pub inputs_sha256: InputsSlot,
    /// Where the pod's UID goes.
    pub pod_uid: PodUidSlot,
    pub cluster_name: &'a str,
    pub pod_cidr: String,
    /// `--node-cidr-mask-size`: the block each node gets ([`crate::render::PodCidr::node_prefix`]).
    pub node_cidr_mask: u8,
    pub service_cidr: String,
    pub mounts: &'a [Mount],
}
template!(ControllerManager => "kube-controller-manager.yaml");

#[derive(Serialize)]
pub(crate) struct Scheduler<'a> {
    pub paths: &'a NodePaths,
    pub image: String,
    /// Where the SHA-256 over the contents of every mounted file goes.
    pub inputs_sha256: InputsSlot,
    /// Where the pod's UID goes.
    pub pod_uid: PodUidSlot,
    pub mounts: &'a [Mount],
}
template!(Scheduler => "kube-scheduler.yaml");

/// containerd's template for the bridge configuration (Go `text/template`, filled by containerd
/// with the node's pod CIDRs).
#[derive(Serialize)]
pub(crate) struct BridgeCni {
    /// Whether the bridge masquerades what its pods send off the node's range (not when a
    /// pod network routes between nodes and masquerades at the pod network's edge).
    pub masquerade: bool,
    /// The pods' MTU, when a tunnel between nodes needs room (else the link's).
    pub mtu: Option<u32>,
}
impl Template for BridgeCni {
    const NAME: &'static str = "bridge-cni.conflist.tmpl";
    const MEMO: bool = true;
}

/// The kernel parameters every node sets (`/etc/sysctl.d`).
#[derive(Serialize)]
pub(crate) struct KernelParameters {}
impl Template for KernelParameters {
    const NAME: &'static str = "kubernetes-sysctl.conf";
    const MEMO: bool = true;
}

/// The socket of the node-local apiserver balancer (`exk8s-agent balance`).
#[derive(Serialize)]
pub(crate) struct BalancerSocket<'a> {
    /// `127.0.0.1:7445`.
    pub listen: &'a str,
}
template!(BalancerSocket => "exk8s-apiserver-balancer.socket");

/// The node-local apiserver balancer's unit.
#[derive(Serialize)]
pub(crate) struct BalancerUnit<'a> {
    pub paths: &'a NodePaths,
    /// The control plane's DNS name and the apiservers' port.
    pub apiserver: String,
    pub listen: &'a str,
}
template!(BalancerUnit => "exk8s-apiserver-balancer.service");

/// The kernel modules every node loads (`/etc/modules-load.d`).
#[derive(Serialize)]
pub(crate) struct KernelModules {}
impl Template for KernelModules {
    const NAME: &'static str = "kubernetes-modules.conf";
    const MEMO: bool = true;
}

/// How long systemd waits for a container's scope it stops itself (a power-off or reboot once
/// the kubelet let go), by a prefix drop-in for every `cri-containerd-<id>.scope`.
#[derive(Serialize)]
pub(crate) struct ContainerScopeStop {}
impl Template for ContainerScopeStop {
    const NAME: &'static str = "container-scope-stop.conf";
    const MEMO: bool = true;
}

#[derive(Serialize)]
pub(crate) struct CiliumValues {
    pub api_host: String,
}
impl Template for CiliumValues {
    const NAME: &'static str = "cilium-values.yaml";
    const MEMO: bool = true;
}

#[derive(Serialize)]
pub(crate) struct KubeProxy<'a> {
    pub image: String,
    pub pod_cidr: String,
    pub kubeconfig: &'a str,
}
template!(KubeProxy => "kube-proxy.yaml");

#[derive(Serialize)]
pub(crate) struct CoreDns<'a> {
    pub image: String,
    pub cluster_domain: &'a str,
    pub dns_service_ip: String,
}
template!(CoreDns => "coredns.yaml");

#[derive(Serialize)]
pub(crate) struct Flannel {
    pub image: String,
    /// flanneld's `net-conf.json`.
    pub net_conf: String,
    /// Where flanneld reaches the apiservers: every node's balancer (`127.0.0.1`, `7445`).
    pub api_host: String,
    pub api_port: String,
}
impl Template for Flannel {
    const NAME: &'static str = "flannel.yaml";
    const MEMO: bool = true;
}

#[derive(Serialize)]
pub(crate) struct Rbac<'a> {
    pub admin_group: &'a str,
    pub apiserver_kubelet_client_user: &'a str,
}
template!(Rbac => "rbac.yaml");

/// Holds the secretbox key: not `Debug`, and dropped right after rendering.
#[derive(Serialize)]
pub(crate) struct Encryption<'a> {
    pub key_name: &'a str,
    pub key_base64: &'a str,
}
impl Template for Encryption<'_> {
    const NAME: &'static str = "encryption-config.yaml";
    const MEMO: bool = false;
}

#[derive(Serialize)]
pub(crate) struct AuditPolicy {}
impl Template for AuditPolicy {
    const NAME: &'static str = "audit-policy.yaml";
    const MEMO: bool = true;
}

#[derive(Serialize)]
pub(crate) struct Containerd<'a> {
    pub pause_image: String,
    pub cni_bin_dir: &'a str,
    pub cni_conf_dir: &'a str,
    pub cni_template: &'a str,
    /// The registry hosts directory (`config_path`).
    pub registry_config_path: &'a str,
}
template!(Containerd => "containerd-config.toml");

#[derive(Serialize)]
pub(crate) struct Userdata<'a> {
    pub api_url: &'a str,
    pub imds_url: &'a str,
    pub insecure_http: bool,
}
template!(Userdata => "userdata.yaml");
