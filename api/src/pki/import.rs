//! Certificate authorities the operator brings (`certificate_authorities` in `POST /clusters`):
//! every check a CA must pass before a cluster is founded on it, each failure naming the part
//! (certificate or key) and the reason. A CA not brought is made by the API as usual; the
//! leaves of every CA use the cluster's key algorithm whatever the CA's own key is.
//!
//! Accepted: one PEM certificate with basicConstraints CA:TRUE and keyUsage keyCertSign, an
//! RSA (2048–8192 bits), ECDSA P-256 or P-384 key, valid now and for at least one leaf lifetime
//! more; its private key in PEM (PKCS#8, SEC1 or PKCS#1), matching the certificate. The three
//! trust domains stay apart: one CA may not serve two roles (PKI.md).

use std::fmt;

use rcgen::{KeyPair, PublicKeyData};
use time::{Duration, OffsetDateTime};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::ca::{ca_key, first_certificate_der};
use super::{CaRole, CertAuthority, KeyAlgorithm, SecretPem};

/// Which half of a supplied CA a refusal is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaPart {
    Certificate,
    Key,
}

/// A supplied CA refused, with the reason (never any key material).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {role}'s {part} {reason}")]
pub struct ImportError {
    pub role: CaRole,
    pub part: CaPart,
    pub reason: String,
}

impl fmt::Display for CaPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Certificate => "certificate",
            Self::Key => "private key",
        })
    }
}

/// A CA as the operator gave it: PEM text, either half possibly missing.
pub struct SuppliedCa<'a> {
    pub cert_pem: Option<&'a str>,
    pub key_pem: Option<&'a SecretPem>,
}

/// What the cluster needs of a CA: its leaves' algorithm and lifetime, at `now`.
#[derive(Debug, Clone, Copy)]
pub struct ImportTerms {
    pub leaf_algorithm: KeyAlgorithm,
    pub leaf_lifetime: Duration,
    pub now: OffsetDateTime,
}

/// Checks a supplied CA and loads it as an issuer.
pub fn import(
    role: CaRole,
    supplied: &SuppliedCa<'_>,
    terms: ImportTerms,
) -> Result<CertAuthority, ImportError> {
    let refuse = |part: CaPart, reason: String| ImportError { role, part, reason };
    let cert_refused = |reason: String| refuse(CaPart::Certificate, reason);
    let cert_pem = supplied
        .cert_pem
        .filter(|p| !p.trim().is_empty())
        .ok_or_else(|| cert_refused("is required".into()))?;
    let key_pem = supplied
        .key_pem
        .filter(|p| !p.expose().trim().is_empty())
        .ok_or_else(|| {
            refuse(
                CaPart::Key,
                "is required: a CA certificate without its private key cannot sign".into(),
            )
        })?;

    let blocks = pem_labels(cert_pem);
    if blocks != ["CERTIFICATE"] {
        return Err(cert_refused(if blocks.is_empty() {
            "is not PEM (expected one -----BEGIN CERTIFICATE----- block)".into()
        } else {
            format!(
                "must be exactly one CERTIFICATE PEM block, got: {}",
                blocks.join(", ")
            )
        }));
    }
    let der = first_certificate_der(cert_pem)
        .ok_or_else(|| cert_refused("the PEM block does not decode".into()))?;
    let (_, cert) = X509Certificate::from_der(&der)
        .map_err(|_| cert_refused("is not an X.509 certificate".into()))?;
    check_ca_extensions(&cert).map_err(cert_refused)?;
    let kind = ca_key(&cert).map_err(cert_refused)?;
    check_validity(&cert, terms).map_err(cert_refused)?;

    let key = KeyPair::from_pem(key_pem.expose()).map_err(|_| {
        refuse(
            CaPart::Key,
            "is not a PEM private key (PKCS#8, SEC1 or PKCS#1) of an allowed type".into(),
        )
    })?;
    if cert.public_key().raw != key.subject_public_key_info().as_slice() {
        return Err(refuse(
            CaPart::Key,
            "does not match the certificate's public key".into(),
        ));
    }
    // Stored re-encoded: the key as PKCS#8, the certificate without text around it.
    let normalized_cert = pem::encode_config(
        &pem::Pem::new("CERTIFICATE", der),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    );
    let ca = CertAuthority::from_pem(
        role,
        &normalized_cert,
        SecretPem::new(key.serialize_pem()),
        terms.leaf_algorithm,
    )
    .map_err(|e| cert_refused(format!("cannot be used as an issuer: {e}")))?;
    debug_assert_eq!(ca.key_kind(), kind);
    Ok(ca)
}

/// The labels of the PEM blocks in `text`, in order.
fn pem_labels(text: &str) -> Vec<String> {
    pem::parse_many(text)
        .map(|blocks| blocks.iter().map(|b| b.tag().to_owned()).collect())
        .unwrap_or_default()
}

fn check_ca_extensions(cert: &X509Certificate<'_>) -> Result<(), String> {
    let constraints = cert
        .basic_constraints()
        .map_err(|_| "has more than one basicConstraints extension".to_owned())?;
    if !constraints.is_some_and(|c| c.value.ca) {
        return Err(
            "is not a CA certificate (basicConstraints CA:TRUE is missing): a leaf cannot sign"
                .into(),
        );
    }
    let usage = cert
        .key_usage()
        .map_err(|_| "has more than one keyUsage extension".to_owned())?;
    match usage {
        Some(u) if u.value.key_cert_sign() => Ok(()),
        Some(_) => Err("has a keyUsage without keyCertSign: it may not sign certificates".into()),
        None => Err("has no keyUsage extension (a CA needs keyCertSign)".into()),
    }
}

fn check_validity(cert: &X509Certificate<'_>, terms: ImportTerms) -> Result<(), String> {
    let validity = cert.validity();
    let not_before = validity.not_before.to_datetime();
    let not_after = validity.not_after.to_datetime();
    let (from, until) = (rfc3339(not_before), rfc3339(not_after));
    if terms.now < not_before {
        return Err(format!("is not valid before {from}"));
    }
    if terms.now >= not_after {
        return Err(format!("expired at {until}"));
    }
    let needed = terms.now + terms.leaf_lifetime;
    if not_after < needed {
        return Err(format!(
            "expires at {until}, before one leaf lifetime ({} days) from now; a CA must \
             outlive the leaves it signs",
            terms.leaf_lifetime.whole_days()
        ));
    }
    Ok(())
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| at.to_string())
}

/// Refuses one CA given for two roles: the trust domains must stay apart.
pub fn check_distinct(cas: &[&CertAuthority]) -> Result<(), ImportError> {
    for (i, a) in cas.iter().enumerate() {
        for b in &cas[..i] {
            if a.public_key_der() == b.public_key_der() {
                return Err(ImportError {
                    role: a.role(),
                    part: CaPart::Certificate,
                    reason: format!(
                        "uses the same key as the {}; the three trust domains need separate CAs",
                        b.role()
                    ),
                });
            }
        }
    }
    Ok(())
}
