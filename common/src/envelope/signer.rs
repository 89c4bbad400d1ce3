//! Signing (API side only; the agent does not enable the `sign` feature).
//!
//! Secret key file format: one line `exk8s-ed25519-secret <base64 of the 32-byte seed>`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use zeroize::Zeroizing;

use super::{Envelope, EnvelopeSignature, pae};
use crate::keyring::{KeyId, pub_line};

const SECRET_LINE_PREFIX: &str = "exk8s-ed25519-secret";

/// Problems reading or making a signing key.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    #[error("the secret key file is not `{SECRET_LINE_PREFIX} <base64 32-byte seed>`")]
    BadSecretFile,
    #[error("the operating system's random source failed")]
    Random,
    #[error("serialising the payload")]
    Serialize(#[source] serde_json::Error),
}

/// An ed25519 bundle-signing key. Zeroised on drop; `Debug` shows only the key id.
pub struct BundleSigner {
    key: SigningKey,
    key_id: KeyId,
}

impl std::fmt::Debug for BundleSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BundleSigner {{ key_id: {}, secret: [redacted] }}",
            self.key_id
        )
    }
}

impl BundleSigner {
    /// A new key from the OS CSPRNG.
    pub fn generate() -> Result<Self, SignerError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        getrandom::fill(seed.as_mut()).map_err(|_| SignerError::Random)?;
        Ok(Self::from_seed(&seed))
    }

    pub fn from_seed(seed: &[u8; 32]) -> Self {
        let key = SigningKey::from_bytes(seed);
        let key_id = KeyId::of(&key.verifying_key());
        Self { key, key_id }
    }

    pub fn from_secret_text(text: &str) -> Result<Self, SignerError> {
        let mut words = text.split_whitespace();
        if words.next() != Some(SECRET_LINE_PREFIX) {
            return Err(SignerError::BadSecretFile);
        }
        let encoded = words.next().ok_or(SignerError::BadSecretFile)?;
        if words.next().is_some() {
            return Err(SignerError::BadSecretFile);
        }
        let raw = Zeroizing::new(
            BASE64
                .decode(encoded)
                .map_err(|_| SignerError::BadSecretFile)?,
        );
        let seed: &[u8; 32] = raw
            .as_slice()
            .try_into()
            .map_err(|_| SignerError::BadSecretFile)?;
        Ok(Self::from_seed(seed))
    }

    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    pub fn verifying_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// The `.pub` line agents trust.
    pub fn pub_line(&self, comment: &str) -> String {
        pub_line(&self.verifying_key(), comment)
    }

    /// The secret key file text (handle with care: it is the key).
    pub fn to_secret_text(&self) -> Zeroizing<String> {
        let seed = Zeroizing::new(self.key.to_bytes());
        Zeroizing::new(format!(
            "{SECRET_LINE_PREFIX} {}\n",
            BASE64.encode(seed.as_ref())
        ))
    }

    fn signature(&self, payload_type: &str, payload: &[u8]) -> EnvelopeSignature {
        let signature = self.key.sign(&pae(payload_type, payload));
        EnvelopeSignature {
            keyid: self.key_id.to_string(),
            sig: BASE64.encode(signature.to_bytes()),
        }
    }

    /// Signs exact payload bytes under `payload_type`.
    pub fn sign(&self, payload_type: &str, payload: &[u8]) -> Envelope {
        Envelope {
            payload_type: payload_type.to_owned(),
            payload: BASE64.encode(payload),
            signatures: vec![self.signature(payload_type, payload)],
        }
    }

    /// Signs exact payload bytes under `payload_type` and writes the envelope's JSON: the
    /// bytes `serde_json::to_vec(&self.sign(..))` gives, written once. The payload's base64
    /// goes straight into the output (its alphabet needs no JSON escaping), where serde
    /// would encode it into a string and then scan and copy that string again.
    pub fn sign_to_json(&self, payload_type: &str, payload: &[u8]) -> Vec<u8> {
        let signature = self.signature(payload_type, payload);
        let quoted = |text: &str| serde_json::to_string(text).unwrap_or_default();
        let encoded_len = payload.len().div_ceil(3) * 4;
        let mut out = Vec::with_capacity(encoded_len + payload_type.len() + 256);
        out.extend_from_slice(b"{\"payloadType\":");
        out.extend_from_slice(quoted(payload_type).as_bytes());
        out.extend_from_slice(b",\"payload\":\"");
        let start = out.len();
        out.resize(start + encoded_len, 0);
        let written = BASE64
            .encode_slice(payload, &mut out[start..])
            .unwrap_or_else(|_| unreachable!("the buffer is sized for the encoding"));
        out.truncate(start + written);
        out.extend_from_slice(b"\",\"signatures\":[{\"keyid\":");
        out.extend_from_slice(quoted(&signature.keyid).as_bytes());
        out.extend_from_slice(b",\"sig\":");
        out.extend_from_slice(quoted(&signature.sig).as_bytes());
        out.extend_from_slice(b"}]}");
        out
    }

    /// Serialises and signs a bundle payload; returns the envelope JSON bytes.
    pub fn sign_bundle(
        &self,
        payload: &crate::payload::BundlePayload,
    ) -> Result<Vec<u8>, SignerError> {
        let bytes = serde_json::to_vec(payload).map_err(SignerError::Serialize)?;
        Ok(self.sign_to_json(super::BUNDLE_PAYLOAD_TYPE, &bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(n: u8) -> [u8; 32] {
        std::array::from_fn(|i| n.wrapping_mul(31).wrapping_add(i as u8))
    }

    #[test]
    fn the_written_envelope_is_the_serialised_one() {
        let signer = BundleSigner::from_seed(&seed(3));
        // Every base64 tail (no padding, one `=`, two) and a type that needs escaping.
        for (payload_type, len) in [("t", 0), ("a/b+json", 1), ("q\"\\\u{1}", 2), ("x", 4099)] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
            let written = signer.sign_to_json(payload_type, &payload);
            let serialised = serde_json::to_vec(&signer.sign(payload_type, &payload)).unwrap();
            assert_eq!(
                String::from_utf8(written).unwrap(),
                String::from_utf8(serialised).unwrap()
            );
        }
    }

    #[test]
    fn the_secret_text_round_trips_and_debug_hides_it() {
        let signer = BundleSigner::from_seed(&seed(5));
        let text = signer.to_secret_text();
        let again = BundleSigner::from_secret_text(&text).unwrap();
        assert_eq!(again.key_id(), signer.key_id());
        let shown = format!("{signer:?}");
        let encoded = text.split_whitespace().nth(1).unwrap().to_owned();
        assert!(!shown.contains(&encoded), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }
}
