//! A snapshot at rest: AES-256-GCM under the cluster's snapshot key, in the STREAM construction
//! (Hoang, Reyhanitabar, Rogaway, Vizár; the `aead` crate's `StreamBE32`), so a snapshot of any
//! size is sealed and opened chunk by chunk, and a chunk that is changed, dropped, moved or
//! repeated — or a truncated object — fails to open.
//!
//! Layout: [`MAGIC`], a random 7-byte nonce prefix, then each chunk of up to [`CHUNK`] bytes of
//! the snapshot sealed with a 16-byte tag; the last chunk (which may be full, or empty) is sealed
//! as the last. Every chunk's associated data names the cluster and the snapshot, so an object
//! moved to another snapshot's row does not open.

use aes_gcm::aead::stream::{DecryptorBE32, EncryptorBE32};
use aes_gcm::aead::{KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key};
use zeroize::Zeroizing;

/// What a sealed snapshot begins with.
pub const MAGIC: &[u8] = b"exk8s-snapshot-v1\n";
/// Plaintext bytes per chunk.
pub const CHUNK: usize = 1 << 20;
const TAG: usize = 16;
const NONCE_PREFIX: usize = 7;

/// Why a sealed snapshot does not open (never with key material or plaintext).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CipherError {
    #[error("not a sealed exk8s snapshot (its header is missing)")]
    NotSealed,
    #[error(
        "the sealed snapshot does not open at chunk {0}: changed, truncated, or another snapshot's"
    )]
    Open(u32),
    #[error("sealing the snapshot failed")]
    Seal,
    #[error("the operating system's random source failed")]
    Random,
    #[error("the snapshot is longer than a sealed object may be")]
    TooLong,
}

/// The associated data of every chunk of snapshot `snapshot_id` of cluster `cluster_id`.
pub fn associated_data(cluster_id: i64, snapshot_id: i64) -> Vec<u8> {
    format!("exk8s snapshot: cluster {cluster_id}, snapshot {snapshot_id}").into_bytes()
}

fn cipher(key: &[u8; 32]) -> Aes256Gcm {
    Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key))
}

/// Seals a snapshot pushed to it in pieces of any size.
pub struct Sealer {
    stream: EncryptorBE32<Aes256Gcm>,
    aad: Vec<u8>,
    pending: Zeroizing<Vec<u8>>,
    chunks: u32,
}

impl Sealer {
    /// A sealer under `key`, and the header the sealed object starts with.
    pub fn new(key: &[u8; 32], aad: Vec<u8>) -> Result<(Self, Vec<u8>), CipherError> {
        let mut prefix = [0u8; NONCE_PREFIX];
        getrandom::fill(&mut prefix).map_err(|_| CipherError::Random)?;
        let stream = EncryptorBE32::from_aead(cipher(key), (&prefix).into());
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&prefix);
        let sealer = Self {
            stream,
            aad,
            pending: Zeroizing::new(Vec::with_capacity(CHUNK)),
            chunks: 0,
        };
        Ok((sealer, header))
    }

    /// Takes `data`; the sealed chunks it completes. A full chunk is held back until more
    /// follows: only [`Self::finish`] knows which chunk is the last.
    pub fn push(&mut self, mut data: &[u8]) -> Result<Vec<u8>, CipherError> {
        let mut out = Vec::new();
        while !data.is_empty() {
            if self.pending.len() == CHUNK {
                out.extend(self.seal_pending()?);
            }
            let take = (CHUNK - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        Ok(out)
    }

    fn seal_pending(&mut self) -> Result<Vec<u8>, CipherError> {
        self.chunks = self.chunks.checked_add(1).ok_or(CipherError::TooLong)?;
        let sealed = self
            .stream
            .encrypt_next(Payload {
                msg: &self.pending,
                aad: &self.aad,
            })
            .map_err(|_| CipherError::Seal)?;
        self.pending.clear();
        Ok(sealed)
    }

    /// The last chunk, sealed as the last.
    pub fn finish(self) -> Result<Vec<u8>, CipherError> {
        self.stream
            .encrypt_last(Payload {
                msg: &self.pending,
                aad: &self.aad,
            })
            .map_err(|_| CipherError::Seal)
    }
}

/// Opens a sealed snapshot pushed to it in pieces of any size.
pub struct Opener {
    key: Zeroizing<[u8; 32]>,
    aad: Vec<u8>,
    stream: Option<DecryptorBE32<Aes256Gcm>>,
    pending: Vec<u8>,
    chunk: u32,
}

impl Opener {
    pub fn new(key: &[u8; 32], aad: Vec<u8>) -> Self {
        Self {
            key: Zeroizing::new(*key),
            aad,
            stream: None,
            pending: Vec::new(),
            chunk: 0,
        }
    }

    /// Takes sealed bytes; the snapshot bytes they complete.
    pub fn push(&mut self, data: &[u8]) -> Result<Zeroizing<Vec<u8>>, CipherError> {
        self.pending.extend_from_slice(data);
        let mut out = Zeroizing::new(Vec::new());
        if self.stream.is_none() {
            let header = MAGIC.len() + NONCE_PREFIX;
            if self.pending.len() < header {
                return Ok(out);
            }
            if !self.pending.starts_with(MAGIC) {
                return Err(CipherError::NotSealed);
            }
            let prefix: [u8; NONCE_PREFIX] = self.pending[MAGIC.len()..header]
                .try_into()
                .map_err(|_| CipherError::NotSealed)?;
            self.stream = Some(DecryptorBE32::from_aead(
                cipher(&self.key),
                (&prefix).into(),
            ));
            self.pending.drain(..header);
        }
        // A whole chunk is opened only once more follows it: the last is opened by `finish`.
        while self.pending.len() > CHUNK + TAG {
            let stream = self.stream.as_mut().ok_or(CipherError::NotSealed)?;
            let opened = stream
                .decrypt_next(Payload {
                    msg: &self.pending[..CHUNK + TAG],
                    aad: &self.aad,
                })
                .map_err(|_| CipherError::Open(self.chunk))?;
            self.chunk += 1;
            out.extend_from_slice(&opened);
            self.pending.drain(..CHUNK + TAG);
        }
        Ok(out)
    }

    /// The last chunk's snapshot bytes; fails when the object ended anywhere but after a last
    /// chunk.
    pub fn finish(self) -> Result<Zeroizing<Vec<u8>>, CipherError> {
        let stream = self.stream.ok_or(CipherError::NotSealed)?;
        stream
            .decrypt_last(Payload {
                msg: &self.pending,
                aad: &self.aad,
            })
            .map(Zeroizing::new)
            .map_err(|_| CipherError::Open(self.chunk))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];

    fn seal(data: &[u8], piece: usize) -> Vec<u8> {
        let (mut sealer, mut out) = Sealer::new(&KEY, associated_data(1, 2)).unwrap();
        for part in data.chunks(piece.max(1)) {
            out.extend(sealer.push(part).unwrap());
        }
        out.extend(sealer.finish().unwrap());
        out
    }

    fn open(sealed: &[u8], piece: usize, aad: Vec<u8>) -> Result<Vec<u8>, CipherError> {
        let mut opener = Opener::new(&KEY, aad);
        let mut out = Vec::new();
        for part in sealed.chunks(piece.max(1)) {
            out.extend_from_slice(&opener.push(part)?);
        }
        out.extend_from_slice(&opener.finish()?);
        Ok(out)
    }

    #[test]
    fn any_size_round_trips_in_pieces_of_any_size() {
        for size in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 2 * CHUNK + 5] {
            let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            for (seal_piece, open_piece) in [(size.max(1), size.max(1)), (4096, 7), (1, 65_536)] {
                if size > CHUNK && seal_piece == 1 {
                    continue; // the same path as 4096, a million times slower
                }
                let sealed = seal(&data, seal_piece);
                assert_eq!(
                    sealed.len(),
                    MAGIC.len() + NONCE_PREFIX + size + TAG * (size / CHUNK + 1)
                        - if size > 0 && size % CHUNK == 0 {
                            TAG
                        } else {
                            0
                        }
                );
                assert_eq!(
                    open(&sealed, open_piece, associated_data(1, 2)).unwrap(),
                    data
                );
            }
        }
    }

    #[test]
    fn a_changed_truncated_reordered_or_moved_object_does_not_open() {
        let data: Vec<u8> = (0..(2 * CHUNK + 100)).map(|i| (i % 13) as u8).collect();
        let sealed = seal(&data, 65_536);
        let aad = || associated_data(1, 2);
        let mut flipped = sealed.clone();
        flipped[MAGIC.len() + NONCE_PREFIX + CHUNK + TAG + 3] ^= 1;
        assert_eq!(open(&flipped, 4096, aad()), Err(CipherError::Open(1)));
        // Cut at a chunk boundary: the last chunk left was not sealed as the last.
        let cut = &sealed[..MAGIC.len() + NONCE_PREFIX + 2 * (CHUNK + TAG)];
        assert_eq!(open(cut, 4096, aad()), Err(CipherError::Open(1)));
        let cut = &sealed[..sealed.len() - 1];
        assert!(open(cut, 4096, aad()).is_err());
        let header = MAGIC.len() + NONCE_PREFIX;
        let mut swapped = sealed[..header].to_vec();
        swapped.extend_from_slice(&sealed[header + CHUNK + TAG..header + 2 * (CHUNK + TAG)]);
        swapped.extend_from_slice(&sealed[header..header + CHUNK + TAG]);
        swapped.extend_from_slice(&sealed[header + 2 * (CHUNK + TAG)..]);
        assert_eq!(open(&swapped, 4096, aad()), Err(CipherError::Open(0)));
        assert_eq!(
            open(&sealed, 4096, associated_data(1, 3)),
            Err(CipherError::Open(0)),
            "another snapshot's row"
        );
        assert_eq!(
            open(&data, 4096, aad()),
            Err(CipherError::NotSealed),
            "a plaintext snapshot"
        );
    }
}
