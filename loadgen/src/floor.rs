//! The issuance floor: the CPU the cryptography of one bundle takes on this machine, with the
//! crates and calls the issuer uses — every per-bundle certificate of a control-plane node
//! minted from fresh keys (`BundleCerts::mint`: 11 key pairs and 11 CA signatures), the
//! payload's SHA-256 twice (once as the files' digests, once as its own), and the ed25519
//! signature over its DSSE pre-authentication encoding. Timed in a tight loop on one thread
//! before the API starts, as a fixed part and a part per payload byte; the API's CPU per bundle
//! over this is the ratio issue 48 asks for.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ed25519_dalek::{Signer as _, SigningKey};
use exk8s_api::pki::{BundleCerts, ClusterPki, KeyAlgorithm, NodeAddresses};
use exk8s_common::contract::Role;
use sha2::{Digest as _, Sha256};

/// How long each part is timed in all, in batches of [`BATCH`] (each at least three rounds).
const TIMED: Duration = Duration::from_secs(2);
const BATCH: Duration = Duration::from_millis(100);
/// The payload the part per byte is timed over.
const SAMPLE_BYTES: usize = 1 << 20;

/// One algorithm's floor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Floor {
    /// Keys and certificate signatures of one bundle, in milliseconds.
    pub(crate) minting_ms: f64,
    /// Both digests and the signature, per KiB of payload, in milliseconds.
    pub(crate) per_kib_ms: f64,
}

impl Floor {
    /// The floor of a bundle whose payload has `payload_bytes`, in milliseconds.
    pub(crate) fn per_bundle_ms(&self, payload_bytes: f64) -> f64 {
        self.minting_ms + self.per_kib_ms * payload_bytes / 1024.0
    }
}

/// Runs `round` in batches for [`TIMED`]: milliseconds per round in the fastest batch. What
/// else runs on the machine only ever slows a batch down, so the fastest is the cryptography's
/// own cost (one mean over the whole time moved by ±20 % between runs on an idle machine).
fn timed(mut round: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let start = Instant::now();
    let mut fastest = f64::INFINITY;
    while start.elapsed() < TIMED {
        let batch = Instant::now();
        let mut rounds = 0u32;
        while rounds < 3 || batch.elapsed() < BATCH {
            round()?;
            rounds += 1;
        }
        fastest = fastest.min(batch.elapsed().as_secs_f64() * 1000.0 / f64::from(rounds));
    }
    Ok(fastest)
}

/// The floor's calls, ready to repeat: a cluster's PKI, a node's addresses, a signing key.
struct Calls {
    pki: ClusterPki,
    node: NodeAddresses,
    now: time::OffsetDateTime,
    key: SigningKey,
}

impl Calls {
    fn new(algorithm: &str) -> Result<Self, String> {
        let algorithm: KeyAlgorithm = algorithm.parse().map_err(|e| format!("{e}"))?;
        let now = time::OffsetDateTime::now_utc();
        let pki = ClusterPki::generate(algorithm, now).map_err(|e| e.to_string())?;
        let node = NodeAddresses {
            name: "cp-1.cluster-1.internal"
                .parse()
                .map_err(|e| format!("a node name: {e}"))?,
            private_ipv4: Ipv4Addr::new(10, 0, 0, 11),
            private_ipv6: None,
            public_ipv4: None,
        };
        Ok(Self {
            pki,
            node,
            now,
            key: SigningKey::from_bytes(&[7; 32]),
        })
    }

    /// One bundle's keys and certificate signatures.
    fn mint(&self) -> Result<(), String> {
        let minted = BundleCerts::mint(&self.pki, &self.node, Role::ControlPlane, self.now);
        std::hint::black_box(minted.map_err(|e| e.to_string())?);
        Ok(())
    }

    /// One payload's two digests and its envelope's signature.
    fn seal(&self, payload: &[u8]) {
        std::hint::black_box(Sha256::digest(payload));
        std::hint::black_box(Sha256::digest(payload));
        let pae = exk8s_common::envelope::pae(exk8s_common::BUNDLE_PAYLOAD_TYPE, payload);
        std::hint::black_box(self.key.sign(&pae));
    }
}

/// Measures the floor of `algorithm` (`ecdsa-p256`, `rsa-2048`, …) on this machine.
pub(crate) fn measure(algorithm: &str) -> Result<Floor, String> {
    let calls = Calls::new(algorithm)?;
    let minting_ms = timed(|| calls.mint())?;
    let payload = vec![b'x'; SAMPLE_BYTES];
    let per_sample_ms = timed(|| {
        calls.seal(&payload);
        Ok(())
    })?;
    Ok(Floor {
        minting_ms,
        per_kib_ms: per_sample_ms / (SAMPLE_BYTES as f64 / 1024.0),
    })
}

/// The floor's calls for `rounds` bundles of `payload_bytes` each, untimed: a fixed amount of
/// work whose instructions `scripts/bench.sh instructions` counts under callgrind (two round
/// counts apart, so the PKI made first cancels out).
pub(crate) fn repeat(algorithm: &str, rounds: u32, payload_bytes: usize) -> Result<(), String> {
    let calls = Calls::new(algorithm)?;
    let payload = vec![b'x'; payload_bytes];
    for _ in 0..rounds {
        calls.mint()?;
        calls.seal(&payload);
    }
    Ok(())
}
