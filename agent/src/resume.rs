//! A first boot tried again resumes with the bundle its failed attempt fetched, as long as that
//! bundle is still valid: `first-boot.bundle` in the agent's state directory (0600) keeps the
//! envelope exactly as received and the nonce it answered. Without it every retry fetched a
//! new bundle, whose freshly minted certificates changed every watched file: the kubelet
//! restarted the control plane at each retry. The kept bundle is verified again from its bytes
//! (signature, identity, the nonce it echoes, freshness against this start, rollback), so
//! nothing is trusted that a fresh fetch would not be; once expired it is forgotten and the boot
//! fetches afresh. Removed when the boot completes.

use std::path::Path;

use exk8s_common::names::Nonce;

use crate::error::AgentError;
use crate::statedir::StateDir;

/// The kept bundle's file in the agent's state directory.
const FILE: &str = "first-boot.bundle";

/// A bundle kept by a failed first boot.
pub struct Kept {
    pub nonce: Nonce,
    /// The envelope, byte for byte.
    pub bytes: Vec<u8>,
}

/// Keeps `bytes`, fetched with `nonce`, for the next attempt (the nonce on the first line).
pub fn keep(root: &Path, nonce: &Nonce, bytes: &[u8]) -> Result<(), AgentError> {
    let Some(dir) = StateDir::open(root, true)? else {
        return Ok(());
    };
    let mut kept = Vec::with_capacity(bytes.len() + 64);
    kept.extend_from_slice(nonce.as_str().as_bytes());
    kept.push(b'\n');
    kept.extend_from_slice(bytes);
    dir.write_atomic(FILE, &kept, 0o600)
}

/// The kept bundle, if a failed attempt left one that reads back whole.
pub fn load(root: &Path) -> Result<Option<Kept>, AgentError> {
    let Some(dir) = StateDir::open(root, false)? else {
        return Ok(None);
    };
    let Some(kept) = dir.read(FILE)? else {
        return Ok(None);
    };
    let Some(newline) = kept.iter().position(|b| *b == b'\n') else {
        return Ok(None);
    };
    let Ok(nonce) = std::str::from_utf8(&kept[..newline]) else {
        return Ok(None);
    };
    let Ok(nonce) = Nonce::new(nonce.to_owned()) else {
        return Ok(None);
    };
    Ok(Some(Kept {
        nonce,
        bytes: kept[newline + 1..].to_vec(),
    }))
}

/// Forgets the kept bundle (the boot completed, or the bundle no longer serves).
pub fn forget(root: &Path) -> Result<(), AgentError> {
    match StateDir::open(root, false)? {
        Some(dir) => dir.remove(FILE),
        None => Ok(()),
    }
}
