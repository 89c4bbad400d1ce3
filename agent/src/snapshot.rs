//! An etcd snapshot asked of this node (its generation check names it): streamed from the
//! node's own member through etcd's v3 JSON gateway (`/v3/maintenance/snapshot`, no gRPC client)
//! into a 0600 file in the state directory, checked (etcd ends the stream with the SHA-256 of
//! what it sent), and `PUT` to the API signed over its digest — or, when it cannot be taken,
//! the reason, so the operator sees it at once. The file is removed either way. The node never
//! holds storage credentials: the API writes the store.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use exk8s_common::contract::SnapshotTask;
use exk8s_common::names::Sha256Digest;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::AgentError;
use crate::etcd_probe::EtcdProbe;
use crate::http;
use crate::log::{log_info, log_warn};
use crate::node_api::NodeApi;

/// How long a read from etcd may stall while it streams.
const READ_STALL: Duration = Duration::from_secs(60);
/// The length of etcd's trailing checksum.
const CHECKSUM: usize = 32;

/// A snapshot on disk and what the member said of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    /// The member's revision when the snapshot began.
    pub revision: i64,
    /// The member's etcd release.
    pub etcd_version: String,
    pub size: u64,
    pub sha256: String,
}

/// Where the snapshot of `task` is written under `root_dir`, and its metadata beside it.
pub fn files(root_dir: &Path, task: &SnapshotTask) -> (PathBuf, PathBuf) {
    let dir = crate::state::state_dir(root_dir);
    (
        dir.join(format!("snapshot-{}.db", task.id)),
        dir.join(format!("snapshot-{}.json", task.id)),
    )
}

fn read(root: &Path, path: &Path) -> Result<Vec<u8>, String> {
    let full = root.join(path.strip_prefix("/").unwrap_or(path));
    std::fs::read(&full).map_err(|e| format!("reading {}: {e}", full.display()))
}

/// Streams a snapshot from the member `probe` names (its files under `root`) to `to`, with
/// its metadata in `meta`.
pub fn save(root: &Path, probe: &EtcdProbe, to: &Path, meta: &Path) -> Result<(), String> {
    let tls = http::mutual_tls(
        &read(root, &probe.ca_file)?,
        &read(root, &probe.cert_file)?,
        &read(root, &probe.key_file)?,
    )
    .map_err(|e| e.to_string())?;
    let agent = ureq::AgentBuilder::new()
        .tls_config(tls)
        .timeout_connect(Duration::from_secs(10))
        .timeout_read(READ_STALL)
        .redirects(0)
        .build();
    let endpoint = probe.endpoint.trim_end_matches('/');
    let answer = agent
        .post(&format!("{endpoint}/v3/maintenance/status"))
        .send_string("{}")
        .map_err(|e| format!("etcd status at {endpoint}: {e}"))?;
    let status: serde_json::Value = serde_json::from_slice(&http::read_capped(answer, 64 * 1024)?)
        .map_err(|e| format!("etcd status at {endpoint}: {e}"))?;
    let revision = status["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse::<i64>().ok())
        .ok_or_else(|| format!("etcd status at {endpoint} has no revision: {status}"))?;
    let etcd_version = status["version"]
        .as_str()
        .ok_or_else(|| format!("etcd status at {endpoint} has no version"))?
        .to_owned();
    let response = agent
        .post(&format!("{endpoint}/v3/maintenance/snapshot"))
        .send_string("{}")
        .map_err(|e| format!("etcd snapshot at {endpoint}: {e}"))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode_0600()
        .open(to)
        .map_err(|e| format!("creating {}: {e}", to.display()))?;
    let written = stream(response.into_reader(), &mut file)
        .map_err(|e| format!("etcd snapshot at {endpoint}: {e}"))?;
    file.sync_all()
        .map_err(|e| format!("writing {}: {e}", to.display()))?;
    let saved = Saved {
        revision,
        etcd_version,
        size: written.0,
        sha256: written.1,
    };
    let text = serde_json::to_vec(&saved).map_err(|e| e.to_string())?;
    std::fs::write(meta, text).map_err(|e| format!("writing {}: {e}", meta.display()))
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::mode(self, 0o600)
    }
}

/// Decodes the gateway's stream of `{"result": {"blob": base64, …}}` messages into `out`; its
/// size and SHA-256, once etcd's trailing checksum matched what came before it.
fn stream(body: impl Read, out: &mut impl Write) -> Result<(u64, String), String> {
    let mut whole = Sha256::new();
    let mut body_hash = Sha256::new();
    let mut tail: Vec<u8> = Vec::new();
    let mut size = 0u64;
    let messages = serde_json::Deserializer::from_reader(body).into_iter::<serde_json::Value>();
    for message in messages {
        let message = message.map_err(|e| format!("an unreadable message: {e}"))?;
        if let Some(error) = message.get("error") {
            return Err(format!("etcd ended the stream: {error}"));
        }
        let blob = message["result"]["blob"].as_str().unwrap_or_default();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(blob)
            .map_err(|e| format!("a blob that is not base64: {e}"))?;
        out.write_all(&bytes).map_err(|e| format!("writing: {e}"))?;
        whole.update(&bytes);
        size += bytes.len() as u64;
        tail.extend_from_slice(&bytes);
        if tail.len() > CHECKSUM {
            let settled = tail.len() - CHECKSUM;
            body_hash.update(&tail[..settled]);
            tail.drain(..settled);
        }
    }
    if tail.len() != CHECKSUM || body_hash.finalize().as_slice() != tail.as_slice() {
        return Err(format!(
            "the stream ended after {size} bytes without etcd's checksum of them (cut short?)"
        ));
    }
    Ok((
        size,
        Sha256Digest::from_bytes(whole.finalize().into()).to_hex(),
    ))
}

/// Takes the snapshot of `task` with `perform` (the host: it streams for real, or records) and
/// uploads it, or tells the API why it could not. The snapshot's files are removed either way.
pub fn take(
    node: &NodeApi<'_>,
    root_dir: &Path,
    task: &SnapshotTask,
    perform: impl FnOnce(&Path, &Path) -> Result<(), AgentError>,
    upload_timeout: Duration,
) -> Result<(), AgentError> {
    let (to, meta) = files(root_dir, task);
    let _ = std::fs::remove_file(&to);
    let _ = std::fs::remove_file(&meta);
    let performed = perform(&to, &meta);
    if performed.is_ok() && !meta.exists() {
        // A recording host (`--root`) recorded the step without taking it: the API is told at
        // once (an upgrade waiting for it says why), rather than at the deadline.
        let why = "this agent runs with --root: it records host steps and takes no etcd snapshot";
        log_warn!("etcd snapshot {} recorded, not taken: {why}", task.id);
        return node.snapshot_failed(task.id, why);
    }
    let outcome = performed.and_then(|()| {
        let text = std::fs::read(&meta).map_err(|e| AgentError::State {
            path: meta.clone(),
            source: e,
        })?;
        let saved: Saved = serde_json::from_slice(&text)
            .map_err(|e| AgentError::Config(format!("{}: {e}", meta.display())))?;
        let digest: Sha256Digest = saved
            .sha256
            .parse()
            .map_err(|_| AgentError::Config(format!("{}: a bad digest", meta.display())))?;
        let upload = crate::node_api::SnapshotUpload {
            file: &to,
            revision: saved.revision,
            etcd_version: &saved.etcd_version,
            size: saved.size,
            digest: &digest,
        };
        node.upload_snapshot(task.id, &upload, upload_timeout)
    });
    let _ = std::fs::remove_file(&to);
    let _ = std::fs::remove_file(&meta);
    match outcome {
        Ok(()) => {
            log_info!("etcd snapshot {} taken and uploaded", task.id);
            Ok(())
        }
        Err(e) => {
            let why = crate::error::chain(&e);
            log_warn!("etcd snapshot {} could not be taken: {why}", task.id);
            node.snapshot_failed(task.id, &why)?;
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(snapshot: &[u8], piece: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for part in snapshot.chunks(piece) {
            let blob = base64::engine::general_purpose::STANDARD.encode(part);
            out.extend_from_slice(
                format!("{{\"result\":{{\"blob\":\"{blob}\",\"remaining_bytes\":\"0\"}}}}\n")
                    .as_bytes(),
            );
        }
        out
    }

    #[test]
    fn the_gateway_stream_is_decoded_and_its_checksum_checked() {
        let data = b"bolt pages".repeat(5000);
        let mut snapshot = data.clone();
        snapshot.extend_from_slice(&Sha256::digest(&data));
        let mut out = Vec::new();
        let (size, digest) = stream(&messages(&snapshot, 32 * 1024)[..], &mut out).unwrap();
        assert_eq!(out, snapshot);
        assert_eq!(size, snapshot.len() as u64);
        assert_eq!(digest, Sha256Digest::of(&snapshot).to_hex());

        let cut = &snapshot[..snapshot.len() - 40];
        let e = stream(&messages(cut, 4096)[..], &mut Vec::new()).unwrap_err();
        assert!(e.contains("without etcd's checksum"), "{e}");
        let error = br#"{"error":{"grpc_code":14,"message":"etcdserver: no leader"}}"#;
        let mut broken = messages(&snapshot[..1000], 500);
        broken.extend_from_slice(error);
        let e = stream(&broken[..], &mut Vec::new()).unwrap_err();
        assert!(e.contains("no leader"), "{e}");
    }
}
