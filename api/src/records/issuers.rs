//! Opened cluster trust kept between requests: bundles, renewal passes, CA rotations and
//! operator kubeconfigs all open a cluster's trust through it. Unsealing a cluster's CA keys and parsing them
//! (RSA keys above all) is the largest per-request cost of a bundle, and it is the same for
//! every node of a cluster. An entry is kept per cluster with a digest of every stored trust
//! column (certificates, sealed keys, algorithm, spec): a rotation or re-key changes a column,
//! so the entry no longer matches and the trust is opened again — a bundle is never signed
//! with stale material. At most `capacity` clusters are held, the least recently used evicted
//! first; an evicted entry's keys are wiped when the last request using them drops them.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};

use exk8s_common::names::Sha256Digest;

use crate::crypto::Keyring;
use crate::db::clusters::ClusterRow;
use crate::pki::ClusterPki;
use crate::trust::{self, TrustError};

/// How many clusters' trust the API keeps open by default (a few KiB each).
pub const DEFAULT_CAPACITY: NonZeroUsize = match NonZeroUsize::new(1024) {
    Some(n) => n,
    None => unreachable!(),
};

struct Entry {
    version: Sha256Digest,
    pki: Arc<ClusterPki>,
}

/// Opened [`ClusterPki`]s by cluster id.
pub struct IssuerCache {
    entries: Mutex<lru::LruCache<i64, Entry>>,
}

impl std::fmt::Debug for IssuerCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("IssuerCache")
            .field("clusters", &entries.len())
            .field("capacity", &entries.cap())
            .finish()
    }
}

impl IssuerCache {
    pub fn new(capacity: NonZeroUsize) -> Self {
        Self {
            entries: Mutex::new(lru::LruCache::new(capacity)),
        }
    }

    /// `row`'s opened trust: the kept one while every trust column is as it was opened from,
    /// else opened now (and kept).
    pub fn open(&self, keks: &Keyring, row: &ClusterRow) -> Result<Arc<ClusterPki>, TrustError> {
        let version = version_of(row);
        {
            let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = entries.get(&row.id) {
                if entry.version == version {
                    return Ok(Arc::clone(&entry.pki));
                }
            }
        }
        // Opened outside the lock: other clusters' requests do not wait for this one.
        let pki = trust::open(keks, row)?;
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.put(
            row.id,
            Entry {
                version,
                pki: Arc::clone(&pki),
            },
        );
        Ok(pki)
    }

    /// How many clusters are held.
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A digest of every column [`trust::open`] reads, each length-prefixed.
fn version_of(row: &ClusterRow) -> Sha256Digest {
    let columns: [Option<&str>; 10] = [
        row.ca_cert.as_deref(),
        row.ca_key_sealed.as_deref(),
        row.etcd_ca_cert.as_deref(),
        row.etcd_ca_key_sealed.as_deref(),
        row.front_proxy_ca_cert.as_deref(),
        row.front_proxy_ca_key_sealed.as_deref(),
        row.sa_public.as_deref(),
        row.sa_key_sealed.as_deref(),
        Some(row.key_algorithm.as_str()),
        Some(row.spec_json.as_str()),
    ];
    let mut bytes = Vec::with_capacity(8 * 1024);
    for column in columns {
        match column {
            None => bytes.push(0),
            Some(text) => {
                bytes.push(1);
                bytes.extend_from_slice(&(text.len() as u64).to_be_bytes());
                bytes.extend_from_slice(text.as_bytes());
            }
        }
    }
    Sha256Digest::of(&bytes)
}
