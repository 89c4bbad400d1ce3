//! What every node's bundle carries, whatever its role: the cluster CA certificate, the
//! kubelet's serving certificate, the kubelet's and kube-proxy's kubeconfigs (pointing at the
//! node's apiserver endpoint), the kubelet's unit and configuration — with the labels and taints
//! it registers its node with — the node-local apiserver balancer's socket, unit and seeds (the
//! members' addresses, until the control plane's name resolves),
//! containerd's configuration, the CNI configuration, and the kernel modules and parameters a
//! node needs.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use exk8s_common::contract::Role;

use super::super::paths::PATHS;
use super::super::{ClusterSpec, RenderError, contexts, render};
use super::{FileSet, Trust};
use crate::cluster::spec::PodNetwork;
use crate::labels::{NodeLabel, Taint};
use crate::pki::{ClientIdentity, NodeAddresses, NodeCerts};

/// The pods' MTU with flannel: a 1500-byte link less VXLAN's 50 bytes of headers (flannel's own
/// choice on such a link). A cloud with a smaller link MTU fragments the tunnel's packets.
const FLANNEL_POD_MTU: u32 = 1450;

/// What a node's own files are made from.
pub(in crate::render) struct NodeSide<'a> {
    pub cluster: &'a ClusterSpec,
    /// The VM the node runs on (its provider ID's).
    pub vm_id: u64,
    pub addresses: &'a NodeAddresses,
    /// The cluster CA certificate(s), PEM.
    pub cluster_ca_pem: &'a str,
    pub certs: &'a NodeCerts,
    /// Where the kubelet and kube-proxy reach the apiserver.
    pub server: &'a str,
    pub role: Role,
    /// The control-plane members' private addresses, as the bundle is made: the node's
    /// balancer uses them until the control plane's name first resolves.
    pub apiservers: &'a [Ipv4Addr],
    /// Set by the kubelet when it registers its node.
    pub labels: &'a [NodeLabel],
    pub taints: &'a [Taint],
}

pub(in crate::render) fn files(
    side: &NodeSide<'_>,
    files: &mut FileSet,
) -> Result<(), RenderError> {
    let p = &PATHS;
    let cluster = side.cluster;
    let network = &cluster.network;
    let node = side.addresses;
    let minted = side.certs;
    let node_ip = node.private_ipv4.to_string();
    let trust = Trust {
        cluster_name: cluster.name.as_str(),
        server: side.server,
        ca_pem: side.cluster_ca_pem,
    };

    files.public(p.ca_cert, side.cluster_ca_pem.as_bytes());
    files.cert(p.kubelet_cert, p.kubelet_key, &minted.kubelet_serving);
    files.kubeconfig(
        p.kubelet_kubeconfig,
        &trust,
        &ClientIdentity::KubeletClient(node.name.clone()),
        &minted.kubelet_client,
    );
    files.kubeconfig(
        p.kube_proxy_kubeconfig,
        &trust,
        &ClientIdentity::KubeProxy,
        &minted.kube_proxy,
    );
    files.public(
        p.kubelet_unit,
        render(&contexts::KubeletUnit {
            paths: p,
            kubelet_binary: super::super::paths::kubernetes_binary(
                &cluster.versions.kubernetes,
                "kubelet",
            ),
            role: side.role.as_str(),
            node_name: node.name.as_str(),
            node_ip: node_ip.clone(),
            node_labels: side
                .labels
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
            configuration_directory: p
                .kubelet_config_dir
                .strip_prefix("/etc/")
                .unwrap_or(p.kubelet_config_dir),
        })?,
    );
    files.public(
        p.kubelet_config,
        render(&contexts::KubeletConfig {
            paths: p,
            node_ip,
            dns_service_ip: network.service_cidr.dns_service_ip().to_string(),
            cluster_domain: &network.cluster_domain,
            provider_id: exk8s_api_types::provider_id(cluster.cluster_id, side.vm_id),
            static_pods: matches!(side.role, Role::ControlPlane),
            register_with_taints: side
                .taints
                .iter()
                .map(|t| contexts::TaintContext {
                    key: t.key(),
                    value: t.value(),
                    effect: t.effect().as_str(),
                })
                .collect(),
        })?,
    );
    files.public(
        p.containerd_config,
        render(&contexts::Containerd {
            pause_image: format!("registry.k8s.io/pause:{}", cluster.versions.pause),
            cni_bin_dir: p.cni_bin_dir,
            cni_conf_dir: "/etc/cni/net.d",
            cni_template: p.cni_template,
            registry_config_path: p.containerd_registry_dir,
        })?,
    );
    files.public(
        p.balancer_socket,
        render(&contexts::BalancerSocket {
            listen: super::BALANCER_LISTEN,
        })?,
    );
    files.public(
        p.balancer_unit,
        render(&contexts::BalancerUnit {
            paths: p,
            apiserver: format!("{}:6443", network.control_plane_dns_name),
            listen: super::BALANCER_LISTEN,
        })?,
    );
    files.public(p.balancer_seeds, seeds(side.apiservers));
    files.public(p.sysctl_conf, render(&contexts::KernelParameters {})?);
    files.public(p.modules_conf, render(&contexts::KernelModules {})?);
    files.public(
        p.container_scope_conf,
        render(&contexts::ContainerScopeStop {})?,
    );
    // The bridge configuration containerd writes once the kubelet hands it the node's pod CIDR
    // (`Node.spec.podCIDR`, allocated by the controller-manager): until Cilium takes over, or
    // for good with flannel, which routes between the nodes' bridges.
    let flannel = cluster.pod_network == PodNetwork::Flannel;
    files.public(
        p.cni_template,
        render(&contexts::BridgeCni {
            masquerade: !flannel,
            mtu: flannel.then_some(FLANNEL_POD_MTU),
        })?,
    );
    Ok(())
}

/// The balancer's seeds file: each member's apiserver, `IP:6443`, one a line.
fn seeds(apiservers: &[Ipv4Addr]) -> String {
    let mut text = String::from(
        "# The control-plane members when this bundle was made. The node's apiserver balancer\n\
         # uses them until the control plane's DNS name first resolves.\n",
    );
    for ip in apiservers {
        // Writing to a String cannot fail.
        let _ = writeln!(text, "{ip}:6443");
    }
    text
}
