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
pub mod signer;

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
