//! The addressing facts certificates are computed from: the service CIDR (whose first address
//! is the `kubernetes` Service VIP), the cluster domain, the shared control-plane DNS name, and
//! each node's addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use exk8s_common::names::NodeName;
use ipnet::IpNet;

use super::PkiError;

/// The Service IP range. Refuses a CIDR with host bits set: `10.96.0.5/12` is not a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceCidr(IpNet);

impl ServiceCidr {
    pub fn parse(text: &str) -> Result<Self, PkiError> {
        let bad = |reason| PkiError::BadServiceCidr(text.chars().take(64).collect(), reason);
        let net: IpNet = text.parse().map_err(|_| bad("not an address/prefix"))?;
        if net.trunc() != net {
            return Err(bad("host bits are set; give the network address"));
        }
        // Room for the API VIP (.1) and the DNS VIP (.10) at least.
        let host_bits = u32::from(net.max_prefix_len() - net.prefix_len());
        if host_bits < 4 {
            return Err(bad("too small; it must hold at least 16 addresses"));
        }
        Ok(Self(net))
    }

    /// The n-th address of the range (0 is the network address).
    fn nth(&self, n: u32) -> IpAddr {
        match self.0.network() {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) + n)),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) + u128::from(n))),
        }
    }

    /// The first usable address: the `kubernetes` Service VIP (10.96.0.1 for 10.96.0.0/12).
    pub fn api_service_ip(&self) -> IpAddr {
        self.nth(1)
    }

    /// The cluster DNS Service IP, the tenth address (10.96.0.10), as kubeadm chooses it.
    pub fn dns_service_ip(&self) -> IpAddr {
        self.nth(10)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip)
    }
}

impl std::fmt::Display for ServiceCidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Cluster-wide naming facts the apiserver certificate depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNetwork {
    pub service_cidr: ServiceCidr,
    /// `cluster.local` by default.
    pub cluster_domain: String,
    /// The shared name every control-plane node answers to (`exk8s-7-2a.k8s.example.com`).
    pub control_plane_dns_name: String,
}

impl ClusterNetwork {
    pub fn new(
        service_cidr: ServiceCidr,
        cluster_domain: &str,
        control_plane_dns_name: &str,
    ) -> Result<Self, PkiError> {
        for (what, value) in [
            ("cluster domain", cluster_domain),
            ("control-plane DNS name", control_plane_dns_name),
        ] {
            if NodeName::new(value).is_err() {
                return Err(PkiError::BadDnsName {
                    what,
                    value: value.chars().take(64).collect(),
                });
            }
        }
        Ok(Self {
            service_cidr,
            cluster_domain: cluster_domain.to_owned(),
            control_plane_dns_name: control_plane_dns_name.to_owned(),
        })
    }
}

/// One node's name and addresses, as the compute API reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddresses {
    /// Lowercase RFC 1123 name, exactly as the kubelet registers it.
    pub name: NodeName,
    pub private_ipv4: Ipv4Addr,
    pub private_ipv6: Option<Ipv6Addr>,
    pub public_ipv4: Option<Ipv4Addr>,
}

impl NodeAddresses {
    /// Addresses inside the cluster network (what etcd and the kubelet listen on).
    pub fn private_ips(&self) -> Vec<IpAddr> {
        let mut ips = vec![IpAddr::V4(self.private_ipv4)];
        ips.extend(self.private_ipv6.map(IpAddr::V6));
        ips
    }

    /// Every address clients may reach the node at.
    pub fn all_ips(&self) -> Vec<IpAddr> {
        let mut ips = self.private_ips();
        ips.extend(self.public_ipv4.map(IpAddr::V4));
        ips
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_vips_are_computed_from_the_cidr() {
        let cidr = ServiceCidr::parse("10.96.0.0/12").unwrap();
        assert_eq!(cidr.api_service_ip().to_string(), "10.96.0.1");
        assert_eq!(cidr.dns_service_ip().to_string(), "10.96.0.10");
        let other = ServiceCidr::parse("172.20.0.0/16").unwrap();
        assert_eq!(other.api_service_ip().to_string(), "172.20.0.1");
        let v6 = ServiceCidr::parse("fd00:10:96::/112").unwrap();
        assert_eq!(v6.api_service_ip().to_string(), "fd00:10:96::1");
    }

    #[test]
    fn a_cidr_that_is_not_a_network_is_refused() {
        for bad in [
            "10.96.0.5/12",
            "10.96.0.0",
            "10.96.0.0/33",
            "banana",
            "10.96.0.0/30",
        ] {
            assert!(
                matches!(ServiceCidr::parse(bad), Err(PkiError::BadServiceCidr(..))),
                "{bad}"
            );
        }
    }
}
