//! Key algorithms a cluster may choose. Never Ed25519: kube-apiserver refuses Ed25519
//! service-account keys and kubeadm does not offer it for certificates.

use std::fmt;

use rcgen::{KeyPair, RsaKeySize, SignatureAlgorithm};

use super::PkiError;

/// The key algorithm of every key in one cluster (CAs, leaves, service account).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum KeyAlgorithm {
    #[default]
    #[serde(rename = "ecdsa-p256")]
    EcdsaP256,
    #[serde(rename = "ecdsa-p384")]
    EcdsaP384,
    #[serde(rename = "rsa-2048")]
    Rsa2048,
    #[serde(rename = "rsa-3072")]
    Rsa3072,
    #[serde(rename = "rsa-4096")]
    Rsa4096,
}

impl KeyAlgorithm {
    pub const ALL: [Self; 5] = [
        Self::EcdsaP256,
        Self::EcdsaP384,
        Self::Rsa2048,
        Self::Rsa3072,
        Self::Rsa4096,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::EcdsaP256 => "ecdsa-p256",
            Self::EcdsaP384 => "ecdsa-p384",
            Self::Rsa2048 => "rsa-2048",
            Self::Rsa3072 => "rsa-3072",
            Self::Rsa4096 => "rsa-4096",
        }
    }

    pub fn is_rsa(self) -> bool {
        matches!(self, Self::Rsa2048 | Self::Rsa3072 | Self::Rsa4096)
    }

    /// SHA-256 everywhere except P-384, which signs with SHA-384.
    pub(crate) fn signature_algorithm(self) -> &'static SignatureAlgorithm {
        match self {
            Self::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            Self::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            Self::Rsa2048 | Self::Rsa3072 | Self::Rsa4096 => &rcgen::PKCS_RSA_SHA256,
        }
    }

    /// A fresh key pair from the platform CSPRNG (aws-lc-rs).
    pub(crate) fn generate(self) -> Result<KeyPair, PkiError> {
        let alg = self.signature_algorithm();
        let result = match self {
            Self::EcdsaP256 | Self::EcdsaP384 => KeyPair::generate_for(alg),
            Self::Rsa2048 => KeyPair::generate_rsa_for(alg, RsaKeySize::_2048),
            Self::Rsa3072 => KeyPair::generate_rsa_for(alg, RsaKeySize::_3072),
            Self::Rsa4096 => KeyPair::generate_rsa_for(alg, RsaKeySize::_4096),
        };
        result.map_err(|source| PkiError::KeyGeneration {
            algorithm: self,
            source,
        })
    }
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for KeyAlgorithm {
    type Err = PkiError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| PkiError::UnknownAlgorithm(s.chars().take(64).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for alg in KeyAlgorithm::ALL {
            assert_eq!(alg.as_str().parse::<KeyAlgorithm>().unwrap(), alg);
            let json = serde_json::to_string(&alg).unwrap();
            assert_eq!(json, format!("\"{alg}\""));
        }
        for bad in ["ed25519", "rsa-1024", "ECDSA-P256", "", "ecdsa-p521"] {
            let err = bad.parse::<KeyAlgorithm>().unwrap_err();
            assert!(matches!(err, PkiError::UnknownAlgorithm(_)), "{bad}");
        }
        assert_eq!(KeyAlgorithm::default(), KeyAlgorithm::EcdsaP256);
    }
}
