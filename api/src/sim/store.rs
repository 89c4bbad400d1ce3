//! Where a simulator keeps its state between runs: a JSON file rewritten atomically (temp file,
//! fsync, rename) after every change. The dev stack keeps it in its data dir, so a restarted
//! stack still knows its VMs (and their instance metadata) and never hands out an id twice.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A state file, or none (state in memory only).
#[derive(Debug, Clone, Default)]
pub(super) struct Store {
    path: Option<PathBuf>,
}

impl Store {
    pub(super) fn at(path: PathBuf) -> Self {
        Self { path: Some(path) }
    }

    /// The saved state, or `None` when there is none yet.
    pub(super) fn load<T: DeserializeOwned>(&self) -> Result<Option<T>, String> {
        let Some(path) = &self.path else {
            return Ok(None);
        };
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| format!("{} is not a simulator state file: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("reading {}: {e}", path.display())),
        }
    }

    /// Saves `state`; a failure is logged (the simulator keeps serving from memory).
    pub(super) fn save<T: Serialize>(&self, state: &T) {
        let Some(path) = &self.path else {
            return;
        };
        if let Err(e) = write_atomic(path, state) {
            tracing::warn!(path = %path.display(), error = %e, "saving simulator state failed");
        }
    }
}

fn write_atomic<T: Serialize>(path: &Path, state: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(state).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("json.tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}
