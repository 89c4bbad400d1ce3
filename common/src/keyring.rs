//! Trusted bundle-signing keys, by key id.
//!
//! Key id = the first 16 bytes of SHA-256 over the raw 32-byte ed25519 public key, in lowercase
//! hex. It is only a hint to find the key; the signature decides. Several keys may be trusted at
//! once, which is how signing keys rotate (add the new key, sign with it, drop the old).
//!
//! # `.pub` file format
//!
//! UTF-8 text, one key per line:
//!
//! ```text
//! # comments and blank lines are ignored
//! ed25519 <base64 of the 32-byte public key> [free-form comment]
//! ```
//!
//! The key id is always computed from the key, never read from the file.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::VerifyingKey;
use sha2::{Digest, Sha256};

/// The algorithm word that starts every key line.
pub const KEY_LINE_ALGORITHM: &str = "ed25519";

/// A key id: first 16 bytes of SHA-256 of the raw public key.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId([u8; 16]);

impl KeyId {
    pub fn of(key: &VerifyingKey) -> Self {
        let digest = Sha256::digest(key.as_bytes());
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        Self(id)
    }

    /// Parses the 32-character lowercase hex form.
    pub fn parse(text: &str) -> Option<Self> {
        if text.len() != 32 || text.bytes().any(|b| b.is_ascii_uppercase()) {
            return None;
        }
        let mut id = [0u8; 16];
        hex::decode_to_slice(text, &mut id).ok()?;
        Some(Self(id))
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// Problems loading trusted keys.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    #[error("reading trusted keys from {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{source_name}:{line}: {reason}")]
    BadLine {
        source_name: String,
        line: usize,
        reason: String,
    },
    #[error("{source_name}: holds no key")]
    NoKeyInFile { source_name: String },
    #[error("no trusted key found in {path} (expected *.pub files)")]
    Empty { path: PathBuf },
}

/// The set of public keys the holder trusts to sign bundles.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: BTreeMap<KeyId, VerifyingKey>,
}

impl Keyring {
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts `key`; returns its id.
    pub fn insert(&mut self, key: VerifyingKey) -> KeyId {
        let id = KeyId::of(&key);
        self.keys.insert(id, key);
        id
    }

    pub fn get(&self, id: &KeyId) -> Option<&VerifyingKey> {
        self.keys.get(id)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn key_ids(&self) -> impl Iterator<Item = KeyId> + '_ {
        self.keys.keys().copied()
    }

    /// Adds every key in `.pub` text; `source_name` names it in errors. Returns how many.
    pub fn add_pub_text(&mut self, text: &str, source_name: &str) -> Result<usize, KeyringError> {
        let mut added = 0;
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |reason: &str| KeyringError::BadLine {
                source_name: source_name.to_owned(),
                line: index + 1,
                reason: reason.to_owned(),
            };
            let mut words = line.split_whitespace();
            if words.next() != Some(KEY_LINE_ALGORITHM) {
                return Err(bad("expected `ed25519 <base64 public key> [comment]`"));
            }
            let encoded = words.next().ok_or_else(|| bad("missing the base64 key"))?;
            let raw = BASE64
                .decode(encoded)
                .map_err(|_| bad("the key is not valid base64"))?;
            let raw: [u8; 32] = raw
                .try_into()
                .map_err(|_| bad("an ed25519 public key is 32 bytes"))?;
            let key = VerifyingKey::from_bytes(&raw)
                .map_err(|_| bad("not a valid ed25519 public key"))?;
            if key.is_weak() {
                return Err(bad("refusing a weak (small-order) ed25519 key"));
            }
            self.insert(key);
            added += 1;
        }
        if added == 0 {
            return Err(KeyringError::NoKeyInFile {
                source_name: source_name.to_owned(),
            });
        }
        Ok(added)
    }

    /// Loads every `*.pub` file in `dir` (sorted by name). Fails if none holds a key.
    pub fn load_dir(dir: &Path) -> Result<Self, KeyringError> {
        let read_err = |path: &Path| {
            let path = path.to_owned();
            move |source| KeyringError::Read { path, source }
        };
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(read_err(dir))?
            .map(|entry| entry.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .map_err(read_err(dir))?;
        paths.retain(|p| p.extension().is_some_and(|ext| ext == "pub") && p.is_file());
        paths.sort();
        let mut ring = Self::new();
        for path in paths {
            let text = std::fs::read_to_string(&path).map_err(read_err(&path))?;
            ring.add_pub_text(&text, &path.display().to_string())?;
        }
        if ring.is_empty() {
            return Err(KeyringError::Empty {
                path: dir.to_owned(),
            });
        }
        Ok(ring)
    }
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.keys.keys()).finish()
    }
}

/// The `.pub` line for `key`.
pub fn pub_line(key: &VerifyingKey, comment: &str) -> String {
    let comment: String = comment
        .chars()
        .filter(|c| !c.is_control())
        .collect::<String>();
    let encoded = BASE64.encode(key.as_bytes());
    if comment.trim().is_empty() {
        format!("{KEY_LINE_ALGORITHM} {encoded}")
    } else {
        format!("{KEY_LINE_ALGORITHM} {encoded} {}", comment.trim())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    fn key(seed: u8) -> VerifyingKey {
        SigningKey::from_bytes(&[seed; 32]).verifying_key()
    }

    #[test]
    fn key_id_is_sha256_prefix_of_the_raw_key() {
        let k = key(1);
        let digest = Sha256::digest(k.as_bytes());
        assert_eq!(KeyId::of(&k).to_string(), hex::encode(&digest[..16]));
        assert_eq!(
            KeyId::parse(&KeyId::of(&k).to_string()),
            Some(KeyId::of(&k))
        );
        assert_eq!(
            KeyId::parse(&KeyId::of(&k).to_string().to_uppercase()),
            None
        );
    }

    #[test]
    fn pub_text_round_trips_and_names_bad_lines() {
        let text = format!(
            "# rotation: old and new\n{}\n\n{}\n",
            pub_line(&key(1), "old key"),
            pub_line(&key(2), "")
        );
        let mut ring = Keyring::new();
        assert_eq!(ring.add_pub_text(&text, "keys.pub").unwrap(), 2);
        assert!(ring.get(&KeyId::of(&key(2))).is_some());

        let err = Keyring::new()
            .add_pub_text("ed25519 AAAA\n", "bad.pub")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "bad.pub:1: an ed25519 public key is 32 bytes"
        );
        let err = Keyring::new()
            .add_pub_text("ssh-ed25519 AAAA\n", "bad.pub")
            .unwrap_err();
        assert!(err.to_string().starts_with("bad.pub:1: expected"));
        assert!(matches!(
            Keyring::new().add_pub_text("# nothing\n", "e.pub"),
            Err(KeyringError::NoKeyInFile { .. })
        ));
    }

    #[test]
    fn refuses_small_order_keys() {
        // The identity point: every signature "verifies" under it without verify_strict.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let line = format!("ed25519 {}", BASE64.encode(identity));
        let err = Keyring::new().add_pub_text(&line, "weak.pub").unwrap_err();
        assert!(err.to_string().contains("weak"), "{err}");
    }

    #[test]
    fn loads_a_directory_of_pub_files_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.pub"), pub_line(&key(1), "a")).unwrap();
        std::fs::write(dir.path().join("b.pub"), pub_line(&key(2), "b")).unwrap();
        std::fs::write(dir.path().join("README"), "not a key").unwrap();
        let ring = Keyring::load_dir(dir.path()).unwrap();
        assert_eq!(ring.len(), 2);

        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            Keyring::load_dir(empty.path()),
            Err(KeyringError::Empty { .. })
        ));
        assert!(matches!(
            Keyring::load_dir(&empty.path().join("missing")),
            Err(KeyringError::Read { .. })
        ));
    }
}
