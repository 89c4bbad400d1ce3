//! A cluster's trust at rest: sealing the PKI into a cluster row, and opening it again. The
//! associated data of every sealed value names its cluster (and node) and column. And what a
//! trust file carries: each CA, and during a CA rotation the one trusted beside it ([`Trusted`]).

use std::sync::Arc;

use base64::Engine as _;
use exk8s_common::names::NodeName;

use crate::crypto::{Keyring, SealError};
use crate::db::clusters::{ClusterRow, Trust};
use crate::db::rotations::{Rotation, RotationPhase};
use crate::pki::{
    CaRole, CertAuthority, ClusterPki, IssuedCert, KeyAlgorithm, PkiError, SecretPem,
    ServiceAccountKey,
};
use crate::render::EncryptionKey;

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("cluster {0} has no stored trust (founding did not finish)")]
    Missing(i64),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Spec(#[from] crate::cluster::SpecError),
}

pub fn cluster_aad(cluster_id: i64, column: &str) -> String {
    format!("cluster/{cluster_id}/{column}")
}

pub fn node_aad(cluster_id: i64, vm_id: i64, column: &str) -> String {
    format!("node/{cluster_id}/{vm_id}/{column}")
}

/// Seals a new cluster's PKI and secrets-encryption key for its row.
pub fn seal(
    keks: &Keyring,
    cluster_id: i64,
    pki: &ClusterPki,
    encryption: &EncryptionKey,
) -> Result<Trust, SealError> {
    let seal = |column: &str, pem: &SecretPem| {
        keks.seal(&cluster_aad(cluster_id, column), pem.expose().as_bytes())
    };
    let encoded = zeroize::Zeroizing::new(
        base64::engine::general_purpose::STANDARD.encode(encryption.expose()),
    );
    Ok(Trust {
        ca_cert: pki.cluster_ca.cert_pem().to_owned(),
        ca_key_sealed: seal("ca_key", pki.cluster_ca.key_pem())?,
        etcd_ca_cert: pki.etcd_ca.cert_pem().to_owned(),
        etcd_ca_key_sealed: seal("etcd_ca_key", pki.etcd_ca.key_pem())?,
        front_proxy_ca_cert: pki.front_proxy_ca.cert_pem().to_owned(),
        front_proxy_ca_key_sealed: seal("front_proxy_ca_key", pki.front_proxy_ca.key_pem())?,
        sa_public: pki.service_account.public_pem.clone(),
        sa_key_sealed: seal("sa_key", &pki.service_account.private_pem)?,
        encryption_key_sealed: keks.seal(
            &cluster_aad(cluster_id, "encryption_key"),
            encoded.as_bytes(),
        )?,
    })
}

/// Opens a cluster row's PKI (CAs as issuers, the service-account pair).
pub fn open(keks: &Keyring, row: &ClusterRow) -> Result<Arc<ClusterPki>, TrustError> {
    let missing = || TrustError::Missing(row.id);
    let algorithm: KeyAlgorithm = row.key_algorithm.parse()?;
    let ca = |role: CaRole,
              cert: &Option<String>,
              sealed: &Option<String>,
              column: &str|
     -> Result<CertAuthority, TrustError> {
        let key = keks.open_text(
            &cluster_aad(row.id, column),
            sealed.as_deref().ok_or_else(missing)?,
        )?;
        Ok(CertAuthority::from_pem(
            role,
            cert.as_deref().ok_or_else(missing)?,
            SecretPem::new(key.to_string()),
            algorithm,
        )?)
    };
    let sa_key = keks.open_text(
        &cluster_aad(row.id, "sa_key"),
        row.sa_key_sealed.as_deref().ok_or_else(missing)?,
    )?;
    let mut pki = ClusterPki {
        algorithm,
        cluster_ca: ca(CaRole::Cluster, &row.ca_cert, &row.ca_key_sealed, "ca_key")?,
        etcd_ca: ca(
            CaRole::Etcd,
            &row.etcd_ca_cert,
            &row.etcd_ca_key_sealed,
            "etcd_ca_key",
        )?,
        front_proxy_ca: ca(
            CaRole::FrontProxy,
            &row.front_proxy_ca_cert,
            &row.front_proxy_ca_key_sealed,
            "front_proxy_ca_key",
        )?,
        service_account: ServiceAccountKey {
            public_pem: row.sa_public.clone().ok_or_else(missing)?,
            private_pem: SecretPem::new(sa_key.to_string()),
        },
    };
    pki.set_leaf_lifetime(crate::cluster::Spec::from_stored(&row.spec_json)?.leaf_lifetime());
    Ok(Arc::new(pki))
}

/// Opens the secrets-encryption key.
pub fn open_encryption_key(keks: &Keyring, row: &ClusterRow) -> Result<EncryptionKey, TrustError> {
    let sealed = row
        .encryption_key_sealed
        .as_deref()
        .ok_or(TrustError::Missing(row.id))?;
    let encoded = keks.open_text(&cluster_aad(row.id, "encryption_key"), sealed)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded.as_bytes())
        .map_err(|_| SealError::Open(cluster_aad(row.id, "encryption_key")))?;
    let key: [u8; 32] = bytes
        .try_into()
        .map_err(|_| SealError::Open(cluster_aad(row.id, "encryption_key")))?;
    Ok(EncryptionKey::from_bytes(key))
}

/// The sealed key columns of a node's stored serving certificates; each names its associated
/// data, so a key sealed for one column never opens as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKeyColumn {
    EtcdServer,
    EtcdPeer,
    Apiserver,
}

impl NodeKeyColumn {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EtcdServer => "etcd_server_key",
            Self::EtcdPeer => "etcd_peer_key",
            Self::Apiserver => "apiserver_key",
        }
    }
}

/// Seals a node's serving key.
pub fn seal_node_key(
    keks: &Keyring,
    cluster_id: i64,
    vm_id: i64,
    column: NodeKeyColumn,
    cert: &IssuedCert,
) -> Result<String, SealError> {
    keks.seal(
        &node_aad(cluster_id, vm_id, column.as_str()),
        cert.key_pem.expose().as_bytes(),
    )
}

/// Opens a node's stored serving certificate and key.
pub fn open_node_cert(
    keks: &Keyring,
    cluster_id: i64,
    vm_id: i64,
    column: NodeKeyColumn,
    cert_pem: &str,
    sealed: &str,
) -> Result<IssuedCert, SealError> {
    let key = keks.open_text(&node_aad(cluster_id, vm_id, column.as_str()), sealed)?;
    Ok(IssuedCert {
        cert_pem: cert_pem.to_owned(),
        key_pem: SecretPem::new(key.to_string()),
        minted: None,
    })
}

/// The group name of a cluster's control-plane nodes (a worker pool's name is its group).
pub const CONTROL_PLANE_GROUP: &str = "cp";

/// A node's name: its group and its VM, so names never collide between groups and are never
/// reused when a machine is replaced.
pub fn node_name(
    cluster_id: i64,
    group: &str,
    vm_id: i64,
) -> Result<NodeName, exk8s_common::names::NameError> {
    NodeName::new(format!("{group}-{vm_id}.cluster-{cluster_id}.internal"))
}

/// The CA certificates every trust file carries, per CA (PEM, one or two certificates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trusted {
    pub cluster: String,
    pub etcd: String,
    pub front_proxy: String,
}

impl Trusted {
    /// The cluster's CAs, plus the one trusted beside the rotating CA while a rotation is in
    /// trust-both or sign-new.
    pub fn of(pki: &ClusterPki, rotation: Option<&Rotation>) -> Self {
        let bundle = |role: CaRole| bundle(pki.ca(role).cert_pem(), role, rotation);
        Self {
            cluster: bundle(CaRole::Cluster),
            etcd: bundle(CaRole::Etcd),
            front_proxy: bundle(CaRole::FrontProxy),
        }
    }
}

/// What is trusted for `role` whose signing CA is `own` (PEM): `own`, plus the other CA while
/// `rotation` of that role is in trust-both or sign-new.
pub fn bundle(own: &str, role: CaRole, rotation: Option<&Rotation>) -> String {
    let mut pem = own.to_owned();
    if let Some(Rotation {
        ca,
        other_cert: Some(other),
        phase: RotationPhase::TrustBoth | RotationPhase::SignNew,
        ..
    }) = rotation
    {
        if *ca == role {
            if !pem.ends_with('\n') {
                pem.push('\n');
            }
            pem.push_str(other);
        }
    }
    pem
}

/// What an operator's client trusts for the cluster CA signing with `own` (PEM): [`bundle`]'s,
/// and the standby made for the CA's next rotation ([`crate::standby`]) when there is one.
pub fn operator_bundle(own: &str, rotation: Option<&Rotation>, standby: Option<&str>) -> String {
    let mut pem = bundle(own, CaRole::Cluster, rotation);
    if let Some(standby) = standby.filter(|s| !pem.contains(s.trim())) {
        if !pem.ends_with('\n') {
            pem.push('\n');
        }
        pem.push_str(standby);
    }
    pem
}
