//! The node's signed channel to the API after its first bundle (`/nodes/{vm_id}/…`): every
//! request carries the IMDS session token and an ed25519 signature by the node key over its
//! method, path, a timestamp, a fresh nonce and the body's digest. A retried attempt is signed
//! anew (the API refuses a nonce it has seen), so the nonce a bundle must echo is the one of
//! the attempt that got it.

use std::time::Duration;

use exk8s_common::BUNDLE_PAYLOAD_TYPE;
use exk8s_common::contract::{
    ETCD_REVISION_HEADER, ETCD_VERSION_HEADER, IMDS_TOKEN_HEADER, NONCE_HEADER, PhaseReport,
    RestoreAck, RestoreStep, SNAPSHOT_FAILURE_HEADER,
};
use exk8s_common::limits::MAX_ENVELOPE_BYTES;
use exk8s_common::names::Nonce;
use exk8s_common::names::Sha256Digest;
use exk8s_common::node_auth::{
    CONTENT_SHA256_HEADER, NodeKey, SIGNATURE_HEADER, TIMESTAMP_HEADER, request_message_for_digest,
};

use crate::error::AgentError;
use crate::http::{Attempt, classify, read_capped, retry};
use crate::imds::{Session, relay};

pub use exk8s_common::contract::Generations;

/// The API's answer to "my update, please".
#[derive(Debug)]
pub enum Update {
    /// The node runs its desired generation (204).
    Current,
    /// The rollout holds this node's update for now (409); the reason is the API's.
    Wait(String),
    /// The signed update bundle, and the nonce its payload must echo.
    Bundle { envelope: Vec<u8>, nonce: Nonce },
}

/// A signed request maker for one node.
pub struct NodeApi<'a> {
    pub agent: &'a ureq::Agent,
    pub api_url: &'a str,
    pub session: &'a Session,
    pub key: &'a NodeKey,
}

/// The path part of `url` (`https://host:8443/prefix/` → `/prefix`), which the API sees and
/// the signature therefore covers.
fn path_prefix(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.find('/')
        .map_or("", |i| &rest[i..])
        .trim_end_matches('/')
}

/// A snapshot to upload: its file, and what the member said of it.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotUpload<'a> {
    pub file: &'a std::path::Path,
    /// The member's revision when the snapshot began.
    pub revision: i64,
    /// The member's etcd release.
    pub etcd_version: &'a str,
    pub size: u64,
    /// The file's SHA-256.
    pub digest: &'a Sha256Digest,
}

impl NodeApi<'_> {
    fn base(&self) -> &str {
        self.api_url.trim_end_matches('/')
    }

    /// A request for `/nodes/{vm_id}/{tail}` signed over `body`, with its nonce.
    fn signed(
        &self,
        method: &str,
        tail: &str,
        body: &[u8],
    ) -> Result<(ureq::Request, Nonce), AgentError> {
        self.signed_over(method, tail, &Sha256Digest::of(body))
    }

    /// A request signed over a body's digest (a streamed body's, declared in
    /// [`CONTENT_SHA256_HEADER`]).
    fn signed_over(
        &self,
        method: &str,
        tail: &str,
        body: &Sha256Digest,
    ) -> Result<(ureq::Request, Nonce), AgentError> {
        let path = format!(
            "{}/nodes/{}/{tail}",
            path_prefix(self.api_url),
            self.session.vm_id
        );
        let nonce = crate::fetch::new_nonce()?;
        let timestamp = crate::clock::now();
        let signature = self.key.sign(&request_message_for_digest(
            method,
            &path,
            timestamp,
            nonce.as_str(),
            body,
        ));
        let url = format!("{}/nodes/{}/{tail}", self.base(), self.session.vm_id);
        let request = self
            .agent
            .request(method, &url)
            .set(IMDS_TOKEN_HEADER, self.session.imds_token.expose())
            .set(TIMESTAMP_HEADER, &timestamp.to_string())
            .set(NONCE_HEADER, nonce.as_str())
            .set(SIGNATURE_HEADER, &signature);
        Ok((request, nonce))
    }

    /// `GET /nodes/{vm_id}/generation`, retried under `deadline`.
    pub fn generations(&self, deadline: Duration) -> Result<Generations, AgentError> {
        retry("asking for the node's generation", deadline, || {
            let request = match self.signed("GET", "generation", b"") {
                Ok((request, _)) => request,
                Err(e) => return Attempt::Fatal(e),
            };
            let response = match classify("generation", request.call()) {
                Ok(r) => r,
                Err(attempt) => return relay(attempt),
            };
            match read_capped(response, 64 * 1024).map(|b| serde_json::from_slice(&b)) {
                Ok(Ok(generations)) => Attempt::Done(generations),
                Ok(Err(e)) => Attempt::Fatal(AgentError::Rejected {
                    what: "generation",
                    status: 200,
                    body: format!("unexpected JSON: {e}"),
                }),
                Err(reason) => Attempt::Retry {
                    reason,
                    after: None,
                },
            }
        })
    }

    /// `GET /nodes/{vm_id}/bundle`, retried under `deadline`.
    pub fn update(&self, deadline: Duration) -> Result<Update, AgentError> {
        retry("fetching the update bundle", deadline, || {
            let (request, nonce) = match self.signed("GET", "bundle", b"") {
                Ok((request, nonce)) => (request.set("Accept", BUNDLE_PAYLOAD_TYPE), nonce),
                Err(e) => return Attempt::Fatal(e),
            };
            let response = match request.call() {
                Err(ureq::Error::Status(409, response)) => {
                    let said = read_capped(response, 4096).unwrap_or_default();
                    let reason = serde_json::from_slice::<serde_json::Value>(&said)
                        .ok()
                        .and_then(|v| v["message"].as_str().map(str::to_owned))
                        .unwrap_or_else(|| "the rollout holds this node's update".into());
                    return Attempt::Done(Update::Wait(reason));
                }
                other => match classify("update bundle", other) {
                    Ok(r) => r,
                    Err(attempt) => return relay(attempt),
                },
            };
            if response.status() == 204 {
                return Attempt::Done(Update::Current);
            }
            match read_capped(response, MAX_ENVELOPE_BYTES) {
                Ok(envelope) => Attempt::Done(Update::Bundle { envelope, nonce }),
                Err(reason) if reason.contains("limit") => {
                    Attempt::Fatal(AgentError::RefusedOnDisk(reason))
                }
                Err(reason) => Attempt::Retry {
                    reason,
                    after: None,
                },
            }
        })
    }

    /// `PUT /nodes/{vm_id}/snapshots/{id}`: the snapshot in `upload.file` (whose SHA-256 is its `digest`),
    /// streamed, within `timeout`. Not retried: a refused or broken upload fails the snapshot,
    /// and the operator asks again.
    pub fn upload_snapshot(
        &self,
        id: i64,
        upload: &SnapshotUpload<'_>,
        timeout: Duration,
    ) -> Result<(), AgentError> {
        let SnapshotUpload {
            file,
            revision,
            etcd_version,
            size,
            digest,
        } = upload;
        let (request, _) = self.signed_over("PUT", &format!("snapshots/{id}"), digest)?;
        let body = std::fs::File::open(file).map_err(|e| AgentError::State {
            path: file.to_path_buf(),
            source: e,
        })?;
        let sent = request
            .timeout(timeout)
            .set(CONTENT_SHA256_HEADER, &digest.to_hex())
            .set(ETCD_REVISION_HEADER, &revision.to_string())
            .set(ETCD_VERSION_HEADER, etcd_version)
            .set("Content-Type", "application/octet-stream")
            .set("Content-Length", &size.to_string())
            .send(body);
        match classify("snapshot upload", sent) {
            Ok(_) => Ok(()),
            Err(Attempt::Fatal(e)) => Err(e),
            Err(Attempt::Retry { reason, .. }) => Err(AgentError::Step {
                step: format!("uploading etcd snapshot {id}"),
                reason,
            }),
            Err(Attempt::Done(never)) => match never {},
        }
    }

    /// Tells the API why the snapshot `id` asked of this node could not be taken.
    pub fn snapshot_failed(&self, id: i64, reason: &str) -> Result<(), AgentError> {
        let (request, _) = self.signed("PUT", &format!("snapshots/{id}"), b"")?;
        // A header carries one line of visible ASCII.
        let said: String = reason
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() || c == ' ' {
                    c
                } else {
                    ' '
                }
            })
            .take(500)
            .collect();
        let sent = request
            .set(CONTENT_SHA256_HEADER, &Sha256Digest::of(b"").to_hex())
            .set(SNAPSHOT_FAILURE_HEADER, &said)
            .send_bytes(b"");
        match classify("snapshot failure", sent) {
            Ok(_) => Ok(()),
            Err(Attempt::Fatal(e)) => Err(e),
            Err(Attempt::Retry { reason, .. }) => Err(AgentError::Step {
                step: format!("reporting etcd snapshot {id} failed"),
                reason,
            }),
            Err(Attempt::Done(never)) => match never {},
        }
    }

    /// `PUT /nodes/{vm_id}/restores/{id}`: step `step` of restore `id` done (`failure`
    /// empty) or not (why), retried under `deadline`.
    pub fn restore_ack(
        &self,
        id: i64,
        step: RestoreStep,
        failure: &str,
        deadline: Duration,
    ) -> Result<(), AgentError> {
        let ack = RestoreAck {
            step,
            failure: failure
                .chars()
                .take(exk8s_common::contract::MAX_REPORT_MESSAGE_CHARS)
                .collect(),
        };
        let body = serde_json::to_vec(&ack).map_err(|e| AgentError::Config(e.to_string()))?;
        retry("acknowledging a restore step", deadline, || {
            let request = match self.signed("PUT", &format!("restores/{id}"), &body) {
                Ok((request, _)) => request,
                Err(e) => return Attempt::Fatal(e),
            };
            let sent = request
                .set("Content-Type", "application/json")
                .send_bytes(&body);
            match classify("restore acknowledgement", sent) {
                Ok(_) => Attempt::Done(()),
                Err(attempt) => relay(attempt),
            }
        })
    }

    /// `GET /nodes/{vm_id}/snapshots/{id}/content` into `to` (created 0600), within
    /// `timeout`; the SHA-256 of what came.
    pub fn snapshot_content(
        &self,
        id: i64,
        to: &std::path::Path,
        timeout: Duration,
    ) -> Result<Sha256Digest, AgentError> {
        use sha2::Digest as _;
        let step = || format!("fetching etcd snapshot {id}");
        let (request, _) = self.signed("GET", &format!("snapshots/{id}/content"), b"")?;
        let response = match classify("snapshot content", request.timeout(timeout).call()) {
            Ok(r) => r,
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Retry { reason, .. }) => {
                return Err(AgentError::Step {
                    step: step(),
                    reason,
                });
            }
            Err(Attempt::Done(never)) => match never {},
        };
        let state = |e: std::io::Error| AgentError::State {
            path: to.to_path_buf(),
            source: e,
        };
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(to).map_err(state)?;
        let mut hasher = sha2::Sha256::new();
        let mut reader = response.into_reader();
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n =
                std::io::Read::read(&mut reader, &mut buffer).map_err(|e| AgentError::Step {
                    step: step(),
                    reason: e.to_string(),
                })?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
            std::io::Write::write_all(&mut file, &buffer[..n]).map_err(state)?;
        }
        file.sync_all().map_err(state)?;
        Ok(Sha256Digest::from_bytes(hasher.finalize().into()))
    }

    /// One `POST /nodes/{vm_id}/status` (signed anew: a retry never reuses a nonce).
    pub fn report(&self, report: &PhaseReport) -> Attempt<()> {
        let body = match serde_json::to_vec(report) {
            Ok(body) => body,
            Err(e) => return Attempt::Fatal(AgentError::Config(e.to_string())),
        };
        let request = match self.signed("POST", "status", &body) {
            Ok((request, _)) => request,
            Err(e) => return Attempt::Fatal(e),
        };
        let sent = request
            .set("Content-Type", "application/json")
            .send_bytes(&body);
        match classify("status report", sent) {
            Ok(_) => Attempt::Done(()),
            Err(attempt) => relay(attempt),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::path_prefix;

    #[test]
    fn the_signed_path_keeps_the_api_urls_prefix() {
        assert_eq!(path_prefix("https://api.example.com"), "");
        assert_eq!(path_prefix("https://api.example.com/"), "");
        assert_eq!(path_prefix("http://127.0.0.1:8080/exk8s/"), "/exk8s");
    }
}
