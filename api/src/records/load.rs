//! The typed loader: a node row and its cluster row become the values rendering takes —
//! addresses parsed once, sealed keys opened by their [`NodeKeyColumn`], the cluster's network
//! and versions checked — or a [`LoadError`] naming what in the stored record is unusable.

use std::net::Ipv4Addr;
use std::sync::Arc;

use super::issuers::IssuerCache;
use crate::crypto::Keyring;
use crate::db::{self, clusters::ClusterRow, nodes::NodeRow, phase::EtcdMembership};
use crate::pki::{ClusterNetwork, ClusterPki, NodeAddresses, NodeServingCerts, ServiceCidr};
use crate::render::{ClusterSpec, ControlPlaneNode, Membership, PodCidr, Versions};
use crate::trust::{self, NodeKeyColumn};

/// Why a stored record cannot be used: always a defect (or a damaged store), never a caller's
/// fault.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A node row holds something unusable.
    #[error("node {vm_id} has an unusable stored {what}")]
    Corrupt { vm_id: i64, what: &'static str },
    /// The cluster's stored trust or facts cannot be opened or parsed.
    #[error("the cluster's stored {what} cannot be used: {source}")]
    Cluster {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn unusable(node: &NodeRow, what: &'static str) -> LoadError {
    LoadError::Corrupt {
        vm_id: node.vm_id,
        what,
    }
}

/// A [`LoadError::Cluster`] for `what`.
fn cluster_fact<E: std::error::Error + Send + Sync + 'static>(
    what: &'static str,
) -> impl FnOnce(E) -> LoadError {
    move |e| LoadError::Cluster {
        what,
        source: Box::new(e),
    }
}

/// A node's name and addresses, parsed from its row.
fn optional_ip<T: std::str::FromStr>(
    node: &NodeRow,
    what: &'static str,
    text: Option<&str>,
) -> Result<Option<T>, LoadError> {
    text.map(str::parse)
        .transpose()
        .map_err(|_| unusable(node, what))
}

pub fn addresses(node: &NodeRow) -> Result<NodeAddresses, LoadError> {
    Ok(NodeAddresses {
        name: node.node_name.parse().map_err(|_| unusable(node, "name"))?,
        private_ipv4: node
            .private_ipv4
            .parse::<Ipv4Addr>()
            .map_err(|_| unusable(node, "private IPv4 address"))?,
        private_ipv6: optional_ip(node, "private IPv6 address", node.private_ipv6.as_deref())?,
        public_ipv4: optional_ip(node, "public IPv4 address", node.public_ipv4.as_deref())?,
    })
}

/// A control-plane node as rendering sees it; `all` resolves who removes a leaving one.
pub fn control_plane_node(node: &NodeRow, all: &[NodeRow]) -> Result<ControlPlaneNode, LoadError> {
    Ok(ControlPlaneNode {
        vm_id: u64::try_from(node.vm_id).map_err(|_| unusable(node, "VM id"))?,
        addresses: addresses(node)?,
        is_initial: node.is_initial,
        membership: match node.etcd_membership {
            Some(EtcdMembership::Joining) => Membership::Joining,
            Some(EtcdMembership::Leaving) => Membership::Leaving {
                by: all
                    .iter()
                    .find(|n| Some(n.id) == node.drain_by)
                    .and_then(|n| u64::try_from(n.vm_id).ok())
                    .ok_or_else(|| unusable(node, "remover"))?,
            },
            Some(EtcdMembership::Voter) => Membership::Voter,
            None => return Err(unusable(node, "etcd membership")),
        },
    })
}

/// A cluster's opened trust and durable facts.
pub struct Cluster {
    pub pki: Arc<ClusterPki>,
    pub spec: ClusterSpec,
}

/// Opens `cluster`'s PKI (through the cache of opened trust) and secrets-encryption key and
/// checks its stored facts.
pub fn cluster(
    keks: &Keyring,
    issuers: &IssuerCache,
    cluster: &ClusterRow,
) -> Result<Cluster, LoadError> {
    let pki = issuers.open(keks, cluster).map_err(cluster_fact("PKI"))?;
    let encryption_key =
        trust::open_encryption_key(keks, cluster).map_err(cluster_fact("encryption key"))?;
    let network = ClusterNetwork::new(
        ServiceCidr::parse(&cluster.service_cidr).map_err(cluster_fact("service CIDR"))?,
        &cluster.cluster_domain,
        &cluster.control_plane_dns_name,
    )
    .map_err(cluster_fact("network"))?;
    let spec = ClusterSpec {
        cluster_id: u64::try_from(cluster.id).map_err(cluster_fact("id"))?,
        org_id: u64::try_from(cluster.org_id).map_err(cluster_fact("organisation id"))?,
        name: cluster.name.parse().map_err(cluster_fact("name"))?,
        network,
        pod_cidr: PodCidr::parse(&cluster.pod_cidr).map_err(cluster_fact("pod CIDR"))?,
        pod_network: crate::cluster::Spec::from_stored(&cluster.spec_json)
            .map_err(cluster_fact("spec"))?
            .pod_network,
        versions: Versions::of(
            cluster
                .kubernetes_version
                .parse()
                .map_err(cluster_fact("Kubernetes version"))?,
        ),
        encryption_key,
    };
    Ok(Cluster { pki, spec })
}

/// The serving certificates a control-plane node was given at founding (`stored`), keys
/// opened.
pub fn serving_certs(
    keks: &Keyring,
    cluster_id: i64,
    node: &NodeRow,
    stored: Option<db::nodes::ServingRow>,
) -> Result<NodeServingCerts, LoadError> {
    let row = stored.ok_or_else(|| unusable(node, "serving certificates"))?;
    let open = |column: NodeKeyColumn, cert: &str, sealed: &str| {
        trust::open_node_cert(keks, cluster_id, node.vm_id, column, cert, sealed)
            .map_err(cluster_fact("serving certificates"))
    };
    Ok(NodeServingCerts {
        apiserver: open(
            NodeKeyColumn::Apiserver,
            &row.apiserver_cert,
            &row.apiserver_key_sealed,
        )?,
        etcd_server: open(
            NodeKeyColumn::EtcdServer,
            &row.etcd_server_cert,
            &row.etcd_server_key_sealed,
        )?,
        etcd_peer: open(
            NodeKeyColumn::EtcdPeer,
            &row.etcd_peer_cert,
            &row.etcd_peer_key_sealed,
        )?,
    })
}
