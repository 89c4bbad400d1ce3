//! Artifacts: binaries downloaded over HTTPS, checked against a SHA-256 digest before use, and
//! installed atomically with their mode. The digest is the bundle's pinned one when present,
//! otherwise the `<url>.sha256` published beside the download; if neither matches, nothing is
//! installed (fail closed). A `.tar.gz` artifact installs one named member.
//!
//! An artifact already installed at the same version with an intact binary is skipped, so a
//! pre-baked image does no network work here.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use exk8s_common::names::Sha256Digest;
use exk8s_common::payload::Artifact;

use crate::error::AgentError;
use crate::http::{self, Attempt, classify, read_capped, retry_unless_abandoned};
use crate::imds::relay;
use crate::log::log_info;
use crate::state::{InstalledArtifact, State, write_atomic};

/// Largest download accepted (kubelet and kubectl are ~60–120 MiB).
const MAX_ARTIFACT_BYTES: u64 = 512 * 1024 * 1024;
/// How long one artifact may take across retries.
const DOWNLOAD_DEADLINE: Duration = Duration::from_secs(900);

fn failed(artifact: &Artifact, reason: impl Into<String>) -> AgentError {
    AgentError::Artifact {
        name: artifact.name.to_string(),
        reason: reason.into(),
    }
}

pub fn dest_of(root: &Path, artifact: &Artifact) -> PathBuf {
    root.join(artifact.dest.relative())
}

/// True when the state records this version and the binary on disk still has its digest.
pub fn is_installed(root: &Path, state: &State, artifact: &Artifact) -> bool {
    let Some(installed) = state.artifacts.get(artifact.name.as_str()) else {
        return false;
    };
    installed.version == artifact.version.as_str()
        && std::fs::read(dest_of(root, artifact))
            .is_ok_and(|bytes| Sha256Digest::of(&bytes).to_hex() == installed.sha256)
}

fn download(
    agent: &ureq::Agent,
    url: &str,
    limit: u64,
    abandoned: &AtomicBool,
) -> Result<Vec<u8>, AgentError> {
    retry_unless_abandoned(
        "downloading an artifact",
        DOWNLOAD_DEADLINE,
        abandoned,
        || match classify("artifact download", agent.get(url).call()) {
            Ok(response) => match read_capped(response, limit) {
                Ok(body) => Attempt::Done(body),
                Err(reason) if reason.contains("limit") => Attempt::Fatal(AgentError::Artifact {
                    name: url.to_owned(),
                    reason,
                }),
                Err(reason) => Attempt::Retry {
                    reason,
                    after: None,
                },
            },
            Err(attempt) => relay(attempt),
        },
    )
}

/// The digest the download must have: pinned, or from `<url>.sha256`.
fn expected_digest(
    agent: &ureq::Agent,
    artifact: &Artifact,
    abandoned: &AtomicBool,
) -> Result<Sha256Digest, AgentError> {
    if let Some(pinned) = artifact.sha256 {
        return Ok(pinned);
    }
    let sidecar =
        download(agent, &format!("{}.sha256", artifact.url), 4096, abandoned).map_err(|e| {
            failed(
                artifact,
                format!(
                    "no pinned digest and no usable {}.sha256: {e}",
                    artifact.url
                ),
            )
        })?;
    let text = String::from_utf8_lossy(&sidecar);
    text.split_whitespace()
        .next()
        .and_then(|word| word.to_ascii_lowercase().parse().ok())
        .ok_or_else(|| {
            failed(
                artifact,
                format!("{}.sha256 does not hold a sha256 digest", artifact.url),
            )
        })
}

fn extract(artifact: &Artifact, archive: &[u8], member: &str) -> Result<Vec<u8>, AgentError> {
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    let entries = tar
        .entries()
        .map_err(|e| failed(artifact, format!("reading the archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| failed(artifact, format!("reading the archive: {e}")))?;
        let path = entry
            .path()
            .map_err(|e| failed(artifact, e.to_string()))?
            .into_owned();
        if path == Path::new(member) && entry.header().entry_type().is_file() {
            let mut bytes = Vec::new();
            entry
                .by_ref()
                .take(MAX_ARTIFACT_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| failed(artifact, format!("extracting {member}: {e}")))?;
            if bytes.len() as u64 > MAX_ARTIFACT_BYTES {
                return Err(failed(
                    artifact,
                    format!("{member} is larger than the artifact limit"),
                ));
            }
            return Ok(bytes);
        }
    }
    Err(failed(
        artifact,
        format!("the archive has no file {member}"),
    ))
}

/// Downloads, verifies and installs one artifact; records it in the state under `root`. The
/// download's retries stop once `abandoned` is set.
pub fn install(
    root: &Path,
    artifact: &Artifact,
    request_timeout: Duration,
    abandoned: &AtomicBool,
) -> Result<(), AgentError> {
    let mut state = State::load(root)?;
    if is_installed(root, &state, artifact) {
        log_info!(
            "artifact {} {} already installed",
            artifact.name,
            artifact.version
        );
        return Ok(());
    }
    let tls = http::api_tls(None)?;
    let agent = http::agent(tls, request_timeout.max(Duration::from_secs(300)));
    let expected = expected_digest(&agent, artifact, abandoned)?;
    let body = download(&agent, artifact.url.as_str(), MAX_ARTIFACT_BYTES, abandoned)?;
    let actual = Sha256Digest::of(&body);
    if actual != expected {
        return Err(failed(
            artifact,
            format!("digest mismatch: expected {expected}, downloaded {actual}; nothing installed"),
        ));
    }
    let binary = match &artifact.archive_member {
        Some(member) => extract(artifact, &body, member.as_str())?,
        None => body,
    };
    let dest = dest_of(root, artifact);
    write_atomic(&dest, &binary, artifact.mode.bits()).map_err(|source| AgentError::Write {
        path: dest.clone(),
        source,
    })?;
    state.artifacts.insert(
        artifact.name.to_string(),
        InstalledArtifact {
            version: artifact.version.to_string(),
            sha256: Sha256Digest::of(&binary).to_hex(),
        },
    );
    state.save(root)?;
    log_info!(
        "installed {} {} at {}",
        artifact.name,
        artifact.version,
        dest.display()
    );
    Ok(())
}
