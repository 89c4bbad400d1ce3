//! Leaf keys: a key pair together with the algorithm it was made for ([`LeafKey`]), and the
//! source one bundle's minting draws its keys from ([`KeySource`]) — keys made ahead of demand
//! first (the key pool's), fresh ones after (by its [`KeyMaker`]), and nothing more once its
//! requester has gone.

use std::fmt;

use rcgen::KeyPair;
use zeroize::Zeroize;

use super::{KeyAlgorithm, KeyMaker, PkiError};

/// A private key for one leaf, used at most once. Its secret bytes are zeroized when it is
/// dropped; `Debug` shows only the algorithm.
pub struct LeafKey {
    algorithm: KeyAlgorithm,
    pair: KeyPair,
}

impl LeafKey {
    /// A fresh key from the platform CSPRNG.
    pub fn generate(algorithm: KeyAlgorithm) -> Result<Self, PkiError> {
        Ok(Self {
            algorithm,
            pair: algorithm.generate()?,
        })
    }

    /// A key made elsewhere (a helper process) for `algorithm`.
    pub(super) fn from_pair(algorithm: KeyAlgorithm, pair: KeyPair) -> Self {
        Self { algorithm, pair }
    }

    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    pub(super) fn pair(&self) -> &KeyPair {
        &self.pair
    }
}

impl Drop for LeafKey {
    fn drop(&mut self) {
        self.pair.zeroize();
    }
}

impl fmt::Debug for LeafKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeafKey")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

/// Where one bundle's keys come from, in order: `ready` keys (made ahead by the key pool), then
/// fresh ones from its maker. Before every key it asks `stop`, and the maker asks it while a key
/// is being made: a bundle whose client has gone stops there.
pub struct KeySource<'a> {
    algorithm: KeyAlgorithm,
    ready: Vec<LeafKey>,
    maker: &'a KeyMaker,
    stop: &'a dyn Fn() -> bool,
    generated: usize,
}

impl<'a> KeySource<'a> {
    /// Fresh keys only, made in this process, never stopping.
    pub fn fresh(algorithm: KeyAlgorithm) -> Self {
        Self::new(algorithm, Vec::new(), &KeyMaker::InProcess, &|| false)
    }

    /// `ready` keys first, then fresh ones from `maker`; a ready key of another algorithm is
    /// never used.
    pub fn new(
        algorithm: KeyAlgorithm,
        ready: Vec<LeafKey>,
        maker: &'a KeyMaker,
        stop: &'a dyn Fn() -> bool,
    ) -> Self {
        let ready = ready
            .into_iter()
            .filter(|k| k.algorithm == algorithm)
            .collect();
        Self {
            algorithm,
            ready,
            maker,
            stop,
            generated: 0,
        }
    }

    /// The next key: [`PkiError::Stopped`] once `stop` says so.
    pub fn next_key(&mut self) -> Result<LeafKey, PkiError> {
        if (self.stop)() {
            return Err(PkiError::Stopped);
        }
        match self.ready.pop() {
            Some(key) => Ok(key),
            None => {
                self.generated += 1;
                self.maker.make(self.algorithm, self.stop)
            }
        }
    }

    /// How many keys this source had to make itself (none were ready).
    pub fn generated(&self) -> usize {
        self.generated
    }
}

impl fmt::Debug for KeySource<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeySource")
            .field("algorithm", &self.algorithm)
            .field("ready", &self.ready.len())
            .field("generated", &self.generated)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_keys_go_first_then_fresh_ones_and_a_stop_ends_it() {
        let ready = vec![
            LeafKey::generate(KeyAlgorithm::EcdsaP256).unwrap(),
            LeafKey::generate(KeyAlgorithm::EcdsaP384).unwrap(),
        ];
        let ready_der = ready[0].pair().serialize_der();
        let stopped = std::cell::Cell::new(false);
        let stop = || stopped.get();
        let mut keys = KeySource::new(KeyAlgorithm::EcdsaP256, ready, &KeyMaker::InProcess, &stop);
        // The P-384 key is not this source's algorithm: never handed out.
        assert_eq!(keys.next_key().unwrap().pair().serialize_der(), ready_der);
        let fresh = keys.next_key().unwrap();
        assert_eq!(fresh.algorithm(), KeyAlgorithm::EcdsaP256);
        assert_ne!(fresh.pair().serialize_der(), ready_der);
        assert_eq!(keys.generated(), 1);
        stopped.set(true);
        assert!(matches!(keys.next_key(), Err(PkiError::Stopped)));
        assert_eq!(keys.generated(), 1);
    }

    #[test]
    fn debug_shows_no_key_material() {
        let key = LeafKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
        let pem = key.pair().serialize_pem();
        let body: String = pem.lines().nth(1).unwrap().chars().take(20).collect();
        let alone = format!("{key:?}");
        let source = KeySource::new(
            KeyAlgorithm::EcdsaP256,
            vec![key],
            &KeyMaker::InProcess,
            &|| false,
        );
        let shown = format!("{alone} {source:?}");
        assert!(!shown.contains(&body), "{shown}");
        assert!(
            shown.contains("EcdsaP256") && shown.contains("ready: 1"),
            "{shown}"
        );
    }
}
