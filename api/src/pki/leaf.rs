//! The certificate policy every leaf follows, set explicitly because rcgen's defaults are unsafe:
//!
//! * validity: NotBefore = now − 5 min (clock skew between API and nodes), NotAfter = now +
//!   the cluster's leaf lifetime (1 year by default), never past the issuing CA's NotAfter;
//! * a random 128-bit positive serial (rcgen otherwise derives it from the key);
//! * basicConstraints critical CA:FALSE, subject key id, authority key id;
//! * keyUsage critical digitalSignature, plus keyEncipherment only for RSA keys (RSA key
//!   transport; meaningless for ECDSA);
//! * exactly the EKUs the identity needs.

use std::net::IpAddr;

use rcgen::{
    CertificateParams, CustomExtension, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyUsagePurpose, SanType, SerialNumber,
};
use time::{Duration, OffsetDateTime};

use super::{CertFacts, KeyAlgorithm, PkiError, SecretPem};

/// How far NotBefore is backdated, for clock skew.
pub(crate) const BACKDATE: Duration = Duration::minutes(5);
/// Leaf lifetime (kubeadm's default).
/// The default leaf lifetime (a cluster may choose another).
pub(crate) const LEAF_LIFETIME: Duration = Duration::days(365);
/// CA lifetime (kubeadm's default).
pub(crate) const CA_LIFETIME: Duration = Duration::days(3650);

/// What a certificate may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
    /// etcd members serve and connect to each other with the same certificate.
    ServerAndClient,
}

impl Usage {
    fn ekus(self) -> Vec<ExtendedKeyUsagePurpose> {
        match self {
            Self::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Self::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Self::ServerAndClient => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        }
    }
}

/// The subject and extensions of one leaf certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafSpec {
    /// The user name Kubernetes (or etcd) sees.
    pub common_name: String,
    /// The group; certificates here carry at most one (rcgen keeps one value per attribute).
    pub organization: Option<String>,
    pub usage: Usage,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
}

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: SecretPem,
    /// What it says of itself, when exk8s minted it in this process (None: opened from the
    /// store, read from `cert_pem` when needed).
    pub minted: Option<CertFacts>,
}

impl IssuedCert {
    /// What it says of itself: as minted, else read from its PEM.
    pub fn facts(&self) -> Result<CertFacts, PkiError> {
        match &self.minted {
            Some(facts) => Ok(facts.clone()),
            None => super::facts(&self.cert_pem),
        }
    }
}

/// 16 bytes from the OS CSPRNG, encoded by rcgen as a positive DER INTEGER.
pub(crate) fn random_serial() -> Result<SerialNumber, PkiError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|_| PkiError::Random)?;
    // A zero first byte would shorten the integer; keep all 16 bytes significant.
    bytes[0] |= 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

/// The subject name with one CN and at most one O.
pub(crate) fn subject(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

/// basicConstraints (2.5.29.19), critical, as the empty SEQUENCE that means `cA FALSE` in DER.
fn no_ca_basic_constraints() -> CustomExtension {
    let mut ext = CustomExtension::from_oid_content(&[2, 5, 29, 19], vec![0x30, 0x00]);
    ext.set_criticality(true);
    ext
}

/// subjectKeyIdentifier (2.5.29.14): the first 20 bytes of the SHA-256 of the subject's public
/// key info, as rcgen derives it for CAs. rcgen writes it only beside
/// basicConstraints, which a leaf now writes itself.
fn subject_key_identifier(subject_public_key: &[u8]) -> CustomExtension {
    let digest = exk8s_common::names::Sha256Digest::of(subject_public_key);
    let mut content = vec![0x04, 20];
    content.extend_from_slice(&digest.as_bytes()[..20]);
    CustomExtension::from_oid_content(&[2, 5, 29, 14], content)
}

/// Builds the parameters of a leaf for the public key `subject_public_key` (its DER
/// SubjectPublicKeyInfo), signed by a CA valid until `ca_not_after`.
pub(crate) fn leaf_params(
    spec: &LeafSpec,
    subject_public_key: &[u8],
    algorithm: KeyAlgorithm,
    now: OffsetDateTime,
    lifetime: Duration,
    ca_not_after: OffsetDateTime,
) -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = subject(&spec.common_name, spec.organization.as_deref());
    params.not_before = now - BACKDATE;
    params.not_after = (now + lifetime).min(ca_not_after);
    params.serial_number = Some(random_serial()?);
    // A leaf says it is no CA with a critical basicConstraints whose cA is absent: DER forbids
    // encoding a DEFAULT value, so `cA FALSE` written out (rcgen's `ExplicitNoCa`) is refused by
    // strict parsers (pyca/cryptography: "EncodedDefault"). Go writes the same empty SEQUENCE.
    params.is_ca = IsCa::NoCa;
    params.custom_extensions = vec![
        subject_key_identifier(subject_public_key),
        no_ca_basic_constraints(),
    ];
    params.use_authority_key_identifier_extension = true;
    params.key_usages = if algorithm.is_rsa() {
        vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ]
    } else {
        vec![KeyUsagePurpose::DigitalSignature]
    };
    params.extended_key_usages = spec.usage.ekus();
    let mut sans = Vec::with_capacity(spec.dns_names.len() + spec.ip_addresses.len());
    for name in &spec.dns_names {
        let ia5 = name.clone().try_into().map_err(|_| PkiError::BadDnsName {
            what: "subject alternative name",
            value: name.chars().take(64).collect(),
        })?;
        sans.push(SanType::DnsName(ia5));
    }
    sans.extend(spec.ip_addresses.iter().copied().map(SanType::IpAddress));
    params.subject_alt_names = sans;
    Ok(params)
}
