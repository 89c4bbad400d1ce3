//! A node's day-2 credential: an ed25519 key pair made on the node at first boot. The public
//! half is registered with the node's first bundle fetch ([`NODE_KEY_HEADER`]); every later
//! request is signed over its method, path, a timestamp, a fresh nonce and the body's SHA-256,
//! so a captured request cannot be replayed, moved to another path or given another body. The
//! private half never leaves the node (feature `node-key` makes and uses it).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::{Signature, VerifyingKey};

use crate::names::Sha256Digest;

/// The node's public key (base64 of its 32 bytes), sent with the bootstrap fetch.
pub const NODE_KEY_HEADER: &str = "X-Exk8s-Node-Key";
/// Unix seconds at which the node signed the request.
pub const TIMESTAMP_HEADER: &str = "X-Exk8s-Timestamp";
/// Base64 ed25519 signature over [`request_message`].
pub const SIGNATURE_HEADER: &str = "X-Exk8s-Signature";
/// How far a request's timestamp may be from the API's clock, either way.
pub const MAX_REQUEST_SKEW_SECS: i64 = 300;

/// Why a node's key or signature was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeAuthError {
    #[error("the node key is not the base64 of a 32-byte ed25519 public key")]
    MalformedKey,
    #[error("the signature is not the base64 of a 64-byte ed25519 signature")]
    MalformedSignature,
    #[error("the signature does not verify with the node's key")]
    BadSignature,
}

/// A node's registered public key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePublicKey(VerifyingKey);

impl NodePublicKey {
    pub fn parse(text: &str) -> Result<Self, NodeAuthError> {
        let bytes: [u8; 32] = BASE64
            .decode(text.trim())
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or(NodeAuthError::MalformedKey)?;
        VerifyingKey::from_bytes(&bytes)
            .map(Self)
            .map_err(|_| NodeAuthError::MalformedKey)
    }

    /// The header and database form.
    pub fn to_text(&self) -> String {
        BASE64.encode(self.0.as_bytes())
    }

    /// Checks `signature` (base64) over `message`, strictly (no malleable encodings).
    pub fn verify(&self, message: &[u8], signature: &str) -> Result<(), NodeAuthError> {
        let bytes: [u8; 64] = BASE64
            .decode(signature.trim())
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or(NodeAuthError::MalformedSignature)?;
        let signature = Signature::from_bytes(&bytes);
        self.0
            .verify_strict(message, &signature)
            .map_err(|_| NodeAuthError::BadSignature)
    }
}

/// The exact bytes a node signs for one request.
pub fn request_message(
    method: &str,
    path: &str,
    timestamp: i64,
    nonce: &str,
    body: &[u8],
) -> Vec<u8> {
    request_message_for_digest(method, path, timestamp, nonce, &Sha256Digest::of(body))
}

/// [`request_message`] for a body known by its digest: a streamed upload, whose digest is
/// declared in [`CONTENT_SHA256_HEADER`] and signed, and checked by the API once the body is in.
pub fn request_message_for_digest(
    method: &str,
    path: &str,
    timestamp: i64,
    nonce: &str,
    body: &Sha256Digest,
) -> Vec<u8> {
    format!(
        "exk8s-node-request-v1\n{method}\n{path}\n{timestamp}\n{nonce}\n{}",
        body.to_hex()
    )
    .into_bytes()
}

/// The SHA-256 (hex) of a streamed request body, signed in place of the body.
pub const CONTENT_SHA256_HEADER: &str = "X-Exk8s-Content-Sha256";

#[cfg(feature = "node-key")]
pub use signing::NodeKey;

#[cfg(feature = "node-key")]
mod signing {
    use base64::Engine as _;
    use ed25519_dalek::{Signer as _, SigningKey};
    use zeroize::Zeroizing;

    use super::{BASE64, NodePublicKey};

    /// The node's private key. `Debug` never shows it.
    pub struct NodeKey(SigningKey);

    impl std::fmt::Debug for NodeKey {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "NodeKey({})", self.public().to_text())
        }
    }

    impl NodeKey {
        /// A new key from the operating system's random source.
        pub fn generate() -> Result<Self, getrandom::Error> {
            let mut seed = Zeroizing::new([0u8; 32]);
            getrandom::fill(seed.as_mut())?;
            Ok(Self(SigningKey::from_bytes(&seed)))
        }

        /// The key file's text: the base64 seed.
        pub fn to_secret_text(&self) -> Zeroizing<String> {
            Zeroizing::new(BASE64.encode(self.0.to_bytes()))
        }

        pub fn from_secret_text(text: &str) -> Option<Self> {
            let bytes = Zeroizing::new(BASE64.decode(text.trim()).ok()?);
            let seed: &[u8; 32] = bytes.as_slice().try_into().ok()?;
            Some(Self(SigningKey::from_bytes(seed)))
        }

        pub fn public(&self) -> NodePublicKey {
            NodePublicKey(self.0.verifying_key())
        }

        /// The base64 signature of `message` (see [`super::request_message`]).
        pub fn sign(&self, message: &[u8]) -> String {
            BASE64.encode(self.0.sign(message).to_bytes())
        }
    }
}

#[cfg(all(test, feature = "node-key"))]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn a_signature_binds_method_path_time_nonce_and_body() {
        let key = NodeKey::generate().unwrap();
        let public = NodePublicKey::parse(&key.public().to_text()).unwrap();
        let message = request_message("GET", "/nodes/5/bundle", 100, "n-0123456789abcdef", b"");
        let signature = key.sign(&message);
        assert_eq!(public.verify(&message, &signature), Ok(()));
        for other in [
            request_message("POST", "/nodes/5/bundle", 100, "n-0123456789abcdef", b""),
            request_message("GET", "/nodes/6/bundle", 100, "n-0123456789abcdef", b""),
            request_message("GET", "/nodes/5/bundle", 101, "n-0123456789abcdef", b""),
            request_message("GET", "/nodes/5/bundle", 100, "n-0123456789abcdeg", b""),
            request_message("GET", "/nodes/5/bundle", 100, "n-0123456789abcdef", b"{}"),
        ] {
            assert_eq!(
                public.verify(&other, &signature),
                Err(NodeAuthError::BadSignature)
            );
        }
        let stranger = NodeKey::generate().unwrap();
        assert_eq!(
            public.verify(&message, &stranger.sign(&message)),
            Err(NodeAuthError::BadSignature)
        );
        assert_eq!(
            public.verify(&message, "AAAA"),
            Err(NodeAuthError::MalformedSignature)
        );
        assert_eq!(
            NodePublicKey::parse("short").unwrap_err(),
            NodeAuthError::MalformedKey
        );
        let restored = NodeKey::from_secret_text(&key.to_secret_text()).unwrap();
        assert_eq!(restored.public(), key.public());
        assert!(!format!("{key:?}").contains(key.to_secret_text().as_str()));
    }
}
