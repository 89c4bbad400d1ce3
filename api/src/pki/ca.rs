//! Certificate authorities (made, stored as PEM, loaded back as issuers) and the
//! service-account keypair.

use std::fmt;

use rcgen::{
    BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData,
};
use time::{Duration, OffsetDateTime};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::leaf::{BACKDATE, CA_LIFETIME, LEAF_LIFETIME, leaf_params, random_serial, subject};
use super::{IssuedCert, KeyAlgorithm, LeafSpec, PkiError, SecretPem};

/// The three trust domains of a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaRole {
    Cluster,
    Etcd,
    FrontProxy,
}

impl CaRole {
    pub const ALL: [Self; 3] = [Self::Cluster, Self::Etcd, Self::FrontProxy];

    /// The CA's subject CN (PKI.md).
    pub fn common_name(self) -> &'static str {
        match self {
            Self::Cluster => "kubernetes-ca",
            Self::Etcd => "etcd-ca",
            Self::FrontProxy => "front-proxy-ca",
        }
    }
}

impl fmt::Display for CaRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cluster => "cluster CA",
            Self::Etcd => "etcd CA",
            Self::FrontProxy => "front-proxy CA",
        })
    }
}

/// A CA: its certificate, its (secret) key, and an issuer ready to sign.
pub struct CertAuthority {
    role: CaRole,
    algorithm: KeyAlgorithm,
    cert_pem: String,
    key_pem: SecretPem,
    not_after: OffsetDateTime,
    /// How long the leaves it issues last (capped at its own expiry).
    leaf_lifetime: Duration,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertAuthority")
            .field("role", &self.role)
            .field("algorithm", &self.algorithm)
            .field("not_after", &self.not_after)
            .field("key", &self.key_pem)
            .finish_non_exhaustive()
    }
}

impl CertAuthority {
    /// A new self-signed CA: CA:TRUE (pathlen 0), keyCertSign + cRLSign + digitalSignature,
    /// subject key id, no EKU, ten years from five minutes ago.
    pub fn generate(
        role: CaRole,
        algorithm: KeyAlgorithm,
        now: OffsetDateTime,
    ) -> Result<Self, PkiError> {
        let key = algorithm.generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = subject(role.common_name(), None);
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_LIFETIME;
        params.serial_number = Some(random_serial()?);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .map_err(|source| PkiError::Signing {
                what: role.to_string(),
                source,
            })?;
        Self::from_pem(role, &cert.pem(), SecretPem::new(key.serialize_pem()))
    }

    /// Loads a stored CA (certificate PEM + private key PEM) as an issuer, checking that the
    /// certificate is a CA and that the key is the certificate's key.
    pub fn from_pem(role: CaRole, cert_pem: &str, key_pem: SecretPem) -> Result<Self, PkiError> {
        let invalid = |reason: &str| PkiError::InvalidCa {
            role,
            reason: reason.to_owned(),
        };
        let key = KeyPair::from_pem(key_pem.expose())
            .map_err(|_| invalid("the private key is not a PEM key rcgen can use"))?;
        let der =
            first_certificate_der(cert_pem).ok_or_else(|| invalid("not a PEM certificate"))?;
        let (_, cert) = X509Certificate::from_der(&der)
            .map_err(|_| invalid("the certificate does not parse"))?;
        if !cert.is_ca() {
            return Err(invalid(
                "the certificate is not a CA (basicConstraints CA:FALSE)",
            ));
        }
        if cert.public_key().raw != key.subject_public_key_info().as_slice() {
            return Err(invalid("the private key does not match the certificate"));
        }
        let algorithm = algorithm_of(&key).ok_or_else(|| invalid("unsupported key algorithm"))?;
        let not_after = cert.validity().not_after.to_datetime();
        let issuer = Issuer::from_ca_cert_der(&der.into(), key)
            .map_err(|_| invalid("rcgen cannot use the certificate as an issuer"))?;
        Ok(Self {
            role,
            algorithm,
            cert_pem: cert_pem.to_owned(),
            key_pem,
            not_after,
            leaf_lifetime: LEAF_LIFETIME,
            issuer,
        })
    }

    /// Leaves issued from now on last `lifetime` (the cluster's setting).
    pub fn set_leaf_lifetime(&mut self, lifetime: Duration) {
        self.leaf_lifetime = lifetime;
    }

    pub fn role(&self) -> CaRole {
        self.role
    }

    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key, for sealing into the database. It never goes to a node.
    pub fn key_pem(&self) -> &SecretPem {
        &self.key_pem
    }

    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    /// Issues a leaf with a fresh key of the CA's algorithm.
    pub fn issue(&self, spec: &LeafSpec, now: OffsetDateTime) -> Result<IssuedCert, PkiError> {
        if now >= self.not_after {
            return Err(PkiError::CaExpired {
                role: self.role,
                not_after: self.not_after,
            });
        }
        let key = self.algorithm.generate()?;
        let params = leaf_params(
            spec,
            self.algorithm,
            now,
            self.leaf_lifetime,
            self.not_after,
        )?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|source| PkiError::Signing {
                what: spec.common_name.clone(),
                source,
            })?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: SecretPem::new(key.serialize_pem()),
        })
    }
}

/// Decodes the first `CERTIFICATE` block of a PEM text.
fn first_certificate_der(pem_text: &str) -> Option<Vec<u8>> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem_text.as_bytes()).ok()?;
    (pem.label == "CERTIFICATE").then_some(pem.contents)
}

fn algorithm_of(key: &KeyPair) -> Option<KeyAlgorithm> {
    use x509_parser::public_key::PublicKey;
    use x509_parser::x509::SubjectPublicKeyInfo;

    let alg = key.algorithm();
    if alg == &rcgen::PKCS_ECDSA_P256_SHA256 {
        return Some(KeyAlgorithm::EcdsaP256);
    }
    if alg == &rcgen::PKCS_ECDSA_P384_SHA384 {
        return Some(KeyAlgorithm::EcdsaP384);
    }
    if alg != &rcgen::PKCS_RSA_SHA256 {
        return None;
    }
    let spki = key.subject_public_key_info();
    let (_, info) = SubjectPublicKeyInfo::from_der(&spki).ok()?;
    match info.parsed().ok()? {
        PublicKey::RSA(rsa) => match rsa.key_size() {
            2048 => Some(KeyAlgorithm::Rsa2048),
            3072 => Some(KeyAlgorithm::Rsa3072),
            4096 => Some(KeyAlgorithm::Rsa4096),
            _ => None,
        },
        _ => None,
    }
}

/// The service-account keypair: the public key verifies tokens (`--service-account-key-file`),
/// the private key signs them (`--service-account-signing-key-file`,
/// `--service-account-private-key-file`).
#[derive(Debug, Clone)]
pub struct ServiceAccountKey {
    /// SubjectPublicKeyInfo PEM (`PUBLIC KEY`) — what `--service-account-key-file` needs.
    pub public_pem: String,
    /// PKCS#8 PEM (`PRIVATE KEY`).
    pub private_pem: SecretPem,
}

impl ServiceAccountKey {
    pub fn generate(algorithm: KeyAlgorithm) -> Result<Self, PkiError> {
        let key = algorithm.generate()?;
        Ok(Self {
            public_pem: key.public_key_pem(),
            private_pem: SecretPem::new(key.serialize_pem()),
        })
    }
}
