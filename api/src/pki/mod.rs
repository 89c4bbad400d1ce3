//! The cluster's trust: three certificate authorities, the service-account keypair, the
//! per-node serving certificates made at founding, the client certificates minted fresh for each
//! bundle, and the kubeconfigs that carry them — to `../shared/design/PKI.md`.
//!
//! Trust domains are separate on purpose: the etcd CA signs only etcd identities, and the
//! front-proxy CA signs only the front-proxy client, so no kubelet or kube-proxy certificate can
//! ever talk to etcd directly or assert identities through the request-header proxy.
//!
//! rcgen's defaults are unsafe for this use (validity 1975–4096, serials derived from the key,
//! no authority key id), so every certificate here sets them explicitly: see [`leaf`].
//!
//! Where PKI.md is silent we follow kubeadm (`cmd/kubeadm/app/phases/certs/certlist.go`,
//! `pkiutil`): one-year leaves, ten-year CAs, SANs as kubeadm computes them. Departures: CAs carry
//! `pathlen:0` (nothing here issues intermediates) and every leaf has a random serial.

mod algorithm;
mod ca;
mod facts;
mod identities;
mod import;
mod keygen;
mod keys;
pub mod kubeconfig;
mod leaf;
mod network;
mod renew_at;

pub use algorithm::KeyAlgorithm;
pub use ca::{CA_RSA_BITS, CaKey, CaRole, CertAuthority, ServiceAccountKey};
pub use exk8s_api_types::SecretPem;
pub use facts::{CertFacts, facts};
pub use identities::{
    BundleCerts, ClientIdentity, ControlPlaneCerts, NodeCerts, NodeServingCerts, apiserver_spec,
    etcd_member_spec, kubelet_serving_spec,
};
pub use import::{CaPart, ImportError, ImportTerms, SuppliedCa, check_distinct, import};
pub use keygen::{HELPER_COMMAND, KeyMaker, write_helper_key};
pub use keys::{KeySource, LeafKey};
pub use leaf::{IssuedCert, LeafSpec, Usage};
pub use network::{ClusterNetwork, NodeAddresses, ServiceCidr};
pub use renew_at::RenewAt;

use time::OffsetDateTime;

/// Everything that can go wrong making or loading cluster trust.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error(
        "unknown key algorithm `{0}` (expected one of ecdsa-p256, ecdsa-p384, rsa-2048, rsa-3072, rsa-4096)"
    )]
    UnknownAlgorithm(String),
    #[error("generating a {algorithm} key")]
    KeyGeneration {
        algorithm: KeyAlgorithm,
        #[source]
        source: rcgen::Error,
    },
    /// The helper process making an RSA key failed (see [`KeyMaker`]).
    #[error("the key helper making a {algorithm} key failed: {reason}")]
    KeyHelper {
        algorithm: KeyAlgorithm,
        reason: String,
    },
    #[error("signing the {what} certificate")]
    Signing {
        what: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("the service-account key is unusable: {0}")]
    InvalidServiceAccountKey(String),
    #[error("the stored {role} is unusable: {reason}")]
    InvalidCa { role: CaRole, reason: String },
    #[error("the {role} expired at {not_after}; it can sign nothing more")]
    CaExpired {
        role: CaRole,
        not_after: OffsetDateTime,
    },
    #[error("service CIDR `{0}` is invalid: {1}")]
    BadServiceCidr(String, &'static str),
    #[error("{what} `{value}` is not a valid DNS name")]
    BadDnsName { what: &'static str, value: String },
    #[error("the operating system's random source failed")]
    Random,
    #[error("a certificate the API made cannot be read back: {0}")]
    Unreadable(String),
    /// A key made for another algorithm reached a CA (a defect: pooled keys are per cluster).
    #[error("the {role} issues {expected} leaves and was handed a {got} key")]
    WrongKey {
        role: CaRole,
        expected: KeyAlgorithm,
        got: KeyAlgorithm,
    },
    /// Nobody waits for the certificates any more; minting stopped before the next key.
    #[error("minting stopped: nobody waits for it")]
    Stopped,
}

/// CAs checked by [`import`], by role; `None` where the API makes its own.
#[derive(Debug, Default)]
pub struct SuppliedCas {
    pub cluster: Option<CertAuthority>,
    pub etcd: Option<CertAuthority>,
    pub front_proxy: Option<CertAuthority>,
}

/// A cluster's long-lived trust, made once at founding and stored sealed by the API.
#[derive(Debug)]
pub struct ClusterPki {
    pub algorithm: KeyAlgorithm,
    /// Signs the apiserver and kubelet serving certs and every Kubernetes client identity.
    pub cluster_ca: CertAuthority,
    /// Signs etcd server/peer certs and the clients allowed to talk to etcd.
    pub etcd_ca: CertAuthority,
    /// Signs only the front-proxy client (the aggregation layer's request-header identity).
    pub front_proxy_ca: CertAuthority,
    /// Signs and verifies service-account tokens; every apiserver holds the same one.
    pub service_account: ServiceAccountKey,
}

impl ClusterPki {
    /// Makes the three CAs and the service-account keypair with one algorithm.
    pub fn generate(algorithm: KeyAlgorithm, now: OffsetDateTime) -> Result<Self, PkiError> {
        Self::with_supplied(algorithm, now, SuppliedCas::default())
    }

    /// The CAs the operator brought (by role, see [`import`]), the others made with
    /// `algorithm`, and a new service-account keypair.
    pub fn with_supplied(
        algorithm: KeyAlgorithm,
        now: OffsetDateTime,
        supplied: SuppliedCas,
    ) -> Result<Self, PkiError> {
        let ca = |given: Option<CertAuthority>, role| match given {
            Some(ca) => Ok(ca),
            None => CertAuthority::generate(role, algorithm, now),
        };
        Ok(Self {
            algorithm,
            cluster_ca: ca(supplied.cluster, CaRole::Cluster)?,
            etcd_ca: ca(supplied.etcd, CaRole::Etcd)?,
            front_proxy_ca: ca(supplied.front_proxy, CaRole::FrontProxy)?,
            service_account: ServiceAccountKey::generate(algorithm)?,
        })
    }

    /// Every leaf issued from now on lasts `lifetime` (capped at its CA's expiry).
    pub fn set_leaf_lifetime(&mut self, lifetime: time::Duration) {
        for ca in [
            &mut self.cluster_ca,
            &mut self.etcd_ca,
            &mut self.front_proxy_ca,
        ] {
            ca.set_leaf_lifetime(lifetime);
        }
    }

    /// The CA that signs `role`'s certificates.
    pub fn ca(&self, role: CaRole) -> &CertAuthority {
        match role {
            CaRole::Cluster => &self.cluster_ca,
            CaRole::Etcd => &self.etcd_ca,
            CaRole::FrontProxy => &self.front_proxy_ca,
        }
    }
}
