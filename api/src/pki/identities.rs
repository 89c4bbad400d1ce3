//! Every certificate a node holds, as data: who signs it, its subject, its usage and its SANs
//! (PKI.md "Per node" and "Kubeconfigs").
//!
//! Serving certificates for etcd and the apiserver are made once at founding and stored
//! ([`NodeServingCerts`]); everything else is minted fresh for each bundle ([`BundleCerts`]):
//! what every node carries ([`NodeCerts`]) and what only a control-plane node does
//! ([`ControlPlaneCerts`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use exk8s_common::contract::Role;
use exk8s_common::names::NodeName;
use time::OffsetDateTime;

use super::{
    CaRole, ClusterNetwork, ClusterPki, IssuedCert, KeySource, LeafSpec, NodeAddresses, PkiError,
    Usage,
};

const LOCALHOST_V4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const LOCALHOST_V6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);

/// The apiserver serving certificate: every name and address a client may use to reach it.
pub fn apiserver_spec(node: &NodeAddresses, network: &ClusterNetwork) -> LeafSpec {
    let domain = &network.cluster_domain;
    let mut ip_addresses = vec![network.service_cidr.api_service_ip()];
    ip_addresses.extend(node.all_ips());
    ip_addresses.push(LOCALHOST_V4);
    LeafSpec {
        common_name: "kube-apiserver".into(),
        organization: None,
        usage: Usage::Server,
        dns_names: vec![
            node.name.to_string(),
            network.control_plane_dns_name.clone(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            format!("kubernetes.default.svc.{domain}"),
            "localhost".into(),
        ],
        ip_addresses,
    }
}

/// etcd server and peer certificates: the node's name, its private addresses and loopback;
/// serverAuth and clientAuth, because members dial each other with them.
pub fn etcd_member_spec(node: &NodeAddresses) -> LeafSpec {
    let mut ip_addresses = node.private_ips();
    ip_addresses.extend([LOCALHOST_V4, LOCALHOST_V6]);
    LeafSpec {
        common_name: node.name.to_string(),
        organization: None,
        usage: Usage::ServerAndClient,
        dns_names: vec![node.name.to_string(), "localhost".into()],
        ip_addresses,
    }
}

/// The kubelet's serving certificate (not its client certificate — the seed's mistake).
pub fn kubelet_serving_spec(node: &NodeAddresses) -> LeafSpec {
    LeafSpec {
        common_name: format!("system:node:{}", node.name),
        organization: Some("system:nodes".into()),
        usage: Usage::Server,
        dns_names: vec![node.name.to_string()],
        ip_addresses: node.all_ips(),
    }
}

/// Client identities, each with its signer and subject (CN = user, O = group).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientIdentity {
    KubeletClient(NodeName),
    ApiserverKubeletClient,
    ApiserverEtcdClient,
    FrontProxyClient,
    EtcdHealthcheckClient,
    KubeProxy,
    ControllerManager,
    Scheduler,
    Admin,
    SuperAdmin,
}

impl ClientIdentity {
    /// The trust domain that signs this identity.
    pub fn signer(&self) -> CaRole {
        match self {
            Self::ApiserverEtcdClient | Self::EtcdHealthcheckClient => CaRole::Etcd,
            Self::FrontProxyClient => CaRole::FrontProxy,
            _ => CaRole::Cluster,
        }
    }

    /// (CN, O).
    pub fn subject(&self) -> (String, Option<&'static str>) {
        let plain = |cn: &str| (cn.to_owned(), None);
        match self {
            Self::KubeletClient(node) => (format!("system:node:{node}"), Some("system:nodes")),
            Self::ApiserverKubeletClient => plain("kube-apiserver-kubelet-client"),
            Self::ApiserverEtcdClient => plain("kube-apiserver-etcd-client"),
            Self::FrontProxyClient => plain("front-proxy-client"),
            Self::EtcdHealthcheckClient => plain("kube-etcd-healthcheck-client"),
            Self::KubeProxy => plain("system:kube-proxy"),
            Self::ControllerManager => plain("system:kube-controller-manager"),
            Self::Scheduler => plain("system:kube-scheduler"),
            Self::Admin => ("exk8s-admin".into(), Some("exk8s:cluster-admins")),
            Self::SuperAdmin => ("exk8s-super-admin".into(), Some("system:masters")),
        }
    }

    pub fn spec(&self) -> LeafSpec {
        let (common_name, organization) = self.subject();
        LeafSpec {
            common_name,
            organization: organization.map(str::to_owned),
            usage: Usage::Client,
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
        }
    }

    pub fn issue(&self, pki: &ClusterPki, now: OffsetDateTime) -> Result<IssuedCert, PkiError> {
        pki.ca(self.signer()).issue(&self.spec(), now)
    }

    /// As [`Self::issue`], with the next key of `keys`.
    pub fn issue_from(
        &self,
        pki: &ClusterPki,
        now: OffsetDateTime,
        keys: &mut KeySource<'_>,
    ) -> Result<IssuedCert, PkiError> {
        pki.ca(self.signer())
            .issue_keyed(&self.spec(), now, keys.next_key()?)
    }
}

/// Serving certificates made at founding and stored with the node.
#[derive(Debug, Clone)]
pub struct NodeServingCerts {
    pub apiserver: IssuedCert,
    pub etcd_server: IssuedCert,
    pub etcd_peer: IssuedCert,
}

impl NodeServingCerts {
    pub fn generate(
        pki: &ClusterPki,
        node: &NodeAddresses,
        network: &ClusterNetwork,
        now: OffsetDateTime,
    ) -> Result<Self, PkiError> {
        let etcd = etcd_member_spec(node);
        Ok(Self {
            apiserver: pki.cluster_ca.issue(&apiserver_spec(node, network), now)?,
            etcd_server: pki.etcd_ca.issue(&etcd, now)?,
            etcd_peer: pki.etcd_ca.issue(&etcd, now)?,
        })
    }
}

/// Certificates every node's bundle carries, whatever its role, minted fresh: the kubelet's
/// serving and client certificates and kube-proxy's client.
#[derive(Debug, Clone)]
pub struct NodeCerts {
    pub kubelet_serving: IssuedCert,
    pub kubelet_client: IssuedCert,
    pub kube_proxy: IssuedCert,
}

impl NodeCerts {
    /// How many keys one minting takes.
    pub const KEYS: usize = 3;

    pub fn mint(
        pki: &ClusterPki,
        node: &NodeAddresses,
        now: OffsetDateTime,
    ) -> Result<Self, PkiError> {
        Self::mint_from(pki, node, now, &mut KeySource::fresh(pki.algorithm))
    }

    /// As [`Self::mint`], with the keys of `keys`.
    pub fn mint_from(
        pki: &ClusterPki,
        node: &NodeAddresses,
        now: OffsetDateTime,
        keys: &mut KeySource<'_>,
    ) -> Result<Self, PkiError> {
        Ok(Self {
            kubelet_serving: pki.cluster_ca.issue_keyed(
                &kubelet_serving_spec(node),
                now,
                keys.next_key()?,
            )?,
            kubelet_client: ClientIdentity::KubeletClient(node.name.clone())
                .issue_from(pki, now, keys)?,
            kube_proxy: ClientIdentity::KubeProxy.issue_from(pki, now, keys)?,
        })
    }
}

/// Certificates only a control-plane node holds, minted fresh for each of its bundles: the
/// apiserver's clients of etcd, the kubelets and aggregated APIs, etcd's health probe, the
/// controller-manager's and scheduler's identities, and the node-local admin kubeconfigs.
#[derive(Debug, Clone)]
pub struct ControlPlaneCerts {
    pub apiserver_kubelet_client: IssuedCert,
    pub apiserver_etcd_client: IssuedCert,
    pub front_proxy_client: IssuedCert,
    pub etcd_healthcheck_client: IssuedCert,
    pub controller_manager: IssuedCert,
    pub scheduler: IssuedCert,
    pub admin: IssuedCert,
    pub super_admin: IssuedCert,
}

impl ControlPlaneCerts {
    /// How many keys one minting takes.
    pub const KEYS: usize = 8;

    pub fn mint(pki: &ClusterPki, now: OffsetDateTime) -> Result<Self, PkiError> {
        Self::mint_from(pki, now, &mut KeySource::fresh(pki.algorithm))
    }

    /// As [`Self::mint`], with the keys of `keys`.
    pub fn mint_from(
        pki: &ClusterPki,
        now: OffsetDateTime,
        keys: &mut KeySource<'_>,
    ) -> Result<Self, PkiError> {
        let mut client = |identity: ClientIdentity| identity.issue_from(pki, now, keys);
        Ok(Self {
            apiserver_kubelet_client: client(ClientIdentity::ApiserverKubeletClient)?,
            apiserver_etcd_client: client(ClientIdentity::ApiserverEtcdClient)?,
            front_proxy_client: client(ClientIdentity::FrontProxyClient)?,
            etcd_healthcheck_client: client(ClientIdentity::EtcdHealthcheckClient)?,
            controller_manager: client(ClientIdentity::ControllerManager)?,
            scheduler: client(ClientIdentity::Scheduler)?,
            admin: client(ClientIdentity::Admin)?,
            super_admin: client(ClientIdentity::SuperAdmin)?,
        })
    }
}

/// Everything one bundle's minting makes, by the node's role.
#[derive(Debug, Clone)]
pub enum BundleCerts {
    ControlPlane {
        node: NodeCerts,
        control_plane: Box<ControlPlaneCerts>,
    },
    Worker {
        node: NodeCerts,
    },
}

impl BundleCerts {
    /// How many keys one bundle of `role` takes.
    pub fn keys(role: Role) -> usize {
        match role {
            Role::ControlPlane => NodeCerts::KEYS + ControlPlaneCerts::KEYS,
            Role::Worker => NodeCerts::KEYS,
        }
    }

    pub fn mint(
        pki: &ClusterPki,
        node: &NodeAddresses,
        role: Role,
        now: OffsetDateTime,
    ) -> Result<Self, PkiError> {
        Self::mint_from(pki, node, role, now, &mut KeySource::fresh(pki.algorithm))
    }

    /// As [`Self::mint`], with the keys of `keys` (ready ones first; a source whose bundle's
    /// client left stops before its next key with [`PkiError::Stopped`]).
    pub fn mint_from(
        pki: &ClusterPki,
        node: &NodeAddresses,
        role: Role,
        now: OffsetDateTime,
        keys: &mut KeySource<'_>,
    ) -> Result<Self, PkiError> {
        let node_certs = NodeCerts::mint_from(pki, node, now, keys)?;
        Ok(match role {
            Role::ControlPlane => Self::ControlPlane {
                node: node_certs,
                control_plane: Box::new(ControlPlaneCerts::mint_from(pki, now, keys)?),
            },
            Role::Worker => Self::Worker { node: node_certs },
        })
    }

    /// What every node carries.
    pub fn node(&self) -> &NodeCerts {
        match self {
            Self::ControlPlane { node, .. } | Self::Worker { node } => node,
        }
    }

    /// What only a control-plane node carries.
    pub fn control_plane(&self) -> Option<&ControlPlaneCerts> {
        match self {
            Self::ControlPlane { control_plane, .. } => Some(control_plane),
            Self::Worker { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::KeyAlgorithm;

    #[test]
    fn a_bundle_takes_the_keys_its_role_says() {
        let now = OffsetDateTime::now_utc();
        let pki = ClusterPki::generate(KeyAlgorithm::EcdsaP256, now).unwrap();
        let node = NodeAddresses {
            name: "cp-1".parse().unwrap(),
            private_ipv4: Ipv4Addr::new(10, 0, 0, 5),
            private_ipv6: None,
            public_ipv4: None,
        };
        for role in [Role::ControlPlane, Role::Worker] {
            let mut keys = KeySource::fresh(KeyAlgorithm::EcdsaP256);
            BundleCerts::mint_from(&pki, &node, role, now, &mut keys).unwrap();
            assert_eq!(keys.generated(), BundleCerts::keys(role), "{role:?}");
        }
    }

    /// The facts known when minting are what the certificate says: every certificate of a
    /// bundle (with and without an organization, both key kinds), read back from its PEM.
    #[test]
    fn minted_facts_are_what_the_certificate_says() {
        let now = OffsetDateTime::now_utc();
        for algorithm in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::Rsa2048] {
            let pki = ClusterPki::generate(algorithm, now).unwrap();
            let node = NodeAddresses {
                name: "cp-1.cluster-9.internal".parse().unwrap(),
                private_ipv4: Ipv4Addr::new(10, 0, 0, 5),
                private_ipv6: None,
                public_ipv4: None,
            };
            let minted = BundleCerts::mint(&pki, &node, Role::ControlPlane, now).unwrap();
            let certs = crate::certificates::bundle(None, &minted);
            assert_eq!(certs.len(), 11);
            let mut organizations = 0;
            for cert in certs {
                let read = crate::pki::facts(cert.pem).unwrap();
                assert_eq!(cert.minted, Some(&read), "{algorithm:?} {}", cert.name);
                organizations += usize::from(read.subject.starts_with("O="));
            }
            assert!(organizations > 0, "no certificate had an organization");
        }
    }
}
