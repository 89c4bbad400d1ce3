//! Keys at rest: every private key in the database is sealed with AES-256-GCM under a
//! key-encryption key (KEK) that lives outside the database (`--kek-file`).
//!
//! A sealed value is text: `v1:<kek-id>:<base64 nonce>:<base64 ciphertext+tag>`. The associated
//! data names the row and column the value belongs to (`cluster/42/ca_key`), so a ciphertext
//! copied to another row or column fails to open. The KEK id inside each value lets several
//! KEKs be loaded at once, which is how a KEK rotates: start with the new KEK first (it seals)
//! and the old one after it (it still opens), re-seal, then drop the old one.
//!
//! # KEK file format
//!
//! One line: `exk8s-kek <id> <base64 of 32 random bytes>`, mode 0600.
//! `exk8s-api keys generate-kek --out FILE` writes one.

use std::fmt;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use zeroize::Zeroizing;

const PREFIX: &str = "exk8s-kek";

/// Problems with KEKs and sealed values. Never carries key material or plaintext.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("KEK file {0}: expected one line `exk8s-kek <id> <base64 32 bytes>`")]
    BadKekFile(String),
    #[error("KEK id `{0}` is invalid (1–32 of a-z, 0-9, '-')")]
    BadKekId(String),
    #[error("the sealed value is malformed")]
    Malformed,
    #[error("no loaded KEK has id `{0}`")]
    UnknownKek(String),
    #[error("the sealed value does not open for {0} (wrong KEK, row or column)")]
    Open(String),
    #[error("sealing failed")]
    Seal,
    #[error("the operating system's random source failed")]
    Random,
}

/// One key-encryption key.
pub struct Kek {
    id: String,
    cipher: Aes256Gcm,
}

impl fmt::Debug for Kek {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kek {{ id: {}, key: [redacted] }}", self.id)
    }
}

fn valid_id(id: &str) -> bool {
    (1..=32).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl Kek {
    pub fn new(id: &str, key: &[u8; 32]) -> Result<Self, SealError> {
        if !valid_id(id) {
            return Err(SealError::BadKekId(id.chars().take(40).collect()));
        }
        Ok(Self {
            id: id.to_owned(),
            cipher: Aes256Gcm::new(key.into()),
        })
    }

    /// A fresh KEK file's text.
    pub fn generate_file_text(id: &str) -> Result<Zeroizing<String>, SealError> {
        if !valid_id(id) {
            return Err(SealError::BadKekId(id.chars().take(40).collect()));
        }
        let mut key = Zeroizing::new([0u8; 32]);
        getrandom::fill(key.as_mut()).map_err(|_| SealError::Random)?;
        Ok(Zeroizing::new(format!(
            "{PREFIX} {id} {}\n",
            BASE64.encode(key.as_ref())
        )))
    }

    pub fn from_file_text(text: &str, source: &str) -> Result<Self, SealError> {
        let bad = || SealError::BadKekFile(source.to_owned());
        let mut words = text.split_whitespace();
        if words.next() != Some(PREFIX) {
            return Err(bad());
        }
        let id = words.next().ok_or_else(bad)?;
        let key = Zeroizing::new(
            BASE64
                .decode(words.next().ok_or_else(bad)?)
                .map_err(|_| bad())?,
        );
        if words.next().is_some() {
            return Err(bad());
        }
        let key: &[u8; 32] = key.as_slice().try_into().map_err(|_| bad())?;
        Self::new(id, key)
    }

    pub fn id(&self) -> &str {
        &self.id
    }
}

/// The loaded KEKs: the first seals, every one opens what it sealed.
#[derive(Debug)]
pub struct Keyring {
    keks: Vec<Kek>,
}

impl Keyring {
    /// `keks` must not be empty; the first is the active one.
    pub fn new(keks: Vec<Kek>) -> Option<Self> {
        (!keks.is_empty()).then_some(Self { keks })
    }

    pub fn active_id(&self) -> &str {
        &self.keks[0].id
    }

    /// Seals `plaintext` for the place named by `aad` (e.g. `cluster/42/ca_key`).
    pub fn seal(&self, aad: &str, plaintext: &[u8]) -> Result<String, SealError> {
        let kek = &self.keks[0];
        let mut nonce = [0u8; 12];
        getrandom::fill(&mut nonce).map_err(|_| SealError::Random)?;
        let ciphertext = kek
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| SealError::Seal)?;
        Ok(format!(
            "v1:{}:{}:{}",
            kek.id,
            BASE64.encode(nonce),
            BASE64.encode(ciphertext)
        ))
    }

    /// Opens a value sealed for `aad`.
    pub fn open(&self, aad: &str, sealed: &str) -> Result<Zeroizing<Vec<u8>>, SealError> {
        let mut parts = sealed.split(':');
        let (Some("v1"), Some(id), Some(nonce), Some(ciphertext), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(SealError::Malformed);
        };
        let kek = self
            .keks
            .iter()
            .find(|k| k.id == id)
            .ok_or_else(|| SealError::UnknownKek(id.chars().take(40).collect()))?;
        let nonce = BASE64.decode(nonce).map_err(|_| SealError::Malformed)?;
        if nonce.len() != 12 {
            return Err(SealError::Malformed);
        }
        let ciphertext = BASE64
            .decode(ciphertext)
            .map_err(|_| SealError::Malformed)?;
        kek.cipher
            .decrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: &ciphertext,
                    aad: aad.as_bytes(),
                },
            )
            .map(Zeroizing::new)
            .map_err(|_| SealError::Open(aad.to_owned()))
    }

    /// Opens a sealed UTF-8 secret (PEM).
    pub fn open_text(&self, aad: &str, sealed: &str) -> Result<Zeroizing<String>, SealError> {
        let bytes = self.open(aad, sealed)?;
        String::from_utf8(bytes.to_vec())
            .map(Zeroizing::new)
            .map_err(|_| SealError::Open(aad.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(ids: &[(&str, u8)]) -> Keyring {
        Keyring::new(
            ids.iter()
                .map(|(id, b)| Kek::new(id, &[*b; 32]).unwrap())
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn sealed_values_open_only_in_their_place() {
        let keys = ring(&[("k1", 1)]);
        let sealed = keys.seal("cluster/42/ca_key", b"secret pem").unwrap();
        assert!(!sealed.contains("secret"));
        assert_eq!(
            keys.open("cluster/42/ca_key", &sealed).unwrap().as_slice(),
            b"secret pem"
        );
        for wrong in ["cluster/43/ca_key", "cluster/42/etcd_ca_key"] {
            assert!(
                matches!(keys.open(wrong, &sealed), Err(SealError::Open(_))),
                "{wrong}"
            );
        }
        let mut tampered = sealed.clone();
        tampered.pop();
        tampered.push('A');
        assert!(keys.open("cluster/42/ca_key", &tampered).is_err());
    }

    #[test]
    fn rotation_seals_with_the_first_kek_and_opens_with_any() {
        let old = ring(&[("old", 1)]);
        let sealed_old = old.seal("a", b"x").unwrap();
        let both = ring(&[("new", 2), ("old", 1)]);
        assert_eq!(both.open("a", &sealed_old).unwrap().as_slice(), b"x");
        assert!(both.seal("a", b"y").unwrap().starts_with("v1:new:"));
        let new_only = ring(&[("new", 2)]);
        assert!(matches!(
            new_only.open("a", &sealed_old),
            Err(SealError::UnknownKek(_))
        ));
    }

    #[test]
    fn kek_files_round_trip_and_never_print() {
        let text = Kek::generate_file_text("2026-11").unwrap();
        let kek = Kek::from_file_text(&text, "kek").unwrap();
        assert_eq!(kek.id(), "2026-11");
        assert!(format!("{kek:?}").contains("[redacted]"));
        let key_b64 = text.split_whitespace().nth(2).unwrap();
        assert!(!format!("{kek:?}").contains(key_b64));
        assert!(Kek::from_file_text("exk8s-kek BAD! AAAA", "f").is_err());
        assert!(Kek::from_file_text("", "f").is_err());
    }
}
