//! The agent's memory between runs, under `<root>/var/lib/exk8s/`:
//!
//! * `state.json` — the highest fully applied serial, the digest of every file written, and the
//!   installed artifacts. Written atomically, and only after every check passed and every file
//!   landed (SECURITY.md 13).
//! * `bootstrap.done` — the marker the unit's `ConditionPathExists=!` reads: a full success.
//! * `recorded-actions.log` — host actions recorded instead of performed (`--root`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::AgentError;

pub const STATE_DIR: &str = "var/lib/exk8s";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstalledArtifact {
    pub version: String,
    /// Digest of the installed binary.
    pub sha256: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Serial of the last bundle applied end to end (files, prerequisites, plan).
    pub applied_serial: Option<u64>,
    pub vm_id: Option<u64>,
    /// path → sha256 of what the agent last wrote there.
    pub files: BTreeMap<String, String>,
    /// artifact name → what is installed.
    pub artifacts: BTreeMap<String, InstalledArtifact>,
}

pub fn state_dir(root: &Path) -> PathBuf {
    root.join(STATE_DIR)
}

pub fn marker_path(root: &Path) -> PathBuf {
    state_dir(root).join("bootstrap.done")
}

fn state_path(root: &Path) -> PathBuf {
    state_dir(root).join("state.json")
}

impl State {
    pub fn load(root: &Path) -> Result<Self, AgentError> {
        let path = state_path(root);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| AgentError::State {
                path,
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(AgentError::State { path, source }),
        }
    }

    pub fn save(&self, root: &Path) -> Result<(), AgentError> {
        let path = state_path(root);
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| AgentError::State {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        write_atomic(&path, &bytes, 0o600).map_err(|source| AgentError::State { path, source })
    }
}

/// Writes a small agent-owned file atomically (temp, fsync, rename, fsync dir).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.tmp-{}", file_name(path), std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
