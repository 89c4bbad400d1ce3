//! [`SecretPem`]: private key text that is wiped from memory when dropped and never printed.

use std::fmt;

use zeroize::Zeroizing;

/// PEM text of a private key (or anything as sensitive: a kubeconfig with an embedded key).
#[derive(Clone, PartialEq, Eq)]
pub struct SecretPem(Zeroizing<String>);

impl SecretPem {
    pub fn new(text: String) -> Self {
        Self(Zeroizing::new(text))
    }

    /// The secret itself. Call sites are the only places secrets leave this type; keep them few.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Read from a request body (a CA key the operator brings) straight into wiped memory.
impl<'de> serde::Deserialize<'de> for SecretPem {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::new)
    }
}

/// Written only where a request is hashed for idempotency; never logged.
impl serde::Serialize for SecretPem {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.expose())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_secret() {
        let secret = SecretPem::new("-----BEGIN PRIVATE KEY-----\nabc\n".into());
        assert_eq!(format!("{secret:?}"), "[redacted]");
        assert_eq!(format!("{:?}", Some(&secret)), "Some([redacted])");
    }
}
