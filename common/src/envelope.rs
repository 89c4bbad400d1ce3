//! The trust boundary: the DSSE envelope around a bundle payload.
//!
//! ```json
//! { "payloadType": "application/vnd.exk8s.bundle.v2+json",
//!   "payload": "<standard base64 of the exact payload bytes>",
//!   "signatures": [ { "keyid": "<32 hex>", "sig": "<standard base64 ed25519 signature>" } ] }
//! ```
//!
//! The signature covers `PAE(payloadType, payload)` as DSSE v1 defines it. [`verify`] checks, in
//! this order and before looking at any payload byte as JSON: the envelope size, the envelope
//! shape, the payload encoding, an ed25519 signature by a trusted key (`verify_strict`), the
//! payload type; only then is the payload parsed. Nothing is ever re-serialised for checking.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::Signature;
use serde::{Deserialize, Serialize};

use crate::error::BundleError;
use crate::keyring::{KeyId, Keyring};
use crate::limits::{MAX_ENVELOPE_BYTES, MAX_SIGNATURES};
use crate::names::{Sha256Digest, shown};
use crate::payload::BundlePayload;
use crate::serde_util::bounded_vec;

/// The payload type of a v1 bundle.
pub const BUNDLE_PAYLOAD_TYPE: &str = "application/vnd.exk8s.bundle.v2+json";

/// A DSSE envelope as it travels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    /// Standard base64 of the payload bytes.
    pub payload: String,
    #[serde(deserialize_with = "bounded_vec::<_, _, MAX_SIGNATURES>")]
    pub signatures: Vec<EnvelopeSignature>,
}

/// One signature in an envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeSignature {
    pub keyid: String,
    pub sig: String,
}

/// DSSE v1 pre-authentication encoding:
/// `"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`, lengths in ASCII decimal.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + payload_type.len() + 32);
    out.extend_from_slice(b"DSSEv1 ");
    out.extend_from_slice(payload_type.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload_type.as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload);
    out
}

/// A bundle whose signature, type and contents were checked. Only [`verify`] makes one.
#[derive(Debug)]
pub struct VerifiedBundle {
    payload: BundlePayload,
    key_id: KeyId,
    payload_sha256: Sha256Digest,
}

impl VerifiedBundle {
    pub fn payload(&self) -> &BundlePayload {
        &self.payload
    }

    pub fn into_payload(self) -> BundlePayload {
        self.payload
    }

    /// The trusted key whose signature verified.
    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    /// SHA-256 of the exact payload bytes (what the API's audit row records).
    pub fn payload_sha256(&self) -> Sha256Digest {
        self.payload_sha256
    }
}

/// Verifies envelope bytes against `keyring` and parses the payload.
pub fn verify(envelope_bytes: &[u8], keyring: &Keyring) -> Result<VerifiedBundle, BundleError> {
    let size = envelope_bytes.len() as u64;
    if size > MAX_ENVELOPE_BYTES {
        return Err(BundleError::EnvelopeTooLarge {
            size,
            limit: MAX_ENVELOPE_BYTES,
        });
    }
    let de = &mut serde_json::Deserializer::from_slice(envelope_bytes);
    let envelope: Envelope = serde_path_to_error::deserialize(de).map_err(|e| {
        let (at, reason) = crate::names::json_failure(e);
        BundleError::MalformedEnvelope { at, reason }
    })?;
    let payload = BASE64
        .decode(envelope.payload.as_bytes())
        .map_err(|_| BundleError::PayloadEncoding)?;
    let key_id = check_signatures(&envelope, &payload, keyring)?;
    if envelope.payload_type != BUNDLE_PAYLOAD_TYPE {
        return Err(BundleError::WrongPayloadType {
            found: shown(&envelope.payload_type),
            expected: BUNDLE_PAYLOAD_TYPE,
        });
    }
    let payload_sha256 = Sha256Digest::of(&payload);
    let payload = BundlePayload::from_json(&payload)?;
    Ok(VerifiedBundle {
        payload,
        key_id,
        payload_sha256,
    })
}

/// Succeeds when at least one signature is a valid strict ed25519 signature by a trusted key.
fn check_signatures(
    envelope: &Envelope,
    payload: &[u8],
    keyring: &Keyring,
) -> Result<KeyId, BundleError> {
    if envelope.signatures.is_empty() {
        return Err(BundleError::Unsigned);
    }
    let message = pae(&envelope.payload_type, payload);
    let mut first_failure = None;
    for signature in &envelope.signatures {
        let Some(key_id) = KeyId::parse(&signature.keyid) else {
            continue;
        };
        let Some(key) = keyring.get(&key_id) else {
            continue;
        };
        let verified = BASE64
            .decode(signature.sig.as_bytes())
            .ok()
            .and_then(|raw| Signature::from_slice(&raw).ok())
            .is_some_and(|sig| key.verify_strict(&message, &sig).is_ok());
        if verified {
            return Ok(key_id);
        }
        first_failure.get_or_insert(key_id);
    }
    match first_failure {
        Some(key_id) => Err(BundleError::BadSignature { key_id }),
        None => Err(BundleError::UnknownKeyId {
            key_ids: envelope
                .signatures
                .iter()
                .map(|s| shown(&s.keyid))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

#[cfg(feature = "sign")]
pub mod signer {
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

        /// Signs exact payload bytes under `payload_type`.
        pub fn sign(&self, payload_type: &str, payload: &[u8]) -> Envelope {
            let signature = self.key.sign(&pae(payload_type, payload));
            Envelope {
                payload_type: payload_type.to_owned(),
                payload: BASE64.encode(payload),
                signatures: vec![EnvelopeSignature {
                    keyid: self.key_id.to_string(),
                    sig: BASE64.encode(signature.to_bytes()),
                }],
            }
        }

        /// Serialises and signs a bundle payload; returns the envelope JSON bytes.
        pub fn sign_bundle(
            &self,
            payload: &crate::payload::BundlePayload,
        ) -> Result<Vec<u8>, SignerError> {
            let bytes = serde_json::to_vec(payload).map_err(SignerError::Serialize)?;
            let envelope = self.sign(super::BUNDLE_PAYLOAD_TYPE, &bytes);
            serde_json::to_vec(&envelope).map_err(SignerError::Serialize)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_envelope_is_reported_without_echoing_its_keys() {
        // Found by the `envelope` fuzz target: serde quotes an unknown field in full.
        let long_key = "k".repeat(50_000);
        let bytes = format!("{{\"{long_key}\": 1}}");
        let err = verify(bytes.as_bytes(), &Keyring::new()).unwrap_err();
        let message = err.to_string();
        assert!(message.len() < 1024, "{} bytes", message.len());
        assert!(message.contains("unknown field"), "{message}");
        // Found next: control characters escape to ten times their length, so the bound
        // counts escaped characters.
        let controls = "\\u001b".repeat(300);
        let bytes = format!("{{\"{controls}\": 1}}");
        let message = verify(bytes.as_bytes(), &Keyring::new())
            .unwrap_err()
            .to_string();
        assert!(
            message.chars().count() < 1024,
            "{} chars",
            message.chars().count()
        );
    }

    #[test]
    fn pae_matches_the_dsse_specification_example() {
        // From the DSSE protocol document.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ".to_vec());
    }

    #[test]
    fn oversized_envelopes_are_refused_before_parsing() {
        let huge = vec![b'{'; MAX_ENVELOPE_BYTES as usize + 1];
        let err = verify(&huge, &Keyring::new()).unwrap_err();
        assert!(matches!(err, BundleError::EnvelopeTooLarge { .. }), "{err}");
    }
}
