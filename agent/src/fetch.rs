//! Fetching this VM's bundle from the API with both credentials and a fresh nonce, saying
//! which bundle format this agent reads (`Accept`: the API refuses, with the reason, rather
//! than hand it one it cannot read; docs/upgrading-exk8s.md, "The agents"). The body is
//! capped at the envelope limit while it streams, so a huge or endless response costs bounded
//! memory and time.

use std::time::Duration;

use exk8s_common::BUNDLE_PAYLOAD_TYPE;
use exk8s_common::limits::MAX_ENVELOPE_BYTES;
use exk8s_common::names::Nonce;
use exk8s_common::node_auth::{NODE_KEY_HEADER, NodePublicKey};

use crate::error::AgentError;
use crate::http::{Attempt, classify, read_capped, retry};
use crate::imds::{IMDS_TOKEN_HEADER, Identity, relay};

/// Header the agent sends its per-request nonce in; the bundle must echo it.
pub use exk8s_common::contract::NONCE_HEADER;

/// A fresh 32-character URL-safe nonce from the OS CSPRNG.
pub fn new_nonce() -> Result<Nonce, AgentError> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|_| AgentError::Config("the OS random source failed".into()))?;
    let text: String = bytes
        .iter()
        .map(|b| ALPHABET[usize::from(b & 63)] as char)
        .collect();
    Nonce::new(text).map_err(|e| AgentError::Config(e.to_string()))
}

/// What the first fetch sends besides the VM's two credentials.
pub struct Credentials<'a> {
    /// Echoed in the bundle.
    pub nonce: &'a Nonce,
    /// Registered for the node's signed day-2 requests.
    pub node_key: &'a NodePublicKey,
}

/// `GET /bootstrap/{vm_id}`, retried under `deadline`.
pub fn bundle(
    agent: &ureq::Agent,
    api_url: &str,
    identity: &Identity,
    credentials: &Credentials<'_>,
    deadline: Duration,
) -> Result<Vec<u8>, AgentError> {
    let node_key = credentials.node_key.to_text();
    let nonce = credentials.nonce;
    let url = format!(
        "{}/bootstrap/{}",
        api_url.trim_end_matches('/'),
        identity.vm_id
    );
    retry("fetching the bundle", deadline, || {
        let request = agent
            .get(&url)
            .set(IMDS_TOKEN_HEADER, identity.imds_token.expose())
            .set(
                "Authorization",
                &format!("Bearer {}", identity.access_token.expose()),
            )
            .set(NONCE_HEADER, nonce.as_str())
            .set(NODE_KEY_HEADER, &node_key)
            .set("Accept", BUNDLE_PAYLOAD_TYPE);
        let response = match classify("bundle", request.call()) {
            Ok(r) => r,
            Err(attempt) => return relay(attempt),
        };
        match read_capped(response, MAX_ENVELOPE_BYTES) {
            Ok(body) => Attempt::Done(body),
            // An oversized body will not shrink on retry.
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
