//! A worker's bundle: exactly what a worker needs and nothing more — the cluster CA
//! certificate, the kubelet's client certificate (`system:node:<name>` in `system:nodes`, its
//! name pinned with `--hostname-override` so the Node authorizer and NodeRestriction match it)
//! and serving certificate, the kubelet's and kube-proxy's kubeconfigs pointing at the
//! control-plane endpoint (`https://<control-plane DNS name>:6443`, never 127.0.0.1), the
//! kubelet's unit and configuration with its pool's labels and taints applied at registration,
//! containerd's and the CNI's configuration. No CA key, no service-account key, no etcd
//! certificate, no admin kubeconfig, no static pod, no addon step.

use exk8s_common::payload::{BundlePayload, Freshness, Identity, Role};

use super::files::node::{self, NodeSide};
use super::files::{BALANCED_API, FileSet};
use super::{ArtifactCatalog, ClusterSpec, Issuance, RenderError, plan};
use crate::labels::{NodeLabel, Taint};
use crate::pki::{NodeAddresses, NodeCerts};

/// One worker VM and what its pool registers it with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerNode {
    pub vm_id: u64,
    pub addresses: NodeAddresses,
    pub labels: Vec<NodeLabel>,
    pub taints: Vec<Taint>,
}

/// Everything a worker's bundle is rendered from.
#[derive(Debug, Clone, Copy)]
pub struct WorkerInput<'a> {
    pub cluster: &'a ClusterSpec,
    pub node: &'a WorkerNode,
    /// The cluster CA certificate(s), PEM (two during a rotation).
    pub cluster_ca_pem: &'a str,
    pub minted: &'a NodeCerts,
    /// The control-plane members' private addresses (the balancer's seeds).
    pub apiservers: &'a [std::net::Ipv4Addr],
    pub issuance: &'a Issuance,
    pub artifacts: &'a ArtifactCatalog,
}

/// Renders a worker's bundle payload.
pub fn render_worker_bundle(input: &WorkerInput<'_>) -> Result<BundlePayload, RenderError> {
    let cluster = input.cluster;
    let issuance = input.issuance;
    let mut files = FileSet::default();
    node::files(
        &NodeSide {
            cluster,
            vm_id: input.node.vm_id,
            addresses: &input.node.addresses,
            cluster_ca_pem: input.cluster_ca_pem,
            certs: input.minted,
            // Through the node's balancer: never an apiserver that is down or stopping.
            server: BALANCED_API,
            role: Role::Worker,
            apiservers: input.apiservers,
            labels: &input.node.labels,
            taints: &input.node.taints,
        },
        &mut files,
    )?;
    Ok(BundlePayload {
        identity: Identity {
            bundle_id: issuance.bundle_id,
            cluster_id: cluster.cluster_id,
            cluster_name: cluster.name.clone(),
            org_id: cluster.org_id,
            vm_id: input.node.vm_id,
            node_name: input.node.addresses.name.clone(),
            role: Role::Worker,
            is_initial_control_plane: false,
            kind: issuance.kind,
            generation: issuance.generation,
        },
        freshness: Freshness {
            issued_at: issuance.issued_at,
            expires_at: issuance.expires_at,
            serial: issuance.serial,
            nonce: issuance.nonce.clone(),
        },
        files: files.into_bundle_files()?,
        artifacts: plan::worker_artifacts(cluster, input.artifacts)?,
        packages: plan::packages(),
        plan: plan::worker_steps()?,
    })
}
