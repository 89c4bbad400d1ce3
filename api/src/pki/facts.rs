//! What a certificate says about itself — subject, issuer, serial and validity — read once,
//! when the API makes it, for the certificate inventory and the renewal policy.

use x509_parser::prelude::{FromDer, X509Certificate};

use super::PkiError;

/// One certificate's identity and validity (unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFacts {
    pub subject: String,
    pub issuer: String,
    /// Lowercase hex bytes, colon-separated, without the sign byte DER adds (the number
    /// `openssl x509 -serial` prints).
    pub serial: String,
    pub not_before: i64,
    pub not_after: i64,
}

/// Reads the first certificate of `cert_pem`.
pub fn facts(cert_pem: &str) -> Result<CertFacts, PkiError> {
    let unreadable = |reason: &str| PkiError::Unreadable(reason.to_owned());
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).map_err(|_| unreadable("not PEM"))?;
    let (_, cert) =
        X509Certificate::from_der(&pem.contents).map_err(|_| unreadable("not a certificate"))?;
    let validity = cert.validity();
    Ok(CertFacts {
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        serial: serial_hex(cert.raw_serial()),
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
    })
}

/// The serial's bytes as hex, without the leading zero byte DER adds to keep it positive.
fn serial_hex(raw: &[u8]) -> String {
    let significant = match raw {
        [0, rest @ ..] if !rest.is_empty() => rest,
        all => all,
    };
    significant
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_sign_byte_is_not_part_of_the_number() {
        assert_eq!(super::serial_hex(&[0x00, 0x93, 0x01]), "93:01");
        assert_eq!(super::serial_hex(&[0x13, 0x01]), "13:01");
        assert_eq!(super::serial_hex(&[0x00]), "00");
    }
}
