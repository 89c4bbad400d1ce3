//! Where everything lives on a control-plane node. The one source of truth for both the file
//! list of a bundle and every path a template writes into a unit or manifest, so a flag can
//! never name a file the bundle does not carry.

use serde::Serialize;

/// Paths of the files a bundle writes, and of the node directories they refer to.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct NodePaths {
    // Trust
    pub ca_cert: &'static str,
    pub etcd_ca_cert: &'static str,
    pub front_proxy_ca_cert: &'static str,
    pub apiserver_cert: &'static str,
    pub apiserver_key: &'static str,
    pub apiserver_kubelet_client_cert: &'static str,
    pub apiserver_kubelet_client_key: &'static str,
    pub apiserver_etcd_client_cert: &'static str,
    pub apiserver_etcd_client_key: &'static str,
    pub front_proxy_client_cert: &'static str,
    pub front_proxy_client_key: &'static str,
    pub etcd_server_cert: &'static str,
    pub etcd_server_key: &'static str,
    pub etcd_peer_cert: &'static str,
    pub etcd_peer_key: &'static str,
    pub etcd_healthcheck_client_cert: &'static str,
    pub etcd_healthcheck_client_key: &'static str,
    pub kubelet_cert: &'static str,
    pub kubelet_key: &'static str,
    pub service_account_public: &'static str,
    pub service_account_key: &'static str,
    // Kubeconfigs
    pub admin_kubeconfig: &'static str,
    pub super_admin_kubeconfig: &'static str,
    pub kubelet_kubeconfig: &'static str,
    pub kube_proxy_kubeconfig: &'static str,
    pub controller_manager_kubeconfig: &'static str,
    pub scheduler_kubeconfig: &'static str,
    // Configuration, units, manifests
    pub cluster_env: &'static str,
    pub etcd_bootstrap_env: &'static str,
    pub kubelet_config: &'static str,
    pub kubelet_unit: &'static str,
    pub balancer_socket: &'static str,
    pub balancer_unit: &'static str,
    pub balancer_seeds: &'static str,
    pub etcd_unit: &'static str,
    pub apiserver_manifest: &'static str,
    pub controller_manager_manifest: &'static str,
    pub scheduler_manifest: &'static str,
    pub cni_template: &'static str,
    pub cilium_values: &'static str,
    pub flannel_manifest: &'static str,
    pub kube_proxy_manifest: &'static str,
    pub coredns_manifest: &'static str,
    pub rbac_manifest: &'static str,
    pub encryption_config: &'static str,
    pub audit_policy: &'static str,
    pub containerd_config: &'static str,
    pub sysctl_conf: &'static str,
    pub modules_conf: &'static str,
    pub container_scope_conf: &'static str,
    // Node directories and binaries the bundle does not write
    pub static_pod_dir: &'static str,
    pub etcd_data_dir: &'static str,
    pub audit_log_dir: &'static str,
    pub containerd_socket: &'static str,
    pub cni_bin_dir: &'static str,
    /// The kubelet's drop-in configuration (`--config-dir`): what the machine's image adds
    /// to the bundle's `KubeletConfiguration`, merged over it in file-name order.
    pub kubelet_config_dir: &'static str,
    /// containerd's registry hosts (`config_path`): one `<registry>/hosts.toml` per mirrored
    /// registry, as air-gapped images bake them.
    pub containerd_registry_dir: &'static str,
    pub helm_binary: &'static str,
}

impl NodePaths {
    /// The control plane's static-pod manifests: apiserver, controller-manager, scheduler.
    pub fn control_plane_manifests(&self) -> [&'static str; 3] {
        [
            self.apiserver_manifest,
            self.controller_manager_manifest,
            self.scheduler_manifest,
        ]
    }
}

pub const PATHS: NodePaths = NodePaths {
    ca_cert: "/etc/exk8s/pki/ca.pem",
    etcd_ca_cert: "/etc/exk8s/pki/etcd-ca.pem",
    front_proxy_ca_cert: "/etc/exk8s/pki/front-proxy-ca.pem",
    apiserver_cert: "/etc/exk8s/pki/apiserver.pem",
    apiserver_key: "/etc/exk8s/pki/apiserver-key.pem",
    apiserver_kubelet_client_cert: "/etc/exk8s/pki/apiserver-kubelet-client.pem",
    apiserver_kubelet_client_key: "/etc/exk8s/pki/apiserver-kubelet-client-key.pem",
    apiserver_etcd_client_cert: "/etc/exk8s/pki/apiserver-etcd-client.pem",
    apiserver_etcd_client_key: "/etc/exk8s/pki/apiserver-etcd-client-key.pem",
    front_proxy_client_cert: "/etc/exk8s/pki/front-proxy-client.pem",
    front_proxy_client_key: "/etc/exk8s/pki/front-proxy-client-key.pem",
    etcd_server_cert: "/etc/exk8s/pki/etcd-server.pem",
    etcd_server_key: "/etc/exk8s/pki/etcd-server-key.pem",
    etcd_peer_cert: "/etc/exk8s/pki/etcd-peer.pem",
    etcd_peer_key: "/etc/exk8s/pki/etcd-peer-key.pem",
    etcd_healthcheck_client_cert: "/etc/exk8s/pki/etcd-healthcheck-client.pem",
    etcd_healthcheck_client_key: "/etc/exk8s/pki/etcd-healthcheck-client-key.pem",
    kubelet_cert: "/etc/exk8s/pki/kubelet.pem",
    kubelet_key: "/etc/exk8s/pki/kubelet-key.pem",
    service_account_public: "/etc/exk8s/pki/service-account.pem",
    service_account_key: "/etc/exk8s/pki/service-account-key.pem",
    admin_kubeconfig: "/etc/exk8s/kubeconfig/admin.kubeconfig",
    super_admin_kubeconfig: "/etc/exk8s/kubeconfig/super-admin.kubeconfig",
    kubelet_kubeconfig: "/etc/exk8s/kubeconfig/kubelet.kubeconfig",
    kube_proxy_kubeconfig: "/etc/exk8s/kubeconfig/kube-proxy.kubeconfig",
    controller_manager_kubeconfig: "/etc/exk8s/kubeconfig/controller-manager.kubeconfig",
    scheduler_kubeconfig: "/etc/exk8s/kubeconfig/scheduler.kubeconfig",
    cluster_env: "/etc/exk8s/config/cluster.env",
    etcd_bootstrap_env: "/etc/exk8s/config/etcd-bootstrap.env",
    kubelet_config: "/var/lib/kubelet/config.yaml",
    kubelet_unit: "/etc/systemd/system/kubelet.service",
    balancer_socket: "/etc/systemd/system/exk8s-apiserver-balancer.socket",
    balancer_unit: "/etc/systemd/system/exk8s-apiserver-balancer.service",
    balancer_seeds: "/etc/exk8s/balancer-seeds",
    etcd_unit: "/etc/systemd/system/etcd.service",
    apiserver_manifest: "/etc/kubernetes/manifests/kube-apiserver.yaml",
    controller_manager_manifest: "/etc/kubernetes/manifests/kube-controller-manager.yaml",
    scheduler_manifest: "/etc/kubernetes/manifests/kube-scheduler.yaml",
    cni_template: "/etc/containerd/bridge-cni.conflist.tmpl",
    cilium_values: "/etc/exk8s/config/cilium-values.yaml",
    flannel_manifest: "/etc/exk8s/manifests/flannel.yaml",
    kube_proxy_manifest: "/etc/exk8s/manifests/kube-proxy.yaml",
    coredns_manifest: "/etc/exk8s/manifests/coredns.yaml",
    rbac_manifest: "/etc/exk8s/manifests/rbac.yaml",
    encryption_config: "/etc/exk8s/config/encryption-config.yaml",
    audit_policy: "/etc/exk8s/config/audit-policy.yaml",
    containerd_config: "/etc/containerd/config.toml",
    sysctl_conf: "/etc/sysctl.d/90-exk8s-kubernetes.conf",
    modules_conf: "/etc/modules-load.d/exk8s-kubernetes.conf",
    container_scope_conf: "/etc/systemd/system/cri-containerd-.scope.d/50-exk8s-stop.conf",
    static_pod_dir: "/etc/kubernetes/manifests",
    etcd_data_dir: "/var/lib/etcd",
    audit_log_dir: "/var/log/kubernetes/audit",
    containerd_socket: "/run/containerd/containerd.sock",
    cni_bin_dir: "/usr/lib/cni",
    kubelet_config_dir: "/etc/kubernetes/kubelet.conf.d",
    containerd_registry_dir: "/etc/containerd/certs.d",
    helm_binary: "/usr/local/bin/helm",
};

/// Where each Kubernetes release's binaries live, side by side: `<this>/<version>/kubelet`. An
/// upgrade installs the new release beside the one running and switches by changing what the
/// kubelet's unit names; a failed update puts the old unit back, and the old binary is still
/// there. The agent prunes releases older than the previous one.
pub const KUBERNETES_RELEASES: &str = "/opt/exk8s/kubernetes";

/// Where each etcd release's binary lives, side by side as Kubernetes' do: `<this>/<version>/etcd`.
/// etcd's unit names the one it runs, so it restarts only when its version changes.
pub const ETCD_RELEASES: &str = "/opt/exk8s/etcd";

/// The path of etcd `version`'s server binary.
pub fn etcd_binary(version: &exk8s_common::names::Version) -> String {
    format!("{ETCD_RELEASES}/{version}/etcd")
}

/// The path of binary `name` (`kubelet`, `kubectl`) of Kubernetes `version`.
pub fn kubernetes_binary(version: &exk8s_common::names::Version, name: &str) -> String {
    format!("{KUBERNETES_RELEASES}/{version}/{name}")
}
