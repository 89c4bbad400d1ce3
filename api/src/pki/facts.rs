//! What a certificate says about itself — subject, issuer, serial and validity — for the
//! certificate inventory and the renewal policy: known when the API mints it ([`minted`]), read
//! from the certificate when it was stored ([`facts`]). Both give the same text.

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
        subject: subject_text(&cert),
        issuer: cert.issuer().to_string(),
        serial: serial_hex(cert.raw_serial()),
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
    })
}

/// The facts of a certificate exk8s is minting, from the values it encodes: the same text
/// [`facts`] reads back from the certificate (`O=…, CN=…` in the order [`super::leaf::subject`]
/// writes them, the serial's hex), validity in the whole seconds DER keeps.
pub(super) fn minted(
    common_name: &str,
    organization: Option<&str>,
    issuer: &str,
    serial: &[u8],
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
) -> CertFacts {
    let subject = match organization {
        Some(org) => format!("O={org}, CN={common_name}"),
        None => format!("CN={common_name}"),
    };
    CertFacts {
        subject,
        issuer: issuer.to_owned(),
        serial: serial_hex(serial),
        not_before: not_before.unix_timestamp(),
        not_after: not_after.unix_timestamp(),
    }
}

/// The text of a certificate's subject, as [`facts`] gives it.
pub(super) fn subject_text(cert: &X509Certificate<'_>) -> String {
    cert.subject().to_string()
}

/// The serial's bytes as hex, without the leading zero byte DER adds to keep it positive.
fn serial_hex(raw: &[u8]) -> String {
    use std::fmt::Write as _;
    let significant = match raw {
        [0, rest @ ..] if !rest.is_empty() => rest,
        all => all,
    };
    let mut hex = String::with_capacity(significant.len() * 3);
    for (i, b) in significant.iter().enumerate() {
        let sep = if i == 0 { "" } else { ":" };
        // Writing to a String cannot fail.
        let _ = write!(hex, "{sep}{b:02x}");
    }
    hex
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
