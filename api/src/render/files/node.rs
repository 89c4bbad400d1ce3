//! What every node's bundle carries, whatever its role: the cluster CA certificate, the
//! kubelet's serving certificate, the kubelet's and kube-proxy's kubeconfigs (pointing at
//! `server`), the kubelet's unit and configuration, containerd's configuration and the CNI
//! configuration.

use super::super::paths::PATHS;
use super::super::{RenderError, RenderInput, contexts, render};
use super::FileSet;
use crate::pki::ClientIdentity;

pub(super) fn files(
    input: &RenderInput<'_>,
    server: &str,
    files: &mut FileSet,
) -> Result<(), RenderError> {
    let p = &PATHS;
    let cluster = input.cluster;
    let network = &cluster.network;
    let node = &input.node.addresses;
    let minted = input.credentials.minted.node();
    let node_ip = node.private_ipv4.to_string();

    files.public(p.ca_cert, input.credentials.cluster_ca_pem.as_bytes());
    files.cert(p.kubelet_cert, p.kubelet_key, &minted.kubelet_serving);
    files.kubeconfig(
        p.kubelet_kubeconfig,
        input,
        server,
        &ClientIdentity::KubeletClient(node.name.clone()),
        &minted.kubelet_client,
    );
    files.kubeconfig(
        p.kube_proxy_kubeconfig,
        input,
        server,
        &ClientIdentity::KubeProxy,
        &minted.kube_proxy,
    );
    files.public(
        p.kubelet_unit,
        render(&contexts::KubeletUnit {
            paths: p,
            node_name: node.name.as_str(),
            node_ip: node_ip.clone(),
        })?,
    );
    files.public(
        p.kubelet_config,
        render(&contexts::KubeletConfig {
            paths: p,
            node_ip,
            dns_service_ip: network.service_cidr.dns_service_ip().to_string(),
            cluster_domain: &network.cluster_domain,
        })?,
    );
    files.public(
        p.containerd_config,
        render(&contexts::Containerd {
            pause_image: format!("registry.k8s.io/pause:{}", cluster.versions.pause),
            cni_bin_dir: p.cni_bin_dir,
            cni_conf_dir: "/etc/cni/net.d",
        })?,
    );
    files.public(
        p.cni_conflist,
        render(&contexts::BridgeCni {
            pod_cidr: cluster.pod_cidr.to_string(),
        })?,
    );
    Ok(())
}
