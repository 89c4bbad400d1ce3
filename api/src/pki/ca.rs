//! Certificate authorities (made, stored as PEM, loaded back as issuers) and the
//! service-account keypair.

use std::fmt;

use rcgen::{
    BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData,
};
use time::{Duration, OffsetDateTime};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::leaf::{BACKDATE, CA_LIFETIME, LEAF_LIFETIME, leaf_params, random_serial, subject};
use super::{IssuedCert, KeyAlgorithm, LeafKey, LeafSpec, PkiError, SecretPem};

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

/// What a CA's own key is. The API's CAs use the cluster's algorithm; an imported one may use
/// another allowed key (its leaves still use the cluster's algorithm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaKey {
    EcdsaP256,
    EcdsaP384,
    Rsa { bits: usize },
}

impl fmt::Display for CaKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EcdsaP256 => f.write_str("ECDSA P-256"),
            Self::EcdsaP384 => f.write_str("ECDSA P-384"),
            Self::Rsa { bits } => write!(f, "RSA-{bits}"),
        }
    }
}

/// RSA CA keys exk8s signs with: at least 2048 bits (NIST SP 800-57), at most 8192.
pub const CA_RSA_BITS: std::ops::RangeInclusive<usize> = 2048..=8192;

/// A CA: its certificate, its (secret) key, and an issuer ready to sign.
pub struct CertAuthority {
    role: CaRole,
    key: CaKey,
    /// The algorithm of the leaves it issues (the cluster's).
    leaf_algorithm: KeyAlgorithm,
    cert_pem: String,
    key_pem: SecretPem,
    not_after: OffsetDateTime,
    /// Its subject as text: the issuer of every leaf it signs.
    subject: String,
    /// Its SubjectPublicKeyInfo (DER).
    public_key: Vec<u8>,
    /// How long the leaves it issues last (capped at its own expiry).
    leaf_lifetime: Duration,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertAuthority")
            .field("role", &self.role)
            .field("ca_key", &self.key)
            .field("leaf_algorithm", &self.leaf_algorithm)
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
        Self::from_pem(
            role,
            &cert.pem(),
            SecretPem::new(key.serialize_pem()),
            algorithm,
        )
    }

    /// Loads a stored CA (certificate PEM + private key PEM) as an issuer of `leaf_algorithm`
    /// leaves, checking that the certificate is a CA and that the key is the certificate's key.
    pub fn from_pem(
        role: CaRole,
        cert_pem: &str,
        key_pem: SecretPem,
        leaf_algorithm: KeyAlgorithm,
    ) -> Result<Self, PkiError> {
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
        let ca_key =
            ca_key(&cert).map_err(|reason| invalid(&format!("its certificate {reason}")))?;
        let not_after = cert.validity().not_after.to_datetime();
        let subject = leaf_issuer(&cert).map_err(|reason| invalid(&reason))?;
        let public_key = cert.public_key().raw.to_vec();
        let issuer = Issuer::from_ca_cert_der(&der.into(), key)
            .map_err(|_| invalid("rcgen cannot use the certificate as an issuer"))?;
        Ok(Self {
            role,
            key: ca_key,
            leaf_algorithm,
            cert_pem: cert_pem.to_owned(),
            key_pem,
            not_after,
            subject,
            public_key,
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

    /// Its own key.
    pub fn key_kind(&self) -> CaKey {
        self.key
    }

    /// The algorithm of the leaves it issues.
    pub fn leaf_algorithm(&self) -> KeyAlgorithm {
        self.leaf_algorithm
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key, for sealing into the database. It never goes to a node.
    pub fn key_pem(&self) -> &SecretPem {
        &self.key_pem
    }

    /// Its SubjectPublicKeyInfo (DER).
    pub fn public_key_der(&self) -> &[u8] {
        &self.public_key
    }

    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    /// Issues a leaf with a fresh key of the leaf algorithm.
    pub fn issue(&self, spec: &LeafSpec, now: OffsetDateTime) -> Result<IssuedCert, PkiError> {
        self.issue_keyed(spec, now, LeafKey::generate(self.leaf_algorithm)?)
    }

    /// Issues a leaf for `key`, which must be of the leaf algorithm (a pooled key of another
    /// cluster's algorithm is refused, never signed).
    pub fn issue_keyed(
        &self,
        spec: &LeafSpec,
        now: OffsetDateTime,
        key: LeafKey,
    ) -> Result<IssuedCert, PkiError> {
        self.issue_for(spec, now, key, self.leaf_lifetime)
    }

    /// Issues a leaf with a fresh key that lives `lifetime`, at most the CA's leaf lifetime
    /// (an operator's short-lived credential).
    pub fn issue_short(
        &self,
        spec: &LeafSpec,
        now: OffsetDateTime,
        lifetime: time::Duration,
    ) -> Result<IssuedCert, PkiError> {
        let key = LeafKey::generate(self.leaf_algorithm)?;
        self.issue_for(spec, now, key, lifetime.min(self.leaf_lifetime))
    }

    fn issue_for(
        &self,
        spec: &LeafSpec,
        now: OffsetDateTime,
        key: LeafKey,
        lifetime: time::Duration,
    ) -> Result<IssuedCert, PkiError> {
        if key.algorithm() != self.leaf_algorithm {
            return Err(PkiError::WrongKey {
                role: self.role,
                expected: self.leaf_algorithm,
                got: key.algorithm(),
            });
        }
        if now >= self.not_after {
            return Err(PkiError::CaExpired {
                role: self.role,
                not_after: self.not_after,
            });
        }
        let params = leaf_params(
            spec,
            &key.pair().subject_public_key_info(),
            self.leaf_algorithm,
            now,
            lifetime,
            self.not_after,
        )?;
        let cert = params
            .signed_by(key.pair(), &self.issuer)
            .map_err(|source| PkiError::Signing {
                what: spec.common_name.clone(),
                source,
            })?;
        let minted = super::facts::minted(
            &spec.common_name,
            spec.organization.as_deref(),
            &self.subject,
            params.serial_number.as_ref().map_or(&[][..], AsRef::as_ref),
            params.not_before,
            params.not_after,
        );
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: SecretPem::new(key.pair().serialize_pem()),
            minted: Some(minted),
        })
    }
}

/// The issuer text of the leaves a CA signs: its subject's. rcgen re-encodes the subject
/// into each leaf keeping one value per attribute type, so a subject that names a type twice
/// would give its leaves another issuer name (a broken chain): such a CA is refused.
fn leaf_issuer(cert: &X509Certificate<'_>) -> Result<String, String> {
    let mut seen = Vec::new();
    for attribute in cert.subject().iter_attributes() {
        let kind = attribute.attr_type();
        if seen.contains(&kind) {
            return Err(format!(
                "its subject names the attribute {kind} twice (rcgen, which signs the leaves, \
                 keeps one value per attribute: their issuer would not be this CA's subject)"
            ));
        }
        seen.push(kind);
    }
    Ok(super::facts::subject_text(cert))
}

/// Decodes the first `CERTIFICATE` block of a PEM text.
pub(super) fn first_certificate_der(pem_text: &str) -> Option<Vec<u8>> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem_text.as_bytes()).ok()?;
    (pem.label == "CERTIFICATE").then_some(pem.contents)
}

/// The kind of a CA certificate's public key, or why exk8s does not sign with it.
pub(super) fn ca_key(cert: &X509Certificate<'_>) -> Result<CaKey, String> {
    use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384};
    use x509_parser::public_key::PublicKey;

    let allowed = "allowed: RSA of 2048 to 8192 bits, ECDSA P-256 or P-384";
    let spki = cert.public_key();
    match spki.parsed() {
        Ok(PublicKey::RSA(rsa)) => {
            let bits = rsa.key_size();
            if CA_RSA_BITS.contains(&bits) {
                Ok(CaKey::Rsa { bits })
            } else {
                Err(format!(
                    "has an RSA-{bits} key, which is not allowed ({allowed})"
                ))
            }
        }
        Ok(PublicKey::EC(_)) if spki.algorithm.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok());
            match curve {
                Some(c) if c == OID_EC_P256 => Ok(CaKey::EcdsaP256),
                Some(c) if c == OID_NIST_EC_P384 => Ok(CaKey::EcdsaP384),
                Some(c) => Err(format!(
                    "has an EC key on curve {}, which is not allowed ({allowed})",
                    oid_name(&c.to_id_string())
                )),
                None => Err(format!(
                    "has an EC key without a named curve, which is not allowed ({allowed})"
                )),
            }
        }
        _ => Err(format!(
            "has a key of type {}, which is not allowed ({allowed})",
            oid_name(&spki.algorithm.algorithm.to_id_string())
        )),
    }
}

/// A readable name for the key types and curves operators meet, else the OID itself.
fn oid_name(oid: &str) -> String {
    let name = match oid {
        "1.3.132.0.35" => "P-521",
        "1.3.132.0.10" => "secp256k1",
        "1.3.101.112" => "Ed25519",
        "1.3.101.113" => "Ed448",
        "1.2.840.10040.4.1" => "DSA",
        "1.2.840.113549.1.1.10" => "RSA-PSS",
        _ => return oid.to_owned(),
    };
    format!("{name} ({oid})")
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
    /// The pair whose private half is `private_pem`, its public half derived from it (a pair
    /// read back cannot disagree with itself).
    pub fn from_private(private_pem: SecretPem) -> Result<Self, PkiError> {
        let key = KeyPair::from_pem(private_pem.expose())
            .map_err(|e| PkiError::InvalidServiceAccountKey(e.to_string()))?;
        Ok(Self {
            public_pem: key.public_key_pem(),
            private_pem,
        })
    }

    pub fn generate(algorithm: KeyAlgorithm) -> Result<Self, PkiError> {
        let key = algorithm.generate()?;
        Ok(Self {
            public_pem: key.public_key_pem(),
            private_pem: SecretPem::new(key.serialize_pem()),
        })
    }
}
