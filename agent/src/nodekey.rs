//! The node's day-2 key: an ed25519 key pair made on first boot and kept as `node.key` (0600)
//! in the agent's private state directory. Its public half goes with the bootstrap fetch; the
//! API then accepts this node's later requests only when signed with it. The private half
//! never leaves the file and never reaches a log line.

use std::path::Path;

use exk8s_common::node_auth::NodeKey;

use crate::error::AgentError;
use crate::state::{StateDir, state_dir};

const KEY_FILE: &str = "node.key";

fn unusable(dir: &StateDir) -> AgentError {
    AgentError::State {
        path: dir.path().join(KEY_FILE),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a node key (base64 of a 32-byte ed25519 seed)",
        ),
    }
}

/// The node key, when one was made.
pub fn load(root: &Path) -> Result<Option<NodeKey>, AgentError> {
    let Some(dir) = StateDir::open(root, false)? else {
        return Ok(None);
    };
    let Some(bytes) = dir.read(KEY_FILE)? else {
        return Ok(None);
    };
    let text = zeroize::Zeroizing::new(String::from_utf8(bytes).map_err(|_| unusable(&dir))?);
    NodeKey::from_secret_text(&text)
        .map(Some)
        .ok_or_else(|| unusable(&dir))
}

/// The node key, made and saved first when there is none.
pub fn load_or_create(root: &Path) -> Result<NodeKey, AgentError> {
    if let Some(key) = load(root)? {
        return Ok(key);
    }
    let dir = StateDir::open(root, true)?.ok_or_else(|| AgentError::State {
        path: state_dir(root),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    let key = NodeKey::generate()
        .map_err(|_| AgentError::Config("the OS random source failed".into()))?;
    dir.write_atomic(KEY_FILE, key.to_secret_text().as_bytes(), 0o600)?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn made_once_private_and_stable() {
        let root = tempfile::tempdir().unwrap();
        assert!(load(root.path()).unwrap().is_none());
        let key = load_or_create(root.path()).unwrap();
        let again = load_or_create(root.path()).unwrap();
        assert_eq!(key.public(), again.public());
        let file = root.path().join("var/lib/exk8s/node.key");
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::write(&file, "garbage").unwrap();
        assert!(matches!(
            load(root.path()).unwrap_err(),
            AgentError::State { .. }
        ));
    }
}
