//! The typed loader: a node row and its cluster row become the values rendering takes —
//! addresses parsed once, sealed keys opened by their [`NodeKeyColumn`], the cluster's network
//! and versions checked — or an [`IssuanceError`] naming what in the stored record is unusable.

use std::net::Ipv4Addr;
use std::sync::Arc;

use crate::crypto::Keyring;
use crate::db::{self, clusters::ClusterRow, nodes::NodeRow, phase::EtcdMembership};
use crate::issuance::issuers::IssuerCache;
use crate::pki::{ClusterNetwork, ClusterPki, NodeAddresses, NodeServingCerts, ServiceCidr};
use crate::render::{ClusterSpec, ControlPlaneNode, Membership, PodCidr, Versions};
use crate::trust::{self, NodeKeyColumn};

use super::IssuanceError;

fn unusable(node: &NodeRow, what: &'static str) -> IssuanceError {
    IssuanceError::Corrupt {
        vm_id: node.vm_id,
        what,
    }
}

/// A node's name and addresses, parsed from its row.
fn optional_ip<T: std::str::FromStr>(
    node: &NodeRow,
    what: &'static str,
    text: Option<&str>,
) -> Result<Option<T>, IssuanceError> {
    text.map(str::parse)
        .transpose()
        .map_err(|_| unusable(node, what))
}

pub fn addresses(node: &NodeRow) -> Result<NodeAddresses, IssuanceError> {
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
pub fn control_plane_node(
    node: &NodeRow,
    all: &[NodeRow],
) -> Result<ControlPlaneNode, IssuanceError> {
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
) -> Result<Cluster, IssuanceError> {
    let pki = issuers
        .open(keks, cluster)
        .map_err(IssuanceError::internal)?;
    let encryption_key =
        trust::open_encryption_key(keks, cluster).map_err(IssuanceError::internal)?;
    let network = ClusterNetwork::new(
        ServiceCidr::parse(&cluster.service_cidr).map_err(IssuanceError::internal)?,
        &cluster.cluster_domain,
        &cluster.control_plane_dns_name,
    )
    .map_err(IssuanceError::internal)?;
    let spec = ClusterSpec {
        cluster_id: u64::try_from(cluster.id).map_err(IssuanceError::internal)?,
        org_id: u64::try_from(cluster.org_id).map_err(IssuanceError::internal)?,
        name: cluster.name.parse().map_err(IssuanceError::internal)?,
        network,
        pod_cidr: PodCidr::parse(&cluster.pod_cidr).map_err(IssuanceError::internal)?,
        versions: Versions::of(
            cluster
                .kubernetes_version
                .parse()
                .map_err(IssuanceError::internal)?,
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
) -> Result<NodeServingCerts, IssuanceError> {
    let row = stored.ok_or_else(|| unusable(node, "serving certificates"))?;
    let open = |column: NodeKeyColumn, cert: &str, sealed: &str| {
        trust::open_node_cert(keks, cluster_id, node.vm_id, column, cert, sealed)
            .map_err(IssuanceError::internal)
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
