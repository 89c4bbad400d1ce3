//! Bearer tokens: 256 bits from the OS CSPRNG, shown once, stored only as their SHA-256.
//! The prefix says what a token is for, so a leaked one is recognisable in a scan.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use exk8s_common::names::Sha256Digest;
use zeroize::Zeroizing;

/// What a principal token may do.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Found, list, show, delete clusters of the token's org.
    Operator,
    /// Fetch bundles and report phases, together with a VM's IMDS token.
    Bootstrap,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Bootstrap => "bootstrap",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "operator" => Some(Self::Operator),
            "bootstrap" => Some(Self::Bootstrap),
            _ => None,
        }
    }
}

/// A new token with the given prefix (`exk8s_op`, `exk8s_bs`, `exk8s_imds`).
pub fn generate(prefix: &str) -> Result<Zeroizing<String>, getrandom::Error> {
    let mut bytes = Zeroizing::new([0u8; 32]);
    getrandom::fill(bytes.as_mut())?;
    Ok(Zeroizing::new(format!(
        "{prefix}_{}",
        BASE64URL.encode(bytes.as_ref())
    )))
}

/// What the database stores and looks up.
pub fn hash(token: &str) -> String {
    Sha256Digest::of(token.as_bytes()).to_hex()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_and_hashed() {
        let a = generate("exk8s_op").unwrap();
        let b = generate("exk8s_op").unwrap();
        assert_ne!(*a, *b);
        assert!(a.starts_with("exk8s_op_") && a.len() >= 9 + 43);
        assert_eq!(hash(&a).len(), 64);
        assert_ne!(hash(&a), *a);
    }
}
