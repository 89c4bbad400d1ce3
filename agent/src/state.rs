//! The agent's memory between runs, under `<root>/var/lib/exk8s/`, always reached through
//! [`StateDir`] (directory handles, no symlink followed):
//!
//! * `state.json` — the highest fully applied serial, the digest of every file written, and the
//!   installed artifacts. Written atomically, and only after every check passed and every file
//!   landed (SECURITY.md 13).
//! * `bootstrap.done` — the marker the unit's `ConditionPathExists=!` reads: a full success.
//! * `recorded-actions.log` — host actions recorded instead of performed (`--root`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use exk8s_common::contract::Component;
use serde::{Deserialize, Serialize};

use crate::error::AgentError;
pub use crate::statedir::{STATE_DIR, StateDir};

const STATE_FILE: &str = "state.json";
/// The done-marker's name in the state directory.
pub const MARKER: &str = "bootstrap.done";

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
    /// The node generation of that bundle.
    #[serde(default)]
    pub applied_generation: Option<u64>,
    /// Files an apply changed whose units have not been restarted since: an interrupted apply's
    /// restarts are owed by the next one, even though its files are then already in place.
    #[serde(default)]
    pub pending: BTreeSet<String>,
    pub vm_id: Option<u64>,
    /// path → sha256 of what the agent last wrote there.
    pub files: BTreeMap<String, String>,
    /// artifact name → what is installed.
    pub artifacts: BTreeMap<String, InstalledArtifact>,
    /// How `sync` checks this node's etcd between updates: the applied plan's health probe
    /// (control-plane nodes only).
    #[serde(default)]
    pub etcd_health: Option<EtcdHealth>,
    /// A sync reported this node's etcd unhealthy; the next healthy check says it recovered.
    #[serde(default)]
    pub reported_unhealthy: bool,
    /// How `sync` probes the node's other components between updates (from the applied plans).
    #[serde(default)]
    pub component_checks: Vec<Check>,
    /// The components' health last reported: a sync reports again when it differs.
    #[serde(default)]
    pub reported_components: Vec<exk8s_common::contract::ComponentHealth>,
    /// The Kubernetes releases (`/opt/exk8s/kubernetes/<version>`) applied bundles ran, the
    /// current ones last: those the last bundle runs and the one before them.
    #[serde(default)]
    pub releases: Vec<String>,
    /// The same for etcd's releases (`/opt/exk8s/etcd/<version>`).
    #[serde(default)]
    pub etcd_releases: Vec<String>,
}

/// A probe `sync` makes of one component between updates (not etcd: [`EtcdHealth`]), from the
/// applied plans' waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "probe", rename_all = "snake_case")]
pub enum Check {
    /// The apiserver's `/readyz` through a kubeconfig.
    Readyz { kubeconfig: String },
    /// A component's `/healthz` on loopback.
    Healthz { component: Component, port: u16 },
    /// The kubelet's Node object, read with its own kubeconfig.
    NodeRegistered { kubeconfig: String, node: String },
}

impl Check {
    pub fn component(&self) -> Component {
        match self {
            Self::Readyz { .. } => Component::Apiserver,
            Self::Healthz { component, .. } => *component,
            Self::NodeRegistered { .. } => Component::Kubelet,
        }
    }
}

/// Where a control-plane node's etcd answers `/health`, and the client identity to ask with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdHealth {
    pub endpoint: String,
    pub ca_file: String,
    pub cert_file: String,
    pub key_file: String,
}

pub fn state_dir(root: &Path) -> PathBuf {
    root.join(STATE_DIR)
}

pub fn marker_path(root: &Path) -> PathBuf {
    state_dir(root).join(MARKER)
}

/// Whether the done-marker exists (as a regular file: a planted symlink does not count).
pub fn is_done(root: &Path) -> Result<bool, AgentError> {
    Ok(StateDir::open(root, false)?.is_some_and(|dir| dir.has_file(MARKER)))
}

/// Takes the node's agent lock (see [`StateDir::lock`]), creating the state directory.
pub fn lock(root: &Path) -> Result<std::fs::File, AgentError> {
    StateDir::open(root, true)?
        .ok_or_else(|| AgentError::State {
            path: state_dir(root),
            source: std::io::ErrorKind::NotFound.into(),
        })?
        .lock()
}

/// Writes the done-marker.
pub fn mark_done(root: &Path, serial: u64) -> Result<(), AgentError> {
    let dir = StateDir::open(root, true)?.ok_or_else(|| AgentError::State {
        path: state_dir(root),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    dir.write_atomic(MARKER, format!("serial {serial}\n").as_bytes(), 0o644)
}

impl State {
    pub fn load(root: &Path) -> Result<Self, AgentError> {
        let Some(dir) = StateDir::open(root, false)? else {
            return Ok(Self::default());
        };
        match dir.read(STATE_FILE)? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| AgentError::State {
                path: dir.path().join(STATE_FILE),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            }),
            None => Ok(Self::default()),
        }
    }

    pub fn save(&self, root: &Path) -> Result<(), AgentError> {
        let dir = StateDir::open(root, true)?.ok_or_else(|| AgentError::State {
            path: state_dir(root),
            source: std::io::ErrorKind::NotFound.into(),
        })?;
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| AgentError::State {
            path: dir.path().join(STATE_FILE),
            source: std::io::Error::other(e),
        })?;
        dir.write_atomic(STATE_FILE, &bytes, 0o600)
    }
}

/// Writes an installed binary atomically (temp, fsync, rename, fsync dir).
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
