//! What rendering needs, all of it already decided: durable cluster facts, this node, its
//! peers, the credentials minted for this bundle, and the issuance metadata. Rendering is a pure
//! function of these; the CA private keys are deliberately not among them.

use std::fmt;

use exk8s_common::names::{K8sName, Nonce, Version};
use ipnet::IpNet;
use uuid::Uuid;
use zeroize::Zeroizing;

use crate::cluster::spec::PodNetwork;
use crate::pki::{BundleCerts, ClusterNetwork, NodeAddresses, NodeServingCerts, ServiceAccountKey};

use super::RenderError;
use super::catalog::ArtifactCatalog;

/// Versions of everything a node runs (defaults per the project's baseline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    pub kubernetes: Version,
    pub etcd: Version,
    pub helm: Version,
    pub cilium_chart: Version,
    pub coredns: Version,
    /// Flannel's image, for clusters whose pod network is flannel.
    pub flannel: Version,
    pub pause: Version,
}

impl Default for Versions {
    fn default() -> Self {
        let v = |s: &str| Version::new(s).unwrap_or_else(|_| unreachable!("literal is valid"));
        Self {
            kubernetes: v("v1.35.3"),
            etcd: v("v3.6.10"),
            helm: v("v3.19.2"),
            cilium_chart: v("1.19.2"),
            coredns: v("v1.12.1"),
            flannel: v("v0.28.4"),
            pause: v("3.10"),
        }
    }
}

/// The etcd release each Kubernetes minor runs: kubeadm's choice for that minor (its
/// `SupportedEtcdVersion`: 3.6.6 for 1.35, 3.6.8 for 1.36) or a newer patch of the same etcd
/// minor, vetted here. A minor not listed runs the etcd of the nearest listed minor below it
/// (the first entry's below them all).
const ETCD_FOR_MINOR: &[(u32, &str)] = &[(35, "v3.6.10"), (36, "v3.6.14")];

/// The etcd release Kubernetes `kubernetes` (`v1.MINOR.PATCH`) runs with ([`ETCD_FOR_MINOR`]).
pub fn etcd_for(kubernetes: &Version) -> Version {
    let minor = kubernetes
        .as_str()
        .strip_prefix("v1.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(0);
    let (_, etcd) = ETCD_FOR_MINOR
        .iter()
        .rev()
        .find(|(m, _)| *m <= minor)
        .unwrap_or(&ETCD_FOR_MINOR[0]);
    Version::new(*etcd).unwrap_or_else(|_| unreachable!("the table's literals are valid"))
}

impl Versions {
    /// What a node of Kubernetes `kubernetes` runs: its etcd ([`etcd_for`]) and the baseline's
    /// other versions.
    pub fn of(kubernetes: Version) -> Self {
        Self {
            etcd: etcd_for(&kubernetes),
            kubernetes,
            ..Self::default()
        }
    }
}

/// The pod IP range. Like the service CIDR, it must be a network address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodCidr(IpNet);

/// The prefix of one node's block: a /24 of an IPv4 pod CIDR, a /64 of an IPv6 one (the
/// controller-manager's defaults for `--node-cidr-mask-size`).
const NODE_PREFIX_V4: u8 = 24;
const NODE_PREFIX_V6: u8 = 64;

impl PodCidr {
    /// The prefix of the block the controller-manager gives each node
    /// (`--node-cidr-mask-size`): a /24 of IPv4, a /64 of IPv6, or the whole range when it is
    /// smaller than that.
    pub fn node_prefix(&self) -> u8 {
        let default = match self.0 {
            IpNet::V4(_) => NODE_PREFIX_V4,
            IpNet::V6(_) => NODE_PREFIX_V6,
        };
        default.max(self.0.prefix_len())
    }

    /// How many nodes the range has blocks for.
    pub fn blocks(&self) -> u64 {
        let bits = self.node_prefix() - self.0.prefix_len();
        1u64.checked_shl(u32::from(bits)).unwrap_or(u64::MAX)
    }

    pub fn parse(text: &str) -> Result<Self, RenderError> {
        let bad = |reason| RenderError::BadPodCidr(text.chars().take(64).collect(), reason);
        let net: IpNet = text.parse().map_err(|_| bad("not an address/prefix"))?;
        if net.trunc() != net {
            return Err(bad("host bits are set; give the network address"));
        }
        Ok(Self(net))
    }
}

impl fmt::Display for PodCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The 32-byte secretbox key that encrypts Secrets at rest in etcd. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct EncryptionKey(Zeroizing<[u8; 32]>);

impl EncryptionKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// A new key from the OS CSPRNG.
    pub fn generate() -> Result<Self, RenderError> {
        let mut key = Zeroizing::new([0u8; 32]);
        getrandom::fill(key.as_mut()).map_err(|_| RenderError::Random)?;
        Ok(Self(key))
    }

    pub fn expose(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EncryptionKey([redacted])")
    }
}

/// Durable facts of one cluster.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    pub cluster_id: u64,
    pub org_id: u64,
    pub name: K8sName,
    pub network: ClusterNetwork,
    pub pod_cidr: PodCidr,
    /// The pod network the first node installs.
    pub pod_network: PodNetwork,
    pub versions: Versions,
    pub encryption_key: EncryptionKey,
}

/// One control-plane VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneNode {
    pub vm_id: u64,
    pub addresses: NodeAddresses,
    /// The one node that installs cluster-wide addons.
    pub is_initial: bool,
    /// Where the node stands in etcd.
    pub membership: Membership,
}

/// A control-plane node's place in etcd, as the API last recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    /// A voting member (every founding member, and a joined one once promoted).
    Voter,
    /// Added after founding and not promoted yet: it adds itself as a learner through the
    /// voters, starts etcd into the existing cluster and is promoted once caught up.
    Joining,
    /// Being removed: the agent of the voter `by` (a VM id, chosen by the API: the oldest
    /// healthy other voter) drains it and removes it from etcd.
    Leaving { by: u64 },
}

/// The certificates and keys this node receives. No CA private key is here, by design.
#[derive(Debug, Clone, Copy)]
pub struct NodeCredentials<'a> {
    pub cluster_ca_pem: &'a str,
    pub etcd_ca_pem: &'a str,
    pub front_proxy_ca_pem: &'a str,
    pub service_account: &'a ServiceAccountKey,
    /// The public keys apiservers verify tokens with (PEM): the service account's, and the
    /// other one during a rotation of it.
    pub service_account_public_pem: &'a str,
    pub serving: &'a NodeServingCerts,
    pub minted: &'a BundleCerts,
}

/// Identity and freshness of this issuance.
#[derive(Debug, Clone)]
pub struct Issuance {
    pub bundle_id: Uuid,
    pub issued_at: i64,
    pub expires_at: i64,
    pub serial: u64,
    pub nonce: Nonce,
    pub kind: exk8s_common::contract::BundleKind,
    /// The node's generation this bundle carries.
    pub generation: u64,
    /// Workers the node's agent drains (a control-plane node's update bundle only).
    pub drains: Vec<exk8s_common::names::NodeName>,
}

/// Everything one bundle is rendered from.
#[derive(Debug, Clone, Copy)]
pub struct RenderInput<'a> {
    pub cluster: &'a ClusterSpec,
    pub node: &'a ControlPlaneNode,
    /// Every control-plane node of the cluster, this one included, in ordinal order.
    pub peers: &'a [ControlPlaneNode],
    pub credentials: NodeCredentials<'a>,
    pub issuance: &'a Issuance,
    pub artifacts: &'a ArtifactCatalog,
    /// How long an update's agent waits for each component it restarted before it puts the
    /// previous files back and reports the update failed (`--update-wait-secs`).
    pub update_wait_secs: u32,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::PodCidr;
    use exk8s_common::names::Version;

    #[test]
    fn each_kubernetes_minor_runs_its_etcd() {
        let etcd = |k: &str| super::etcd_for(&Version::new(k).unwrap()).to_string();
        assert_eq!(etcd("v1.35.3"), "v3.6.10");
        assert_eq!(etcd("v1.36.3"), "v3.6.14");
        assert_eq!(etcd("v1.36.0"), "v3.6.14");
        // Beyond the table: the nearest minor below, or the first.
        assert_eq!(etcd("v1.37.2"), "v3.6.14");
        assert_eq!(etcd("v1.34.6"), "v3.6.10");
        let of = super::Versions::of(Version::new("v1.36.3").unwrap());
        assert_eq!(
            (of.kubernetes.as_str(), of.etcd.as_str()),
            ("v1.36.3", "v3.6.14")
        );
    }

    #[test]
    fn each_node_gets_a_block_of_the_pod_cidr() {
        let v4 = PodCidr::parse("172.16.0.0/12").unwrap();
        assert_eq!((v4.node_prefix(), v4.blocks()), (24, 4096));
        let v6 = PodCidr::parse("fd00:10::/48").unwrap();
        assert_eq!((v6.node_prefix(), v6.blocks()), (64, 1 << 16));
        assert_eq!(PodCidr::parse("fd00::/8").unwrap().blocks(), 1 << 56);
        assert_eq!(
            PodCidr::parse("::/0").unwrap().blocks(),
            u64::MAX,
            "saturates"
        );
        let small = PodCidr::parse("10.1.2.0/26").unwrap();
        assert_eq!(
            (small.node_prefix(), small.blocks()),
            (26, 1),
            "smaller than a block: one node"
        );
    }
}
