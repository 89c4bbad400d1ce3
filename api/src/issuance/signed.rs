//! Who is asking on the day-2 routes: the VM's IMDS session token (second factor) and a request
//! signed with the node key registered at its first fetch, over method, path, timestamp, nonce
//! and body. A timestamp outside the window, a nonce seen before, a key the node does not have
//! (deleted nodes have none) or a signature by any other key is refused like every other bad
//! credential: one answer, the reason only in the audit row and the log.

use axum::http::HeaderMap;
use exk8s_common::contract::{IMDS_TOKEN_HEADER, NONCE_HEADER};
use exk8s_common::names::Nonce;
use exk8s_common::node_auth::{
    MAX_REQUEST_SKEW_SECS, NodePublicKey, SIGNATURE_HEADER, TIMESTAMP_HEADER, request_message,
    request_message_for_digest,
};

use crate::db::Db;
use crate::db::{self, DbError};
use crate::tokens;

use super::auth::{Refusal, Vm, header, member_of, same_vm, session_of, unauthorized};

/// The parts of a request its signature covers.
#[derive(Debug, Clone, Copy)]
pub struct SignedRequest<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub headers: &'a HeaderMap,
    pub body: SignedBody<'a>,
}

/// What of the body the signature covers.
#[derive(Debug, Clone, Copy)]
pub enum SignedBody<'a> {
    /// The body, read whole.
    Bytes(&'a [u8]),
    /// A streamed body's declared digest: the caller checks the body against it as it comes.
    Declared(&'a exk8s_common::names::Sha256Digest),
}

/// Checks the IMDS token, the signature, its freshness and its nonce, then the VM's membership.
///
/// An accepted request is the node's heartbeat: `seen_at` (the health checks' clock) becomes
/// its `last_seen_at` when that is a minute old or more.
pub async fn authenticate(
    db: &Db,
    request: &SignedRequest<'_>,
    path_vm: i64,
    seen_at: i64,
) -> Result<Result<Vm, Refusal>, DbError> {
    let headers = request.headers;
    let Some(imds) = header(headers, IMDS_TOKEN_HEADER) else {
        return Ok(Err(unauthorized("IMDS token missing or malformed")));
    };
    let signature = header(headers, SIGNATURE_HEADER);
    let timestamp = header(headers, TIMESTAMP_HEADER).and_then(|t| t.parse::<i64>().ok());
    let nonce = header(headers, NONCE_HEADER).and_then(|n| Nonce::new(n).ok());
    let (Some(signature), Some(timestamp), Some(nonce)) = (signature, timestamp, nonce) else {
        return Ok(Err(unauthorized(
            "request signature, timestamp or nonce missing or malformed",
        )));
    };
    // The session, the node and its cluster in one read; membership is judged after the
    // signature.
    let found = db::callers::signed(&db.pool, &tokens::hash(imds), path_vm).await?;
    let session = match session_of(found.session) {
        Ok(session) => session,
        Err(refusal) => return Ok(Err(refusal)),
    };
    if let Err(refusal) = same_vm(session, path_vm) {
        return Ok(Err(refusal));
    }
    let found = found.member;
    let Some((node, _)) = &found else {
        return Ok(Err(unauthorized(
            "the VM has no node record (deleted or never founded)",
        )));
    };
    let Some(key) = node.node_key.as_deref() else {
        return Ok(Err(unauthorized("the node has registered no key")));
    };
    let Ok(key) = NodePublicKey::parse(key) else {
        return Ok(Err(unauthorized("the node's stored key is unusable")));
    };
    let message = match request.body {
        SignedBody::Bytes(body) => request_message(
            request.method,
            request.path,
            timestamp,
            nonce.as_str(),
            body,
        ),
        SignedBody::Declared(digest) => request_message_for_digest(
            request.method,
            request.path,
            timestamp,
            nonce.as_str(),
            digest,
        ),
    };
    if key.verify(&message, signature).is_err() {
        return Ok(Err(unauthorized("request signature does not verify")));
    }
    let now = db::now();
    if (now - timestamp).abs() > MAX_REQUEST_SKEW_SECS {
        return Ok(Err(unauthorized(
            "request timestamp outside the allowed window",
        )));
    }
    // Kept until no timestamp that could carry it is accepted any more.
    let expires_at = timestamp + MAX_REQUEST_SKEW_SECS + 1;
    let fresh = db::nonces::remember(&db.pool, node.id, nonce.as_str(), expires_at, now).await?;
    if !fresh {
        return Ok(Err(unauthorized("request nonce replayed")));
    }
    crate::health::heartbeat(db, node, seen_at).await?;
    Ok(member_of(found, session.org_id))
}
